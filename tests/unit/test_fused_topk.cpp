// The fused error-feedback top-k against the sort-based reference selection
// (test::select_topk_reference): identical indices and values, bit for bit.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "gravac/core/detail/square_sum.hpp"
#include "gravac_test_util.hpp"
#include "topk_reference.hpp"

using namespace gravac;

namespace {

bool bit_equal(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool bit_equal_d(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

struct decoded {
  std::vector<float> dense;     // decompress(packet)
  std::vector<float> residual;  // e after compress
  compress_stats st;
};

decoded run(topk& c, const layout& lay, const std::vector<float>& g, std::vector<float> e, const step_params& p) {
  std::vector<std::byte> packet(c.max_packet_bytes());
  std::vector<float> gg = g;
  decoded d;
  const auto bytes = c.compress(host_view(gg), host_view(e), p, packet, d.st);
  const std::span<const std::byte> pk(packet.data(), bytes);
  REQUIRE(c.validate(pk));
  d.dense.assign(lay.numel(), 0.0f);
  c.decompress_add(pk, host_view(d.dense), 1.0f);
  d.residual = std::move(e);
  return d;
}

// The expected (dense, residual) from the reference selection over u restricted to \p sel_layers.
void expect_reference(const std::vector<float>& u, std::size_t first, std::size_t n, std::size_t k, const decoded& d) {
  std::vector<std::uint64_t> order, selected;
  test::select_topk_reference(std::span<const float>(u.data() + first, n), k, order, selected);
  std::vector<char> is_sel(n, 0);
  for (auto ix : selected) is_sel[ix] = 1;
  for (std::size_t i = 0; i < n; ++i) {
    const float want_dense = is_sel[i] ? u[first + i] : 0.0f;
    const float want_e = is_sel[i] ? 0.0f : u[first + i];
    if (!bit_equal(d.dense[first + i], want_dense) || !bit_equal(d.residual[first + i], want_e)) {
      INFO("element " << first + i << " selected by reference " << int(is_sel[i]));
      REQUIRE(bit_equal(d.dense[first + i], want_dense));
      REQUIRE(bit_equal(d.residual[first + i], want_e));
    }
  }
}

}  // namespace

TEST_CASE("fused top-k equals the reference selection bit for bit", "[topk][fused]") {
  const std::size_t sizes[] = {1, 2, 3, 7, 8, 9, 17, 31, 511, 512, 513, 1023, 4099, 65537};
  const double fractions[] = {0.0, 1e-4, 0.001, 0.01, 0.1, 0.37, 0.5, 0.999, 1.0};
  for (int kind = 0; kind < 5; ++kind) {
    for (std::size_t n : sizes) {
      for (double f : fractions) {
        INFO("data " << kind << " n " << n << " f " << f);
        const auto lay = layout::flat(n);
        topk c(lay);
        const auto g = test::data_of_kind(kind, n, 100 + n);
        auto e = test::data_of_kind(kind == 2 ? 2 : 0, n, 200 + n);
        for (auto& x : e) x *= 0.25f;
        std::vector<float> u(n);
        for (std::size_t i = 0; i < n; ++i) u[i] = g[i] + e[i];
        auto d = run(c, lay, g, e, test::params_for(lay, f));
        const std::size_t k = f >= 1.0 ? n : kept_count(n, f);
        expect_reference(u, 0, n, k, d);
        CHECK(d.st.layers[0].kept == k);
        CHECK_FALSE(d.st.non_finite);
      }
    }
  }
}

TEST_CASE("fused top-k stays exact over steps as the guess moves (hits and misses)", "[topk][fused]") {
  const std::size_t n = 20000;
  const auto lay = layout::flat(n);
  for (bool whole : {false, true}) {
    topk c(lay, {.whole_buffer = whole});
    std::vector<float> e(n, 0.0f);
    // Fractions and scales change between steps so the previous threshold is sometimes
    // far too high (a miss) and sometimes far too low (a long candidate list).
    const double fractions[] = {0.01, 0.01, 0.2, 0.001, 0.05, 0.05, 0.5, 0.01};
    const float scales[] = {1.0f, 1.0f, 10.0f, 0.01f, 1.0f, 100.0f, 1.0f, 1e-3f};
    for (int s = 0; s < 8; ++s) {
      INFO("whole " << whole << " step " << s);
      auto g = test::make_data(n, 500 + s, s % 2 ? test::distribution::laplace : test::distribution::gaussian);
      for (auto& x : g) x *= scales[s];
      std::vector<float> u(n);
      for (std::size_t i = 0; i < n; ++i) u[i] = g[i] + e[i];
      auto d = run(c, lay, g, e, test::params_for(lay, fractions[s], s));
      expect_reference(u, 0, n, kept_count(n, fractions[s]), d);
      e = d.residual;
    }
  }
}

TEST_CASE("fused whole-buffer top-k equals the reference over the compressed layers", "[topk][fused][whole]") {
  layout lay;
  lay.add("a", {3, 5, 7}, layer_kind::conv);
  lay.add("bias", {17}, layer_kind::bias_or_norm);
  lay.add("empty", {0}, layer_kind::dense);
  lay.add("b", {1023}, layer_kind::dense);
  lay.add("c", {65537}, layer_kind::dense);
  for (int kind = 0; kind < 5; ++kind) {
    for (double f : {0.0, 0.001, 0.01, 0.3, 0.9, 1.0}) {
      INFO("data " << kind << " f " << f);
      topk c(lay, {.whole_buffer = true});
      auto g = test::data_of_kind(kind, lay.numel(), 7 + kind);
      // Layer "b" larger in magnitude so the global selection is lopsided.
      for (std::size_t i = 0; i < 1023; ++i) g[lay[3].offset + i] *= 3.0f;
      std::vector<float> e(lay.numel(), 0.0f);
      auto p = test::params_for(lay, f);
      p.kept_fraction[1] = 1.0;  // the bias goes dense: out of the global selection
      p.global_fraction = f;
      auto d = run(c, lay, g, e, p);
      // Reference over the concatenation of the compressed layers (a, b, c).
      std::vector<float> cat;
      std::vector<std::size_t> where;
      for (std::size_t li : {0u, 3u, 4u})
        for (std::size_t j = 0; j < lay[li].numel; ++j) {
          cat.push_back(g[lay[li].offset + j]);
          where.push_back(lay[li].offset + j);
        }
      std::vector<std::uint64_t> order, selected;
      test::select_topk_reference(cat, kept_count(cat.size(), f), order, selected);
      std::vector<char> is_sel(lay.numel(), 0);
      for (auto ix : selected) is_sel[where[ix]] = 1;
      for (std::size_t i = lay[1].offset; i < lay[1].offset + 17; ++i) is_sel[i] = 1;  // dense layer
      std::size_t mismatches = 0;
      for (std::size_t i = 0; i < lay.numel(); ++i) {
        const float want = is_sel[i] ? g[i] : 0.0f;
        const float want_e = is_sel[i] ? 0.0f : g[i];
        if (!bit_equal(d.dense[i], want) || !bit_equal(d.residual[i], want_e)) ++mismatches;
      }
      CHECK(mismatches == 0);
      std::size_t kept = 0;
      for (std::size_t li : {0u, 3u, 4u}) kept += d.st.layers[li].kept;
      CHECK(kept == kept_count(cat.size(), f));
    }
  }
}

TEST_CASE("fused top-k per layer on a mixed layout equals the reference in every layer", "[topk][fused]") {
  const auto lay = test::mixed_layout();
  for (double f : {0.01, 0.1, 0.5}) {
    topk c(lay);
    const auto g = test::make_data(lay.numel(), 9, test::distribution::laplace);
    auto e = test::make_data(lay.numel(), 10);
    for (auto& x : e) x *= 0.1f;
    std::vector<float> u(lay.numel());
    for (std::size_t i = 0; i < u.size(); ++i) u[i] = g[i] + e[i];
    auto d = run(c, lay, g, e, test::params_for(lay, f));
    for (std::size_t li = 0; li < lay.size(); ++li) {
      INFO("f " << f << " layer " << lay[li].name);
      expect_reference(u, lay[li].offset, lay[li].numel, kept_count(lay[li].numel, f), d);
    }
  }
}

TEST_CASE("error feedback invariant of the fused top-k holds bit for bit", "[topk][fused][ef]") {
  const auto lay = test::mixed_layout();
  for (bool whole : {false, true}) {
    for (unsigned threads : {1u, 3u}) {
      topk c(lay, {.whole_buffer = whole, .threads = threads});
      std::vector<float> e(lay.numel(), 0.0f);
      for (int s = 0; s < 4; ++s) {
        const auto g = test::make_data(lay.numel(), 40 + s, test::distribution::laplace);
        std::vector<float> u(lay.numel());
        for (std::size_t i = 0; i < u.size(); ++i) u[i] = g[i] + e[i];
        auto d = run(c, lay, g, e, test::params_for(lay, 0.05, s));
        for (std::size_t i = 0; i < u.size(); ++i) REQUIRE(bit_equal(d.dense[i] + d.residual[i], u[i]));
        e = d.residual;
      }
    }
  }
}

TEST_CASE("threads inside a rank give the same selection as one thread", "[topk][fused][threads]") {
  const std::size_t n = (std::size_t{1} << 20) + 37;  // large enough that the threaded pass runs
  const auto lay = layout::flat(n);
  const auto g = test::make_data(n, 77, test::distribution::laplace);
  for (double f : {0.001, 0.1}) {
    topk one(lay), three(lay, {.threads = 3}), four(lay, {.threads = 4});
    std::vector<float> e1(n, 0.0f), e3(n, 0.0f), e4(n, 0.0f);
    for (int s = 0; s < 2; ++s) {  // the second step uses the guess (the collecting pass)
      auto d1 = run(one, lay, g, e1, test::params_for(lay, f, s));
      for (auto* other : {&three, &four}) {
        auto& eo = other == &three ? e3 : e4;
        auto d = run(*other, lay, g, eo, test::params_for(lay, f, s));
        CHECK(std::memcmp(d1.dense.data(), d.dense.data(), n * sizeof(float)) == 0);
        CHECK(std::memcmp(d1.residual.data(), d.residual.data(), n * sizeof(float)) == 0);
        // The norms are one tree over the blocks, whatever the threads (square_sum.hpp).
        CHECK(std::memcmp(&d1.st.layers[0], &d.st.layers[0], sizeof(layer_stats)) == 0);
        eo = d.residual;
      }
      e1 = d1.residual;
    }
  }
}

TEST_CASE("NaN and infinity are reported and never selected", "[topk][fused][non_finite]") {
  const std::size_t n = 1000;
  const auto lay = layout::flat(n);
  for (bool whole : {false, true}) {
    for (int step = 0; step < 2; ++step) {
      topk c(lay, {.whole_buffer = whole});
      auto g = test::make_data(n, 3);
      std::vector<float> e(n, 0.0f);
      if (step == 1) {  // a first clean step sets the guess, so the second takes the collecting path
        auto d0 = run(c, lay, g, e, test::params_for(lay, 0.01));
        CHECK_FALSE(d0.st.non_finite);
      }
      g[10] = std::numeric_limits<float>::quiet_NaN();
      g[20] = std::numeric_limits<float>::infinity();
      e[30] = -std::numeric_limits<float>::infinity();
      auto d = run(c, lay, g, e, test::params_for(lay, 0.01, 1));
      CHECK(d.st.non_finite);
      CHECK(d.dense[10] == 0.0f);
      CHECK(d.dense[20] == 0.0f);
      CHECK(d.dense[30] == 0.0f);
      CHECK(std::isnan(d.residual[10]));  // left in the residual, not silently sent
      CHECK(std::isinf(d.residual[20]));
      // The k values sent are the top-k of the finite values.
      std::vector<float> finite = g;
      for (std::size_t i = 0; i < n; ++i) finite[i] += e[i];
      finite[10] = finite[20] = finite[30] = 0.0f;
      std::vector<std::uint64_t> order, selected;
      test::select_topk_reference(finite, kept_count(n, 0.01), order, selected);
      for (auto ix : selected) CHECK(bit_equal(d.dense[ix], finite[ix]));
      CHECK(d.st.layers[0].kept == kept_count(n, 0.01));
    }
  }
  SECTION("all values non-finite: nothing is sent") {
    topk c(lay);
    std::vector<float> g(n, std::numeric_limits<float>::infinity()), e(n, 0.0f);
    auto d = run(c, lay, g, e, test::params_for(lay, 0.1));
    CHECK(d.st.non_finite);
    CHECK(d.st.layers[0].kept == 0);
  }
}

TEST_CASE("fused top-k statistics match the reference sums", "[topk][fused][stats]") {
  const auto lay = test::mixed_layout();
  topk c(lay);
  const auto g = test::make_data(lay.numel(), 21);
  auto e = test::make_data(lay.numel(), 22);
  auto d = run(c, lay, g, e, test::params_for(lay, 0.1));
  for (std::size_t li = 0; li < lay.size(); ++li) {
    std::vector<float> gl, ul, kept;  // kept: the values sent, in index order (the packet's)
    for (std::size_t j = 0; j < lay[li].numel; ++j) {
      const std::size_t i = lay[li].offset + j;
      gl.push_back(g[i]);
      ul.push_back(g[i] + e[i]);
      if (d.dense[i] != 0.0f) kept.push_back(d.dense[i]);
    }
    REQUIRE(kept.size() == d.st.layers[li].kept);  // the data has no zeros
    // Equal bits to the one summation order (core/detail/square_sum.hpp)...
    CHECK(bit_equal_d(d.st.layers[li].grad_sq, detail::square_sum(gl)));
    CHECK(bit_equal_d(d.st.layers[li].input_sq, detail::square_sum(ul)));
    CHECK(bit_equal_d(d.st.layers[li].kept_sq, detail::square_sum(kept)));
    // ... which is close to the plain sums (float lanes within blocks).
    double gsq = 0, usq = 0, ksq = 0;
    for (float x : gl) gsq += double(x) * x;
    for (float x : ul) usq += double(x) * x;
    for (float x : kept) ksq += double(x) * x;
    CHECK(d.st.layers[li].grad_sq == Approx(gsq).epsilon(1e-6));
    CHECK(d.st.layers[li].input_sq == Approx(usq).epsilon(1e-6));
    CHECK(d.st.layers[li].kept_sq == Approx(ksq).epsilon(1e-6));
  }
}

TEST_CASE("topk rejects invalid options at construction", "[topk][options]") {
  const auto lay = layout::flat(10);
  CHECK_THROWS_AS(topk(lay, {.threads = 0}), gravac::error);
  CHECK_THROWS_AS(topk(lay, {.guess_margin = 0.0f}), gravac::error);
  CHECK_THROWS_AS(topk(lay, {.guess_margin = 1.5f}), gravac::error);
}
