#pragma once
//! \file presets.hpp
//! \brief Named methods: the recommended configuration and the baselines every comparison
//! starts from.

#include <string_view>

#include "gravac/runtime/method_config.hpp"

namespace gravac::runtime {

//! The recommended adaptive configuration, for a network the program is not told about:
//! GraVAC over top-k and Allgather at the default eps, with dense among its choices, on
//! measured clocks. \p period_steps: steps per evaluation period (0: one interval, an epoch
//! marked by end_interval; a DDP hook that marks none needs a step count).
inline method_config recommended(std::uint64_t period_steps = 100) {
  method_config m;
  m.compressor = compressor_id::topk;
  m.collective = collective_id::allgather;
  m.policy = policy_id::gravac;
  m.gravac.period_steps = period_steps;
  m.gravac.dense_candidate = true;
  m.gravac.time.source = time_source::measured;
  return m;
}

//! Dense SGD through gravac: identity over an Allreduce.
inline method_config dense() {
  method_config m;
  m.compressor = compressor_id::identity;
  m.collective = collective_id::dense_allreduce;
  m.policy = policy_id::fixed;
  return m;
}

//! The preset names, in the order of gravac_name_at(GRAVAC_PRESETS, i).
inline constexpr std::string_view preset_names[] = {"recommended", "dense"};

//! The preset named \p name; gravac::error (invalid_argument) listing them otherwise.
inline method_config preset(std::string_view name) {
  if (name == "recommended") return recommended();
  if (name == "dense") return dense();
  std::string known;
  for (auto n : preset_names) known += (known.empty() ? "" : ", ") + std::string(n);
  throw error(status::invalid_argument, "unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace gravac::runtime
