#pragma once
//! \file sign_cuda.hpp
//! \brief sign_cuda: EF-sign on the device, the packets of gravac::sign bit for bit. The
//! quantizer machinery it shares with qsgd_cuda, terngrad_cuda and cast16_cuda is in
//! detail/quantize_cuda_base.hpp. Part of target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/compress/sign.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/cuda/detail/quantize_cuda_base.hpp"
#include "gravac/cuda/stream.hpp"

namespace gravac {

//! Options of sign_cuda: the stream.
struct sign_cuda_options {
  stream_ref stream{};  //!< the stream every kernel of the compressor runs on
};

//! EF-sign on the device: the packets of gravac::sign on the same input, bit for bit (the
//! same mean |u| per layer, sign bits and padding), and the same residual
//! e = u - decompress(packet). Models Compressor and DeviceShardableCompressor.
class sign_cuda : public detail::quantize_cuda_base<detail::quant_family::sign, sign_cuda_options> {
 public:
  //! Options (see sign_cuda_options).
  using options = sign_cuda_options;

  //! A compressor for \p lay; allocates the whole workspace.
  sign_cuda(const layout& lay, const options& opt = {}) : quantize_cuda_base(lay, opt, 1, 0) {}
};
static_assert(Compressor<sign_cuda>);

}  // namespace gravac
