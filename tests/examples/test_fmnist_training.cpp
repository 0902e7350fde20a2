// Short data-parallel runs of the Fashion-MNIST example on 4 thread ranks: dense SGD and
// GraVAC with top-k both learn (loss falls, accuracy far above chance), and GraVAC sends
// far fewer bytes than dense; QSGD through the compressed allreduce learns too, and the
// compressors that collective cannot run are refused by name.
#include <catch2/catch.hpp>
#include <gravac/comm/thread_communicator.hpp>

#include "fmnist_training_checks.hpp"

namespace {
fmnist::run_result run_on_threads(const fmnist::run_config& cfg) {
  const auto per_rank = fmnist_test::train_on_threads(cfg);
  // Every rank recorded the same (rank-averaged) history.
  for (const auto& r : per_rank) {
    REQUIRE(r.epochs.size() == per_rank[0].epochs.size());
    for (std::size_t e = 0; e < r.epochs.size(); ++e) CHECK(r.epochs[e].test_acc == per_rank[0].epochs[e].test_acc);
  }
  return per_rank[0];
}
}  // namespace

TEST_CASE("fashion_mnist on 4 thread ranks: dense SGD and GraVAC both learn; GraVAC sends far less") {
  const auto dense = run_on_threads(fmnist_test::short_run(fmnist_test::dense_method()));
  fmnist_test::check_learned(dense, 4);
  const auto grav = run_on_threads(fmnist_test::short_run(fmnist_test::gravac_method()));
  fmnist_test::check_learned(grav, 4);
  INFO("dense sent " << dense.total_bytes_per_rank() << " bytes per rank, GraVAC " << grav.total_bytes_per_rank());
  CHECK(grav.total_bytes_per_rank() * 5 < dense.total_bytes_per_rank());
  // Dense sends exactly the fp32 buffer every step.
  CHECK(dense.total_bytes_per_rank() == Approx(300.0 * 4.0 * static_cast<double>(dense.params)));
}

TEST_CASE("fashion_mnist: a static top-k run learns, and invalid settings are refused clearly") {
  auto m = fmnist_test::dense_method();
  m.compressor = fmnist::compressor_id::topk;
  m.collective = fmnist::collective_id::allgather;
  m.fixed.kept_fraction = 0.01;
  const auto r = run_on_threads(fmnist_test::short_run(m));
  fmnist_test::check_learned(r, 4);
  CHECK(r.steps.back().kept_fraction == Approx(0.01));

  auto bad = fmnist_test::short_run(m);
  bad.batch = 66;  // not divisible by 4 ranks
  CHECK_THROWS_WITH(run_on_threads(bad), Catch::Contains("multiple of the 4 ranks"));
  auto unoffered = fmnist_test::short_run(m);
  unoffered.method.compressor = fmnist::compressor_id::qsgd;
  unoffered.method.collective = fmnist::collective_id::allreduce_compatible;
  CHECK_THROWS_WITH(run_on_threads(unoffered), Catch::Contains("does not accept qsgd + allreduce_compatible"));
}

TEST_CASE("fashion_mnist: a random-walk network is parsed, described, refused when malformed, and trained on") {
  const auto n = fmnist::network_config::parse("random-walk:3");
  CHECK(n.type == fmnist::network_config::kind::random_walk);
  CHECK(n.walk_seed == 3);
  CHECK(n.describe() == "random-walk:3");
  for (const char* bad : {"random-walk:", "random-walk:x", "random-walk:-1", "random-walk:3.5"})
    CHECK_THROWS_WITH(fmnist::network_config::parse(bad), Catch::Contains("random-walk needs a seed"));
  auto m = fmnist_test::dense_method();
  m.compressor = fmnist::compressor_id::topk;
  m.collective = fmnist::collective_id::allgather;
  m.fixed.kept_fraction = 0.01;
  auto cfg = fmnist_test::short_run(m);
  cfg.network = n;
  fmnist_test::check_learned(run_on_threads(cfg), 4);
}

TEST_CASE("fashion_mnist: QSGD through the compressed allreduce learns, with fewer wire bytes than by Allgather") {
  auto m = fmnist_test::dense_method();
  m.compressor = fmnist::compressor_id::qsgd;
  m.collective = fmnist::collective_id::compressed_allreduce;
  // A quantizer ignores the fraction, but 1 sends every layer raw (one dense Allreduce).
  m.fixed.kept_fraction = 0.01;
  const auto car = run_on_threads(fmnist_test::short_run(m));
  fmnist_test::check_learned(car, 4);
  m.collective = fmnist::collective_id::allgather;
  const auto ag = run_on_threads(fmnist_test::short_run(m));
  // At 4 ranks the compressed allreduce receives about 2(N-1)/N = 1.5 packets a step, the
  // Allgather N-1 = 3.
  INFO("wire bytes received per rank: compressed allreduce "
       << car.total_wire_bytes_received_per_rank() << ", Allgather " << ag.total_wire_bytes_received_per_rank());
  CHECK(car.total_wire_bytes_received_per_rank() < 0.6 * ag.total_wire_bytes_received_per_rank());

  // Top-k cannot run on shards: refused, naming the compressors the collective takes.
  auto unoffered = fmnist_test::short_run(m);
  unoffered.method.compressor = fmnist::compressor_id::topk;
  unoffered.method.collective = fmnist::collective_id::compressed_allreduce;
  CHECK_THROWS_WITH(
      run_on_threads(unoffered),
      Catch::Contains("does not accept topk + compressed_allreduce") &&
          Catch::Contains("compressed_allreduce with fixed takes identity, qsgd, terngrad, sign, cast16"));
}
