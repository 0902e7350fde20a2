#pragma once
//! \file block_scaled_cuda.hpp
//! \brief mxfp8_cuda, mxfp4_cuda and nvfp4_cuda: the block-scaled compressors with error
//! feedback on the device, the packets of gravac::mxfp8, mxfp4 and nvfp4 bit for bit (one
//! header, as the host's block_scaled.hpp). The quantizer machinery they share with
//! qsgd_cuda and the others is in detail/quantize_cuda_base.hpp, their kernels in
//! detail/block_scaled_kernels.hpp. Part of target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/compress/block_scaled.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/cuda/detail/quantize_cuda_base.hpp"
#include "gravac/cuda/stream.hpp"

namespace gravac {

//! Options of mxfp8_cuda: the stream, and those of gravac::mxfp8 (same meaning, same checks).
struct mxfp8_cuda_options {
  stream_ref stream{};                                     //!< the stream every kernel of the compressor runs on
  mxfp8_element element = mxfp8_element::e4m3;             //!< see mxfp8_options
  block_rounding rounding = block_rounding::nearest_even;  //!< see mxfp8_options
  bool error_feedback = true;                              //!< see mxfp8_options
};

//! Options of mxfp4_cuda: the stream, and those of gravac::mxfp4.
struct mxfp4_cuda_options {
  stream_ref stream{};                                     //!< the stream every kernel of the compressor runs on
  block_rounding rounding = block_rounding::nearest_even;  //!< see mxfp4_options
  bool error_feedback = true;                              //!< see mxfp4_options
};

//! Options of nvfp4_cuda: the stream, and those of gravac::nvfp4.
struct nvfp4_cuda_options {
  stream_ref stream{};                                     //!< the stream every kernel of the compressor runs on
  block_rounding rounding = block_rounding::nearest_even;  //!< see nvfp4_options
  bool error_feedback = true;                              //!< see nvfp4_options
};

namespace detail {
//! The rounding check the host's block_scaled_compressor makes, with the device class's name.
inline void check_block_rounding(block_rounding r, const char* who) {
  require(r == block_rounding::nearest_even || r == block_rounding::stochastic, who, ": unknown rounding");
}
}  // namespace detail

//! MXFP8 with error feedback on the device: the packets of gravac::mxfp8 on the same input,
//! bit for bit (the same E8M0 scales, random draws, FP8 codes and padding), and the same
//! residual. Models Compressor and DeviceShardableCompressor.
//!
//! compress() plans the packet on the host and runs a fixed sequence of launches over every
//! layer on the options' stream (u = g + e with the statistics; one pass that finds each
//! block's scale by warp shuffles and writes its codes and the residual) and returns when
//! packet, residual and statistics are ready; every workspace is allocated at construction.
//! validate() and decompress_add() run on the device too.
class mxfp8_cuda : public detail::quantize_cuda_base<detail::quant_family::mxfp8, mxfp8_cuda_options> {
 public:
  //! Options (see mxfp8_cuda_options).
  using options = mxfp8_cuda_options;

  //! A compressor for \p lay; rejects an unknown element format or rounding, as mxfp8 does,
  //! then allocates the whole workspace.
  mxfp8_cuda(const layout& lay, const options& opt = {}) : quantize_cuda_base(lay, checked(opt), 1, 0) {}

 private:
  static const options& checked(const options& opt) {
    require(opt.element == mxfp8_element::e4m3 || opt.element == mxfp8_element::e5m2,
            "mxfp8_cuda: unknown element format");
    detail::check_block_rounding(opt.rounding, "mxfp8_cuda");
    return opt;
  }
};
static_assert(Compressor<mxfp8_cuda>);

//! MXFP4 with error feedback on the device: the packets of gravac::mxfp4 on the same input,
//! bit for bit, and the same residual. Models Compressor and DeviceShardableCompressor. Runs
//! as mxfp8_cuda does, with 4-bit E2M1 codes.
class mxfp4_cuda : public detail::quantize_cuda_base<detail::quant_family::mxfp4, mxfp4_cuda_options> {
 public:
  //! Options (see mxfp4_cuda_options).
  using options = mxfp4_cuda_options;

  //! A compressor for \p lay; rejects an unknown rounding, then allocates the whole workspace.
  mxfp4_cuda(const layout& lay, const options& opt = {}) : quantize_cuda_base(lay, checked(opt), 1, 0) {}

 private:
  static const options& checked(const options& opt) {
    detail::check_block_rounding(opt.rounding, "mxfp4_cuda");
    return opt;
  }
};
static_assert(Compressor<mxfp4_cuda>);

//! NVFP4 with error feedback on the device: the packets of gravac::nvfp4 on the same input,
//! bit for bit (the same per-layer scale, E4M3 block scales, codes and padding), and the
//! same residual. Models Compressor and DeviceShardableCompressor. Runs as mxfp8_cuda does,
//! with one more pass before the codes: every layer's largest finite |u|, from which each
//! block of 16 finds the per-layer scale.
class nvfp4_cuda : public detail::quantize_cuda_base<detail::quant_family::nvfp4, nvfp4_cuda_options> {
 public:
  //! Options (see nvfp4_cuda_options).
  using options = nvfp4_cuda_options;

  //! A compressor for \p lay; rejects an unknown rounding, then allocates the whole workspace.
  nvfp4_cuda(const layout& lay, const options& opt = {}) : quantize_cuda_base(lay, checked(opt), 1, 0) {}

 private:
  static const options& checked(const options& opt) {
    detail::check_block_rounding(opt.rounding, "nvfp4_cuda");
    return opt;
  }
};
static_assert(Compressor<nvfp4_cuda>);

}  // namespace gravac
