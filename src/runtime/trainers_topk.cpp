// trainer<topk, K, P> (and local steps over it) for every collective and policy the library
// accepts with top-k.
#include "dispatch.hpp"

namespace gravac::runtime::detail {
built make_topk(const build_request& r) { return build_for<topk>(r); }
}  // namespace gravac::runtime::detail
