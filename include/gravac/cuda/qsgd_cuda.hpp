#pragma once
//! \file qsgd_cuda.hpp
//! \brief qsgd_cuda: QSGD with error feedback on the device, the packets of gravac::qsgd bit
//! for bit. The quantizer machinery it shares with terngrad_cuda, sign_cuda and cast16_cuda
//! is in detail/quantize_cuda_base.hpp. Part of target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>
#include <string>

#include "gravac/compress/qsgd.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/cuda/detail/quantize_cuda_base.hpp"
#include "gravac/cuda/stream.hpp"
#include "gravac/packet/quantized_packet.hpp"

namespace gravac {

//! Options of qsgd_cuda: the stream, and those of gravac::qsgd (same meaning, same checks).
struct qsgd_cuda_options {
  stream_ref stream{};         //!< the stream every kernel of the compressor runs on
  std::uint32_t levels = 127;  //!< see qsgd_options
  std::uint32_t bucket = 512;  //!< see qsgd_options
};

//! QSGD with error feedback on the device: the packets of gravac::qsgd on the same input,
//! bit for bit (the same norms, random draws, codes and padding), and the same residual
//! e = u - decompress(packet). Models Compressor and DeviceShardableCompressor.
//!
//! compress() plans the packet on the host, runs a fixed sequence of launches over every
//! layer on the options' stream (the chunk sums, the bucket norms, the codes with the
//! residual) and returns when packet, residual and statistics are ready; every workspace is
//! allocated at construction. validate() and decompress_add() run on the device too.
class qsgd_cuda : public detail::quantize_cuda_base<detail::quant_family::qsgd, qsgd_cuda_options> {
 public:
  //! Options (see qsgd_cuda_options).
  using options = qsgd_cuda_options;

  //! A compressor for \p lay; rejects a level count outside 1..32767 or a bucket that is not
  //! a multiple of 64, as qsgd does, then allocates the whole workspace.
  qsgd_cuda(const layout& lay, const options& opt = {})
      : quantize_cuda_base(lay, checked(opt), opt.levels, opt.bucket) {}

 private:
  static const options& checked(const options& opt) {
    require(
        opt.levels >= 1 && opt.levels <= qsgd_max_levels,
        "qsgd_cuda: levels must be in 1.." + std::to_string(qsgd_max_levels) + ", got " + std::to_string(opt.levels));
    require(opt.bucket % 64 == 0,
            "qsgd_cuda: bucket must be a multiple of 64 (or 0 for whole layers), got " + std::to_string(opt.bucket));
    return opt;
  }
};
static_assert(Compressor<qsgd_cuda>);

}  // namespace gravac
