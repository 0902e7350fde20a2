# The demo's build prints no compiler warning: configures and builds the target
# scripts/demo builds, with the options scripts/demo passes (Release, no tests, no
# benchmarks, target fashion_mnist), into a build directory of its own, and fails on any
# `warning:` in the build's output, naming first those located in gravac's own files
# (include/gravac/, examples/).
# On demand (a whole Release build: about 6 minutes on 2 cores). CI does not run it; its
# build compiles the same sources with GRAVAC_WERROR (warnings are errors) instead:
#   cmake -DSOURCE_DIR=$PWD -DBINARY_DIR=/tmp/demo_build -DGENERATOR=Ninja -DCXX=c++ \
#         -P tests/examples/demo_build_warnings.cmake
# cmake -DSOURCE_DIR=<repo> -DBINARY_DIR=<dir> -DGENERATOR=<gen> -DCXX=<compiler>
#       [-DJOBS=<n>] -P demo_build_warnings.cmake
# The build directory is kept (configure is then quick), but every run cleans it first: an
# object file left from an earlier run would not be compiled again, nor warned about.
if(NOT JOBS)
  set(JOBS 2)
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR} -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
          -DCMAKE_BUILD_TYPE=Release -DGRAVAC_BUILD_TESTS=OFF -DGRAVAC_BUILD_BENCHMARKS=OFF
  OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the demo's build failed:\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --target clean OUTPUT_QUIET ERROR_QUIET)
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --parallel ${JOBS} --target fashion_mnist
                OUTPUT_VARIABLE log ERROR_VARIABLE log RESULT_VARIABLE rc)
file(WRITE ${BINARY_DIR}/demo_build.log "${log}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the demo's build failed (log in ${BINARY_DIR}/demo_build.log):\n${log}")
endif()
# Lines, without CMake's list separators getting in the way.
string(REPLACE ";" "," log "${log}")
string(REPLACE "\n" ";" lines "${log}")
set(own "")
set(other "")
foreach(line IN LISTS lines)
  if(line MATCHES "warning:")
    if(line MATCHES "(${SOURCE_DIR}/)?(include/gravac|examples)/[^:]*:[0-9]+")
      string(APPEND own "\n  ${line}")
    else()
      string(APPEND other "\n  ${line}")
    endif()
  endif()
endforeach()
if(own OR other)
  set(where "")
  if(own)
    string(APPEND where "\nin gravac's own files:${own}")
  endif()
  if(other)
    string(APPEND where "\nelsewhere (third-party code, reached from gravac's):${other}")
  endif()
  message(FATAL_ERROR "the demo's build printed compiler warnings (whole log in ${BINARY_DIR}/demo_build.log):${where}")
endif()
message(STATUS "the demo's build printed no warning")
