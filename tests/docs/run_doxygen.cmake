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
# The guides carry no {#label} (GitHub would show it in the title), so Doxygen names each
# page after its file (md_docs_getting_started.html; newer Doxygen escapes the name
# differently): find each guide's page by its title, the guide's first heading.
if(NOT EXISTS ${OUT_DIR}/html/index.html)
  message(FATAL_ERROR "doxygen did not produce index.html")
endif()
file(GLOB _pages ${OUT_DIR}/html/md_docs*.html)
set(_titles "")
foreach(_page IN LISTS _pages)
  file(STRINGS ${_page} _title REGEX "<title>" LIMIT_COUNT 1)
  string(APPEND _titles "${_title}\n")
  if(_title MATCHES "Compressor concept")
    set(_compressor_page ${_page})
  endif()
endforeach()
file(GLOB _guides ${SOURCE_DIR}/docs/*.md)
foreach(_guide IN LISTS _guides)
  get_filename_component(_name ${_guide} NAME_WE)
  if(_name STREQUAL "mainpage")
    continue()
  endif()
  file(STRINGS ${_guide} _heading LIMIT_COUNT 1)
  string(REGEX REPLACE "^# " "" _heading "${_heading}")
  if(_heading MATCHES "{#([A-Za-z0-9_]+)}")  # a page with a label is named after it
    if(NOT EXISTS ${OUT_DIR}/html/${CMAKE_MATCH_1}.html)
      message(FATAL_ERROR "doxygen did not produce ${CMAKE_MATCH_1}.html for docs/${_name}.md")
    endif()
    continue()
  endif()
  string(FIND "${_titles}" ": ${_heading}</title>" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "doxygen did not produce a page titled '${_heading}' for docs/${_name}.md")
  endif()
endforeach()
# The guides' inline code (compiled by the docs_code_blocks test) reaches the pages, and
# their Markdown links between guides resolve to pages, not to the .md files.
if(NOT _compressor_page)
  message(FATAL_ERROR "doxygen did not produce the Compressor concept page")
endif()
file(READ ${_compressor_page} _html)
if(NOT _html MATCHES "alternating_layers")
  message(FATAL_ERROR "the Compressor concept page lacks the custom compressor's code")
endif()
file(READ ${OUT_DIR}/html/index.html _html)
if(NOT _html MATCHES "href=\"md_docs_[^\"]*getting_+started")
  message(FATAL_ERROR "index.html does not link the getting-started page")
endif()
message(STATUS "doxygen: no warnings; HTML in ${OUT_DIR}/html")
