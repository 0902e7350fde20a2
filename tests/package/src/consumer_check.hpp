// Shared by the package consumers: one trainer step of top-k at half the values, where
// rank r's gradient is (r + 1) * i. Each rank keeps the upper half of the indices, so
// the average there is 1.5 * i and zero below: any other result is a failure.
#pragma once
#include <cstdio>
#include <gravac/gravac.hpp>
#include <vector>

namespace consumer {

constexpr std::size_t n = 8;

template <class Comm>
int run_step(Comm& comm) {
  gravac::layout lay;
  lay.add("w", {n}, gravac::layer_kind::dense);
  using trainer_t = gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy>;
  trainer_t::options opt;
  opt.policy.kept_fraction = 0.5;
  trainer_t t(comm, lay, opt);
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>((comm.rank() + 1) * i);
  const auto& report = t.step(g);
  int bad = 0;
  const float mean_factor = 0.5f * static_cast<float>(comm.size() + 1);  // mean of 1..size
  for (std::size_t i = 0; i < n; ++i) {
    const float expect = i >= n / 2 ? mean_factor * static_cast<float>(i) : 0.0f;
    if (g[i] != expect) {
      std::fprintf(stderr, "rank %d: g[%zu] = %g, expected %g\n", comm.rank(), i, g[i], expect);
      ++bad;
    }
  }
  if (report.bytes_sent == 0 || report.dense_bytes != n * sizeof(float)) {
    std::fprintf(stderr, "rank %d: implausible report (bytes_sent %zu, dense_bytes %zu)\n", comm.rank(),
                 report.bytes_sent, report.dense_bytes);
    ++bad;
  }
  return bad;
}

}  // namespace consumer
