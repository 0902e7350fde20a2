#pragma once
//! \file terngrad_cuda.hpp
//! \brief terngrad_cuda: TernGrad with error feedback on the device, the packets of
//! gravac::terngrad bit for bit. The quantizer machinery it shares with qsgd_cuda, sign_cuda
//! and cast16_cuda is in detail/quantize_cuda_base.hpp. Part of target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>
#include <string>

#include "gravac/compress/terngrad.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/cuda/detail/quantize_cuda_base.hpp"
#include "gravac/cuda/stream.hpp"

namespace gravac {

//! Options of terngrad_cuda: the stream, and those of gravac::terngrad.
struct terngrad_cuda_options {
  stream_ref stream{};         //!< the stream every kernel of the compressor runs on
  std::uint32_t bucket = 512;  //!< see terngrad_options
};

//! TernGrad with error feedback on the device: the packets of gravac::terngrad on the same
//! input, bit for bit (the same bucket maxima, random draws, codes and padding), and the
//! same residual e = u - decompress(packet). Models Compressor and
//! DeviceShardableCompressor. Runs as qsgd_cuda does, with one level and the bucket's
//! largest |u| as its scale.
class terngrad_cuda : public detail::quantize_cuda_base<detail::quant_family::terngrad, terngrad_cuda_options> {
 public:
  //! Options (see terngrad_cuda_options).
  using options = terngrad_cuda_options;

  //! A compressor for \p lay; rejects a bucket that is not a multiple of 64, as terngrad
  //! does, then allocates the whole workspace.
  terngrad_cuda(const layout& lay, const options& opt = {}) : quantize_cuda_base(lay, checked(opt), 1, opt.bucket) {}

 private:
  static const options& checked(const options& opt) {
    require(opt.bucket % 64 == 0, "terngrad_cuda: bucket must be a multiple of 64 (or 0 for whole layers), got " +
                                      std::to_string(opt.bucket));
    return opt;
  }
};
static_assert(Compressor<terngrad_cuda>);

}  // namespace gravac
