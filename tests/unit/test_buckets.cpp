// Buckets: the split of a layout (bucket_plan.hpp) and what a bucketed step gives: with one
// bucket the step of a trainer without buckets, bit for bit; a dense step in any buckets
// the exact rank average; the asynchronous step the synchronous one's bits.
#include <catch2/catch.hpp>
#include <span>
#include <vector>

#include "bucket_checks.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/topk.hpp"

using namespace gravac;

namespace {

layout sized_layout() {
  layout l;
  l.add("a", {100}, layer_kind::dense);  // 400 bytes
  l.add("b", {0}, layer_kind::dense);    // empty
  l.add("c", {50}, layer_kind::dense);   // 200 bytes
  l.add("d", {300}, layer_kind::dense);  // 1200 bytes
  l.add("e", {10}, layer_kind::bias_or_norm);
  l.add("f", {0}, layer_kind::dense);  // empty, last
  return l;
}

}  // namespace

TEST_CASE("bucket_plan: buckets from the last layer to the first, never split, never empty", "[buckets]") {
  const auto lay = sized_layout();
  SECTION("one bucket") {
    const bucket_plan p(lay, one_bucket);
    REQUIRE(p.size() == 1);
    CHECK(p[0].first_layer == 0);
    CHECK(p[0].last_layer == lay.size());
    CHECK(p[0].numel == lay.numel());
    CHECK(p[0].layers.hash() == lay.hash());  // the same layout: the step of a trainer without buckets
  }
  SECTION("one per layer: an empty layer rides with the layer before it") {
    const bucket_plan p(lay, bucket_per_layer);
    REQUIRE(p.size() == 4);
    CHECK(p[0].first_layer == 4);  // e and the empty f
    CHECK(p[0].last_layer == 6);
    CHECK(p[1].first_layer == 3);
    CHECK(p[2].first_layer == 2);  // c
    CHECK(p[2].last_layer == 3);
    CHECK(p[3].first_layer == 0);  // a and the empty b
    CHECK(p[3].last_layer == 2);
    CHECK(p.bucket_of(5) == 0);
    CHECK(p.bucket_of(1) == 3);
    for (std::size_t b = 0; b < p.size(); ++b) {
      CHECK(p[b].numel > 0);
      CHECK(p[b].offset == lay[p[b].first_layer].offset);
      CHECK(p[b].layers.size() == p[b].last_layer - p[b].first_layer);
      CHECK(p[b].layers[0].id == lay[p[b].first_layer].id);  // the same stable ids
      CHECK(p[b].layers[0].offset == 0);
    }
  }
  SECTION("a target size closes a bucket once reached") {
    const bucket_plan p(lay, 1000);
    REQUIRE(p.size() == 2);
    CHECK(p[0].first_layer == 3);  // e (40) + d (1200) >= 1000
    CHECK(p[1].first_layer == 0);
    CHECK(p[1].numel == 150);
  }
  SECTION("leading empty layers join the first layers' bucket") {
    layout l;
    l.add("z", {0}, layer_kind::dense);
    l.add("w", {4}, layer_kind::dense);
    const bucket_plan p(l, bucket_per_layer);
    REQUIRE(p.size() == 1);
    CHECK(p[0].first_layer == 0);
  }
  CHECK_THROWS_WITH(bucket_plan(lay, 0), Catch::Contains("bucket_bytes must be positive"));
}

TEST_CASE("buckets: a dense step in any buckets is the exact rank average", "[buckets]") {
  const auto lay = test::mixed_layout();
  for (std::size_t bytes : {one_bucket, bucket_per_layer, std::size_t{2048}}) {
    std::vector<std::vector<float>> out(4);
    run_ranks(4, [&](thread_communicator& comm) {
      trainer<identity, dense_allreduce, fixed_policy> t(comm, lay, {.bucket_bytes = bytes});
      auto g = test::rank_gradient(lay, 0, comm.rank());
      const auto& r = t.step(std::span<float>(g));
      CHECK(r.buckets == t.bucket_count());
      CHECK(r.bytes_sent == lay.numel() * sizeof(float));
      out[static_cast<std::size_t>(comm.rank())] = g;
    });
    std::vector<float> expect(lay.numel(), 0.0f);
    for (int r = 0; r < 4; ++r) {
      const auto g = test::rank_gradient(lay, 0, r);
      for (std::size_t i = 0; i < g.size(); ++i) expect[i] += g[i];
    }
    for (auto& v : expect) v *= 0.25f;
    INFO("bucket_bytes " << bytes);
    for (const auto& o : out) CHECK(test::max_rel_diff(o, expect) < 1e-6);
  }
}

TEST_CASE("buckets: one bucket gives the unbucketed step's bits", "[buckets]") {
  // The default (25 MiB) puts this small layout in one bucket, as one_bucket does.
  const auto lay = test::mixed_layout();
  const auto run = [&](std::size_t bytes) {
    std::vector<test::run_hashes> out(4);
    run_ranks(4, [&](thread_communicator& comm) {
      out[static_cast<std::size_t>(comm.rank())] =
          test::bucketed_run<topk, allgather, gravac_policy>(comm, lay, 10, bytes, test::step_mode::synchronous);
    });
    return out;
  };
  CHECK(run(default_bucket_bytes) == run(one_bucket));
}

TEST_CASE("buckets: several buckets send each its own packet", "[buckets]") {
  const auto lay = test::mixed_layout();
  run_ranks(2, [&](thread_communicator& comm) {
    trainer<topk, allgather, fixed_policy> one(comm, lay,
                                               {.policy = {.kept_fraction = 0.1}, .bucket_bytes = one_bucket});
    trainer<topk, allgather, fixed_policy> per_layer(
        comm, lay, {.policy = {.kept_fraction = 0.1}, .bucket_bytes = bucket_per_layer});
    CHECK(one.bucket_count() == 1);
    CHECK(per_layer.bucket_count() == 5);  // the empty layer rides with fc1.weight
    auto g1 = test::rank_gradient(lay, 1, comm.rank());
    auto g2 = g1;
    const std::size_t b1 = one.step(std::span<float>(g1)).bytes_sent;
    const auto& r2 = per_layer.step(std::span<float>(g2));
    CHECK(r2.buckets == 5);
    // The same values travel (per-layer top-k) in five packets: four more headers.
    CHECK(r2.bytes_sent > b1);
    CHECK(test::max_rel_diff(g1, g2) == 0.0);
  });
}
