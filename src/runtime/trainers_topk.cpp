// trainer<topk, K, P> for every collective and policy the library accepts with top-k.
#include "dispatch.hpp"

namespace gravac::runtime::detail {
std::unique_ptr<any_trainer> make_topk(const method_config& m, host_comm comm, const layout& lay) {
  return make_for<topk>(m, comm, lay);
}
}  // namespace gravac::runtime::detail
