#pragma once
//! \file method.hpp
//! \brief The runtime choice of compressor, collective and policy, mapped onto gravac's
//! compile-time trainer<C, K, P>. The training loop sees only the small `stepper`
//! interface, so it is compiled once, and the trainer instantiations live in a few
//! translation units (src/method_*.cpp), one per compressor family.

#include <cstdint>
#include <gravac/collective/allgather.hpp>
#include <gravac/collective/allreduce_compatible.hpp>
#include <gravac/collective/compressed_allreduce.hpp>
#include <gravac/collective/dense_allreduce.hpp>
#include <gravac/collective/flexible.hpp>
#include <gravac/collective/low_rank_allreduce.hpp>
#include <gravac/comm/communicator_ref.hpp>
#include <gravac/compress/adacomp.hpp>
#include <gravac/compress/cast16.hpp>
#include <gravac/compress/identity.hpp>
#include <gravac/compress/powersgd.hpp>
#include <gravac/compress/qsgd.hpp>
#include <gravac/compress/randomk.hpp>
#include <gravac/compress/sign.hpp>
#include <gravac/compress/terngrad.hpp>
#include <gravac/compress/threshold.hpp>
#include <gravac/compress/topk.hpp>
#include <gravac/policy/accordion_policy.hpp>
#include <gravac/policy/adacomp_policy.hpp>
#include <gravac/policy/fixed_policy.hpp>
#include <gravac/policy/gravac_policy.hpp>
#include <gravac/policy/moo_policy.hpp>
#include <gravac/trainer.hpp>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fmnist {

//! The compressors the example offers.
enum class compressor_id : std::uint8_t {
  identity,
  topk,
  randomk,
  threshold,
  adacomp,
  qsgd,
  terngrad,
  sign,
  cast16,
  powersgd
};
//! The collectives the example offers.
enum class collective_id : std::uint8_t {
  dense_allreduce,
  allgather,
  allreduce_compatible,
  flexible,
  low_rank_allreduce,
  compressed_allreduce
};
//! The policies the example offers.
enum class policy_id : std::uint8_t { fixed, gravac, accordion, adacomp, moo };

//! A name and the value it stands for (command-line choices).
template <class E>
struct named {
  std::string_view name;  //!< the command-line spelling
  E value;                //!< the choice
};

//! Every compressor, by its command-line name.
inline constexpr named<compressor_id> compressor_names[] = {
    {"identity", compressor_id::identity},   {"topk", compressor_id::topk},       {"randomk", compressor_id::randomk},
    {"threshold", compressor_id::threshold}, {"adacomp", compressor_id::adacomp}, {"qsgd", compressor_id::qsgd},
    {"terngrad", compressor_id::terngrad},   {"sign", compressor_id::sign},       {"cast16", compressor_id::cast16},
    {"powersgd", compressor_id::powersgd}};
//! Every collective, by its command-line name.
inline constexpr named<collective_id> collective_names[] = {
    {"dense_allreduce", collective_id::dense_allreduce},
    {"allgather", collective_id::allgather},
    {"allreduce_compatible", collective_id::allreduce_compatible},
    {"flexible", collective_id::flexible},
    {"low_rank_allreduce", collective_id::low_rank_allreduce},
    {"compressed_allreduce", collective_id::compressed_allreduce}};
//! Every policy, by its command-line name.
inline constexpr named<policy_id> policy_names[] = {{"fixed", policy_id::fixed},
                                                    {"gravac", policy_id::gravac},
                                                    {"accordion", policy_id::accordion},
                                                    {"adacomp", policy_id::adacomp},
                                                    {"moo", policy_id::moo}};

//! The command-line name of \p v.
template <class E, std::size_t N>
constexpr std::string_view name_of(const named<E> (&table)[N], E v) noexcept {
  for (const auto& n : table)
    if (n.value == v) return n.name;
  return "?";
}

//! Everything that defines one method: which three parts, and the options of every part
//! (the library's own option structs, so every knob the library has is reachable).
struct method_config {
  compressor_id compressor = compressor_id::topk;       //!< which compressor
  collective_id collective = collective_id::allgather;  //!< which collective
  policy_id policy = policy_id::gravac;                 //!< which policy

  gravac::identity_options identity{};    //!< options of identity
  gravac::topk_options topk{};            //!< options of topk
  gravac::randomk_options randomk{};      //!< options of randomk
  gravac::threshold_options threshold{};  //!< options of threshold
  gravac::adacomp_options adacomp{};      //!< options of the adacomp compressor
  gravac::qsgd_options qsgd{};            //!< options of qsgd
  gravac::terngrad_options terngrad{};    //!< options of terngrad
  gravac::sign_options sign{};            //!< options of sign
  gravac::cast16_options cast16{};        //!< options of cast16
  gravac::powersgd_options powersgd{};    //!< options of powersgd

  gravac::dense_allreduce_options dense_allreduce{};            //!< options of dense_allreduce
  gravac::allgather_options allgather{};                        //!< options of allgather
  gravac::allreduce_compatible_options allreduce_compatible{};  //!< options of AR-Topk
  gravac::flexible_options flexible{};                          //!< options of flexible
  gravac::low_rank_allreduce_options low_rank_allreduce{};      //!< options of low_rank_allreduce
  gravac::compressed_allreduce_options compressed_allreduce{};  //!< options of compressed_allreduce

  gravac::fixed_policy_options fixed{};             //!< options of fixed_policy
  gravac::gravac_policy_options gravac{};           //!< options of gravac_policy
  gravac::accordion_policy_options accordion{};     //!< options of accordion_policy
  gravac::adacomp_policy_options adacomp_policy{};  //!< options of adacomp_policy
  gravac::moo_policy_options moo{};                 //!< options of moo_policy

  std::uint64_t seed = 0;  //!< the trainer's shared seed (random-k, stochastic rounding)
  //! The trainer's bucket size in bytes of float gradient (trainer options::bucket_bytes):
  //! gravac::bucket_per_layer, gravac::one_bucket or anything between.
  std::size_t bucket_bytes = gravac::default_bucket_bytes;
  gravac::non_finite_action on_non_finite = gravac::non_finite_action::throw_error;  //!< NaN / inf handling
};

//! "compressor + collective + policy", e.g. "topk + allgather + gravac".
inline std::string method_name(const method_config& m) {
  return std::string(name_of(compressor_names, m.compressor)) + " + " +
         std::string(name_of(collective_names, m.collective)) + " + " + std::string(name_of(policy_names, m.policy));
}

//! One trainer<C, K, P> behind a virtual interface: the training loop's only view of gravac.
class stepper {
 public:
  virtual ~stepper() = default;
  //! Runs one gravac step on the flat gradient buffer (left holding the rank average).
  virtual const gravac::step_report& step(std::span<float> grads) = 0;
  //! Starts an asynchronous step on \p grads, which backward is about to fill
  //! (trainer::begin_step): the buckets run on the trainer's communication thread as
  //! ready() fills them.
  virtual void begin_step(std::span<float> grads) = 0;
  //! Layer \p layer's gradient is final, at \p ready_s seconds on the modeled timeline of
  //! the step (from begin_step) (trainer::ready).
  virtual void ready(std::size_t layer, double ready_s) = 0;
  //! Layer \p layer's gradient is final now: its time on the timeline is the wall time since
  //! begin_step (trainer::ready).
  virtual void ready(std::size_t layer) = 0;
  //! Ends the asynchronous step: waits for every bucket, leaves the rank average in the
  //! buffer given to begin_step and returns the step's report (trainer::finish).
  virtual const gravac::step_report& finish() = 0;
  //! Buckets the trainer aggregates a step in.
  [[nodiscard]] virtual std::size_t buckets() const = 0;
  //! Marks the end of an interval (an epoch) for the policy.
  virtual void end_interval(const gravac::interval_info& info) = 0;
  //! The parameters the policy chose for the last step.
  [[nodiscard]] virtual const gravac::step_params& last_params() const = 0;
  //! A short line about the policy's state (phase, ratio), for the per-epoch output.
  [[nodiscard]] virtual std::string policy_state() const = 0;
  //! Writes this rank's gravac checkpoint (residuals, policy, compressor and collective
  //! state) to \p path, atomically. Rank-local: the caller agrees on success across ranks
  //! over its own engine, so that no collective of the checkpoint is charged to a
  //! simulated network.
  virtual void save_checkpoint(const std::string& path) = 0;
  //! Restores this rank's trainer from \p path (written by save_checkpoint on the same
  //! rank, for the same layout). Rank-local, like save_checkpoint; throws gravac::error
  //! without changing the trainer when the file is unusable.
  virtual void restore_checkpoint(const std::string& path) = 0;
};

//! The communicator a stepper runs on (any engine, possibly a simulated network).
using host_comm = gravac::communicator_ref<gravac::host_space>;

//! Builds the trainer for \p m over \p comm and \p lay. Throws gravac::error naming the
//! combinations that are offered when \p m asks for one that is not (for instance
//! allreduce_compatible with a compressor that has no index hook, or compressed_allreduce
//! with one it cannot run on shards).
std::unique_ptr<stepper> make_stepper(const method_config& m, host_comm comm, const gravac::layout& lay);

}  // namespace fmnist
