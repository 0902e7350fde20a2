// Degenerate shapes and parameters for every compressor: k = 0, a kept fraction so small
// that k rounds to one, empty layers between full ones, single-element layers, and sizes
// on either side of the bin and bucket lengths (AdaComp 50/500, quantizer buckets of 64).
// Each packet must validate, decode in bounds, and keep error feedback: decompress(sent)
// + e_new == g + e_old (to rounding).
#include <catch2/catch.hpp>

#include "gravac_test_util.hpp"

using namespace gravac;

namespace {
layout awkward_layout() {
  layout l;
  l.add("one", {1}, layer_kind::bias_or_norm);
  l.add("empty.a", {0}, layer_kind::dense);
  l.add("two", {2}, layer_kind::conv);
  l.add("c49", {7, 7}, layer_kind::conv);
  l.add("c51", {51}, layer_kind::conv);
  l.add("b63", {63}, layer_kind::bias_or_norm);
  l.add("d64", {8, 8}, layer_kind::dense);
  l.add("d65", {65}, layer_kind::dense);
  l.add("empty.b", {3, 0}, layer_kind::conv);
  l.add("d129", {129}, layer_kind::dense);
  l.add("d499", {499}, layer_kind::dense);
  l.add("r501", {3, 167}, layer_kind::recurrent);
  l.add("last", {1}, layer_kind::dense);
  return l;
}

template <class C>
void check_edges(const typename C::options& opt) {
  const layout lay = awkward_layout();
  C c(lay, opt);
  std::vector<std::byte> packet(c.max_packet_bytes());
  std::vector<float> e(lay.numel(), 0.0f);
  std::uint64_t step = 0;
  for (double f : {0.0, 1e-9, 0.02, 0.5, 0.999, 1.0}) {
    for (int rep = 0; rep < 2; ++rep) {  // the second pass starts from a non-zero residual
      INFO("fraction " << f << " pass " << rep);
      auto g = test::make_data(lay.numel(), 31 + step, test::distribution::laplace);
      auto p = test::params_for(lay, f, step++, 9);
      p.ranks = 1;
      std::vector<float> u(lay.numel());
      for (std::size_t i = 0; i < u.size(); ++i) u[i] = g[i] + e[i];
      compress_stats st;
      const auto bytes = c.compress(host_view(g), host_view(e), p, packet, st);
      const std::span<const std::byte> pk(packet.data(), bytes);
      const validation v = c.validate(pk);
      INFO(v.reason);
      REQUIRE(v);
      std::vector<float> out(lay.numel(), 0.0f);
      c.decompress_add(pk, host_view(out), 1.0f);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] += e[i];
      CHECK(test::max_rel_diff(out, u) < 1e-4);
      // k = 0 sends nothing of a compressed layer; k rounds up to one otherwise.
      if (f == 0.0 && C::summable_by_index && !std::is_same_v<C, identity>)  // identity sends all
        for (std::size_t i = 0; i < lay.size(); ++i) CHECK(st.layers[i].kept == 0);
      if (f == 1e-9 && std::is_same_v<C, topk>) {  // per layer: one per non-empty layer; whole buffer: one
        std::size_t total = 0;
        for (std::size_t i = 0; i < lay.size(); ++i) {
          CHECK(st.layers[i].kept <= (lay[i].numel ? 1u : 0u));
          total += st.layers[i].kept;
        }
        CHECK(total >= 1);
      }
    }
  }
}
}  // namespace

TEST_CASE("edges: top-k", "[reliability][edges]") {
  check_edges<topk>({});
  check_edges<topk>({.whole_buffer = true});
}
TEST_CASE("edges: threshold", "[reliability][edges]") { check_edges<threshold>({}); }
TEST_CASE("edges: random-k", "[reliability][edges]") { check_edges<randomk>({}); }
TEST_CASE("edges: AdaComp with sizes not divisible by the bin length", "[reliability][edges]") {
  check_edges<adacomp>({});
  check_edges<adacomp>({.conv_bin = 7, .dense_bin = 64, .bias_bin = 2});
}
TEST_CASE("edges: quantizers with sizes not divisible by the bucket", "[reliability][edges]") {
  check_edges<qsgd>({.levels = 3, .bucket = 64});
  check_edges<qsgd>({.levels = 127, .bucket = 0});
  check_edges<terngrad>({.bucket = 64});
  check_edges<sign>({});
  check_edges<cast16>({.format = cast16_format::fp16});
  check_edges<cast16>({.format = cast16_format::bf16});
}
TEST_CASE("edges: identity", "[reliability][edges]") { check_edges<identity>({}); }

TEST_CASE("edges: a trainer over awkward layers runs every collective", "[reliability][edges]") {
  const layout lay = awkward_layout();
  run_ranks(3, [&](thread_communicator& comm) {
    trainer<topk, allgather, fixed_policy> a(comm, lay, {.policy = {.kept_fraction = 1e-9}});
    trainer<topk, dense_allreduce, fixed_policy> b(comm, lay, {.policy = {.kept_fraction = 0.3}});
    trainer<topk, allreduce_compatible, fixed_policy> c(comm, lay, {.policy = {.kept_fraction = 0.05}});
    trainer<randomk, allreduce_compatible, fixed_policy> d(comm, lay, {.policy = {.kept_fraction = 0.05}});
    for (int s = 0; s < 3; ++s) {
      auto g = test::make_data(lay.numel(), comm.rank() * 10 + s);
      auto g2 = g, g3 = g, g4 = g;
      a.step(g);
      b.step(g2);
      c.step(g3);
      d.step(g4);
      for (const auto* v : {&g, &g2, &g3, &g4})
        for (float x : *v) REQUIRE(std::isfinite(x));
    }
  });
}
