// gravac's collectives on MPI ranks against the raw MPI calls on the same buffers, and
// the modeled step time of each collective across kept fractions and network profiles.
//
//   mpiexec -n 4 --oversubscribe bench/bench_collectives_mpi [--reps R] [--max-log2 K]
//
// Every figure is the median over R repetitions of the slowest rank's time; each gravac
// figure is printed next to its baseline measured in the same run, with the ratio: the dense
// step against MPI_Allreduce on the same buffer, the sparse steps against the same
// algorithm written by hand on raw MPI calls and std::nth_element.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/collective/flexible.hpp"
#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/gravac.hpp"
#include "gravac/network/cost_model.hpp"

namespace {

using namespace gravac;

// Medians over repetitions of the slowest rank's seconds for a() and b(), run alternately
// (a, b, a, b, ...) so that the load of a shared machine drifts over both alike.
template <class A, class B>
std::pair<double, double> paired_median_max(MPI_Comm comm, int reps, A&& a, B&& b) {
  std::vector<double> ta(static_cast<std::size_t>(reps)), tb(static_cast<std::size_t>(reps));
  a();  // warm-up (first touch, MPI buffers, workspaces)
  b();
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    a();
    ta[static_cast<std::size_t>(r)] = MPI_Wtime() - t0;
    MPI_Barrier(comm);
    t0 = MPI_Wtime();
    b();
    tb[static_cast<std::size_t>(r)] = MPI_Wtime() - t0;
  }
  auto med = [&](std::vector<double>& t) {
    MPI_Allreduce(MPI_IN_PLACE, t.data(), reps, MPI_DOUBLE, MPI_MAX, comm);
    std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
    return t[static_cast<std::size_t>(reps / 2)];
  };
  const double ma = med(ta);
  return {ma, med(tb)};
}

std::vector<float> data(std::size_t n, int rank) {
  std::vector<float> v(n);
  std::uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(rank + 1);
  for (auto& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = static_cast<float>(static_cast<std::int64_t>(s % 2001) - 1000) * 1e-3f;
  }
  return v;
}

layout model_layout(std::size_t d) {
  // A 2-D layer holding most of the parameters plus a small one, so per-layer code runs.
  layout lay;
  const std::size_t rows = 1024, big = d - d % rows - rows;
  lay.add("w1", {rows, big / rows}, layer_kind::dense);
  lay.add("w2", {rows, (d - big) / rows}, layer_kind::dense);
  return lay;
}

// The naive top-k of |u| over one layer: indices 0..n-1, nth_element, sort (ascending).
void naive_topk(const float* u, std::size_t n, std::size_t k, std::vector<std::uint32_t>& idx) {
  idx.resize(n);
  for (std::size_t i = 0; i < n; ++i) idx[i] = static_cast<std::uint32_t>(i);
  if (k < n)
    std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return std::fabs(u[a]) > std::fabs(u[b]); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
}

// AR-Topk written by hand on raw MPI (STAR): u = g + e, rank `step mod N` selects and
// broadcasts, everyone sums its values there, e keeps the rest.
struct hand_ar_topk {
  const layout& lay;
  double f;
  int n;
  std::vector<float> e;
  std::vector<std::uint32_t> idx, sel;
  std::vector<float> vals;
  std::uint64_t steps = 0;
  hand_ar_topk(const layout& l, double f_, int n_) : lay(l), f(f_), n(n_), e(l.numel(), 0.0f) {}
  void step(std::vector<float>& g, MPI_Comm c, int me) {
    const int root = static_cast<int>(steps++ % static_cast<std::uint64_t>(n));
    for (std::size_t j = 0; j < g.size(); ++j) e[j] += g[j];
    idx.clear();
    for (const auto& l : lay.layers()) {
      const std::size_t k = kept_count(l.numel, f);
      if (me == root) {
        naive_topk(e.data() + l.offset, l.numel, k, sel);
        for (auto i : sel) idx.push_back(static_cast<std::uint32_t>(l.offset + i));
      } else {
        idx.resize(idx.size() + k);
      }
    }
    MPI_Bcast(idx.data(), static_cast<int>(idx.size()), MPI_UINT32_T, root, c);
    vals.resize(idx.size());
    for (std::size_t i = 0; i < idx.size(); ++i) {
      vals[i] = e[idx[i]];
      e[idx[i]] = 0.0f;
    }
    MPI_Allreduce(MPI_IN_PLACE, vals.data(), static_cast<int>(vals.size()), MPI_FLOAT, MPI_SUM, c);
    std::fill(g.begin(), g.end(), 0.0f);
    const float inv = 1.0f / static_cast<float>(n);
    for (std::size_t i = 0; i < idx.size(); ++i) g[idx[i]] = vals[i] * inv;
  }
};

// Allgather top-k written by hand on raw MPI: u = g + e, local top-k, MPI_Allgather of
// (indices, values), scatter-add of every rank's values divided by N.
struct hand_allgather {
  const layout& lay;
  double f;
  int n;
  std::vector<float> e;
  std::vector<std::uint32_t> sel;
  std::vector<std::uint32_t> mine, all;  // k indices then k values (as bits) per rank
  hand_allgather(const layout& l, double f_, int n_) : lay(l), f(f_), n(n_), e(l.numel(), 0.0f) {}
  void step(std::vector<float>& g, MPI_Comm c) {
    for (std::size_t j = 0; j < g.size(); ++j) e[j] += g[j];
    mine.clear();
    std::size_t k_total = 0;
    for (const auto& l : lay.layers()) k_total += kept_count(l.numel, f);
    mine.resize(2 * k_total);
    std::size_t at = 0;
    for (const auto& l : lay.layers()) {
      naive_topk(e.data() + l.offset, l.numel, kept_count(l.numel, f), sel);
      for (auto i : sel) {
        const std::size_t j = l.offset + i;
        mine[at] = static_cast<std::uint32_t>(j);
        std::memcpy(&mine[k_total + at], &e[j], 4);
        e[j] = 0.0f;
        ++at;
      }
    }
    all.resize(mine.size() * static_cast<std::size_t>(n));
    MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_UINT32_T, all.data(), static_cast<int>(mine.size()),
                  MPI_UINT32_T, c);
    std::fill(g.begin(), g.end(), 0.0f);
    const float inv = 1.0f / static_cast<float>(n);
    for (int r = 0; r < n; ++r) {
      const std::uint32_t* p = all.data() + static_cast<std::size_t>(r) * mine.size();
      for (std::size_t i = 0; i < k_total; ++i) {
        float v;
        std::memcpy(&v, &p[k_total + i], 4);
        g[p[i]] += inv * v;
      }
    }
  }
};

void measured_tables(mpi_communicator& comm, int reps, int max_log2) {
  const int n = comm.size(), me = comm.rank();
  MPI_Comm raw = comm.native();
  if (me == 0) {
    std::printf("\n## Measured on %d MPI ranks (median of %d, slowest rank)\n\n", n, reps);
    std::printf("| d (floats) | path | gravac ms | raw MPI ms | ratio |\n|---:|---|---:|---:|---:|\n");
  }
  for (int lg = 16; lg <= max_log2; lg += 2) {
    const std::size_t d = std::size_t{1} << lg;
    const auto lay = model_layout(d);
    const std::size_t dd = lay.numel();
    auto g0 = data(dd, me);
    std::vector<float> g(dd);

    // Dense: trainer<identity, dense_allreduce> at f = 1 vs MPI_Allreduce on the same buffer.
    {
      trainer<identity, dense_allreduce, fixed_policy>::options o;
      o.policy.kept_fraction = 1.0;
      o.on_non_finite = non_finite_action::ignore;
      trainer<identity, dense_allreduce, fixed_policy> t(comm, lay, o);
      const auto [gv_s, raw_s] = paired_median_max(
          raw, reps,
          [&] {
            std::memcpy(g.data(), g0.data(), dd * 4);
            t.step(g);
          },
          [&] {
            std::memcpy(g.data(), g0.data(), dd * 4);
            MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(dd), MPI_FLOAT, MPI_SUM, raw);
          });
      if (me == 0)
        std::printf("| %zu | dense trainer step vs MPI_Allreduce | %.3f | %.3f | %.3f |\n", dd, gv_s * 1e3, raw_s * 1e3,
                    gv_s / raw_s);
    }
    // Sparse paths at f = 1% and 0.1%: gravac's whole step against the same algorithm
    // written by hand on raw MPI calls and std::nth_element (the naive selection baseline).
    for (double f : {0.01, 0.001}) {
      hand_ar_topk hand_a(lay, f, n);
      hand_allgather hand_g(lay, f, n);
      trainer<topk, allreduce_compatible, fixed_policy>::options oa;
      oa.policy.kept_fraction = f;
      oa.on_non_finite = non_finite_action::ignore;
      trainer<topk, allreduce_compatible, fixed_policy> ta(comm, lay, oa);
      trainer<topk, allgather, fixed_policy>::options og;
      og.policy.kept_fraction = f;
      og.on_non_finite = non_finite_action::ignore;
      trainer<topk, allgather, fixed_policy> tg(comm, lay, og);
      const auto [step_a, raw_ar] = paired_median_max(
          raw, reps,
          [&] {
            std::memcpy(g.data(), g0.data(), dd * 4);
            ta.step(g);
          },
          [&] {
            std::memcpy(g.data(), g0.data(), dd * 4);
            hand_a.step(g, raw, me);
          });
      const auto [step_g, raw_ag] = paired_median_max(
          raw, reps,
          [&] {
            std::memcpy(g.data(), g0.data(), dd * 4);
            tg.step(g);
          },
          [&] {
            std::memcpy(g.data(), g0.data(), dd * 4);
            hand_g.step(g, raw);
          });
      if (me == 0) {
        std::printf(
            "| %zu | AR-Topk step f=%g vs hand-written (nth_element, MPI_Bcast, MPI_Allreduce) | %.3f | %.3f | %.3f "
            "|\n",
            dd, f, step_a * 1e3, raw_ar * 1e3, step_a / raw_ar);
        std::printf("| %zu | Allgather step f=%g vs hand-written (nth_element, MPI_Allgather) | %.3f | %.3f | %.3f |\n",
                    dd, f, step_g * 1e3, raw_ag * 1e3, step_g / raw_ag);
      }
    }
  }
}

void modeled_table(int n) {
  const double d = 25.6e6;  // ResNet-50 sized
  struct prof {
    const char* name;
    network_params net;
  };
  const prof profiles[] = {{"1 ms, 25 Gbit/s", network_params::from_gbps(1e-3, 25)},
                           {"32 ms, 1 Gbit/s", network_params::from_gbps(32e-3, 1)},
                           {"50 us, 10 Gbit/s", network_params::from_gbps(50e-6, 10)},
                           {"5 us, 100 Gbit/s", network_params::from_gbps(5e-6, 100)}};
  std::printf("\n## Modeled communication per step, N = %d, d = %.1fM (ms; cost model of algorithms.md)\n\n", n,
              d / 1e6);
  std::printf(
      "| network | f | dense ring | AR-Topk ring | AR-Topk tree | Allgather top-k | flexible picks (AR-Topk priced as "
      "ring) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---|\n");
  for (const auto& p : profiles)
    for (double f : {0.1, 0.033, 0.011, 0.004, 0.001}) {
      const auto c = flexible::costs(n, d, f, p.net);
      const double tree = cost_model::ar_topk(n, d, f, allreduce_algorithm::tree).seconds(p.net);
      const auto best =
          flexible::candidates[static_cast<std::size_t>(std::min_element(c.begin(), c.end()) - c.begin())];
      std::printf("| %s | %g | %.2f | %.2f | %.2f | %.2f | %s |\n", p.name, f, c[0] * 1e3, c[1] * 1e3, tree * 1e3,
                  c[2] * 1e3, std::string(to_string(best)).c_str());
    }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int reps = 20, max_log2 = 22;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0)
      reps = std::max(3, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--max-log2") == 0)
      max_log2 = std::max(16, std::atoi(argv[++i]));
  }
  int rc = 0;
  try {
    gravac::mpi_communicator comm;
    measured_tables(comm, reps, max_log2);
    if (comm.rank() == 0) {
      modeled_table(comm.size());
      modeled_table(64);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives_mpi: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
