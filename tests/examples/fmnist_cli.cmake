# The fashion_mnist example's command line: --help and the error of a wrong enum value
# list the choices by name and print no control characters (a CLI::CheckedTransformer
# over the std::uint8_t enums printed their raw values, e.g. "topk->^A").
#   cmake -DEXE=<fashion_mnist> -DWORK_DIR=<dir> -P fmnist_cli.cmake
cmake_minimum_required(VERSION 3.25)
foreach(v EXE WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "fmnist_cli: -D${v}=... is required")
  endif()
endforeach()
file(MAKE_DIRECTORY ${WORK_DIR})

set(_failed FALSE)
macro(fail msg)
  message(SEND_ERROR "fmnist_cli: ${msg}")
  set(_failed TRUE)
endmacro()

# Runs EXE with the arguments after `file`, stdout and stderr together into `file`;
# sets rc, text (the output as text) and controls (the control bytes found, as hex).
macro(run file)
  execute_process(COMMAND ${EXE} ${ARGN} OUTPUT_FILE ${file} ERROR_FILE ${file} RESULT_VARIABLE rc TIMEOUT 60)
  # Read as hex: a NUL byte would end a CMake string early.
  file(READ ${file} _hex HEX)
  string(REGEX MATCHALL ".." _bytes "${_hex}")
  set(controls ${_bytes})
  # Bytes below 0x20 other than \t (09), \n (0a) and \r (0d), and DEL (7f).
  list(FILTER controls INCLUDE REGEX "^(0[0-8bcef]|1[0-9a-f]|7f)$")
  list(REMOVE_DUPLICATES controls)
  file(READ ${file} text)
  message("---- ${EXE} ${ARGN} (exit status ${rc}) ----\n${text}")
endmacro()

# (1) --help: succeeds, no control characters, every enum option's choices by name.
run(${WORK_DIR}/fmnist_cli_help.txt --help)
if(NOT rc STREQUAL "0")
  fail("--help exited with ${rc}")
endif()
if(controls)
  fail("--help prints control characters (bytes ${controls})")
endif()
foreach(name topk randomk identity powersgd allgather dense_allreduce low_rank_allreduce compressed_allreduce gravac
             fixed moo)
  if(NOT text MATCHES "[{,]${name}[,}]")
    fail("--help does not list the choice '${name}'")
  endif()
endforeach()

# (2) a wrong value of each enum option: non-zero exit, the accepted names, no control characters.
foreach(case "compressor;topk;powersgd" "collective;allgather;flexible;compressed_allreduce" "policy;gravac;accordion")
  list(GET case 0 opt)
  list(SUBLIST case 1 -1 expected)
  run(${WORK_DIR}/fmnist_cli_bad_${opt}.txt --${opt} nonsense)
  if(rc STREQUAL "0" OR NOT rc MATCHES "^[0-9]+$")
    fail("--${opt} nonsense: exit status '${rc}', expected a non-zero exit")
  endif()
  if(controls)
    fail("--${opt} nonsense: the message has control characters (bytes ${controls})")
  endif()
  if(NOT text MATCHES "--${opt}")
    fail("--${opt} nonsense: the message does not name the option")
  endif()
  foreach(name IN LISTS expected)
    if(NOT text MATCHES "[{,]${name}[,}]")
      fail("--${opt} nonsense: the message does not list the accepted name '${name}'")
    endif()
  endforeach()
endforeach()

# (3) --collective-timeout: a negative, non-finite or non-numeric value is refused by name
# before anything runs (0 is "off"; a positive value is seconds).
foreach(value -1 nan inf soon)
  run(${WORK_DIR}/fmnist_cli_timeout_${value}.txt --collective-timeout ${value})
  if(rc STREQUAL "0" OR NOT rc MATCHES "^[0-9]+$")
    fail("--collective-timeout ${value}: exit status '${rc}', expected a non-zero exit")
  endif()
  if(NOT text MATCHES "--collective-timeout: must be 0 \\(off\\) or a positive number of seconds")
    fail("--collective-timeout ${value}: the message does not say what is accepted")
  endif()
endforeach()

if(_failed)
  message(FATAL_ERROR "fmnist_cli: failed")
endif()
message(STATUS "fmnist_cli: passed")
