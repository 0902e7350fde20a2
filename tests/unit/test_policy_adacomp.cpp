// adacomp_policy: L_T by layer kind, dense biases, and the compression it reports.
#include <catch2/catch.hpp>
#include <cmath>

#include "gravac/policy/adacomp_policy.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {
layout kinds() {
  layout l;
  l.add("conv", {8, 3, 3, 3}, layer_kind::conv);      // 216
  l.add("conv.bias", {8}, layer_kind::bias_or_norm);  // 8
  l.add("fc", {30, 40}, layer_kind::dense);           // 1200
  l.add("lstm", {40, 160}, layer_kind::recurrent);    // 6400
  return l;
}
}  // namespace

TEST_CASE("adacomp: L_T by layer kind, biases dense, 1 / L_T for fraction compressors", "[policy][adacomp]") {
  const auto lay = kinds();
  adacomp_policy p(lay);
  step_params sp;
  adacomp_settings ss;
  p.plan(sp);
  p.plan_settings(ss);
  CHECK(ss.bin_length == std::vector<std::uint32_t>{50, 50, 500, 500});
  CHECK(sp.kept_fraction == std::vector<double>{1.0 / 50, 1.0, 1.0 / 500, 1.0 / 500});
  CHECK(sp.global_fraction == Approx((216.0 / 50 + 1200.0 / 500 + 6400.0 / 500) / (216 + 1200 + 6400)));
  CHECK(p.compressed(0));
  CHECK_FALSE(p.compressed(1));
  CHECK(p.bin_length(3) == 500);

  adacomp_policy custom(lay, {.conv_bin = 20,
                              .dense_bin = 100,
                              .recurrent_bin = 300,
                              .bias_or_norm_bin = 4,
                              .bias_or_norm_dense = false,
                              .collective = collective_kind::allgather});
  custom.plan(sp);
  custom.plan_settings(ss);
  CHECK(ss.bin_length == std::vector<std::uint32_t>{20, 4, 100, 300});
  CHECK(sp.kept_fraction == std::vector<double>{1.0 / 20, 1.0 / 4, 1.0 / 100, 1.0 / 300});
  CHECK(sp.collective == collective_kind::allgather);
}

TEST_CASE("adacomp: achieved compression per layer and its running mean", "[policy][adacomp]") {
  adacomp_policy p(kinds());
  CHECK(std::isnan(p.achieved_cf(0)));
  CHECK(std::isnan(p.mean_model_cf()));
  step_report r;
  r.kept_fraction = {0.02, 1.0, 0.004, 0.001};
  p.observe(r);
  CHECK(p.achieved_cf(0) == Approx(50));
  CHECK(p.achieved_cf(1) == 1.0);
  CHECK(p.achieved_cf(2) == Approx(250));
  CHECK(p.achieved_cf(3) == Approx(1000));
  r.kept_fraction = {0.04, 1.0, 0.006, 0.0};
  p.observe(r);
  CHECK(p.achieved_fraction(0) == 0.04);
  CHECK(std::isinf(p.achieved_cf(3)));  // nothing sent this step
  CHECK(p.mean_fraction(0) == Approx(0.03));
  CHECK(p.mean_cf(0) == Approx(1 / 0.03));
  CHECK(p.mean_cf(2) == Approx(200));
  CHECK(p.mean_cf(3) == Approx(2000));
  // Over the model: elements / values sent.
  const double kept2 = 0.04 * 216 + 8 + 0.006 * 1200 + 0.0;
  const double kept1 = 0.02 * 216 + 8 + 0.004 * 1200 + 0.001 * 6400;
  CHECK(p.model_cf() == Approx(7824 / kept2));
  CHECK(p.mean_model_cf() == Approx(2 * 7824 / (kept1 + kept2)));
  CHECK(p.steps_observed() == 2);
  // Skipped steps and reports of another layout are ignored.
  r.skipped = true;
  p.observe(r);
  r.skipped = false;
  r.kept_fraction = {0.5};
  p.observe(r);
  CHECK(p.steps_observed() == 2);
}

TEST_CASE("adacomp: works with a fraction compressor (top-k) in the trainer", "[policy][adacomp][threads]") {
  const auto lay = kinds();
  run_ranks(2, [&](thread_communicator& comm) {
    trainer<topk, allgather, adacomp_policy> t(comm, lay, {});
    for (int s = 0; s < 3; ++s) {
      auto g = test::make_data(lay.numel(), 10 * s + comm.rank());
      t.step(g);
      adacomp_settings ss;  // top-k has no step settings: the bin lengths stay with the policy
      t.policy().plan_settings(ss);
      CHECK(ss.bin_length == std::vector<std::uint32_t>{50, 50, 500, 500});
    }
    const auto& pol = t.policy();
    for (std::size_t i : {0u, 2u, 3u}) {
      const double numel = lay[i].numel;
      CHECK(pol.achieved_cf(i) == Approx(numel / kept_count(lay[i].numel, 1.0 / pol.bin_length(i))));
      CHECK(pol.mean_cf(i) == Approx(pol.achieved_cf(i)));
    }
    CHECK(pol.achieved_cf(1) == 1.0);
  });
}

TEST_CASE("adacomp: the trainer gives each bucket's AdaComp its layers' bin lengths", "[policy][adacomp][threads]") {
  const auto lay = kinds();
  for (std::size_t bucket_bytes : {one_bucket, bucket_per_layer}) {
    INFO("bucket_bytes " << bucket_bytes);
    run_ranks(2, [&](thread_communicator& comm) {
      trainer<adacomp, allgather, adacomp_policy> t(
          comm, lay,
          {.policy = {.conv_bin = 20, .dense_bin = 100, .recurrent_bin = 300, .bias_or_norm_bin = 4},
           .check_consistency = true,
           .bucket_bytes = bucket_bytes});
      auto g = test::make_data(lay.numel(), 3 + comm.rank());
      t.step(g);
      CHECK(t.last_settings().bin_length == std::vector<std::uint32_t>{20, 4, 100, 300});
      for (std::size_t b = 0; b < t.buckets().size(); ++b) {
        const auto& bk = t.buckets()[b];
        for (std::size_t i = bk.first_layer; i < bk.last_layer; ++i)
          CHECK(t.compressor(b).bin_length(i - bk.first_layer) == t.policy().bin_length(i));
      }
    });
  }
}

TEST_CASE("adacomp: options validated, state saved and restored", "[policy][adacomp][state]") {
  const auto lay = kinds();
  CHECK_THROWS_WITH(adacomp_policy(lay, {.conv_bin = 1}), Catch::Contains("conv_bin"));
  CHECK_THROWS_WITH(adacomp_policy(lay, {.dense_bin = 0}), Catch::Contains("dense_bin"));
  CHECK_THROWS_WITH(adacomp_policy(lay, {.recurrent_bin = 1}), Catch::Contains("recurrent_bin"));
  CHECK_THROWS_WITH(adacomp_policy(lay, {.bias_or_norm_bin = 1}), Catch::Contains("bias_or_norm_bin"));
  adacomp_policy p(lay);
  step_report r;
  r.kept_fraction = {0.02, 1.0, 0.004, 0.001};
  p.observe(r);
  std::vector<std::byte> bytes;
  p.save(bytes);
  adacomp_policy q(lay);
  q.load(bytes);
  r.kept_fraction = {0.04, 1.0, 0.002, 0.003};
  p.observe(r);
  q.observe(r);
  for (std::size_t i = 0; i < 4; ++i) CHECK(q.mean_cf(i) == p.mean_cf(i));
  CHECK(q.mean_model_cf() == p.mean_model_cf());
  adacomp_policy other(lay, {.conv_bin = 60});
  CHECK_THROWS_WITH(other.load(bytes), Catch::Contains("other options"));
}
