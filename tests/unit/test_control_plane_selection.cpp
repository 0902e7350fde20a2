// The control plane of a step, with the selection compressors: no collective besides the
// gradient's own for every collective and policy (counted by a test decorator around the
// thread communicator), and at 32 ms of modeled latency an adaptive policy's step costs
// what the same kept fraction costs under fixed_policy.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "control_plane_checks.hpp"
#include "gravac/comm/simulated_communicator.hpp"
#include "gravac/compress/randomk.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"

using namespace gravac;

TEST_CASE("control plane: top-k makes only the gradient's collectives", "[control_plane]") {
  test::check_control_plane_all<topk>();
}
TEST_CASE("control plane: threshold makes only the gradient's collectives", "[control_plane]") {
  test::check_control_plane_all<threshold>();
}
TEST_CASE("control plane: random-k makes only the gradient's collectives", "[control_plane]") {
  test::check_control_plane_all<randomk>();
}

namespace {
// Modeled seconds and collective calls of each step of trainer<topk, K, P> at 32 ms of
// latency and 1 Gbit/s, with the kept fraction each step used.
struct step_cost {
  double seconds = 0;
  std::uint64_t calls = 0;
  double fraction = 1;
};

template <class K, class P>
std::vector<step_cost> costs_at_32ms(const typename P::options& popt, int steps) {
  const auto lay = test::mixed_layout();
  std::vector<step_cost> out(static_cast<std::size_t>(steps));
  run_ranks(4, [&](thread_communicator& comm) {
    simulated_communicator<thread_communicator> net(comm,
                                                    network_profile::constant(network_params::from_gbps(32e-3, 1)));
    typename trainer<topk, K, P>::options o;
    o.policy = popt;
    trainer<topk, K, P> t(net, lay, o);
    for (int s = 0; s < steps; ++s) {
      auto g = test::rank_gradient(lay, s, comm.rank(), test::amplitude_at(s));
      const double before = net.modeled_seconds();
      const auto calls = net.calls();
      t.step(g);
      if (comm.rank() == 0)
        out[static_cast<std::size_t>(s)] = {net.modeled_seconds() - before, net.calls() - calls,
                                            t.last_params().global_fraction};
      if ((s + 1) % test::steps_per_epoch == 0)
        t.end_interval({static_cast<std::uint64_t>(s + 1), static_cast<std::uint64_t>((s + 1) / test::steps_per_epoch),
                        0.1, 160.0});
    }
  });
  return out;
}

// The same comparison for one adaptive policy P: each step against a fixed_policy step at
// its kept fraction. The only difference allowed is the control values' bytes (a few
// hundred bytes against a 64 ms latency: below 0.1% of the step).
template <class K, class P>
void check_no_dearer_than_fixed(const typename P::options& popt) {
  const auto adaptive = costs_at_32ms<K, P>(popt, 30);
  std::map<double, step_cost> fixed;
  for (const auto& c : adaptive)
    if (!fixed.count(c.fraction))
      fixed[c.fraction] = costs_at_32ms<K, fixed_policy>({.kept_fraction = c.fraction}, 1)[0];
  CHECK(fixed.size() >= 2);  // the policy did change the fraction
  for (std::size_t s = 0; s < adaptive.size(); ++s) {
    const auto& f = fixed[adaptive[s].fraction];
    INFO("step " << s << " fraction " << adaptive[s].fraction);
    CHECK(adaptive[s].calls == f.calls);
    CHECK(adaptive[s].seconds <= f.seconds * 1.001);
    CHECK(adaptive[s].seconds >= f.seconds);
  }
}
}  // namespace

TEST_CASE("control plane: at 32 ms an adaptive step costs what the same kept fraction costs under fixed_policy",
          "[control_plane][latency]") {
  SECTION("gravac_policy, allgather") {
    check_no_dearer_than_fixed<allgather, gravac_policy>(test::quick_policy_options<gravac_policy>());
  }
  SECTION("gravac_policy, allreduce_compatible") {
    check_no_dearer_than_fixed<allreduce_compatible, gravac_policy>(test::quick_policy_options<gravac_policy>());
  }
  SECTION("moo_policy, allgather") {
    check_no_dearer_than_fixed<allgather, moo_policy>(test::quick_policy_options<moo_policy>());
  }
  SECTION("accordion_policy, allgather (epochs of 5 steps)") {
    check_no_dearer_than_fixed<allgather, accordion_policy>({.compare_every = 1});
  }
}

TEST_CASE("control plane: GraVAC's dense fallback is a ring Allreduce of the gradient under allgather",
          "[control_plane][gravac]") {
  // eps = 1: no compressed ratio keeps all of the gradient, so every step after the warm-up
  // falls back to dense. Under the allgather collective that step must cost what a ring
  // Allreduce of the dense gradient costs (plus the control floats at its end), not an
  // Allgather of N raw segments, which moves N/2 times more.
  constexpr int n = 4;
  const auto lay = test::mixed_layout();
  const double d = static_cast<double>(lay.numel());
  const auto net = network_params::from_gbps(32e-3, 1);
  struct step_charge {
    double latency = 0, bytes = 0;
    std::uint64_t calls = 0;
    fallback_reason why = fallback_reason::none;
    collective_kind kind = collective_kind::automatic;
  };
  std::vector<step_charge> charges(8);
  run_ranks(n, [&](thread_communicator& comm) {
    simulated_communicator<thread_communicator> sim(comm, network_profile::constant(net));
    trainer<topk, allgather, gravac_policy> t(sim, lay, {.policy = {.warmup_steps = 2, .epsilon = 1.0}});
    for (int s = 0; s < 8; ++s) {
      auto g = test::rank_gradient(lay, s, comm.rank());
      const auto calls = sim.calls();
      const auto& rep = t.step(g);
      CHECK(rep.fallback == t.policy().fallback());  // the reason of the step the policy planned
      if (comm.rank() == 0)
        charges[static_cast<std::size_t>(s)] = {sim.last_charge().first.latency, sim.last_charge().first.bytes,
                                                sim.calls() - calls, rep.fallback, rep.collective};
    }
  });
  const double ring = 2.0 * (n - 1) / n;  // a ring Allreduce moves 2(N-1)/N of its buffer per rank
  for (std::size_t s = 2; s < charges.size(); ++s) {
    const auto& c = charges[s];
    INFO("step " << s);
    CHECK(c.why == fallback_reason::minimum_gain_below_eps);
    CHECK(c.kind == collective_kind::dense_allreduce);
    CHECK(c.calls == 1);
    CHECK(c.latency == 2.0 * (n - 1));
    const double control_bytes = c.bytes / ring - 4 * d;  // the floats riding at the end
    CHECK(control_bytes >= 0);
    CHECK(control_bytes <= 4 * (2 + 1 + 3 + 2 * lay.size() + 4));  // flag, gains, norms, kept, times
    CHECK(std::fmod(control_bytes, 4.0) == Approx(0).margin(1e-6));
  }
  CHECK(charges[0].why == fallback_reason::none);  // the warm-up sends at CF_min by design
  CHECK(charges[0].kind == collective_kind::allgather);
}
