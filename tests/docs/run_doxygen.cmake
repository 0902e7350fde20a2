# Runs doxygen on the project's Doxyfile with warnings as errors, into OUT_DIR.
# cmake -DDOXYGEN=<exe> -DSOURCE_DIR=<repo> -DOUT_DIR=<dir> -P run_doxygen.cmake
file(REMOVE_RECURSE ${OUT_DIR})
file(MAKE_DIRECTORY ${OUT_DIR})
# Later assignments win: keep the project's settings, redirect the output, fail on any
# warning (after reporting them all), and skip the graphs (slow, and not under test).
file(WRITE ${OUT_DIR}/Doxyfile "@INCLUDE = ${SOURCE_DIR}/Doxyfile
OUTPUT_DIRECTORY = ${OUT_DIR}
WARN_AS_ERROR = FAIL_ON_WARNINGS
WARN_LOGFILE = ${OUT_DIR}/warnings.log
HAVE_DOT = NO
QUIET = YES
")
execute_process(COMMAND ${DOXYGEN} ${OUT_DIR}/Doxyfile WORKING_DIRECTORY ${SOURCE_DIR} RESULT_VARIABLE _rc)
file(READ ${OUT_DIR}/warnings.log _warnings)
if(NOT _rc EQUAL 0 OR NOT _warnings STREQUAL "")
  message(FATAL_ERROR "doxygen failed (exit ${_rc}) with these warnings:\n${_warnings}")
endif()
foreach(_page index getting_started concept_compressor concept_collective concept_communicator concept_policy
              choosing_a_policy algorithms custom_sparse_compressor)
  if(NOT EXISTS ${OUT_DIR}/html/${_page}.html)
    message(FATAL_ERROR "doxygen did not produce ${_page}.html")
  endif()
endforeach()
# The guides' inline code (compiled by the docs_code_blocks test) reaches the pages, and
# their Markdown links between guides resolve to pages, not to the .md files.
file(READ ${OUT_DIR}/html/concept_compressor.html _html)
if(NOT _html MATCHES "alternating_layers")
  message(FATAL_ERROR "concept_compressor.html lacks the custom compressor's code")
endif()
file(READ ${OUT_DIR}/html/index.html _html)
if(NOT _html MATCHES "href=\"getting_started.html")
  message(FATAL_ERROR "index.html does not link the getting-started page")
endif()
message(STATUS "doxygen: no warnings; HTML in ${OUT_DIR}/html")
