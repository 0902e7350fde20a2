#pragma once
//! \file method_config.hpp
//! \brief A method chosen at run time: which compressor, collective and policy, by name,
//! and the options of every part (the library's own option structs, so every knob is
//! reachable). make_trainer builds the trainer<C, K, P> it names.

#include <cstdint>
#include <string>
#include <string_view>

#include "gravac/collective/allgather.hpp"
#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/collective/compressed_allreduce.hpp"
#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/collective/flexible.hpp"
#include "gravac/collective/low_rank_allreduce.hpp"
#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/block_scaled.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/fp8_rowwise.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/powersgd.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/randomk.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/sparseloco.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/non_finite_action.hpp"
#include "gravac/local/outer_optimizer.hpp"
#include "gravac/policy/accordion_policy.hpp"
#include "gravac/policy/adacomp_policy.hpp"
#include "gravac/policy/fixed_policy.hpp"
#include "gravac/policy/gravac_policy.hpp"
#include "gravac/policy/local_steps_policy.hpp"
#include "gravac/policy/moo_policy.hpp"
#include "gravac/trainer.hpp"

namespace gravac::runtime {

//! The compressors a runtime method may name (the order of detail::compressor_types).
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
  powersgd,
  mxfp8,
  mxfp4,
  nvfp4,
  fp8_rowwise,
  sparseloco
};
//! The collectives a runtime method may name (the order of detail::collective_types).
enum class collective_id : std::uint8_t {
  dense_allreduce,
  allgather,
  allreduce_compatible,
  flexible,
  low_rank_allreduce,
  compressed_allreduce
};
//! The policies a runtime method may name (the order of detail::policy_types).
enum class policy_id : std::uint8_t { fixed, gravac, accordion, adacomp, moo };

//! A name and the value it stands for.
template <class E>
struct named {
  std::string_view name;  //!< the spelling every front end uses
  E value;                //!< the choice
};

//! Every compressor, by name.
inline constexpr named<compressor_id> compressor_names[] = {
    {"identity", compressor_id::identity},    {"topk", compressor_id::topk},
    {"randomk", compressor_id::randomk},      {"threshold", compressor_id::threshold},
    {"adacomp", compressor_id::adacomp},      {"qsgd", compressor_id::qsgd},
    {"terngrad", compressor_id::terngrad},    {"sign", compressor_id::sign},
    {"cast16", compressor_id::cast16},        {"powersgd", compressor_id::powersgd},
    {"mxfp8", compressor_id::mxfp8},          {"mxfp4", compressor_id::mxfp4},
    {"nvfp4", compressor_id::nvfp4},          {"fp8_rowwise", compressor_id::fp8_rowwise},
    {"sparseloco", compressor_id::sparseloco}};
//! Every collective, by name.
inline constexpr named<collective_id> collective_names[] = {
    {"dense_allreduce", collective_id::dense_allreduce},
    {"allgather", collective_id::allgather},
    {"allreduce_compatible", collective_id::allreduce_compatible},
    {"flexible", collective_id::flexible},
    {"low_rank_allreduce", collective_id::low_rank_allreduce},
    {"compressed_allreduce", collective_id::compressed_allreduce}};
//! Every policy, by name.
inline constexpr named<policy_id> policy_names[] = {{"fixed", policy_id::fixed},
                                                    {"gravac", policy_id::gravac},
                                                    {"accordion", policy_id::accordion},
                                                    {"adacomp", policy_id::adacomp},
                                                    {"moo", policy_id::moo}};

//! The name of \p v in \p table ("?" if absent).
template <class E, std::size_t N>
constexpr std::string_view name_of(const named<E> (&table)[N], E v) noexcept {
  for (const auto& n : table)
    if (n.value == v) return n.name;
  return "?";
}

//! The value named \p name in \p table; gravac::error (invalid_argument) listing the names
//! otherwise. \p what: "compressor", "collective" or "policy".
template <class E, std::size_t N>
E value_of(const named<E> (&table)[N], std::string_view name, std::string_view what) {
  std::string known;
  for (const auto& n : table) {
    if (n.name == name) return n.value;
    known += (known.empty() ? "" : ", ") + std::string(n.name);
  }
  throw error(status::invalid_argument,
              "unknown " + std::string(what) + " '" + std::string(name) + "' (known: " + known + ")");
}

//! How local-step training runs its rounds (runtime::make_local_steps; ignored by
//! make_trainer): H fixed, or chosen with the kept fraction by local_steps_policy, and the
//! outer optimizer. The exchange is the method's compressor and collective.
struct local_round_options {
  std::size_t period = 10;  //!< H, inner steps per exchange, >= 1 (fixed policy)
  //! local_steps_policy chooses H (up to policy.max_period) and the kept fraction of each
  //! exchange from the network and the compute per step, in place of the method's policy,
  //! which must then be `fixed`.
  bool adaptive = false;
  bool overlap = false;                 //!< each exchange runs behind the next round, applied one round late
  outer_options outer{};                //!< the outer optimizer (DiLoCo's Nesterov 0.7 / 0.9 by default)
  local_steps_policy_options policy{};  //!< the adaptive policy's options
};

//! Everything that defines one method: which three parts, and the options of every part.
struct method_config {
  compressor_id compressor = compressor_id::topk;       //!< which compressor
  collective_id collective = collective_id::allgather;  //!< which collective
  policy_id policy = policy_id::gravac;                 //!< which policy

  identity_options identity{};        //!< options of identity
  topk_options topk{};                //!< options of topk
  randomk_options randomk{};          //!< options of randomk
  threshold_options threshold{};      //!< options of threshold
  adacomp_options adacomp{};          //!< options of the adacomp compressor
  qsgd_options qsgd{};                //!< options of qsgd
  terngrad_options terngrad{};        //!< options of terngrad
  sign_options sign{};                //!< options of sign
  cast16_options cast16{};            //!< options of cast16
  powersgd_options powersgd{};        //!< options of powersgd
  mxfp8_options mxfp8{};              //!< options of mxfp8
  mxfp4_options mxfp4{};              //!< options of mxfp4
  nvfp4_options nvfp4{};              //!< options of nvfp4
  fp8_rowwise_options fp8_rowwise{};  //!< options of fp8_rowwise
  sparseloco_options sparseloco{};    //!< options of sparseloco

  dense_allreduce_options dense_allreduce{};            //!< options of dense_allreduce
  allgather_options allgather{};                        //!< options of allgather
  allreduce_compatible_options allreduce_compatible{};  //!< options of AR-Topk
  flexible_options flexible{};                          //!< options of flexible
  low_rank_allreduce_options low_rank_allreduce{};      //!< options of low_rank_allreduce
  compressed_allreduce_options compressed_allreduce{};  //!< options of compressed_allreduce

  fixed_policy_options fixed{};             //!< options of fixed_policy
  gravac_policy_options gravac{};           //!< options of gravac_policy
  accordion_policy_options accordion{};     //!< options of accordion_policy
  adacomp_policy_options adacomp_policy{};  //!< options of adacomp_policy
  moo_policy_options moo{};                 //!< options of moo_policy
  local_round_options local{};              //!< local-step training (make_local_steps only)

  std::uint64_t seed = 0;  //!< the trainer's shared seed (random-k, stochastic rounding)
  //! The trainer's bucket size in bytes of float gradient (trainer options::bucket_bytes):
  //! bucket_per_layer, one_bucket or anything between.
  std::size_t bucket_bytes = default_bucket_bytes;
  non_finite_action on_non_finite = non_finite_action::throw_error;  //!< NaN / inf handling
};

//! "compressor + collective + policy", e.g. "topk + allgather + gravac".
inline std::string method_name(const method_config& m) {
  return std::string(name_of(compressor_names, m.compressor)) + " + " +
         std::string(name_of(collective_names, m.collective)) + " + " + std::string(name_of(policy_names, m.policy));
}

}  // namespace gravac::runtime
