// The scaling study on thread ranks: every method of scaling.hpp on N ranks (real data,
// real collectives of the thread engine) through the simulated network, and the flexible
// collective's pick on each network. Prints one CSV row per (N, method, network):
//   layout,ranks,method,gbps,latency_us,modeled_comm_s,wire_sent,wire_received,packet_bytes,collective,how
// `how` is "run" (measured on N thread ranks), or "model" for an Allgather too large to
// hold in memory on N thread ranks at once (N x N packets): its time and bytes then come
// from the cost model and the packet size the same method had at the largest N that ran
// (the packet of a quantizer or of top-k at a fixed k does not depend on N).
// Exits non-zero when a step's reported wire bytes differ from the simulated network's count.
//   scaling_threads [--layout mlp|25m] [--ranks 4,16,64] [--gbps 1,10,100] [--latency-us 50]
//                   [--steps 2] [--memory-gib 8] [--methods a,b,...]
//                   [--allreduce ring|open-mpi-4.1|nccl]
// --allreduce charges every Allreduce as that engine would run it (simulated_network_options::
// rule; default ring, the study's setting); NCCL's choice depends on the network, so with nccl
// one --gbps only.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <sstream>

#include "scaling.hpp"

using namespace gravac;

namespace {

std::vector<double> parse_list(const std::string& s) {
  std::vector<double> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::stod(item));
  return v;
}

// The largest value over ranks (the modeled time is the same everywhere; bytes differ where
// a rank roots a broadcast or holds a longer shard).
scaling::sample busiest(const std::vector<scaling::sample>& per_rank) {
  scaling::sample s = per_rank.front();
  for (const auto& r : per_rank) {
    s.wire_sent = std::max(s.wire_sent, r.wire_sent);
    s.wire_received = std::max(s.wire_received, r.wire_received);
    s.packet_bytes = std::max(s.packet_bytes, r.packet_bytes);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gravac scaling study on thread ranks"};
  std::string layout_name = "mlp", ranks_s = "4,16,64", gbps_s = "1,10,100";
  double latency_us = 50, memory_gib = 8;
  int steps = 2;
  std::string only;
  app.add_option("--layout", layout_name, "mlp (235,146 parameters) or 25m (a synthetic 26M-parameter layout)")
      ->check(CLI::IsMember({"mlp", "25m"}));
  app.add_option("--ranks", ranks_s, "comma-separated rank counts");
  app.add_option("--gbps", gbps_s, "comma-separated bandwidths, Gbit/s");
  app.add_option("--latency-us", latency_us, "network latency alpha, microseconds")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", steps, "steps per run (the last is reported)")->check(CLI::Range(1, 100));
  app.add_option("--memory-gib", memory_gib, "largest N x N packet bytes an Allgather may hold at once")
      ->check(CLI::PositiveNumber);
  app.add_option("--methods", only, "comma-separated methods to run (default: all, and flexible)");
  std::string allreduce_s = "ring";
  app.add_option("--allreduce", allreduce_s, "how each Allreduce is charged: ring, or as an engine chooses")
      ->check(CLI::IsMember({"ring", "open-mpi-4.1", "nccl"}));
  CLI11_PARSE(app, argc, argv);
  simulated_network_options sim_opt;
  if (allreduce_s == "open-mpi-4.1") sim_opt.rule = allreduce_rule::open_mpi_4_1;
  if (allreduce_s == "nccl") sim_opt.rule = allreduce_rule::nccl;
  const auto wanted = [&](const std::string& name) {
    return only.empty() || ("," + only + ",").find("," + name + ",") != std::string::npos;
  };
  const layout lay = layout_name == "mlp" ? scaling::mlp_layout() : scaling::synthetic_25m_layout();
  const auto ranks = parse_list(ranks_s);
  const auto gbps = parse_list(gbps_s);
  std::vector<network_params> nets;
  for (double b : gbps) nets.push_back(network_params::from_gbps(latency_us * 1e-6, b));
  if (sim_opt.rule == allreduce_rule::nccl && nets.size() != 1) {
    std::fprintf(stderr, "scaling: --allreduce nccl chooses by the network: give one --gbps\n");
    return 2;
  }

  std::printf(
      "layout,ranks,method,gbps,latency_us,modeled_comm_s,wire_sent,wire_received,packet_bytes,collective,how\n");
  bool mismatch = false;
  std::map<std::string, double> last_packet;  // per method: packet bytes at the largest N run
  // Whether an Allgather of method \p name's packets on n thread ranks exceeds the memory budget.
  const auto too_large_to_gather = [&](const std::string& name, int n) {
    const auto it = last_packet.find(name);
    return it != last_packet.end() && scaling::allgather_memory_bytes(n, it->second) > memory_gib * (1ull << 30);
  };
  for (double nd : ranks) {
    const int n = static_cast<int>(nd);
    for (const auto& m : scaling::methods()) {
      if (!wanted(m.name)) continue;
      const bool gathers = m.name.find("allgather") != std::string::npos;
      scaling::sample s;
      std::string how = "run";
      if (gathers && too_large_to_gather(m.name, n)) {
        // Too large to gather on n thread ranks at once: priced from its packet instead.
        const double p = last_packet[m.name];
        s.packet_bytes = static_cast<std::size_t>(p);
        s.terms = cost_model::allgather(n, n * p);
        const auto w = wire_bytes::allgather(n, n * p, p);
        s.wire_sent = w.sent;
        s.wire_received = w.received;
        s.collective = collective_kind::allgather;
        how = "model";
      } else {
        std::vector<scaling::sample> per_rank(static_cast<std::size_t>(n));
        run_ranks(n, [&](thread_communicator& comm) {
          simulated_communicator<thread_communicator> sim(comm, network_profile::constant(nets.front()), sim_opt);
          per_rank[static_cast<std::size_t>(comm.rank())] =
              scaling::run_method(m.name, sim, lay, m.kept_fraction, steps);
        });
        for (const auto& r : per_rank)
          if (r.wire_sent != r.counted_sent || r.wire_received != r.counted_received) mismatch = true;
        s = busiest(per_rank);
        last_packet[m.name] = static_cast<double>(s.packet_bytes);
      }
      for (std::size_t k = 0; k < nets.size(); ++k)
        std::printf("%s,%d,%s,%g,%g,%.9g,%.0f,%.0f,%zu,%s,%s\n", layout_name.c_str(), n, m.name.c_str(), gbps[k],
                    latency_us, s.terms.seconds(nets[k]), s.wire_sent, s.wire_received, s.packet_bytes,
                    std::string(to_string(s.collective)).c_str(), how.c_str());
      std::fflush(stdout);
    }
    // The flexible collective's pick, on each network (its choice depends on it).
    for (const char* c : {"topk", "qsgd"}) {
      if (!wanted("flexible(" + std::string(c) + ")")) continue;
      for (std::size_t k = 0; k < nets.size(); ++k) {
        // It might pick the Allgather, which does not fit.
        if (too_large_to_gather(std::string(c) == "topk" ? "topk1%_allgather" : "qsgd8_allgather", n)) continue;
        std::vector<scaling::sample> per_rank(static_cast<std::size_t>(n));
        run_ranks(n, [&](thread_communicator& comm) {
          simulated_communicator<thread_communicator> sim(comm, network_profile::constant(nets[k]), sim_opt);
          per_rank[static_cast<std::size_t>(comm.rank())] = scaling::run_flexible(c, sim, lay, 0.01, steps, nets[k]);
        });
        const scaling::sample s = busiest(per_rank);
        std::printf("%s,%d,flexible(%s),%g,%g,%.9g,%.0f,%.0f,%zu,%s,run\n", layout_name.c_str(), n, c, gbps[k],
                    latency_us, s.terms.seconds(nets[k]), s.wire_sent, s.wire_received, s.packet_bytes,
                    std::string(to_string(s.collective)).c_str());
        std::fflush(stdout);
      }
    }
    std::fprintf(stderr, "scaling: N = %d done, peak resident %.2f GiB\n", n,
                 scaling::peak_resident_bytes() / (1ull << 30));
  }
  if (mismatch) {
    std::fprintf(stderr, "scaling: a step's reported wire bytes differ from the simulated network's count\n");
    return 1;
  }
}
