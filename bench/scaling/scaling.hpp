#pragma once
// The scaling study's methods and measurement, shared by the thread-rank program (any N,
// the modeled network) and the MPI program (the same methods on real MPI ranks, to check
// the reported bytes and the model's time against a real engine).
//
// A method is a compressor x collective composition. Each runs `steps` steps of a
// Gaussian gradient through a simulated_communicator over the engine; what is recorded per
// rank is the last step's: the wire bytes its report gives (and the simulated network's
// count, which must be equal), the cost terms its calls were charged (so one run prices
// the same calls on every network), and the measured time in the collective.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gravac/gravac.hpp"

namespace scaling {

//! The Fashion-MNIST MLP (784-256-128-10): 235,146 parameters.
inline gravac::layout mlp_layout() {
  gravac::layout lay;
  lay.add("fc1.weight", {256, 784}, gravac::layer_kind::dense);
  lay.add("fc1.bias", {256}, gravac::layer_kind::bias_or_norm);
  lay.add("fc2.weight", {128, 256}, gravac::layer_kind::dense);
  lay.add("fc2.bias", {128}, gravac::layer_kind::bias_or_norm);
  lay.add("fc3.weight", {10, 128}, gravac::layer_kind::dense);
  lay.add("fc3.bias", {10}, gravac::layer_kind::bias_or_norm);
  return lay;
}

//! A synthetic 25M-parameter layout: 24 blocks of a 1024x1024 matrix and its bias.
inline gravac::layout synthetic_25m_layout() {
  gravac::layout lay;
  for (int b = 0; b < 24; ++b) {
    lay.add("block" + std::to_string(b) + ".weight", {1024, 1024}, gravac::layer_kind::dense);
    lay.add("block" + std::to_string(b) + ".bias", {1024}, gravac::layer_kind::bias_or_norm);
  }
  lay.add("head.weight", {1000, 1000}, gravac::layer_kind::dense);
  return lay;
}

//! The last step of one method on one rank.
struct sample {
  double wire_sent = 0, wire_received = 0;        // step_report
  double counted_sent = 0, counted_received = 0;  // the simulated network's count
  gravac::cost_terms terms{};                     // what the step's calls were charged
  double communicate_s = 0;                       // measured seconds in the collective
  std::vector<double> step_communicate_s;         // the same, every step
  std::size_t packet_bytes = 0;                   // step_report::bytes_sent
  gravac::collective_kind collective = gravac::collective_kind::automatic;
};

//! The methods: a name, and the kept fraction its policy uses (1: dense).
struct method {
  std::string name;
  double kept_fraction;
};

inline const std::vector<method>& methods() {
  static const std::vector<method> m = {
      {"dense_allreduce", 1.0},    {"topk1%_allgather", 0.01}, {"topk1%_ar_topk", 0.01},
      {"qsgd8_allgather", 0.01},   {"qsgd8_compressed", 0.01}, {"efsign_allgather", 0.01},
      {"efsign_compressed", 0.01}, {"cast16_allgather", 0.01}, {"cast16_compressed", 0.01},
  };
  return m;
}

//! Runs trainer<C, K, fixed_policy> at kept fraction \p f for \p steps steps on \p sim (a
//! simulated_communicator) and returns the last step's sample.
template <class C, class K, class Sim>
sample run_one(Sim& sim, const gravac::layout& lay, double f, int steps, const typename K::options& kopt = {}) {
  using T = gravac::trainer<C, K, gravac::fixed_policy>;
  typename T::options opt;
  opt.policy.kept_fraction = f;
  opt.policy.one_dim_dense = false;
  opt.collective = kopt;
  T t(sim, lay, opt);
  std::mt19937 rng(static_cast<unsigned>(sim.rank()) + 1);
  std::normal_distribution<float> normal;
  std::vector<float> g(lay.numel());
  sample s;
  for (int step = 0; step < steps; ++step) {
    for (auto& x : g) x = normal(rng);
    const double out0 = sim.wire_bytes_sent(), in0 = sim.wire_bytes_received();
    const gravac::cost_terms terms0 = sim.charged_terms();
    const auto& r = t.step(g);
    s.wire_sent = r.wire_bytes_sent;
    s.wire_received = r.wire_bytes_received;
    s.counted_sent = sim.wire_bytes_sent() - out0;
    s.counted_received = sim.wire_bytes_received() - in0;
    s.terms = {sim.charged_terms().latency - terms0.latency, sim.charged_terms().bytes - terms0.bytes};
    s.communicate_s = r.communicate_s;
    s.step_communicate_s.push_back(r.communicate_s);
    s.packet_bytes = r.bytes_sent;
    s.collective = r.collective;
  }
  return s;
}

//! Method \p name on \p sim.
template <class Sim>
sample run_method(const std::string& name, Sim& sim, const gravac::layout& lay, double f, int steps) {
  using namespace gravac;
  if (name == "dense_allreduce") return run_one<identity, dense_allreduce>(sim, lay, f, steps);
  if (name == "topk1%_allgather") return run_one<topk, allgather>(sim, lay, f, steps);
  if (name == "topk1%_ar_topk") return run_one<topk, allreduce_compatible>(sim, lay, f, steps);
  if (name == "qsgd8_allgather") return run_one<qsgd, allgather>(sim, lay, f, steps);
  if (name == "qsgd8_compressed") return run_one<qsgd, compressed_allreduce>(sim, lay, f, steps);
  if (name == "efsign_allgather") return run_one<sign, allgather>(sim, lay, f, steps);
  if (name == "efsign_compressed") return run_one<sign, compressed_allreduce>(sim, lay, f, steps);
  if (name == "cast16_allgather") return run_one<cast16, allgather>(sim, lay, f, steps);
  if (name == "cast16_compressed") return run_one<cast16, compressed_allreduce>(sim, lay, f, steps);
  throw error(status::invalid_argument, "scaling: unknown method '" + name + "'");
}

//! The flexible collective with \p compressor ("topk" or "qsgd") on the fixed network \p net,
//! priced by the wire alone (charge_codec off: N threads on a few cores make codec times
//! meaningless), so its pick can be compared with the study's modeled times.
template <class Sim>
sample run_flexible(const std::string& compressor, Sim& sim, const gravac::layout& lay, double f, int steps,
                    const gravac::network_params& net) {
  using namespace gravac;
  flexible_options o;
  o.source = network_source::fixed;
  o.network = net;
  o.charge_codec = false;
  if (compressor == "topk") return run_one<topk, flexible>(sim, lay, f, steps, o);
  if (compressor == "qsgd") return run_one<qsgd, flexible>(sim, lay, f, steps, o);
  throw error(status::invalid_argument, "scaling: unknown compressor '" + compressor + "' for flexible");
}

//! Bytes one rank holds after an Allgather of \p packet_bytes from each of \p n ranks, times
//! n ranks: what the thread-rank Allgather needs in memory at once.
inline double allgather_memory_bytes(int n, double packet_bytes) {
  return static_cast<double>(n) * static_cast<double>(n) * packet_bytes;
}

//! Peak resident set of this process in bytes (VmHWM), 0 where /proc is not there.
inline double peak_resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      double kib = 0;
      in >> kib;
      return kib * 1024.0;
    }
    std::getline(in, key);
  }
  return 0;
}

}  // namespace scaling
