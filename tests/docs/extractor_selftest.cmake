# Checks extract_code_blocks.cmake on a guide written to trip it: CMake's list syntax in
# code (';', '[', ']', '\'), empty lines, a fence of another language, an indented fence,
# a continued block, and a fence left open.
# cmake -DWORK_DIR=<dir> -P extractor_selftest.cmake
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/extract_code_blocks.cmake)
if(NOT WORK_DIR)
  message(FATAL_ERROR "pass -DWORK_DIR=<dir>")
endif()
if(UNFINISHED)  # the second run: a guide whose last fence is never closed
  file(WRITE ${WORK_DIR}/open.md "# Open\n\n```cpp\nint x;\n")
  gravac_extract_code_blocks(${WORK_DIR}/open.md docs/open.md ${WORK_DIR}/out O)
  return()
endif()
file(REMOVE_RECURSE ${WORK_DIR})
set(bt "```")
file(WRITE ${WORK_DIR}/guide.md "# Guide

${bt}sh
echo ${bt}cpp is not code here
${bt}

${bt}cpp
#include <cstdio>
int a[2] = {1, 2};  // [unbalanced; one ] two ]]

const char* s = \"a\\\\b;\";
${bt}

Text.

<!-- continued -->
${bt}cpp
int main() { return a[0] - 1; }
${bt}

1. A list item:

   ${bt}c++
   struct t {
     int v;
   };
   ${bt}
")
gravac_extract_code_blocks(${WORK_DIR}/guide.md docs/guide.md ${WORK_DIR}/out G)
set(expected_units "guide_8;guide_24")
if(NOT G_UNITS STREQUAL expected_units)
  message(FATAL_ERROR "units: got '${G_UNITS}', expected '${expected_units}'")
endif()
file(READ ${G_guide_8_SOURCE} got)
set(want "#line 8 \"docs/guide.md\"
#include <cstdio>
int a[2] = {1, 2};  // [unbalanced; one ] two ]]

const char* s = \"a\\\\b;\";
#line 18 \"docs/guide.md\"
int main() { return a[0] - 1; }
")
if(NOT got STREQUAL want)
  message(FATAL_ERROR "the first unit differs:\n---\n${got}---\nexpected:\n---\n${want}---")
endif()
if(NOT G_guide_8_PROGRAM OR G_guide_24_PROGRAM)
  message(FATAL_ERROR "int main was not detected in the first unit only")
endif()
if(NOT G_guide_8_WHERE STREQUAL "docs/guide.md:8")
  message(FATAL_ERROR "where: got '${G_guide_8_WHERE}'")
endif()
file(READ ${G_guide_24_SOURCE} got)
set(want "#line 24 \"docs/guide.md\"\nstruct t {\n  int v;\n};\n")
if(NOT got STREQUAL want)
  message(FATAL_ERROR "the indented block differs:\n---\n${got}---")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -DWORK_DIR=${WORK_DIR} -DUNFINISHED=ON -P ${CMAKE_CURRENT_LIST_FILE}
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "docs/open.md:3: a code fence is never closed")
  message(FATAL_ERROR "an unclosed fence was not reported with its guide and line:\n${err}")
endif()
message(STATUS "extract_code_blocks: all checks passed")
