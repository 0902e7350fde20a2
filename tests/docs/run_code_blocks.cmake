# Compiles every ```cpp block of the guides and runs the whole programs among them.
# cmake -DSOURCE_DIR=<repo> -DBINARY_DIR=<dir> -DGENERATOR=<gen> -DCXX=<compiler>
#       [-DJOBS=<n>] [-DRUNTIME_LIBRARY=<libgravac_runtime.a>] -P run_code_blocks.cmake
# RUNTIME_LIBRARY: the calling build's gravac::runtime, linked by the blocks that need it
# instead of compiling it again.
# A block that does not compile is named by its guide and line: the compiler's messages
# carry them (#line), and the summary lists every failing block.
if(NOT JOBS)
  set(JOBS 2)
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/docs/code_blocks -B ${BINARY_DIR} -G ${GENERATOR}
          -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE= -DCMAKE_CXX_FLAGS=-O0 -DGRAVAC_SOURCE_DIR=${SOURCE_DIR}
          -DGRAVAC_ENABLE_CUDA=OFF -DGRAVAC_ENABLE_TORCH=OFF -DGRAVAC_RUNTIME_PREBUILT=${RUNTIME_LIBRARY}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the guides' code blocks failed (see above)")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --parallel ${JOBS} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  # Name every block that fails: build them one by one (those already built are up to date).
  file(STRINGS ${BINARY_DIR}/blocks.txt entries)
  set(failed "")
  foreach(entry IN LISTS entries)
    string(REPLACE "|" ";" fields "${entry}")
    list(GET fields 0 target)
    list(GET fields 1 where)
    execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --target ${target}
                    RESULT_VARIABLE trc OUTPUT_QUIET ERROR_QUIET)
    if(NOT trc EQUAL 0)
      string(APPEND failed "\n  ${where}")
    endif()
  endforeach()
  message(FATAL_ERROR "these code blocks of the guides do not compile (errors above):${failed}")
endif()
execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --output-on-failure WORKING_DIRECTORY ${BINARY_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "a program of the guides failed when run (its guide and line name the test above)")
endif()
