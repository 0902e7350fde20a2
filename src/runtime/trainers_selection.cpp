// trainer<C, K, P> for the other selection compressors, random-k and threshold.
#include "dispatch.hpp"

namespace gravac::runtime::detail {
std::unique_ptr<any_trainer> make_selection(const method_config& m, host_comm comm, const layout& lay) {
  if (m.compressor == compressor_id::threshold) return make_for<threshold>(m, comm, lay);
  return make_for<randomk>(m, comm, lay);
}
}  // namespace gravac::runtime::detail
