// The data-parallel training loop of the Fashion-MNIST example (see fmnist/train.hpp).
#include "fmnist/train.hpp"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>
#include <random>

#include <gravac/network/simulated_network.hpp>

namespace fmnist {

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double parse_number(const std::string& s, const std::string& spec) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  gravac::require(used == s.size() && std::isfinite(v) && v > 0,
                  "network: cannot read a positive number from '" + s + "' in '" + spec + "'");
  return v;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The numel-weighted mean kept fraction (capped at 1) of a step's parameters.
double chosen_fraction(const gravac::step_params& p, const gravac::layout& lay) {
  double kept = 0;
  for (std::size_t i = 0; i < lay.size() && i < p.kept_fraction.size(); ++i)
    kept += std::min(1.0, p.kept_fraction[i]) * static_cast<double>(lay[i].numel);
  return kept / static_cast<double>(lay.numel());
}

// Copies the images and labels of `idx` into contiguous buffers.
void gather_samples(const dataset& d, const std::uint32_t* idx, std::size_t n, std::vector<float>& x,
                    std::vector<int>& y) {
  const std::size_t px = d.pixels_per_image();
  x.resize(n * px);
  y.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::copy_n(d.image(idx[i]), px, x.data() + i * px);
    y[i] = d.labels[idx[i]];
  }
}

}  // namespace

network_config network_config::parse(const std::string& spec) {
  network_config n;
  if (spec == "none") {
    n.type = kind::none;
  } else if (spec == "schedule" || spec.rfind("schedule:", 0) == 0) {
    n.type = kind::schedule;
    if (spec.size() > 9) n.phase_epochs = parse_number(spec.substr(9), spec);
  } else if (spec.rfind("trace:", 0) == 0) {
    n.type = kind::trace;
    n.trace_path = spec.substr(6);
    gravac::require(!n.trace_path.empty(), "network: trace needs a file, e.g. trace:net.csv");
  } else {
    n.type = kind::constant;
    const auto colon = spec.find(':');
    const std::string bw = spec.substr(0, colon);
    gravac::require(ends_with(bw, "gbps"), "network: expected none, <N>gbps[:<L>ms], schedule[:<epochs>] or "
                                           "trace:<file>, got '" + spec + "'");
    n.gbps = parse_number(bw.substr(0, bw.size() - 4), spec);
    if (colon != std::string::npos) {
      const std::string lat = spec.substr(colon + 1);
      gravac::require(ends_with(lat, "ms"), "network: latency must be given in ms, e.g. 1gbps:0.05ms");
      n.latency_s = parse_number(lat.substr(0, lat.size() - 2), spec) * 1e-3;
    }
  }
  return n;
}

std::string network_config::describe() const {
  char b[128];
  switch (type) {
    case kind::none: return "none";
    case kind::schedule: std::snprintf(b, sizeof b, "schedule:%g", phase_epochs); return b;
    case kind::trace: return "trace:" + trace_path;
    case kind::constant: std::snprintf(b, sizeof b, "%ggbps:%gms", gbps, latency_s * 1e3); return b;
  }
  return "?";
}

double run_result::total_bytes_per_rank() const {
  double s = 0;
  for (const auto& e : epochs) s += e.bytes_per_rank;
  return s;
}

double run_result::total_wire_bytes_sent_per_rank() const {
  double s = 0;
  for (const auto& e : epochs) s += e.wire_bytes_sent_per_rank;
  return s;
}

double run_result::total_wire_bytes_received_per_rank() const {
  double s = 0;
  for (const auto& e : epochs) s += e.wire_bytes_received_per_rank;
  return s;
}

double run_result::modeled_time_to(double target, int shadow) const {
  for (const auto& e : epochs)
    if (e.test_acc >= target)
      return shadow < 0 ? e.modeled_time_s : e.shadow_time_s.at(static_cast<std::size_t>(shadow));
  return -1;
}

run_result train(host_comm comm, const dataset& train_set, const dataset& test_set, const run_config& cfg,
                 const train_observer& obs) {
  const int ranks = comm.size(), rank = comm.rank();
  gravac::require(cfg.batch > 0 && cfg.batch % static_cast<std::size_t>(ranks) == 0,
                  "train: the global batch (" + std::to_string(cfg.batch) + ") must be a positive multiple of the " +
                      std::to_string(ranks) + " ranks");
  gravac::require(cfg.epochs > 0, "train: epochs must be positive");
  const std::size_t per_epoch = cfg.train_subset ? std::min(cfg.train_subset, train_set.n) : train_set.n;
  const std::size_t steps_per_epoch = per_epoch / cfg.batch;
  gravac::require(steps_per_epoch > 0, "train: the training subset (" + std::to_string(per_epoch) +
                                           ") holds less than one global batch (" + std::to_string(cfg.batch) + ")");
  const std::size_t local = cfg.batch / static_cast<std::size_t>(ranks);

  auto net = make_model(cfg.model, cfg.mlp_hidden);
  const gravac::layout& lay = net->get_layout();
  std::vector<float> params(net->num_params()), grads(net->num_params());
  net->init(params, cfg.seed);
  sgd_momentum opt(params.size(), cfg.momentum, cfg.weight_decay);

  // Shared read-only batches: rank-local scratch for this rank's shard.
  std::vector<float> xb;
  std::vector<int> yb;
  std::vector<std::uint32_t> order(train_set.n);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 data_rng(cfg.seed ^ 0x9e3779b97f4a7c15ull);

  // Calibrate the modeled compute per step: the slowest rank's median thread CPU time of
  // forward + backward + optimizer-sized work on a real shard (parameters untouched).
  double compute_s = cfg.compute_s;
  if (compute_s < 0) {
    gather_samples(train_set, order.data() + static_cast<std::size_t>(rank) * local, local, xb, yb);
    std::vector<double> t;
    for (int i = 0; i < 7; ++i) {
      const double t0 = thread_cpu_seconds();
      net->forward_backward(params, xb.data(), yb.data(), local, grads);
      t.push_back(thread_cpu_seconds() - t0);
    }
    std::sort(t.begin(), t.end());
    double med = t[t.size() / 2];
    comm.allreduce_max(std::span<double>(&med, 1));
    compute_s = med;
  }

  // The modeled networks wrap this rank's engine, shadows innermost, the primary network
  // outermost (the trainer, its collective and its policy read the outermost clock).
  // Evaluation and bookkeeping use the engine directly so they are not charged.
  using sim_t = gravac::simulated_communicator<host_comm>;
  const auto make_profile = [&](const network_config& n) {
    switch (n.type) {
      case network_config::kind::schedule:
        return gravac::network_profile::fast_slow_schedule(n.phase_epochs * static_cast<double>(steps_per_epoch));
      case network_config::kind::trace: return gravac::network_profile::from_csv(n.trace_path);
      default: return gravac::network_profile::constant(gravac::network_params::from_gbps(n.latency_s, n.gbps));
    }
  };
  gravac::require(cfg.shadow_networks.empty() || cfg.network.type != network_config::kind::none,
                  "train: shadow networks need a primary network");
  std::vector<std::unique_ptr<sim_t>> sims;  // shadows..., primary
  std::vector<host_comm> links;              // links[i] is what sims[i] wraps
  auto profile = std::make_shared<gravac::network_profile>(gravac::network_profile::constant({}));
  if (cfg.network.type != network_config::kind::none) {
    links.reserve(cfg.shadow_networks.size() + 1);
    std::vector<network_config> chain = cfg.shadow_networks;
    chain.push_back(cfg.network);
    for (std::size_t i = 0; i < chain.size(); ++i) {
      links.push_back(i == 0 ? comm : host_comm(*sims.back()));
      sims.push_back(std::make_unique<sim_t>(links.back(), make_profile(chain[i])));
    }
    *profile = sims.back()->profile();
  }
  sim_t* sim = sims.empty() ? nullptr : sims.back().get();
  const std::size_t shadows = sims.empty() ? 0 : sims.size() - 1;
  std::vector<double> shadow_clock(shadows, 0.0), shadow_before(shadows, 0.0);

  // Fill in what the method's options need from the run: batch size, clocks, profile.
  method_config m = cfg.method;
  if (!(m.gravac.samples_per_step > 0)) m.gravac.samples_per_step = static_cast<double>(cfg.batch);
  if (m.gravac.time.source == gravac::time_source::simulated && m.gravac.time.compute_s == 0)
    m.gravac.time.compute_s = compute_s;
  if (m.accordion.initial_learning_rate == 0) m.accordion.initial_learning_rate = cfg.lr.at(0);
  if (!m.flexible.profile) m.flexible.profile = profile;
  if (!m.moo.profile) m.moo.profile = profile;
  if (!sim) {
    // Without a modeled network the modeled sources have nothing to read.
    if (m.flexible.source == gravac::network_source::modeled || m.flexible.source == gravac::network_source::profile)
      m.flexible.source = gravac::network_source::measured;
    if (m.moo.source == gravac::network_source::modeled || m.moo.source == gravac::network_source::profile)
      m.moo.source = gravac::network_source::measured;
    if (m.gravac.time.source != gravac::time_source::measured) m.gravac.time.source = gravac::time_source::measured;
  }
  m.seed = m.seed ? m.seed : cfg.seed;
  std::unique_ptr<stepper> st = sim ? make_stepper(m, host_comm(*sim), lay) : make_stepper(m, comm, lay);

  run_result res;
  res.method = method_name(cfg.method);
  res.model = net->name();
  res.network = cfg.network.describe();
  res.ranks = ranks;
  res.params = net->num_params();
  res.steps_per_epoch = steps_per_epoch;
  res.compute_per_step_s = compute_s;

  // Fixed test subset, evaluated in shards.
  std::vector<std::uint32_t> test_idx(test_set.n);
  std::iota(test_idx.begin(), test_idx.end(), 0u);
  if (cfg.test_subset && cfg.test_subset < test_set.n) {
    std::mt19937_64 trng(cfg.seed + 17);
    std::shuffle(test_idx.begin(), test_idx.end(), trng);
    test_idx.resize(cfg.test_subset);
  }
  std::vector<float> xt;
  std::vector<int> yt;
  {
    const std::size_t n = test_idx.size(), lo = n * static_cast<std::size_t>(rank) / static_cast<std::size_t>(ranks),
                      hi = n * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(ranks);
    gather_samples(test_set, test_idx.data() + lo, hi - lo, xt, yt);
  }

  double modeled_clock = 0;
  // The primary network's wire counters at the previous record: each step's record takes
  // the difference, so traffic between steps (none today) would land in the next step.
  double wire_sent_before = 0, wire_received_before = 0;
  std::uint64_t step = 0;
  bool stop = false;
  for (std::size_t epoch = 0; epoch < cfg.epochs && !stop; ++epoch) {
    const auto wall0 = std::chrono::steady_clock::now();
    const double lr = cfg.lr.at(epoch);
    std::shuffle(order.begin(), order.end(), data_rng);  // same permutation on every rank
    epoch_record er;
    er.epoch = epoch;
    er.lr = lr;
    double loss_sum = 0, correct = 0, seen = 0, frac_sum = 0;
    std::size_t done = 0;
    for (std::size_t s = 0; s < steps_per_epoch; ++s) {
      if (cfg.max_steps && step >= cfg.max_steps) {
        stop = true;
        break;
      }
      const std::uint32_t* shard = order.data() + s * cfg.batch + static_cast<std::size_t>(rank) * local;
      gather_samples(train_set, shard, local, xb, yb);
      const double c0 = thread_cpu_seconds();
      const batch_result br = net->forward_backward(params, xb.data(), yb.data(), local, grads);
      const double c1 = thread_cpu_seconds();
      const double clock0 = sim ? sim->modeled_seconds() : 0.0;
      for (std::size_t k = 0; k < shadows; ++k) shadow_before[k] = sims[k]->modeled_seconds();
      for (auto& sm : sims) sm->set_step(step);
      const gravac::network_params now = sim ? sim->current() : gravac::network_params{};
      const auto& rep = st->step(grads);
      const double c2 = thread_cpu_seconds();
      const double comm_s = sim ? sim->modeled_seconds() - clock0 : 0.0;
      opt.step(params, grads, lr);
      const double c3 = thread_cpu_seconds();

      // Rank-averaged loss and bytes, slowest-rank times (on the engine: not charged). The
      // wire bytes differ between ranks (a broadcast's root receives nothing), hence the mean.
      const double wire_sent = sim ? sim->wire_bytes_sent() : 0.0;
      const double wire_received = sim ? sim->wire_bytes_received() : 0.0;
      double sums[6] = {br.loss_sum, static_cast<double>(br.correct), static_cast<double>(br.samples),
                        static_cast<double>(rep.bytes_sent), wire_sent - wire_sent_before,
                        wire_received - wire_received_before};
      wire_sent_before = wire_sent;
      wire_received_before = wire_received;
      const double codec = cfg.codec_cpu_time ? c2 - c1 : rep.compress_s + rep.decompress_s;
      double maxes[2] = {(c1 - c0) + (c3 - c2), codec};
      comm.allreduce_sum(std::span<double>(sums, 6));
      comm.allreduce_max(std::span<double>(maxes, 2));

      step_record r;
      r.step = step;
      r.epoch = epoch;
      r.lr = lr;
      r.loss = sums[0] / sums[2];
      r.train_acc = sums[1] / sums[2];
      r.kept_fraction = chosen_fraction(st->last_params(), lay);
      r.bytes_sent = sums[3] / ranks;
      r.wire_bytes_sent = sums[4] / ranks;
      r.wire_bytes_received = sums[5] / ranks;
      r.dense_bytes = static_cast<double>(rep.dense_bytes);
      r.collective = std::string(gravac::to_string(rep.collective));
      r.gain = rep.gain;
      r.compute_s = maxes[0];
      r.codec_s = maxes[1];
      r.modeled_comm_s = comm_s;
      modeled_clock += compute_s + r.codec_s + comm_s;
      for (std::size_t k = 0; k < shadows; ++k)
        shadow_clock[k] += compute_s + r.codec_s + (sims[k]->modeled_seconds() - shadow_before[k]);
      for (auto& sm : sims) sm->add_compute_seconds(compute_s + r.codec_s);
      r.modeled_time_s = modeled_clock;
      if (sim) {
        r.bandwidth_gbps = 8.0 / now.beta / 1e9;
        r.latency_ms = now.alpha * 1e3;
      }
      loss_sum += sums[0];
      correct += sums[1];
      seen += sums[2];
      frac_sum += r.kept_fraction;
      er.bytes_per_rank += r.bytes_sent;
      er.dense_bytes_per_rank += r.dense_bytes;
      er.wire_bytes_sent_per_rank += r.wire_bytes_sent;
      er.wire_bytes_received_per_rank += r.wire_bytes_received;
      er.compute_s += r.compute_s;
      er.codec_s += r.codec_s;
      er.modeled_comm_s += comm_s;
      res.steps.push_back(std::move(r));
      ++step;
      ++done;
      if (rank == 0 && obs.on_step) obs.on_step(res.steps.back(), s, steps_per_epoch);
    }
    if (done == 0) break;
    // Evaluate on this rank's shard of the test subset; sum over ranks.
    const batch_result tr = net->evaluate(params, xt.data(), yt.data(), yt.size());
    double ev[3] = {tr.loss_sum, static_cast<double>(tr.correct), static_cast<double>(tr.samples)};
    comm.allreduce_sum(std::span<double>(ev, 3));
    er.train_loss = loss_sum / seen;
    er.train_acc = correct / seen;
    er.test_loss = ev[0] / ev[2];
    er.test_acc = ev[1] / ev[2];
    er.kept_fraction = frac_sum / static_cast<double>(done);
    er.modeled_time_s = modeled_clock;
    er.shadow_time_s = shadow_clock;
    st->end_interval({step, epoch + 1, cfg.lr.at(epoch + 1), static_cast<double>(done * cfg.batch)});
    er.policy_state = st->policy_state();
    er.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    res.epochs.push_back(er);
    if (rank == 0 && obs.on_epoch) obs.on_epoch(res.epochs.back(), res);
  }
  return res;
}

}  // namespace fmnist
