# A compile-fail test: builds TARGET in BUILD_DIR, which must fail, and the first error line
# of the compiler's output must match EXPECT (the line that says why, not a follow-on).
#   cmake -DBUILD_DIR=<dir> -DTARGET=<target> -DEXPECT=<regex> -P check_first_error.cmake
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(_rc EQUAL 0)
  message(FATAL_ERROR "compile-fail ${TARGET}: it compiled, but the composition must be rejected")
endif()
string(REGEX MATCH "[^\n]*(error:|error #|: error)[^\n]*" _first "${_out}")
if(NOT _first)
  message(FATAL_ERROR "compile-fail ${TARGET}: the build failed without a compiler error line:\n${_out}")
endif()
if(NOT _first MATCHES "${EXPECT}")
  message(FATAL_ERROR "compile-fail ${TARGET}: the first error line does not carry the expected message\n"
                      "  expected: ${EXPECT}\n  first error: ${_first}")
endif()
message("compile-fail ${TARGET}: first error line as expected: ${_first}")
