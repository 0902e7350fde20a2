// Checkpoint and restore: bit-identical resumption, and rejection of truncated, corrupted
// and foreign checkpoints before anything in the trainer changes.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gravac/checkpoint.hpp"
#include "gravac/policy/gravac_policy.hpp"
#include "reliability_util.hpp"

using namespace gravac;

namespace {
using gravac::test::ranks;

std::vector<std::byte> file_bytes(const std::string& path) { return detail::read_file(path); }
void write_bytes(const std::string& path, const std::vector<std::byte>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// 200 uninterrupted steps versus 100 steps, checkpoint, a brand-new trainer (built with a
// different seed, which the checkpoint must override), restore, 100 more steps: every
// rank's parameters and residual must be bit-identical.
template <class C, class K, class P>
void check_resume(const typename trainer<C, K, P>::options& opt, const std::string& tag) {
  using T = trainer<C, K, P>;
  std::vector<std::vector<float>> straight_params(ranks), straight_res(ranks), resumed_params(ranks),
      resumed_res(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    test::linear_model m;
    T t(comm, m.lay, opt);
    m.train(t, comm.rank(), 200);
    straight_params[comm.rank()] = m.params;
    straight_res[comm.rank()].assign(t.residual().begin(), t.residual().end());
  });
  test::scratch_dir dir("resume-" + tag);
  run_ranks(ranks, [&](thread_communicator& comm) {
    test::linear_model m;
    const std::string path = dir.file("rank" + std::to_string(comm.rank()) + ".ckpt");
    {
      T t(comm, m.lay, opt);
      m.train(t, comm.rank(), 100);
      save_checkpoint(t, path);
    }
    auto opt2 = opt;
    opt2.seed = opt.seed + 12345;
    T t2(comm, m.lay, opt2);
    const auto rep = restore_checkpoint(t2, path);
    CHECK(rep.steps == 100);
    CHECK(rep.policy_restored);
    CHECK(t2.get_options().seed == opt.seed);
    m.train(t2, comm.rank(), 200);
    resumed_params[comm.rank()] = m.params;
    resumed_res[comm.rank()].assign(t2.residual().begin(), t2.residual().end());
  });
  for (int r = 0; r < ranks; ++r) {
    INFO(tag << " rank " << r);
    CHECK(test::bitwise_equal(resumed_params[r], straight_params[r]));
    CHECK(test::bitwise_equal(resumed_res[r], straight_res[r]));
  }
  // The run actually compressed (a zero residual would make the test vacuous).
  bool nonzero = false;
  for (float x : straight_res[0]) nonzero = nonzero || x != 0.0f;
  CHECK(nonzero);
}

// A one-rank trainer of the mixed layout that has run a few steps (non-zero residual).
using topk_trainer = trainer<topk, allgather, fixed_policy>;

template <class Body>
void with_trained(Body&& body, const layout& lay = test::mixed_layout()) {
  run_ranks(1, [&](thread_communicator& comm) {
    topk_trainer t(comm, lay, {.policy = {.kept_fraction = 0.1}, .seed = 3});
    for (int s = 0; s < 3; ++s) {
      auto g = test::make_data(lay.numel(), 40 + s);
      t.step(g);
    }
    body(comm, t);
  });
}

std::vector<float> residual_of(topk_trainer& t) { return {t.residual().begin(), t.residual().end()}; }
}  // namespace

TEST_CASE("checkpoint: 100 + restore + 100 steps equal 200 steps bit for bit", "[reliability][checkpoint]") {
  SECTION("top-k, allgather, fixed policy") {
    check_resume<topk, allgather, fixed_policy>({.policy = {.kept_fraction = 0.05}, .seed = 11}, "topk");
  }
  SECTION("random-k, dense allreduce, fixed policy (indices drawn from the restored seed and step)") {
    check_resume<randomk, dense_allreduce, fixed_policy>({.policy = {.kept_fraction = 0.1}, .seed = 21}, "randomk");
  }
  SECTION("QSGD, compressed allreduce (both residuals: the rank's and its shard's server residual)") {
    check_resume<qsgd, compressed_allreduce, fixed_policy>({.seed = 41}, "compressed");
  }
  SECTION("top-k, allgather, gravac_policy mid-search (policy state restored)") {
    gravac_policy_options p;
    p.cf_min = 2;
    p.cf_max = 64;
    p.window = 5;
    p.warmup_steps = 20;
    p.period_steps = 15;
    p.time = {time_source::simulated, 0.01};
    check_resume<topk, allgather, gravac_policy>({.policy = p, .seed = 31}, "gravac");
  }
}

TEST_CASE("checkpoint: the file round-trips every field", "[reliability][checkpoint]") {
  test::scratch_dir dir("roundtrip");
  with_trained([&](thread_communicator&, topk_trainer& t) {
    save_checkpoint(t, dir.file("a.ckpt"));
    const auto s = read_checkpoint(dir.file("a.ckpt"));
    CHECK(s.steps == 3);
    CHECK(s.seed == 3);
    CHECK(s.rank == 0);
    CHECK(s.ranks == 1);
    CHECK(s.layout_hash == t.get_layout().hash());
    REQUIRE(s.layers.size() == t.get_layout().size());
    for (std::size_t i = 0; i < s.layers.size(); ++i) {
      CHECK(s.layers[i].id == t.get_layout()[i].id);
      CHECK(s.layers[i].numel == t.get_layout()[i].numel);
    }
    CHECK(test::bitwise_equal(s.residual, residual_of(t)));
    // Written atomically: no temporary file is left next to it.
    std::size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
      ++files;
      CHECK(e.path().filename() == "a.ckpt");
    }
    CHECK(files == 1);
    // Saving again replaces the file in place.
    t.set_steps(77);
    save_checkpoint(t, dir.file("a.ckpt"));
    CHECK(read_checkpoint(dir.file("a.ckpt")).steps == 77);
  });
}

TEST_CASE("checkpoint: a truncated file is rejected at every length", "[reliability][checkpoint]") {
  test::scratch_dir dir("truncated");
  with_trained([&](thread_communicator&, topk_trainer& t) {
    save_checkpoint(t, dir.file("a.ckpt"));
    const auto full = file_bytes(dir.file("a.ckpt"));
    for (std::size_t len = 0; len < full.size(); ++len) {
      INFO("length " << len);
      REQUIRE_THROWS_WITH(decode_checkpoint(std::span<const std::byte>(full.data(), len)),
                          Catch::Contains("truncated"));
    }
    // Through a file, and the trainer is untouched.
    const auto before = residual_of(t);
    t.set_steps(5);
    write_bytes(dir.file("cut.ckpt"), std::vector<std::byte>(full.begin(), full.begin() + full.size() / 2));
    try {
      restore_checkpoint(t, dir.file("cut.ckpt"));
      FAIL("no throw");
    } catch (const gravac::error& e) {
      CHECK(e.code() == status::io_failure);
      CHECK_THAT(e.what(), Catch::Contains("cut.ckpt") && Catch::Contains("truncated") && Catch::Contains("rank 0"));
    }
    CHECK(t.steps() == 5);
    CHECK(test::bitwise_equal(residual_of(t), before));
  });
}

TEST_CASE("checkpoint: a corrupted byte anywhere is rejected", "[reliability][checkpoint]") {
  test::scratch_dir dir("corrupt");
  with_trained([&](thread_communicator&, topk_trainer& t) {
    save_checkpoint(t, dir.file("a.ckpt"));
    const auto full = file_bytes(dir.file("a.ckpt"));
    for (std::size_t at = 0; at < full.size(); at += 7) {
      auto bad = full;
      bad[at] ^= std::byte{0x10};
      INFO("byte " << at);
      REQUIRE_THROWS_AS(decode_checkpoint(bad), gravac::error);
      if (at >= 32) REQUIRE_THROWS_WITH(decode_checkpoint(bad), Catch::Contains("checksum mismatch"));
    }
    auto bad = full;
    bad[0] = std::byte{'X'};
    CHECK_THROWS_WITH(decode_checkpoint(bad), Catch::Contains("wrong magic"));
    bad = full;
    bad[8] = std::byte{9};  // version
    CHECK_THROWS_WITH(decode_checkpoint(bad), Catch::Contains("unsupported checkpoint version 9"));
    bad = full;
    bad.push_back(std::byte{0});
    CHECK_THROWS_WITH(decode_checkpoint(bad), Catch::Contains("trailing bytes"));
    CHECK_THROWS_WITH(read_checkpoint(dir.file("missing.ckpt")), Catch::Contains("cannot open"));
  });
}

TEST_CASE("checkpoint: a well-formed file with bad content is rejected", "[reliability][checkpoint]") {
  const auto lay = test::mixed_layout();
  checkpoint_state s;
  s.layout_hash = lay.hash();
  s.residual.assign(lay.numel(), 0.0f);
  for (const auto& l : lay.layers())
    s.layers.push_back({l.id, l.numel, std::vector<std::uint64_t>(l.shape.begin(), l.shape.end()), l.offset});
  REQUIRE_NOTHROW(decode_checkpoint(encode_checkpoint(s)));
  auto bad = s;
  bad.residual[5] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(decode_checkpoint(encode_checkpoint(bad)), Catch::Contains("not finite"));
  bad = s;
  bad.layers[0].shape = {1000, 1000};  // shape disagrees with numel
  CHECK_THROWS_WITH(decode_checkpoint(encode_checkpoint(bad)), Catch::Contains("shape"));
  bad = s;
  bad.rank = 4;
  bad.ranks = 4;
  CHECK_THROWS_WITH(decode_checkpoint(encode_checkpoint(bad)), Catch::Contains("rank fields"));
  bad = s;
  bad.layers[2].numel += 1;  // more residuals claimed than stored
  bad.layers[2].shape.clear();
  CHECK_THROWS_AS(decode_checkpoint(encode_checkpoint(bad)), gravac::error);
}

TEST_CASE("checkpoint: another layout is rejected; remap restores by layer id", "[reliability][checkpoint]") {
  test::scratch_dir dir("layout");
  std::vector<float> saved;
  layout original = test::mixed_layout();
  with_trained(
      [&](thread_communicator&, topk_trainer& t) {
        save_checkpoint(t, dir.file("a.ckpt"));
        saved = residual_of(t);
      },
      original);
  // Same tensors, other order; and a layout where fc1 changed shape.
  layout reordered;
  for (std::size_t i = original.size(); i-- > 0;) reordered.add(original[i].name, original[i].shape, original[i].kind);
  layout reshaped;
  for (const auto& l : original.layers())
    reshaped.add(l.name, l.name == "fc1.weight" ? std::vector<std::size_t>{17, 33} : l.shape, l.kind);
  reshaped.add("new.bias", {5}, layer_kind::bias_or_norm);

  run_ranks(1, [&](thread_communicator& comm) {
    topk_trainer t(comm, reordered, {});
    try {
      restore_checkpoint(t, dir.file("a.ckpt"));
      FAIL("no throw");
    } catch (const gravac::error& e) {
      CHECK(e.code() == status::layout_mismatch);
      CHECK_THAT(e.what(), Catch::Contains("another layout"));
    }
    CHECK(t.steps() == 0);
    const auto rep = restore_checkpoint(t, dir.file("a.ckpt"), {.remap_layers = true});
    CHECK(rep.layers_restored == original.size());
    CHECK(rep.layers_reset == 0);
    CHECK_FALSE(rep.policy_restored);
    CHECK(t.steps() == 3);
    for (const auto& l : original.layers()) {
      const auto& nl = reordered[reordered.find(l.id)];
      INFO(l.name);
      CHECK(std::equal(saved.begin() + l.offset, saved.begin() + l.offset + l.numel, t.residual().begin() + nl.offset));
    }
  });
  run_ranks(1, [&](thread_communicator& comm) {
    topk_trainer t(comm, reshaped, {});
    const auto rep = restore_checkpoint(t, dir.file("a.ckpt"), {.remap_layers = true});
    CHECK(rep.layers_restored == original.size() - 1);  // all but fc1.weight
    CHECK(rep.layers_reset == 2);                       // fc1.weight (shape changed) and new.bias
    const auto& fc1 = reshaped[reshaped.find(original[2].id)];
    for (std::size_t j = 0; j < fc1.numel; ++j) REQUIRE(t.residual()[fc1.offset + j] == 0.0f);
    const auto& fc2 = original[4];
    CHECK(std::equal(saved.begin() + fc2.offset, saved.begin() + fc2.offset + fc2.numel,
                     t.residual().begin() + reshaped[4].offset));
  });
}

TEST_CASE("checkpoint: a file of another rank is rejected", "[reliability][checkpoint]") {
  test::scratch_dir dir("rank");
  const auto lay = test::mixed_layout();
  run_ranks(2, [&](thread_communicator& comm) {
    topk_trainer t(comm, lay, {});
    save_checkpoint(t, dir.file("rank" + std::to_string(comm.rank()) + ".ckpt"));
    // Every rank loads rank 1's file: rank 0 must refuse, and so every rank fails.
    try {
      restore_checkpoint(t, dir.file("rank1.ckpt"));
      FAIL("no throw");
    } catch (const gravac::error& e) {
      CHECK_THAT(e.what(), Catch::Contains("rank 0: ") && Catch::Contains("written by rank 1 of 2"));
    }
  });
}

TEST_CASE("checkpoint: a bad file on one rank of four fails every rank, naming it", "[reliability][checkpoint]") {
  test::scratch_dir dir("one-bad");
  const auto lay = test::mixed_layout();
  std::atomic<int> failed{0};
  run_ranks(ranks, [&](thread_communicator& comm) {
    topk_trainer t(comm, lay, {.policy = {.kept_fraction = 0.1}});
    auto g = test::make_data(lay.numel(), comm.rank());
    t.step(g);
    const std::string path = dir.file("rank" + std::to_string(comm.rank()) + ".ckpt");
    save_checkpoint(t, path);
    comm.barrier();
    if (comm.rank() == 2) {
      auto b = file_bytes(path);
      b[b.size() / 2] ^= std::byte{1};
      write_bytes(path, b);
    }
    comm.barrier();
    t.set_steps(9);
    const auto before = residual_of(t);
    try {
      restore_checkpoint(t, path);
    } catch (const gravac::error& e) {
      CHECK_THAT(e.what(), Catch::Contains("rank 2: ") && Catch::Contains("checksum mismatch"));
      ++failed;
    }
    // No rank restored anything.
    CHECK(t.steps() == 9);
    CHECK(test::bitwise_equal(residual_of(t), before));
  });
  CHECK(failed == ranks);
}

TEST_CASE("checkpoint: ranks restored at different steps are rejected", "[reliability][checkpoint]") {
  test::scratch_dir dir("steps");
  const auto lay = test::mixed_layout();
  std::atomic<int> failed{0};
  run_ranks(3, [&](thread_communicator& comm) {
    topk_trainer t(comm, lay, {});
    const std::string path = dir.file("rank" + std::to_string(comm.rank()) + ".ckpt");
    t.set_steps(comm.rank() == 1 ? 8 : 4);
    // Saving agrees on the steps too: rank 1 is named at save time already.
    CHECK_THROWS_WITH(save_checkpoint(t, path), Catch::Contains("ranks 1 hold a different step counter"));
    CHECK_THROWS_WITH(restore_checkpoint(t, path), Catch::Contains("ranks 1 hold a different step counter"));
    ++failed;
  });
  CHECK(failed == 3);
}

TEST_CASE("checkpoint: an unwritable path fails on every rank", "[reliability][checkpoint]") {
  const auto lay = test::mixed_layout();
  std::atomic<int> failed{0};
  run_ranks(2, [&](thread_communicator& comm) {
    topk_trainer t(comm, lay, {});
    const std::string path = comm.rank() == 1 ? "/nonexistent-gravac-dir/x.ckpt" : "/dev/null/impossible";
    try {
      save_checkpoint(t, path);
    } catch (const gravac::error& e) {
      CHECK(e.code() == status::io_failure);
      CHECK_THAT(e.what(), Catch::Contains("rank 0: ") && Catch::Contains("rank 1: "));
      ++failed;
    }
  });
  CHECK(failed == 2);
}
