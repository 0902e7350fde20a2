// trainer<C, K, P> (and local steps over it) for the block-scaled formats (MXFP8, MXFP4,
// NVFP4) and their peer fp8_rowwise.
#include "dispatch.hpp"

namespace gravac::runtime::detail {
built make_block_scaled(const build_request& r) {
  switch (r.m.compressor) {
    case compressor_id::mxfp8:
      return build_for<mxfp8>(r);
    case compressor_id::mxfp4:
      return build_for<mxfp4>(r);
    case compressor_id::nvfp4:
      return build_for<nvfp4>(r);
    default:
      return build_for<fp8_rowwise>(r);
  }
}
}  // namespace gravac::runtime::detail
