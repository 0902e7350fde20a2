// The compressed allreduce (reduce-scatter of compressed shards, fp32 sum, recompression
// with a server residual, Allgather) on thread ranks: equal, bit for bit on every rank, to a
// serial reference of the two stages, including both residuals; the shard split; the wire
// bytes against the simulated network's counts; malformed shards rejected before anything
// is touched; the server residual saved and restored.
#include <catch2/catch.hpp>
#include <cstring>

#include "gravac/collective/compressed_allreduce.hpp"
#include "gravac/trainer/detail/checkpoint_agreement.hpp"
#include "gravac_test_util.hpp"
#include "two_stage_reference.hpp"

using namespace gravac;

static_assert(detail::has_state<compressed_allreduce>, "the server residual must ride in checkpoints");

namespace {

// mixed_layout plus a layer smaller than the rank counts tested (empty shards).
layout shard_test_layout() {
  layout l = test::mixed_layout();
  l.add("tiny", {3}, layer_kind::bias_or_norm);
  return l;
}

using gravac::test::two_stage_reference;

template <class C>
void check_against_reference(int n, const typename C::options& copt, const std::string& name) {
  using T = trainer<C, compressed_allreduce, fixed_policy>;
  const layout lay = shard_test_layout();
  constexpr int steps = 4;
  typename T::options opt;
  opt.compressor = copt;
  std::vector<std::vector<std::vector<float>>> results(steps, std::vector<std::vector<float>>(n));
  std::vector<std::vector<float>> res(n), srv(n);
  std::vector<int> kind_ok(n, 0);
  run_ranks(n, [&](thread_communicator& comm) {
    T t(comm, lay, opt);
    const auto r = static_cast<std::size_t>(comm.rank());
    for (int s = 0; s < steps; ++s) {
      auto g = test::make_data(lay.numel(), 100 * s + r + 1,
                               s % 2 ? test::distribution::laplace : test::distribution::gaussian);
      const auto& rep = t.step(g);
      kind_ok[r] += rep.collective == collective_kind::compressed_allreduce;
      results[static_cast<std::size_t>(s)][r] = g;
    }
    res[r].assign(t.residual().begin(), t.residual().end());
    const auto sr = t.collective().server_residual();
    srv[r].assign(sr.begin(), sr.end());
  });
  std::vector<std::vector<float>> e(n, std::vector<float>(lay.numel(), 0.0f)), server;
  fixed_policy pol(lay, opt.policy);
  for (int s = 0; s < steps; ++s) {
    step_params p = test::params_for(lay, 0.01, static_cast<std::uint64_t>(s), opt.seed);
    pol.plan(p);
    p.ranks = n;
    std::vector<std::vector<float>> g(n);
    for (int r = 0; r < n; ++r)
      g[static_cast<std::size_t>(r)] = test::make_data(
          lay.numel(), 100 * s + r + 1, s % 2 ? test::distribution::laplace : test::distribution::gaussian);
    const auto ref = two_stage_reference<C>(lay, copt, p, g, e, server);
    for (int r = 0; r < n; ++r) {
      INFO(name << " on " << n << " ranks, step " << s << ", rank " << r);
      const auto& got = results[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
      std::size_t first = 0;
      while (first < ref.size() && got[first] == ref[first]) ++first;
      INFO("first difference at " << first << " of " << ref.size()
                                  << (first < ref.size()
                                          ? " got " + std::to_string(got[first]) + " want " + std::to_string(ref[first])
                                          : ""));
      CHECK(got == ref);
    }
  }
  for (int r = 0; r < n; ++r) {
    INFO(name << " on " << n << " ranks, rank " << r);
    CHECK(kind_ok[static_cast<std::size_t>(r)] == steps);
    CHECK(res[static_cast<std::size_t>(r)] == e[static_cast<std::size_t>(r)]);
    CHECK(srv[static_cast<std::size_t>(r)] == server[static_cast<std::size_t>(r)]);
  }
}

}  // namespace

TEST_CASE("shard_plan splits every layer into balanced contiguous shards and gathers back exactly",
          "[compressed_allreduce]") {
  const layout lay = shard_test_layout();
  for (std::size_t n : {1u, 3u, 4u, 8u, 40u}) {
    const detail::shard_plan plan(lay, n);
    REQUIRE(plan.size() == n);
    std::size_t total = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const layout& s = plan.shard_layout(j);
      REQUIRE(s.size() == lay.size());
      CHECK(plan.start(j) == total);
      total += plan.numel(j);
      for (std::size_t i = 0; i < lay.size(); ++i) {
        const std::size_t m = s[i].numel;
        CHECK(m >= lay[i].numel / n);
        CHECK(m <= lay[i].numel / n + 1);
        CHECK(s[i].id != lay[i].id);
      }
    }
    CHECK(total == lay.numel());
    const auto g = test::make_data(lay.numel(), 5);
    std::vector<float> staged(lay.numel(), 0.0f), back(lay.numel(), 0.0f);
    for (std::size_t j = 0; j < n; ++j) plan.gather(j, g.data(), staged.data() + plan.start(j));
    for (std::size_t j = 0; j < n; ++j) plan.scatter(j, staged.data() + plan.start(j), back.data());
    CHECK(back == g);
  }
}

TEST_CASE("compressed allreduce equals the serial two-stage reference on 3, 4 and 8 thread ranks",
          "[compressed_allreduce]") {
  for (int n : {3, 4, 8}) {
    check_against_reference<qsgd>(n, {}, "qsgd 8-bit");
    check_against_reference<sign>(n, {}, "EF-sign");
    check_against_reference<terngrad>(n, {}, "terngrad");
    check_against_reference<cast16>(n, {}, "cast16");
  }
}

TEST_CASE("compressed allreduce reports the wire bytes the simulated network counts", "[compressed_allreduce]") {
  // And sends far less than a dense fp32 ring Allreduce: QSGD 8-bit about 1/4, EF-sign 1/32.
  constexpr int n = 8;
  layout lay;
  lay.add("w", {256, 64}, layer_kind::dense);
  lay.add("b", {64}, layer_kind::bias_or_norm);
  std::vector<double> reported_out(n), reported_in(n), counted_out(n), counted_in(n), ratio_q(n), ratio_s(n);
  run_ranks(n, [&](thread_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    simulated_communicator<thread_communicator> sim(comm, network_profile::constant({}));
    trainer<qsgd, compressed_allreduce, fixed_policy> tq(sim, lay);
    trainer<sign, compressed_allreduce, fixed_policy> ts(sim, lay);
    const double dense = 2.0 * (n - 1) / n * 4.0 * static_cast<double>(lay.numel());
    auto g = test::make_data(lay.numel(), r + 1);
    const double out0 = sim.wire_bytes_sent(), in0 = sim.wire_bytes_received();
    const auto& rq = tq.step(g);
    reported_out[r] = rq.wire_bytes_sent;
    reported_in[r] = rq.wire_bytes_received;
    counted_out[r] = sim.wire_bytes_sent() - out0;
    counted_in[r] = sim.wire_bytes_received() - in0;
    ratio_q[r] = rq.wire_bytes_sent / dense;
    g = test::make_data(lay.numel(), r + 1);
    ratio_s[r] = ts.step(g).wire_bytes_sent / dense;
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(reported_out[static_cast<std::size_t>(r)] == counted_out[static_cast<std::size_t>(r)]);
    CHECK(reported_in[static_cast<std::size_t>(r)] == counted_in[static_cast<std::size_t>(r)]);
    CHECK(ratio_q[static_cast<std::size_t>(r)] < 0.3);
    CHECK(ratio_s[static_cast<std::size_t>(r)] < 0.05);
  }
}

namespace {
// A thread engine whose alltoallv hands this rank a damaged block from rank `bad` (its
// first byte flipped): the reduce-scatter's validation must catch it. Test-only.
struct damaging_communicator : thread_communicator {
  damaging_communicator(thread_team& team, int rank, int bad) : thread_communicator(team, rank), bad_(bad) {}
  void alltoallv(std::span<const std::byte> in, std::span<const std::size_t> ss, byte_buffer& out,
                 std::vector<std::size_t>& rs) {
    thread_communicator::alltoallv(in, ss, out, rs);
    std::size_t at = 0;
    for (int r = 0; r < bad_; ++r) at += rs[static_cast<std::size_t>(r)];
    if (rs[static_cast<std::size_t>(bad_)] > 0) out[at] ^= std::byte{0xff};
  }
  int bad_;
};
}  // namespace

TEST_CASE("compressed allreduce rejects a damaged shard before touching the gradient or the server residual",
          "[compressed_allreduce]") {
  constexpr int n = 4;
  const layout lay = shard_test_layout();
  thread_team team(n, std::chrono::seconds(20));
  std::vector<int> failed_with(n, -2), grad_intact(n, 0), server_intact(n, 0);
  std::vector<std::string> messages(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      damaging_communicator comm(team, r, 2);
      compressed_allreduce k(lay);
      qsgd c(lay);
      k.prepare(c);
      auto g = test::make_data(lay.numel(), r + 1);
      const auto g0 = g;
      std::vector<float> e(lay.numel(), 0.0f);
      step_params p = test::params_for(lay, 0.01);
      p.ranks = n;
      compress_stats st;
      step_report rep;
      step_buffers<host_space> buf{grad_view<host_space>(g.data(), g.size()),
                                   grad_view<host_space>(e.data(), e.size())};
      try {
        k.aggregate(c, comm, buf, p, st, rep);
      } catch (const error& x) {
        const bool names_sender = std::string(x.what()).find("from rank 2") != std::string::npos;
        failed_with[static_cast<std::size_t>(r)] = x.code() == status::malformed_packet && names_sender ? 2 : -1;
        messages[static_cast<std::size_t>(r)] = x.what();
      }
      grad_intact[static_cast<std::size_t>(r)] = g == g0;
      server_intact[static_cast<std::size_t>(r)] =
          std::all_of(k.server_residual().begin(), k.server_residual().end(), [](float x) { return x == 0.0f; });
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << messages[static_cast<std::size_t>(r)]);
    CHECK(failed_with[static_cast<std::size_t>(r)] == 2);  // names the sender of the damaged shard
    CHECK(grad_intact[static_cast<std::size_t>(r)]);
    CHECK(server_intact[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("compressed allreduce's server residual round-trips through save and load, and bad blobs are refused",
          "[compressed_allreduce]") {
  constexpr int n = 4;
  const layout lay = shard_test_layout();
  std::vector<std::vector<std::byte>> blobs(n);
  std::vector<std::vector<float>> servers(n);
  run_ranks(n, [&](thread_communicator& comm) {
    trainer<qsgd, compressed_allreduce, fixed_policy> t(comm, lay);
    for (int s = 0; s < 3; ++s) {
      auto g = test::make_data(lay.numel(), 10 * s + comm.rank());
      t.step(g);
    }
    t.collective().save(blobs[static_cast<std::size_t>(comm.rank())]);
    const auto sr = t.collective().server_residual();
    servers[static_cast<std::size_t>(comm.rank())].assign(sr.begin(), sr.end());
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    compressed_allreduce k(lay);
    qsgd c(lay);
    k.prepare(c);
    k.load(blobs[static_cast<std::size_t>(r)]);
    CHECK(std::vector<float>(k.server_residual().begin(), k.server_residual().end()) ==
          servers[static_cast<std::size_t>(r)]);
    CHECK(k.plan().size() == static_cast<std::size_t>(n));
    std::vector<std::byte> again;
    k.save(again);
    CHECK(again == blobs[static_cast<std::size_t>(r)]);
    CHECK(std::any_of(servers[static_cast<std::size_t>(r)].begin(), servers[static_cast<std::size_t>(r)].end(),
                      [](float x) { return x != 0.0f; }));
  }
  // Refused, and nothing changed: truncated, another layout, another rank count.
  compressed_allreduce k(lay);
  qsgd c(lay);
  k.prepare(c);
  k.load(blobs[1]);
  const std::vector<float> before(k.server_residual().begin(), k.server_residual().end());
  auto cut = blobs[1];
  cut.resize(cut.size() - 3);
  CHECK_THROWS_AS(k.load(cut), error);
  compressed_allreduce other(layout::flat(lay.numel()));
  CHECK_THROWS_AS(other.load(blobs[1]), error);
  auto ranks = blobs[1];
  const std::uint64_t eight = 8;
  std::memcpy(ranks.data() + 8, &eight, 8);
  CHECK_THROWS_AS(k.load(ranks), error);
  CHECK(std::vector<float>(k.server_residual().begin(), k.server_residual().end()) == before);
}
