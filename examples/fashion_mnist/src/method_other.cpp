// trainer<C, K, P> for the compressors with a fixed or self-adjusting ratio: identity,
// AdaComp, QSGD, TernGrad, EF-sign, cast16 and PowerSGD.
#include "fmnist/detail/dispatch.hpp"

namespace fmnist::detail {
std::unique_ptr<stepper> make_other_stepper(const method_config& m, host_comm comm, const gravac::layout& lay) {
  switch (m.compressor) {
    case compressor_id::identity:
      return dispatch_collective<gravac::identity>(m, comm, lay);
    case compressor_id::adacomp:
      return dispatch_collective<gravac::adacomp>(m, comm, lay);
    case compressor_id::qsgd:
      return dispatch_collective<gravac::qsgd>(m, comm, lay);
    case compressor_id::terngrad:
      return dispatch_collective<gravac::terngrad>(m, comm, lay);
    case compressor_id::sign:
      return dispatch_collective<gravac::sign>(m, comm, lay);
    case compressor_id::cast16:
      return dispatch_collective<gravac::cast16>(m, comm, lay);
    case compressor_id::powersgd:
      return dispatch_collective<gravac::powersgd>(m, comm, lay);
    default:
      break;
  }
  not_offered(m);
}
}  // namespace fmnist::detail

namespace fmnist {
std::unique_ptr<stepper> make_stepper(const method_config& m, host_comm comm, const gravac::layout& lay) {
  switch (m.compressor) {
    case compressor_id::topk:
      return detail::make_topk_stepper(m, comm, lay);
    case compressor_id::randomk:
    case compressor_id::threshold:
      return detail::make_selection_stepper(m, comm, lay);
    default:
      return detail::make_other_stepper(m, comm, lay);
  }
}
}  // namespace fmnist
