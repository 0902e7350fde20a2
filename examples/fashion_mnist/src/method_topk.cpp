// trainer<topk, K, P> for every collective and policy the example offers with top-k.
#include "fmnist/detail/dispatch.hpp"

namespace fmnist::detail {
std::unique_ptr<stepper> make_topk_stepper(const method_config& m, host_comm comm, const gravac::layout& lay) {
  return dispatch_collective<gravac::topk>(m, comm, lay);
}
}  // namespace fmnist::detail
