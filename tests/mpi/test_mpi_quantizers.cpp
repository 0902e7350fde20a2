// Runs under mpiexec with 4 ranks: AdaComp and the quantizers x {allgather, dense_allreduce}
// equal the serial reference, bit-identical on every rank, residuals included.
#include <catch2/catch.hpp>

#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {
template <class C, class K>
void check_quantizer_against_reference(const typename C::options& copt, double f) {
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
    auto data = [&](int r) {
      return test::make_data(lay.numel(), 100 * s + r + 1,
                             r % 2 ? test::distribution::laplace : test::distribution::gaussian);
    };
    auto g = data(comm.rank());
    t.step(g);
    std::vector<std::vector<float>> grads(n);
    for (int r = 0; r < n; ++r) grads[r] = data(r);
    auto p = test::params_for(lay, f, s, 5);
    p.ranks = n;  // as the trainer sets it (cast16 divides by it)
    auto ref = test::serial_reference<C>(lay, copt, p, grads, ref_res);
    INFO("step " << s << " rank " << comm.rank() << " fraction " << f);
    CHECK(test::max_rel_diff(g, ref) < 1e-5);
    double sum = 0;
    for (float x : g) sum += x;
    std::vector<double> lo{sum}, hi{-sum};
    comm.allreduce_max(lo);
    comm.allreduce_max(hi);
    CHECK(lo[0] == -hi[0]);
  }
  CHECK(std::equal(t.residual().begin(), t.residual().end(), ref_res[comm.rank()].begin()));
}

template <class C>
void both(const typename C::options& copt) {
  for (double f : {0.1, 1.0}) {
    check_quantizer_against_reference<C, allgather>(copt, f);
    check_quantizer_against_reference<C, dense_allreduce>(copt, f);
  }
}
}  // namespace

TEST_CASE("MPI: AdaComp and the quantizers x collectives equal the serial reference", "[mpi][quant]") {
  both<adacomp>({});
  both<qsgd>({});
  both<qsgd>({.levels = 3, .bucket = 64});
  both<terngrad>({});
  both<sign>({});
  both<cast16>({.format = cast16_format::fp16});
  both<cast16>({.format = cast16_format::bf16});
}
