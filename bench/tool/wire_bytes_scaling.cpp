// Wire bytes per rank of the quantizers by compressed allreduce and by Allgather, relative
// to a dense fp32 ring Allreduce of the same gradient, on N thread ranks through the
// simulated network (which counts every call by its algorithm). The gradient is the
// Fashion-MNIST MLP's layout (784-256-128-10) filled with Gaussian values; the second
// step is reported (the first has a zero residual), for the rank that sent the most.
//   wire_bytes_scaling [N ...]        (default: 4 16 64)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../scaling/scaling.hpp"
#include "gravac/gravac.hpp"

using namespace gravac;

namespace {

// The most wire bytes any rank sent in the second step of trainer<C, K>.
template <class C, class K>
double busiest_rank_bytes(int n, const layout& lay) {
  std::vector<double> sent(static_cast<std::size_t>(n));
  run_ranks(n, [&](thread_communicator& comm) {
    simulated_communicator<thread_communicator> sim(comm, network_profile::constant({}));
    trainer<C, K, fixed_policy> t(sim, lay);
    std::mt19937 rng(static_cast<unsigned>(comm.rank()) + 1);
    std::normal_distribution<float> normal;
    std::vector<float> g(lay.numel());
    for (int s = 0; s < 2; ++s) {
      for (auto& x : g) x = normal(rng);
      sent[static_cast<std::size_t>(comm.rank())] = t.step(g).wire_bytes_sent;
    }
  });
  return *std::max_element(sent.begin(), sent.end());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks;
  for (int i = 1; i < argc; ++i) ranks.push_back(std::atoi(argv[i]));
  if (ranks.empty()) ranks = {4, 16, 64};
  const layout lay = scaling::mlp_layout();
  std::printf("# wire bytes per rank / dense fp32 ring Allreduce's, d = %zu\n", lay.numel());
  std::printf("N,qsgd_compressed,qsgd_allgather,sign_compressed,sign_allgather,cast16_compressed,cast16_allgather\n");
  for (int n : ranks) {
    if (n < 2) {
      std::fprintf(stderr, "wire_bytes_scaling: N must be at least 2, got %d\n", n);
      return 2;
    }
    const double dense = 2.0 * (n - 1) / n * 4.0 * static_cast<double>(lay.numel());
    std::printf("%d,%.3f,%.3f,%.4f,%.4f,%.3f,%.3f\n", n, busiest_rank_bytes<qsgd, compressed_allreduce>(n, lay) / dense,
                busiest_rank_bytes<qsgd, allgather>(n, lay) / dense,
                busiest_rank_bytes<sign, compressed_allreduce>(n, lay) / dense,
                busiest_rank_bytes<sign, allgather>(n, lay) / dense,
                busiest_rank_bytes<cast16, compressed_allreduce>(n, lay) / dense,
                busiest_rank_bytes<cast16, allgather>(n, lay) / dense);
  }
}
