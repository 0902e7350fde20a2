#pragma once
//! \file
//! \brief The per-block slots of statistics that repeat bit for bit on the device: each
//! block's partial sums go to the block's own slot, and the last block of the group adds the
//! slots in a fixed order (square_sums.hpp: the aligned tree). A floating-point atomic per
//! block would add them in the order the blocks happen to finish, so the same step could
//! give different norms, and different policy decisions, run to run.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/select_common.hpp"
#include "gravac/cuda/device_buffer.hpp"

namespace gravac::detail {

//! Most statistics one kernel sums per group (||g||^2, ||u||^2, the kept energy).
inline constexpr int max_ordered_sums = 3;

//! Device memory for the per-block partials of one kernel at a time (the kernels of a
//! compressor run in stream order, so one set serves them all).
struct block_slots {
  double* slots = nullptr;               //!< max_ordered_sums * capacity: sum v of block b at v * capacity + b
  unsigned long long capacity = 0;       //!< blocks a grid may have
  std::uint32_t* blocks_done = nullptr;  //!< counts the blocks of a whole-grid group (zero between kernels)
};

//! Owns the block_slots of a compressor.
class block_slots_buffer {
 public:
  block_slots_buffer() = default;
  //! Slots for grids of up to \p blocks blocks, allocated on stream \p s.
  block_slots_buffer(unsigned long long blocks, stream_ref s)
      : blocks_(blocks), buf_(static_cast<std::size_t>(max_ordered_sums * blocks), s), done_(1, s) {}
  //! What the kernels take.
  [[nodiscard]] block_slots view() noexcept { return {buf_.data(), blocks_, done_.data()}; }

 private:
  unsigned long long blocks_ = 0;
  device_buffer<double> buf_;
  device_buffer<std::uint32_t> done_;  // zero-filled
};

}  // namespace gravac::detail
