// trainer<C, K, P> for the other selection compressors, random-k and threshold, with
// every collective and the fraction-choosing policies.
#include "fmnist/detail/dispatch.hpp"

namespace fmnist::detail {
std::unique_ptr<stepper> make_selection_stepper(const method_config& m, host_comm comm, const gravac::layout& lay) {
  if (m.compressor == compressor_id::threshold) return dispatch_collective<gravac::threshold>(m, comm, lay);
  return dispatch_collective<gravac::randomk>(m, comm, lay);
}
}  // namespace fmnist::detail
