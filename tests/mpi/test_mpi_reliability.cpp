// Runs under mpiexec with 4 ranks: the reliability guarantees on real MPI. Every failure
// injected on one rank must end with an error on every rank (so the job never hangs),
// naming the rank. (A rank that throws outside gravac is covered by the test
// mpi_abort_on_rank_failure, which must end the job through gravac::run_or_abort.)
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "bucket_checks.hpp"
#include "gravac/checkpoint.hpp"
#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/compress/identity.hpp"
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

namespace {
template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
}  // namespace

TEST_CASE("MPI: a negative, NaN or infinite collective_timeout is refused at construction",
          "[mpi][reliability][timeout]") {
  using seconds = std::chrono::duration<double>;
  for (double bad : {-1.0, -1e-9, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    INFO("collective_timeout " << bad);
    try {
      mpi_communicator comm(mpi_options{.collective_timeout = seconds(bad)});
      FAIL("no throw");
    } catch (const gravac::error& e) {
      CHECK(e.code() == status::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("collective_timeout must be zero (off) or a positive finite number"));
    }
  }
  mpi_communicator off;  // the default is off; zero is off too
  CHECK(off.options().collective_timeout.count() == 0.0);
  mpi_communicator zero(MPI_COMM_WORLD, {.collective_timeout = seconds(0)});
  CHECK(zero.options().collective_timeout.count() == 0.0);
  mpi_communicator on({.collective_timeout = std::chrono::seconds(60)});
  CHECK(on.options().collective_timeout.count() == 60.0);
  CHECK(all_ranks(off, true));
}

TEST_CASE("MPI: with a collective_timeout the collectives give the bits they give without",
          "[mpi][reliability][timeout]") {
  mpi_communicator plain;
  mpi_communicator timed({.collective_timeout = std::chrono::seconds(60)});
  const int rank = plain.rank(), n = plain.size();
  const auto seed = static_cast<std::uint64_t>(rank) + 1;

  // The same blocking calls with a watchdog beside them: the same bits, on any rank count
  // (an earlier design polled the non-blocking forms, whose float sums Open MPI 4.1 added in
  // another order on 3 and 5 ranks).
  for (std::size_t len : {std::size_t{1}, std::size_t{1000}, std::size_t{100003}}) {
    INFO("allreduce_sum of " << len << " floats");
    auto a = test::make_data(len, seed * 7 + len), b = a;
    plain.allreduce_sum(std::span<float>(a));
    timed.allreduce_sum(std::span<float>(b));
    CHECK(same_bytes(a, b));
    auto first = b;  // rank 0's result, compared on every rank
    timed.broadcast_values(std::span<float>(first), 0);
    CHECK(same_bytes(b, first));
  }
  {
    std::vector<double> a(257), m(257);
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = std::sin(static_cast<double>(i * 31 + static_cast<std::size_t>(rank) * 7)) * 1e3;
      m[i] = std::cos(static_cast<double>(i * 17 + static_cast<std::size_t>(rank) * 5));
    }
    auto b = a, mb = m;
    plain.allreduce_sum(std::span<double>(a));
    timed.allreduce_sum(std::span<double>(b));
    CHECK(same_bytes(a, b));
    plain.allreduce_max(std::span<double>(m));
    timed.allreduce_max(std::span<double>(mb));
    CHECK(same_bytes(m, mb));
  }
  {
    // allgatherv with a different size on every rank, rank 1 sending nothing.
    const auto mine_f = test::make_data(rank == 1 ? 0 : 100 * static_cast<std::size_t>(rank) + 3, seed);
    const auto mine = std::as_bytes(std::span<const float>(mine_f));
    mpi_communicator::byte_buffer a, b;
    std::vector<std::size_t> sa, sb;
    plain.allgatherv(mine, a, sa);
    timed.allgatherv(mine, b, sb);
    CHECK(same_bytes(a, b));
    CHECK(sa == sb);
  }
  {
    auto a = test::make_data(4099, 99 + seed), b = a;
    plain.broadcast_values(std::span<float>(a), n - 1);
    timed.broadcast_values(std::span<float>(b), n - 1);
    CHECK(same_bytes(a, b));
  }
  {
    // alltoallv: block j of rank r holds (r + 2 j) % 5 * 8 bytes, some of them empty.
    std::vector<std::size_t> sizes(static_cast<std::size_t>(n));
    std::size_t total = 0;
    for (int j = 0; j < n; ++j)
      total += sizes[static_cast<std::size_t>(j)] = static_cast<std::size_t>((rank + 2 * j) % 5) * 8;
    const auto send_f = test::make_data(total / sizeof(float), 5 * seed);
    const auto send = std::as_bytes(std::span<const float>(send_f));
    mpi_communicator::byte_buffer a, b;
    std::vector<std::size_t> ra, rb;
    plain.alltoallv(send, sizes, a, ra);
    timed.alltoallv(send, sizes, b, rb);
    CHECK(same_bytes(a, b));
    CHECK(ra == rb);
  }
  timed.barrier();
  CHECK(all_ranks(timed, true));
}

TEST_CASE("MPI: trainer steps, synchronous and overlapped, give the same bits with a collective_timeout",
          "[mpi][reliability][timeout]") {
  mpi_communicator plain;
  mpi_communicator timed({.collective_timeout = std::chrono::seconds(60)});
  const auto lay = test::mixed_layout();
  for (auto mode : {test::step_mode::synchronous, test::step_mode::overlapped}) {
    INFO("mode " << static_cast<int>(mode));
    CHECK(test::bucketed_run<topk, allgather, gravac_policy>(plain, lay, test::bucket_steps, 2048, mode) ==
          test::bucketed_run<topk, allgather, gravac_policy>(timed, lay, test::bucket_steps, 2048, mode));
    const auto dense_plain =
        test::bucketed_run<identity, dense_allreduce, fixed_policy>(plain, lay, test::bucket_steps, 2048, mode);
    const auto dense_timed =
        test::bucketed_run<identity, dense_allreduce, fixed_policy>(timed, lay, test::bucket_steps, 2048, mode);
    CHECK(dense_plain == dense_timed);
  }
}
