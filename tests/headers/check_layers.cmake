# Every arrow points down: a header under include/gravac may include only headers of its own
# layer or of a lower one (docs/architecture.md draws the layers), and names every header it
# includes literally (an include through a macro would hide an arrow from this check).
#   cmake -DGRAVAC_INCLUDE_DIR=<dir holding gravac/> -P check_layers.cmake
# A header's layer is its folder's, read from the table below and from nothing else: a file's
# name never decides it, and a header in a folder the table does not list is an error. A
# folder's detail/ is the folder's layer. No two headers share a name either (which of two
# step_settings.hpp a comment or an include meant is a question nobody should have to ask);
# a forwarding header that keeps an old public path (nothing but includes, one of them, of a
# header with its own name) is that header under another path, not a second one.
# Fails naming every offending line. tests/headers runs it on include/ and, to show that it
# can fail, on a small tree with each fault (tests/headers/layers_fixture).
cmake_policy(VERSION 3.25)
if(NOT GRAVAC_INCLUDE_DIR)
  message(FATAL_ERROR "check_layers: pass -DGRAVAC_INCLUDE_DIR=<dir holding gravac/>")
endif()

# The layers from the bottom up, each "layer folder...".
set(_layers
  "core gravac/core"
  "packet gravac/packet"
  "concepts gravac/concepts"
  "stats gravac/stats"
  "compress gravac/compress"
  "network gravac/network"
  "comm gravac/comm"
  "collective gravac/collective gravac/collective/control"
  "policy gravac/policy"
  "cuda gravac/cuda"
  "composer gravac gravac/trainer gravac/local"
  "runtime gravac/runtime"
  "adapters gravac/adapters")

# The layer (rank from the bottom, name) of the header at \p path (relative to the include
# directory): its folder without a trailing detail/, looked up in the table.
function(_layer_of path out_rank out_name out_folder)
  get_filename_component(folder "${path}" DIRECTORY)
  string(REGEX REPLACE "/detail$" "" folder "${folder}")
  set(${out_folder} "${folder}" PARENT_SCOPE)
  set(rank 0)
  foreach(entry IN LISTS _layers)
    string(REPLACE " " ";" parts "${entry}")
    list(POP_FRONT parts name)
    if(folder IN_LIST parts)
      set(${out_rank} ${rank} PARENT_SCOPE)
      set(${out_name} ${name} PARENT_SCOPE)
      return()
    endif()
    math(EXPR rank "${rank} + 1")
  endforeach()
  set(${out_rank} -1 PARENT_SCOPE)
  set(${out_name} "" PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE _headers RELATIVE ${GRAVAC_INCLUDE_DIR} ${GRAVAC_INCLUDE_DIR}/gravac/*.hpp)
list(SORT _headers)
set(_problems)
set(_names)
list(LENGTH _headers _count)
foreach(h IN LISTS _headers)
  _layer_of("${h}" mine mine_name mine_folder)
  if(mine LESS 0)
    list(APPEND _problems "${h}: its folder ${mine_folder}/ is in no layer (add it to tests/headers/check_layers.cmake)")
    continue()
  endif()
  file(STRINGS ${GRAVAC_INCLUDE_DIR}/${h} _all)
  set(_forwarding TRUE)
  set(_targets)
  set(_lines)
  foreach(l IN LISTS _all)
    if(NOT l MATCHES "^[ \t]*(//.*|#pragma once|#include \"gravac/[^\"]+\"[ \t]*(//.*)?)?$")
      set(_forwarding FALSE)
    endif()
    if(l MATCHES "^[ \t]*#[ \t]*include")
      list(APPEND _lines "${l}")
    endif()
  endforeach()
  foreach(l IN LISTS _lines)
    if(NOT l MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"]")
      list(APPEND _problems "${h}: an include through a macro hides its arrow: ${l}")
      continue()
    endif()
    if(NOT l MATCHES "include[ \t]*[<\"](gravac/[^>\"]+)")
      continue()
    endif()
    set(target ${CMAKE_MATCH_1})
    list(APPEND _targets ${target})
    if(NOT EXISTS ${GRAVAC_INCLUDE_DIR}/${target})
      list(APPEND _problems "${h}: includes ${target}, which does not exist")
      continue()
    endif()
    _layer_of("${target}" theirs theirs_name theirs_folder)
    if(theirs GREATER mine)
      list(APPEND _problems "${h} (${mine_name}) includes ${target} (${theirs_name}): an arrow that points up")
    endif()
  endforeach()
  # One name, one header: a forwarding header of the same name is the header it forwards to.
  get_filename_component(_name "${h}" NAME)
  list(LENGTH _targets _n_targets)
  if(_forwarding AND _n_targets EQUAL 1)
    get_filename_component(_target_name "${_targets}" NAME)
    if(_target_name STREQUAL _name)
      continue()
    endif()
  endif()
  string(MAKE_C_IDENTIFIER "${_name}" _key)
  if(DEFINED _first_${_key})
    list(APPEND _problems "${h}: shares its name with ${_first_${_key}} (rename one to say what it holds)")
  else()
    set(_first_${_key} ${h})
  endif()
endforeach()

if(_problems)
  foreach(p IN LISTS _problems)
    message(NOTICE "check_layers: ${p}")  # one unwrapped line each
  endforeach()
  list(LENGTH _problems _n)
  message(FATAL_ERROR "check_layers: ${_n} problem(s) with the layering (above)")
endif()
message(STATUS "check_layers: ${_count} headers, every include points down, no two share a name")
