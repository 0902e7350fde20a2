#pragma once
// From a runtime method_config to one trainer<C_cuda, K, P> over device memory. Included
// only by this folder's translation units (CUDA C++); each instantiates one family of
// device compressors. The compositions offered are those composition_verdict accepts for
// the device types: nothing here says by hand which parts go together.

#include <memory>
#include <string>
#include <type_traits>

#include "../runtime/dispatch.hpp"  // visit_type, options_of, state_of, the host part tuples
#include "gravac/gravac.hpp"
#include "gravac/runtime/make_device_trainer.hpp"

// The device compressors' headers are included by the translation unit that instantiates
// them, each in one unit only: sign_cuda's kernels (quantize_cuda_kernels.hpp) include
// non-template __global__ functions, defined in the header, that two units would both
// define.

namespace gravac::runtime::detail {

template <class C, class K, class P>
class erased_device_trainer final : public erased_common<C, K, P> {
  using erased_common<C, K, P>::t_;

 public:
  erased_device_trainer(const method_config& m, device_comm comm, const layout& lay,
                        const typename C::options& compressor)
      : erased_common<C, K, P>(m, comm, lay, compressor) {}
  const step_report& step(std::span<float> g) override { return t_.step(grad_view<cuda_space>(g.data(), g.size())); }
  void begin_step(std::span<float> g) override { t_.begin_step(grad_view<cuda_space>(g.data(), g.size())); }
};

// The device trainer of device compressor D (options \p o, its stream set) for the
// collective and policy \p m names; nullptr where the library refuses the composition (the
// caller has checked first).
template <class D>
std::unique_ptr<any_trainer> make_device_for(const method_config& m, device_comm comm, const layout& lay,
                                             const typename D::options& o) {
  return visit_type<collective_types>(static_cast<std::size_t>(m.collective), [&]<class K>() {
    return visit_type<policy_types>(static_cast<std::size_t>(m.policy), [&]<class P>() -> std::unique_ptr<any_trainer> {
      if constexpr (gravac::detail::composition_verdict<D, K, P>() == rejection::none)
        return std::make_unique<erased_device_trainer<D, K, P>>(m, comm, lay, o);
      else
        return nullptr;
    });
  });
}

// One per device compressor family: topk_cuda and threshold_cuda (trainers_selection.cu),
// adacomp_cuda (trainers_adacomp.cu); the quantizers are in make_device_trainer.cu.
std::unique_ptr<any_trainer> make_device_selection(const method_config& m, device_comm comm, const layout& lay,
                                                   stream_ref s);
std::unique_ptr<any_trainer> make_device_adacomp(const method_config& m, device_comm comm, const layout& lay,
                                                 stream_ref s);

}  // namespace gravac::runtime::detail
