// Runs under mpiexec with 4 ranks: the adaptive policies on real MPI, fed deliberately
// different local gradients. Every rank must take the same decision at every step (the
// hashes of step_params are allgathered and compared), the averaged gradient must equal
// the serial reference under the chosen parameters, and a save / restore mid-run must
// continue bit for bit. No REQUIRE: a rank that stopped early would hang the others.
#include <catch2/catch.hpp>
#include <cstring>
#include <type_traits>

#include "gravac/comm/mpi_communicator.hpp"
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
constexpr int total_steps = 40;

// True on every rank when every rank logged the same decisions as rank 0.
bool same_decisions_everywhere(mpi_communicator& comm, const test::rank_log& log) {
  std::vector<std::uint64_t> mine;
  for (const auto& p : log.params) mine.push_back(p.hash);
  std::vector<std::byte> all;
  std::vector<std::size_t> sizes;
  comm.allgatherv(std::as_bytes(std::span<const std::uint64_t>(mine)), all, sizes);
  bool same = true;
  for (int r = 0; r < comm.size(); ++r)
    same = same && sizes[r] == sizes[0] && std::memcmp(all.data() + r * sizes[0], all.data(), sizes[0]) == 0;
  return same;
}

template <class C, class K, class P>
void check_agreement(const typename trainer<C, K, P>::options& opt) {
  mpi_communicator comm;
  const auto lay = test::mixed_layout();
  trainer<C, K, P> t(comm, lay, opt);
  test::rank_log log;
  test::run_schedule(t, comm.rank(), 0, total_steps, log);
  CHECK(same_decisions_everywhere(comm, log));
  // The policy state too (checkpoints compare it across ranks).
  std::vector<std::byte> state, all;
  std::vector<std::size_t> sizes;
  t.policy().save(state);
  comm.allgatherv(state, all, sizes);
  for (int r = 0; r < comm.size(); ++r)
    CHECK((sizes[r] == state.size() && std::memcmp(all.data() + r * state.size(), state.data(), state.size()) == 0));
  std::vector<std::vector<float>> res;
  const auto ref = test::schedule_reference<C>(lay, opt.compressor, log.params, comm.size(), res);
  for (int s = 0; s < total_steps; ++s) {
    INFO("step " << s << " rank " << comm.rank());
    // allgather sums the packets in rank order, as the reference does: bit for bit. MPI's
    // Allreduce sums in its own order: equal up to rounding.
    if constexpr (std::is_same_v<K, allgather>)
      CHECK(log.out[s] == ref[s]);
    else
      CHECK(test::max_rel_diff(log.out[s], ref[s]) < 1e-5);
  }
  CHECK(log.residual == res[comm.rank()]);
}

template <class P>
void check_restore(const typename P::options& popt, int cut) {
  using T = trainer<topk, allgather, P>;
  mpi_communicator comm;
  const auto lay = test::mixed_layout();
  typename T::options opt;
  opt.policy = popt;
  test::rank_log full, part;
  {
    T t(comm, lay, opt);
    test::run_schedule(t, comm.rank(), 0, total_steps, full);
  }
  std::vector<std::byte> saved, saved_local;
  {
    T t(comm, lay, opt);
    test::run_schedule(t, comm.rank(), 0, cut, part);
    t.policy().save(saved);
    if constexpr (requires { t.policy().save_local(saved_local); }) t.policy().save_local(saved_local);
  }
  T t(comm, lay, opt);
  t.policy().load(saved);
  if constexpr (requires { t.policy().load_local(saved_local); }) t.policy().load_local(saved_local);
  std::copy(part.residual.begin(), part.residual.end(), t.residual().begin());
  t.set_steps(static_cast<std::uint64_t>(cut));
  test::run_schedule(t, comm.rank(), cut, total_steps, part);
  for (int s = 0; s < total_steps; ++s) {
    INFO("cut " << cut << " step " << s << " rank " << comm.rank());
    CHECK(part.params[s].hash == full.params[s].hash);
    CHECK(part.out[s] == full.out[s]);
  }
  CHECK(part.residual == full.residual);
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

TEST_CASE("MPI: gravac_policy decides identically on every rank", "[mpi][policy][gravac]") {
  using T = trainer<topk, allgather, gravac_policy>;
  check_agreement<topk, allgather, gravac_policy>(T::options{.policy = small_gravac()});
  auto epochs = small_gravac();
  epochs.period_steps = 0;
  check_agreement<topk, allgather, gravac_policy>(T::options{.policy = epochs});
  using D = trainer<topk, dense_allreduce, gravac_policy>;
  check_agreement<topk, dense_allreduce, gravac_policy>(D::options{.policy = small_gravac()});
}

TEST_CASE("MPI: accordion_policy decides identically on every rank", "[mpi][policy][accordion]") {
  using T = trainer<topk, allgather, accordion_policy>;
  // A decision every interval: the schedule has 8 epochs, fewer than the default compare_every (10).
  check_agreement<topk, allgather, accordion_policy>(T::options{.policy = {.compare_every = 1}});
  check_agreement<topk, allgather, accordion_policy>(T::options{.policy = {.interval_steps = 3, .compare_every = 1}});
}

TEST_CASE("MPI: adacomp_policy with top-k and with the AdaComp compressor", "[mpi][policy][adacomp]") {
  using T = trainer<topk, allgather, adacomp_policy>;
  check_agreement<topk, allgather, adacomp_policy>(T::options{.policy = {.conv_bin = 10, .dense_bin = 40}});
#ifdef GRAVAC_TEST_HAVE_ADACOMP
  using A = trainer<adacomp, allgather, adacomp_policy>;
  check_agreement<adacomp, allgather, adacomp_policy>(A::options{.policy = {.conv_bin = 10, .dense_bin = 40}});
#endif
}

TEST_CASE("MPI: save / restore mid-run continues bit for bit", "[mpi][policy][state]") {
  // Simulated time without a network model: a fixed compute time per step, so CT (and the
  // search) depend on the synchronized gains only and are reproducible.
  for (int cut : {2, 11, 23}) {
    check_restore<gravac_policy>(small_gravac({time_source::simulated, 0.002, false}), cut);
    check_restore<accordion_policy>({.interval_steps = 3}, cut);
    check_restore<adacomp_policy>({}, cut);
  }
}
