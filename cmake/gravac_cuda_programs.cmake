# How gravac's own nvcc programs (the GPU test suites and the GPU benchmarks) are built.
#
#   program  executables; the tests run them and skip (exit 77) where no GPU is visible
#   ptx      the device front end only (nvcc --ptx, one virtual architecture): every
#            translation unit is parsed and its kernels compiled, but nothing is linked and
#            no test is registered. For machines without a GPU, where the executables could
#            only be skipped: the host compiler's pass over the same sources is the host
#            double's build (tests/cuda/host_double), so building them whole again repeats
#            it at three times the cost (39 s against 12 s for test_cuda_kernels.cu).
# gravac_cuda_program(<name> <source> [WHOLE]) adds <name> either way and sets
# <name>_IS_PROGRAM in the caller's scope; WHOLE builds it as an executable in both modes
# (one suite stays whole so that the real host pass and the link against CUDA and NCCL
# are proved where there is no GPU as well).
set(GRAVAC_CUDA_PROGRAMS "program" CACHE STRING
    "gravac's nvcc test suites and GPU benchmarks: program (executables) or ptx (compile-checked only)")
set_property(CACHE GRAVAC_CUDA_PROGRAMS PROPERTY STRINGS program ptx)
if(NOT GRAVAC_CUDA_PROGRAMS MATCHES "^(program|ptx)$")
  message(FATAL_ERROR "GRAVAC_CUDA_PROGRAMS is '${GRAVAC_CUDA_PROGRAMS}': use program or ptx")
endif()

function(gravac_cuda_program name source)
  cmake_parse_arguments(PARSE_ARGV 2 _arg "WHOLE" "" "")
  if(GRAVAC_CUDA_PROGRAMS STREQUAL "program" OR _arg_WHOLE)
    add_executable(${name} ${source})
    set(${name}_IS_PROGRAM TRUE PARENT_SCOPE)
    return()
  endif()
  add_library(${name} OBJECT ${source})
  list(GET CMAKE_CUDA_ARCHITECTURES 0 _arch)
  string(REGEX REPLACE "-(real|virtual)$" "" _arch "${_arch}")
  set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES ${_arch}-virtual CUDA_PTX_COMPILATION ON)
  set(${name}_IS_PROGRAM FALSE PARENT_SCOPE)
endfunction()

if(CMAKE_CUDA_COMPILER AND GRAVAC_CUDA_PROGRAMS STREQUAL "ptx")
  message(STATUS "gravac: nvcc test suites and GPU benchmarks are compile-checked only (GRAVAC_CUDA_PROGRAMS=ptx)")
endif()
