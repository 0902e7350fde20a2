// The asynchronous step's contract beyond its bits (test_async_step_*.cpp check those):
// misuse is refused with a clear error, a rank's non-finite gradient ends the step on
// every rank with the residual invariant kept, checkpoints hold every bucket's state, and
// the modeled timeline hides communication behind backward.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "bucket_checks.hpp"
#include "gravac/checkpoint.hpp"
#include "gravac/comm/simulated_communicator.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/topk.hpp"

using namespace gravac;

TEST_CASE("async step: misuse is refused and leaves the trainer usable", "[buckets][async]") {
  const auto lay = test::mixed_layout();
  run_ranks(1, [&](thread_communicator& comm) {
    trainer<topk, allgather, fixed_policy> t(comm, lay, {.bucket_bytes = bucket_per_layer});
    auto g = test::rank_gradient(lay, 0, 0);
    CHECK_THROWS_WITH(t.ready(0), Catch::Contains("no asynchronous step in progress"));
    CHECK_THROWS_WITH(t.finish(), Catch::Contains("no asynchronous step in progress"));
    t.begin_step(std::span<float>(g));
    CHECK(t.step_in_progress());
    CHECK_THROWS_WITH(t.begin_step(std::span<float>(g)), Catch::Contains("already in progress"));
    CHECK_THROWS_WITH(t.step(std::span<float>(g)), Catch::Contains("already in progress"));
    CHECK_THROWS_WITH(t.ready(lay.size()), Catch::Contains("outside the layout"));
    t.ready(5);
    CHECK_THROWS_WITH(t.ready(5), Catch::Contains("'tail' was already marked ready"));
    const auto& r = t.finish();  // marks the rest ready
    CHECK_FALSE(t.step_in_progress());
    CHECK(r.buckets == t.bucket_count());
    CHECK(t.steps() == 1);
    CHECK_NOTHROW(t.step(std::span<float>(g)));
    CHECK(t.steps() == 2);
  });
  run_ranks(1, [&](thread_communicator& comm) {
    CHECK_THROWS_WITH((trainer<topk, allgather, fixed_policy>(comm, lay, {.bucket_bytes = 0})),
                      Catch::Contains("bucket_bytes must be positive"));
  });
}

TEST_CASE("async step: a non-finite gradient ends the step on every rank, nothing lost", "[buckets][async]") {
  const auto lay = test::mixed_layout();  // buckets: tail | fc2 | fc1 + empty | conv1.bias | conv1.weight
  constexpr int ranks = 4;
  std::vector<std::string> what(ranks);
  std::vector<std::vector<float>> grads(ranks), residuals(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    trainer<topk, allgather, fixed_policy> t(comm, lay,
                                             {.policy = {.kept_fraction = 0.2}, .bucket_bytes = bucket_per_layer});
    auto g = test::rank_gradient(lay, 0, comm.rank());
    if (comm.rank() == 1) g[lay[2].offset + 7] = std::numeric_limits<float>::quiet_NaN();
    grads[r] = g;
    t.begin_step(std::span<float>(g));
    for (std::size_t i = lay.size(); i-- > 0;) t.ready(i);
    try {
      t.finish();
    } catch (const error& e) {
      CHECK(e.code() == status::non_finite);
      what[r] = e.what();
    }
    CHECK(t.steps() == 0);  // the step did not count
    const auto& ct = t;
    residuals[r].assign(ct.residual().begin(), ct.residual().end());
    // The trainer takes the next step.
    auto ok = test::rank_gradient(lay, 1, comm.rank());
    CHECK_NOTHROW(t.step(std::span<float>(ok)));
  });
  CHECK_THAT(what[1], Catch::Contains("layer 'fc1.weight'"));
  for (int r : {0, 2, 3}) CHECK_THAT(what[static_cast<std::size_t>(r)], Catch::Contains("rank 1's gradient"));
  // Every rank's residual holds what it did not get to send: u = g + e = g (e was 0)
  // wherever it sent; the failing rank left its bad layer's bucket and the later ones out
  // (their residual is the old one, 0).
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    const auto& e = residuals[static_cast<std::size_t>(r)];
    const auto& g = grads[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const auto& l = lay[i];
      const bool left_out = r == 1 && i <= 3;  // fc1 (and the empty layer), conv1.bias, conv1.weight
      for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) {
        INFO("layer " << l.name << " element " << j);
        REQUIRE(e[j] == (left_out ? 0.0f : g[j]));
      }
    }
  }
}

TEST_CASE("async step: skip_step and zero_values behave as in the synchronous step", "[buckets][async]") {
  const auto lay = test::mixed_layout();
  for (auto action : {non_finite_action::skip_step, non_finite_action::zero_values}) {
    for (auto mode : {test::step_mode::synchronous, test::step_mode::overlapped}) {
      std::vector<std::vector<float>> out(3), res(3);
      std::vector<char> skipped(3);  // not vector<bool>: each rank writes its own element
      run_ranks(3, [&](thread_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        trainer<topk, allgather, fixed_policy> t(
            comm, lay, {.policy = {.kept_fraction = 0.3}, .on_non_finite = action, .bucket_bytes = bucket_per_layer});
        auto g = test::rank_gradient(lay, 0, comm.rank());
        if (comm.rank() == 2) g[lay[4].offset + 1] = std::numeric_limits<float>::infinity();
        const step_report* rep = nullptr;
        if (mode == test::step_mode::synchronous) {
          rep = &t.step(std::span<float>(g));
        } else {
          t.begin_step(std::span<float>(g));
          for (std::size_t i = lay.size(); i-- > 0;) t.ready(i);
          rep = &t.finish();
        }
        skipped[r] = rep->skipped;
        out[r] = g;
        const auto& ct = t;
        res[r].assign(ct.residual().begin(), ct.residual().end());
      });
      static std::vector<std::vector<float>> sync_out, sync_res;
      INFO("action " << static_cast<int>(action));
      for (std::size_t r = 0; r < 3; ++r) {
        CHECK((skipped[r] != 0) == (action == non_finite_action::skip_step));
        for (float v : out[r]) CHECK(std::isfinite(v));
      }
      if (mode == test::step_mode::synchronous) {
        sync_out = out;
        sync_res = res;
      } else {
        CHECK(out == sync_out);
        CHECK(res == sync_res);
      }
    }
  }
}

TEST_CASE("async step: a checkpoint holds every bucket's state", "[buckets][async][checkpoint]") {
  const auto lay = test::mixed_layout();
  const std::string dir = "async_step_ckpt";
  std::filesystem::create_directories(dir);
  std::vector<std::uint64_t> resumed(2), straight(2);
  run_ranks(2, [&](thread_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    const std::string path = dir + "/rank" + std::to_string(r);
    using T = trainer<topk, allgather, gravac_policy>;
    auto opt = test::determinism_options<topk, allgather, gravac_policy>();
    opt.bucket_bytes = bucket_per_layer;
    const auto run = [&](T& t, int from, int to) {
      std::uint64_t h = 0;
      for (int s = from; s < to; ++s) {
        auto g = test::rank_gradient(lay, s, comm.rank(), test::amplitude_at(s));
        t.step(std::span<float>(g));
        h = test::fnv1a_floats(g, h);
      }
      return h;
    };
    T a(comm, lay, opt);
    run(a, 0, 4);
    save_checkpoint(a, path);
    straight[r] = run(a, 4, 8);
    T b(comm, lay, opt);
    restore_checkpoint(b, path);
    resumed[r] = run(b, 4, 8);
  });
  CHECK(resumed == straight);
  std::filesystem::remove_all(dir);
}

TEST_CASE("bucket states: a stateful part's checkpoint blob per bucket, checked before loading",
          "[buckets][checkpoint]") {
  const auto save_part = [](std::size_t b, std::vector<std::byte>& out) {
    out.assign(b + 1, static_cast<std::byte>(0x40 + b));  // bucket b saves b + 1 bytes
  };
  std::vector<std::byte> one, three;
  detail::save_bucket_states(1, one, save_part);
  CHECK(one == std::vector<std::byte>{std::byte{0x40}});  // one bucket: the part's own blob, as without buckets
  detail::save_bucket_states(3, three, save_part);
  std::vector<std::vector<std::byte>> loaded(3);
  detail::load_bucket_states(3, three, "compressor", [&](std::size_t b, std::span<const std::byte> in) {
    loaded[b].assign(in.begin(), in.end());
  });
  for (std::size_t b = 0; b < 3; ++b) {
    std::vector<std::byte> expect;
    save_part(b, expect);
    CHECK(loaded[b] == expect);
  }
  int loads = 0;
  const auto count = [&](std::size_t, std::span<const std::byte>) { ++loads; };
  CHECK_THROWS_WITH(detail::load_bucket_states(2, three, "compressor", count),
                    Catch::Contains("saved with 3 buckets; this trainer has 2"));
  CHECK_THROWS_WITH(detail::load_bucket_states(3, one, "compressor", count), Catch::Contains("saved with one bucket"));
  auto cut = three;
  cut.pop_back();
  CHECK_THROWS_WITH(detail::load_bucket_states(3, cut, "collective", count),
                    Catch::Contains("collective state is truncated"));
  auto longer = three;
  longer.push_back(std::byte{0});
  CHECK_THROWS_WITH(detail::load_bucket_states(3, longer, "compressor", count), Catch::Contains("trailing bytes"));
  CHECK(loads == 0);  // nothing loads from a bad frame
}

TEST_CASE("async step: the modeled timeline hides communication behind backward", "[buckets][async][network]") {
  const auto lay = test::mixed_layout();
  const auto net = network_params::from_gbps(1e-3, 1);  // 1 ms latency, 1 Gbit/s
  std::vector<double> exposed_sync(2), total_sync(2), exposed_zero(2), total_zero(2), exposed_spread(2),
      total_spread(2);
  run_ranks(2, [&](thread_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    simulated_communicator<thread_communicator> sim(comm, network_profile::constant(net));
    trainer<identity, dense_allreduce, fixed_policy> t(sim, lay, {.bucket_bytes = bucket_per_layer});
    auto g = test::rank_gradient(lay, 0, comm.rank());
    const auto& a = t.step(std::span<float>(g));
    exposed_sync[r] = a.modeled_exposed_s;
    total_sync[r] = a.modeled_communicate_s;
    // Backward ends at once (every layer ready at 0): nothing hides.
    t.begin_step(std::span<float>(g));
    for (std::size_t i = lay.size(); i-- > 0;) t.ready(i, 0.0);
    const auto& b = t.finish();
    exposed_zero[r] = b.modeled_exposed_s;
    total_zero[r] = b.modeled_communicate_s;
    // 1 s of backward per layer, far more than a bucket's messages: only the last bucket
    // (ready when backward ends) is exposed.
    t.begin_step(std::span<float>(g));
    for (std::size_t i = lay.size(); i-- > 0;) t.ready(i, static_cast<double>(lay.size() - i));
    const auto& c = t.finish();
    exposed_spread[r] = c.modeled_exposed_s;
    total_spread[r] = c.modeled_communicate_s;
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(total_sync[r] > 0);
    CHECK(exposed_sync[r] == total_sync[r]);
    CHECK(exposed_zero[r] == Approx(total_zero[r]).epsilon(1e-12));
    CHECK(exposed_spread[r] > 0);
    CHECK(exposed_spread[r] < 0.5 * total_spread[r]);  // 5 buckets, one exposed
    CHECK(exposed_spread[r] == exposed_spread[0]);     // every rank models the same
  }
}

TEST_CASE("async step: a rank that fails in backward ends every rank with an error naming it", "[buckets][async]") {
  const auto lay = test::mixed_layout();
  constexpr int ranks = 4;
  std::vector<std::string> what(ranks);
  try {
    // A short team timeout: without the abandon, the others would report a timeout instead.
    run_ranks(
        ranks,
        [&](thread_communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          // The gradient first: it must outlive the trainer, whose communication thread may
          // still be writing it when rank 2's exception destroys the trainer.
          auto g = test::rank_gradient(lay, 0, comm.rank());
          trainer<topk, allgather, fixed_policy> t(comm, lay, {.bucket_bytes = bucket_per_layer});
          t.begin_step(std::span<float>(g));
          t.ready(5);  // the first bucket starts on every rank
          t.ready(4);
          if (comm.rank() == 2) throw std::runtime_error("backward failed on rank 2");
          try {
            t.finish();
          } catch (const error& e) {
            CHECK(e.code() == status::aborted);
            what[r] = e.what();
          }
        },
        std::chrono::seconds(60));
    FAIL("run_ranks should rethrow rank 2's failure");
  } catch (const std::runtime_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("backward failed on rank 2"));
  }
  for (int r : {0, 1, 3}) {
    INFO("rank " << r);
    CHECK_THAT(what[static_cast<std::size_t>(r)], Catch::Contains("rank 2") && Catch::Contains("abandoned"));
  }
}

TEST_CASE("async step: checkpoints are taken between steps, never inside one", "[buckets][async][checkpoint]") {
  const auto lay = test::mixed_layout();
  run_ranks(1, [&](thread_communicator& comm) {
    trainer<topk, allgather, fixed_policy> t(comm, lay, {.bucket_bytes = bucket_per_layer});
    auto g = test::rank_gradient(lay, 0, 0);
    t.begin_step(std::span<float>(g));
    CHECK_THROWS_WITH(save_checkpoint(t, "never_written.ckpt"), Catch::Contains("between steps"));
    CHECK_THROWS_WITH(restore_checkpoint(t, "never_written.ckpt"), Catch::Contains("between steps"));
    CHECK_FALSE(std::filesystem::exists("never_written.ckpt"));
    t.finish();
  });
}

TEST_CASE("checkpoint: the trainer's step state travels, so a resumed run sends what an uninterrupted one does",
          "[checkpoint]") {
  const auto lay = test::mixed_layout();
  const std::string dir = "step_state_ckpt";
  std::filesystem::create_directories(dir);
  run_ranks(2, [&](thread_communicator& comm) {
    const std::string path = dir + "/rank" + std::to_string(comm.rank());
    using T = trainer<topk, allgather, gravac_policy>;  // needs statistics: the last step's times ride along
    const auto opt = test::determinism_options<topk, allgather, gravac_policy>();
    T a(comm, lay, opt);
    for (int s = 0; s < 3; ++s) {
      auto g = test::rank_gradient(lay, s, comm.rank());
      a.step(std::span<float>(g));
    }
    save_checkpoint(a, path);
    T b(comm, lay, opt);
    restore_checkpoint(b, path);
    std::vector<std::byte> sa, sb;
    a.save_step_state(sa);
    b.save_step_state(sb);
    CHECK(sa == sb);
    auto g = test::rank_gradient(lay, 3, comm.rank());
    CHECK(b.step(std::span<float>(g)).previous_times_agreed);  // as the uninterrupted run's step 3
    CHECK_THROWS_WITH(b.load_step_state(std::span<const std::byte>(sa).first(8)), Catch::Contains("has 8 bytes"));
  });
  // A version 2 file (no step state) is still read: its steps start without pending times.
  auto s = read_checkpoint(dir + "/rank0");
  s.trainer.clear();
  auto bytes = encode_checkpoint(s);
  detail::checkpoint_header h;
  std::memcpy(&h, bytes.data(), sizeof h);
  bytes.resize(bytes.size() - 8);  // drop the empty trainer blob (its length word)
  h.version = 2;
  h.payload_bytes -= 8;
  h.checksum = detail::fnv1a(bytes.data() + sizeof h, bytes.size() - sizeof h);
  std::memcpy(bytes.data(), &h, sizeof h);
  const auto v2 = decode_checkpoint(bytes, "v2");
  CHECK(v2.steps == 3);
  CHECK(v2.trainer.empty());
  h.version = 1;
  std::memcpy(bytes.data(), &h, sizeof h);
  CHECK_THROWS_WITH(decode_checkpoint(bytes, "v1"), Catch::Contains("unsupported checkpoint version 1"));
  std::filesystem::remove_all(dir);
}
