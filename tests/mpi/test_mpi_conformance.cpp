// Runs under mpiexec with 4 ranks: the communicator conformance suite
// (support/communicator_conformance.hpp) on mpi_communicator, with and without the
// collective watchdog, and through communicator_ref<host_space> (how the trainer holds it).
// Each rank is a process with its own Catch2 session, so the suite reports as it runs.
#include <catch2/catch.hpp>
#include <chrono>

#include "communicator_conformance.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/comm/mpi_communicator.hpp"

using namespace gravac;

TEST_CASE("MPI: mpi_communicator passes the communicator conformance suite", "[mpi][conformance]") {
  mpi_communicator comm;
  const auto log = test::check_communicator_conformance(comm);
  CHECK(log.alltoallv_tested);
  CHECK(log.broadcast_values_tested);
}

TEST_CASE("MPI: mpi_communicator with a collective timeout passes the conformance suite", "[mpi][conformance]") {
  mpi_options opt;
  opt.collective_timeout = std::chrono::seconds(60);
  mpi_communicator comm(opt);
  test::check_communicator_conformance(comm);
}

TEST_CASE("MPI: communicator_ref over mpi_communicator passes the conformance suite", "[mpi][conformance]") {
  mpi_communicator comm;
  communicator_ref<host_space> ref(comm);
  const auto log = test::check_communicator_conformance(ref);
  CHECK(log.alltoallv_tested);
}
