// trainer<topk_cuda | threshold_cuda, K, P> for every collective and policy the library accepts.
#include "gravac/cuda/topk_cuda.hpp"
// (the compressor first: see dispatch_cuda.hpp)
#include "dispatch_cuda.hpp"

namespace gravac::runtime::detail {
std::unique_ptr<any_trainer> make_device_selection(const method_config& m, device_comm comm, const layout& lay,
                                                   stream_ref s) {
  if (m.compressor == compressor_id::threshold) {
    threshold_cuda::options o;
    o.stream = s;
    o.expected_hits = m.threshold.expected_hits;
    o.run_length = m.threshold.run_length;
    o.full_histogram_above = m.threshold.full_histogram_above;
    return make_device_for<threshold_cuda>(m, comm, lay, o);
  }
  topk_cuda::options o;
  o.stream = s;
  o.whole_buffer = m.topk.whole_buffer;
  return make_device_for<topk_cuda>(m, comm, lay, o);
}
}  // namespace gravac::runtime::detail
