// Runs under mpiexec with 4 ranks: the reliability guarantees on real MPI. Every failure
// injected on one rank must end with an error on every rank (so the job never hangs),
// naming the rank. (A rank that throws outside gravac is covered by the test
// mpi_abort_on_rank_failure, which must end the job through gravac::run_or_abort.)
#include <catch2/catch.hpp>
#include <limits>

#include "gravac/checkpoint.hpp"
#include "gravac/comm/mpi_communicator.hpp"
#include "reliability_util.hpp"

using namespace gravac;

namespace {
using topk_trainer = trainer<topk, allgather, fixed_policy>;

// All ranks agree that `ok` holds on every rank (so one rank's failure fails all).
bool all_ranks(mpi_communicator& comm, bool ok) {
  double v = ok ? 0.0 : 1.0;
  comm.allreduce_max(std::span<double>(&v, 1));
  return v == 0.0;
}
}  // namespace

TEST_CASE("MPI: a layout mismatch fails on every rank, naming the odd rank", "[mpi][reliability]") {
  mpi_communicator comm;
  layout lay = test::mixed_layout();
  if (comm.rank() == comm.size() - 1) lay.add("extra", {2}, layer_kind::dense);
  try {
    topk_trainer t(comm, lay, {});
    FAIL("no throw");
  } catch (const gravac::error& e) {
    CHECK(e.code() == status::layout_mismatch);
    CHECK_THAT(e.what(), Catch::Contains("ranks " + std::to_string(comm.size() - 1) + " differ from rank 0"));
  }
}

TEST_CASE("MPI: a NaN on one rank is handled identically by every rank", "[mpi][reliability][non_finite]") {
  mpi_communicator comm;
  const auto lay = test::mixed_layout();
  for (auto action : {non_finite_action::throw_error, non_finite_action::skip_step, non_finite_action::zero_values}) {
    topk_trainer t(comm, lay, {.policy = {.kept_fraction = 0.1}, .on_non_finite = action});
    auto g = test::make_data(lay.numel(), comm.rank() + 1);
    if (comm.rank() == 1) g[lay[4].offset + 2] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> res_before(t.residual().begin(), t.residual().end());
    std::vector<float> u(g.size());  // what a finite rank keeps when the step throws: u = g + e
    for (std::size_t i = 0; i < g.size(); ++i) u[i] = res_before[i] + g[i];
    bool threw = false, skipped = false;
    try {
      skipped = t.step(g).skipped;
    } catch (const gravac::error& e) {
      threw = true;
      CHECK(e.code() == status::non_finite);
      CHECK_THAT(e.what(), Catch::Contains(comm.rank() == 1 ? "layer 'fc2.weight'" : "rank 1's gradient"));
    }
    INFO("action " << static_cast<int>(action));
    CHECK(threw == (action == non_finite_action::throw_error));
    CHECK(skipped == (action == non_finite_action::skip_step));
    // skip_step leaves every residual alone; throw_error leaves the failing rank's alone and
    // gives every other rank what it sent back (the flag rides in the step's collective).
    const std::vector<float> now(t.residual().begin(), t.residual().end());
    if (action == non_finite_action::skip_step || (threw && comm.rank() == 1))
      CHECK(test::bitwise_equal(now, res_before));
    else if (threw)
      CHECK(test::bitwise_equal(now, u));
    if (!threw)
      for (float x : g) REQUIRE(std::isfinite(x));
    CHECK(all_ranks(comm, true));  // every rank got here: nobody is left waiting
  }
}

TEST_CASE("MPI: check_consistency names the ranks whose decision diverged", "[mpi][reliability]") {
  mpi_communicator comm;
  const auto lay = test::mixed_layout();
  const double f = comm.rank() == 2 ? 0.3 : 0.1;
  topk_trainer t(comm, lay, {.policy = {.kept_fraction = f}, .check_consistency = true});
  auto g = test::make_data(lay.numel(), comm.rank());
  try {
    t.step(g);
    FAIL("no throw");
  } catch (const gravac::error& e) {
    CHECK(e.code() == status::diverged);
    CHECK_THAT(e.what(), Catch::Contains("ranks 2 planned different step parameters"));
  }
}

TEST_CASE("MPI: checkpoint, restore and resume are bit-identical; a bad file fails every rank",
          "[mpi][reliability][checkpoint]") {
  mpi_communicator comm;
  const fixed_policy_options pol{.kept_fraction = 0.05};
  test::linear_model straight;
  {
    topk_trainer t(comm, straight.lay, {.policy = pol, .seed = 3});
    straight.train(t, comm.rank(), 200);
  }
  test::scratch_dir dir("mpi-rank" + std::to_string(comm.rank()));
  const std::string path = dir.file("state.ckpt");
  test::linear_model resumed;
  {
    topk_trainer t(comm, resumed.lay, {.policy = pol, .seed = 3});
    resumed.train(t, comm.rank(), 100);
    save_checkpoint(t, path);
  }
  {
    topk_trainer t(comm, resumed.lay, {.policy = pol});
    CHECK(restore_checkpoint(t, path).steps == 100);
    resumed.train(t, comm.rank(), 200);
  }
  CHECK(test::bitwise_equal(resumed.params, straight.params));

  // Rank 1's file loses its tail: every rank refuses to restore, naming rank 1.
  if (comm.rank() == 1) {
    auto bytes = detail::read_file(path);
    bytes.resize(bytes.size() - 5);
    write_file_atomically(path, bytes);
  }
  topk_trainer t(comm, resumed.lay, {.policy = pol});
  try {
    restore_checkpoint(t, path);
    FAIL("no throw");
  } catch (const gravac::error& e) {
    CHECK_THAT(e.what(), Catch::Contains("rank 1: ") && Catch::Contains("truncated"));
  }
  CHECK(t.steps() == 0);
}

TEST_CASE("MPI: with verify_layout off, a foreign packet is rejected on every rank", "[mpi][reliability][packet]") {
  mpi_communicator comm;
  layout lay = test::mixed_layout();
  if (comm.rank() == 0) lay.add("extra", {3}, layer_kind::dense);
  topk_trainer t(comm, lay, {.policy = {.kept_fraction = 0.1}, .verify_layout = false});
  auto g = test::make_data(lay.numel(), comm.rank());
  try {
    t.step(g);
    FAIL("no throw");
  } catch (const gravac::error& e) {
    CHECK(e.code() == status::layout_mismatch);
    CHECK_THAT(e.what(), Catch::Contains(comm.rank() == 0 ? "from rank 1" : "from rank 0"));
  }
}
