// Invalid options of every compressor, collective, policy, communicator and of the trainer
// are rejected at construction with gravac::error(invalid_argument) and a message that
// names the component and the option. NaN is tried wherever an option is a double
// (a comparison with NaN is false, so "x < 0" checks let it through; "x >= 0" ones do not).
#include <catch2/catch.hpp>
#include <limits>

#include "gravac_test_util.hpp"

using namespace gravac;

namespace {
const double k_nan = std::numeric_limits<double>::quiet_NaN();
const double k_inf = std::numeric_limits<double>::infinity();

template <class T, class O>
void rejects(const O& opt, const std::string& needle) {
  const auto lay = test::mixed_layout();
  INFO(needle);
  try {
    T t(lay, opt);
    FAIL("accepted an invalid option");
  } catch (const gravac::error& e) {
    CHECK(e.code() == status::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains(needle));
  }
}
template <class T, class O>
void accepts(const O& opt) {
  const auto lay = test::mixed_layout();
  CHECK_NOTHROW(T(lay, opt));
}
}  // namespace

TEST_CASE("options: compressors reject invalid options", "[reliability][options]") {
  rejects<topk>(topk_options{.threads = 0}, "topk: threads");
  rejects<topk>(topk_options{.threads = 100000}, "topk: threads");
  rejects<topk>(topk_options{.guess_margin = 0.0f}, "topk: guess_margin");
  rejects<topk>(topk_options{.guess_margin = std::numeric_limits<float>::quiet_NaN()}, "topk: guess_margin");
  rejects<topk>(topk_options{.guess_margin = 1.5f}, "topk: guess_margin");
  accepts<topk>(topk_options{});
  rejects<threshold>(threshold_options{.expected_hits = 0}, "threshold: expected_hits");
  rejects<threshold>(threshold_options{.run_length = 0}, "threshold: run_length");
  rejects<threshold>(threshold_options{.full_histogram_above = 0.0}, "threshold: full_histogram_above");
  rejects<threshold>(threshold_options{.full_histogram_above = k_nan}, "threshold: full_histogram_above");
  rejects<threshold>(threshold_options{.full_histogram_above = 1.5}, "threshold: full_histogram_above");
  accepts<threshold>(threshold_options{});
  rejects<adacomp>(adacomp_options{.conv_bin = 0}, "adacomp: bin lengths");
  rejects<adacomp>(adacomp_options{.dense_bin = 0}, "adacomp: bin lengths");
  rejects<adacomp>(adacomp_options{.bias_bin = 0}, "adacomp: bin lengths");
  accepts<adacomp>(adacomp_options{});
  rejects<qsgd>(qsgd_options{.levels = 0}, "qsgd: levels");
  rejects<qsgd>(qsgd_options{.levels = 40000}, "qsgd: levels");
  rejects<qsgd>(qsgd_options{.bucket = 100}, "qsgd: bucket");
  accepts<qsgd>(qsgd_options{});
  rejects<terngrad>(terngrad_options{.bucket = 65}, "terngrad: bucket");
  accepts<terngrad>(terngrad_options{});
  rejects<cast16>(cast16_options{.format = static_cast<cast16_format>(7)}, "cast16: unknown format");
  accepts<cast16>(cast16_options{});
}

TEST_CASE("options: collectives reject invalid options", "[reliability][options]") {
  rejects<allreduce_compatible>(allreduce_compatible_options{.norm_smoothing = 0.0}, "norm_smoothing");
  rejects<allreduce_compatible>(allreduce_compatible_options{.norm_smoothing = k_nan}, "norm_smoothing");
  rejects<allreduce_compatible>(allreduce_compatible_options{.norm_smoothing = 1.5}, "norm_smoothing");
  accepts<allreduce_compatible>(allreduce_compatible_options{});
  rejects<flexible>(flexible_options{.source = network_source::profile}, "flexible: network_source::profile");
  rejects<flexible>(flexible_options{.sync_interval = 0}, "flexible: sync_interval");
  rejects<flexible>(flexible_options{.window = 1}, "flexible: window");
  accepts<flexible>(flexible_options{});
  CHECK_THROWS_WITH(network_params::from_gbps(-1, 10), Catch::Contains("latency"));
  CHECK_THROWS_WITH(network_params::from_gbps(1e-3, 0), Catch::Contains("bandwidth"));
  CHECK_THROWS_WITH(network_params::from_gbps(k_nan, 10), Catch::Contains("latency"));
  CHECK_THROWS_WITH(network_params::from_gbps(1e-3, k_inf), Catch::Contains("bandwidth"));
}

TEST_CASE("options: policies reject invalid options", "[reliability][options]") {
  for (double f : {0.0, -0.5, 1.5, k_nan, k_inf})
    rejects<fixed_policy>(fixed_policy_options{.kept_fraction = f}, "fixed_policy: kept_fraction");
  accepts<fixed_policy>(fixed_policy_options{.kept_fraction = 1.0});

  const auto gravac_with = [](auto set) {
    gravac_policy_options o;
    set(o);
    return o;
  };
  rejects<gravac_policy>(gravac_with([](auto& o) { o.cf_min = 0.5; }), "gravac_policy: cf_min");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.cf_min = k_nan; }), "gravac_policy: cf_min");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.cf_max = 5; }), "gravac_policy: cf_max");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.cf_max = k_inf; }), "gravac_policy: cf_max");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.scale = 1.0; }), "gravac_policy: scale");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.scale = k_nan; }), "gravac_policy: scale");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.window = 0; }), "gravac_policy: window");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.epsilon = 1.1; }), "gravac_policy: epsilon");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.epsilon = k_nan; }), "gravac_policy: epsilon");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.omega = 1.0; }), "gravac_policy: omega");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.samples_per_step = -1; }), "gravac_policy: samples_per_step");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.time.compute_s = k_nan; }), "gravac_policy: time.compute_s");
  rejects<gravac_policy>(gravac_with([](auto& o) { o.scale = 0.999999; }), "gravac_policy");  // too many candidates
  accepts<gravac_policy>(gravac_policy_options{});

  rejects<accordion_policy>(accordion_policy_options{.low_compression = 0.0}, "accordion_policy: low_compression");
  rejects<accordion_policy>(accordion_policy_options{.low_compression = k_nan}, "accordion_policy: low_compression");
  rejects<accordion_policy>(accordion_policy_options{.high_compression = 0.5}, "accordion_policy: high_compression");
  rejects<accordion_policy>(accordion_policy_options{.eta = 0.0}, "accordion_policy: eta");
  rejects<accordion_policy>(accordion_policy_options{.eta = k_inf}, "accordion_policy: eta");
  rejects<accordion_policy>(accordion_policy_options{.initial_learning_rate = -1},
                            "accordion_policy: initial_learning_rate");
  accepts<accordion_policy>(accordion_policy_options{});

  rejects<adacomp_policy>(adacomp_policy_options{.conv_bin = 1}, "adacomp_policy: conv_bin");
  rejects<adacomp_policy>(adacomp_policy_options{.dense_bin = 0}, "adacomp_policy: dense_bin");
  rejects<adacomp_policy>(adacomp_policy_options{.recurrent_bin = 1}, "adacomp_policy: recurrent_bin");
  rejects<adacomp_policy>(adacomp_policy_options{.bias_or_norm_bin = 1}, "adacomp_policy: bias_or_norm_bin");
  accepts<adacomp_policy>(adacomp_policy_options{});

  const auto moo_with = [](auto set) {
    moo_policy_options o;
    set(o);
    return o;
  };
  rejects<moo_policy>(moo_with([](auto& o) { o.candidates.clear(); }), "moo_policy: at least one candidate");
  rejects<moo_policy>(moo_with([](auto& o) { o.candidates = {0.1, 1.0}; }), "moo_policy: candidate fractions");
  rejects<moo_policy>(moo_with([](auto& o) { o.candidates = {k_nan}; }), "moo_policy: candidate fractions");
  rejects<moo_policy>(moo_with([](auto& o) { o.warmup_start = 0; }), "moo_policy");
  rejects<moo_policy>(moo_with([](auto& o) { o.weight_time = k_nan; }), "moo_policy");
  rejects<moo_policy>(moo_with([](auto& o) { o.weight_time = 0, o.weight_gain = 0; }), "moo_policy");
  rejects<moo_policy>(moo_with([](auto& o) { o.gain_smoothing = 0; }), "moo_policy: gain_smoothing");
  rejects<moo_policy>(moo_with([](auto& o) { o.scan_points = 1; }), "moo_policy: scan_points");
  rejects<moo_policy>(moo_with([](auto& o) { o.source = network_source::profile; }), "moo_policy");
  rejects<moo_policy>(moo_with([](auto& o) { o.network.alpha = k_nan; }), "alpha and beta");
  accepts<moo_policy>(moo_policy_options{});
}

TEST_CASE("options: layouts, communicators and the trainer reject invalid arguments", "[reliability][options]") {
  layout lay;
  CHECK_THROWS_WITH(lay.add("", {3}, layer_kind::dense), Catch::Contains("needs a name"));
  CHECK_THROWS_WITH(lay.add("a", {}, layer_kind::dense), Catch::Contains("needs a shape"));
  lay.add("a", {3}, layer_kind::dense);
  CHECK_THROWS_WITH(lay.add("a", {4}, layer_kind::dense), Catch::Contains("duplicate layer name"));
  CHECK_THROWS_WITH(thread_team(0), Catch::Contains("size must be positive"));
  thread_team team(2);
  CHECK_THROWS_WITH(thread_communicator(team, 2), Catch::Contains("rank out of range"));
  CHECK_THROWS_WITH(thread_communicator(team, -1), Catch::Contains("rank out of range"));
  run_ranks(1, [&](thread_communicator& comm) {
    std::vector<std::byte> b(4);
    CHECK_THROWS_WITH(comm.broadcast(b, 1), Catch::Contains("root out of range"));
    using T = trainer<topk, allgather, fixed_policy>;
    layout empty_only;
    empty_only.add("nothing", {0}, layer_kind::dense);
    CHECK_THROWS_WITH(T(comm, empty_only, {}), Catch::Contains("no elements"));
    // A component's invalid option fails the trainer's construction too.
    CHECK_THROWS_WITH(T(comm, test::mixed_layout(), {.compressor = {.threads = 0}}), Catch::Contains("topk: threads"));
    T t(comm, test::mixed_layout(), {});
    std::vector<float> short_grad(10);
    CHECK_THROWS_WITH(t.step(short_grad), Catch::Contains("gradient buffer has 10 elements"));
  });
}
