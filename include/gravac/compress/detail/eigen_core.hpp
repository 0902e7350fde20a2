#pragma once
//! \file
//! \brief <Eigen/Core>, included once for gravac and its example. GCC 12 reports
//! -Wmaybe-uninitialized (at -O3) and -Wuninitialized (at -O1) inside its own AVX-512
//! intrinsics (the `__m512 __Y = __Y;` of _mm512_undefined_ps) when Eigen's packet code is
//! inlined into a caller: a false positive in third-party code, silenced for Eigen only.

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
