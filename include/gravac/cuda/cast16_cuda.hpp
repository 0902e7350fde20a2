#pragma once
//! \file cast16_cuda.hpp
//! \brief cast16_cuda: cast16 (fp16 or bf16 of u / N) on the device, the packets of
//! gravac::cast16 bit for bit. The quantizer machinery it shares with qsgd_cuda,
//! terngrad_cuda and sign_cuda is in detail/quantize_cuda_base.hpp. Part of target
//! gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/comm/sum_piece.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/cast16_format.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/cuda/detail/quantize_cuda_base.hpp"
#include "gravac/cuda/stream.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/packet/quantized_packet.hpp"
#include "gravac/packet/raw_segment.hpp"

namespace gravac {

//! Options of cast16_cuda: the stream, and the format of gravac::cast16.
struct cast16_cuda_options {
  stream_ref stream{};                         //!< the stream every kernel of the compressor runs on
  cast16_format format = cast16_format::fp16;  //!< see cast16_options
};

//! cast16 (fp16 or bf16 of u / N) on the device: the packets of gravac::cast16 on the same
//! input, bit for bit (the same clamp, rounding and padding), and the same residual
//! e = u - decompress(packet). Models Compressor and PieceSummableCompressor: not
//! DeviceShardableCompressor, its path in compressed_allreduce is the 16-bit sum of one
//! whole packet (summed_pieces).
class cast16_cuda : public detail::quantize_cuda_base<detail::quant_family::cast16, cast16_cuda_options> {
 public:
  //! Options (see cast16_cuda_options).
  using options = cast16_cuda_options;

  //! A compressor for \p lay; rejects an unknown format, then allocates the whole workspace.
  cast16_cuda(const layout& lay, const options& opt = {}) : quantize_cuda_base(lay, checked(opt), 1, 0) {
    pieces_.reserve(std::max<std::size_t>(lay.size(), 1));
  }

  //! Where the last packet's values lie, for a communicator that sums them in place
  //! (nccl_communicator::allreduce_sum_pieces, the 16-bit path of compressed_allreduce):
  //! the 16-bit codes of every cast layer (summed in fp16 or bf16) and the floats of every
  //! raw layer. Everything else in the packet (headers, the multiplier N) follows from the
  //! layout and the step's parameters, so it is the same on every rank, and a packet whose
  //! pieces hold the ranks' sums decodes, with the multiplier N and a scale of 1/N, to the
  //! sum of the ranks' codes. Valid until the next compress.
  [[nodiscard]] std::span<const sum_piece> summed_pieces() {
    pieces_.clear();  // reserved at construction: no allocation per step
    const sum_type t = get_options().format == cast16_format::bf16 ? sum_type::bf16 : sum_type::f16;
    for (const auto& d : last_segments()) {
      const std::size_t payload = d.at + sizeof(segment_header);
      if (d.header.encoding == raw_encoding)
        pieces_.push_back({payload, static_cast<std::size_t>(d.header.numel), sum_type::f32});
      else
        pieces_.push_back({payload + quant_prefix_bytes, static_cast<std::size_t>(d.header.numel), t});
    }
    return pieces_;
  }

 private:
  static const options& checked(const options& opt) {
    require(opt.format == cast16_format::fp16 || opt.format == cast16_format::bf16, "cast16_cuda: unknown format");
    return opt;
  }

  std::vector<sum_piece> pieces_;  // summed_pieces' answer
};
static_assert(Compressor<cast16_cuda>);

}  // namespace gravac
