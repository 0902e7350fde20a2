// The scaling study's priced table: real model sizes whose gradients do not fit N thread ranks
// in memory, priced by the cost model (not run) as DDP sends them, in 25 MiB buckets, each
// bucket one collective call, the calls one after the other (communication only, nothing
// overlapped with backward). Every Allreduce is priced three ways: always a ring (what the
// simulated network charges by default), as Open MPI 4.1 chooses, and as NCCL chooses
// (cost_model::choose_allreduce). Prints Markdown tables: one per bandwidth, rows model x
// method x rule, columns N; a cell is the modeled seconds per step and, for a rule, the
// algorithm of the full buckets' Allreduce. Runs in well under a second.
//   scaling_priced [--latency-us 50]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gravac/network/cost_model.hpp"

using namespace gravac;

namespace {

struct model {
  const char* name;
  double parameters;
};

// Parameter counts: the MLP of the study (784-256-128-10); ResNet-50 25.6M; BERT-large 340M;
// a 7B model.
const std::vector<model> models = {
    {"MLP (235,146)", 235146}, {"ResNet-50 (25.6M)", 25.6e6}, {"BERT-large (340M)", 340e6}, {"7B", 7e9}};
const std::vector<int> ranks = {8, 64, 256, 1024};
const std::vector<double> gbps = {1, 10, 100};
constexpr double bucket_bytes = 25.0 * 1024 * 1024;  // DDP's bucket_cap_mb = 25
constexpr double kept = 0.01;                        // top-k 1%

struct rule {
  const char* name;
  allreduce_rule r;
};
const std::vector<rule> rules = {
    {"ring", allreduce_rule::fixed}, {"Open MPI 4.1", allreduce_rule::open_mpi_4_1}, {"NCCL", allreduce_rule::nccl}};

const char* short_name(allreduce_algorithm a) {
  switch (a) {
    case allreduce_algorithm::ring:
      return "ring";
    case allreduce_algorithm::tree:
      return "tree";
    case allreduce_algorithm::recursive_doubling:
      return "RD";
    case allreduce_algorithm::rabenseifner:
      return "Rab";
    case allreduce_algorithm::pipelined_tree:
      return "NCCL tree";
    case allreduce_algorithm::linear:
      return "linear";
  }
  return "?";
}

// The buckets of a gradient of d fp32 parameters: full 25 MiB ones, then the rest.
struct buckets {
  double full = 0;        // number of full buckets
  double rest_bytes = 0;  // bytes of the last, partial bucket (0: none)
};
buckets bucketed(double d) {
  const double total = 4.0 * d;
  buckets b;
  b.full = static_cast<double>(static_cast<long long>(total / bucket_bytes));
  b.rest_bytes = total - b.full * bucket_bytes;
  return b;
}

enum class method { dense, allgather, ar_topk };

// One step's modeled seconds of method m over n ranks under rule r, and the algorithm of the
// largest bucket's Allreduce.
std::pair<double, allreduce_algorithm> price(const model& mo, method m, int n, const network_params& net,
                                             allreduce_rule r) {
  const buckets b = bucketed(mo.parameters);
  allreduce_algorithm largest = allreduce_algorithm::ring;
  auto one = [&](double bytes, bool record) {
    const double d = bytes / 4.0;
    cost_terms t;
    allreduce_algorithm a = allreduce_algorithm::ring;
    switch (m) {
      case method::dense:
        a = cost_model::choose_allreduce(r, allreduce_algorithm::ring, n, bytes, net);
        t = cost_model::allreduce(n, bytes, a);
        break;
      case method::allgather:
        t = cost_model::allgather_topk(n, d, kept);
        break;
      case method::ar_topk:
        a = cost_model::choose_allreduce(r, allreduce_algorithm::ring, n, 4.0 * d * kept, net);
        t = cost_model::index_broadcast(n, d, kept) + cost_model::allreduce(n, 4.0 * d * kept, a);
        break;
    }
    if (record) largest = a;
    return t.seconds(net);
  };
  double s = 0;
  if (b.full > 0) s += b.full * one(bucket_bytes, true);
  if (b.rest_bytes > 0) s += one(b.rest_bytes, b.full == 0);
  return {s, largest};
}

std::string seconds_text(double s) {
  char buf[64];
  if (s < 1)
    std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
  else if (s < 1000)
    std::snprintf(buf, sizeof buf, "%.3g s", s);
  else
    std::snprintf(buf, sizeof buf, "%.0f s", s);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  double latency_us = 50;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--latency-us") == 0 && i + 1 < argc) {
      latency_us = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "scaling_priced: unknown argument %s (--latency-us US)\n", argv[i]);
      return 2;
    }
  }
  const char* method_names[] = {"dense Allreduce", "top-k 1% Allgather", "top-k 1% AR-Topk"};
  for (double g : gbps) {
    const network_params net = network_params::from_gbps(latency_us * 1e-6, g);
    std::printf("### Priced, %g Gbit/s, %g us: modeled communication per step (25 MiB buckets)\n\n", g, latency_us);
    std::printf("| model | method | Allreduce | N = 8 | N = 64 | N = 256 | N = 1024 |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    for (const model& mo : models)
      for (method m : {method::dense, method::allgather, method::ar_topk})
        for (const rule& r : rules) {
          // The Allgather has no Allreduce: one row, whatever the rule.
          if (m == method::allgather && r.r != allreduce_rule::fixed) continue;
          std::printf("| %s | %s | %s |", mo.name, method_names[static_cast<int>(m)],
                      m == method::allgather ? "(none)" : r.name);
          for (int n : ranks) {
            const auto [s, a] = price(mo, m, n, net, r.r);
            if (m == method::allgather || r.r == allreduce_rule::fixed)
              std::printf(" %s |", seconds_text(s).c_str());
            else
              std::printf(" %s (%s) |", seconds_text(s).c_str(), short_name(a));
          }
          std::printf("\n");
        }
    std::printf("\n");
  }
  std::printf("Buckets per step: ");
  for (const model& mo : models) {
    const buckets b = bucketed(mo.parameters);
    std::printf("%s%s %.0f%s", &mo == &models.front() ? "" : "; ", mo.name, b.full + (b.rest_bytes > 0 ? 1 : 0),
                b.full > 0 ? "" : " (smaller than one)");
  }
  std::printf(".\n");
  return 0;
}
