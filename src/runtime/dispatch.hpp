#pragma once
// From a runtime method_config to one trainer<C, K, P>. Included only by this folder's
// translation units; each instantiates one compressor family, so no unit grows large.
// The compositions offered are those composition_verdict accepts: nothing here says by
// hand which parts go together.

#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "gravac/checkpoint.hpp"
#include "gravac/local_steps.hpp"
#include "gravac/runtime/make_local_steps.hpp"
#include "gravac/runtime/make_trainer.hpp"
#include "gravac/trainer/detail/composition_checks.hpp"

namespace gravac::runtime::detail {

// The library's parts, in the order of the name tables (method_config.hpp).
using compressor_types = std::tuple<identity, topk, randomk, threshold, adacomp, qsgd, terngrad, sign, cast16, powersgd,
                                    mxfp8, mxfp4, nvfp4, fp8_rowwise, sparseloco>;
using collective_types = std::tuple<dense_allreduce, allgather, allreduce_compatible, flexible, low_rank_allreduce,
                                    compressed_allreduce>;
using policy_types = std::tuple<fixed_policy, gravac_policy, accordion_policy, adacomp_policy, moo_policy>;
static_assert(std::tuple_size_v<compressor_types> == std::size(compressor_names));
static_assert(std::tuple_size_v<collective_types> == std::size(collective_names));
static_assert(std::tuple_size_v<policy_types> == std::size(policy_names));

// Calls f.template operator()<T>() for the T at \p index of Tuple.
template <class Tuple, class F, std::size_t... I>
decltype(auto) visit_type(std::size_t index, F&& f, std::index_sequence<I...>) {
  using R = decltype(f.template operator()<std::tuple_element_t<0, Tuple>>());
  if constexpr (std::is_void_v<R>) {
    ((index == I ? (f.template operator()<std::tuple_element_t<I, Tuple>>(), true) : false) || ...);
  } else {
    R r{};
    ((index == I ? (r = f.template operator()<std::tuple_element_t<I, Tuple>>(), true) : false) || ...);
    return r;
  }
}
template <class Tuple, class F>
decltype(auto) visit_type(std::size_t index, F&& f) {
  return visit_type<Tuple>(index, std::forward<F>(f), std::make_index_sequence<std::tuple_size_v<Tuple>>{});
}

// The options of part T inside a method_config.
template <class T>
const auto& options_of(const method_config& m) {
  if constexpr (std::is_same_v<T, identity>) return m.identity;
  else if constexpr (std::is_same_v<T, topk>) return m.topk;
  else if constexpr (std::is_same_v<T, randomk>) return m.randomk;
  else if constexpr (std::is_same_v<T, threshold>) return m.threshold;
  else if constexpr (std::is_same_v<T, adacomp>) return m.adacomp;
  else if constexpr (std::is_same_v<T, qsgd>) return m.qsgd;
  else if constexpr (std::is_same_v<T, terngrad>) return m.terngrad;
  else if constexpr (std::is_same_v<T, sign>) return m.sign;
  else if constexpr (std::is_same_v<T, cast16>) return m.cast16;
  else if constexpr (std::is_same_v<T, powersgd>) return m.powersgd;
  else if constexpr (std::is_same_v<T, mxfp8>) return m.mxfp8;
  else if constexpr (std::is_same_v<T, mxfp4>) return m.mxfp4;
  else if constexpr (std::is_same_v<T, nvfp4>) return m.nvfp4;
  else if constexpr (std::is_same_v<T, fp8_rowwise>) return m.fp8_rowwise;
  else if constexpr (std::is_same_v<T, sparseloco>) return m.sparseloco;
  else if constexpr (std::is_same_v<T, dense_allreduce>) return m.dense_allreduce;
  else if constexpr (std::is_same_v<T, allgather>) return m.allgather;
  else if constexpr (std::is_same_v<T, allreduce_compatible>) return m.allreduce_compatible;
  else if constexpr (std::is_same_v<T, flexible>) return m.flexible;
  else if constexpr (std::is_same_v<T, low_rank_allreduce>) return m.low_rank_allreduce;
  else if constexpr (std::is_same_v<T, compressed_allreduce>) return m.compressed_allreduce;
  else if constexpr (std::is_same_v<T, fixed_policy>) return m.fixed;
  else if constexpr (std::is_same_v<T, gravac_policy>) return m.gravac;
  else if constexpr (std::is_same_v<T, accordion_policy>) return m.accordion;
  else if constexpr (std::is_same_v<T, adacomp_policy>) return m.adacomp_policy;
  else if constexpr (std::is_same_v<T, moo_policy>) return m.moo;
  else if constexpr (std::is_same_v<T, local_steps_policy>) return m.local.policy;
  else static_assert(sizeof(T) == 0, "gravac::runtime: no options for this part");
}

// A short description of a policy's state.
inline std::string state_of(const fixed_policy&) { return {}; }
inline std::string state_of(const gravac_policy& p) {
  char b[96];
  std::snprintf(b, sizeof b, "%s, CF %.0f", std::string(to_string(p.phase())).c_str(), p.current_cf());
  return b;
}
inline std::string state_of(const accordion_policy& p) {
  std::size_t low = 0, high = 0;
  for (auto l : p.levels()) {
    if (l == accordion_level::low) ++low;
    if (l == accordion_level::high) ++high;
  }
  return std::to_string(low) + " layers low, " + std::to_string(high) + " high";
}
inline std::string state_of(const adacomp_policy& p) {
  char b[64];
  std::snprintf(b, sizeof b, "achieved CF %.0f", p.mean_model_cf());
  return b;
}
inline std::string state_of(const moo_policy& p) {
  char b[96];
  if (!p.decided()) return "warm-up";
  std::snprintf(b, sizeof b, "f %.4f (%zu decisions)", p.last_decision().fraction,
                static_cast<std::size_t>(p.decisions()));
  return b;
}

inline std::string state_of(const local_steps_policy& p) {
  char b[96];
  std::snprintf(b, sizeof b, "H %zu, kept %.3g (%llu changes)", p.period(), p.choice().kept_fraction,
                static_cast<unsigned long long>(p.changes()));
  return b;
}

// trainer<C, K, P>'s options from \p m, with the compressor's options \p c given apart (a
// device compressor's carry its stream).
template <class C, class K, class P>
typename trainer<C, K, P>::options trainer_options(const method_config& m, const typename C::options& c) {
  typename trainer<C, K, P>::options o;
  o.compressor = c;
  o.collective = options_of<K>(m);
  o.policy = options_of<P>(m);
  o.seed = m.seed;
  o.bucket_bytes = m.bucket_bytes;
  o.on_non_finite = m.on_non_finite;
  return o;
}

// What a type-erased trainer forwards to its trainer<C, K, P> unchanged, in host and device
// memory alike; the erased trainers add the step's memory view and the state.
template <class C, class K, class P>
class erased_common : public any_trainer {
 public:
  using trainer_t = trainer<C, K, P>;
  template <class Comm>
  erased_common(const method_config& m, Comm comm, const layout& lay, const typename C::options& c)
      : t_(comm, lay, trainer_options<C, K, P>(m, c)) {}
  void ready(std::size_t layer, double ready_s) override { t_.ready(layer, ready_s); }
  void ready(std::size_t layer) override { t_.ready(layer); }
  const step_report& finish() override { return t_.finish(); }
  [[nodiscard]] const step_report& last_report() const override { return t_.last_report(); }
  [[nodiscard]] std::uint64_t steps() const override { return t_.steps(); }
  [[nodiscard]] std::size_t buckets() const override { return t_.buckets().size(); }
  [[nodiscard]] const layout& get_layout() const override { return t_.get_layout(); }
  void end_interval(const interval_info& info) override { t_.end_interval(info); }
  [[nodiscard]] const step_params& last_params() const override { return t_.last_params(); }
  [[nodiscard]] std::string policy_state() const override { return state_of(t_.policy()); }
  [[nodiscard]] std::vector<std::byte> save_state() const override { return save_checkpoint_bytes(t_); }
  void load_state(std::span<const std::byte> bytes) override { restore_checkpoint_bytes(t_, bytes); }
  void save_checkpoint(const std::string& path) override { gravac::save_checkpoint(t_, path, {.collective = false}); }
  void restore_checkpoint(const std::string& path) override {
    gravac::restore_checkpoint(t_, path, {.collective = false});
  }

 protected:
  trainer_t t_;
};

template <class C, class K, class P>
class erased_trainer final : public erased_common<C, K, P> {
  using erased_common<C, K, P>::t_;

 public:
  erased_trainer(const method_config& m, host_comm comm, const layout& lay)
      : erased_common<C, K, P>(m, comm, lay, options_of<C>(m)) {}
  const step_report& step(std::span<float> grads) override { return t_.step(grads); }
  void begin_step(std::span<float> grads) override { t_.begin_step(grads); }
};

// local_steps<C, K, P>'s options from \p m: the exchange's trainer and the rounds.
template <class C, class K, class P>
typename local_steps<C, K, P>::options local_options(const method_config& m) {
  typename local_steps<C, K, P>::options o;
  o.exchange = trainer_options<C, K, P>(m, options_of<C>(m));
  o.period = m.local.period;
  o.overlap = m.local.overlap;
  o.outer = m.local.outer;
  return o;
}

template <class C, class K, class P>
class erased_local_steps final : public any_local_steps {
 public:
  erased_local_steps(const method_config& m, host_comm comm, const layout& lay, std::span<const float> params)
      : ls_(comm, lay, params, local_options<C, K, P>(m)) {}
  const step_report* before_inner_step(std::span<float> grads) override { return ls_.before_inner_step(grads); }
  const step_report* after_inner_step(std::span<float> params) override { return ls_.after_inner_step(params); }
  const step_report* finish_round(std::span<float> params) override { return ls_.finish_round(params); }
  void complete_exchange() override { ls_.complete_exchange(); }
  [[nodiscard]] bool inner_state_must_agree() const override { return ls_.inner_state_must_agree(); }
  void average_inner_state(std::span<float> state) override { ls_.average_inner_state(state); }
  void end_interval(const interval_info& info) override { ls_.end_interval(info); }
  [[nodiscard]] std::size_t period() const override { return ls_.period(); }
  [[nodiscard]] std::size_t round_step() const override { return ls_.round_step(); }
  [[nodiscard]] std::uint64_t inner_steps() const override { return ls_.inner_steps(); }
  [[nodiscard]] std::uint64_t exchanges() const override { return ls_.exchange_trainer().steps(); }
  [[nodiscard]] bool exchange_in_flight() const override { return ls_.exchange_in_flight(); }
  [[nodiscard]] std::span<const float> global_params() const override { return ls_.global_params(); }
  [[nodiscard]] const step_report& last_report() const override { return ls_.exchange_trainer().last_report(); }
  [[nodiscard]] const layout& get_layout() const override { return ls_.exchange_trainer().get_layout(); }
  [[nodiscard]] std::string policy_state() const override {
    const std::string s = state_of(ls_.exchange_trainer().policy());
    return s.empty() ? "H " + std::to_string(ls_.period()) : s;
  }
  [[nodiscard]] std::vector<std::byte> save_state() override {
    std::vector<std::byte> out;
    ls_.save(out);
    return out;
  }
  void load_state(std::span<const std::byte> bytes) override { ls_.load(bytes); }

 private:
  local_steps<C, K, P> ls_;
};

// The policy of local steps' rounds: local_steps_policy when it chooses H, else fixed.
template <class F>
decltype(auto) visit_local_policy(const method_config& m, F&& f) {
  if (m.local.adaptive) return f.template operator()<local_steps_policy>();
  return f.template operator()<fixed_policy>();
}

// What a compressor family builds: a per-step trainer, or local steps from \p params.
struct build_request {
  const method_config& m;
  host_comm comm;
  const layout& lay;
  const std::span<const float>* params;  // nullptr: a per-step trainer
};
// What it built (one of the two).
struct built {
  std::unique_ptr<any_trainer> trainer;
  std::unique_ptr<any_local_steps> local;
};

// The trainer (or local steps) of compressor C for the collective and policy the request
// names; empty where the library refuses the composition (the caller has checked first).
template <class C>
built build_for(const build_request& r) {
  return visit_type<collective_types>(static_cast<std::size_t>(r.m.collective), [&]<class K>() {
    if (r.params != nullptr)
      return visit_local_policy(r.m, [&]<class P>() {
        built b;
        if constexpr (gravac::detail::composition_verdict<C, K, P>() == rejection::none)
          b.local = std::make_unique<erased_local_steps<C, K, P>>(r.m, r.comm, r.lay, *r.params);
        return b;
      });
    return visit_type<policy_types>(static_cast<std::size_t>(r.m.policy), [&]<class P>() {
      built b;
      if constexpr (gravac::detail::composition_verdict<C, K, P>() == rejection::none)
        b.trainer = std::make_unique<erased_trainer<C, K, P>>(r.m, r.comm, r.lay);
      return b;
    });
  });
}

// One per compressor family (trainers_*.cpp).
built make_topk(const build_request& r);
built make_selection(const build_request& r);
built make_quantizer(const build_request& r);
built make_other(const build_request& r);
built make_block_scaled(const build_request& r);

}  // namespace gravac::runtime::detail
