// The reproduction's runs that diverge (bench/reproduce/train_run.hpp): a learning rate far
// too large makes the gradient non-finite; the trainer's protocol throws the same error on
// every rank, and train_run records the run as diverged (where, and every rank's message)
// instead of ending the experiment. The same seed diverges at the same step, a run after it
// trains as if it had run alone, other failures still propagate, and the tables' helpers
// count a diverged run as such (summary_stats.hpp).
#include <catch2/catch.hpp>
#include <cmath>
#include <gravac/core/error.hpp>
#include <string>
#include <vector>

#include "fmnist_training_checks.hpp"
#include "summary_stats.hpp"
#include "train_run.hpp"

namespace {
fmnist::run_config diverging() {
  auto m = fmnist_test::dense_method();
  m.compressor = fmnist::compressor_id::topk;
  m.collective = fmnist::collective_id::allgather;
  m.fixed.kept_fraction = 0.1;
  auto c = fmnist_test::short_run(m);
  c.epochs = 1;
  c.lr = {1e3, 0.1, {}};  // far too large: the weights overflow within a few steps
  return c;
}
fmnist::run_config finishing() {
  auto c = fmnist_test::short_run(fmnist_test::dense_method());
  c.epochs = 1;
  return c;
}
}  // namespace

TEST_CASE("reproduce: a non-finite gradient ends the run as diverged on every rank, and the next run trains") {
  const auto& train = fmnist_test::data(fmnist::split::train);
  const auto& test = fmnist_test::data(fmnist::split::test);
  const auto alone = repro::train_run(4, train, test, finishing());
  REQUIRE_FALSE(alone.diverged);

  const auto d = repro::train_run(4, train, test, diverging());
  REQUIRE(d.diverged);
  INFO(d.where());
  // Every rank threw the non-finite error (train_run refuses a run where one did not).
  REQUIRE(d.by_rank.size() == 4);
  for (const auto& m : d.by_rank) CHECK(m.find("non-finite") != std::string::npos);
  CHECK(d.error.find("layer '") != std::string::npos);
  // Stopped at the step after the last one recorded, within the first epoch.
  CHECK(d.diverged_step == d.r.steps.size());
  CHECK(d.diverged_step < 100);
  CHECK(d.diverged_epoch == 0);
  CHECK(d.r.epochs.empty());
  CHECK(d.where().rfind("diverged at step " + std::to_string(d.diverged_step + 1) + " (epoch 1)", 0) == 0);
  CHECK(repro::status_columns(d).rfind("diverged,0," + std::to_string(d.diverged_step) + ",\"", 0) == 0);
  CHECK(repro::status_columns(alone) == "finished,,,");

  // The same seed diverges at the same step with the same message.
  const auto again = repro::train_run(4, train, test, diverging());
  REQUIRE(again.diverged);
  CHECK(again.diverged_step == d.diverged_step);
  CHECK(again.error == d.error);

  // Nothing of the diverged run is left behind: the next run equals one that ran alone.
  const auto after = repro::train_run(4, train, test, finishing());
  REQUIRE_FALSE(after.diverged);
  CHECK(after.r.final_params == alone.r.final_params);
  CHECK(after.r.epochs.back().test_acc == alone.r.epochs.back().test_acc);
}

TEST_CASE("reproduce: failures other than a non-finite gradient still propagate") {
  const auto& train = fmnist_test::data(fmnist::split::train);
  const auto& test = fmnist_test::data(fmnist::split::test);
  auto c = finishing();
  c.batch = 66;  // not divisible by 4 ranks
  try {
    (void)repro::train_run(4, train, test, c);
    FAIL("an invalid setting was not refused");
  } catch (const gravac::error& e) {
    CHECK(e.code() != gravac::status::non_finite);
  }
}

TEST_CASE("reproduce: the tables count diverged runs and never average them in") {
  const double nan = std::nan("");
  const auto s = repro::summarize({0.8, nan, 0.9});
  CHECK(s.n == 2);
  CHECK(repro::pm_finished(s, 1, 3, "%.2f", 100) == "85.00 ± 7.07 (1/3 diverged)");
  CHECK(repro::pm_finished(repro::summarize({nan}), 1, 1, "%.2f", 100) == "diverged");
  CHECK(repro::pm_finished(repro::summarize({nan, nan}), 2, 2, "%.2f", 100) == "2/2 diverged");
  CHECK(repro::pm_finished(repro::summarize({0.5}), 0, 1, "%.2f", 100) == "50.00");
  // A diverged run counts as not reaching the target (-1).
  CHECK(repro::time_cell({1.0, -1, -1}, 1) == "1.00 (1/3 reached, 1/3 diverged)");
  CHECK(repro::time_cell({-1, -1}, 1) == "not reached (0/2 reached, 1/2 diverged)");
  CHECK(repro::time_cell({-1}, 1) == "diverged");
  CHECK(repro::time_cell({1.0, 3.0}) == "2.00 ± 1.41");
  CHECK(repro::time_cell({-1}) == "not reached");
}
