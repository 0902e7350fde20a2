// trainer<C, K, P> (and local steps over it) for the quantizers: QSGD, TernGrad, EF-sign and
// cast16.
#include "dispatch.hpp"

namespace gravac::runtime::detail {
built make_quantizer(const build_request& r) {
  switch (r.m.compressor) {
    case compressor_id::qsgd:
      return build_for<qsgd>(r);
    case compressor_id::terngrad:
      return build_for<terngrad>(r);
    case compressor_id::sign:
      return build_for<sign>(r);
    default:
      return build_for<cast16>(r);
  }
}
}  // namespace gravac::runtime::detail
