// step_report::wire_bytes_* of low_rank_allreduce (PowerSGD's two allreduces, the control
// floats at the end of the second) equal what the simulated network counted, per step and
// rank; the other collectives are in test_wire_bytes.cpp.
#include <catch2/catch.hpp>

#include "gravac/collective/low_rank_allreduce.hpp"
#include "gravac/compress/powersgd.hpp"
#include "gravac/policy/fixed_policy.hpp"
#include "wire_bytes_checks.hpp"

using namespace gravac;

TEST_CASE("wire bytes: low_rank_allreduce counts both allreduces", "[wire][powersgd]") {
  using T = trainer<powersgd, low_rank_allreduce, fixed_policy>;
  const auto lay = test::mixed_layout();
  SECTION("one bucket") {
    T::options opt;
    opt.policy.kept_fraction = 0.1;
    test::check_wire_steps(test::wire_steps<T>(lay, opt, 4), collective_kind::dense_allreduce);
  }
  SECTION("one bucket per layer (buckets without low-rank layers have one Allreduce)") {
    T::options opt;
    opt.policy.kept_fraction = 0.1;
    opt.bucket_bytes = bucket_per_layer;
    test::check_wire_steps(test::wire_steps<T>(lay, opt, 4), collective_kind::dense_allreduce);
  }
  SECTION("8 ranks, each Allreduce as Open MPI 4.1 chooses: counted by the algorithm charged") {
    T::options opt;
    opt.policy.kept_fraction = 0.1;
    const simulated_network_options net_opt{allreduce_algorithm::ring, allreduce_rule::open_mpi_4_1};
    test::check_wire_steps(test::wire_steps<T>(lay, opt, 4, 8, net_opt), collective_kind::dense_allreduce);
  }
}
