// Short data-parallel runs of the Fashion-MNIST example on MPI ranks (run under mpiexec):
// dense SGD and GraVAC with top-k both learn, and GraVAC sends far fewer bytes.
#include <catch2/catch.hpp>
#include <gravac/comm/mpi_communicator.hpp>

#include "fmnist_training_checks.hpp"

TEST_CASE("fashion_mnist on MPI ranks: dense SGD and GraVAC both learn; GraVAC sends far less") {
  gravac::mpi_communicator comm;
  const auto& train = fmnist_test::data(fmnist::split::train);
  const auto& test = fmnist_test::data(fmnist::split::test);
  auto dense_cfg = fmnist_test::short_run(fmnist_test::dense_method());
  auto grav_cfg = fmnist_test::short_run(fmnist_test::gravac_method());
  dense_cfg.codec_cpu_time = grav_cfg.codec_cpu_time = false;
  const auto dense = fmnist::train(comm, train, test, dense_cfg);
  fmnist_test::check_learned(dense, comm.size());
  const auto grav = fmnist::train(comm, train, test, grav_cfg);
  fmnist_test::check_learned(grav, comm.size());
  CHECK(grav.total_bytes_per_rank() * 5 < dense.total_bytes_per_rank());
}
