#pragma once
//! \file dispatch.hpp
//! \brief From a runtime method_config to one trainer<C, K, P> instantiation. Included
//! only by src/method_*.cpp; each of them instantiates one compressor family, so the
//! number of instantiations per translation unit stays small.

#include <cstdio>
#include <gravac/checkpoint.hpp>
#include <memory>
#include <string>
#include <type_traits>

#include "fmnist/method.hpp"

namespace fmnist::detail {

// The options of part T inside a method_config.
template <class T>
const auto& options_of(const method_config& m) {
  if constexpr (std::is_same_v<T, gravac::identity>)
    return m.identity;
  else if constexpr (std::is_same_v<T, gravac::topk>)
    return m.topk;
  else if constexpr (std::is_same_v<T, gravac::randomk>)
    return m.randomk;
  else if constexpr (std::is_same_v<T, gravac::threshold>)
    return m.threshold;
  else if constexpr (std::is_same_v<T, gravac::adacomp>)
    return m.adacomp;
  else if constexpr (std::is_same_v<T, gravac::qsgd>)
    return m.qsgd;
  else if constexpr (std::is_same_v<T, gravac::terngrad>)
    return m.terngrad;
  else if constexpr (std::is_same_v<T, gravac::sign>)
    return m.sign;
  else if constexpr (std::is_same_v<T, gravac::cast16>)
    return m.cast16;
  else if constexpr (std::is_same_v<T, gravac::powersgd>)
    return m.powersgd;
  else if constexpr (std::is_same_v<T, gravac::dense_allreduce>)
    return m.dense_allreduce;
  else if constexpr (std::is_same_v<T, gravac::allgather>)
    return m.allgather;
  else if constexpr (std::is_same_v<T, gravac::allreduce_compatible>)
    return m.allreduce_compatible;
  else if constexpr (std::is_same_v<T, gravac::flexible>)
    return m.flexible;
  else if constexpr (std::is_same_v<T, gravac::low_rank_allreduce>)
    return m.low_rank_allreduce;
  else if constexpr (std::is_same_v<T, gravac::compressed_allreduce>)
    return m.compressed_allreduce;
  else if constexpr (std::is_same_v<T, gravac::fixed_policy>)
    return m.fixed;
  else if constexpr (std::is_same_v<T, gravac::gravac_policy>)
    return m.gravac;
  else if constexpr (std::is_same_v<T, gravac::accordion_policy>)
    return m.accordion;
  else if constexpr (std::is_same_v<T, gravac::adacomp_policy>)
    return m.adacomp_policy;
  else if constexpr (std::is_same_v<T, gravac::moo_policy>)
    return m.moo;
  else
    static_assert(sizeof(T) == 0, "fmnist: no options for this part");
}

// Which (compressor, policy) pairs the example offers. The adaptive policies choose kept
// fractions, which only selection compressors act on; AdaComp's compressor adapts by
// itself and pairs with adacomp_policy (bin lengths by layer kind) or fixed; quantizers,
// PowerSGD and identity have a fixed ratio.
template <class C, class P>
inline constexpr bool policy_fits = std::is_same_v<P, gravac::fixed_policy> ||
                                    (std::is_same_v<C, gravac::topk> && !std::is_same_v<P, gravac::fixed_policy>) ||
                                    ((std::is_same_v<C, gravac::randomk> || std::is_same_v<C, gravac::threshold>)&&(
                                        std::is_same_v<P, gravac::gravac_policy> ||
                                        std::is_same_v<P, gravac::accordion_policy> ||
                                        std::is_same_v<P, gravac::moo_policy>)) ||
                                    (std::is_same_v<C, gravac::adacomp> && std::is_same_v<P, gravac::adacomp_policy>);

template <class C, class K, class P>
inline constexpr bool offered = K::template accepts<C>&& policy_fits<C, P>;

// A short description of a policy's state.
inline std::string state_of(const gravac::fixed_policy&) { return {}; }
inline std::string state_of(const gravac::gravac_policy& p) {
  char b[96];
  std::snprintf(b, sizeof b, "%s, CF %.0f", std::string(gravac::to_string(p.phase())).c_str(), p.current_cf());
  return b;
}
inline std::string state_of(const gravac::accordion_policy& p) {
  std::size_t low = 0, high = 0;
  for (auto l : p.levels()) {
    if (l == gravac::accordion_level::low) ++low;
    if (l == gravac::accordion_level::high) ++high;
  }
  return std::to_string(low) + " layers low, " + std::to_string(high) + " high";
}
inline std::string state_of(const gravac::adacomp_policy& p) {
  char b[64];
  std::snprintf(b, sizeof b, "achieved CF %.0f", p.mean_model_cf());
  return b;
}
inline std::string state_of(const gravac::moo_policy& p) {
  char b[96];
  if (!p.decided()) return "warm-up";
  std::snprintf(b, sizeof b, "f %.4f (%zu decisions)", p.last_decision().fraction,
                static_cast<std::size_t>(p.decisions()));
  return b;
}

template <class C, class K, class P>
class trainer_stepper final : public stepper {
 public:
  using trainer_t = gravac::trainer<C, K, P>;
  trainer_stepper(const method_config& m, host_comm comm, const gravac::layout& lay) : t_(comm, lay, make_options(m)) {}
  const gravac::step_report& step(std::span<float> grads) override { return t_.step(grads); }
  void begin_step(std::span<float> grads) override { t_.begin_step(grads); }
  void ready(std::size_t layer, double ready_s) override { t_.ready(layer, ready_s); }
  void ready(std::size_t layer) override { t_.ready(layer); }
  const gravac::step_report& finish() override { return t_.finish(); }
  [[nodiscard]] std::size_t buckets() const override { return t_.buckets().size(); }
  void end_interval(const gravac::interval_info& info) override { t_.end_interval(info); }
  [[nodiscard]] const gravac::step_params& last_params() const override { return t_.last_params(); }
  [[nodiscard]] std::string policy_state() const override { return state_of(const_cast<trainer_t&>(t_).policy()); }
  void save_checkpoint(const std::string& path) override { gravac::save_checkpoint(t_, path, {.collective = false}); }
  void restore_checkpoint(const std::string& path) override {
    gravac::restore_checkpoint(t_, path, {.collective = false});
  }

 private:
  static typename trainer_t::options make_options(const method_config& m) {
    typename trainer_t::options o;
    o.compressor = options_of<C>(m);
    o.collective = options_of<K>(m);
    o.policy = options_of<P>(m);
    o.seed = m.seed;
    o.bucket_bytes = m.bucket_bytes;
    o.on_non_finite = m.on_non_finite;
    return o;
  }
  trainer_t t_;
};

// The compressors collective K accepts, by their command-line names ("qsgd, sign"). Read off
// K::accepts, so that the error below names what the library takes, not a list kept by hand.
template <class K>
std::string accepted_by() {
  std::string names;
  const auto add = [&]<class C>(compressor_id id) {
    if constexpr (K::template accepts<C>)
      names += (names.empty() ? "" : ", ") + std::string(name_of(compressor_names, id));
  };
  add.template operator()<gravac::identity>(compressor_id::identity);
  add.template operator()<gravac::topk>(compressor_id::topk);
  add.template operator()<gravac::randomk>(compressor_id::randomk);
  add.template operator()<gravac::threshold>(compressor_id::threshold);
  add.template operator()<gravac::adacomp>(compressor_id::adacomp);
  add.template operator()<gravac::qsgd>(compressor_id::qsgd);
  add.template operator()<gravac::terngrad>(compressor_id::terngrad);
  add.template operator()<gravac::sign>(compressor_id::sign);
  add.template operator()<gravac::cast16>(compressor_id::cast16);
  add.template operator()<gravac::powersgd>(compressor_id::powersgd);
  return names;
}

// \p refused: the collective does not accept the compressor (rather than the policy not
// fitting it).
[[noreturn]] inline void not_offered(const method_config& m, bool refused = false) {
  // The compressed allreduce's refusal is the one users meet with a compressor that works
  // everywhere else (top-k, PowerSGD), so it says why before the list.
  const std::string why = refused && m.collective == collective_id::compressed_allreduce
                              ? "compressed_allreduce compresses shards of every layer and recompresses their "
                                "average, so it needs a host compressor with one packet per compress whose options "
                                "it can copy. "
                              : "";
  throw gravac::error(gravac::status::invalid_argument,
                      "the example does not offer " + method_name(m) + ". " + why +
                          "Offered: adaptive policies (gravac, accordion, moo) with topk, randomk or threshold; "
                          "adacomp policy with topk or the adacomp compressor; fixed with every compressor; "
                          "allreduce_compatible needs topk, randomk or identity; low_rank_allreduce needs powersgd; "
                          "compressed_allreduce needs " +
                          accepted_by<gravac::compressed_allreduce>() + " (with fixed)");
}

template <class C, class K, class P>
std::unique_ptr<stepper> make_if_offered(const method_config& m, host_comm comm, const gravac::layout& lay) {
  if constexpr (offered<C, K, P>)
    return std::make_unique<trainer_stepper<C, K, P>>(m, comm, lay);
  else
    not_offered(m, !K::template accepts<C>);
}

template <class C, class K>
std::unique_ptr<stepper> dispatch_policy(const method_config& m, host_comm comm, const gravac::layout& lay) {
  switch (m.policy) {
    case policy_id::fixed:
      return make_if_offered<C, K, gravac::fixed_policy>(m, comm, lay);
    case policy_id::gravac:
      return make_if_offered<C, K, gravac::gravac_policy>(m, comm, lay);
    case policy_id::accordion:
      return make_if_offered<C, K, gravac::accordion_policy>(m, comm, lay);
    case policy_id::adacomp:
      return make_if_offered<C, K, gravac::adacomp_policy>(m, comm, lay);
    case policy_id::moo:
      return make_if_offered<C, K, gravac::moo_policy>(m, comm, lay);
  }
  not_offered(m);
}

//! The trainer of compressor C for the collective and policy \p m names.
template <class C>
std::unique_ptr<stepper> dispatch_collective(const method_config& m, host_comm comm, const gravac::layout& lay) {
  switch (m.collective) {
    case collective_id::dense_allreduce:
      return dispatch_policy<C, gravac::dense_allreduce>(m, comm, lay);
    case collective_id::allgather:
      return dispatch_policy<C, gravac::allgather>(m, comm, lay);
    case collective_id::allreduce_compatible:
      return dispatch_policy<C, gravac::allreduce_compatible>(m, comm, lay);
    case collective_id::flexible:
      return dispatch_policy<C, gravac::flexible>(m, comm, lay);
    case collective_id::low_rank_allreduce:
      return dispatch_policy<C, gravac::low_rank_allreduce>(m, comm, lay);
    case collective_id::compressed_allreduce:
      // Instantiated only where compressed_allreduce::accepts<C> holds (offered<>): the
      // others end in not_offered, which names the compressors it takes.
      return dispatch_policy<C, gravac::compressed_allreduce>(m, comm, lay);
  }
  not_offered(m);
}

// One per compressor family (src/method_*.cpp).
std::unique_ptr<stepper> make_topk_stepper(const method_config& m, host_comm comm, const gravac::layout& lay);
std::unique_ptr<stepper> make_selection_stepper(const method_config& m, host_comm comm, const gravac::layout& lay);
std::unique_ptr<stepper> make_other_stepper(const method_config& m, host_comm comm, const gravac::layout& lay);

}  // namespace fmnist::detail
