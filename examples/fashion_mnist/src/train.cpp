// The data-parallel training loop of the Fashion-MNIST example (see fmnist/train.hpp).
#include "fmnist/train.hpp"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <gravac/checkpoint.hpp>
#include <gravac/comm/simulated_communicator.hpp>
#include <gravac/network/random_walk_profile.hpp>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>

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
double chosen_fraction(std::span<const double> kept_fraction, const gravac::layout& lay) {
  double kept = 0;
  for (std::size_t i = 0; i < lay.size() && i < kept_fraction.size(); ++i)
    kept += std::min(1.0, kept_fraction[i]) * static_cast<double>(lay[i].numel);
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

// Every rank posts its failure (empty: none); then every rank throws the same error, naming
// each failing rank and why, or returns. It runs over the rank's own engine, never a
// simulated network, so that checkpoints charge nothing to the modeled clock and counters.
void agree(host_comm& comm, const std::string& action, const std::string& failure) {
  host_comm::byte_buffer all;
  std::vector<std::size_t> sizes;
  comm.allgatherv(std::as_bytes(std::span<const char>(failure.data(), failure.size())), all, sizes);
  std::string failures;
  std::size_t at = 0;
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    if (sizes[r] > 0)
      failures += "\n  rank " + std::to_string(r) + ": " +
                  std::string(reinterpret_cast<const char*>(all.data() + at), sizes[r]);
    at += sizes[r];
  }
  if (!failures.empty())
    throw gravac::error(gravac::status::io_failure, action + " failed on some ranks:" + failures, comm.rank(),
                        gravac::backend::io);
}

// The same value on every rank: the minimum of \p v over the ranks (exact below 2^53).
double min_over_ranks(host_comm& comm, double v) {
  double x = -v;
  comm.allreduce_max(std::span<double>(&x, 1));
  return -x;
}

// This rank's newest usable checkpoint at or below \p bound (steps done), decoded, or none.
// Every file it passes over is reported on stderr with the reason. A checkpoint written
// with other settings is an error, not a reason to fall back: resuming it would train
// something else.
std::optional<run_state> newest_usable(const checkpoint_config& ck, int rank, int ranks, const std::string& settings,
                                       std::uint64_t bound) {
  for (const std::uint64_t s : checkpoint_steps(ck.dir, rank)) {
    if (s > bound) continue;
    const std::string run_path = checkpoint_file(ck.dir, s, rank, "run");
    const std::string gravac_path = checkpoint_file(ck.dir, s, rank, "gravac");
    try {
      run_state st = decode_run_state(read_whole_file(run_path), run_path);
      if (st.step != s)
        throw gravac::error(gravac::status::io_failure, "checkpoint '" + run_path + "' is unusable: it holds step " +
                                                            std::to_string(st.step) + ", its name says " +
                                                            std::to_string(s));
      if (st.settings != settings || st.ranks != ranks || st.rank != rank)
        throw gravac::error(gravac::status::invalid_argument,
                            "checkpoint '" + run_path + "' was written by another run (rank " +
                                std::to_string(st.rank) + " of " + std::to_string(st.ranks) +
                                ", settings: " + st.settings + "); this is rank " + std::to_string(rank) + " of " +
                                std::to_string(ranks) + " with settings: " + settings +
                                ". Resume with the settings it was written with, or use another --checkpoint-dir");
      // Decoding the trainer's file checks its header, checksum and every field (local
      // steps keep their state in the run file, under its checksum).
      if (st.local_steps_state.empty()) (void)gravac::read_checkpoint(gravac_path);
      return st;
    } catch (const gravac::error& e) {
      if (e.code() == gravac::status::invalid_argument) throw;
      std::fprintf(stderr, "fashion_mnist: rank %d: %s; trying an older checkpoint\n", rank, e.what());
    }
  }
  return std::nullopt;
}

// The checkpoint every rank resumes from: the newest one that every rank can use (each
// rank checks its own files), or none when no rank has any. Throws when checkpoints exist
// but none is usable on every rank: starting over silently would redo the whole run.
std::optional<run_state> choose_checkpoint(host_comm& comm, const checkpoint_config& ck, const std::string& settings) {
  const int rank = comm.rank(), ranks = comm.size();
  double any = checkpoint_steps(ck.dir, rank).empty() ? 0.0 : 1.0;
  comm.allreduce_max(std::span<double>(&any, 1));
  if (any == 0) return std::nullopt;
  std::uint64_t bound = ~std::uint64_t{0};
  std::optional<run_state> mine = newest_usable(ck, rank, ranks, settings, bound);
  for (;;) {
    // The candidate: the oldest of the ranks' newest usable ones (-1: some rank has none).
    const double cand = min_over_ranks(comm, mine ? static_cast<double>(mine->step) : -1.0);
    if (cand < 0)
      throw gravac::error(gravac::status::io_failure,
                          "--resume: no checkpoint in '" + ck.dir +
                              "' is usable on every rank (see the messages "
                              "above); remove the directory to start over",
                          rank, gravac::backend::io);
    const auto c = static_cast<std::uint64_t>(cand);
    // A rank whose newest usable one is newer must have c itself usable too.
    if (mine && mine->step != c) mine = newest_usable(ck, rank, ranks, settings, c);
    const double all_have = min_over_ranks(comm, mine && mine->step == c ? 1.0 : 0.0);
    if (all_have == 1.0) return mine;
    if (c == 0)
      mine.reset();
    else if (mine && mine->step == c)
      mine = newest_usable(ck, rank, ranks, settings, c - 1);
  }
}

}  // namespace

std::string describe_settings(const run_config& cfg, int ranks) {
  std::ostringstream o;
  o.precision(17);
  o << "model " << (cfg.model == model_kind::cnn ? "cnn" : "mlp") << " hidden";
  for (auto h : cfg.mlp_hidden) o << ' ' << h;
  o << ", ranks " << ranks << ", batch " << cfg.batch << ", train-subset " << cfg.train_subset << ", test-subset "
    << cfg.test_subset << ", seed " << cfg.seed << ", lr " << cfg.lr.base << " gamma " << cfg.lr.gamma << " milestones";
  for (auto ms : cfg.lr.milestones) o << ' ' << ms;
  o << ", momentum " << cfg.momentum << ", weight-decay " << cfg.weight_decay << ", method "
    << run_method_name(cfg.method, cfg.local_steps) << " kept-fraction " << cfg.method.fixed.kept_fraction
    << ", network " << cfg.network.describe();
  for (const auto& n : cfg.shadow_networks) o << " shadow " << n.describe();
  if (cfg.network_allreduce != gravac::allreduce_rule::fixed)
    o << ", network allreduce rule " << static_cast<int>(cfg.network_allreduce);
  if (!cfg.ready_share.empty()) {
    o << ", ready-share";
    for (double x : cfg.ready_share) o << ' ' << x;
  }
  o << ", compute-s " << cfg.compute_s << ", codec-time " << (cfg.charge_codec ? "on" : "off") << ", bucket-bytes "
    << cfg.method.bucket_bytes << ", overlap " << (cfg.overlap ? "on" : "off");
  return o.str();
}

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
  } else if (spec.rfind("random-walk:", 0) == 0) {
    n.type = kind::random_walk;
    const std::string seed = spec.substr(12);
    gravac::require(!seed.empty() && seed.find_first_not_of("0123456789") == std::string::npos && seed.size() <= 19,
                    "network: random-walk needs a seed, a whole number, e.g. random-walk:3; got '" + spec + "'");
    n.walk_seed = std::stoull(seed);
  } else {
    n.type = kind::constant;
    const auto colon = spec.find(':');
    const std::string bw = spec.substr(0, colon);
    gravac::require(ends_with(bw, "gbps"),
                    "network: expected none, <N>gbps[:<L>ms], schedule[:<epochs>], "
                    "trace:<file> or random-walk:<seed>, got '" +
                        spec + "'");
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
    case kind::none:
      return "none";
    case kind::schedule:
      std::snprintf(b, sizeof b, "schedule:%g", phase_epochs);
      return b;
    case kind::trace:
      return "trace:" + trace_path;
    case kind::random_walk:
      return "random-walk:" + std::to_string(walk_seed);
    case kind::constant:
      std::snprintf(b, sizeof b, "%ggbps:%gms", gbps, latency_s * 1e3);
      return b;
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

std::vector<double> ready_share_model(const gravac::layout& lay, const std::vector<std::size_t>& backward_order) {
  gravac::require(backward_order.size() == lay.size(), "ready_share_model: the model announced " +
                                                           std::to_string(backward_order.size()) +
                                                           " layers, its layout has " + std::to_string(lay.size()));
  std::vector<double> share(lay.size(), 0.0);
  const double total = static_cast<double>(lay.numel());
  std::size_t done = 0;
  for (const std::size_t i : backward_order) {
    gravac::require(i < lay.size(), "ready_share_model: the model announced a layer outside its layout");
    done += lay[i].numel;
    share.at(i) = 1.0 / 3.0 + (2.0 / 3.0) * (static_cast<double>(done) / total);
  }
  return share;
}

exposure exposure_of(const run_result& r) {
  exposure x;
  for (const auto& e : r.epochs) {
    x.total_s += e.modeled_comm_s;
    x.exposed_s += e.modeled_exposed_s;
  }
  return x;
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

  const checkpoint_config& ck = cfg.checkpoint;
  const bool checkpointing = !ck.dir.empty();
  gravac::require(!ck.resume || checkpointing, "train: resuming needs a checkpoint directory");
  gravac::require(!checkpointing || ck.every > 0, "train: the checkpoint period must be positive");
  const std::string settings = describe_settings(cfg, ranks);
  if (checkpointing) {
    std::error_code ec;
    std::filesystem::create_directories(ck.dir, ec);
    agree(comm, "creating the checkpoint directory",
          std::filesystem::is_directory(ck.dir) ? "" : "cannot create '" + ck.dir + "': " + ec.message());
  }
  std::optional<run_state> resume_from;
  if (ck.resume) {
    resume_from = choose_checkpoint(comm, ck, settings);
    if (!resume_from && rank == 0)
      std::printf("fashion_mnist: --resume: no checkpoint in %s yet; starting from step 0\n", ck.dir.c_str());
  }
  if (resume_from) {
    gravac::require(resume_from->order.size() == order.size() && resume_from->params.size() == params.size(),
                    "train: the checkpoint's data order or parameters do not fit this run");
    std::istringstream in(resume_from->data_rng);
    in >> data_rng;
    gravac::require(!in.fail(), "train: the checkpoint's data-order generator state is unreadable");
    order = resume_from->order;
  }

  // Overlap charges each bucket from its modeled ready time, which only the primary network
  // sees (the trainer's communicator); a shadow network's clock would charge the whole
  // communication, so the two cannot be recorded side by side.
  gravac::require(!cfg.overlap || cfg.shadow_networks.empty(),
                  "train: --overlap on does not model shadow networks (their clocks would charge the communication "
                  "that overlap hides on the primary network); run each network on its own, or --overlap off");
  gravac::require(!cfg.overlap || !cfg.local_steps,
                  "train: --overlap on overlaps a per-step exchange with backward; with --local-steps, "
                  "--local-overlap runs each exchange behind the next round instead");

  // Calibrate the modeled compute per step: the slowest rank's median thread CPU time of
  // forward + backward + optimizer-sized work on a real shard (parameters untouched).
  // A resumed run keeps the first run's figure: the policies' simulated clocks read it.
  // With overlap, the same runs measure when each layer's gradient is final, as a share of
  // the run's time (median over the runs; the slowest rank's, i.e. the latest share over
  // the ranks, so that every rank's modeled timeline is the same).
  double compute_s = resume_from ? resume_from->compute_s : cfg.compute_s;
  std::vector<double> ready_share = resume_from ? resume_from->ready_share : cfg.ready_share;
  gravac::require(!cfg.overlap || ready_share.empty() || ready_share.size() == lay.size(),
                  "train: the ready shares given are " + std::to_string(ready_share.size()) + ", the model has " +
                      std::to_string(lay.size()) + " layers");
  const bool measure_shares = cfg.overlap && ready_share.empty();
  if (compute_s < 0) {
    gather_samples(train_set, order.data() + static_cast<std::size_t>(rank) * local, local, xb, yb);
    std::vector<double> t;
    std::vector<std::vector<double>> at(lay.size());  // at[layer][run]: seconds from the run's start
    for (int i = 0; i < 7; ++i) {
      const double t0 = thread_cpu_seconds();
      if (measure_shares)
        net->forward_backward(params, xb.data(), yb.data(), local, grads,
                              [&](std::size_t layer) { at.at(layer).push_back(thread_cpu_seconds() - t0); });
      else
        net->forward_backward(params, xb.data(), yb.data(), local, grads);
      t.push_back(thread_cpu_seconds() - t0);
      if (measure_shares)
        for (auto& a : at)
          if (a.size() == static_cast<std::size_t>(i) + 1) a.back() /= t.back() > 0 ? t.back() : 1.0;
    }
    std::sort(t.begin(), t.end());
    double med = t[t.size() / 2];
    comm.allreduce_max(std::span<double>(&med, 1));
    compute_s = med;
    if (measure_shares) {
      ready_share.assign(lay.size(), 1.0);
      for (std::size_t i = 0; i < lay.size(); ++i) {
        gravac::require(at[i].size() == 7, "train: the model did not announce layer '" + lay[i].name +
                                               "' once per backward (gradient_final_fn)");
        std::sort(at[i].begin(), at[i].end());
        ready_share[i] = std::min(1.0, at[i][at[i].size() / 2]);
      }
      comm.allreduce_max(std::span<double>(ready_share));
    }
  }
  if (cfg.overlap && ready_share.empty()) {
    // A given --compute-s: the deterministic model, in the order the model announces its
    // layers (one backward on a real shard, parameters untouched), so that runs repeat.
    gather_samples(train_set, order.data() + static_cast<std::size_t>(rank) * local, local, xb, yb);
    std::vector<std::size_t> backward_order;
    net->forward_backward(params, xb.data(), yb.data(), local, grads,
                          [&](std::size_t layer) { backward_order.push_back(layer); });
    ready_share = ready_share_model(lay, backward_order);
  }

  // The modeled networks wrap this rank's engine, shadows innermost, the primary network
  // outermost (the trainer, its collective and its policy read the outermost clock).
  // Evaluation and bookkeeping use the engine directly so they are not charged.
  using sim_t = gravac::simulated_communicator<host_comm>;
  const auto make_profile = [&](const network_config& n) {
    switch (n.type) {
      case network_config::kind::schedule:
        return gravac::network_profile::fast_slow_schedule(n.phase_epochs * static_cast<double>(steps_per_epoch));
      case network_config::kind::trace:
        return gravac::network_profile::from_csv(n.trace_path);
      case network_config::kind::random_walk:
        return gravac::random_walk_profile({}, n.walk_seed);
      default:
        return gravac::network_profile::constant(gravac::network_params::from_gbps(n.latency_s, n.gbps));
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
      typename sim_t::options sim_options;
      sim_options.rule = cfg.network_allreduce;
      sims.push_back(std::make_unique<sim_t>(links.back(), make_profile(chain[i]), sim_options));
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
  if (!cfg.charge_codec) m.gravac.time.include_codec = false;
  if (m.accordion.initial_learning_rate == 0) m.accordion.initial_learning_rate = cfg.lr.at(0);
  if (!m.flexible.profile) m.flexible.profile = profile;
  if (!m.moo.profile) m.moo.profile = profile;
  if (!m.local.policy.profile) m.local.policy.profile = profile;
  if (m.local.policy.time.source == gravac::time_source::simulated && m.local.policy.time.compute_s == 0)
    m.local.policy.time.compute_s = compute_s;
  if (!sim) {
    // Without a modeled network the modeled sources have nothing to read.
    if (m.flexible.source == gravac::network_source::modeled || m.flexible.source == gravac::network_source::profile)
      m.flexible.source = gravac::network_source::measured;
    if (m.moo.source == gravac::network_source::modeled || m.moo.source == gravac::network_source::profile)
      m.moo.source = gravac::network_source::measured;
    if (m.gravac.time.source != gravac::time_source::measured) m.gravac.time.source = gravac::time_source::measured;
    if (m.local.policy.source == gravac::network_source::modeled ||
        m.local.policy.source == gravac::network_source::profile)
      m.local.policy.source = gravac::network_source::measured;
    m.local.policy.time.source = gravac::time_source::measured;
  }
  m.seed = m.seed ? m.seed : cfg.seed;
  gravac::require(m.bucket_bytes > 0,
                  "train: the bucket size must be positive (gravac::bucket_per_layer: one a layer)");
  // Per-step training (st), or local steps around the optimizer (ls): one of the two.
  std::unique_ptr<stepper> st;
  std::unique_ptr<local_stepper> ls;
  const host_comm gravac_comm = sim ? host_comm(*sim) : comm;
  if (cfg.local_steps)
    ls = make_local_stepper(m, gravac_comm, lay, params);
  else
    st = make_stepper(m, gravac_comm, lay);
  // The model evaluated: with local steps the global point, the same on every rank.
  const auto evaluated = [&]() -> std::span<const float> { return ls ? ls->global_params() : params; };

  run_result res;
  res.method = run_method_name(cfg.method, cfg.local_steps);
  res.model = net->name();
  res.network = cfg.network.describe();
  res.ranks = ranks;
  res.params = net->num_params();
  res.steps_per_epoch = steps_per_epoch;
  res.compute_per_step_s = compute_s;
  res.overlap = cfg.overlap;
  res.buckets = st ? st->buckets() : 1;
  res.ready_share = ready_share;

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

  // The test loss and accuracy of the evaluated model into \p e: each rank evaluates its shard
  // of the test subset, summed over the ranks on the engine (not charged).
  const auto evaluate_test = [&](epoch_record& e) {
    const batch_result tr = net->evaluate(evaluated(), xt.data(), yt.data(), yt.size());
    double ev[3] = {tr.loss_sum, static_cast<double>(tr.correct), static_cast<double>(tr.samples)};
    comm.allreduce_sum(std::span<double>(ev, 3));
    e.test_loss = ev[0] / ev[2];
    e.test_acc = ev[1] / ev[2];
  };

  double modeled_clock = 0;
  // The primary network's wire counters at the previous record: each step's record takes
  // the difference, so traffic between steps (none today) would land in the next step.
  double wire_sent_before = 0, wire_received_before = 0;
  std::uint64_t step = 0;
  std::size_t first_epoch = 0, first_step_in_epoch = 0;
  bool resume_mid_epoch = false;
  if (resume_from) {
    run_state& rs = *resume_from;
    const std::string gravac_path = checkpoint_file(ck.dir, rs.step, rank, "gravac");
    std::string failure;
    try {
      gravac::require(rs.sims.size() == sims.size() && rs.shadow_clock.size() == shadows,
                      "'" + gravac_path + "': the checkpoint's simulated networks do not fit this run");
      if (ls)
        ls->load_state(rs.local_steps_state);
      else
        st->restore_checkpoint(gravac_path);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    agree(comm, "restoring the trainer from the checkpoint of step " + std::to_string(rs.step), failure);
    std::copy(rs.params.begin(), rs.params.end(), params.begin());
    std::copy(rs.velocity.begin(), rs.velocity.end(), opt.velocity().begin());
    // The trainer's construction and restore may have charged the networks: the saved
    // totals replace whatever they hold now.
    for (std::size_t i = 0; i < sims.size(); ++i) sims[i]->set_counters(rs.sims[i]);
    modeled_clock = rs.modeled_clock;
    shadow_clock = rs.shadow_clock;
    wire_sent_before = rs.wire_sent_before;
    wire_received_before = rs.wire_received_before;
    res.steps = std::move(rs.steps);
    res.epochs = std::move(rs.epochs);
    step = rs.step;
    first_epoch = static_cast<std::size_t>(rs.epoch);
    first_step_in_epoch = static_cast<std::size_t>(rs.step_in_epoch);
    resume_mid_epoch = rs.epoch_started;
    res.resumed = true;
    res.resumed_from_step = rs.step;
    if (rank == 0)
      std::printf("fashion_mnist: resuming from the checkpoint of step %llu (epoch %zu, %zu of %zu steps done) in %s\n",
                  static_cast<unsigned long long>(rs.step), first_epoch, first_step_in_epoch, steps_per_epoch,
                  ck.dir.c_str());
  }
  const std::uint64_t start_step = step;

  // Writes this rank's checkpoint files and, once every rank has written both, deletes its
  // files of the checkpoints before the last `keep`. A failure on any rank throws on every
  // rank, naming it.
  const auto save = [&](std::size_t epoch, std::size_t step_in_epoch, bool started, double loss_sum, double correct,
                        double seen, double frac_sum, double epoch_wall_s, const epoch_record& partial) {
    std::string failure;
    try {
      run_state rs;
      rs.settings = settings;
      rs.rank = rank;
      rs.ranks = ranks;
      rs.step = step;
      rs.epoch = epoch;
      rs.step_in_epoch = step_in_epoch;
      rs.epoch_started = started;
      std::ostringstream rng;
      rng << data_rng;
      rs.data_rng = rng.str();
      rs.order = order;
      rs.params = params;
      rs.velocity.assign(opt.velocity().begin(), opt.velocity().end());
      rs.compute_s = compute_s;
      rs.ready_share = ready_share;
      rs.modeled_clock = modeled_clock;
      rs.shadow_clock = shadow_clock;
      rs.wire_sent_before = wire_sent_before;
      rs.wire_received_before = wire_received_before;
      for (const auto& sm : sims) rs.sims.push_back(sm->counters());
      rs.loss_sum = loss_sum;
      rs.correct = correct;
      rs.seen = seen;
      rs.frac_sum = frac_sum;
      rs.epoch_wall_s = epoch_wall_s;
      rs.partial = partial;
      rs.steps = res.steps;
      rs.epochs = res.epochs;
      if (ls)
        rs.local_steps_state = ls->save_state();
      else
        st->save_checkpoint(checkpoint_file(ck.dir, step, rank, "gravac"));
      // The run file last: a run file present means its trainer file was complete before it.
      write_file_atomically(checkpoint_file(ck.dir, step, rank, "run"), encode_run_state(rs));
    } catch (const std::exception& e) {
      failure = e.what();
    }
    agree(comm, "writing the checkpoint of step " + std::to_string(step), failure);
    prune_checkpoints(ck.dir, rank, step, ck.keep);
  };
  const auto kill_if_asked = [&] {
    if (cfg.fault.kill_rank == rank && cfg.fault.kill_step == step) {
      std::fprintf(stderr, "fashion_mnist: rank %d: --fault-kill-rank: sending SIGKILL to itself before step %llu\n",
                   rank, static_cast<unsigned long long>(step));
      std::fflush(stderr);
      ::raise(SIGKILL);
    }
  };

  if (!cfg.start_marker.empty()) {
    // Every rank is here (the allreduce), so the first step starts now on every rank.
    double here = 0;
    comm.allreduce_max(std::span<double>(&here, 1));
    if (rank == 0) {
      std::ofstream mark(cfg.start_marker);
      gravac::require(static_cast<bool>(mark), "train: cannot create the start marker '" + cfg.start_marker + "'");
    }
  }
  // One step's own figures, kept from its computation to its record (close_step), and the
  // simulated networks as its exchange found them (open_step).
  struct step_figures {
    std::uint64_t step = 0;
    std::size_t in_epoch = 0;
    batch_result br;
    double compute_cpu_s = 0, codec_cpu_s = 0, wall_s = 0, exchange_wall_s = 0;
    bool opened = false;            // open_step has run
    bool exchanged_behind = false;  // its exchange ran on the communication thread (--local-overlap)
    double clock0 = 0;
    std::vector<double> shadow_before;
    gravac::network_params now{};
  };
  const auto open_step = [&](step_figures& f) {
    f.clock0 = sim ? sim->modeled_seconds() : 0.0;
    f.shadow_before.resize(shadows);
    for (std::size_t k = 0; k < shadows; ++k) f.shadow_before[k] = sims[k]->modeled_seconds();
    for (auto& sm : sims) sm->set_step(f.step);
    f.now = sim ? sim->current() : gravac::network_params{};
    f.opened = true;
  };
  // --local-overlap: the records' collectives and the simulated networks wait while an exchange
  // runs on the communication thread (gravac::local_steps: the caller may not use the
  // communicator beside it); a step's record is written once the exchange has completed, at the
  // round's end (where after_inner_step completes it anyway), an epoch's end or a checkpoint.
  const bool local_overlap = ls && m.local.overlap;

  bool stop = false, last_epoch_line = false;
  for (std::size_t epoch = first_epoch; epoch < cfg.epochs && !stop; ++epoch) {
    const bool resumed_here = resume_mid_epoch && epoch == first_epoch;
    auto wall0 = std::chrono::steady_clock::now();
    const double lr = cfg.lr.at(epoch);
    if (!resumed_here) std::shuffle(order.begin(), order.end(), data_rng);  // same permutation on every rank
    epoch_record er;
    er.epoch = epoch;
    er.lr = lr;
    double loss_sum = 0, correct = 0, seen = 0, frac_sum = 0;
    std::size_t done = 0;
    if (resumed_here) {
      const run_state& rs = *resume_from;
      er = rs.partial;
      loss_sum = rs.loss_sum;
      correct = rs.correct;
      seen = rs.seen;
      frac_sum = rs.frac_sum;
      done = first_step_in_epoch;
      wall0 -= std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(rs.epoch_wall_s));
    }
    // The step's record from its figures and \p rep_p, the report of its exchange (nullptr:
    // none): the ranks' figures reduced, the modeled clocks advanced.
    const auto close_step = [&](const step_figures& f, const gravac::step_report* rep_p) {
      static const gravac::step_report no_exchange{};
      const auto& rep = rep_p ? *rep_p : no_exchange;
      const double comm_s = sim ? sim->modeled_seconds() - f.clock0 : 0.0;
      // What backward hid of the buckets' modeled communication (0 for the synchronous
      // step): the rest, and any communication outside the buckets, is exposed.
      const double hidden =
          cfg.overlap ? std::clamp(rep.modeled_communicate_s - rep.modeled_exposed_s, 0.0, comm_s) : 0.0;

      // Rank-averaged loss and bytes, slowest-rank times (on the engine: not charged). The
      // wire bytes differ between ranks (a broadcast's root receives nothing), hence the mean.
      const double wire_sent = sim ? sim->wire_bytes_sent() : 0.0;
      const double wire_received = sim ? sim->wire_bytes_received() : 0.0;
      double sums[6] = {f.br.loss_sum,
                        static_cast<double>(f.br.correct),
                        static_cast<double>(f.br.samples),
                        static_cast<double>(rep.bytes_sent),
                        wire_sent - wire_sent_before,
                        wire_received - wire_received_before};
      wire_sent_before = wire_sent;
      wire_received_before = wire_received;
      // With overlap the codec runs on the communication thread: its measured wall times.
      const double codec =
          cfg.codec_cpu_time && !cfg.overlap && !f.exchanged_behind ? f.codec_cpu_s : rep.compress_s + rep.decompress_s;
      double maxes[4] = {f.compute_cpu_s, codec, f.wall_s, f.exchange_wall_s};
      comm.allreduce_sum(std::span<double>(sums, 6));
      comm.allreduce_max(std::span<double>(maxes, 4));

      step_record r;
      r.step = f.step;
      r.epoch = epoch;
      r.lr = lr;
      r.loss = sums[0] / sums[2];
      r.train_acc = sums[1] / sums[2];
      r.kept_fraction = ls ? (rep_p ? chosen_fraction(rep.kept_fraction, lay) : 0.0)
                           : chosen_fraction(st->last_params().kept_fraction, lay);
      r.bytes_sent = sums[3] / ranks;
      r.wire_bytes_sent = sums[4] / ranks;
      r.wire_bytes_received = sums[5] / ranks;
      r.dense_bytes = static_cast<double>(rep.dense_bytes);
      r.collective = std::string(gravac::to_string(rep.collective));
      r.gain = rep.gain;
      r.compute_s = maxes[0];
      r.codec_s = maxes[1];
      r.wall_s = maxes[2];
      r.exchange_wall_s = maxes[3];
      r.modeled_comm_s = comm_s;
      r.modeled_exposed_s = comm_s - hidden;
      const double charged_codec = cfg.charge_codec ? r.codec_s : 0.0;
      // The step's modeled time is compute + codec + the exposed communication; the
      // networks' clocks already hold all of the communication, so they advance by the
      // rest of the step less what backward hid (no shadows with overlap: hidden is 0 there).
      modeled_clock += compute_s + charged_codec + r.modeled_exposed_s;
      for (std::size_t k = 0; k < shadows; ++k)
        shadow_clock[k] += compute_s + charged_codec + (sims[k]->modeled_seconds() - f.shadow_before[k]);
      for (auto& sm : sims) sm->add_compute_seconds(compute_s + charged_codec - hidden);
      r.modeled_time_s = modeled_clock;
      if (sim) {
        r.bandwidth_gbps = 8.0 / f.now.beta / 1e9;
        r.latency_ms = f.now.alpha * 1e3;
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
      er.exchange_wall_s += r.exchange_wall_s;
      er.modeled_comm_s += comm_s;
      er.modeled_exposed_s += r.modeled_exposed_s;
      res.steps.push_back(std::move(r));
      if (rank == 0 && obs.on_step) obs.on_step(res.steps.back(), f.in_epoch, steps_per_epoch);
    };
    // --local-overlap: the steps whose records wait for the exchange in flight, in order;
    // catch_up completes it and writes them (the first may be the step that started it).
    std::vector<step_figures> waiting;
    const auto catch_up = [&] {
      if (!local_overlap) return;
      ls->complete_exchange();
      for (auto& f : waiting) {
        if (!f.opened) open_step(f);
        close_step(f, f.exchanged_behind ? &ls->last_report() : nullptr);
      }
      waiting.clear();
    };
    for (std::size_t s = resumed_here ? first_step_in_epoch : 0; s < steps_per_epoch; ++s) {
      // At the boundary before step `step`: the test hook's death (before this boundary's
      // checkpoint is written), the checkpoint, then the end a --max-steps run stops at.
      kill_if_asked();
      if (checkpointing && ck.every_unit == checkpoint_config::unit::steps && step != start_step &&
          step % ck.every == 0) {
        catch_up();
        save(epoch, s, true, loss_sum, correct, seen, frac_sum,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count(), er);
      }
      if (cfg.max_steps && step >= cfg.max_steps) {
        stop = true;
        break;
      }
      const std::uint32_t* shard = order.data() + s * cfg.batch + static_cast<std::size_t>(rank) * local;
      gather_samples(train_set, shard, local, xb, yb);
      step_figures f;
      f.step = step;
      f.in_epoch = s;
      double c0 = 0, c1 = 0;
      const gravac::step_report* rep_p = nullptr;
      const auto w0 = std::chrono::steady_clock::now();
      auto x0 = w0;
      if (cfg.overlap) {
        // Buckets start on the trainer's communication thread as backward announces their
        // layers; each layer is ready at compute_s times its share on the modeled timeline.
        open_step(f);
        c0 = thread_cpu_seconds();
        st->begin_step(grads);
        f.br = net->forward_backward(params, xb.data(), yb.data(), local, grads,
                                     [&](std::size_t layer) { st->ready(layer, compute_s * ready_share[layer]); });
        c1 = thread_cpu_seconds();
        x0 = std::chrono::steady_clock::now();
        rep_p = &st->finish();
      } else {
        c0 = thread_cpu_seconds();
        f.br = net->forward_backward(params, xb.data(), yb.data(), local, grads);
        c1 = thread_cpu_seconds();
        if (!(local_overlap && ls->exchange_in_flight())) open_step(f);
        x0 = std::chrono::steady_clock::now();
        rep_p = ls ? ls->before_inner_step(grads) : &st->step(grads);
      }
      auto x1 = std::chrono::steady_clock::now();
      const double c2 = thread_cpu_seconds();
      opt.step(params, grads, lr);
      const double c3 = thread_cpu_seconds();
      // Local steps: a round's end exchanges and moves params to the new global point.
      double after_cpu_s = 0;
      std::chrono::steady_clock::duration records_time{};  // other steps' records written in this one
      if (ls) {
        double a0 = c3;
        if (local_overlap && ls->exchange_in_flight() && ls->period() > 1 && ls->round_step() + 1 == ls->period()) {
          // The round ends here: complete the exchange in flight as after_inner_step would
          // (this step waited for it), and write the records that waited for it before the
          // next exchange starts.
          const auto z0 = std::chrono::steady_clock::now();
          ls->complete_exchange();
          const auto z1 = std::chrono::steady_clock::now();
          x1 += z1 - z0;
          catch_up();
          if (!f.opened) open_step(f);
          records_time = std::chrono::steady_clock::now() - z1;
          a0 = thread_cpu_seconds();
        }
        const bool was_in_flight = ls->exchange_in_flight();
        const auto y0 = std::chrono::steady_clock::now();
        const gravac::step_report* exchanged = ls->after_inner_step(params);
        // Per-step rounds follow local ones: every rank now applies its SGD to the same
        // averaged gradient, so the momentum, each rank's own so far, becomes the ranks'
        // average (one allreduce; averaging keeps the direction the rounds built, which a
        // reset would throw away).
        if (ls->inner_state_must_agree()) ls->average_inner_state(opt.velocity());
        after_cpu_s = thread_cpu_seconds() - a0;
        x1 += std::chrono::steady_clock::now() - y0;
        if (local_overlap && ls->exchange_in_flight())
          f.exchanged_behind = !was_in_flight;  // it started one: the report is read once it completes
        else if (exchanged)
          rep_p = exchanged;
      }
      const auto w1 = std::chrono::steady_clock::now();
      f.compute_cpu_s = (c1 - c0) + (c3 - c2);
      f.codec_cpu_s = (c2 - c1) + after_cpu_s;
      f.wall_s = std::chrono::duration<double>(w1 - w0 - records_time).count();
      f.exchange_wall_s = std::chrono::duration<double>(x1 - x0).count();
      ++step;
      ++done;
      if (local_overlap && ls->exchange_in_flight()) {
        waiting.push_back(std::move(f));
      } else {
        if (!f.opened) open_step(f);
        close_step(f, rep_p);
      }
    }
    catch_up();
    if (done == 0) break;
    er.train_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    evaluate_test(er);
    er.train_loss = loss_sum / seen;
    er.train_acc = correct / seen;
    er.kept_fraction = frac_sum / static_cast<double>(done);
    er.modeled_time_s = modeled_clock;
    er.shadow_time_s = shadow_clock;
    const gravac::interval_info interval{step, epoch + 1, cfg.lr.at(epoch + 1), static_cast<double>(done * cfg.batch)};
    if (ls)
      ls->end_interval(interval);
    else
      st->end_interval(interval);
    er.policy_state = ls ? ls->policy_state() : st->policy_state();
    er.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    res.epochs.push_back(er);
    // With local steps the line of the run's last epoch waits for the end of training below,
    // which changes its figures.
    if (ls && (stop || epoch + 1 == cfg.epochs || (cfg.max_steps && step >= cfg.max_steps)))
      last_epoch_line = rank == 0 && obs.on_epoch;
    else if (rank == 0 && obs.on_epoch)
      obs.on_epoch(res.epochs.back(), res);
    // Epoch-end checkpoints hold the next epoch's start: its permutation is not drawn yet.
    // An epoch cut short by --max-steps has not ended.
    if (checkpointing && ck.every_unit == checkpoint_config::unit::epochs && (epoch + 1) % ck.every == 0 && !stop)
      save(epoch + 1, 0, false, 0, 0, 0, 0, 0, epoch_record{});
  }
  // The end of training with local steps: the round in progress ends now (finish_round;
  // with overlap, the average of the exchange that ran behind, completed and recorded at the
  // last epoch's end, is applied first), so its steps are in the final model and every rank
  // holds it. It comes after the last checkpoint, which keeps the round open: a run resumed
  // from it goes on as the uninterrupted run did and ends the same way.
  if (ls) {
    for (auto& sm : sims) sm->set_step(step > 0 ? step - 1 : 0);  // the last step's network
    const double clock0 = sim ? sim->modeled_seconds() : 0.0;
    for (std::size_t k = 0; k < shadows; ++k) shadow_before[k] = sims[k]->modeled_seconds();
    const auto x0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    const bool exchanges = ls->round_step() > 0;  // a round of no steps sends nothing
    const gravac::step_report* rep = ls->finish_round(params);
    const double cpu_s = thread_cpu_seconds() - c0;
    if (rep && !exchanges) {
      // Overlap, the run ending at a round's end: only the average received was applied.
      if (!res.epochs.empty()) evaluate_test(res.epochs.back());
    } else if (rep && !res.steps.empty() && !res.epochs.empty()) {
      // Charged to the last step and its epoch as a round's exchange is to the step that ends
      // it; the epoch's test figures become the final model's.
      const double comm_s = sim ? sim->modeled_seconds() - clock0 : 0.0;
      double sums[3] = {static_cast<double>(rep->bytes_sent), sim ? sim->wire_bytes_sent() - wire_sent_before : 0.0,
                        sim ? sim->wire_bytes_received() - wire_received_before : 0.0};
      double maxes[2] = {cfg.codec_cpu_time ? cpu_s : rep->compress_s + rep->decompress_s,
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - x0).count()};
      comm.allreduce_sum(std::span<double>(sums, 3));
      comm.allreduce_max(std::span<double>(maxes, 2));
      const double charged_codec = cfg.charge_codec ? maxes[0] : 0.0;
      modeled_clock += charged_codec + comm_s;
      for (std::size_t k = 0; k < shadows; ++k)
        shadow_clock[k] += charged_codec + (sims[k]->modeled_seconds() - shadow_before[k]);
      step_record& r = res.steps.back();
      epoch_record& e = res.epochs.back();
      if (r.bytes_sent == 0) {
        // The step had no exchange of its own: this one is its exchange.
        const double kept = chosen_fraction(rep->kept_fraction, lay);
        const auto in_epoch =
            std::count_if(res.steps.begin(), res.steps.end(), [&](const step_record& x) { return x.epoch == r.epoch; });
        e.kept_fraction += (kept - r.kept_fraction) / static_cast<double>(in_epoch);
        r.kept_fraction = kept;
        r.dense_bytes = static_cast<double>(rep->dense_bytes);
        e.dense_bytes_per_rank += r.dense_bytes;
        r.collective = std::string(gravac::to_string(rep->collective));
        r.gain = rep->gain;
      }
      r.bytes_sent += sums[0] / ranks;
      r.wire_bytes_sent += sums[1] / ranks;
      r.wire_bytes_received += sums[2] / ranks;
      r.codec_s += maxes[0];
      r.wall_s += maxes[1];
      r.exchange_wall_s += maxes[1];
      r.modeled_comm_s += comm_s;
      r.modeled_exposed_s += comm_s;
      r.modeled_time_s = modeled_clock;
      e.bytes_per_rank += sums[0] / ranks;
      e.wire_bytes_sent_per_rank += sums[1] / ranks;
      e.wire_bytes_received_per_rank += sums[2] / ranks;
      e.codec_s += maxes[0];
      e.exchange_wall_s += maxes[1];
      e.train_wall_s += maxes[1];
      e.wall_s += maxes[1];
      e.modeled_comm_s += comm_s;
      e.modeled_exposed_s += comm_s;
      e.modeled_time_s = modeled_clock;
      e.shadow_time_s = shadow_clock;
      evaluate_test(e);
    }
  }
  if (last_epoch_line) obs.on_epoch(res.epochs.back(), res);
  res.final_params.assign(evaluated().begin(), evaluated().end());
  return res;
}

}  // namespace fmnist
