// Checkpoints of the Fashion-MNIST example's training, on 4 thread ranks: a run stopped
// part-way and resumed ends with the parameters of a run that never stopped, bit for bit,
// and the same records (times aside); only the last two checkpoints are kept; a truncated
// or corrupted newest checkpoint is skipped for the previous one; a checkpoint of other
// settings is refused. (tests/examples/fmnist_fault_kill.sh does the same with a rank
// killed by SIGKILL under mpiexec.)
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <gravac/comm/thread_communicator.hpp>
#include <string>
#include <vector>

#include "fmnist/checkpoint.hpp"
#include "fmnist_training_checks.hpp"

namespace {

namespace fs = std::filesystem;

// Every rank's result; every rank must end with the same parameters.
fmnist::run_result run4(const fmnist::run_config& cfg) {
  const auto per_rank = fmnist_test::train_on_threads(cfg);
  for (const auto& r : per_rank) REQUIRE(r.final_params == per_rank[0].final_params);
  return per_rank[0];
}

// 3 epochs of 20 steps (4 ranks x 16 samples), a small MLP: 60 steps in well under a second.
fmnist::run_config tiny(fmnist::method_config m) {
  auto c = fmnist_test::short_run(std::move(m));
  // Measured compression times out of the modeled clocks: the decisions of GraVAC (and the
  // rounding of every modeled time) then depend on the data alone, so runs repeat exactly.
  c.charge_codec = false;
  c.mlp_hidden = {32};
  c.train_subset = 1280;
  c.test_subset = 500;
  return c;
}

// GraVAC's search with evaluation periods short enough for a 60-step run.
fmnist::method_config gravac_deterministic() {
  auto m = fmnist_test::gravac_method();
  m.gravac.period_steps = 10;
  m.gravac.warmup_steps = 5;
  return m;
}

fmnist::method_config accordion_topk() {
  fmnist::method_config m;
  m.compressor = fmnist::compressor_id::topk;
  m.collective = fmnist::collective_id::allgather;
  m.policy = fmnist::policy_id::accordion;
  return m;
}

fmnist::method_config randomk_ar_topk() {
  fmnist::method_config m;
  m.compressor = fmnist::compressor_id::randomk;
  m.collective = fmnist::collective_id::allreduce_compatible;
  m.policy = fmnist::policy_id::gravac;
  m.gravac.time.source = gravac::time_source::simulated;
  m.gravac.period_steps = 10;
  m.gravac.warmup_steps = 5;
  return m;
}

// A fresh, empty directory of its own for each use.
struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& name)
      : path(fs::temp_directory_path() / ("gravac_fmnist_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

fmnist::run_config with_checkpoints(fmnist::run_config c, const fs::path& dir, const std::string& every) {
  const auto e = fmnist::checkpoint_config::parse_every(every);
  c.checkpoint.dir = dir.string();
  c.checkpoint.every = e.every;
  c.checkpoint.every_unit = e.every_unit;
  return c;
}

// The records agree field by field, times aside (measured compute and codec times, the
// wall time, and the modeled clock that includes the codec time when it is charged). The
// first step of a resumed run (each step in \p resumed_at) moves the same bytes as the
// uninterrupted run's: gravac's checkpoint holds the trainer's step state, the previous
// step's times that ride in the next step's control block.
void same_records(const fmnist::run_result& a, const fmnist::run_result& b,
                  const std::vector<std::uint64_t>& resumed_at) {
  const auto first_after_resume = [&](std::uint64_t step) {
    return std::find(resumed_at.begin(), resumed_at.end(), step) != resumed_at.end();
  };
  REQUIRE(a.steps.size() == b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    const auto &x = a.steps[i], &y = b.steps[i];
    INFO("step " << i << (first_after_resume(x.step) ? " (first after a resume)" : ""));
    CHECK(x.step == y.step);
    CHECK(x.epoch == y.epoch);
    CHECK(x.lr == y.lr);
    CHECK(x.loss == y.loss);
    CHECK(x.train_acc == y.train_acc);
    CHECK(x.kept_fraction == y.kept_fraction);
    CHECK(x.bytes_sent == y.bytes_sent);
    CHECK(x.dense_bytes == y.dense_bytes);
    CHECK(x.wire_bytes_sent == y.wire_bytes_sent);
    CHECK(x.wire_bytes_received == y.wire_bytes_received);
    CHECK(x.collective == y.collective);
    CHECK(x.gain == y.gain);
    CHECK(x.modeled_comm_s == y.modeled_comm_s);
    CHECK(x.bandwidth_gbps == y.bandwidth_gbps);
    CHECK(x.latency_ms == y.latency_ms);
  }
  REQUIRE(a.epochs.size() == b.epochs.size());
  for (std::size_t i = 0; i < a.epochs.size(); ++i) {
    const auto &x = a.epochs[i], &y = b.epochs[i];
    INFO("epoch " << i);
    CHECK(x.epoch == y.epoch);
    CHECK(x.lr == y.lr);
    CHECK(x.train_loss == y.train_loss);
    CHECK(x.train_acc == y.train_acc);
    CHECK(x.test_loss == y.test_loss);
    CHECK(x.test_acc == y.test_acc);
    CHECK(x.bytes_per_rank == y.bytes_per_rank);
    CHECK(x.dense_bytes_per_rank == y.dense_bytes_per_rank);
    CHECK(x.wire_bytes_sent_per_rank == y.wire_bytes_sent_per_rank);
    CHECK(x.wire_bytes_received_per_rank == y.wire_bytes_received_per_rank);
    CHECK(x.kept_fraction == y.kept_fraction);
    CHECK(x.modeled_comm_s == y.modeled_comm_s);
    CHECK(x.policy_state == y.policy_state);
  }
}

void same_params(const fmnist::run_result& a, const fmnist::run_result& b) {
  REQUIRE(a.final_params.size() == b.final_params.size());
  REQUIRE(!a.final_params.empty());
  CHECK(std::memcmp(a.final_params.data(), b.final_params.data(), a.final_params.size() * sizeof(float)) == 0);
}

std::vector<std::uint64_t> steps_of_every_rank(const fs::path& dir) {
  const auto s = fmnist::checkpoint_steps(dir.string(), 0);
  for (int r = 1; r < 4; ++r) CHECK(fmnist::checkpoint_steps(dir.string(), r) == s);
  return s;
}

void truncate_file(const fs::path& p, std::uintmax_t bytes) { fs::resize_file(p, bytes); }

void flip_byte(const fs::path& p, std::uintmax_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x40));
}

}  // namespace

TEST_CASE("fashion_mnist resume: stopped mid-epoch and resumed equals the run that never stopped, bit for bit") {
  const auto [name, method] = GENERATE(table<const char*, fmnist::method_config>(
      {{"gravac", gravac_deterministic()}, {"accordion", accordion_topk()}, {"randomk_ar", randomk_ar_topk()}}));
  INFO(name);
  const auto cfg = tiny(method);
  const auto ref = run4(cfg);
  REQUIRE(ref.steps.size() == 60);
  CHECK_FALSE(ref.resumed);

  scratch_dir dir(std::string("resume_") + name);
  auto first = with_checkpoints(cfg, dir.path, "7");
  first.max_steps = 30;  // stops before step 30, in the second epoch
  const auto stopped = run4(first);
  CHECK(stopped.steps.size() == 30);
  // Checkpoints at 7, 14, 21, 28; the last two are kept, on every rank.
  CHECK(steps_of_every_rank(dir.path) == std::vector<std::uint64_t>{28, 21});

  auto second = with_checkpoints(cfg, dir.path, "7");
  second.checkpoint.resume = true;
  const auto resumed = run4(second);
  CHECK(resumed.resumed);
  CHECK(resumed.resumed_from_step == 28);
  same_params(ref, resumed);
  same_records(ref, resumed, {28});
  // The resumed run went on checkpointing: 49 and 56 remain.
  CHECK(steps_of_every_rank(dir.path) == std::vector<std::uint64_t>{56, 49});
}

TEST_CASE("fashion_mnist resume: epoch checkpoints resume at the next epoch's start") {
  const auto cfg = tiny(gravac_deterministic());
  const auto ref = run4(cfg);
  scratch_dir dir("epochs");
  auto first = with_checkpoints(cfg, dir.path, "1e");
  first.max_steps = 50;
  run4(first);
  CHECK(steps_of_every_rank(dir.path) == std::vector<std::uint64_t>{40, 20});
  auto second = with_checkpoints(cfg, dir.path, "1e");
  second.checkpoint.resume = true;
  const auto resumed = run4(second);
  CHECK(resumed.resumed_from_step == 40);
  same_params(ref, resumed);
  same_records(ref, resumed, {40});
}

TEST_CASE("fashion_mnist resume: a truncated or corrupted newest checkpoint is skipped for the previous one") {
  const auto cfg = tiny(gravac_deterministic());
  const auto ref = run4(cfg);
  scratch_dir dir("corrupt");
  auto first = with_checkpoints(cfg, dir.path, "7");
  first.max_steps = 30;
  run4(first);
  auto resume = with_checkpoints(cfg, dir.path, "7");
  resume.checkpoint.resume = true;
  resume.max_steps = 35;  // far enough to write the next checkpoint (step 35) and stop

  SECTION("one rank's run file truncated") {
    const fs::path run1 = fmnist::checkpoint_file(dir.path.string(), 28, 1, "run");
    truncate_file(run1, fs::file_size(run1) / 2);
    const auto r = run4(resume);
    CHECK(r.resumed_from_step == 21);
  }
  SECTION("one rank's trainer file corrupted") {
    const fs::path g2 = fmnist::checkpoint_file(dir.path.string(), 28, 2, "gravac");
    flip_byte(g2, fs::file_size(g2) - 9);
    const auto r = run4(resume);
    CHECK(r.resumed_from_step == 21);
  }
  SECTION("one rank's files missing (it died before writing them)") {
    fs::remove(fmnist::checkpoint_file(dir.path.string(), 28, 3, "run"));
    fs::remove(fmnist::checkpoint_file(dir.path.string(), 28, 3, "gravac"));
    const auto r = run4(resume);
    CHECK(r.resumed_from_step == 21);
  }
  // The resumed run still ends where the uninterrupted one did.
  resume.max_steps = 0;
  const auto rest = run4(resume);
  CHECK(rest.resumed_from_step == 35);
  same_params(ref, rest);
  same_records(ref, rest, {21, 35});
}

TEST_CASE("fashion_mnist resume: no usable checkpoint, other settings, an empty directory") {
  const auto cfg = tiny(gravac_deterministic());
  scratch_dir dir("refuse");
  auto first = with_checkpoints(cfg, dir.path, "10");
  first.max_steps = 25;
  run4(first);  // checkpoints 10 and 20

  SECTION("every checkpoint damaged on some rank: an error, not a silent restart") {
    flip_byte(fmnist::checkpoint_file(dir.path.string(), 20, 0, "run"), 40);
    truncate_file(fmnist::checkpoint_file(dir.path.string(), 10, 3, "gravac"), 20);
    auto again = with_checkpoints(cfg, dir.path, "10");
    again.checkpoint.resume = true;
    CHECK_THROWS_WITH(run4(again), Catch::Contains("no checkpoint in") && Catch::Contains("usable on every rank"));
  }
  SECTION("other settings: refused, naming both") {
    auto other = with_checkpoints(cfg, dir.path, "10");
    other.checkpoint.resume = true;
    other.seed = 8;
    CHECK_THROWS_WITH(run4(other), Catch::Contains("written by another run") && Catch::Contains("seed 7") &&
                                       Catch::Contains("seed 8"));
  }
  SECTION("an empty directory: starts afresh") {
    scratch_dir empty("empty");
    auto fresh = with_checkpoints(cfg, empty.path, "10");
    fresh.checkpoint.resume = true;
    const auto r = run4(fresh);
    CHECK_FALSE(r.resumed);
    CHECK(r.steps.size() == 60);
  }
}

TEST_CASE("fashion_mnist run files: truncation, corruption and foreign bytes are named") {
  fmnist::run_state s;
  s.settings = "x";
  s.params = {1.0f, 2.0f};
  s.velocity = {0.5f, 0.25f};
  s.steps.resize(3);
  s.steps[1].collective = "allgather";
  auto bytes = fmnist::encode_run_state(s);
  const auto back = fmnist::decode_run_state(bytes, "f");
  CHECK(back.params == s.params);
  CHECK(back.steps.size() == 3);
  CHECK(back.steps[1].collective == "allgather");

  auto cut = bytes;
  cut.resize(cut.size() - 5);
  CHECK_THROWS_WITH(fmnist::decode_run_state(cut, "f"), Catch::Contains("'f' is unusable: truncated"));
  cut.resize(10);
  CHECK_THROWS_WITH(fmnist::decode_run_state(cut, "f"), Catch::Contains("truncated (10 bytes"));
  auto flipped = bytes;
  flipped[flipped.size() / 2] ^= std::byte{1};
  CHECK_THROWS_WITH(fmnist::decode_run_state(flipped, "f"), Catch::Contains("checksum mismatch"));
  auto foreign = bytes;
  foreign[0] = std::byte{'X'};
  CHECK_THROWS_WITH(fmnist::decode_run_state(foreign, "f"), Catch::Contains("wrong magic"));
}

TEST_CASE("fashion_mnist --checkpoint-every: steps, epochs, and clear errors") {
  using u = fmnist::checkpoint_config::unit;
  CHECK(fmnist::checkpoint_config::parse_every("100").every == 100);
  CHECK(fmnist::checkpoint_config::parse_every("100").every_unit == u::steps);
  CHECK(fmnist::checkpoint_config::parse_every("100s").every_unit == u::steps);
  CHECK(fmnist::checkpoint_config::parse_every("2e").every == 2);
  CHECK(fmnist::checkpoint_config::parse_every("2e").every_unit == u::epochs);
  for (const char* bad : {"0", "0e", "e", "", "-1", "1x", "1.5e", "99999999999999"})
    CHECK_THROWS_WITH(fmnist::checkpoint_config::parse_every(bad), Catch::Contains("--checkpoint-every"));
}

TEST_CASE("fashion_mnist --local-steps: stopped mid-round and resumed equals the run that never stopped") {
  // Adaptive local steps over SparseLoCo-style exchanges on a slow modeled network (H chosen
  // from the modeled exchanges), then a fixed H = 5 and H = 8 with DiLoCo's outer step: the
  // checkpoint every 7 steps falls inside a round. H = 8 ends the runs inside a round too,
  // which the end of training exchanges (finish_round) after the last checkpoint.
  fmnist::method_config adaptive;
  adaptive.compressor = fmnist::compressor_id::sparseloco;
  adaptive.policy = fmnist::policy_id::fixed;
  adaptive.local.adaptive = true;
  adaptive.local.policy.max_period = 8;
  adaptive.local.policy.source = gravac::network_source::modeled;
  adaptive.local.policy.time.source = gravac::time_source::simulated;
  adaptive.local.outer.kind = gravac::outer_kind::averaging;
  fmnist::method_config fixed_h = adaptive;
  fixed_h.local.adaptive = false;
  fixed_h.local.period = 5;
  fixed_h.local.outer.kind = gravac::outer_kind::nesterov;
  fixed_h.fixed.kept_fraction = 0.1;
  fmnist::method_config fixed_h8 = fixed_h;
  fixed_h8.local.period = 8;
  const auto [name, method] = GENERATE_COPY(table<const char*, fmnist::method_config>(
      {{"adaptive", adaptive}, {"fixed_h5", fixed_h}, {"fixed_h8", fixed_h8}}));
  INFO(name);
  auto cfg = tiny(method);
  cfg.local_steps = true;
  cfg.network = fmnist::network_config::parse("0.05gbps:50ms");
  const auto ref = run4(cfg);
  REQUIRE(ref.steps.size() == 60);
  // Fewer exchanges than steps: the steps without one send nothing.
  const auto silent =
      std::count_if(ref.steps.begin(), ref.steps.end(), [](const auto& s) { return s.bytes_sent == 0; });
  CHECK(silent > 30);
  CHECK(ref.epochs.back().test_acc > 0.5);  // it learns (chance is 0.1)
  CHECK_THAT(ref.method, Catch::Contains("local steps"));
  if (method.local.period == 8) {
    // Step 59 is the 4th of a round: the round ends with the run, and its last step records
    // the exchange.
    CHECK(ref.steps.back().bytes_sent > 0);
    CHECK(ref.steps.back().kept_fraction > 0);
  }

  scratch_dir dir(std::string("local_") + name);
  auto first = with_checkpoints(cfg, dir.path, "7");
  first.max_steps = 30;
  run4(first);
  auto second = with_checkpoints(cfg, dir.path, "7");
  second.checkpoint.resume = true;
  const auto resumed = run4(second);
  CHECK(resumed.resumed_from_step == 28);
  same_params(ref, resumed);
  same_records(ref, resumed, {28});
  if (method.local.period == 8) {
    // A checkpoint where a run stops mid-round (step 30) holds the round still open: the run
    // resumed from it ends as the uninterrupted one.
    scratch_dir at_stop(std::string("local_stop_") + name);
    auto stopped = with_checkpoints(cfg, at_stop.path, "10");
    stopped.max_steps = 30;
    run4(stopped);
    auto rest = with_checkpoints(cfg, at_stop.path, "10");
    rest.checkpoint.resume = true;
    const auto resumed_at_stop = run4(rest);
    CHECK(resumed_at_stop.resumed_from_step == 30);
    same_params(ref, resumed_at_stop);
    same_records(ref, resumed_at_stop, {30});
  }
}

TEST_CASE("fashion_mnist --local-steps --local-overlap: every rank ends on one model; resumed equals uninterrupted") {
  // Each round's exchange runs on the trainer's communication thread behind the next round
  // (applied one round late), so the example may not use the communicator for its records
  // while one is in flight (gravac::local_steps). H = 8: the checkpoints every 7 steps and the
  // epochs' ends (steps 20, 40) fall inside rounds with an exchange in flight, and the run
  // ends inside one (finish_round). H = 5: the run ends with a round, whose exchange
  // finish_round only applies. Then H chosen by the policy, which prices the overlap.
  fmnist::method_config fixed_h8;
  fixed_h8.compressor = fmnist::compressor_id::sparseloco;
  fixed_h8.policy = fmnist::policy_id::fixed;
  fixed_h8.fixed.kept_fraction = 0.1;
  fixed_h8.local.period = 8;
  fixed_h8.local.outer.kind = gravac::outer_kind::nesterov;
  fixed_h8.local.overlap = true;
  fmnist::method_config fixed_h5 = fixed_h8;
  fixed_h5.local.period = 5;
  fmnist::method_config adaptive = fixed_h8;
  adaptive.local.adaptive = true;
  adaptive.local.policy.max_period = 8;
  adaptive.local.policy.source = gravac::network_source::modeled;
  adaptive.local.policy.time.source = gravac::time_source::simulated;
  adaptive.local.outer.kind = gravac::outer_kind::averaging;
  const auto [name, method] = GENERATE_COPY(table<const char*, fmnist::method_config>(
      {{"fixed_h8", fixed_h8}, {"fixed_h5", fixed_h5}, {"adaptive", adaptive}}));
  INFO(name);
  auto cfg = tiny(method);
  cfg.local_steps = true;
  cfg.network = fmnist::network_config::parse("0.05gbps:50ms");
  const auto ref = run4(cfg);  // completes, and every rank ends on the same parameters
  REQUIRE(ref.steps.size() == 60);
  // It learns (chance is 0.1; 60 steps are 7 rounds, each applied one round late).
  CHECK(ref.epochs.back().test_acc > 0.3);
  CHECK(ref.epochs.back().train_loss < ref.epochs.front().train_loss);
  // On 2 ranks too.
  const auto two = fmnist_test::train_on_threads(cfg, 2);
  CHECK(two[1].final_params == two[0].final_params);
  CHECK(two[0].steps.size() == 60);

  // The exchanges were applied one round late: not the model of the run without overlap.
  auto sync = cfg;
  sync.method.local.overlap = false;
  const auto without = run4(sync);
  CHECK(without.final_params != ref.final_params);
  if (!method.local.adaptive) {
    // Every exchange is recorded once, with the step that ends its round, as without overlap.
    const auto exchanging = [](const fmnist::run_result& r) {
      std::vector<std::uint64_t> at;
      for (const auto& s : r.steps)
        if (s.bytes_sent > 0) at.push_back(s.step);
      return at;
    };
    if (method.local.period == 8) CHECK(exchanging(ref) == std::vector<std::uint64_t>{7, 15, 23, 31, 39, 47, 55, 59});
    CHECK(exchanging(ref) == exchanging(without));
    CHECK(ref.total_bytes_per_rank() == Approx(without.total_bytes_per_rank()).epsilon(0.05));
  }

  scratch_dir dir(std::string("local_overlap_") + name);
  auto first = with_checkpoints(cfg, dir.path, "7");
  first.max_steps = 30;
  run4(first);
  auto second = with_checkpoints(cfg, dir.path, "7");
  second.checkpoint.resume = true;
  const auto resumed = run4(second);
  CHECK(resumed.resumed_from_step == 28);
  same_params(ref, resumed);
  same_records(ref, resumed, {28});
}

TEST_CASE("fashion_mnist --local-adaptive from local rounds to per-step and back: every rank ends on one model") {
  // The network goes fast, slow, fast, slow (an epoch each) and the policy reads it
  // (source = profile): per-step rounds, rounds of H = 8, per-step rounds again, then local
  // rounds again. After local rounds each rank's SGD momentum is its own; the per-step
  // rounds apply every rank's SGD to the same averaged gradient, so the example averages the
  // momentum at the switch (local_steps::inner_state_must_agree), or the ranks would drift
  // apart for good. A run resumed from a checkpoint after the switch ends on the same model.
  fmnist::method_config adaptive;
  adaptive.compressor = fmnist::compressor_id::sparseloco;
  adaptive.policy = fmnist::policy_id::fixed;
  adaptive.local.adaptive = true;
  adaptive.local.policy.max_period = 8;
  adaptive.local.policy.source = gravac::network_source::profile;
  adaptive.local.policy.time.source = gravac::time_source::simulated;
  adaptive.local.outer.kind = gravac::outer_kind::nesterov;
  adaptive.local.overlap = GENERATE(false, true);
  INFO("overlap " << adaptive.local.overlap);
  auto cfg = tiny(adaptive);
  cfg.epochs = 4;
  cfg.compute_s = 0.05;  // per-step training pays on the fast phases (1 ms), not on the slow ones (32 ms)
  cfg.local_steps = true;
  cfg.network = fmnist::network_config::parse("schedule:1");
  const auto ref = run4(cfg);  // every rank ends with the same parameters
  REQUIRE(ref.steps.size() == 80);
  // Steps without an exchange (inside local rounds), per epoch: none in the fast epochs' last
  // steps, many in the slow epochs.
  std::vector<int> silent(4, 0), silent_tail(4, 0);
  for (const auto& s : ref.steps) {
    silent[s.epoch] += s.bytes_sent == 0;
    silent_tail[s.epoch] += s.bytes_sent == 0 && s.step % 20 >= 12;
  }
  INFO("silent steps per epoch " << silent[0] << " " << silent[1] << " " << silent[2] << " " << silent[3]);
  CHECK(silent[0] == 0);
  CHECK(silent[1] > 10);
  CHECK(silent_tail[2] == 0);
  CHECK(silent[3] > 10);
  const auto two = fmnist_test::train_on_threads(cfg, 2);
  CHECK(two[1].final_params == two[0].final_params);

  // Stopped in the second fast epoch after the switch (checkpoint at step 49), resumed.
  scratch_dir dir(std::string("local_switch_") + (adaptive.local.overlap ? "overlap" : "sync"));
  auto first = with_checkpoints(cfg, dir.path, "7");
  first.max_steps = 52;
  run4(first);
  auto second = with_checkpoints(cfg, dir.path, "7");
  second.checkpoint.resume = true;
  const auto resumed = run4(second);
  CHECK(resumed.resumed_from_step == 49);
  same_params(ref, resumed);
  same_records(ref, resumed, {49});
}
