#pragma once
//! \file
//! \brief Runs a CPU kernel compiled for AVX2 when the processor has it, without the user
//! building with -mavx2. The quantizers' per-element work (32-bit multiplies of the random
//! draws, float-to-int conversions, selects) is compute bound on baseline x86-64 (SSE2 has
//! no 32-bit vector multiply); AVX2 runs it at twice the width with native multiplies.
//! (The fused top-k pass, written with intrinsics, has its own AVX2 version chosen by
//! runs_avx2_kernels(): fused_pass_avx2 in compress/detail/fused_pass.hpp.)
//!
//! How: the kernel is a lambda marked GRAVAC_KERNEL_LAMBDA whose callees are marked
//! GRAVAC_KERNEL_INLINE (always inlined); with_best_isa calls it either directly or from
//! a function compiled with the target attribute "avx2", into which the whole kernel is
//! inlined and so compiled for AVX2. The choice is made once per process. Only "avx2" is
//! enabled, not "fma": a fused multiply-add rounds differently, and both versions must
//! give the same bits (packets are compared bit for bit with the reference and with the
//! device kernels). Builds that already target AVX2, other architectures and
//! GRAVAC_PORTABLE_KERNELS run the lambda directly.

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__AVX2__) && \
    !defined(GRAVAC_PORTABLE_KERNELS) && !defined(__CUDA_ARCH__)
#define GRAVAC_ISA_DISPATCH 1
#else
#define GRAVAC_ISA_DISPATCH 0
#endif

#if defined(__GNUC__) || defined(__clang__)
//! Marks a kernel helper that must be inlined into its caller (so it is compiled for the
//! caller's instruction set).
#define GRAVAC_KERNEL_INLINE [[gnu::always_inline]] inline
//! Marks a kernel lambda passed to with_best_isa: `[&]() GRAVAC_KERNEL_LAMBDA { ... }`.
#define GRAVAC_KERNEL_LAMBDA __attribute__((always_inline))
#else
#define GRAVAC_KERNEL_INLINE inline
#define GRAVAC_KERNEL_LAMBDA
#endif

#include <atomic>

namespace gravac::detail {

//! Which version of the dispatched kernels runs.
enum class kernel_isa {
  best,      //!< AVX2 where the processor has it (the default)
  baseline,  //!< the build's baseline instruction set, always (benchmarks and tests compare)
};

//! The process-wide choice of with_best_isa; tests and benchmarks set it to compare the two
//! versions in one run. Both give the same bits.
inline std::atomic<kernel_isa>& kernel_isa_choice() noexcept {
  static std::atomic<kernel_isa> choice{kernel_isa::best};
  return choice;
}

//! True when this build dispatches (see GRAVAC_ISA_DISPATCH) and the processor runs AVX2
//! (asked once).
inline bool cpu_has_avx2() noexcept {
#if GRAVAC_ISA_DISPATCH
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

//! True when with_best_isa currently runs the AVX2 version.
inline bool runs_avx2_kernels() noexcept {
  return cpu_has_avx2() && kernel_isa_choice().load(std::memory_order_relaxed) == kernel_isa::best;
}

#if GRAVAC_ISA_DISPATCH
//! Calls \p kernel from code compiled for AVX2 (the always-inlined kernel with it).
template <class Kernel>
[[gnu::target("avx2")]] inline void run_for_avx2(Kernel& kernel) {
  kernel();
}
#endif

//! Runs \p kernel (a lambda marked GRAVAC_KERNEL_LAMBDA) compiled for the best instruction
//! set this processor has: AVX2 where available, the build's baseline otherwise.
template <class Kernel>
inline void with_best_isa(Kernel&& kernel) {
#if GRAVAC_ISA_DISPATCH
  if (runs_avx2_kernels()) {
    run_for_avx2(kernel);
    return;
  }
#endif
  kernel();
}

}  // namespace gravac::detail
