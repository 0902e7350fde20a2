// The adaptive policies inside the trainer on 4 thread ranks fed deliberately different
// gradients: every rank takes the same decision at every step, the averaged gradient
// equals the serial reference under the parameters the policy chose, and a save /
// restore mid-run continues exactly as an uninterrupted run.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <set>

#include "gravac/comm/simulated_communicator.hpp"
#include "gravac/policy/accordion_policy.hpp"
#include "gravac/policy/adacomp_policy.hpp"
#include "gravac/policy/gravac_policy.hpp"
#include "policy_test_util.hpp"
#if __has_include("gravac/compress/adacomp.hpp")
#include "gravac/compress/adacomp.hpp"
#define GRAVAC_TEST_HAVE_ADACOMP 1
#endif

using namespace gravac;

namespace {
using gravac::test::ranks;
constexpr int total_steps = 40;

// Runs the schedule on 4 thread ranks and checks agreement and the serial reference.
// Returns rank 0's log for further checks.
template <class C, class K, class P>
test::rank_log check_agreement(const typename trainer<C, K, P>::options& opt) {
  const auto lay = test::mixed_layout();
  std::vector<test::rank_log> logs(ranks);
  std::vector<std::vector<std::byte>> states(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    trainer<C, K, P> t(comm, lay, opt);
    test::run_schedule(t, comm.rank(), 0, total_steps, logs[comm.rank()]);
    t.policy().save(states[comm.rank()]);
  });
  for (int r = 1; r < ranks; ++r) CHECK(states[r] == states[0]);  // the policy state too (checkpoints compare it)
  for (int s = 0; s < total_steps; ++s)
    for (int r = 1; r < ranks; ++r) {
      INFO("step " << s << " rank " << r);
      REQUIRE(logs[r].params[s].hash == logs[0].params[s].hash);  // the same decision everywhere
    }
  std::vector<std::vector<float>> res;
  const auto ref = test::schedule_reference<C>(lay, opt.compressor, logs[0].params, ranks, res);
  for (int s = 0; s < total_steps; ++s)
    for (int r = 0; r < ranks; ++r) {
      INFO("step " << s << " rank " << r);
      CHECK(logs[r].out[s] == ref[s]);  // bit for bit: same packets, summed in rank order
    }
  for (int r = 0; r < ranks; ++r) CHECK(logs[r].residual == res[r]);
  return logs[0];
}

std::set<double> fractions_of_layer(const test::rank_log& log, std::size_t layer) {
  std::set<double> f;
  for (const auto& p : log.params) f.insert(p.kept_fraction[layer]);
  return f;
}

// Runs the schedule uninterrupted, then again with a save after step `cut` and a restore
// into fresh trainers (policy state, residual, step counter); both must match bit for bit.
template <class C, class P>
void check_restore(const typename P::options& popt, int cut) {
  using T = trainer<C, allgather, P>;
  const auto lay = test::mixed_layout();
  typename T::options opt;
  opt.policy = popt;
  opt.seed = 11;
  std::vector<test::rank_log> full(ranks), part(ranks);
  std::vector<std::vector<std::byte>> saved(ranks), saved_local(ranks);
  std::vector<std::vector<float>> residual(ranks);
  // The mock network model makes simulated time (and so GraVAC's CT) reproducible.
  run_ranks(ranks, [&](thread_communicator& comm) {
    test::mock_network_comm net(comm, 1e-4, 1e-6);
    T t(net, lay, opt);
    test::run_schedule(t, comm.rank(), 0, total_steps, full[comm.rank()]);
  });
  run_ranks(ranks, [&](thread_communicator& comm) {
    test::mock_network_comm net(comm, 1e-4, 1e-6);
    T t(net, lay, opt);
    test::run_schedule(t, comm.rank(), 0, cut, part[comm.rank()]);
    t.policy().save(saved[comm.rank()]);
    if constexpr (requires { t.policy().save_local(saved_local[0]); }) t.policy().save_local(saved_local[comm.rank()]);
    residual[comm.rank()] = part[comm.rank()].residual;
  });
  run_ranks(ranks, [&](thread_communicator& comm) {
    test::mock_network_comm net(comm, 1e-4, 1e-6);
    T t(net, lay, opt);
    t.policy().load(saved[comm.rank()]);
    if constexpr (requires { t.policy().load_local(saved_local[0]); }) t.policy().load_local(saved_local[comm.rank()]);
    std::copy(residual[comm.rank()].begin(), residual[comm.rank()].end(), t.residual().begin());
    t.set_steps(static_cast<std::uint64_t>(cut));
    test::run_schedule(t, comm.rank(), cut, total_steps, part[comm.rank()]);
  });
  for (int r = 0; r < ranks; ++r) {
    REQUIRE(part[r].params.size() == full[r].params.size());
    for (int s = 0; s < total_steps; ++s) {
      INFO("cut " << cut << " step " << s << " rank " << r);
      CHECK(part[r].params[s].hash == full[r].params[s].hash);
      CHECK(part[r].out[s] == full[r].out[s]);
    }
    CHECK(part[r].residual == full[r].residual);
  }
}

gravac_policy_options small_gravac(time_options time = {}) {
  return {.cf_min = 4,
          .cf_max = 64,
          .window = 3,
          .warmup_steps = 3,
          .epsilon = 0.3,
          .period_steps = 4,
          .samples_per_step = 32,
          .time = time};
}
}  // namespace

TEST_CASE("threads: gravac_policy decides identically on every rank and matches the reference",
          "[policy][gravac][threads]") {
  SECTION("measured time, periods of 4 steps") {
    using T = trainer<topk, allgather, gravac_policy>;
    const auto log = check_agreement<topk, allgather, gravac_policy>(T::options{.policy = small_gravac()});
    CHECK(fractions_of_layer(log, 0).size() >= 2);  // the policy did change the ratio
  }
  SECTION("epoch periods, whole-buffer top-k") {
    using T = trainer<topk, allgather, gravac_policy>;
    auto o = small_gravac();
    o.period_steps = 0;
    o.samples_per_step = 0;
    check_agreement<topk, allgather, gravac_policy>(T::options{.compressor = {.whole_buffer = true}, .policy = o});
  }
  SECTION("dense Allreduce collective") {
    using T = trainer<topk, dense_allreduce, gravac_policy>;
    check_agreement<topk, dense_allreduce, gravac_policy>(T::options{.policy = small_gravac()});
  }
}

TEST_CASE("threads: the search settles on every rank alike", "[policy][gravac][threads]") {
  const auto lay = test::mixed_layout();
  std::vector<double> kept(ranks);
  std::vector<std::vector<double>> table(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    trainer<topk, allgather, gravac_policy> t(comm, lay, {.policy = small_gravac()});
    test::rank_log log;
    test::run_schedule(t, comm.rank(), 0, total_steps, log);
    CHECK(t.policy().phase() == gravac_phase::monitoring);  // 3 + 5 * 4 steps at most
    kept[comm.rank()] = t.policy().candidate_cf();
    table[comm.rank()].assign(t.policy().throughput_table().begin(), t.policy().throughput_table().end());
  });
  for (int r = 1; r < ranks; ++r) {
    CHECK(kept[r] == kept[0]);
    // NaN marks unevaluated candidates; compare bit patterns.
    CHECK(std::memcmp(table[r].data(), table[0].data(), table[0].size() * sizeof(double)) == 0);
  }
}

TEST_CASE("threads: GraVAC with dense among its choices keeps dense on a fast network and a ratio once it slows",
          "[policy][gravac][dense][threads]") {
  layout lay;
  lay.add("fc1.weight", {64, 64}, layer_kind::dense);
  lay.add("fc2.weight", {16, 128}, layer_kind::dense);
  // 40 steps on a fast network (5 us, 100 GB/s), then a slow one for ever (1 ms, 1 MB/s):
  // dense's 36.9 KB on the ring cost 37 ms there, CF 16's Allgather a quarter of it.
  const network_params fast{5e-6, 1e-11}, slow{1e-3, 1e-6};
  const auto sched = network_profile::schedule({{40, fast}, {1, slow}}, profile_index::step, false);
  // A clock every rank shares (1 ms of compute, the modeled communication, no measured
  // codec time): the decisions are the same in every run.
  const gravac_policy_options o{.cf_min = 16,
                                .cf_max = 64,
                                .window = 3,
                                .warmup_steps = 3,
                                .epsilon = 0.3,
                                .period_steps = 4,
                                .samples_per_step = 32,
                                .time = {time_source::simulated, 1e-3, false},
                                .dense_candidate = true,
                                .dense_probe_steps = 3};
  constexpr int steps = 100;
  std::vector<std::vector<double>> sent(ranks);
  std::vector<int> dense_when_fast(ranks), dense_at_end(ranks);
  std::vector<std::uint64_t> rechecks(ranks);
  run_ranks(ranks, [&](thread_communicator& tc) {
    simulated_communicator<thread_communicator> sim(tc, sched);
    trainer<topk, allgather, gravac_policy> t(sim, lay, {.policy = o});
    for (int s = 0; s < steps; ++s) {
      sim.set_step(static_cast<std::uint64_t>(s));
      auto g = test::make_data(lay.numel(), static_cast<std::uint64_t>(1000 * tc.rank() + s));
      const auto& r = t.step(g);
      sent[tc.rank()].push_back(r.kept_fraction.empty() ? 1.0 : r.kept_fraction[0]);
      if (s == 39) dense_when_fast[tc.rank()] = t.policy().dense_kept();
    }
    dense_at_end[tc.rank()] = t.policy().dense_kept();
    rechecks[tc.rank()] = t.policy().rechecks();
  });
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(dense_when_fast[r] == 1);  // dense beat CF 16 even with CF 16's communication free
    CHECK(sent[r][39] == 1.0);
    CHECK(dense_at_end[r] == 0);  // the slow network was noticed, CF 16 probed and kept
    CHECK(sent[r].back() < 0.1);
    CHECK(rechecks[r] == 2);  // dense confirmed after the search, then the slow network once
    CHECK(sent[r] == sent[0]);
  }
}

TEST_CASE("threads: accordion_policy decides identically on every rank and matches the reference",
          "[policy][accordion][threads]") {
  using T = trainer<topk, allgather, accordion_policy>;
  // A decision every epoch: the schedule has 8 epochs, fewer than the default compare_every (10).
  const auto log = check_agreement<topk, allgather, accordion_policy>(T::options{.policy = {.compare_every = 1}});
  CHECK(fractions_of_layer(log, 0) == std::set<double>{0.01, 0.1});  // both levels were used
  CHECK(fractions_of_layer(log, 1) == std::set<double>{1.0});        // the bias stays dense
  const T::options every_3_steps{.policy = {.interval_steps = 3, .compare_every = 1}};
  const auto by_interval = check_agreement<topk, allgather, accordion_policy>(every_3_steps);
  CHECK(fractions_of_layer(by_interval, 2).size() == 2);
}

TEST_CASE("threads: adacomp_policy with top-k and with the AdaComp compressor", "[policy][adacomp][threads]") {
  using T = trainer<topk, allgather, adacomp_policy>;
  check_agreement<topk, allgather, adacomp_policy>(T::options{.policy = {.conv_bin = 10, .dense_bin = 40}});
#ifdef GRAVAC_TEST_HAVE_ADACOMP
  using A = trainer<adacomp, allgather, adacomp_policy>;
  check_agreement<adacomp, allgather, adacomp_policy>(A::options{.policy = {.conv_bin = 10, .dense_bin = 40}});
#endif
}

TEST_CASE("threads: save / restore mid-run continues bit for bit", "[policy][state][threads]") {
  for (int cut : {2, 9, 17, 23}) {
    check_restore<topk, gravac_policy>(small_gravac({time_source::simulated, 0.002, false}), cut);
    check_restore<topk, accordion_policy>({.interval_steps = 3}, cut);
    check_restore<topk, accordion_policy>({}, cut);
    check_restore<topk, adacomp_policy>({.conv_bin = 10}, cut);
  }
}

TEST_CASE("threads: simulated time drives a reproducible search", "[policy][gravac][threads]") {
  // Two independent runs under the mock network take the same path through the search.
  const auto lay = test::mixed_layout();
  std::vector<std::vector<double>> tables;
  for (int run = 0; run < 2; ++run) {
    std::vector<double> table;
    run_ranks(ranks, [&](thread_communicator& comm) {
      test::mock_network_comm net(comm, 1e-4, 1e-6);
      trainer<topk, allgather, gravac_policy> t(net, lay,
                                                {.policy = small_gravac({time_source::simulated, 0.002, false})});
      test::rank_log log;
      test::run_schedule(t, comm.rank(), 0, total_steps, log);
      if (comm.rank() == 0) table.assign(t.policy().throughput_table().begin(), t.policy().throughput_table().end());
    });
    tables.push_back(table);
  }
  CHECK(std::memcmp(tables[0].data(), tables[1].data(), tables[0].size() * sizeof(double)) == 0);
  CHECK_FALSE(std::isnan(tables[0][1]));  // at least two candidates were evaluated
}

TEST_CASE("threads: times are each rank's own; a statistics policy gets the ranks' mean of the previous step's",
          "[policy][threads]") {
  // Times are known only after a step's collective, so they cannot ride in it: the trainer
  // sends each rank's times with the next step (no collective of their own).
  const auto lay = test::mixed_layout();
  std::vector<double> own(ranks), seen(ranks);
  std::vector<step_times> times1(ranks), previous2(ranks);
  std::vector<char> agreed1(ranks), agreed2(ranks);  // not vector<bool>: ranks write neighbouring elements
  run_ranks(ranks, [&](thread_communicator& comm) {
    const int r = comm.rank();
    // MOCK network whose latency differs by rank, so the ranks' modeled times differ.
    test::mock_network_comm net(comm, 1e-3 * (r + 1), 1e-6);
    trainer<topk, allgather, gravac_policy> t(net, lay, {.policy = small_gravac()});
    for (int s = 0; s < 3; ++s) {
      auto g = test::rank_gradient(lay, s, r);
      const double before = net.modeled_seconds();
      const auto& rep = t.step(g);
      own[r] = net.modeled_seconds() - before;
      seen[r] = rep.modeled_communicate_s;
      if (s == 0) agreed1[r] = rep.previous_times_agreed;
      if (s == 1) times1[r] = {rep.compress_s, rep.communicate_s, rep.decompress_s, rep.iteration_s};
      if (s == 2) {
        agreed2[r] = rep.previous_times_agreed;
        previous2[r] = rep.previous_times;
      }
    }
  });
  step_times mean{};
  for (int r = 0; r < ranks; ++r) {
    mean.compress_s += times1[r].compress_s / ranks;
    mean.communicate_s += times1[r].communicate_s / ranks;
    mean.decompress_s += times1[r].decompress_s / ranks;
    mean.iteration_s += times1[r].iteration_s / ranks;
  }
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(seen[r] == own[r]);  // this rank's own
    CHECK_FALSE(agreed1[r]);   // the first step has no previous one
    CHECK(agreed2[r]);
    // The same bits on every rank, equal to the mean up to the float the values travel in.
    CHECK(std::memcmp(&previous2[r], &previous2[0], sizeof(step_times)) == 0);
    CHECK(previous2[r].compress_s == Approx(mean.compress_s).epsilon(1e-6));
    CHECK(previous2[r].communicate_s == Approx(mean.communicate_s).epsilon(1e-6));
    CHECK(previous2[r].decompress_s == Approx(mean.decompress_s).epsilon(1e-6));
    CHECK(previous2[r].iteration_s == Approx(mean.iteration_s).epsilon(1e-6));
  }
  CHECK(own[0] < own[ranks - 1]);  // the ranks did differ
}

TEST_CASE("fixed_policy: versioned state that refuses another configuration", "[policy][state]") {
  const auto lay = test::mixed_layout();
  fixed_policy a(lay, {.kept_fraction = 0.1});
  std::vector<std::byte> bytes;
  a.save(bytes);
  CHECK_FALSE(bytes.empty());
  fixed_policy same(lay, {.kept_fraction = 0.1});
  CHECK_NOTHROW(same.load(bytes));
  CHECK_NOTHROW(same.load({}));
  fixed_policy other(lay, {.kept_fraction = 0.2});
  CHECK_THROWS_WITH(other.load(bytes), Catch::Contains("other options"));
  gravac_policy g(lay);
  CHECK_THROWS_WITH(g.load(bytes), Catch::Contains("another policy"));
}
