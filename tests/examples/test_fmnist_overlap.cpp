// The Fashion-MNIST example with --overlap on, on 4 thread ranks: gravac's
// buckets are aggregated on the trainer's communication thread while the models' backward
// announces each layer's final gradient. With a fixed compute time and no measured time in
// the modeled clocks, the overlapped run ends with the parameters of the synchronous run
// with the same buckets, bit for bit, and the same records but the times; only the
// modeled clock differs, by the communication backward hid. A run stopped and resumed
// with overlap equals one that never stopped. Shadow networks are refused.
// (tests/examples/fmnist_overlap_mpi.sh does the same on 4 MPI processes.)
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <gravac/comm/thread_communicator.hpp>
#include <string>
#include <vector>

#include "fmnist/mlp.hpp"
#include "fmnist_training_checks.hpp"

namespace {

namespace fs = std::filesystem;

fmnist::run_result run4(const fmnist::run_config& cfg) {
  const auto per_rank = fmnist_test::train_on_threads(cfg);
  for (const auto& r : per_rank) {
    REQUIRE(r.final_params == per_rank[0].final_params);
    // Every rank's modeled timeline is the same (the ready times are agreed).
    REQUIRE(r.steps.size() == per_rank[0].steps.size());
    for (std::size_t i = 0; i < r.steps.size(); ++i)
      CHECK(r.steps[i].modeled_time_s == per_rank[0].steps[i].modeled_time_s);
  }
  return per_rank[0];
}

// 3 epochs of 20 steps (4 ranks x 16 samples), GraVAC's search with short periods; no
// measured time in the modeled clocks, so everything but the measured times repeats.
fmnist::run_config tiny(std::size_t bucket_bytes) {
  auto m = fmnist_test::gravac_method();
  m.gravac.period_steps = 10;
  m.gravac.warmup_steps = 5;
  m.bucket_bytes = bucket_bytes;
  auto c = fmnist_test::short_run(std::move(m));
  c.charge_codec = false;
  c.mlp_hidden = {32};
  c.train_subset = 1280;
  c.test_subset = 500;
  return c;
}

void same_params(const fmnist::run_result& a, const fmnist::run_result& b) {
  REQUIRE(a.final_params.size() == b.final_params.size());
  REQUIRE(!a.final_params.empty());
  CHECK(std::memcmp(a.final_params.data(), b.final_params.data(), a.final_params.size() * sizeof(float)) == 0);
}

// Everything computed is equal; the modeled communication is equal up to the rounding of
// the clock's differences (the two clocks advance differently); the exposed part and the
// modeled clock are compared by the caller. At step \p resumed_at (the first after a
// resume) and in its epoch, gravac's trainer has no previous step's times to send in its
// control block: up to 16 bytes per rank fewer, and less modeled communication
// (test_fmnist_resume explains it).
void same_records_but_time(const fmnist::run_result& a, const fmnist::run_result& b,
                           std::uint64_t resumed_at = ~std::uint64_t{0}) {
  const double slack = 16.0 * a.ranks;
  const auto wire = [&](double x, double y, bool resumed) {
    if (resumed) {
      CHECK(y <= x);
      CHECK(x - y <= slack);
    } else {
      CHECK(x == y);
    }
  };
  const auto comm = [&](double x, double y, bool resumed) {
    if (resumed)
      CHECK(y <= x * (1 + 1e-12));
    else
      CHECK(y == Approx(x).epsilon(1e-9));
  };
  std::size_t resumed_epoch = ~std::size_t{0};
  REQUIRE(a.steps.size() == b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    const auto &x = a.steps[i], &y = b.steps[i];
    const bool resumed = x.step == resumed_at;
    if (resumed) resumed_epoch = x.epoch;
    INFO("step " << i << (resumed ? " (the first after a resume)" : ""));
    CHECK(x.step == y.step);
    CHECK(x.loss == y.loss);
    CHECK(x.train_acc == y.train_acc);
    CHECK(x.kept_fraction == y.kept_fraction);
    CHECK(x.bytes_sent == y.bytes_sent);
    wire(x.wire_bytes_sent, y.wire_bytes_sent, resumed);
    wire(x.wire_bytes_received, y.wire_bytes_received, resumed);
    CHECK(x.collective == y.collective);
    CHECK(x.gain == y.gain);
    comm(x.modeled_comm_s, y.modeled_comm_s, resumed);
    CHECK(x.bandwidth_gbps == y.bandwidth_gbps);
  }
  REQUIRE(a.epochs.size() == b.epochs.size());
  for (std::size_t i = 0; i < a.epochs.size(); ++i) {
    const auto &x = a.epochs[i], &y = b.epochs[i];
    const bool resumed = i == resumed_epoch;
    INFO("epoch " << i);
    CHECK(x.train_loss == y.train_loss);
    CHECK(x.test_loss == y.test_loss);
    CHECK(x.test_acc == y.test_acc);
    CHECK(x.bytes_per_rank == y.bytes_per_rank);
    wire(x.wire_bytes_received_per_rank, y.wire_bytes_received_per_rank, resumed);
    CHECK(x.kept_fraction == y.kept_fraction);
    comm(x.modeled_comm_s, y.modeled_comm_s, resumed);
    CHECK(x.policy_state == y.policy_state);
  }
}

// The modeled clock charges compute + exposed communication per step (no codec time).
void clock_adds_up(const fmnist::run_result& r) {
  double before = 0;
  for (const auto& s : r.steps) {
    INFO("step " << s.step);
    CHECK(s.modeled_exposed_s >= 0);
    CHECK(s.modeled_exposed_s <= s.modeled_comm_s * (1 + 1e-12));
    CHECK(s.modeled_time_s - before == Approx(r.compute_per_step_s + s.modeled_exposed_s).epsilon(1e-9));
    before = s.modeled_time_s;
  }
}

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& name)
      : path(fs::temp_directory_path() / ("gravac_fmnist_overlap_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("fashion_mnist --overlap on: the parameters and records of the synchronous step, less exposed time") {
  const auto [name, bytes] = GENERATE(table<const char*, std::size_t>(
      {{"one bucket per layer", gravac::bucket_per_layer}, {"the default buckets", gravac::default_bucket_bytes}}));
  INFO(name);
  auto off = tiny(bytes);
  auto on = off;
  on.overlap = true;
  const auto a = run4(off);
  const auto b = run4(on);
  CHECK_FALSE(a.overlap);
  CHECK(b.overlap);
  CHECK(a.buckets == b.buckets);
  CHECK(b.buckets == (bytes == gravac::bucket_per_layer ? 4u : 1u));
  same_params(a, b);
  same_records_but_time(a, b);
  clock_adds_up(a);
  clock_adds_up(b);
  // Synchronous: every second of communication is exposed.
  for (const auto& s : a.steps) CHECK(s.modeled_exposed_s == s.modeled_comm_s);
  const auto xa = fmnist::exposure_of(a), xb = fmnist::exposure_of(b);
  CHECK(xa.ratio() == Approx(1.0));
  if (b.buckets > 1) {
    // The last layer's bucket goes out while backward computes the first layer.
    CHECK(xb.exposed_s < xa.exposed_s);
    CHECK(b.epochs.back().modeled_time_s < a.epochs.back().modeled_time_s);
  } else {
    // One bucket starts when backward has ended: nothing to hide.
    CHECK(xb.exposed_s == Approx(xa.exposed_s).epsilon(1e-9));
  }
  // The deterministic ready-time model: forward a third, then each layer in proportion
  // to its parameters, last layer first; layer 0 (fc1.weight) ends backward.
  REQUIRE(b.ready_share.size() == 4);
  CHECK(b.ready_share[0] < b.ready_share[1]);  // fc1.weight, then fc1.bias
  CHECK(b.ready_share[1] == Approx(1.0));
  CHECK(b.ready_share[2] > 1.0 / 3.0);
  CHECK(b.ready_share[2] < b.ready_share[3]);
  CHECK(b.ready_share[3] < b.ready_share[0]);

  // Repeats exactly, exposed time included.
  const auto again = run4(on);
  same_params(b, again);
  for (std::size_t i = 0; i < b.steps.size(); ++i) {
    CHECK(again.steps[i].modeled_exposed_s == b.steps[i].modeled_exposed_s);
    CHECK(again.steps[i].modeled_time_s == b.steps[i].modeled_time_s);
  }
}

TEST_CASE("fashion_mnist --overlap on: the CNN announces its layers; same parameters as the synchronous step") {
  auto off = tiny(gravac::bucket_per_layer);
  off.model = fmnist::model_kind::cnn;
  off.epochs = 1;
  off.max_steps = 12;
  auto on = off;
  on.overlap = true;
  const auto a = run4(off);
  const auto b = run4(on);
  CHECK(b.buckets == 8);
  same_params(a, b);
  same_records_but_time(a, b);
  clock_adds_up(b);
  CHECK(fmnist::exposure_of(b).exposed_s < fmnist::exposure_of(a).exposed_s);
  // Backward order: fc2, fc1, conv2, conv1 (weights before biases).
  REQUIRE(b.ready_share.size() == 8);
  const std::size_t order[] = {6, 7, 4, 5, 2, 3, 0, 1};
  for (std::size_t i = 0; i + 1 < 8; ++i) CHECK(b.ready_share[order[i]] < b.ready_share[order[i + 1]]);
  CHECK(b.ready_share[1] == Approx(1.0));  // conv1.bias ends backward
}

TEST_CASE("fashion_mnist --overlap on: stopped mid-epoch and resumed equals the run that never stopped") {
  const auto cfg = [] {
    auto c = tiny(gravac::bucket_per_layer);
    c.overlap = true;
    return c;
  }();
  const auto ref = run4(cfg);
  scratch_dir dir("resume");
  auto first = cfg;
  first.checkpoint.dir = dir.path.string();
  first.checkpoint.every = 7;
  first.checkpoint.every_unit = fmnist::checkpoint_config::unit::steps;
  first.max_steps = 30;
  CHECK(run4(first).steps.size() == 30);
  auto second = first;
  second.max_steps = 0;
  second.checkpoint.resume = true;
  const auto resumed = run4(second);
  CHECK(resumed.resumed_from_step == 28);
  same_params(ref, resumed);
  same_records_but_time(ref, resumed, 28);
  // The exposed time too, except at the first step after the resume: GraVAC's trainer then
  // has no previous step's times to send (16 bytes per rank fewer, test_fmnist_resume).
  for (std::size_t i = 0; i < ref.steps.size(); ++i) {
    INFO("step " << i);
    if (i == 28)
      CHECK(resumed.steps[i].modeled_exposed_s <= ref.steps[i].modeled_exposed_s * (1 + 1e-12));
    else
      CHECK(resumed.steps[i].modeled_exposed_s == Approx(ref.steps[i].modeled_exposed_s).epsilon(1e-9));
  }
  clock_adds_up(resumed);

  // A checkpoint of the synchronous run is not resumed with overlap (another modeled clock).
  auto sync = second;
  sync.overlap = false;
  CHECK_THROWS_WITH(run4(sync), Catch::Contains("written by another run") && Catch::Contains("overlap on") &&
                                    Catch::Contains("overlap off"));
}

TEST_CASE("fashion_mnist --overlap on: a calibrated compute time measures the layers' ready shares") {
  auto cfg = tiny(gravac::bucket_per_layer);
  cfg.overlap = true;
  cfg.compute_s = -1;
  cfg.epochs = 1;
  cfg.max_steps = 10;
  const auto r = run4(cfg);
  CHECK(r.compute_per_step_s > 0);
  REQUIRE(r.ready_share.size() == 4);
  // Backward order: fc2.weight, fc2.bias, fc1.weight, fc1.bias.
  CHECK(r.ready_share[2] > 0);
  CHECK(r.ready_share[2] <= r.ready_share[3]);
  CHECK(r.ready_share[3] <= r.ready_share[0]);
  CHECK(r.ready_share[0] <= r.ready_share[1]);
  CHECK(r.ready_share[1] <= 1.0);
  clock_adds_up(r);
}

TEST_CASE("fashion_mnist --overlap on: shadow networks are refused at the start") {
  auto cfg = tiny(gravac::bucket_per_layer);
  cfg.overlap = true;
  cfg.shadow_networks = {fmnist::network_config::parse("10gbps")};
  CHECK_THROWS_WITH(run4(cfg), Catch::Contains("--overlap on does not model shadow networks"));
}

TEST_CASE("fashion_mnist ready_share_model: forward a third, backward by parameters in announcement order") {
  fmnist::mlp net(4, {3}, 2);  // fc1.weight 12, fc1.bias 3, fc2.weight 6, fc2.bias 2: 23
  const auto s = fmnist::ready_share_model(net.get_layout(), {2, 3, 0, 1});
  REQUIRE(s.size() == 4);
  CHECK(s[2] == Approx(1.0 / 3 + 2.0 / 3 * 6 / 23));
  CHECK(s[3] == Approx(1.0 / 3 + 2.0 / 3 * 8 / 23));
  CHECK(s[0] == Approx(1.0 / 3 + 2.0 / 3 * 20 / 23));
  CHECK(s[1] == Approx(1.0));
  CHECK_THROWS_WITH(fmnist::ready_share_model(net.get_layout(), {2, 3}), Catch::Contains("announced 2 layers"));
}
