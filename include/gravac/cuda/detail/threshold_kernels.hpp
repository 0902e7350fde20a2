#pragma once
//! \file threshold_kernels.hpp
//! \brief The estimate of threshold_cuda, the device twin of threshold::estimate(): a
//! 4096-bin count histogram of |u| (the magnitude_histogram bins: exponent and 4 mantissa
//! bits) over the whole layer or over the same seeded sample runs, then the same boundary
//! and the same interpolation, in the same double operations (explicitly rounded, so the
//! compiler cannot fuse them into an FMA the host does not use). The low threshold key it
//! writes is bit for bit the host's, so the selection that follows is the host's too.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cfloat>
#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/select_kernels.hpp"

namespace gravac::detail {

//! Bits of the key dropped to form an estimate bin (magnitude_histogram::shift).
inline constexpr int estimate_shift = 19;
//! Bins of the estimate histogram (magnitude_histogram::bins).
inline constexpr int estimate_bins = 1 << (31 - estimate_shift);
//! The first bin of infinity and NaN (magnitude_histogram::first_non_finite_bin).
inline constexpr std::uint32_t estimate_first_non_finite_bin = non_finite_key >> estimate_shift;
//! The key that collects nothing (detail::no_guess).
inline constexpr std::uint32_t estimate_none = 0xffffffffu;

//! What the host derived for one layer's estimate (data-independent, as threshold::estimate).
struct estimate_request {
  unsigned long long n = 0;            //!< layer size
  unsigned long long k = 0;            //!< kept_count(n, fraction)
  int sampled = 0;                     //!< 0: histogram of the whole layer
  unsigned long long runs = 0;         //!< sampled: strata, one run each
  unsigned long long run = 0;          //!< sampled: run length
  unsigned long long stratum = 0;      //!< sampled: stratum size
  unsigned long long room = 1;         //!< sampled: stratum - run + 1
  unsigned long long seed = 0;         //!< sampled: mix_seed(seed, step, layer id)
  double target = 0;                   //!< sampled: hits + 4 sqrt(hits) + 4
  unsigned long long target_ceil = 0;  //!< sampled: ceil(target)
};

//! splitmix64's (n+1)-th output from \p seed (detail::splitmix64_nth).
__device__ __forceinline__ std::uint64_t splitmix64_nth_device(std::uint64_t seed, std::uint64_t n) {
  std::uint64_t z = seed + (n + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

//! Counts key(g + e) into \p hist (estimate_bins zeroed counters) over the whole layer or
//! over the sample: run s starts at s * stratum + splitmix64 draw s % room, as the host.
static __global__ void __launch_bounds__(select_threads)
    estimate_histogram(const float* __restrict__ g, const float* __restrict__ e, estimate_request rq,
                       std::uint32_t* __restrict__ hist) {
  __shared__ std::uint32_t sh[estimate_bins];
  for (int i = static_cast<int>(threadIdx.x); i < estimate_bins; i += select_threads) sh[i] = 0;
  __syncthreads();
  const unsigned long long total = rq.sampled ? rq.runs * rq.run : rq.n;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * select_threads;
  for (unsigned long long i = blockIdx.x * static_cast<unsigned long long>(select_threads) + threadIdx.x; i < total;
       i += stride) {
    unsigned long long at = i;
    if (rq.sampled) {
      const unsigned long long s = i / rq.run;
      at = s * rq.stratum + splitmix64_nth_device(rq.seed, s) % rq.room + (i - s * rq.run);
    }
    const float u = __fadd_rn(g[at], e[at]);
    atomicAdd(&sh[device_magnitude_key(u) >> estimate_shift], 1u);
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < estimate_bins; i += select_threads)
    if (sh[i]) atomicAdd(&hist[i], sh[i]);
}

//! One block: the low threshold key from the histogram (threshold::estimate's last lines
//! and detail::threshold_key_from_histogram), into \p guess; zeroes \p hist for the next layer.
static __global__ void __launch_bounds__(select_threads)
    estimate_threshold(std::uint32_t* __restrict__ hist, estimate_request rq, std::uint32_t* __restrict__ guess) {
  __shared__ std::uint32_t sh[estimate_bins];
  std::uint32_t mine = 0;
  for (int i = static_cast<int>(threadIdx.x); i < estimate_bins; i += select_threads) {
    // Infinity and NaN are not candidates: the host's boundary search starts below them.
    sh[i] = static_cast<std::uint32_t>(i) < estimate_first_non_finite_bin ? hist[i] : 0u;
    mine += sh[i];
    hist[i] = 0;
  }
  using reduce_t = block_reduce<std::uint32_t, select_threads>;
  __shared__ typename reduce_t::TempStorage red;
  __shared__ std::uint32_t finite_sh;
  const std::uint32_t finite = reduce_t(red).Sum(mine);
  if (threadIdx.x == 0) finite_sh = finite;
  __syncthreads();
  const std::uint32_t fin = finite_sh;
  const unsigned long long want_raw = rq.sampled ? rq.target_ceil : rq.k;
  const bool none = rq.k == 0 || fin == 0 || want_raw == 0;
  const auto want = static_cast<std::uint32_t>(want_raw < fin ? want_raw : fin);
  const boundary b = find_device_boundary(sh, estimate_bins, none ? 0u : want);  // block-wide
  if (threadIdx.x != 0) return;
  if (none) {
    *guess = estimate_none;
    return;
  }
  const std::uint32_t lower = b.bin << estimate_shift;
  if (!rq.sampled) {
    *guess = lower;
    return;
  }
  const double lo = static_cast<double>(__uint_as_float(lower));
  const double hi = b.bin + 1 >= estimate_first_non_finite_bin
                        ? static_cast<double>(FLT_MAX)
                        : static_cast<double>(__uint_as_float((b.bin + 1) << estimate_shift));
  const double c = static_cast<double>(b.count);
  double need = __dsub_rn(rq.target, static_cast<double>(b.above));
  need = need < 0.0 ? 0.0 : (need > c ? c : need);
  const double t = b.count == 0 ? lo : __dsub_rn(hi, __dmul_rn(__ddiv_rn(need, c), __dsub_rn(hi, lo)));
  const std::uint32_t key = device_magnitude_key(__double2float_rn(t));
  *guess = key > lower ? key : lower;
}

}  // namespace gravac::detail
