#pragma once
// The method configurations the reproduction's binaries share: the static choices (a
// compressor at a fixed kept fraction) and GraVAC, including the library's recommended
// adaptive configuration. Change the recommendation here; reproduce and network_grid follow.
#include <cstdint>
#include <gravac/policy/gravac_policy.hpp>

#include "fmnist/method.hpp"

namespace repro {

//! Compressor \p c over collective \p k at the fixed kept fraction \p f.
inline fmnist::method_config fixed_config(fmnist::compressor_id c, fmnist::collective_id k, double f) {
  fmnist::method_config m;
  m.compressor = c;
  m.collective = k;
  m.policy = fmnist::policy_id::fixed;
  m.fixed.kept_fraction = f;
  return m;
}

//! GraVAC over top-k and collective \p k at \p eps, on the simulated clock (compute +
//! measured codec + modeled communication); \p period steps per evaluation (0: an epoch).
inline fmnist::method_config gravac_config(double eps, fmnist::collective_id k, std::uint64_t period,
                                           bool dense_candidate) {
  fmnist::method_config m;
  m.compressor = fmnist::compressor_id::topk;
  m.collective = k;
  m.policy = fmnist::policy_id::gravac;
  m.gravac.period_steps = period;
  m.gravac.epsilon = eps;
  m.gravac.dense_candidate = dense_candidate;
  m.gravac.time.source = gravac::time_source::simulated;
  return m;
}

//! The recommended adaptive configuration (the library's preset, gravac::runtime::recommended)
//! on the reproduction's simulated clock: it learns the network from the step times it
//! sees; it is not told the network.
inline fmnist::method_config recommended_config(std::uint64_t period) {
  auto m = gravac::runtime::recommended(period);
  m.gravac.time.source = gravac::time_source::simulated;  // the reproduction's clock
  return m;
}

}  // namespace repro
