#include <catch2/catch.hpp>

#include "gravac_test_util.hpp"

using namespace gravac;

namespace {
using gravac::test::ranks;

// Each rank trains `steps` steps on deliberately different gradients; every rank's output
// must equal the serial reference, and every rank must hold the same bits.
template <class C, class K>
void check_against_reference(const typename C::options& copt, double f, int steps = 3) {
  const auto lay = test::mixed_layout();
  using T = trainer<C, K, fixed_policy>;
  typename T::options opt;
  opt.compressor = copt;
  opt.policy.kept_fraction = f;
  opt.seed = 99;
  std::vector<std::vector<std::vector<float>>> outputs(steps, std::vector<std::vector<float>>(ranks));
  std::vector<std::vector<float>> residuals(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    T t(comm, lay, opt);
    for (int s = 0; s < steps; ++s) {
      auto g = test::make_data(lay.numel(), 1000 * s + comm.rank() + 1,
                               comm.rank() % 2 ? test::distribution::laplace : test::distribution::gaussian);
      const auto& rep = t.step(g);
      CHECK(rep.step == static_cast<std::uint64_t>(s));
      outputs[s][comm.rank()] = g;
    }
    residuals[comm.rank()].assign(t.residual().begin(), t.residual().end());
  });
  std::vector<std::vector<float>> ref_res(ranks, std::vector<float>(lay.numel(), 0.0f));
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> grads(ranks);
    for (int r = 0; r < ranks; ++r)
      grads[r] = test::make_data(lay.numel(), 1000 * s + r + 1,
                                 r % 2 ? test::distribution::laplace : test::distribution::gaussian);
    auto p = test::params_for(lay, f, s, 99);
    auto ref = test::serial_reference<C>(lay, copt, p, grads, ref_res);
    for (int r = 0; r < ranks; ++r) {
      INFO("step " << s << " rank " << r);
      CHECK(test::max_rel_diff(outputs[s][r], ref) < 1e-5);
      CHECK(outputs[s][r] == outputs[s][0]);  // identical bits on every rank
    }
  }
  for (int r = 0; r < ranks; ++r) CHECK(residuals[r] == ref_res[r]);
}
}  // namespace

TEST_CASE("every compressor x collective equals the serial reference on threads", "[trainer][threads]") {
  for (double f : {0.01, 0.1, 1.0}) {
    INFO("fraction " << f);
    check_against_reference<identity, allgather>({}, f);
    check_against_reference<identity, dense_allreduce>({}, f);
    check_against_reference<topk, allgather>({}, f);
    check_against_reference<topk, dense_allreduce>({}, f);
    check_against_reference<topk, allgather>({.whole_buffer = true}, f);
    check_against_reference<randomk, allgather>({}, f);
    check_against_reference<randomk, dense_allreduce>({}, f);
  }
}

TEST_CASE("the step report counts bytes and kept fractions", "[trainer][threads]") {
  const auto lay = test::mixed_layout();
  run_ranks(2, [&](thread_communicator& comm) {
    trainer<topk, allgather, fixed_policy> t(comm, lay, {.policy = {.kept_fraction = 0.1}});
    auto g = test::make_data(lay.numel(), comm.rank());
    const auto& r = t.step(g);
    CHECK(r.dense_bytes == lay.numel() * 4);
    CHECK(r.bytes_sent < r.dense_bytes);
    CHECK(r.collective == collective_kind::allgather);
    CHECK(r.kept_fraction[2] == Approx(double(kept_count(lay[2].numel, 0.1)) / lay[2].numel));
    CHECK(r.gain > 0.0);
    CHECK(r.gain < 1.0);
    CHECK(r.layer_grad_norm[0] > 0.0);
  });
}

TEST_CASE("a dense step reports every value kept, on the fast path too", "[trainer][threads]") {
  // fixed_policy needs no statistics, so the dense Allreduce's fast path computes no norms;
  // the kept counts are still what went on the wire: everything.
  const auto lay = test::mixed_layout();
  run_ranks(2, [&](thread_communicator& comm) {
    trainer<identity, dense_allreduce, fixed_policy> t(comm, lay, {});
    for (int s = 0; s < 2; ++s) {
      auto g = test::make_data(lay.numel(), 10 * s + comm.rank());
      const auto& r = t.step(g);
      for (std::size_t i = 0; i < lay.size(); ++i)
        if (lay[i].numel > 0) CHECK(r.kept_fraction[i] == 1.0);
    }
  });
}

TEST_CASE("a layout mismatch across ranks fails on every rank", "[trainer][errors]") {
  std::atomic<int> failures{0};
  CHECK_THROWS_WITH(run_ranks(4,
                              [&](thread_communicator& comm) {
                                layout lay = test::mixed_layout();
                                if (comm.rank() == 2) lay.add("extra", {3}, layer_kind::dense);
                                try {
                                  trainer<topk, allgather, fixed_policy> t(comm, lay, {});
                                } catch (const gravac::error& e) {
                                  CHECK(e.code() == status::layout_mismatch);
                                  ++failures;
                                  throw;
                                }
                              }),
                    Catch::Contains("ranks 2 differ from rank 0"));
  CHECK(failures == 4);
}

TEST_CASE("invalid options are rejected at construction", "[trainer][errors]") {
  const auto lay = test::mixed_layout();
  run_ranks(1, [&](thread_communicator& comm) {
    using T = trainer<topk, allgather, fixed_policy>;
    CHECK_THROWS_WITH(T(comm, lay, {.policy = {.kept_fraction = 0.0}}), Catch::Contains("kept_fraction"));
    CHECK_THROWS_WITH(T(comm, lay, {.policy = {.kept_fraction = 1.5}}), Catch::Contains("kept_fraction"));
    CHECK_THROWS_WITH(T(comm, layout{}, {}), Catch::Contains("no elements"));
    T t(comm, lay, {});
    std::vector<float> wrong(lay.numel() + 1);
    CHECK_THROWS_WITH(t.step(wrong), Catch::Contains("gradient buffer"));
  });
}

TEST_CASE("non-finite gradients: throw, skip or zero, the same on every rank", "[trainer][non_finite]") {
  const auto lay = test::mixed_layout();
  using T = trainer<topk, allgather, fixed_policy>;
  SECTION("throw names the layer on the failing rank and the rank elsewhere") {
    std::atomic<int> thrown{0};
    run_ranks(4, [&](thread_communicator& comm) {
      T t(comm, lay, {});
      auto g = test::make_data(lay.numel(), comm.rank());
      if (comm.rank() == 1) g[lay[2].offset + 3] = std::numeric_limits<float>::quiet_NaN();
      try {
        t.step(g);
      } catch (const gravac::error& e) {
        CHECK(e.code() == status::non_finite);
        if (comm.rank() == 1)
          CHECK_THAT(e.what(), Catch::Contains("fc1.weight"));
        else
          CHECK_THAT(e.what(), Catch::Contains("rank 1"));
        ++thrown;
      }
    });
    CHECK(thrown == 4);
  }
  SECTION("skip leaves residuals untouched on every rank") {
    run_ranks(4, [&](thread_communicator& comm) {
      T t(comm, lay, {.on_non_finite = non_finite_action::skip_step});
      auto g = test::make_data(lay.numel(), comm.rank());
      t.step(g);
      const std::vector<float> before(t.residual().begin(), t.residual().end());
      g = test::make_data(lay.numel(), comm.rank() + 10);
      if (comm.rank() == 3) g[0] = std::numeric_limits<float>::infinity();
      const auto& r = t.step(g);
      CHECK(r.skipped);
      CHECK(std::vector<float>(t.residual().begin(), t.residual().end()) == before);
      CHECK(t.steps() == 2);
    });
  }
  SECTION("zero replaces the offending values") {
    run_ranks(2, [&](thread_communicator& comm) {
      T t(comm, lay, {.policy = {.kept_fraction = 1.0}, .on_non_finite = non_finite_action::zero_values});
      std::vector<float> g(lay.numel(), 1.0f);
      g[5] = std::numeric_limits<float>::quiet_NaN();
      t.step(g);
      CHECK(g[5] == 0.0f);
      CHECK(g[6] == 1.0f);
    });
  }
}

TEST_CASE("an exception on one rank of four ends every rank with an error, no hang", "[threads][errors]") {
  std::atomic<int> aborted{0};
  CHECK_THROWS_WITH(run_ranks(4,
                              [&](thread_communicator& comm) {
                                if (comm.rank() == 2) throw std::runtime_error("boom on two");
                                try {
                                  comm.barrier();
                                } catch (const gravac::error& e) {
                                  CHECK(e.code() == status::aborted);
                                  CHECK_THAT(e.what(), Catch::Contains("rank 2 failed"));
                                  ++aborted;
                                  throw;
                                }
                              }),
                    Catch::Contains("boom on two"));
  CHECK(aborted == 3);
}

TEST_CASE("thread communicator collectives", "[threads]") {
  run_ranks(3, [&](thread_communicator& comm) {
    std::vector<float> v{float(comm.rank()), 1.0f};
    comm.allreduce_sum(std::span<float>(v));
    CHECK(v[0] == 3.0f);
    CHECK(v[1] == 3.0f);
    std::vector<double> m{double(comm.rank())};
    comm.allreduce_max(std::span<double>(m));
    CHECK(m[0] == 2.0);
    std::vector<std::byte> mine(static_cast<std::size_t>(comm.rank()) + 1, std::byte(comm.rank()));
    std::vector<std::byte> all;
    std::vector<std::size_t> sizes;
    comm.allgatherv(mine, all, sizes);
    CHECK(sizes == std::vector<std::size_t>{1, 2, 3});
    CHECK(all.size() == 6);
    CHECK(all[5] == std::byte(2));
    std::array<int, 2> b{comm.rank(), 7};
    comm.broadcast_values(std::span<int>(b), 1);
    CHECK(b[0] == 1);
  });
}
