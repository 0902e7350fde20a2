#pragma once
//! \file
//! \brief The compiler options every gravac CUDA header needs, checked first, so that a
//! build without them fails with one line that names them instead of a run of errors
//! from inside the kernels. Linking the CMake target gravac::cuda adds them; builds
//! without CMake pass `nvcc -std=c++20 --extended-lambda --expt-relaxed-constexpr`.
//! The host test build (GRAVAC_CUDA_HOST_DOUBLE: a C++ compiler against the test double of
//! tests/cuda/host_double) is accepted too; the nvcc options are checked under nvcc only.

#if !defined(__CUDACC__) && !defined(GRAVAC_CUDA_HOST_DOUBLE)
#error "gravac/cuda headers need a CUDA compiler: compile this file as CUDA (link gravac::cuda)"
#endif
#if __cplusplus < 202002L
#error "gravac/cuda headers need C++20: nvcc -std=c++20 (linking gravac::cuda adds it)"
#endif
#if defined(__NVCC__) && !defined(__CUDACC_RELAXED_CONSTEXPR__)
#error \
    "gravac/cuda headers need nvcc's --expt-relaxed-constexpr (the kernels call the core's constexpr helpers); link gravac::cuda, or pass -std=c++20 --extended-lambda --expt-relaxed-constexpr"
#endif
#if defined(__NVCC__) && !defined(__CUDACC_EXTENDED_LAMBDA__)
#error \
    "gravac/cuda headers need nvcc's --extended-lambda (device code takes lambdas); link gravac::cuda, or pass -std=c++20 --extended-lambda --expt-relaxed-constexpr"
#endif
