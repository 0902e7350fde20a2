// Shared by the thread and MPI training tests: a short run on real Fashion-MNIST data
// (a subset, a few hundred steps) and what it must achieve.
#pragma once

#include <catch2/catch.hpp>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "fmnist/train.hpp"
#include "gravac/comm/thread_communicator.hpp"

namespace fmnist_test {

// Loads the installed dataset, failing with the package name when it is absent.
inline const fmnist::dataset& data(fmnist::split s) {
  static const auto load = [](fmnist::split sp) {
    const std::string dir = fmnist::default_data_dir;
    INFO("the training tests need Debian's dataset-fashion-mnist (scripts/install-deps)");
    REQUIRE(std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz"));
    return fmnist::load_fashion_mnist(dir, sp);
  };
  static const fmnist::dataset train = load(fmnist::split::train);
  static const fmnist::dataset test = load(fmnist::split::test);
  return s == fmnist::split::train ? train : test;
}

// Trains \p cfg on \p ranks thread ranks of this process; every rank's result, rank order.
inline std::vector<fmnist::run_result> train_on_threads(const fmnist::run_config& cfg, int ranks = 4) {
  const auto& train = data(fmnist::split::train);
  const auto& test = data(fmnist::split::test);
  std::vector<fmnist::run_result> per_rank(static_cast<std::size_t>(ranks));
  gravac::run_ranks(ranks, [&](gravac::thread_communicator& comm) {
    per_rank[static_cast<std::size_t>(comm.rank())] = fmnist::train(comm, train, test, cfg);
  });
  return per_rank;
}

// 4 ranks x 16 samples, 100 steps per epoch, 3 epochs: 300 steps of a small MLP.
inline fmnist::run_config short_run(fmnist::method_config m) {
  fmnist::run_config c;
  c.model = fmnist::model_kind::mlp;
  c.mlp_hidden = {64};
  c.epochs = 3;
  c.batch = 64;
  c.train_subset = 6400;
  c.test_subset = 2000;
  c.lr = {0.05, 0.1, {}};
  c.seed = 7;
  c.method = std::move(m);
  c.network = fmnist::network_config::parse("1gbps");
  c.compute_s = 1e-3;  // fixed, so the modeled clock does not depend on the machine's load
  return c;
}

inline fmnist::method_config dense_method() {
  fmnist::method_config m;
  m.compressor = fmnist::compressor_id::identity;
  m.collective = fmnist::collective_id::dense_allreduce;
  m.policy = fmnist::policy_id::fixed;
  m.fixed.kept_fraction = 1.0;
  return m;
}

inline fmnist::method_config gravac_method() {
  fmnist::method_config m;
  m.compressor = fmnist::compressor_id::topk;
  m.collective = fmnist::collective_id::allgather;
  m.policy = fmnist::policy_id::gravac;
  m.gravac.period_steps = 50;
  m.gravac.warmup_steps = 25;
  m.gravac.time.source = gravac::time_source::simulated;
  return m;
}

// The loss falls, the accuracy beats chance (10%) by a wide margin, and the records add up.
inline void check_learned(const fmnist::run_result& r, int ranks) {
  REQUIRE(r.epochs.size() == 3);
  REQUIRE(r.steps.size() == 300);
  CHECK(r.ranks == ranks);
  const auto mean_loss = [&](std::size_t from, std::size_t to) {
    double s = 0;
    for (std::size_t i = from; i < to; ++i) s += r.steps[i].loss;
    return s / static_cast<double>(to - from);
  };
  const double first = mean_loss(0, 20), last = mean_loss(280, 300);
  INFO(r.method << ": loss of the first 20 steps " << first << ", of the last 20 " << last << "; test accuracy "
                << r.epochs.back().test_acc);
  CHECK(last < 0.6 * first);
  CHECK(r.epochs.back().test_acc > 0.70);
  CHECK(r.epochs.back().train_loss < r.epochs.front().train_loss);
  // The modeled clock is monotone and charged communication on every step.
  for (std::size_t i = 1; i < r.steps.size(); ++i) CHECK(r.steps[i].modeled_time_s > r.steps[i - 1].modeled_time_s);
  CHECK(r.epochs.back().modeled_comm_s > 0);
}

}  // namespace fmnist_test
