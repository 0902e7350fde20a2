#pragma once
//! \file
//! \brief The ordered compactions of a job table (select_jobs, adacomp_jobs): one per run of
//! consecutive layers below 2^32 elements, each listing the selected elements of its layers
//! in index order.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gravac/cuda/cuda_error.hpp"
#include "gravac/cuda/detail/cub_primitives.hpp"
#include "gravac/cuda/device_buffer.hpp"

namespace gravac::detail {

//! A run of consecutive layers that one ordered compaction covers: its elements are
//! counted in 32 bits.
struct compaction_window {
  unsigned long long start = 0;  //!< its first element
  unsigned long long size = 0;   //!< its elements, below 2^32
};

//! Adds the layer at [\p offset, offset + \p numel) (after the last one added) to the last
//! window of \p windows, or opens a new one where it would pass 2^32 elements; returns its window.
inline std::uint32_t add_to_windows(std::vector<compaction_window>& windows, unsigned long long offset,
                                    unsigned long long numel) {
  if (windows.empty() || offset + numel - windows.back().start > 0xffffffffull) windows.push_back({offset, 0});
  windows.back().size = offset + numel - windows.back().start;
  return static_cast<std::uint32_t>(windows.size() - 1);
}

//! The temporary storage (at least one byte) of a compaction over any window of \p windows
//! with predicate \p Pred and writer \p Writer: CUB sizes it per call, so each is asked.
template <class Pred, class Writer>
std::size_t compaction_temp_bytes(const std::vector<compaction_window>& windows, cudaStream_t s) {
  std::size_t temp = 1;
  for (const auto& w : windows) {
    std::size_t t = 0;
    GRAVAC_TRY_CUDA(select_indices_if(nullptr, t, static_cast<std::int64_t>(w.size), Pred{}, Writer{}, nullptr, s));
    temp = std::max(temp, t);
  }
  return temp;
}

//! Queues on \p s one ordered compaction per window of \p windows, in order, with
//! \p pred_of(window) and \p writer_of(window); window w's count goes to selected[w].
template <class PredOf, class WriterOf>
void compact_windows(const std::vector<compaction_window>& windows, device_buffer<std::byte>& temp,
                     unsigned long long* selected, cudaStream_t s, PredOf pred_of, WriterOf writer_of) {
  for (std::size_t w = 0; w < windows.size(); ++w) {
    std::size_t bytes = temp.size();
    GRAVAC_TRY_CUDA(select_indices_if(temp.data(), bytes, static_cast<std::int64_t>(windows[w].size),
                                      pred_of(windows[w]), writer_of(windows[w]), selected + w, s));
  }
}

}  // namespace gravac::detail
