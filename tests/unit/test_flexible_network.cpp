// The cost model against hand-computed numbers, the online network estimate, network
// profiles (schedules, CSV traces), the simulated network's virtual clock, and the
// flexible collective's per-step choice.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>

#include "gravac/collective/flexible.hpp"
#include "gravac/comm/simulated_communicator.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

TEST_CASE("cost model: values equal hand-computed numbers", "[network][cost_model]") {
  // N = 4 (L = 2), d = 1e6, f = 0.01, alpha = 1 ms, beta = 1 ns/byte. Worked by hand:
  // indices 4e4 bytes; broadcast = 2 ms + 2 * 4e4 ns = 2.08 ms;
  // AR ring = 2.08 + 6 + 1.5 * 4e4 ns = 8.14 ms; AR tree = 2.08 + 4 + 4 * 4e4 ns = 6.24 ms;
  // Allgather = 2 + 6 * 4e4 ns = 2.24 ms; dense = 6 + 1.5 * 4e6 ns = 12 ms.
  const network_params net{1e-3, 1e-9};
  CHECK(cost_model::index_broadcast(4, 1e6, 0.01).seconds(net) == Approx(2.08e-3).epsilon(1e-12));
  CHECK(cost_model::ar_topk(4, 1e6, 0.01, allreduce_algorithm::ring).seconds(net) == Approx(8.14e-3).epsilon(1e-12));
  CHECK(cost_model::ar_topk(4, 1e6, 0.01, allreduce_algorithm::tree).seconds(net) == Approx(6.24e-3).epsilon(1e-12));
  CHECK(cost_model::allgather_topk(4, 1e6, 0.01).seconds(net) == Approx(2.24e-3).epsilon(1e-12));
  CHECK(cost_model::dense_allreduce(4, 1e6).seconds(net) == Approx(12e-3).epsilon(1e-12));
  // N = 8 (L = 3), d = 1000, f = 0.1, alpha = 1, beta = 0.5: dense = 14 + 1.75 * 4000 * 0.5
  // = 3514; Allgather = 3 + 14 * 400 * 0.5 = 2803; broadcast = 3 + 3 * 400 * 0.5 = 603;
  // AR ring = 603 + 14 + 1.75 * 400 * 0.5 = 967; AR tree = 603 + 6 + 6 * 400 * 0.5 = 1809.
  const network_params unit{1, 0.5};
  CHECK(cost_model::dense_allreduce(8, 1000).seconds(unit) == Approx(3514));
  CHECK(cost_model::allgather_topk(8, 1000, 0.1).seconds(unit) == Approx(2803));
  CHECK(cost_model::index_broadcast(8, 1000, 0.1).seconds(unit) == Approx(603));
  CHECK(cost_model::ar_topk(8, 1000, 0.1).seconds(unit) == Approx(967));
  CHECK(cost_model::ar_topk(8, 1000, 0.1, allreduce_algorithm::tree).seconds(unit) == Approx(1809));
  // One rank communicates nothing; 5 ranks round L up to 3.
  CHECK(cost_model::dense_allreduce(1, 1e6).seconds(net) == 0.0);
  CHECK(cost_model::broadcast(5, 0).latency == 3.0);
  CHECK(network_params::from_gbps(1e-3, 25).beta == Approx(8.0 / 25e9));
  CHECK(network_params::from_gbps(1e-3, 25).gbps() == Approx(25));
  CHECK_THROWS_AS(network_params::from_gbps(1e-3, 0), error);
}

TEST_CASE("network estimate recovers alpha and beta within 5% from noisy timings", "[network][estimate]") {
  const network_params truth{2e-4, 8.0 / 10e9};  // 200 us, 10 Gbit/s
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    network_estimate est({.window = 256, .prior = {5e-5, 1.0 / 1.25e9}});
    std::mt19937_64 rng(seed);
    std::lognormal_distribution<double> noise(0.0, 0.05);
    std::uniform_real_distribution<double> log_bytes(std::log(1e3), std::log(6.4e7));
    std::uniform_int_distribution<int> which(0, 2);
    std::bernoulli_distribution stall(0.1);
    for (int i = 0; i < 200; ++i) {
      const double b = std::exp(log_bytes(rng));
      const cost_terms t = which(rng) == 0   ? cost_model::ring_allreduce(4, b)
                           : which(rng) == 1 ? cost_model::broadcast(4, b)
                                             : cost_model::allgather(4, b);
      double s = t.seconds(truth) * noise(rng);
      if (stall(rng)) s *= 3;  // a stalled call: the robust fit must ignore it
      est.add(t, s);
    }
    INFO("seed " << seed << " alpha " << est.params().alpha << " beta " << est.params().beta);
    CHECK(est.params().alpha == Approx(truth.alpha).epsilon(0.05));
    CHECK(est.params().beta == Approx(truth.beta).epsilon(0.05));
  }
  // Garbage is ignored; before any sample the prior is returned.
  network_estimate est;
  est.add({2, 100}, -1);
  est.add({2, 100}, NAN);
  CHECK(est.samples() == 0);
  CHECK(est.params() == network_params{});
  CHECK_THROWS_AS(network_estimate({.window = 1}), error);
}

TEST_CASE("network profiles: constant, cyclic schedules, CSV traces with clear errors", "[network][profile]") {
  const auto fast = network_params::from_gbps(1e-3, 25), slow = network_params::from_gbps(32e-3, 1);
  const auto sched = network_profile::fast_slow_schedule(10);
  CHECK(sched.at(0, 0) == fast);
  CHECK(sched.at(9, 0) == fast);
  CHECK(sched.at(10, 0) == slow);
  CHECK(sched.at(19, 0) == slow);
  CHECK(sched.at(20, 0) == fast);  // and back
  const auto by_time = network_profile::schedule({{0.5, fast}, {1.0, slow}}, profile_index::time, false);
  CHECK(by_time.at(99, 0.49) == fast);
  CHECK(by_time.at(0, 0.5) == slow);
  CHECK(by_time.at(0, 100) == slow);  // not cyclic: the last phase holds

  const auto trace =
      network_profile::parse_csv("# a trace\n\nstep,latency_ms,bandwidth_gbps\n0,1,25\n 100 , 32 , 1 \n250,2,10\n");
  CHECK(trace.phases() == 3);
  CHECK(trace.at(99, 0) == fast);
  CHECK(trace.at(100, 0) == slow);
  CHECK(trace.at(1000, 0).alpha == Approx(2e-3));
  CHECK(trace.at(1000, 0).gbps() == Approx(10));
  const auto t2 = network_profile::parse_csv("time_s,latency_us,bandwidth_bytes_per_s\r\n0,5,1e9\r\n");
  CHECK(t2.index() == profile_index::time);
  CHECK(t2.at(0, 7).beta == Approx(1e-9));
  CHECK(t2.at(0, 7).alpha == Approx(5e-6));

  auto fails_with = [](const char* text, const char* what) {
    CHECK_THROWS_WITH(network_profile::parse_csv(text, "t.csv"), Catch::Contains(what) && Catch::Contains("t.csv"));
  };
  fails_with("", "no header");
  fails_with("step,latency_ms,bandwidth_gbps\n", "no data rows");
  fails_with("epoch,latency_ms,bandwidth_gbps\n0,1,1\n", "first column");
  fails_with("step,latency,bandwidth_gbps\n0,1,1\n", "second column");
  fails_with("step,latency_ms,bw\n0,1,1\n", "third column");
  fails_with("step,latency_ms,bandwidth_gbps\n0,1\n", "line 2: expected 3");
  fails_with("step,latency_ms,bandwidth_gbps\n0,x,1\n", "not a number");
  fails_with("step,latency_ms,bandwidth_gbps\n5,1,1\n", "start at 0");
  fails_with("step,latency_ms,bandwidth_gbps\n0,1,1\n10,1,1\n10,1,1\n", "line 4: rows must be strictly increasing");
  fails_with("step,latency_ms,bandwidth_gbps\n0,-1,1\n", "latency");
  fails_with("step,latency_ms,bandwidth_gbps\n0,1,0\n", "bandwidth must be > 0");
  CHECK_THROWS_AS(network_profile::schedule({}, profile_index::step), error);

  // From a file, and a missing file.
  const std::string path = "gravac_test_trace_flex.csv";
  {
    std::ofstream out(path);
    out << "step,latency_s,bandwidth_gbps\n0,0.001,25\n3,0.032,1\n";
  }
  CHECK(network_profile::from_csv(path).at(3, 0) == slow);
  std::remove(path.c_str());
  try {
    network_profile::from_csv("no/such/trace.csv");
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == status::io_failure);
  }
}

TEST_CASE("simulated network: real collectives, and a clock equal to the sum of the modeled costs",
          "[network][simulated]") {
  constexpr int n = 4;
  const auto sched = network_profile::schedule({{2, network_params{1e-3, 1e-9}}, {2, network_params{5e-6, 1e-7}}},
                                               profile_index::step);
  std::vector<double> clocks(n), expected(n);
  std::vector<int> sums_ok(n, 0);
  run_ranks(n, [&](thread_communicator& tc) {
    simulated_communicator<thread_communicator> sim(tc, sched);
    double expect = 0;
    std::vector<std::byte> all;
    std::vector<std::size_t> sizes;
    for (std::uint64_t step = 0; step < 6; ++step) {
      sim.set_step(step);
      const auto& net = sched.at(step, 0);
      std::vector<float> v(1000, 1.0f + tc.rank());
      sim.allreduce_sum(std::span<float>(v));
      expect += cost_model::ring_allreduce(n, 4000).seconds(net);
      sums_ok[static_cast<std::size_t>(tc.rank())] += v[0] == 10.0f && v[999] == 10.0f;
      std::vector<double> m(3, tc.rank());
      sim.allreduce_max(std::span<double>(m));
      expect += cost_model::ring_allreduce(n, 24).seconds(net);
      std::vector<std::byte> mine(static_cast<std::size_t>(tc.rank()) * 100 + 8);
      sim.allgatherv(mine, all, sizes);
      expect += cost_model::allgather(n, 8 * 4 + 100 * (0 + 1 + 2 + 3)).seconds(net);
      std::vector<std::byte> b(512);
      sim.broadcast(b, 1);
      expect += cost_model::broadcast(n, 512).seconds(net);
      sim.barrier();
      expect += cost_model::barrier(n).seconds(net);
    }
    clocks[static_cast<std::size_t>(tc.rank())] = sim.modeled_seconds();
    expected[static_cast<std::size_t>(tc.rank())] = expect;
  });
  for (int r = 0; r < n; ++r) {
    CHECK(sums_ok[static_cast<std::size_t>(r)] == 6);
    CHECK(clocks[static_cast<std::size_t>(r)] == Approx(expected[static_cast<std::size_t>(r)]).epsilon(1e-12));
    CHECK(clocks[static_cast<std::size_t>(r)] == clocks[0]);  // the same virtual time everywhere
  }
  CHECK(clocks[0] > 0);
}

namespace {
layout wide_layout() {
  layout lay;
  lay.add("conv.weight", {64, 8, 3, 3}, layer_kind::conv);
  lay.add("fc1.weight", {100, 97}, layer_kind::dense);
  lay.add("fc2.weight", {10, 100}, layer_kind::dense);
  return lay;
}
using flex_trainer = trainer<topk, flexible, fixed_policy>;
}  // namespace

TEST_CASE("flexible: under a simulated step schedule it switches where the cost model predicts",
          "[flexible][simulated]") {
  constexpr int n = 4;
  const auto lay = wide_layout();
  // Low latency and 1 Gbit/s (bandwidth-bound) for 3 steps, then 32 ms and 25 Gbit/s
  // (latency-bound) for 3 steps, and back.
  auto sched = std::make_shared<network_profile>(network_profile::schedule(
      {{3, network_params::from_gbps(1e-6, 1)}, {3, network_params::from_gbps(32e-3, 25)}}, profile_index::step));
  constexpr int steps = 12;
  for (double f : {0.1, 0.6}) {
    std::vector<std::vector<collective_kind>> kinds(n);
    std::vector<std::vector<double>> modeled(n);
    std::vector<std::vector<std::size_t>> bytes(n);
    std::vector<double> clock(n), after_ctor(n);
    run_ranks(n, [&](thread_communicator& tc) {
      simulated_communicator<thread_communicator> sim(tc, *sched);
      flex_trainer::options opt;
      opt.policy.kept_fraction = f;
      opt.collective.source = network_source::profile;
      opt.collective.profile = sched;
      opt.collective.charge_codec = false;  // the network model alone decides here
      flex_trainer t(sim, lay, opt);
      after_ctor[static_cast<std::size_t>(tc.rank())] = sim.modeled_seconds();
      for (int s = 0; s < steps; ++s) {
        sim.set_step(static_cast<std::uint64_t>(s));
        auto g = test::make_data(lay.numel(), 31 * s + tc.rank());
        const auto& rep = t.step(g);
        kinds[static_cast<std::size_t>(tc.rank())].push_back(rep.collective);
        modeled[static_cast<std::size_t>(tc.rank())].push_back(rep.modeled_communicate_s);
        bytes[static_cast<std::size_t>(tc.rank())].push_back(rep.bytes_sent);
      }
      clock[static_cast<std::size_t>(tc.rank())] = sim.modeled_seconds();
    });
    // The prediction: argmin of the three modeled costs at this step's network.
    step_params p = test::params_for(lay, f);
    flexible_options fixed_net;
    fixed_net.source = network_source::fixed;
    flexible probe(lay, fixed_net);
    const double fe = probe.kept_fraction_of(p), d = static_cast<double>(lay.numel());
    std::set<collective_kind> seen;
    // The layout check: one Allreduce of 8 doubles.
    double expect_clock = cost_model::ring_allreduce(n, 64.0).seconds(sched->at(0, 0));
    for (int s = 0; s < steps; ++s) {
      const auto& net = sched->at(static_cast<std::uint64_t>(s), 0);
      const auto c = flexible::costs(n, d, fe, net);
      const auto predicted =
          flexible::candidates[static_cast<std::size_t>(std::min_element(c.begin(), c.end()) - c.begin())];
      seen.insert(predicted);
      // What the engine must have charged for what was actually sent: the gradient's own
      // collective, with the trainer's non-finite flag (2 floats) riding at its end.
      constexpr double flag = 2 * sizeof(float);
      double charged = 0;
      std::size_t k = 0;
      for (const auto& l : lay.layers()) k += kept_count(l.numel, f);
      if (predicted == collective_kind::dense_allreduce)
        charged = cost_model::ring_allreduce(n, 4 * d + flag).seconds(net);
      if (predicted == collective_kind::allreduce_compatible)
        charged = (cost_model::broadcast(n, 4.0 * k) + cost_model::ring_allreduce(n, 4.0 * k + flag)).seconds(net);
      if (predicted == collective_kind::allgather) {
        double total = 0;
        for (int r = 0; r < n; ++r)
          total += static_cast<double>(bytes[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)]) + flag;
        charged = cost_model::allgather(n, total).seconds(net);
      }
      expect_clock += charged;  // no collective of its own for the flag
      for (int r = 0; r < n; ++r) {
        INFO("f " << f << " step " << s << " rank " << r);
        CHECK(kinds[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)] == predicted);
        CHECK(modeled[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)] == Approx(charged).epsilon(1e-12));
      }
    }
    CHECK(seen.size() == 2);  // the schedule does make it switch
    CHECK(seen.count(collective_kind::allgather) == 1);
    CHECK(seen.count(f < 0.5 ? collective_kind::allreduce_compatible : collective_kind::dense_allreduce) == 1);
    for (int r = 0; r < n; ++r) CHECK(clock[static_cast<std::size_t>(r)] == Approx(expect_clock).epsilon(1e-12));
  }
}

TEST_CASE("flexible: measured timings give the same choices on every rank; a policy can force one", "[flexible]") {
  constexpr int n = 4;
  const auto lay = wide_layout();
  std::vector<std::vector<collective_kind>> kinds(n);
  std::vector<network_params> nets(n);
  std::vector<std::size_t> samples(n);
  std::vector<int> forced_ok(n, 0);
  run_ranks(n, [&](thread_communicator& tc) {
    flex_trainer::options opt;
    opt.policy.kept_fraction = 0.05;
    opt.collective.sync_interval = 3;
    flex_trainer t(tc, lay, opt);
    for (int s = 0; s < 20; ++s) {
      auto g = test::make_data(lay.numel(), 7 * s + tc.rank());
      kinds[static_cast<std::size_t>(tc.rank())].push_back(t.step(g).collective);
    }
    nets[static_cast<std::size_t>(tc.rank())] = t.collective().estimate().params();
    samples[static_cast<std::size_t>(tc.rank())] = t.collective().estimate().samples();

    flex_trainer::options forced = opt;
    forced.policy.collective = collective_kind::allgather;
    forced.collective.source = network_source::fixed;
    forced.collective.network = network_params::from_gbps(1e-6, 0.01);  // would pick AR-Topk
    flex_trainer t2(tc, lay, forced);
    auto g = test::make_data(lay.numel(), 99 + tc.rank());
    forced_ok[static_cast<std::size_t>(tc.rank())] = t2.step(g).collective == collective_kind::allgather &&
                                                     t2.collective().last_costs()[1] < t2.collective().last_costs()[2];
  });
  for (int r = 0; r < n; ++r) {
    CHECK(kinds[static_cast<std::size_t>(r)] == kinds[0]);
    CHECK(nets[static_cast<std::size_t>(r)] == nets[0]);
    CHECK(forced_ok[static_cast<std::size_t>(r)]);
  }
  CHECK(samples[0] == 18);  // six max-reductions of three timings each
  flexible_options bad;
  bad.source = network_source::profile;  // without a profile
  CHECK_THROWS_AS(flexible(lay, bad), error);
  bad = {};
  bad.sync_interval = 0;
  CHECK_THROWS_AS(flexible(lay, bad), error);
}

TEST_CASE("flexible: with charge_codec each step takes the cheapest of network cost plus measured codec time",
          "[flexible][codec]") {
  // A network where Allgather top-k at 1% is modeled 20 us cheaper than a dense Allreduce
  // of 2^18 floats: whether compression pays then depends on the codec times, which are
  // measured (so the test checks the rule, not which path wins on this machine).
  constexpr int n = 4, steps = 8;
  layout lay;
  lay.add("w", {512, 512}, layer_kind::dense);
  const double d = static_cast<double>(lay.numel());
  const auto dense = cost_model::dense_allreduce(n, d), gather = cost_model::allgather_topk(n, d, 0.01);
  const network_params net{1e-6, (20e-6 - (dense.latency - gather.latency) * 1e-6) / (dense.bytes - gather.bytes)};
  REQUIRE(net.beta > 0);
  std::vector<std::vector<collective_kind>> with(n), without(n);
  std::vector<std::vector<std::array<double, 3>>> codec(n), costs(n);
  for (bool charge : {true, false}) {
    run_ranks(n, [&](thread_communicator& tc) {
      const auto r = static_cast<std::size_t>(tc.rank());
      flex_trainer::options opt;
      opt.policy.kept_fraction = 0.01;
      opt.collective.source = network_source::fixed;
      opt.collective.network = net;
      opt.collective.charge_codec = charge;
      flex_trainer t(tc, lay, opt);
      for (int s = 0; s < steps; ++s) {
        auto g = test::make_data(lay.numel(), 5 * s + tc.rank());
        (charge ? with : without)[r].push_back(t.step(g).collective);
        if (charge) {
          codec[r].push_back(t.collective().codec_seconds());
          costs[r].push_back(t.collective().last_costs());
        }
      }
    });
  }
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(with[static_cast<std::size_t>(r)] == with[0]);    // the same choices everywhere...
    CHECK(codec[static_cast<std::size_t>(r)] == codec[0]);  // ...from the same (rank-averaged) codec times
    CHECK(without[static_cast<std::size_t>(r)] == std::vector<collective_kind>(steps, collective_kind::allgather));
  }
  CHECK(with[0][0] == collective_kind::allgather);  // no codec time known yet: the network decides
  CHECK(codec[0][1][2] > 0);                        // the Allgather step's codec time arrived with the next step
  std::set<collective_kind> used(with[0].begin(), with[0].end());
  for (int s = 1; s < steps; ++s) {
    // Step s decides on the codec times known after step s - 1.
    std::array<double, 3> total{};
    const auto at = static_cast<std::size_t>(s);
    for (std::size_t k = 0; k < 3; ++k) total[k] = costs[0][at][k] + codec[0][at - 1][k];
    const auto least = std::min_element(total.begin(), total.end()) - total.begin();
    const auto cheapest = flexible::candidates[static_cast<std::size_t>(least)];
    INFO("step " << s);
    CHECK(with[0][static_cast<std::size_t>(s)] == cheapest);
  }
  // Top-k over 2^18 values costs more than 20 us, so the untried dense path was tried.
  CHECK(used.count(collective_kind::dense_allreduce) == 1);
}
