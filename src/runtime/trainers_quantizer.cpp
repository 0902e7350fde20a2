// trainer<C, K, P> for the quantizers: QSGD, TernGrad, EF-sign and cast16.
#include "dispatch.hpp"

namespace gravac::runtime::detail {
std::unique_ptr<any_trainer> make_quantizer(const method_config& m, host_comm comm, const layout& lay) {
  switch (m.compressor) {
    case compressor_id::qsgd:
      return make_for<qsgd>(m, comm, lay);
    case compressor_id::terngrad:
      return make_for<terngrad>(m, comm, lay);
    case compressor_id::sign:
      return make_for<sign>(m, comm, lay);
    default:
      return make_for<cast16>(m, comm, lay);
  }
}
}  // namespace gravac::runtime::detail
