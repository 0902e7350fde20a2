// Faults across ranks: a rank that throws or leaves mid-training, a rank whose packets are
// corrupted in flight, layouts that differ, and ranks whose decisions diverge. Every case
// must end every rank with an error that names the culprit, never a hang.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>

#include "gravac/policy/gravac_policy.hpp"
#include "reliability_util.hpp"

using namespace gravac;

namespace {
using gravac::test::ranks;
using topk_trainer = trainer<topk, allgather, fixed_policy>;

// MOCK (unit test only): a thread communicator whose rank `bad` damages its own packet on
// the way out, as a faulty NIC or a buggy peer would. Everything else is forwarded.
class corrupting_communicator {
 public:
  using communicator_tag = void;
  using memory_space = host_space;
  using byte_buffer = std::vector<std::byte>;

  corrupting_communicator(thread_communicator& inner, int bad, std::size_t offset, std::byte value)
      : inner_(inner), bad_(bad), offset_(offset), value_(value) {}
  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  void allreduce_sum(std::span<float> d) { inner_.allreduce_sum(d); }
  void allreduce_sum(std::span<double> d) { inner_.allreduce_sum(d); }
  void allreduce_max(std::span<double> d) { inner_.allreduce_max(d); }
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    if (rank() != bad_ || !armed) return inner_.allgatherv(in, out, sizes);
    damaged_.assign(in.begin(), in.end());
    if (offset_ < damaged_.size()) damaged_[offset_] = value_;
    inner_.allgatherv(damaged_, out, sizes);
  }
  void broadcast(std::span<std::byte> d, int root) { inner_.broadcast(d, root); }
  void barrier() { inner_.barrier(); }

  bool armed = false;  // off while the trainer verifies layouts

 private:
  thread_communicator& inner_;
  int bad_;
  std::size_t offset_;
  std::byte value_;
  std::vector<std::byte> damaged_;
};
static_assert(Communicator<corrupting_communicator>);
}  // namespace

TEST_CASE("faults: an exception on one rank of four mid-training ends every rank", "[reliability][faults]") {
  const auto lay = test::mixed_layout();
  std::atomic<int> aborted{0};
  CHECK_THROWS_WITH(run_ranks(ranks,
                              [&](thread_communicator& comm) {
                                topk_trainer t(comm, lay, {.policy = {.kept_fraction = 0.1}});
                                for (int s = 0; s < 20; ++s) {
                                  if (comm.rank() == 2 && s == 5) throw std::runtime_error("out of memory on two");
                                  auto g = test::make_data(lay.numel(), s * 10 + comm.rank());
                                  try {
                                    t.step(g);
                                  } catch (const gravac::error& e) {
                                    CHECK(e.code() == status::aborted);
                                    CHECK(e.rank() == comm.rank());
                                    CHECK_THAT(e.what(), Catch::Contains("rank 2 failed: out of memory on two"));
                                    CHECK(t.steps() == 5);
                                    ++aborted;
                                    throw;
                                  }
                                }
                              }),
                    Catch::Contains("out of memory on two"));
  CHECK(aborted == ranks - 1);
}

TEST_CASE("faults: a rank that leaves without a word times the others out", "[reliability][faults]") {
  const auto lay = test::mixed_layout();
  std::atomic<int> ended{0};
  try {
    run_ranks(
        ranks,
        [&](thread_communicator& comm) {
          topk_trainer t(comm, lay, {});
          if (comm.rank() == 1) return;  // e.g. a bug that skips the rest of the epoch
          auto g = test::make_data(lay.numel(), comm.rank());
          try {
            t.step(g);
          } catch (const gravac::error& e) {
            CHECK((e.code() == status::timeout || e.code() == status::aborted));
            ++ended;
            throw;
          }
        },
        std::chrono::milliseconds(300));
    FAIL("no error");
  } catch (const gravac::error& e) {
    CHECK_THAT(e.what(), Catch::Contains("timed out"));
  }
  CHECK(ended == ranks - 1);
}

TEST_CASE("faults: a packet corrupted in flight is rejected on every rank, naming the sender",
          "[reliability][faults][packet]") {
  const auto lay = test::mixed_layout();
  struct damage {
    std::size_t offset;
    std::byte value;
    const char* reason;
  };
  const std::size_t first_index = sizeof(packet_header) + sizeof(segment_header);
  for (const auto& d : {damage{0, std::byte{0x00}, "wrong magic"}, damage{4, std::byte{0x07}, "unsupported version"},
                        damage{first_index + 3, std::byte{0x7f}, "index out of range"},
                        damage{sizeof(packet_header) + 16, std::byte{0xff}, "sparse segment"}}) {
    INFO(d.reason);
    std::atomic<int> rejected{0};
    run_ranks(ranks, [&](thread_communicator& inner) {
      corrupting_communicator comm(inner, 3, d.offset, d.value);
      topk_trainer t(comm, lay, {.policy = {.kept_fraction = 0.1}});
      auto g = test::make_data(lay.numel(), inner.rank());
      t.step(g);  // clean
      comm.armed = true;
      g = test::make_data(lay.numel(), inner.rank() + 7);
      const std::vector<float> res_before(t.residual().begin(), t.residual().end());
      try {
        t.step(g);
        FAIL("no throw");
      } catch (const gravac::error& e) {
        CHECK(e.code() == status::malformed_packet);
        CHECK_THAT(e.what(), Catch::Contains("from rank 3") && Catch::Contains(d.reason));
        ++rejected;
      }
      // The residual is this rank's own business: it holds exactly what this rank did not
      // send, whatever happened to the packet afterwards (error feedback is not corrupted).
      CHECK_FALSE(test::bitwise_equal(std::vector<float>(t.residual().begin(), t.residual().end()), res_before));
    });
    CHECK(rejected == ranks);
  }
}

TEST_CASE("faults: layouts that differ across ranks fail on every rank", "[reliability][faults][layout]") {
  SECTION("same names, one shape differs") {
    std::atomic<int> failed{0};
    CHECK_THROWS_WITH(
        run_ranks(ranks,
                  [&](thread_communicator& comm) {
                    layout lay;
                    lay.add("a", {comm.rank() == 3 ? std::size_t{6} : std::size_t{4}, 3}, layer_kind::dense);
                    lay.add("b", {5}, layer_kind::bias_or_norm);
                    try {
                      topk_trainer t(comm, lay, {});
                    } catch (const gravac::error& e) {
                      CHECK(e.code() == status::layout_mismatch);
                      ++failed;
                      throw;
                    }
                  }),
        Catch::Contains("ranks 3 differ from rank 0"));
    CHECK(failed == ranks);
  }
  SECTION("same tensors, another order") {
    std::atomic<int> failed{0};
    CHECK_THROWS_WITH(run_ranks(ranks,
                                [&](thread_communicator& comm) {
                                  layout lay;
                                  if (comm.rank() % 2 == 1) lay.add("b", {5}, layer_kind::bias_or_norm);
                                  lay.add("a", {4, 3}, layer_kind::dense);
                                  if (comm.rank() % 2 == 0) lay.add("b", {5}, layer_kind::bias_or_norm);
                                  try {
                                    topk_trainer t(comm, lay, {});
                                  } catch (const gravac::error& e) {
                                    ++failed;
                                    throw;
                                  }
                                }),
                      Catch::Contains("ranks 1, 3 differ from rank 0"));
    CHECK(failed == ranks);
  }
  SECTION("verify_layout off: allgather rejects the foreign packets") {
    std::atomic<int> failed{0};
    run_ranks(ranks, [&](thread_communicator& comm) {
      layout lay = test::mixed_layout();
      if (comm.rank() == 1) lay.add("extra", {3}, layer_kind::dense);
      topk_trainer t(comm, lay, {.policy = {.kept_fraction = 0.1}, .verify_layout = false});
      auto g = test::make_data(lay.numel(), comm.rank());
      try {
        t.step(g);
      } catch (const gravac::error& e) {
        CHECK(e.code() == status::layout_mismatch);
        // Rank 1 rejects everybody else's packets, the others reject rank 1's.
        CHECK_THAT(e.what(), Catch::Contains(comm.rank() == 1 ? "from rank 0" : "from rank 1"));
        ++failed;
      }
    });
    CHECK(failed == ranks);
  }
  SECTION("verify_layout off: a dense allreduce of different sizes fails on every rank") {
    std::atomic<int> failed{0};
    CHECK_THROWS_WITH(run_ranks(ranks,
                                [&](thread_communicator& comm) {
                                  layout lay = test::mixed_layout();
                                  if (comm.rank() == 2) lay.add("extra", {3}, layer_kind::dense);
                                  trainer<topk, dense_allreduce, fixed_policy> t(comm, lay, {.verify_layout = false});
                                  auto g = test::make_data(lay.numel(), comm.rank());
                                  try {
                                    t.step(g);
                                  } catch (const gravac::error&) {
                                    ++failed;
                                    throw;
                                  }
                                }),
                      Catch::Contains("sizes differ"));
    CHECK(failed == ranks);
  }
}

TEST_CASE("faults: check_consistency names the ranks whose decision diverged", "[reliability][faults][consistency]") {
  const auto lay = test::mixed_layout();
  std::atomic<int> failed{0};
  run_ranks(ranks, [&](thread_communicator& comm) {
    // A policy fed different options on ranks 1 and 2 plans different kept fractions:
    // allgather would happily average the mismatched packets; the check refuses.
    const double f = comm.rank() == 1 || comm.rank() == 2 ? 0.2 : 0.1;
    topk_trainer t(comm, lay, {.policy = {.kept_fraction = f}, .check_consistency = true});
    auto g = test::make_data(lay.numel(), comm.rank());
    const std::vector<float> g_before = g;
    try {
      t.step(g);
      FAIL("no throw");
    } catch (const gravac::error& e) {
      CHECK(e.code() == status::diverged);
      CHECK_THAT(e.what(), Catch::Contains("step 0: ranks 1, 2 planned different step parameters"));
      ++failed;
    }
    // Checked before anything is sent or touched.
    CHECK(test::bitwise_equal(g, g_before));
    CHECK(t.steps() == 0);
  });
  CHECK(failed == ranks);
}

TEST_CASE("faults: check_consistency passes identical decisions, with every policy input synchronized",
          "[reliability][faults][consistency]") {
  test::linear_model model;
  std::vector<std::vector<float>> with(ranks), without(ranks);
  for (bool check : {true, false}) {
    run_ranks(ranks, [&](thread_communicator& comm) {
      gravac_policy_options p;
      p.cf_min = 2;
      p.cf_max = 32;
      p.warmup_steps = 5;
      p.window = 3;
      p.period_steps = 6;
      p.time = {time_source::simulated, 0.01};
      test::linear_model m;
      trainer<topk, allgather, gravac_policy> t(comm, m.lay, {.policy = p, .check_consistency = check});
      m.train(t, comm.rank(), 60);
      (check ? with : without)[comm.rank()] = m.params;
    });
  }
  // The check observes and never changes the result.
  for (int r = 0; r < ranks; ++r) CHECK(test::bitwise_equal(with[r], without[r]));
}

TEST_CASE("faults: hash_step_params sees every field that changes what is sent", "[reliability][consistency]") {
  const auto lay = test::mixed_layout();
  step_params base = test::params_for(lay, 0.1);
  const auto h0 = detail::hash_step_params(base);
  CHECK(detail::hash_step_params(base) == h0);
  auto p = base;
  p.kept_fraction[3] = 0.2;
  CHECK(detail::hash_step_params(p) != h0);
  p = base;
  p.step += 1;
  CHECK(detail::hash_step_params(p) != h0);
  p = base;
  p.seed += 1;
  CHECK(detail::hash_step_params(p) != h0);
  p = base;
  p.global_fraction = 0.5;
  CHECK(detail::hash_step_params(p) != h0);
  p = base;
  p.collective = collective_kind::allgather;
  CHECK(detail::hash_step_params(p) != h0);
  p = base;
  const double cands[] = {0.1, 0.01};
  p.gain_candidates.assign(std::begin(cands), std::end(cands));
  CHECK(detail::hash_step_params(p) != h0);
}

TEST_CASE("faults: hash_step_settings sees every per-layer setting of a compressor", "[reliability][consistency]") {
  const auto lay = test::mixed_layout();
  const auto h0 = detail::hash_step_params(test::params_for(lay, 0.1));
  adacomp_settings a;
  a.bin_length.assign(lay.size(), 0);
  const auto ha = detail::hash_step_settings(a, h0);
  CHECK(detail::hash_step_settings(a, h0) == ha);
  CHECK(ha != h0);
  CHECK(detail::hash_step_settings(adacomp_settings{}, h0) != ha);  // the length counts
  auto b = a;
  b.bin_length[0] = 50;
  CHECK(detail::hash_step_settings(b, h0) != ha);
  powersgd_settings r{{2, 0, 1}};
  const auto hr = detail::hash_step_settings(r, h0);
  r.approximation_rank[2] = 2;
  CHECK(detail::hash_step_settings(r, h0) != hr);
}

namespace {
// MOCK (unit test only): top-k whose AR-Topk index hook returns one index past the end of
// the layer, as a buggy selection kernel might. The index rank must not scatter with it,
// and no rank may go on alone into the Allreduce.
struct bad_index_topk : topk {
  using topk::topk;
  static constexpr bool shared_indices = false;
  void select_indices(std::span<const float> u, std::size_t i, const step_params& p,
                      std::vector<std::uint64_t>& out) const {
    const std::size_t k = kept_count(u.size(), p.kept_fraction[i]);
    out.clear();
    for (std::size_t j = 0; j + 1 < k; ++j) out.push_back(j);
    out.push_back(u.size() + 1000);
  }
};
}  // namespace

TEST_CASE("faults: an invalid AR-Topk index list fails every rank, the index rank included",
          "[reliability][faults][packet]") {
  const auto lay = test::mixed_layout();
  std::atomic<int> rejected{0};
  run_ranks(ranks, [&](thread_communicator& comm) {
    trainer<bad_index_topk, allreduce_compatible, fixed_policy> t(comm, lay, {.policy = {.kept_fraction = 0.1}});
    auto g = test::make_data(lay.numel(), comm.rank());
    try {
      t.step(g);
      FAIL("no throw");
    } catch (const gravac::error& e) {
      CHECK(e.code() == status::malformed_packet);
      CHECK_THAT(e.what(), Catch::Contains("rank 0 broadcast an invalid index list"));
      ++rejected;
    }
  });
  CHECK(rejected == ranks);
}
