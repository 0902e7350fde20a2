#pragma once
//! \file padded_allgatherv.hpp
//! \brief allgatherv over an engine that gathers equal slots only (Gloo, caller callbacks):
//! every packet padded to the widest, then compacted in rank order.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace gravac::detail {

//! The padded buffers, kept by their communicator so that a step allocates nothing once
//! they have grown.
struct padded_allgather_scratch {
  std::vector<std::byte> in;   //!< this rank's packet, padded
  std::vector<std::byte> out;  //!< every rank's padded packet
};

//! Fills \p out with every rank's bytes back to back in rank order, given each rank's byte
//! count in \p sizes (gathered first by the caller). \p allgather(send, bytes, recv)
//! gathers \p bytes from every rank into \p recv (ranks x bytes, rank order).
template <class Allgather>
void padded_allgatherv(std::span<const std::byte> mine, const std::vector<std::size_t>& sizes,
                       std::vector<std::byte>& out, padded_allgather_scratch& scratch, Allgather&& allgather) {
  const std::size_t widest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  std::size_t total = 0;
  for (auto s : sizes) total += s;
  out.resize(total);
  if (widest == 0) return;
  scratch.in.assign(widest, std::byte{0});
  if (!mine.empty()) std::memcpy(scratch.in.data(), mine.data(), mine.size());
  scratch.out.resize(widest * sizes.size());
  allgather(static_cast<const void*>(scratch.in.data()), widest, static_cast<void*>(scratch.out.data()));
  std::size_t at = 0;
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    if (sizes[r] != 0) std::memcpy(out.data() + at, scratch.out.data() + r * widest, sizes[r]);
    at += sizes[r];
  }
}

}  // namespace gravac::detail
