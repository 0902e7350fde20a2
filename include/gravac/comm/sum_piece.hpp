#pragma once
//! \file
//! \brief sum_piece: a run of values inside a packet that a communicator can sum
//! over the ranks in place, in the values' own type. cast16_cuda lists the pieces of its
//! last packet (the 16-bit codes of each cast layer, the floats of each raw layer), and
//! nccl_communicator::allreduce_sum_pieces sums exactly those, leaving the segment headers
//! and multipliers between them as they are (every rank writes the same ones).

#include <cstddef>
#include <cstdint>

namespace gravac {

//! The type a piece is summed in.
enum class sum_type : std::uint8_t {
  f32,   //!< 32-bit float (a raw layer)
  f16,   //!< IEEE half (a cast16 fp16 layer): summed in fp16
  bf16,  //!< bfloat16 (a cast16 bf16 layer): summed in bf16
};

//! Bytes of one value of \p t.
constexpr std::size_t sum_type_bytes(sum_type t) noexcept { return t == sum_type::f32 ? 4 : 2; }

//! A run of \p count values of type \p type starting \p offset bytes into a packet.
struct sum_piece {
  std::size_t offset = 0;         //!< byte offset in the packet (a multiple of the value size)
  std::size_t count = 0;          //!< number of values
  sum_type type = sum_type::f32;  //!< what they are summed as
};

}  // namespace gravac
