// gravac's collectives on MPI ranks against the raw MPI calls on the same buffers, and
// the modeled step time of each collective across kept fractions and network profiles.
//
//   mpiexec -n 4 --oversubscribe bench/bench_collectives_mpi [--reps R] [--max-log2 K]
//
// Every figure is the median over R repetitions of the slowest rank's time; each gravac
// figure is printed next to its raw-MPI baseline measured in the same run, with the ratio.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/collective/flexible.hpp"
#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/gravac.hpp"
#include "gravac/network/cost_model.hpp"

namespace {

using namespace gravac;

// Median over repetitions of the slowest rank's seconds for fn().
template <class Fn>
double median_max_seconds(MPI_Comm comm, int reps, Fn&& fn) {
  std::vector<double> t(static_cast<std::size_t>(reps));
  fn();  // warm-up (first-touch, MPI buffers)
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    fn();
    t[static_cast<std::size_t>(r)] = MPI_Wtime() - t0;
  }
  MPI_Allreduce(MPI_IN_PLACE, t.data(), reps, MPI_DOUBLE, MPI_MAX, comm);
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[static_cast<std::size_t>(reps / 2)];
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
      const double raw_s = median_max_seconds(raw, reps, [&] {
        std::memcpy(g.data(), g0.data(), dd * 4);
        MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(dd), MPI_FLOAT, MPI_SUM, raw);
      });
      const double gv_s = median_max_seconds(raw, reps, [&] {
        std::memcpy(g.data(), g0.data(), dd * 4);
        t.step(g);
      });
      if (me == 0)
        std::printf("| %zu | dense trainer step vs MPI_Allreduce | %.3f | %.3f | %.3f |\n", dd, gv_s * 1e3, raw_s * 1e3,
                    gv_s / raw_s);
    }
    // Sparse paths at f = 1% and 0.1%: gravac's whole step (selection included) and its
    // communication alone, against the raw calls moving the same bytes.
    for (double f : {0.01, 0.001}) {
      std::size_t k = 0;
      for (const auto& l : lay.layers()) k += kept_count(l.numel, f);
      std::vector<std::uint32_t> idx(k);
      std::vector<float> vals(k);
      std::vector<std::byte> pk(8 * k), all(8 * k * static_cast<std::size_t>(n));
      const double raw_ar = median_max_seconds(raw, reps, [&] {
        MPI_Bcast(idx.data(), static_cast<int>(k), MPI_UINT32_T, 0, raw);
        MPI_Allreduce(MPI_IN_PLACE, vals.data(), static_cast<int>(k), MPI_FLOAT, MPI_SUM, raw);
      });
      const double raw_ag = median_max_seconds(raw, reps, [&] {
        MPI_Allgather(pk.data(), static_cast<int>(pk.size()), MPI_BYTE, all.data(), static_cast<int>(pk.size()),
                      MPI_BYTE, raw);
      });
      trainer<topk, allreduce_compatible, fixed_policy>::options oa;
      oa.policy.kept_fraction = f;
      oa.on_non_finite = non_finite_action::ignore;
      trainer<topk, allreduce_compatible, fixed_policy> ta(comm, lay, oa);
      trainer<topk, allgather, fixed_policy>::options og;
      og.policy.kept_fraction = f;
      og.on_non_finite = non_finite_action::ignore;
      trainer<topk, allgather, fixed_policy> tg(comm, lay, og);
      double comm_a = 0, comm_g = 0;
      std::vector<double> ca, cg;
      ca.reserve(static_cast<std::size_t>(reps) + 1);
      cg.reserve(static_cast<std::size_t>(reps) + 1);
      const double step_a = median_max_seconds(raw, reps, [&] {
        std::memcpy(g.data(), g0.data(), dd * 4);
        ca.push_back(ta.step(g).communicate_s);
      });
      const double step_g = median_max_seconds(raw, reps, [&] {
        std::memcpy(g.data(), g0.data(), dd * 4);
        cg.push_back(tg.step(g).communicate_s);
      });
      auto med = [&](std::vector<double>& v) {
        MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, raw);
        std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
        return v[v.size() / 2];
      };
      comm_a = med(ca);
      comm_g = med(cg);
      if (me == 0) {
        std::printf("| %zu | AR-Topk f=%g: communication vs Bcast+Allreduce | %.3f | %.3f | %.3f |\n", dd, f,
                    comm_a * 1e3, raw_ar * 1e3, comm_a / raw_ar);
        std::printf("| %zu | AR-Topk f=%g: whole step (top-k selection included) | %.3f | %.3f | %.3f |\n", dd, f,
                    step_a * 1e3, raw_ar * 1e3, step_a / raw_ar);
        std::printf("| %zu | Allgather f=%g: communication vs MPI_Allgather | %.3f | %.3f | %.3f |\n", dd, f,
                    comm_g * 1e3, raw_ag * 1e3, comm_g / raw_ag);
        std::printf("| %zu | Allgather f=%g: whole step | %.3f | %.3f | %.3f |\n", dd, f, step_g * 1e3,
                    raw_ag * 1e3, step_g / raw_ag);
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
  std::printf("| network | f | dense ring | AR-Topk ring | AR-Topk tree | Allgather top-k | flexible picks |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---|\n");
  for (const auto& p : profiles)
    for (double f : {0.1, 0.033, 0.011, 0.004, 0.001}) {
      const auto c = flexible::costs(n, d, f, p.net);
      const double tree = cost_model::ar_topk(n, d, f, allreduce_algorithm::tree).seconds(p.net);
      const auto best = flexible::candidates[static_cast<std::size_t>(std::min_element(c.begin(), c.end()) - c.begin())];
      std::printf("| %s | %g | %.2f | %.2f | %.2f | %.2f | %s |\n", p.name, f, c[0] * 1e3, c[1] * 1e3, tree * 1e3,
                  c[2] * 1e3, std::string(to_string(best)).c_str());
    }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int reps = 20, max_log2 = 22;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(3, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--max-log2") == 0) max_log2 = std::max(16, std::atoi(argv[++i]));
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
