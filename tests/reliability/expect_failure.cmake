# Runs COMMAND (a ;-list) and passes only when it fails: a non-zero exit status, output
# (stdout and stderr together) matching the regex EXPECT, within DEADLINE seconds. A
# command that succeeds, hangs, or fails without the expected message fails the test.
# With EXPECT_ALSO, the output must match that regex too (in any order).
#   cmake -DCOMMAND=... -DEXPECT=... [-DEXPECT_ALSO=...] [-DDEADLINE=s] -P expect_failure.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED DEADLINE)
  set(DEADLINE 120)
endif()
list(FILTER COMMAND EXCLUDE REGEX "^$")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                TIMEOUT ${DEADLINE})
message("${out}")
if(rc STREQUAL "0")
  message(FATAL_ERROR "expect_failure: the command succeeded, but it had to fail")
elseif(rc MATCHES "timeout|Process terminated due to timeout")
  message(FATAL_ERROR "expect_failure: the command did not end within ${DEADLINE} s (a hang)")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "expect_failure: exit status ${rc}, but the output does not match '${EXPECT}'")
endif()
if(DEFINED EXPECT_ALSO AND NOT out MATCHES "${EXPECT_ALSO}")
  message(FATAL_ERROR "expect_failure: exit status ${rc}, but the output does not match '${EXPECT_ALSO}'")
endif()
message(STATUS "expect_failure: failed as expected (exit status ${rc})")
