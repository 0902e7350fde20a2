// trainer<C, K, P> for the block-scaled formats (MXFP8, MXFP4, NVFP4) and their peer fp8_rowwise.
#include "dispatch.hpp"

namespace gravac::runtime::detail {
std::unique_ptr<any_trainer> make_block_scaled(const method_config& m, host_comm comm, const layout& lay) {
  switch (m.compressor) {
    case compressor_id::mxfp8:
      return make_for<mxfp8>(m, comm, lay);
    case compressor_id::mxfp4:
      return make_for<mxfp4>(m, comm, lay);
    case compressor_id::nvfp4:
      return make_for<nvfp4>(m, comm, lay);
    default:
      return make_for<fp8_rowwise>(m, comm, lay);
  }
}
}  // namespace gravac::runtime::detail
