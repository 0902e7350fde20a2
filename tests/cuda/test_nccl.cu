// nccl_communicator with one rank per GPU (run under mpiexec): every collective against
// what it must produce, trainer<topk_cuda, allgather, fixed_policy> against the serial
// host reference, and trainer<topk_cuda, allreduce_compatible, fixed_policy> (AR-Topk's
// NCCL broadcast and Allreduce) against the host trainer on thread ranks. Skipped (exit 77)
// without a GPU.
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <vector>

#include "cuda_test_util.hpp"
#include "gravac/comm/nccl_communicator.hpp"
#include "gravac/cuda/topk_cuda.hpp"
#include "gravac/gravac.hpp"
#include "gravac_test_util.hpp"

namespace {

using gravac::test::to_device;
using gravac::test::to_host;

gravac::mpi_communicator& world() {
  static gravac::mpi_communicator m;
  return m;
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
    // The host reference: every rank on a thread of this process; rank r's outputs kept.
    std::vector<std::vector<float>> want_g(steps), want_e(steps);
    gravac::run_ranks(n, [&](gravac::thread_communicator& tc) {
      H t(tc, lay, host_opt);
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
