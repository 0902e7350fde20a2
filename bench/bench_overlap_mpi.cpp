// The asynchronous bucketed step on MPI ranks against the same overlap written by hand:
// the dense path (identity + dense_allreduce) over buckets, each started as soon as a
// simulated backward has produced its layers, against MPI_Iallreduce per bucket posted at
// the same points of the same compute (with MPI_Testall between layers, so that Open MPI
// progresses the requests), in the same run. The synchronous step (compute, then step())
// is printed beside them.
//
//   mpiexec -n 4 --oversubscribe bench/bench_overlap_mpi [--reps R] [--mparams M] [--bucket-mb B]
//                                                        [--check-non-finite on|off]
//
// Every figure is the median over R repetitions of the slowest rank's wall time per step;
// the three variants run alternately so that a shared machine's load drifts over all alike.
// The layout is a ResNet-50-like list of layers (M million parameters in all, default 25.6)
// and backward is a fixed amount of arithmetic per gradient element (it writes the
// gradient), calibrated at the start to take about as long as the dense Allreduce.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/gravac.hpp"

namespace {

using namespace gravac;

// Layers of M million parameters: a few large ones and many small, last layers first in
// backward, as in a residual network.
layout model_layout(double mparams) {
  layout lay;
  const auto total = static_cast<std::size_t>(mparams * 1e6);
  // Relative sizes of 16 blocks (conv weight + its norm), the last a classifier.
  const double rel[] = {0.2, 0.5, 0.5, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 6};
  double sum = 0;
  for (double r : rel) sum += r;
  std::size_t used = 0;
  for (std::size_t i = 0; i < std::size(rel); ++i) {
    const auto n = i + 1 < std::size(rel) ? static_cast<std::size_t>(rel[i] / sum * static_cast<double>(total))
                                          : total - used - 64 * (std::size(rel) - 1) - 1000;
    lay.add("block" + std::to_string(i) + ".weight", {n}, layer_kind::conv);
    used += n;
    if (i + 1 < std::size(rel)) lay.add("block" + std::to_string(i) + ".norm", {64}, layer_kind::bias_or_norm);
  }
  lay.add("fc.bias", {1000}, layer_kind::bias_or_norm);
  return lay;
}

// "Backward" of one layer: `passes` multiply-adds per element over a working array that
// ends in the gradient (the same values every time for a given step and rank).
void backward_layer(std::span<float> g, int passes, int step, int rank) {
  float x = 1.0f + 1e-3f * static_cast<float>((step * 7 + rank) % 13);
  for (std::size_t j = 0; j < g.size(); ++j) {
    float v = x + 1e-7f * static_cast<float>(j % 1024);
    for (int p = 0; p < passes; ++p) v = v * 0.999f + 1e-4f;
    g[j] = v - 0.9f;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double slowest(double t) {
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int reps = 9;
  double mparams = 25.6, bucket_mb = 25;
  bool check_non_finite = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
    if (a == "--mparams") mparams = std::atof(argv[i + 1]);
    if (a == "--bucket-mb") bucket_mb = std::atof(argv[i + 1]);
    if (a == "--check-non-finite") check_non_finite = std::string(argv[i + 1]) != "off";
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (provided < MPI_THREAD_SERIALIZED) {
    if (rank == 0) std::fprintf(stderr, "bench_overlap_mpi: MPI provides no MPI_THREAD_SERIALIZED\n");
    MPI_Finalize();
    return 1;
  }
  {
    mpi_communicator comm(MPI_COMM_WORLD);
    const layout lay = model_layout(mparams);
    const auto bucket_bytes = static_cast<std::size_t>(bucket_mb * (1 << 20));
    const bucket_plan plan(lay, bucket_bytes);
    std::vector<float> grads(lay.numel());
    const float inv = 1.0f / static_cast<float>(size);

    // Calibrate backward to about the dense Allreduce's time.
    double allreduce_s = 0;
    {
      std::vector<double> t;
      for (int r = 0; r < 3; ++r) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(grads.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        t.push_back(slowest(MPI_Wtime() - t0));
      }
      allreduce_s = median(t);
    }
    int passes = 1;
    for (;;) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      backward_layer(grads, passes, 0, rank);
      const double t = slowest(MPI_Wtime() - t0);
      if (t >= allreduce_s || passes >= 4096) break;
      passes *= 2;
    }

    using dense_trainer = trainer<identity, dense_allreduce, fixed_policy>;
    dense_trainer::options topt;
    topt.policy.kept_fraction = 1.0;  // dense: identity's fast path, one Allreduce per bucket
    topt.bucket_bytes = bucket_bytes;
    if (!check_non_finite) topt.on_non_finite = non_finite_action::ignore;
    dense_trainer t(comm, lay, topt);
    const auto backward_all = [&](int step, auto&& on_layer) {
      for (std::size_t i = lay.size(); i-- > 0;) {
        const auto& l = lay[i];
        backward_layer(std::span<float>(grads.data() + l.offset, l.numel), passes, step, rank);
        on_layer(i);
      }
    };
    int step = 0;
    double codec_s = 0, comm_s = 0, wait_s = 0;  // the last asynchronous step's report
    const auto synchronous = [&] {
      backward_all(step, [](std::size_t) {});
      t.step(std::span<float>(grads));
      ++step;
    };
    const auto gravac_async = [&] {
      t.begin_step(std::span<float>(grads));
      backward_all(step, [&](std::size_t i) { t.ready(i); });
      const auto& r = t.finish();
      codec_s = r.compress_s + r.decompress_s;
      comm_s = r.communicate_s;
      wait_s = r.exposed_communicate_s;
      ++step;
    };
    std::vector<MPI_Request> req(plan.size(), MPI_REQUEST_NULL);
    const auto by_hand = [&] {
      std::size_t next = 0;  // buckets posted so far (in order)
      std::vector<std::size_t> pending(plan.size());
      for (std::size_t b = 0; b < plan.size(); ++b) pending[b] = plan[b].last_layer - plan[b].first_layer;
      backward_all(step, [&](std::size_t i) {
        --pending[plan.bucket_of(i)];
        while (next < plan.size() && pending[next] == 0) {
          const auto& bk = plan[next];
          MPI_Iallreduce(MPI_IN_PLACE, grads.data() + bk.offset, static_cast<int>(bk.numel), MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD, &req[next]);
          ++next;
        }
        int done = 0;
        MPI_Testall(static_cast<int>(next), req.data(), &done, MPI_STATUSES_IGNORE);
      });
      MPI_Waitall(static_cast<int>(plan.size()), req.data(), MPI_STATUSES_IGNORE);
      for (auto& v : grads) v *= inv;
      ++step;
    };

    synchronous();  // warm-up: first touch, MPI buffers, the communication thread
    gravac_async();
    by_hand();
    std::vector<double> ts, ta, th;
    for (int r = 0; r < reps; ++r) {
      const auto time = [&](auto&& f, std::vector<double>& out) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        f();
        out.push_back(slowest(MPI_Wtime() - t0));
      };
      time(synchronous, ts);
      time(gravac_async, ta);
      time(by_hand, th);
    }
    if (rank == 0) {
      std::printf(
          "bench_overlap_mpi: %d ranks, %zu parameters in %zu layers, %zu buckets of >= %.1f MB, "
          "backward %d passes/element, median of %d (slowest rank)\n",
          size, lay.numel(), lay.size(), plan.size(), bucket_mb, passes, reps);
      std::printf("  dense Allreduce of the whole gradient        %9.4f s\n", allreduce_s);
      std::printf("  synchronous: backward, then step()           %9.4f s\n", median(ts));
      std::printf("  MPI_Iallreduce per bucket by hand (baseline)  %9.4f s\n", median(th));
      std::printf("  gravac asynchronous step (begin/ready/finish) %9.4f s   ratio to baseline %.3f\n", median(ta),
                  median(ta) / median(th));
      std::printf(
          "  its last step on rank 0: copies and scaling %.4f s, in the collectives %.4f s, finish() waited %.4f s\n",
          codec_s, comm_s, wait_s);
    }
  }
  MPI_Finalize();
  return 0;
}
