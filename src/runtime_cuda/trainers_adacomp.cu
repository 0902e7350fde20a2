// trainer<adacomp_cuda, K, P> for every collective and policy the library accepts.
#include "gravac/cuda/adacomp_cuda.hpp"
// (the compressor first: see dispatch_cuda.hpp)
#include "dispatch_cuda.hpp"

namespace gravac::runtime::detail {
std::unique_ptr<any_trainer> make_device_adacomp(const method_config& m, device_comm comm, const layout& lay,
                                                 stream_ref s) {
  adacomp_cuda::options o;
  o.stream = s;
  o.bins = m.adacomp;
  return make_device_for<adacomp_cuda>(m, comm, lay, o);
}
}  // namespace gravac::runtime::detail
