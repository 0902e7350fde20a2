#pragma once
//! \file
//! \brief Every launch configuration of gravac's kernels in one place: the block sizes of
//! each kernel family (compile-time, because the kernels size their shared memory, block
//! reductions and __launch_bounds__ by them) and the grids, computed by launch_config from
//! the element counts and the device's multiprocessor count. A kernel launch takes its
//! grid and its block from here, so a tuning is one change.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "gravac/cuda/cuda_error.hpp"

namespace gravac::detail {

//! Threads per block of every selection kernel (topk_cuda, threshold_cuda, the gain pass).
inline constexpr int select_threads = 256;
//! Elements per chunk of the ordered tie search.
inline constexpr int tie_items = 16;
//! Threads per block of the quantizer kernels.
inline constexpr int quant_threads = 256;
//! Threads per block of the packet kernels (headers, validation, decoding).
inline constexpr int packet_threads = 256;
//! Threads per block of the AdaComp kernels.
inline constexpr int adacomp_threads = 256;
//! Elements per thread and tile of adacomp_bins.
inline constexpr int adacomp_items = 8;
//! Elements of one tile of adacomp_bins.
inline constexpr std::uint32_t adacomp_tile = static_cast<std::uint32_t>(adacomp_threads) * adacomp_items;

//! The grid of a kernel that runs as one block (a decision over a small table).
inline constexpr unsigned one_block = 1;
//! The block of a kernel whose one thread does a step's bookkeeping (placing a segment,
//! walking a packet's headers, finishing the packet header).
inline constexpr unsigned one_thread = 1;
//! Blocks per layer (grid x) of the validation and decoding kernels; grid y takes the layers.
inline constexpr unsigned blocks_per_layer = 64;
//! The largest grid y (CUDA's limit): kernels over layers stride by gridDim.y beyond it.
inline constexpr std::size_t max_grid_y = 65535;

//! Blocks that cover \p n items at \p per_block a block (one item per thread or per lane:
//! the kernel does not stride); zero for zero items.
[[nodiscard]] constexpr unsigned long long blocks_covering(unsigned long long n,
                                                           unsigned long long per_block) noexcept {
  return (n + per_block - 1) / per_block;
}

//! Blocks of a kernel with one thread per entry of a table of \p n entries, at least one
//! block (the kernel also writes the packet header when the table is empty).
[[nodiscard]] constexpr unsigned table_blocks(std::size_t n, int threads) noexcept {
  return static_cast<unsigned>((n + static_cast<std::size_t>(threads)) / static_cast<std::size_t>(threads));
}

//! The grids of one device, from its multiprocessor count (read once, at a compressor's
//! construction: never per step).
class launch_config {
 public:
  //! The configuration of the current device.
  [[nodiscard]] static launch_config current_device() {
    int dev = 0, sms = 1;
    GRAVAC_TRY_CUDA(cudaGetDevice(&dev));
    GRAVAC_TRY_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return launch_config(sms);
  }
  //! A configuration for a device of \p sms multiprocessors (at least one).
  explicit constexpr launch_config(int sms = 1) noexcept : sms_(std::max(sms, 1)) {}

  //! Multiprocessors of the device.
  [[nodiscard]] constexpr int sms() const noexcept { return sms_; }

  //! Blocks of a grid-stride kernel over \p n items, \p per_block items a block and round:
  //! enough to cover them, at least one, at most 8 per multiprocessor (more would only
  //! queue; the kernel strides over the rest).
  [[nodiscard]] constexpr int grid_stride(std::size_t n, int per_block) const noexcept {
    const std::size_t need = (n + static_cast<std::size_t>(per_block) - 1) / static_cast<std::size_t>(per_block);
    return static_cast<int>(std::clamp<std::size_t>(need, 1, static_cast<std::size_t>(max_stride_grid())));
  }
  //! The largest grid grid_stride gives (what per-block statistics slots must hold).
  [[nodiscard]] constexpr int max_stride_grid() const noexcept { return sms_ * 8; }
  //! Blocks of the ordered tie search, whose one-block-per-item grid is \p grid: at most 4
  //! per multiprocessor (the blocks stride over the chunks; the last one to finish scans
  //! every chunk's count in order).
  [[nodiscard]] constexpr int tie_search(int grid) const noexcept { return std::min(grid, 4 * sms_); }
  //! Grid y of a kernel over \p layers layers (one slot per layer up to CUDA's limit).
  [[nodiscard]] static constexpr unsigned layer_slots(std::size_t layers) noexcept {
    return static_cast<unsigned>(std::clamp<std::size_t>(layers, 1, max_grid_y));
  }
  //! The grid of the validation and decoding kernels over \p layers layers.
  [[nodiscard]] static dim3 per_layer(std::size_t layers) noexcept { return {blocks_per_layer, layer_slots(layers)}; }
  //! The grid of the pass that restores every layer's residual after a failed step: 2
  //! blocks per multiprocessor in x (striding over a layer's sent values), grid y over the
  //! \p layers layers (at least one).
  [[nodiscard]] dim3 repair(std::size_t layers) const noexcept {
    return {static_cast<unsigned>(sms_) * 2, static_cast<unsigned>(std::min<std::size_t>(layers, max_grid_y))};
  }

 private:
  int sms_ = 1;
};

}  // namespace gravac::detail
