#pragma once
// The trainer's screening of u = g + e for NaN and infinity (on_non_finite), per memory
// space: non_finite_ops<Space> finds the first bad layer of a range, zeroes g where u is
// not finite, and zeroes all of g. The primary template is the host's (plain loops over
// host-accessible memory); a backend specializes it for its own space (the CUDA one in
// gravac/cuda/detail/non_finite_kernels.hpp, which every CUDA compressor includes through
// cuda/detail/space_hooks.hpp), so the trainer names no backend.

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "gravac/core/layout.hpp"

namespace gravac::detail {

// What a scan found: the first layer whose u holds NaN or infinity (-1: none), and whether
// g and e were both finite everywhere in it (the sum overflowed; asked for only when the
// caller reports it).
struct non_finite_scan {
  long layer = -1;
  bool overflow = false;
};

// Host memory. The compressor argument (its stream, on a device) is not needed here. A
// residual known to be zero is not read for the check (u = g).
// The check that Space is host memory sits in the functions, not the class: the trainer
// holds a non_finite_ops member, and a class-level assertion would fire when the trainer
// is instantiated, before its own clearer message for a composition that mixes memory
// spaces (tests/compile_fail/device_compressor_with_host_communicator.cpp).
template <class Space>
struct non_finite_ops {
  template <class C>
  non_finite_scan first_non_finite(const C&, const layout& lay, std::size_t first, std::size_t last, const float* g,
                                   const float* e, bool residual_zero, bool want_overflow) {
    static_assert(Space::host_accessible,
                  "non_finite_ops: no screening for this memory space (include its backend's compressor header)");
    for (std::size_t i = first; i < last; ++i) {
      const auto& l = lay[i];
      bool bad = false;
      if (residual_zero) {
        for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) bad |= !std::isfinite(g[j]);
      } else {
        for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) bad |= !std::isfinite(g[j] + e[j]);
      }
      if (!bad) continue;
      non_finite_scan found{static_cast<long>(i), false};
      if (want_overflow) {
        found.overflow = true;
        for (std::size_t j = l.offset; j < l.offset + l.numel; ++j)
          found.overflow = found.overflow && std::isfinite(g[j]) && std::isfinite(e[j]);
      }
      return found;
    }
    return {};
  }

  // zero_values: g is zeroed wherever u = g + e is not finite, in the n values from g and e.
  template <class C>
  void zero_non_finite(const C&, float* g, const float* e, std::size_t n, bool residual_zero) {
    static_assert(Space::host_accessible, "non_finite_ops: no screening for this memory space");
    for (std::size_t j = 0; j < n; ++j)
      if (!std::isfinite(residual_zero ? g[j] : g[j] + e[j])) g[j] = 0.0f;
  }

  template <class C>
  void zero_all(const C&, float* g, std::size_t n) {
    static_assert(Space::host_accessible, "non_finite_ops: no screening for this memory space");
    std::fill(g, g + n, 0.0f);
  }
};

}  // namespace gravac::detail
