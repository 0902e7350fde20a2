// trainer<C, K, P> (and local steps over it) for the other selection compressors, random-k
// and threshold.
#include "dispatch.hpp"

namespace gravac::runtime::detail {
built make_selection(const build_request& r) {
  if (r.m.compressor == compressor_id::threshold) return build_for<threshold>(r);
  return build_for<randomk>(r);
}
}  // namespace gravac::runtime::detail
