# Prints the files under clang-format's rules, one per line (for scripts/format).
#   cmake -DROOT=<repository> -P list_files.cmake
include(${CMAKE_CURRENT_LIST_DIR}/format_files.cmake)
gravac_format_files(${ROOT} _files)
foreach(_f IN LISTS _files)
  message("${_f}")
endforeach()
