#include <catch2/catch.hpp>
#include <gravac/comm/simulated_communicator.hpp>
#include <gravac/local_steps.hpp>
#include <gravac/policy/local_steps_policy.hpp>

#include "gravac_test_util.hpp"

namespace local_steps_policy_tests {
using namespace gravac;

constexpr int ranks4 = 4;

// One exchange seen by the policy: planned, then reported as run at its planned fraction.
void exchange(local_steps_policy& p, const layout& lay, double modeled_s = 0) {
  step_params sp;
  sp.kept_fraction.assign(lay.size(), 1.0);
  sp.ranks = ranks4;
  p.plan(sp);
  step_report r;
  const double f = sp.global_fraction;
  r.collective = f >= 1 ? collective_kind::dense_allreduce : collective_kind::allgather;
  r.bytes_sent = static_cast<std::size_t>(f >= 1 ? 4.0 * lay.numel() : 8.0 * f * lay.numel());
  r.modeled_communicate_s = modeled_s;
  p.round_ended(p.period(), 0.0, 0);
  p.observe(r);
}

local_steps_policy_options fixed_net(double gbps, double latency_s, double compute_s) {
  local_steps_policy_options o;
  o.source = network_source::fixed;
  o.network = network_params::from_gbps(latency_s, gbps);
  o.time.source = time_source::simulated;
  o.time.compute_s = compute_s;
  return o;
}

// The rule written out again, for the first decision: the fastest pair's time per step T*,
// then the first pair in the order of preference (largest fraction, then smallest H) within
// (1 + slack) T*; the current pair (H = 1, densest at the start) keeps the wider slack.
period_choice expected_first_choice(const layout& lay, const local_steps_policy_options& o) {
  std::vector<double> fr = o.kept_fractions;
  std::sort(fr.begin(), fr.end(), std::greater<>());
  std::vector<std::size_t> hs;
  for (std::size_t h = 1; h < o.max_period; h *= 2) hs.push_back(h);
  hs.push_back(o.max_period);
  const double d = static_cast<double>(lay.numel());
  std::vector<period_choice> all;
  double fastest = INFINITY;
  for (double f : fr)
    for (std::size_t h : hs) {
      const double tc = f >= 1 ? cost_model::dense_allreduce(ranks4, d).seconds(o.network)
                               : cost_model::allgather_packets(ranks4, 8.0 * f * d).seconds(o.network);
      const double hd = static_cast<double>(h);
      const double exposed = o.overlap ? std::max(0.0, tc - hd * o.time.compute_s) : tc;
      const double step = o.time.compute_s + exposed / hd;
      all.push_back({h, f, step, (exposed / hd) / step});
      fastest = std::min(fastest, step);
    }
  for (const auto& c : all) {
    const bool current = c.period == 1 && c.kept_fraction == fr.front();
    if (c.predicted_step_s <= fastest * (1 + (current ? o.slack * (1 + o.margin) : o.slack))) return c;
  }
  return {};
}

TEST_CASE("local_steps_policy keeps per-step dense training on a fast network", "[policy][local_steps]") {
  const auto lay = test::mixed_layout();
  local_steps_policy p(lay, fixed_net(100, 10e-6, 5e-3));
  CHECK(p.period() == 1);
  for (int i = 0; i < 5; ++i) exchange(p, lay);
  CHECK(p.period() == 1);
  CHECK(p.choice().kept_fraction == 1.0);
  // Within the slack of the fastest pair (which is compute plus next to nothing).
  CHECK(p.choice().predicted_step_s <= 5e-3 * (1 + 0.25 * 1.25));
}

TEST_CASE("local_steps_policy grows H to its bound on a slow, far network", "[policy][local_steps]") {
  const auto lay = test::mixed_layout();
  auto o = fixed_net(0.01, 0.1, 1e-3);
  o.max_period = 50;
  local_steps_policy p(lay, o);
  exchange(p, lay);
  CHECK(p.period() == 50);
  // 100 ms of latency dominates: at H = 50 the 10% exchange costs within the slack of the 1%
  // one, so it keeps more rather than compress for nothing; dense does not fit.
  CHECK(p.choice().kept_fraction == 0.1);
  const auto net = o.network;
  CHECK(p.exchange_seconds(0.1, net) / 50 + 1e-3 <= 1.25 * (p.exchange_seconds(0.01, net) / 50 + 1e-3));
  CHECK(p.exchange_seconds(1.0, net) / 50 + 1e-3 > 1.25 * (p.exchange_seconds(0.01, net) / 50 + 1e-3));
}

TEST_CASE("local_steps_policy takes the densest, least stale pair within the slack of the fastest",
          "[policy][local_steps]") {
  const auto lay = test::mixed_layout();
  for (double gbps : {0.05, 0.3, 1.0, 3.0, 20.0})
    for (double compute : {1e-4, 1e-3, 1e-2})
      for (bool overlap : {false, true}) {
        INFO(gbps << " Gbit/s, compute " << compute << ", overlap " << overlap);
        auto o = fixed_net(gbps, 1e-3, compute);
        o.overlap = overlap;
        local_steps_policy p(lay, o);
        exchange(p, lay);
        const period_choice want = expected_first_choice(lay, o);
        CHECK(p.period() == want.period);
        CHECK(p.choice().kept_fraction == want.kept_fraction);
        CHECK(p.choice().predicted_step_s == Approx(want.predicted_step_s).epsilon(1e-12));
      }
}

TEST_CASE("with overlap an exchange hidden behind H steps of compute costs nothing", "[policy][local_steps]") {
  const auto lay = test::mixed_layout();
  auto o = fixed_net(1, 20e-3, 5e-3);  // dense exchange: ~0.12 s of latency, some bandwidth
  o.kept_fractions = {1.0};
  local_steps_policy without(lay, o);
  o.overlap = true;
  local_steps_policy with(lay, o);
  exchange(without, lay);
  exchange(with, lay);
  const double tc = cost_model::dense_allreduce(ranks4, static_cast<double>(lay.numel())).seconds(o.network);
  // Overlapped: an H whose compute hides the exchange costs compute alone, so the choice is
  // within the slack of that; without overlap it must be longer to get there, or cannot.
  CHECK(with.choice().predicted_step_s <= 5e-3 * 1.25);
  CHECK(static_cast<double>(with.period()) * 5e-3 * 1.25 >= tc);
  CHECK(without.period() > with.period());
}

TEST_CASE("local_steps_policy follows a network that changes, without oscillating", "[policy][local_steps]") {
  const auto lay = test::mixed_layout();
  auto o = fixed_net(1, 1e-3, 2e-3);
  o.source = network_source::modeled;
  // Fast and slow alternating every 4 inner steps (faster than the exchanges at H > 4 can
  // follow), then a long fast phase.
  std::vector<network_phase> phases;
  for (int s = 0; s < 400; s += 4)
    phases.push_back({4.0, (s / 4) % 2 ? network_params::from_gbps(0.1, 0.05) : network_params::from_gbps(10e-6, 100)});
  phases.push_back({1e6, network_params::from_gbps(10e-6, 100)});
  const auto net = network_profile::schedule(phases, profile_index::step, false);
  local_steps_policy p(lay, o);
  std::uint64_t inner = 0;
  std::vector<std::size_t> periods;
  const double d = static_cast<double>(lay.numel());
  while (inner < 1000) {
    step_params sp;
    sp.kept_fraction.assign(lay.size(), 1.0);
    sp.ranks = ranks4;
    p.plan(sp);
    const double f = sp.global_fraction;
    inner += p.period();
    p.round_ended(p.period(), 0.0, inner);
    step_report r;
    r.collective = f >= 1 ? collective_kind::dense_allreduce : collective_kind::allgather;
    r.bytes_sent = static_cast<std::size_t>(f >= 1 ? 4 * d : 8 * f * d);
    const cost_terms t = f >= 1 ? cost_model::dense_allreduce(ranks4, d)
                                : cost_model::allgather_packets(ranks4, static_cast<double>(r.bytes_sent));
    r.modeled_communicate_s = t.seconds(net.at(inner, 0.0));
    p.observe(r);
    periods.push_back(p.period());
  }
  INFO("changes " << p.changes() << " over " << periods.size() << " exchanges");
  // It left per-step training on the mixed network, but did not flip at every exchange...
  CHECK(p.changes() >= 2);
  CHECK(p.changes() * 4 < periods.size());
  // ... and once the network stays fast, it is back to per-step dense training.
  CHECK(p.period() == 1);
  CHECK(p.choice().kept_fraction == 1.0);
}

TEST_CASE("local_steps_policy decides the same on every rank from the modeled clock", "[policy][local_steps]") {
  const auto lay = test::mixed_layout();
  using LS = local_steps<topk, allgather, local_steps_policy>;
  LS::options opt;
  opt.outer.kind = outer_kind::averaging;
  opt.exchange.policy.source = network_source::modeled;
  opt.exchange.policy.network = network_params::from_gbps(50e-6, 10);  // a wrong prior
  opt.exchange.policy.time.source = time_source::simulated;
  opt.exchange.policy.time.compute_s = 1e-3;
  opt.exchange.policy.max_period = 16;
  const network_params slow = network_params::from_gbps(0.05, 0.1);
  std::vector<std::vector<std::size_t>> periods(ranks4);
  std::vector<std::vector<float>> global(ranks4);
  run_ranks(ranks4, [&](thread_communicator& comm) {
    simulated_communicator<thread_communicator> sim(comm, network_profile::constant(slow));
    std::vector<float> x = test::make_data(lay.numel(), 5);
    LS ls(sim, lay, x, opt);
    for (int s = 0; s < 80; ++s) {
      periods[comm.rank()].push_back(ls.period());
      auto g = test::make_data(lay.numel(), 300 + 7 * static_cast<std::uint64_t>(s) + comm.rank());
      ls.before_inner_step(g);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] -= 0.01f * g[i];
      ls.after_inner_step(x);
    }
    global[comm.rank()].assign(ls.global_params().begin(), ls.global_params().end());
  });
  for (int r = 1; r < ranks4; ++r) {
    CHECK(periods[r] == periods[0]);
    CHECK(global[r] == global[0]);
  }
  // Learned from the modeled exchanges: on this slow network it left per-step training.
  CHECK(periods[0].front() == 1);
  CHECK(periods[0].back() == 16);
}

TEST_CASE("local_steps_policy state round-trips and bad states are refused", "[policy][local_steps]") {
  const auto lay = test::mixed_layout();
  auto o = fixed_net(1, 1e-3, 1e-3);
  o.source = network_source::modeled;
  local_steps_policy p(lay, o);
  for (int i = 0; i < 5; ++i) exchange(p, lay, 0.01 * (i + 1));
  std::vector<std::byte> a, b;
  p.save(a);
  local_steps_policy q(lay, o);
  q.load(a);
  q.save(b);
  CHECK(a == b);
  CHECK(q.choice() == p.choice());
  exchange(p, lay, 0.02);
  exchange(q, lay, 0.02);
  CHECK(q.choice() == p.choice());
  CHECK(q.decision_network() == p.decision_network());
  for (std::size_t cut : {std::size_t{0}, std::size_t{10}, a.size() - 1}) {
    local_steps_policy r(lay, o);
    CHECK_THROWS_AS(r.load(std::span<const std::byte>(a.data(), cut)), gravac::error);
    CHECK(r.period() == 1);
  }
  auto other = o;
  other.slack = 0.2;
  local_steps_policy r(lay, other);
  CHECK_THROWS_AS(r.load(a), gravac::error);
}

TEST_CASE("local_steps_policy rejects options out of their domain", "[policy][local_steps]") {
  const auto lay = test::mixed_layout();
  const auto refuses = [&](auto edit) {
    local_steps_policy_options o;
    edit(o);
    CHECK_THROWS_AS(local_steps_policy(lay, o), gravac::error);
  };
  refuses([](auto& o) { o.kept_fractions = {}; });
  refuses([](auto& o) { o.kept_fractions = {1.0, 0.0}; });
  refuses([](auto& o) { o.kept_fractions = {1.5}; });
  refuses([](auto& o) { o.max_period = 0; });
  refuses([](auto& o) { o.slack = 0; });
  refuses([](auto& o) { o.slack = 1; });
  refuses([](auto& o) { o.margin = -1; });
  refuses([](auto& o) { o.estimate_window = 1; });
  refuses([](auto& o) { o.initial_bytes_per_kept = 0; });
  refuses([](auto& o) { o.source = network_source::profile; });
  refuses([](auto& o) { o.time.compute_s = -1; });
}

}  // namespace local_steps_policy_tests
