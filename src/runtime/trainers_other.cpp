// trainer<C, K, P> (and local steps over it) for identity (dense), AdaComp, PowerSGD and
// SparseLoCo-style compression.
#include "dispatch.hpp"

namespace gravac::runtime::detail {
built make_other(const build_request& r) {
  switch (r.m.compressor) {
    case compressor_id::adacomp:
      return build_for<adacomp>(r);
    case compressor_id::powersgd:
      return build_for<powersgd>(r);
    case compressor_id::sparseloco:
      return build_for<sparseloco>(r);
    default:
      return build_for<identity>(r);
  }
}
}  // namespace gravac::runtime::detail
