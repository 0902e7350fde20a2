// step_report::wire_bytes_sent / wire_bytes_received for every collective on 4 thread
// ranks through a simulated network: each step's report equals what the network counted
// for the calls that step made, to the byte, with the control floats at the end of an
// Allreduce and the control trailers of Allgather packets included. PowerSGD's two
// allreduces are in test_wire_bytes_powersgd.cpp (it needs Eigen).
#include <catch2/catch.hpp>

#include "gravac/collective/allgather.hpp"
#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/collective/flexible.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/network/wire_bytes.hpp"
#include "gravac/policy/fixed_policy.hpp"
#include "gravac/policy/gravac_policy.hpp"
#include "wire_bytes_checks.hpp"

using namespace gravac;

namespace {
constexpr int steps = 4;
}  // namespace

TEST_CASE("wire bytes: the rules of one call", "[wire]") {
  CHECK(wire_bytes::allreduce(4, 4000) == wire_bytes{6000, 6000});
  CHECK(wire_bytes::allgather(4, 632, 8) == wire_bytes{624, 624});
  CHECK(wire_bytes::broadcast(4, 512, false) == wire_bytes{384, 512});
  CHECK(wire_bytes::broadcast(4, 512, true) == wire_bytes{384, 0});
  CHECK(wire_bytes::alltoall(4, 300, 200) == wire_bytes{300, 200});
  // One rank: nothing leaves the process.
  CHECK(wire_bytes::allreduce(1, 4000) == wire_bytes{});
  CHECK(wire_bytes::allgather(1, 100, 100) == wire_bytes{});
  CHECK(wire_bytes::broadcast(1, 512, true) == wire_bytes{});
  CHECK(wire_bytes::alltoall(1, 0, 0) == wire_bytes{});
  CHECK(wire_bytes::allreduce(4, 4000) + wire_bytes::broadcast(4, 512, true) == wire_bytes{6384, 6000});
}

TEST_CASE("wire bytes: dense_allreduce reports what the network counted", "[wire]") {
  using T = trainer<topk, dense_allreduce, fixed_policy>;
  const auto lay = test::mixed_layout();
  SECTION("every layer dense (the baseline, control floats at the end)") {
    test::check_wire_steps(test::wire_steps<T>(lay, {.policy = {.kept_fraction = 1.0}}, steps),
                           collective_kind::dense_allreduce);
  }
  SECTION("compressed, decoded locally") {
    test::check_wire_steps(test::wire_steps<T>(lay, {.policy = {.kept_fraction = 0.1}}, steps),
                           collective_kind::dense_allreduce);
  }
  SECTION("one bucket per layer: the trainer sums the buckets") {
    test::check_wire_steps(
        test::wire_steps<T>(lay, {.policy = {.kept_fraction = 1.0}, .bucket_bytes = bucket_per_layer}, steps),
        collective_kind::dense_allreduce);
  }
  SECTION("one rank sends nothing") {
    const auto w = test::wire_steps<T>(lay, {.policy = {.kept_fraction = 1.0}}, 2, 1);
    test::check_wire_steps(w, collective_kind::dense_allreduce);
    CHECK(w[0][0].report_sent == 0.0);
    CHECK(w[0][1].report_received == 0.0);
  }
}

TEST_CASE("wire bytes: under an engine's Allreduce rule, reports follow the algorithm charged", "[wire]") {
  // 4 and 8 ranks: Open MPI 4.1 runs recursive doubling there at this size, NCCL its tree;
  // the report must count what the network counted, which is not the ring's count. (With 5
  // ranks the per-rank averages are not exact in binary, and the network's running sum
  // rounds differently from a step's own count: checked to 1e-12 below.)
  const auto lay = test::mixed_layout();
  for (const int ranks : {4, 8})
    for (const auto rule : {allreduce_rule::open_mpi_4_1, allreduce_rule::nccl}) {
      INFO(ranks << " ranks, rule " << static_cast<int>(rule));
      const simulated_network_options net_opt{allreduce_algorithm::ring, rule};
      {
        using T = trainer<topk, dense_allreduce, fixed_policy>;
        const auto w = test::wire_steps<T>(lay, {.policy = {.kept_fraction = 1.0}}, steps, ranks, net_opt);
        test::check_wire_steps(w, collective_kind::dense_allreduce);
        const auto ring = test::wire_steps<T>(lay, {.policy = {.kept_fraction = 1.0}}, steps, ranks);
        test::check_wire_steps(ring, collective_kind::dense_allreduce);
        // NCCL's tree moves what a ring does, per rank on average; Open MPI's choices do not.
        if (rule == allreduce_rule::open_mpi_4_1)
          CHECK(w[0][0].report_sent != ring[0][0].report_sent);
        else
          CHECK(w[0][0].report_sent == ring[0][0].report_sent);
      }
      {
        using T = trainer<topk, allreduce_compatible, fixed_policy>;
        T::options opt;
        opt.policy.kept_fraction = 0.1;
        test::check_wire_steps(test::wire_steps<T>(lay, opt, steps, ranks, net_opt),
                               collective_kind::allreduce_compatible);
      }
    }
}

TEST_CASE("wire bytes: 5 ranks under Open MPI 4.1's rule, reports within rounding of the network's count", "[wire]") {
  using T = trainer<topk, dense_allreduce, fixed_policy>;
  const simulated_network_options net_opt{allreduce_algorithm::ring, allreduce_rule::open_mpi_4_1};
  const auto w = test::wire_steps<T>(test::mixed_layout(), {.policy = {.kept_fraction = 1.0}}, steps, 5, net_opt);
  const auto ring = test::wire_steps<T>(test::mixed_layout(), {.policy = {.kept_fraction = 1.0}}, steps, 5);
  for (std::size_t r = 0; r < w.size(); ++r)
    for (std::size_t s = 0; s < w[r].size(); ++s) {
      INFO("rank " << r << " step " << s);
      CHECK(w[r][s].report_sent == Approx(w[r][s].net_sent).epsilon(1e-12));
      CHECK(w[r][s].report_received == Approx(w[r][s].net_received).epsilon(1e-12));
      CHECK(w[r][s].report_sent != Approx(ring[r][s].report_sent).epsilon(1e-6));
    }
}

TEST_CASE("wire bytes: allgather reports what the network counted", "[wire]") {
  const auto lay = test::mixed_layout();
  SECTION("packets with their control trailers") {
    using T = trainer<topk, allgather, fixed_policy>;
    test::check_wire_steps(test::wire_steps<T>(lay, {.policy = {.kept_fraction = 0.1}}, steps),
                           collective_kind::allgather);
  }
  SECTION("one bucket per layer") {
    using T = trainer<topk, allgather, fixed_policy>;
    test::check_wire_steps(
        test::wire_steps<T>(lay, {.policy = {.kept_fraction = 0.1}, .bucket_bytes = bucket_per_layer}, steps),
        collective_kind::allgather);
  }
  SECTION("every layer dense: one Allreduce instead") {
    using T = trainer<topk, allgather, fixed_policy>;
    test::check_wire_steps(test::wire_steps<T>(lay, {.policy = {.kept_fraction = 1.0}}, steps),
                           collective_kind::dense_allreduce);
  }
  SECTION("a policy's statistics in the trailer") {
    using T = trainer<topk, allgather, gravac_policy>;
    T::options opt;
    opt.policy.warmup_steps = 2;
    test::check_wire_steps(test::wire_steps<T>(lay, opt, steps), collective_kind::allgather);
  }
}

TEST_CASE("wire bytes: allreduce_compatible counts the index broadcast and the value Allreduce", "[wire]") {
  using T = trainer<topk, allreduce_compatible, fixed_policy>;
  const auto lay = test::mixed_layout();
  for (const auto rule : {index_rank_rule::star, index_rank_rule::var}) {  // VAR: N norms in the Allreduce
    T::options opt;
    opt.policy.kept_fraction = 0.1;
    opt.policy.one_dim_dense = true;  // dense layers in the Allreduce too
    opt.collective.rule = rule;
    const auto w = test::wire_steps<T>(lay, opt, steps);
    test::check_wire_steps(w, collective_kind::allreduce_compatible);
    // The root of STAR's step s is rank s mod 4: it receives no indices, so it takes
    // fewer bytes off the wire than it sends.
    if (rule == index_rank_rule::star)
      for (std::size_t s = 0; s < steps; ++s) {
        CHECK(w[s % 4][s].report_received < w[s % 4][s].report_sent);
        CHECK(w[(s + 1) % 4][s].report_received > w[(s + 1) % 4][s].report_sent);
      }
  }
}

TEST_CASE("wire bytes: flexible reports the path it ran, with its own control floats", "[wire]") {
  using T = trainer<topk, flexible, fixed_policy>;
  const auto lay = test::mixed_layout();
  for (const auto kind :
       {collective_kind::dense_allreduce, collective_kind::allreduce_compatible, collective_kind::allgather}) {
    INFO("forced " << to_string(kind));
    T::options opt;
    opt.policy.kept_fraction = 0.1;
    opt.policy.collective = kind;
    opt.collective.sync_interval = 2;  // a batch of timings rides in step 2's collective
    test::check_wire_steps(test::wire_steps<T>(lay, opt, steps), kind);
  }
  SECTION("chosen by the cost model, every layer dense") {
    T::options opt;
    opt.policy.kept_fraction = 1.0;
    test::check_wire_steps(test::wire_steps<T>(lay, opt, steps), collective_kind::dense_allreduce);
  }
}
