# Every arrow points down: a header under include/gravac may include only headers of its own
# layer or of a lower one (docs/architecture.md draws the layers), and names every header it
# includes literally (an include through a macro would hide an arrow from this check).
#   cmake -DGRAVAC_INCLUDE_DIR=<dir holding gravac/> -P check_layers.cmake
# Fails naming every offending line. tests/headers runs it on include/ and, to show that it
# can fail, on a small tree with an upward and a hidden include (tests/headers/layers_fixture).
if(NOT GRAVAC_INCLUDE_DIR)
  message(FATAL_ERROR "check_layers: pass -DGRAVAC_INCLUDE_DIR=<dir holding gravac/>")
endif()

# The layers from the bottom up, each "name pattern...": the first pattern a header's path
# matches gives its layer.
set(_layers
  "base ^gravac/(error|layout|memory|step|atomic_file|bucket_plan|non_finite_action)\\.hpp$ ^gravac/detail/(fnv1a|random|isa_dispatch|seconds_since|bucket_states|host_transfer)\\.hpp$"
  "packet ^gravac/packet/"
  "concepts ^gravac/(concepts|composition)\\.hpp$ ^gravac/detail/(non_finite_ops|layer_events)\\.hpp$"
  "stats ^gravac/stats/"
  "compress ^gravac/compress/"
  "network ^gravac/network/"
  "comm ^gravac/comm/"
  "collective ^gravac/collective/"
  "policy ^gravac/policy/"
  "cuda ^gravac/cuda/"
  "composer ^gravac/(trainer|checkpoint|telemetry)\\.hpp$ ^gravac/detail/"
  "runtime ^gravac/runtime/"
  "adapters ^gravac/adapters/ ^gravac/gravac\\.hpp$")

function(_layer_of path out_rank out_name)
  set(rank 0)
  foreach(entry IN LISTS _layers)
    string(REPLACE " " ";" parts "${entry}")
    list(POP_FRONT parts name)
    foreach(re IN LISTS parts)
      if(path MATCHES "${re}")
        set(${out_rank} ${rank} PARENT_SCOPE)
        set(${out_name} ${name} PARENT_SCOPE)
        return()
      endif()
    endforeach()
    math(EXPR rank "${rank} + 1")
  endforeach()
  set(${out_rank} -1 PARENT_SCOPE)
  set(${out_name} "" PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE _headers RELATIVE ${GRAVAC_INCLUDE_DIR} ${GRAVAC_INCLUDE_DIR}/gravac/*.hpp)
list(SORT _headers)
set(_problems)
list(LENGTH _headers _count)
foreach(h IN LISTS _headers)
  _layer_of("${h}" mine mine_name)
  if(mine LESS 0)
    list(APPEND _problems "${h}: in no layer (add its folder to tests/headers/check_layers.cmake)")
    continue()
  endif()
  file(STRINGS ${GRAVAC_INCLUDE_DIR}/${h} _lines REGEX "^[ \t]*#[ \t]*include")
  foreach(l IN LISTS _lines)
    if(NOT l MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"]")
      list(APPEND _problems "${h}: an include through a macro hides its arrow: ${l}")
      continue()
    endif()
    if(NOT l MATCHES "include[ \t]*[<\"](gravac/[^>\"]+)")
      continue()
    endif()
    set(target ${CMAKE_MATCH_1})
    if(NOT EXISTS ${GRAVAC_INCLUDE_DIR}/${target})
      list(APPEND _problems "${h}: includes ${target}, which does not exist")
      continue()
    endif()
    _layer_of("${target}" theirs theirs_name)
    if(theirs GREATER mine)
      list(APPEND _problems "${h} (${mine_name}) includes ${target} (${theirs_name}): an arrow that points up")
    endif()
  endforeach()
endforeach()

if(_problems)
  foreach(p IN LISTS _problems)
    message(NOTICE "check_layers: ${p}")  # one unwrapped line each
  endforeach()
  list(LENGTH _problems _n)
  message(FATAL_ERROR "check_layers: ${_n} problem(s) with the layering (above)")
endif()
message(STATUS "check_layers: ${_count} headers, every include points down")
