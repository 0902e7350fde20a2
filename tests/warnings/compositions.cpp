// Part of warnings_library (CMakeLists.txt here; -O2): trainers over the compressors and
// policies whose headers warned, each run for a few steps on one thread rank, the state a
// checkpoint saves between steps, and local steps with their state.
#include <cstddef>
#include <vector>

#include "gravac/gravac.hpp"

namespace gravac_warnings {

template <class C, class K, class P>
float train(gravac::thread_communicator& comm, const gravac::layout& lay,
            const typename gravac::trainer<C, K, P>::options& opt) {
  gravac::trainer<C, K, P> t(comm, lay, opt);
  std::vector<float> grad(lay.numel(), 0.5f);
  for (int s = 0; s < 3; ++s) t.step(grad);
  return grad[0];
}

// What a checkpoint saves between steps, into a new buffer.
template <class T>
std::vector<std::byte> step_state(const T& t) {
  std::vector<std::byte> out;
  t.save_step_state(out);
  return out;
}

#define GRAVAC_WARNINGS_TRAIN(C, K, P)                                               \
  template float train<C, K, P>(gravac::thread_communicator&, const gravac::layout&, \
                                const gravac::trainer<C, K, P>::options&)
GRAVAC_WARNINGS_TRAIN(gravac::topk, gravac::allgather, gravac::gravac_policy);
GRAVAC_WARNINGS_TRAIN(gravac::qsgd, gravac::allgather, gravac::fixed_policy);
#undef GRAVAC_WARNINGS_TRAIN
template std::vector<std::byte> step_state(
    const gravac::trainer<gravac::topk, gravac::allgather, gravac::gravac_policy>&);

// Local steps over the compressor and policy made for them, a few rounds, then their state.
std::vector<std::byte> local_steps_state(gravac::thread_communicator& comm, const gravac::layout& lay) {
  using L = gravac::local_steps<gravac::sparseloco, gravac::allgather, gravac::local_steps_policy>;
  std::vector<float> params(lay.numel(), 0.25f), grad(lay.numel(), 0.5f);
  L ls(comm, lay, params, L::options{});
  for (int s = 0; s < 5; ++s) {
    ls.before_inner_step(grad);
    for (std::size_t i = 0; i < params.size(); ++i) params[i] -= 0.1f * grad[i];
    ls.after_inner_step(params);
  }
  std::vector<std::byte> out;
  ls.save(out);
  return out;
}

}  // namespace gravac_warnings
