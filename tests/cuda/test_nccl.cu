// nccl_communicator with one rank per GPU (run under mpiexec): every collective against
// what it must produce, trainer<topk_cuda, allgather, fixed_policy> against the serial
// host reference, trainer<topk_cuda, allreduce_compatible, fixed_policy> (AR-Topk's NCCL
// broadcast and Allreduce) and trainer<adacomp_cuda, allgather, adacomp_policy> (the
// policy's bin lengths in every bucket) against the host trainer on thread ranks, and the
// asynchronous device step (begin_step, ready per layer on a stream, finish) against the
// synchronous one and its errors; a collective one rank never joins (timeout) and a
// communicator one rank aborts: the others fail instead of hanging, and every communicator
// is destroyed. Skipped (exit 77) without a GPU.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_test_util.hpp"
#include "gravac/cuda/adacomp_cuda.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/nccl_communicator.hpp"
#include "gravac/cuda/topk_cuda.hpp"
#include "gravac/gravac.hpp"
#include "gravac_test_util.hpp"
#include "nccl_world.hpp"
#include "pairwise_cases.hpp"

namespace {

using gravac::test::to_device;
using gravac::test::to_host;
using gravac::test::world;

// The host reference of a device trainer: host trainer \p H on \p n thread ranks of this
// process for \p steps steps of gradients grad(step, rank); rank \p r's averaged gradient
// and residual after each step.
template <class H, class Grad>
std::pair<std::vector<std::vector<float>>, std::vector<std::vector<float>>> host_reference(
    int n, int r, const gravac::layout& lay, const typename H::options& opt, std::uint64_t steps, Grad&& grad) {
  std::vector<std::vector<float>> want_g(steps), want_e(steps);
  gravac::run_ranks(n, [&](gravac::thread_communicator& tc) {
    H t(tc, lay, opt);
    for (std::uint64_t step = 0; step < steps; ++step) {
      auto g = grad(step, tc.rank());
      t.step(std::span<float>(g));
      if (tc.rank() == r) {
        want_g[step] = g;
        const auto e = t.residual();
        want_e[step].assign(e.begin(), e.end());
      }
    }
  });
  return {std::move(want_g), std::move(want_e)};
}

}  // namespace

TEST_CASE("nccl_communicator: allreduce, broadcast, allgatherv without padding, barrier") {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank(), n = comm.size();
  REQUIRE(n == world().size());

  std::vector<float> f(1000);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i % 17) + static_cast<float>(r);
  auto fd = to_device(f);
  comm.allreduce_sum(fd.span());
  const auto fs = to_host(fd.data(), fd.size());
  for (std::size_t i = 0; i < f.size(); ++i)
    REQUIRE(fs[i] == static_cast<float>(n * static_cast<int>(i % 17) + n * (n - 1) / 2));

  std::vector<double> d = {1.0 + r, -2.0 * r, 0.5};
  comm.allreduce_sum(std::span<double>(d));  // host memory
  REQUIRE(d[0] == Approx(n + n * (n - 1) / 2.0));
  REQUIRE(d[2] == Approx(0.5 * n));
  std::vector<double> m = {static_cast<double>(r), -static_cast<double>(r)};
  comm.allreduce_max(std::span<double>(m));
  REQUIRE(m[0] == n - 1);
  REQUIRE(m[1] == 0);

  std::vector<std::byte> b(37, std::byte{0});
  if (r == n - 1)
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 3 + 1);
  auto bd = to_device(b);
  comm.broadcast(bd.span(), n - 1);
  const auto bb = to_host(bd.data(), bd.size());
  for (std::size_t i = 0; i < bb.size(); ++i) REQUIRE(bb[i] == static_cast<std::byte>(i * 3 + 1));

  // Rank q sends 13 * q + 5 bytes (rank 1 sends none when there are 3 or more ranks).
  auto size_of = [&](int q) { return (q == 1 && n >= 3) ? std::size_t{0} : static_cast<std::size_t>(13 * q + 5); };
  std::vector<std::byte> mine(size_of(r));
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<std::byte>(r * 31 + static_cast<int>(i));
  for (bool from_host : {false, true}) {
    auto md = to_device(mine);
    gravac::device_byte_buffer out;
    std::vector<std::size_t> sizes;
    comm.allgatherv(from_host ? std::span<const std::byte>(mine) : std::span<const std::byte>(md.data(), md.size()),
                    out, sizes);
    REQUIRE(sizes.size() == static_cast<std::size_t>(n));
    std::size_t total = 0;
    for (int q = 0; q < n; ++q) {
      REQUIRE(sizes[static_cast<std::size_t>(q)] == size_of(q));
      total += size_of(q);
    }
    REQUIRE(out.size() == total);  // exact: no padding to the largest
    const auto all = to_host(out.data(), out.size());
    std::size_t at = 0;
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < size_of(q); ++i, ++at)
        REQUIRE(all[at] == static_cast<std::byte>(q * 31 + static_cast<int>(i)));
  }
  comm.barrier();
}

TEST_CASE("trainer<topk_cuda, allgather, fixed_policy> over NCCL equals the serial host reference") {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank(), n = comm.size();
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {200003}, gravac::layer_kind::dense);
  using T = gravac::trainer<gravac::topk_cuda, gravac::allgather, gravac::fixed_policy>;
  T::options opt;
  opt.policy.kept_fraction = 0.02;
  T t(comm, lay, opt);

  std::vector<std::vector<float>> residuals(static_cast<std::size_t>(n), std::vector<float>(lay.numel(), 0.0f));
  auto p = gravac::test::params_for(lay, 0.02);
  for (std::uint64_t step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> grads;
    for (int q = 0; q < n; ++q)
      grads.push_back(gravac::test::make_data(lay.numel(), 100 * step + static_cast<std::uint64_t>(q)));
    const auto expect = gravac::test::serial_reference<gravac::topk>(lay, {}, p, grads, residuals);
    auto g = to_device(grads[static_cast<std::size_t>(r)]);
    const auto& rep = t.step(gravac::device_view(g));
    REQUIRE(rep.collective == gravac::collective_kind::allgather);
    const auto got = to_host(g.data(), g.size());
    REQUIRE(gravac::test::max_rel_diff(got, expect) <= 1e-6);
    const auto res = to_host(t.residual_view().data(), lay.numel());
    REQUIRE(std::memcmp(res.data(), residuals[static_cast<std::size_t>(r)].data(), res.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("trainer<topk_cuda, dense_allreduce, fixed_policy> over NCCL equals the serial host reference") {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank(), n = comm.size();
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {131075}, gravac::layer_kind::dense);
  using T = gravac::trainer<gravac::topk_cuda, gravac::dense_allreduce, gravac::fixed_policy>;
  T::options opt;
  opt.policy.kept_fraction = 0.05;
  T t(comm, lay, opt);

  std::vector<std::vector<float>> residuals(static_cast<std::size_t>(n), std::vector<float>(lay.numel(), 0.0f));
  auto p = gravac::test::params_for(lay, 0.05);
  for (std::uint64_t step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> grads;
    for (int q = 0; q < n; ++q)
      grads.push_back(gravac::test::make_data(lay.numel(), 300 * step + static_cast<std::uint64_t>(q)));
    // The average of every rank's decompressed packet (summation order aside).
    const auto expect = gravac::test::serial_reference<gravac::topk>(lay, {}, p, grads, residuals);
    auto g = to_device(grads[static_cast<std::size_t>(r)]);
    const auto& rep = t.step(gravac::device_view(g));
    REQUIRE(rep.collective == gravac::collective_kind::dense_allreduce);
    REQUIRE(rep.bytes_sent == lay.numel() * sizeof(float));
    const auto got = to_host(g.data(), g.size());
    REQUIRE(gravac::test::max_rel_diff(got, expect) <= 1e-6);
    const auto res = to_host(t.residual_view().data(), lay.numel());
    REQUIRE(std::memcmp(res.data(), residuals[static_cast<std::size_t>(r)].data(), res.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("trainer<topk_cuda, allreduce_compatible, fixed_policy> over NCCL equals the host's AR-Topk, STAR and VAR") {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank(), n = comm.size();
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {65537}, gravac::layer_kind::dense);
  for (const auto rule : {gravac::index_rank_rule::star, gravac::index_rank_rule::var}) {
    INFO("rule " << static_cast<int>(rule));
    using D = gravac::trainer<gravac::topk_cuda, gravac::allreduce_compatible, gravac::fixed_policy>;
    using H = gravac::trainer<gravac::topk, gravac::allreduce_compatible, gravac::fixed_policy>;
    D::options opt;
    opt.policy.kept_fraction = 0.03;
    opt.collective.rule = rule;
    H::options host_opt;
    host_opt.policy.kept_fraction = 0.03;
    host_opt.collective.rule = rule;
    constexpr std::uint64_t steps = 4;
    auto grad = [&](std::uint64_t step, int q) {
      return gravac::test::make_data(lay.numel(), 500 * step + static_cast<std::uint64_t>(q));
    };
    const auto [want_g, want_e] = host_reference<H>(n, r, lay, host_opt, steps, grad);
    D t(comm, lay, opt);
    for (std::uint64_t step = 0; step < steps; ++step) {
      INFO("step " << step);
      auto g = to_device(grad(step, r));
      const auto& rep = t.step(gravac::device_view(g));
      REQUIRE(rep.collective == gravac::collective_kind::allreduce_compatible);
      const auto got = to_host(g.data(), g.size());
      REQUIRE(gravac::test::max_rel_diff(got, want_g[step]) <= 1e-6);  // NCCL sums in its own order
      const auto res = to_host(t.residual_view().data(), lay.numel());
      REQUIRE(std::memcmp(res.data(), want_e[step].data(), res.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("trainer<adacomp_cuda, allgather, adacomp_policy> over NCCL, bucket per layer, equals the host") {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank(), n = comm.size();
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {65537}, gravac::layer_kind::dense);
  using D = gravac::trainer<gravac::adacomp_cuda, gravac::allgather, gravac::adacomp_policy>;
  using H = gravac::trainer<gravac::adacomp, gravac::allgather, gravac::adacomp_policy>;
  // Bin lengths other than the compressor's defaults, so a bucket that missed them would differ.
  D::options opt;
  opt.policy.conv_bin = 7;
  opt.policy.dense_bin = 33;
  opt.bucket_bytes = gravac::bucket_per_layer;
  H::options host_opt;
  host_opt.policy = opt.policy;
  host_opt.bucket_bytes = gravac::bucket_per_layer;
  constexpr std::uint64_t steps = 3;
  auto grad = [&](std::uint64_t step, int q) {
    return gravac::test::make_data(lay.numel(), 700 * step + static_cast<std::uint64_t>(q));
  };
  const auto [want_g, want_e] = host_reference<H>(n, r, lay, host_opt, steps, grad);
  D t(comm, lay, opt);
  REQUIRE(t.bucket_count() > 1);
  for (std::uint64_t step = 0; step < steps; ++step) {
    INFO("step " << step);
    auto g = to_device(grad(step, r));
    t.step(gravac::device_view(g));
    for (std::size_t b = 0; b < t.bucket_count(); ++b) {
      const auto& bk = t.buckets()[b];
      const auto& bins = t.compressor(b).settings().bin_length;
      REQUIRE(bins.size() == bk.last_layer - bk.first_layer);
      for (std::size_t i = 0; i < bins.size(); ++i) REQUIRE(bins[i] == t.policy().bin_length(bk.first_layer + i));
    }
    const auto got = to_host(g.data(), g.size());
    REQUIRE(gravac::test::max_rel_diff(got, want_g[step]) <= 1e-6);  // NCCL gathers; decoding order is the same
    // adacomp_cuda sends what adacomp sends (test_cuda_adacomp), so the residuals are equal.
    const auto res = to_host(t.residual_view().data(), lay.numel());
    REQUIRE(std::memcmp(res.data(), want_e[step].data(), res.size() * sizeof(float)) == 0);
  }
}

namespace {

// The asynchronous step's calls on device memory: ready() takes the stream as a
// cudaStream_t or a stream_ref, an integer second argument is still a ready time, and a
// host span is not device memory; a host trainer has no stream form.
using device_trainer = gravac::trainer<gravac::topk_cuda, gravac::allgather, gravac::fixed_policy>;
static_assert(requires(device_trainer & t, gravac::grad_view<gravac::cuda_space> g, cudaStream_t s,
                       gravac::stream_ref sr) {
  t.begin_step(g);
  t.ready(std::size_t{0});
  t.ready(std::size_t{0}, s);
  t.ready(std::size_t{0}, sr);
  t.ready(std::size_t{0}, 0.5);
  t.ready(std::size_t{0}, 0);
  t.finish();
});
template <class T, class G>
concept begins_on = requires(T& t, G g) {
  t.begin_step(g);
};
template <class T, class S>
concept ready_on = requires(T& t, S s) {
  t.ready(std::size_t{0}, s);
};
static_assert(!begins_on<device_trainer, std::span<float>>);
static_assert(!ready_on<gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy>, cudaStream_t>);

// How the asynchronous step below hands its layers over: each layer's gradient is copied
// in by an asynchronous copy on a stream just before ready(), so a bucket that did not wait
// for its layers' events would read the zeros the buffer starts with.
enum class hand_over {
  reverse,            // last layer first (backward's order), on the legacy default stream, ready(layer)
  scrambled,          // a per-rank, per-step shuffle, on the legacy default stream, ready(layer)
  reverse_on_stream,  // last layer first, on a non-blocking stream of the caller's, ready(layer, stream)
  one_left_out,       // as reverse, but layer 1 is never marked: finish() takes it (legacy stream)
};

// The report fields that do not measure time, equal bit for bit, except the statistics:
// the device kernels add per-block partial norms and histogram energies with floating-point
// atomics, whose order varies from run to run on a GPU (and from launch to launch on the
// host double, which shuffles the blocks), so those agree to a few ulps, not in every bit.
// The packets and residuals they do not feed stay bit for bit (see the callers).
bool close_values(double x, double y) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return x == y || std::fabs(x - y) <= 1e-12 * std::max(std::fabs(x), std::fabs(y));
}
void require_same_report(const gravac::step_report& a, const gravac::step_report& b) {
  REQUIRE(a.step == b.step);
  REQUIRE(a.bytes_sent == b.bytes_sent);
  REQUIRE(a.dense_bytes == b.dense_bytes);
  REQUIRE(std::bit_cast<std::uint64_t>(a.wire_bytes_sent) == std::bit_cast<std::uint64_t>(b.wire_bytes_sent));
  REQUIRE(std::bit_cast<std::uint64_t>(a.wire_bytes_received) == std::bit_cast<std::uint64_t>(b.wire_bytes_received));
  REQUIRE(a.collective == b.collective);
  REQUIRE(a.fallback == b.fallback);
  REQUIRE(a.buckets == b.buckets);
  REQUIRE(a.skipped == b.skipped);
  REQUIRE(close_values(a.gain, b.gain));
  const auto same = [](const std::vector<double>& x, const std::vector<double>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
  };
  const auto close = [](const std::vector<double>& x, const std::vector<double>& y) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!close_values(x[i], y[i])) return false;
    return true;
  };
  REQUIRE(same(a.kept_fraction, b.kept_fraction));
  REQUIRE(close(a.layer_grad_norm, b.layer_grad_norm));
  REQUIRE(close(a.gain_curve, b.gain_curve));
}

// Keeps a stream busy for about a millisecond: queued before each layer's copy, it makes a
// bucket that did not wait for its layers' events read zeros instead of the gradient (an
// 80 KB copy from pinned memory alone would usually be done before the bucket starts).
__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
void hold(cudaStream_t s) {
#if defined(GRAVAC_CUDA_HOST_DOUBLE)
  // The double runs a stream only when something waits for it, so the copy after this is
  // late whatever the spin; its clock64 counts nanoseconds, and 2 ms per layer only costs time.
  gravac::detail::launch(&spin_kernel, 1, 1, s, 20'000LL);
#else
  gravac::detail::launch(&spin_kernel, 1, 1, s, 2'000'000LL);
#endif
}

// Three steps of the synchronous and of the asynchronous device step with the same options
// on the same gradients: the averaged gradients, residuals and reports agree bit for bit.
// \p compressor_stream: the compressors' stream (default: the per-thread default stream);
// with a non-blocking one nothing but the layers' events orders the buckets after the
// copies, whichever stream the copies are on.
template <class K>
void async_equals_sync(gravac::nccl_communicator& comm, std::size_t bucket_bytes, gravac::non_finite_action on_bad,
                       hand_over how, gravac::stream_ref compressor_stream = {}) {
  const int r = comm.rank();
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {20011}, gravac::layer_kind::dense);
  using T = gravac::trainer<gravac::topk_cuda, K, gravac::fixed_policy>;
  typename T::options opt;
  opt.policy.kept_fraction = 0.05;
  opt.bucket_bytes = bucket_bytes;
  opt.on_non_finite = on_bad;
  opt.compressor.stream = compressor_stream;
  T sync(comm, lay, opt), async(comm, lay, opt);
  REQUIRE(async.bucket_count() == sync.bucket_count());
  REQUIRE((async.bucket_count() == 1) == (bucket_bytes == gravac::one_bucket));  // per layer: the empty one rides along
  gravac::cuda_stream user_stream;  // non-blocking: nothing orders it with the trainer's streams but the events
  for (std::uint64_t step = 0; step < 3; ++step) {
    INFO("step " << step);
    const auto h = gravac::test::make_data(lay.numel(), 700 * step + static_cast<std::uint64_t>(r));
    gravac::pinned_buffer<float> staged(h.size());  // pinned, so the copies below are truly asynchronous
    std::copy(h.begin(), h.end(), staged.data());
    auto gs = to_device(h);
    const auto& rs = sync.step(gravac::device_view(gs));
    const gravac::step_report want = rs;

    auto ga = to_device(std::vector<float>(lay.numel(), 0.0f));
    async.begin_step(gravac::device_view(ga));
    std::vector<std::size_t> order(lay.size());
    std::iota(order.rbegin(), order.rend(), std::size_t{0});  // last layer first
    if (how == hand_over::scrambled) {
      std::mt19937 rng(static_cast<unsigned>(31 * step + static_cast<std::uint64_t>(r)));
      std::shuffle(order.begin(), order.end(), rng);
    }
    const cudaStream_t s = how == hand_over::reverse_on_stream ? user_stream.ref().get() : cudaStreamLegacy;
    for (const std::size_t i : order) {
      const auto& l = lay[i];
      hold(s);
      if (l.numel)
        GRAVAC_TRY_CUDA(cudaMemcpyAsync(ga.data() + l.offset, staged.data() + l.offset, l.numel * sizeof(float),
                                        cudaMemcpyHostToDevice, s));
      if (how == hand_over::one_left_out && i == 1) continue;
      if (how == hand_over::reverse_on_stream)
        async.ready(i, s);
      else
        async.ready(i);
    }
    const auto& ra = async.finish();
    GRAVAC_TRY_CUDA(cudaStreamSynchronize(s));  // the copies are done (finish() ordered after them)
    require_same_report(ra, want);
    const auto got_s = to_host(gs.data(), gs.size()), got_a = to_host(ga.data(), ga.size());
    REQUIRE(std::memcmp(got_a.data(), got_s.data(), got_s.size() * sizeof(float)) == 0);
    const auto es = to_host(sync.residual_view().data(), lay.numel());
    const auto ea = to_host(async.residual_view().data(), lay.numel());
    REQUIRE(std::memcmp(ea.data(), es.data(), es.size() * sizeof(float)) == 0);
  }
  REQUIRE(async.steps() == sync.steps());
}

// The cases of a sweep over bucket size x action on non-finite values x hand-over x
// collective: the full product on a GPU; on the host double a pairwise cover on 2 ranks (16
// of 64, 7 of 24) and every level once on more (4 and 3 cases: what more ranks add is the
// collectives' size, which the cover on 2 ranks does not need again).
std::vector<std::vector<int>> sweep_cases(const std::vector<int>& levels, [[maybe_unused]] int ranks) {
#if defined(GRAVAC_CUDA_HOST_DOUBLE)
  if (ranks > 2) return gravac::test::each_level_cases(levels);
#endif
  return gravac::test::device_sweep_cases(levels);
}

void async_sweep(gravac::nccl_communicator& comm, const std::vector<std::size_t>& buckets,
                 const std::vector<gravac::non_finite_action>& actions, const std::vector<hand_over>& hand_overs,
                 gravac::stream_ref compressor_stream = {}) {
  const auto cases = sweep_cases(
      {static_cast<int>(buckets.size()), static_cast<int>(actions.size()), static_cast<int>(hand_overs.size()), 2},
      comm.size());
  for (const auto& c : cases) {
    const std::size_t bb = buckets[static_cast<std::size_t>(c[0])];
    const auto on_bad = actions[static_cast<std::size_t>(c[1])];
    const auto how = hand_overs[static_cast<std::size_t>(c[2])];
    INFO("bucket_bytes " << bb << ", on_non_finite " << static_cast<int>(on_bad) << ", hand-over "
                         << static_cast<int>(how) << ", " << (c[3] == 0 ? "allgather" : "dense_allreduce"));
    if (c[3] == 0)
      async_equals_sync<gravac::allgather>(comm, bb, on_bad, how, compressor_stream);
    else
      async_equals_sync<gravac::dense_allreduce>(comm, bb, on_bad, how, compressor_stream);
  }
}

}  // namespace

TEST_CASE("the asynchronous device step over NCCL equals the synchronous one bit for bit (topk_cuda)") {
  gravac::nccl_communicator comm(world());
  async_sweep(comm, {gravac::bucket_per_layer, gravac::one_bucket},
              {gravac::non_finite_action::throw_error, gravac::non_finite_action::zero_values,
               gravac::non_finite_action::ignore, gravac::non_finite_action::skip_step},
              {hand_over::reverse, hand_over::scrambled, hand_over::reverse_on_stream, hand_over::one_left_out});
}

// One asynchronous step sequence, small, for compute-sanitizer (scripts/gpu-check).
TEST_CASE("the asynchronous device step equals the synchronous one: one case (compute-sanitizer)", "[sanitize]") {
  gravac::nccl_communicator comm(world());
  async_equals_sync<gravac::allgather>(comm, gravac::one_bucket, gravac::non_finite_action::throw_error,
                                       hand_over::reverse);
}

TEST_CASE("the asynchronous device step on streams of its own (compressors and NCCL) equals the synchronous one") {
  // What docs/overlap.md recommends for overlap: non-blocking streams, which the legacy
  // stream does not order, so every hand-over depends on the layers' events.
  gravac::cuda_stream compressor_stream, nccl_stream;
  gravac::nccl_communicator comm(world(), {.stream = nccl_stream.ref()});
  async_sweep(comm, {gravac::bucket_per_layer, gravac::one_bucket},
              {gravac::non_finite_action::throw_error, gravac::non_finite_action::skip_step},
              {hand_over::reverse, hand_over::reverse_on_stream, hand_over::one_left_out}, compressor_stream.ref());
}

TEST_CASE("the asynchronous device step refuses misuse clearly and stays usable") {
  gravac::nccl_communicator comm(world());
  auto lay = gravac::test::mixed_layout();
  using T = gravac::trainer<gravac::topk_cuda, gravac::allgather, gravac::fixed_policy>;
  T::options opt;
  opt.policy.kept_fraction = 0.1;
  opt.bucket_bytes = gravac::bucket_per_layer;
  opt.on_non_finite = gravac::non_finite_action::ignore;  // buckets run before finish()
  auto g = to_device(gravac::test::make_data(lay.numel(), 11 + static_cast<std::uint64_t>(comm.rank())));
  T t(comm, lay, opt);  // after g: the gradient must outlive a step the trainer may abandon
  CHECK_THROWS_WITH(t.ready(0), Catch::Contains("no asynchronous step in progress"));
  CHECK_THROWS_WITH(t.finish(), Catch::Contains("no asynchronous step in progress"));
  t.begin_step(gravac::device_view(g));
  CHECK_THROWS_WITH(t.begin_step(gravac::device_view(g)), Catch::Contains("already in progress"));
  CHECK_THROWS_WITH(t.step(gravac::device_view(g)), Catch::Contains("already in progress"));
  CHECK_THROWS_WITH(t.ready(lay.size()), Catch::Contains("outside the layout"));
  gravac::cuda_stream s;
  t.ready(5, s.ref());
  CHECK_THROWS_WITH(t.ready(5), Catch::Contains("'tail' was already marked ready"));
  CHECK_THROWS_WITH(t.ready(5, s.ref().get()), Catch::Contains("'tail' was already marked ready"));
  const auto& r = t.finish();  // takes the layers never marked (every rank the same ones)
  CHECK(r.buckets == t.bucket_count());
  CHECK_FALSE(t.step_in_progress());
  CHECK(t.steps() == 1);
  CHECK_NOTHROW(t.step(gravac::device_view(g)));
  CHECK(t.steps() == 2);
}

TEST_CASE("a non-finite gradient ends the asynchronous device step on every rank at its bucket, nothing lost") {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank();
  const auto lay = gravac::test::mixed_layout();  // buckets: tail | fc2 | fc1 + empty | conv1.bias | conv1.weight
  using T = gravac::trainer<gravac::topk_cuda, gravac::allgather, gravac::fixed_policy>;
  T::options opt;
  opt.policy.kept_fraction = 0.2;
  opt.bucket_bytes = gravac::bucket_per_layer;  // on_non_finite: throw_error, agreed per bucket
  auto h = gravac::test::make_data(lay.numel(), 40 + static_cast<std::uint64_t>(r));
  if (r == 0) h[lay[2].offset + 7] = std::numeric_limits<float>::quiet_NaN();
  auto g = to_device(h);
  T t(comm, lay, opt);  // after g, which must outlive the step
  t.begin_step(gravac::device_view(g));
  for (std::size_t i = lay.size(); i-- > 0;) t.ready(i);
  std::string what;
  try {
    t.finish();
  } catch (const gravac::error& e) {
    CHECK(e.code() == gravac::status::non_finite);
    what = e.what();
  }
  if (r == 0)
    CHECK_THAT(what, Catch::Contains("layer 'fc1.weight'"));
  else
    CHECK_THAT(what, Catch::Contains("rank 0's gradient"));
  CHECK(t.steps() == 0);  // the step did not count
  // tail and fc2 were sent and given back: their residual is u = g + e = g (e was 0); from
  // fc1's bucket on nothing was sent: residual 0, gradient as the caller wrote it.
  const auto e = to_host(t.residual_view().data(), lay.numel());
  const auto got = to_host(g.data(), g.size());
  for (std::size_t i = 0; i < lay.size(); ++i) {
    const auto& l = lay[i];
    INFO("layer " << l.name);
    for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) REQUIRE(e[j] == (i >= 4 ? h[j] : 0.0f));
    if (i < 4) REQUIRE(std::memcmp(got.data() + l.offset, h.data() + l.offset, l.numel * sizeof(float)) == 0);
  }
  auto ok = to_device(gravac::test::make_data(lay.numel(), 50 + static_cast<std::uint64_t>(r)));
  CHECK_NOTHROW(t.step(gravac::device_view(ok)));
  CHECK(t.steps() == 1);
}

TEST_CASE("skip_step in the asynchronous device step: a NaN on one rank skips the step on every rank") {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank();
  const auto lay = gravac::test::mixed_layout();
  using T = gravac::trainer<gravac::topk_cuda, gravac::allgather, gravac::fixed_policy>;
  T::options opt;
  opt.policy.kept_fraction = 0.2;
  opt.bucket_bytes = gravac::bucket_per_layer;
  opt.on_non_finite = gravac::non_finite_action::skip_step;  // agreed in finish(), before anything is sent
  auto h = gravac::test::make_data(lay.numel(), 60 + static_cast<std::uint64_t>(r));
  if (r == 0) h[lay[2].offset + 3] = std::numeric_limits<float>::infinity();
  auto g = to_device(h);
  T t(comm, lay, opt);  // after g, which must outlive the step
  t.begin_step(gravac::device_view(g));
  for (std::size_t i = lay.size(); i-- > 0;) t.ready(i);
  const auto& rep = t.finish();
  CHECK(rep.skipped);
  // Every rank: the gradient zeroed, the residual untouched (zero), nothing sent.
  const auto got = to_host(g.data(), g.size());
  const auto e = to_host(t.residual_view().data(), lay.numel());
  for (std::size_t j = 0; j < lay.numel(); ++j) {
    REQUIRE(got[j] == 0.0f);
    REQUIRE(e[j] == 0.0f);
  }
  CHECK(rep.bytes_sent == 0);
}

namespace {

using seconds_since = std::chrono::duration<double>;

// How many ranks of the MPI world pass true (an MPI allreduce, outside NCCL).
int ranks_with(bool yes) {
  std::vector<double> v = {yes ? 1.0 : 0.0};
  world().allreduce_sum(std::span<double>(v));
  return static_cast<int>(v[0]);
}

// What one call on a communicator threw (nothing: no code) and how long it took.
struct outcome {
  std::optional<gravac::status> code;
  int engine_code = 0;
  std::string what;
  double seconds = 0;
};
template <class F>
outcome run_timed(F&& f) {
  outcome o;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const gravac::error& e) {
    o.code = e.code();
    o.engine_code = e.engine_code();
    o.what = e.what();
  }
  o.seconds = seconds_since(std::chrono::steady_clock::now() - t0).count();
  return o;
}

// An error a collective may end with when a peer's communicator is gone: this rank's
// timeout, or NCCL's report of a failed peer.
bool peer_failure(const outcome& o) {
  if (o.code == gravac::status::timeout) return true;
#if defined(GRAVAC_CUDA_HOST_DOUBLE)
  // The double reports a peer's ncclCommAbort to every other rank, as ncclRemoteError.
  return o.code == gravac::status::backend_failure && o.engine_code == static_cast<int>(ncclRemoteError);
#else
  // NCCL may notice the peer's closed connections (ncclRemoteError, or ncclSystemError from
  // its proxy), or leave the wait to the timeout.
  return o.code == gravac::status::backend_failure;
#endif
}

}  // namespace

TEST_CASE("nccl_communicator: a collective the last rank never calls times out on the others and nothing hangs") {
  static_assert(std::is_same_v<decltype(gravac::nccl_options{}.timeout_s), double>);
  const int n = world().size(), r = world().rank();
  std::optional<gravac::nccl_communicator> comm;
  comm.emplace(world(), gravac::nccl_options{.timeout_s = 1});
  REQUIRE(comm->size() == n);
  world().barrier();  // every rank has joined: the timeouts below cannot fail a peer's join
  const bool waits = r != n - 1;
  outcome o;
  if (waits) {
    std::vector<double> v = {1.0 + r, -2.0};
    const auto before = v;
    o = run_timed([&] { comm->allreduce_sum(std::span<double>(v)); });
    INFO("rank " << r << " after " << o.seconds << " s: " << o.what);
    CHECK(o.code.has_value());  // CHECK, not REQUIRE: every rank must reach the barriers below
    // Its own timeout (1 s), or, with three or more ranks, the abort of a rank whose timeout
    // fired first (its communicator aborted, NCCL fails the others' pending operation).
    CHECK(peer_failure(o));
    CHECK(o.seconds >= (o.code == gravac::status::timeout ? 1.0 : 0.0));
    CHECK(o.seconds < 10.0);  // a few seconds, not a hang
    if (o.code == gravac::status::timeout) {
      CHECK_THAT(o.what, Catch::Contains("ncclAllReduce(double, sum)") && Catch::Contains("not complete after"));
    }
    CHECK(v == before);  // a failed reduction leaves the values as they were
  }
  // At least one waiting rank timed out by itself (the first whose deadline passed).
  CHECK(ranks_with(waits && o.code == gravac::status::timeout) >= 1);
  world().barrier();  // every rank past the collective, over MPI
  // Destroyed without hanging: the failed communicators were aborted; the last rank's,
  // which never joined the collective, finalizes (or aborts after timeout_s).
  const auto t0 = std::chrono::steady_clock::now();
  comm.reset();
  const double destroy_s = seconds_since(std::chrono::steady_clock::now() - t0).count();
  INFO("rank " << r << " destroyed its communicator in " << destroy_s << " s");
  CHECK(destroy_s < 10.0);
  world().barrier();
}

TEST_CASE("nccl_communicator::abort on rank 0: its later calls and the others' collectives fail and nothing hangs") {
  const int n = world().size(), r = world().rank();
  // 1. Rank 0 aborts before anyone calls; an MPI barrier; then every rank calls a
  // collective on the communicator: rank 0's own call is refused at once, the others'
  // fail (a peer's abort, or their timeout of 2 s) instead of waiting for rank 0.
  {
    gravac::nccl_communicator comm(world(), {.timeout_s = 2});
    // Every rank has joined before rank 0 aborts (an abort during a peer's join fails the
    // join: its constructor would throw, as on 4 ranks of the host double without this).
    world().barrier();
    if (r == 0) {
      comm.abort();
      comm.abort();  // a second abort does nothing
    }
    world().barrier();
    auto fd = to_device(std::vector<float>(1000, 1.0f));
    const auto o = run_timed([&] { comm.allreduce_sum(fd.span()); });
    INFO("rank " << r << " after " << o.seconds << " s: " << o.what);
    CHECK(o.code.has_value());  // CHECK, not REQUIRE: every rank must reach the barriers below
    CHECK(o.seconds < 10.0);
    if (r == 0)
      CHECK(o.code == gravac::status::aborted);  // refused by the communicator, not left to NCCL
    else
      CHECK(peer_failure(o));
    const auto back = to_host(fd.data(), fd.size());
    CHECK(std::all_of(back.begin(), back.end(), [](float x) { return x == 1.0f; }));  // untouched
    if (r == 0) {  // and every later call on it, host values too
      std::vector<double> d = {1.0};
      const auto o2 = run_timed([&] { comm.allreduce_sum(std::span<double>(d)); });
      INFO(o2.what);
      CHECK(o2.code == gravac::status::aborted);
      CHECK(d[0] == 1.0);
    }
    world().barrier();
  }  // destroyed: aborted ones release nothing more, none waits
  world().barrier();
  // 2. The other ranks are inside a collective (or about to enter it) when rank 0 aborts;
  // rank 0 never calls it. They fail instead of waiting for rank 0.
  if (n >= 2) {
    std::optional<gravac::nccl_communicator> comm;
    comm.emplace(world(), gravac::nccl_options{.timeout_s = 2});
    world().barrier();
    outcome o;
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      comm->abort();
    } else {
      std::vector<double> v = {static_cast<double>(r)};
      o = run_timed([&] { comm->allreduce_sum(std::span<double>(v)); });
      INFO("rank " << r << " after " << o.seconds << " s: " << o.what);
      CHECK(o.code.has_value());
      CHECK(peer_failure(o));
      CHECK(o.seconds < 10.0);
      CHECK(v[0] == static_cast<double>(r));
    }
    world().barrier();
    const auto t0 = std::chrono::steady_clock::now();
    comm.reset();
    CHECK(seconds_since(std::chrono::steady_clock::now() - t0).count() < 10.0);
  }
  world().barrier();
}
