# gravac_format_files(<root> <out-var>): the C++ and CUDA sources under clang-format's
# rules, relative to <root>: include/, tests/, bench/, examples/, python/ and tools/, without build
# trees, fuzz corpora or generated files.
function(gravac_format_files root out)
  set(_globs)
  foreach(_dir include tests bench examples python tools)
    foreach(_ext hpp cpp cu cuh h)
      list(APPEND _globs ${root}/${_dir}/*.${_ext})
    endforeach()
  endforeach()
  file(GLOB_RECURSE _files RELATIVE ${root} ${_globs})
  list(FILTER _files EXCLUDE REGEX "(^|/)(build[^/]*|corpus|third_party)/")
  list(SORT _files)
  set(${out} ${_files} PARENT_SCOPE)
endfunction()
