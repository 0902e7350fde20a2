// trainer<C, K, P> for identity (dense), AdaComp and PowerSGD.
#include "dispatch.hpp"

namespace gravac::runtime::detail {
std::unique_ptr<any_trainer> make_other(const method_config& m, host_comm comm, const layout& lay) {
  switch (m.compressor) {
    case compressor_id::adacomp:
      return make_for<adacomp>(m, comm, lay);
    case compressor_id::powersgd:
      return make_for<powersgd>(m, comm, lay);
    default:
      return make_for<identity>(m, comm, lay);
  }
}
}  // namespace gravac::runtime::detail
