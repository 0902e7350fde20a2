// Runs under mpiexec with 4 ranks: AR-Topk on real MPI equals the serial reference on
// every rank, the residual invariant holds, STAR rotates and VAR picks the loudest rank;
// the flexible collective over a simulated network chooses the same on every rank.
#include <catch2/catch.hpp>

#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/collective/flexible.hpp"
#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/comm/simulated_communicator.hpp"
#include "gravac_test_util.hpp"
#include "topk_reference.hpp"

using namespace gravac;

namespace {
// Every rank's copy of \p v is identical (bitwise): compare min and max over ranks.
bool same_on_all_ranks(mpi_communicator& comm, std::span<const float> v) {
  std::vector<double> lo(v.begin(), v.end()), hi(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) hi[i] = -lo[i];
  comm.allreduce_max(lo);
  comm.allreduce_max(hi);
  for (std::size_t i = 0; i < v.size(); ++i)
    if (lo[i] != -hi[i]) return false;
  return true;
}
int min_over_ranks(mpi_communicator& comm, int x) {
  std::vector<double> v{-static_cast<double>(x)};
  comm.allreduce_max(v);
  return static_cast<int>(-v[0]);
}
}  // namespace

TEST_CASE("MPI: AR-Topk STAR equals the serial reference on every rank", "[mpi][ar_topk]") {
  mpi_communicator comm;
  const int n = comm.size();
  const auto lay = test::mixed_layout();
  using T = trainer<topk, allreduce_compatible, fixed_policy>;
  for (double f : {0.02, 0.3}) {
    T::options opt;
    opt.policy.kept_fraction = f;
    opt.policy.one_dim_dense = true;
    T t(comm, lay, opt);
    fixed_policy pol(lay, opt.policy);
    std::vector<std::vector<float>> e(n, std::vector<float>(lay.numel(), 0.0f));
    for (int s = 0; s < 5; ++s) {
      auto g = test::make_data(lay.numel(), 500 * s + comm.rank() + 1);
      t.step(g);
      CHECK(t.collective().last_root() == s % n);  // STAR rotates
      // Serial replay of every rank: u = g + e; indices of the root's top-k; mean of u there.
      step_params p = test::params_for(lay, f, static_cast<std::uint64_t>(s));
      pol.plan(p);
      std::vector<std::vector<float>> u(n);
      for (int r = 0; r < n; ++r) {
        u[r] = test::make_data(lay.numel(), 500 * s + r + 1);
        for (std::size_t j = 0; j < u[r].size(); ++j) u[r][j] += e[r][j];
      }
      std::vector<float> ref(lay.numel(), 0.0f);
      std::vector<std::uint64_t> order, sel;
      for (std::size_t i = 0; i < lay.size(); ++i) {
        const auto& l = lay[i];
        sel.clear();
        if (p.kept_fraction[i] >= 1)
          for (std::size_t j = 0; j < l.numel; ++j) sel.push_back(j);
        else
          test::select_topk_reference(std::span<const float>(u[s % n].data() + l.offset, l.numel),
                                      kept_count(l.numel, p.kept_fraction[i]), order, sel);
        for (auto ix : sel) {
          double sum = 0;
          for (int r = 0; r < n; ++r) sum += u[r][l.offset + ix];
          ref[l.offset + ix] = static_cast<float>(sum / n);
          for (int r = 0; r < n; ++r) u[r][l.offset + ix] = 0.0f;
        }
      }
      e = u;
      INFO("f " << f << " step " << s << " rank " << comm.rank());
      CHECK(test::max_rel_diff(g, ref) < 1e-5);
      CHECK(same_on_all_ranks(comm, g));
      // The residual invariant, exactly: e is u where unsent, 0 where sent.
      CHECK(std::equal(t.residual().begin(), t.residual().end(), e[comm.rank()].begin()));
    }
  }
}

TEST_CASE("MPI: AR-Topk VAR picks the rank with the largest smoothed norm", "[mpi][ar_topk]") {
  mpi_communicator comm;
  const int n = comm.size();
  layout lay;
  lay.add("w", {16, 16}, layer_kind::dense);
  trainer<topk, allreduce_compatible, fixed_policy>::options opt;
  opt.policy.kept_fraction = 0.1;
  opt.collective.rule = index_rank_rule::var;
  opt.collective.norm_smoothing = 1.0;  // no memory: the loudest rank of the previous step
  trainer<topk, allreduce_compatible, fixed_policy> t(comm, lay, opt);
  // The norms ride in the step's value Allreduce: step s uses those of step s - 1 (rank 0 first).
  int previous_loud = 0;
  for (int s = 0; s < n + 1; ++s) {
    const int loud = (s * 3 + 1) % n;
    auto g = test::make_data(lay.numel(), 9);
    for (auto& x : g) x *= comm.rank() == loud ? 4.0f : 1.0f;
    t.step(g);
    CHECK(t.collective().last_root() == previous_loud);
    previous_loud = loud;
  }
  // Equal norms: the lowest rank.
  auto g = test::make_data(lay.numel(), 9);
  for (int s = 0; s < 3; ++s) {
    auto h = g;
    t.step(h);
  }
  CHECK(t.collective().last_root() == 0);
}

TEST_CASE("MPI: the flexible collective over a simulated schedule chooses the same on every rank", "[mpi][flexible]") {
  mpi_communicator comm;
  layout lay;
  lay.add("fc1.weight", {100, 97}, layer_kind::dense);
  lay.add("fc2.weight", {10, 100}, layer_kind::dense);
  auto sched = std::make_shared<network_profile>(network_profile::schedule(
      {{2, network_params::from_gbps(1e-6, 1)}, {2, network_params::from_gbps(32e-3, 25)}}, profile_index::step));
  simulated_communicator<mpi_communicator> sim(comm, *sched);
  trainer<topk, flexible, fixed_policy>::options opt;
  opt.policy.kept_fraction = 0.1;
  opt.collective.source = network_source::profile;
  opt.collective.profile = sched;
  opt.collective.charge_codec = false;  // the network model alone decides here
  trainer<topk, flexible, fixed_policy> t(sim, lay, opt);
  int switches = 0;
  collective_kind prev = collective_kind::automatic;
  for (int s = 0; s < 8; ++s) {
    sim.set_step(static_cast<std::uint64_t>(s));
    auto g = test::make_data(lay.numel(), 3 * s + comm.rank());
    const auto kind = t.step(g).collective;
    CHECK(min_over_ranks(comm, static_cast<int>(kind)) == static_cast<int>(kind));
    CHECK(kind == (s / 2 % 2 == 0 ? collective_kind::allreduce_compatible : collective_kind::allgather));
    switches += s > 0 && kind != prev;
    prev = kind;
    CHECK(same_on_all_ranks(comm, g));
  }
  CHECK(switches == 3);
  std::vector<float> clock{static_cast<float>(sim.modeled_seconds())};
  CHECK(same_on_all_ranks(comm, clock));
}
