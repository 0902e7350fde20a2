// Runs under mpiexec with 4 ranks: the same checks as the thread tests, on real MPI.
#include <catch2/catch.hpp>

#include "gravac/comm/mpi_communicator.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {
template <class C, class K>
void check_against_reference(const typename C::options& copt, double f) {
  mpi_communicator comm;
  const int n = comm.size();
  const auto lay = test::mixed_layout();
  using T = trainer<C, K, fixed_policy>;
  typename T::options opt;
  opt.compressor = copt;
  opt.policy.kept_fraction = f;
  opt.seed = 5;
  T t(comm, lay, opt);
  std::vector<std::vector<float>> ref_res(n, std::vector<float>(lay.numel(), 0.0f));
  for (int s = 0; s < 3; ++s) {
    auto g = test::make_data(lay.numel(), 100 * s + comm.rank() + 1);
    t.step(g);
    std::vector<std::vector<float>> grads(n);
    for (int r = 0; r < n; ++r) grads[r] = test::make_data(lay.numel(), 100 * s + r + 1);
    auto ref = test::serial_reference<C>(lay, copt, test::params_for(lay, f, s, 5), grads, ref_res);
    INFO("step " << s << " rank " << comm.rank());
    CHECK(test::max_rel_diff(g, ref) < 1e-5);
    // Identical on every rank: compare a checksum against rank 0's.
    double sum = 0;
    for (float x : g) sum += x;
    std::vector<double> lo{sum}, hi{-sum};
    comm.allreduce_max(lo);
    comm.allreduce_max(hi);
    CHECK(lo[0] == -hi[0]);
  }
  CHECK(std::equal(t.residual().begin(), t.residual().end(), ref_res[comm.rank()].begin()));
}
}  // namespace

TEST_CASE("MPI: every compressor x collective equals the serial reference", "[mpi][trainer]") {
  for (double f : {0.01, 0.2, 1.0}) {
    check_against_reference<identity, dense_allreduce>({}, f);
    check_against_reference<topk, allgather>({}, f);
    check_against_reference<topk, dense_allreduce>({}, f);
    check_against_reference<randomk, allgather>({}, f);
    check_against_reference<randomk, dense_allreduce>({}, f);
  }
}

TEST_CASE("MPI: allgatherv moves variable sizes without padding", "[mpi]") {
  mpi_communicator comm;
  std::vector<std::byte> mine(static_cast<std::size_t>(comm.rank()) * 3 + 1, std::byte(comm.rank()));
  std::vector<std::byte> all;
  std::vector<std::size_t> sizes;
  comm.allgatherv(mine, all, sizes);
  std::size_t expect = 0;
  for (int r = 0; r < comm.size(); ++r) {
    CHECK(sizes[r] == static_cast<std::size_t>(r) * 3 + 1);
    expect += sizes[r];
  }
  CHECK(all.size() == expect);
  CHECK(all.back() == std::byte(comm.size() - 1));
}

TEST_CASE("MPI: a layout mismatch fails on every rank", "[mpi][errors]") {
  mpi_communicator comm;
  layout lay = test::mixed_layout();
  if (comm.rank() == comm.size() - 1) lay.add("extra", {2}, layer_kind::dense);
  CHECK_THROWS_WITH((trainer<topk, allgather, fixed_policy>(comm, lay, {})),
                    Catch::Contains("layout differs between ranks"));
}

TEST_CASE("MPI: a non-finite gradient on one rank throws on every rank", "[mpi][errors]") {
  mpi_communicator comm;
  const auto lay = test::mixed_layout();
  trainer<topk, allgather, fixed_policy> t(comm, lay, {});
  auto g = test::make_data(lay.numel(), comm.rank());
  if (comm.rank() == 1) g[0] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(t.step(g), Catch::Contains("non-finite"));
}
