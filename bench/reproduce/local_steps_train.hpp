#pragma once
// Local-step training of the reproduction's models (gravac::local_steps), with the data
// order, initialisation, inner optimizer and evaluation of fmnist::train, charged on several
// modeled networks at once. What reproduce_local_steps runs for the local-step methods.
#include <algorithm>
#include <cstdio>
#include <gravac/comm/simulated_communicator.hpp>
#include <gravac/comm/thread_communicator.hpp>
#include <gravac/local_steps.hpp>
#include <gravac/network/random_walk_profile.hpp>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "fmnist/train.hpp"

namespace repro {

//! What a local-step run recorded (rank 0's view; the model is the same on every rank).
struct local_run {
  std::vector<double> test_acc;                         //!< per epoch, of the global parameters
  std::vector<std::vector<double>> clock;               //!< [network][epoch]: modeled time at the epoch's end
  std::vector<double> wire_received;                    //!< per network: wire bytes a rank received (mean over ranks)
  std::map<std::size_t, std::size_t> rounds_by_period;  //!< exchanges at each H
  std::map<double, std::size_t> rounds_by_fraction;     //!< exchanges at each kept fraction
  //! Modeled time at which test accuracy first reached \p target on network \p k (< 0: never).
  [[nodiscard]] double time_to(double target, std::size_t k) const {
    for (std::size_t e = 0; e < test_acc.size(); ++e)
      if (test_acc[e] >= target) return clock[k][e];
    return -1;
  }
};

//! The profile of \p n as fmnist::train builds it (constant or random walk).
inline gravac::network_profile profile_of(const fmnist::network_config& n) {
  if (n.type == fmnist::network_config::kind::random_walk) return gravac::random_walk_profile({}, n.walk_seed);
  gravac::require(n.type == fmnist::network_config::kind::constant,
                  "local_steps_train: only constant and random-walk networks");
  return gravac::network_profile::constant(gravac::network_params::from_gbps(n.latency_s, n.gbps));
}

//! Trains on this rank with local_steps<C, K, P> and options \p opt; \p nets[0] is the
//! network the exchanges (and a policy) see, the others are charged alongside (shadows).
//! Compute per inner step is cfg.compute_s (>= 0); codec time is not charged. The exchange
//! is never overlapped here: every network's clock charges all of it.
template <class C, class K, class P>
local_run train_local(gravac::thread_communicator& comm, const fmnist::dataset& train_set,
                      const fmnist::dataset& test_set, const fmnist::run_config& cfg,
                      const typename gravac::local_steps<C, K, P>::options& opt,
                      const std::vector<fmnist::network_config>& nets) {
  using host_comm = fmnist::host_comm;
  const int ranks = comm.size(), rank = comm.rank();
  gravac::require(cfg.compute_s >= 0 && !nets.empty() && !opt.overlap, "train_local: compute_s, networks, no overlap");
  const std::size_t per_epoch = cfg.train_subset ? std::min(cfg.train_subset, train_set.n) : train_set.n;
  const std::size_t steps_per_epoch = per_epoch / cfg.batch, local = cfg.batch / static_cast<std::size_t>(ranks);
  auto net = fmnist::make_model(cfg.model, cfg.mlp_hidden);
  const gravac::layout& lay = net->get_layout();
  std::vector<float> params(net->num_params()), grads(net->num_params());
  net->init(params, cfg.seed);
  fmnist::sgd_momentum inner(params.size(), cfg.momentum, cfg.weight_decay);
  std::vector<std::uint32_t> order(train_set.n);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 data_rng(cfg.seed ^ 0x9e3779b97f4a7c15ull);  // fmnist::train's data order

  // The networks wrap the engine, the one the exchanges see outermost.
  using sim_t = gravac::simulated_communicator<host_comm>;
  std::vector<std::unique_ptr<sim_t>> sims;
  std::vector<host_comm> links;
  links.reserve(nets.size());
  for (std::size_t i = nets.size(); i-- > 0;) {
    links.push_back(sims.empty() ? host_comm(comm) : host_comm(*sims.back()));
    sims.push_back(std::make_unique<sim_t>(links.back(), profile_of(nets[i])));
  }
  std::reverse(sims.begin(), sims.end());  // sims[k] charges nets[k]
  std::vector<double> clock(nets.size(), 0.0), before(nets.size(), 0.0);

  gravac::local_steps<C, K, P> ls(*sims[0], lay, params, opt);

  // The fixed test subset of fmnist::train, evaluated in shards.
  std::vector<std::uint32_t> test_idx(test_set.n);
  std::iota(test_idx.begin(), test_idx.end(), 0u);
  if (cfg.test_subset && cfg.test_subset < test_set.n) {
    std::mt19937_64 trng(cfg.seed + 17);
    std::shuffle(test_idx.begin(), test_idx.end(), trng);
    test_idx.resize(cfg.test_subset);
  }
  const std::size_t tn = test_idx.size(), lo = tn * static_cast<std::size_t>(rank) / static_cast<std::size_t>(ranks),
                    hi = tn * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(ranks);
  const std::size_t px = train_set.pixels_per_image();
  std::vector<float> xt((hi - lo) * px), xb(local * px);
  std::vector<int> yt(hi - lo), yb(local);
  for (std::size_t i = lo; i < hi; ++i) {
    std::copy_n(test_set.image(test_idx[i]), px, xt.data() + (i - lo) * px);
    yt[i - lo] = test_set.labels[test_idx[i]];
  }

  local_run res;
  res.clock.assign(nets.size(), {});
  std::uint64_t step = 0;
  for (std::size_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    const double lr = cfg.lr.at(epoch);
    std::shuffle(order.begin(), order.end(), data_rng);
    for (std::size_t s = 0; s < steps_per_epoch; ++s, ++step) {
      const std::uint32_t* shard = order.data() + s * cfg.batch + static_cast<std::size_t>(rank) * local;
      for (std::size_t i = 0; i < local; ++i) {
        std::copy_n(train_set.image(shard[i]), px, xb.data() + i * px);
        yb[i] = train_set.labels[shard[i]];
      }
      for (std::size_t k = 0; k < sims.size(); ++k) {
        sims[k]->set_step(step);
        before[k] = sims[k]->modeled_seconds();
      }
      const std::size_t period = ls.period();
      net->forward_backward(params, xb.data(), yb.data(), local, grads);
      const bool per_step = ls.before_inner_step(grads) != nullptr;
      inner.step(params, grads, lr);
      const bool exchanged = ls.after_inner_step(params) != nullptr || per_step;
      // Per-step rounds follow local ones: the momentum becomes the ranks' average (it is each
      // rank's own after local steps; per-step rounds need it the same on every rank).
      if (ls.inner_state_must_agree()) ls.average_inner_state(inner.velocity());
      if (rank == 0 && exchanged) {
        ++res.rounds_by_period[period];
        ++res.rounds_by_fraction[ls.exchange_trainer().last_params().global_fraction];
      }
      for (std::size_t k = 0; k < sims.size(); ++k) {
        clock[k] += cfg.compute_s + (sims[k]->modeled_seconds() - before[k]);
        sims[k]->add_compute_seconds(cfg.compute_s);
      }
    }
    if (epoch + 1 == cfg.epochs) {
      // The end of training: the round in progress ends now (charged), so its steps count
      // and every rank holds the final model, as a DiLoCo run ends.
      for (std::size_t k = 0; k < sims.size(); ++k) before[k] = sims[k]->modeled_seconds();
      ls.finish_round(params);
      for (std::size_t k = 0; k < sims.size(); ++k) clock[k] += sims[k]->modeled_seconds() - before[k];
    }
    // The model is the global point; the evaluation's reduction is not charged.
    const auto g = ls.global_params();
    const fmnist::batch_result tr = net->evaluate(g, xt.data(), yt.data(), yt.size());
    double ev[2] = {static_cast<double>(tr.correct), static_cast<double>(tr.samples)};
    comm.allreduce_sum(std::span<double>(ev, 2));
    res.test_acc.push_back(ev[0] / ev[1]);
    for (std::size_t k = 0; k < nets.size(); ++k) res.clock[k].push_back(clock[k]);
  }
  for (const auto& sm : sims) {
    double w = sm->wire_bytes_received();
    comm.allreduce_sum(std::span<double>(&w, 1));
    res.wire_received.push_back(w / ranks);
  }
  return res;
}

}  // namespace repro
