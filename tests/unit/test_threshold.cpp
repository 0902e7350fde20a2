// Threshold selection (approximate top-k): the k it achieves, what it sends, error feedback.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "gravac_test_util.hpp"

using namespace gravac;

namespace {

bool bit_equal(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Gradient-like data: heavy tails (Student-t, 2 degrees of freedom), rows whose scales
// differ by orders of magnitude (lognormal), and a share of exact zeros (dead units).
std::vector<float> gradient_like(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::student_t_distribution<float> t(2.0f);
  std::lognormal_distribution<float> scale(0.0f, 1.5f);
  std::bernoulli_distribution dead(0.1);
  std::vector<float> v(n);
  float s = 1;
  bool row_dead = false;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 256 == 0) {
      s = 1e-3f * scale(rng);
      row_dead = dead(rng);
    }
    v[i] = row_dead ? 0.0f : s * t(rng);
  }
  return v;
}

std::vector<float> data_for(int kind, std::size_t n, std::uint64_t seed) {
  if (kind == 0) return test::make_data(n, seed, test::distribution::gaussian);
  if (kind == 1) return test::make_data(n, seed, test::distribution::laplace);
  return gradient_like(n, seed);
}

struct result {
  std::vector<float> dense, residual;
  compress_stats st;
};

result run(threshold& c, const layout& lay, std::vector<float> g, std::vector<float> e, const step_params& p) {
  std::vector<std::byte> packet(c.max_packet_bytes());
  result r;
  const auto bytes = c.compress(host_view(g), host_view(e), p, packet, r.st);
  const std::span<const std::byte> pk(packet.data(), bytes);
  REQUIRE(c.validate(pk));
  r.dense.assign(lay.numel(), 0.0f);
  c.decompress_add(pk, host_view(r.dense), 1.0f);
  r.residual = std::move(e);
  return r;
}

// How a compress of u = g + e split u: requires every sent value to be u bit for bit with
// a zero residual, and every unsent one to stay in the residual bit for bit; returns the
// count sent and the magnitudes on either side.
struct sent_split {
  std::size_t sent = 0;
  float min_sent = std::numeric_limits<float>::infinity(), max_unsent = 0;
};

sent_split split_sent(const std::vector<float>& g, const std::vector<float>& e, const result& r) {
  sent_split s;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float u = g[i] + e[i];
    if (r.dense[i] != 0.0f) {
      REQUIRE(bit_equal(r.dense[i], u));
      REQUIRE(r.residual[i] == 0.0f);
      s.min_sent = std::min(s.min_sent, std::fabs(u));
      ++s.sent;
    } else {
      REQUIRE(bit_equal(r.residual[i], u));
      s.max_unsent = std::max(s.max_unsent, std::fabs(u));
    }
  }
  return s;
}

}  // namespace

TEST_CASE("threshold achieves k within 10% on Gaussian, Laplace and gradient-like data", "[threshold]") {
  for (int kind = 0; kind < 3; ++kind) {
    for (std::size_t n : {std::size_t{1} << 16, std::size_t{1} << 20, (std::size_t{1} << 20) + 12345}) {
      for (double f : {0.1, 0.01, 0.001}) {
        for (std::uint64_t step = 0; step < 3; ++step) {
          const auto lay = layout::flat(n);
          threshold c(lay);
          const auto g = data_for(kind, n, 1000 * kind + step);
          std::vector<float> e(n, 0.0f);
          auto r = run(c, lay, g, e, test::params_for(lay, f, step));
          const double k = static_cast<double>(kept_count(n, f));
          const double k_hat = static_cast<double>(r.st.layers[0].kept);
          INFO("data " << kind << " n " << n << " f " << f << " step " << step << " k " << k << " k_hat " << k_hat);
          CHECK(std::fabs(k_hat - k) / k <= 0.10);
        }
      }
    }
  }
}

TEST_CASE("threshold sends exactly the values at or above a threshold, in index order", "[threshold]") {
  const std::size_t n = 200000;
  const auto lay = layout::flat(n);
  threshold c(lay);
  const auto g = test::make_data(n, 5, test::distribution::laplace);
  auto e = test::make_data(n, 6);
  for (auto& x : e) x *= 0.3f;
  auto r = run(c, lay, g, e, test::params_for(lay, 0.01));
  // Every sent magnitude is >= every unsent one, and sent values are u bit for bit.
  const auto s = split_sent(g, e, r);
  CHECK(s.sent == r.st.layers[0].kept);
  CHECK(s.max_unsent < s.min_sent);
}

TEST_CASE("threshold from a sample sends exactly the values above its final threshold, step after step",
          "[threshold][sampled]") {
  // Large enough that the estimate comes from a sample: the pass zeroes from the central
  // estimate, above its collect key, and keep_selected mends both sides.
  const std::size_t n = (std::size_t{1} << 20) + 777;
  const auto lay = layout::flat(n);
  for (int kind = 0; kind < 3; ++kind) {
    threshold c(lay);
    std::vector<float> e(n, 0.0f);
    for (std::uint64_t step = 0; step < 3; ++step) {
      const auto g = data_for(kind, n, 77 + step);
      auto r = run(c, lay, g, e, test::params_for(lay, 0.01, step));
      INFO("data " << kind << " step " << step);
      const auto s = split_sent(g, e, r);
      CHECK(s.sent == r.st.layers[0].kept);
      CHECK(s.max_unsent <= s.min_sent);
      e = r.residual;
    }
  }
}

TEST_CASE("a pass zeroing from a key above its collect key leaves a residual that keep_selected and zero_below mend",
          "[threshold][fused]") {
  const std::size_t n = 100003;
  const auto g = test::make_data(n, 41, test::distribution::laplace);
  auto e0 = test::make_data(n, 42);
  for (auto& x : e0) x *= 0.3f;
  std::vector<float> u(n);
  std::vector<std::uint32_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) {
    u[i] = g[i] + e0[i];
    keys[i] = magnitude_key(u[i]);
  }
  auto sorted = keys;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const std::uint32_t collect = sorted[3000], zero_from = sorted[2000];
  REQUIRE(collect < zero_from);
  auto expect_residual = [&](const std::vector<float>& e, auto sent) {
    for (std::size_t i = 0; i < n; ++i) {
      INFO("i " << i << " key " << keys[i]);
      if (sent(keys[i]))
        REQUIRE(e[i] == 0.0f);
      else
        REQUIRE(bit_equal(e[i], u[i]));
    }
  };
  detail::fused_topk_workspace ws(n, 1);
  // The final threshold below the zeroing key (candidates left in e are sent: zeroed) and
  // above it (zeroed candidates not sent: written back).
  for (const std::uint32_t t : {sorted[2500], sorted[1500]}) {
    auto e = e0;
    const auto r = ws.fuse(g, e, 0, collect, {}, zero_from);
    expect_residual(e, [&](std::uint32_t k) { return k >= zero_from; });
    std::uint64_t ties = r.collected;
    const std::size_t kept = ws.keep_selected({0, r.collected}, t, ties, e, zero_from);
    CHECK(kept == static_cast<std::size_t>(std::count_if(keys.begin(), keys.end(), [&](auto k) { return k >= t; })));
    expect_residual(e, [&](std::uint32_t k) { return k >= t; });
  }
  // Every candidate sent.
  auto e = e0;
  const auto r = ws.fuse(g, e, 0, collect, {}, zero_from);
  ws.zero_below({0, r.collected}, zero_from, e);
  expect_residual(e, [&](std::uint32_t k) { return k >= collect; });
}

TEST_CASE("threshold keeps ties: all-equal data sends everything", "[threshold]") {
  const std::size_t n = 5000;
  const auto lay = layout::flat(n);
  threshold c(lay);
  const auto g = test::make_data(n, 1, test::distribution::all_equal);
  auto r = run(c, lay, g, std::vector<float>(n, 0.0f), test::params_for(lay, 0.01));
  CHECK(r.st.layers[0].kept == n);
}

TEST_CASE("threshold error feedback invariant holds bit for bit", "[threshold][ef]") {
  const auto lay = test::mixed_layout();
  for (double f : {0.0, 0.01, 0.1, 0.5, 1.0}) {
    threshold c(lay);
    std::vector<float> e(lay.numel(), 0.0f);
    for (std::uint64_t s = 0; s < 3; ++s) {
      const auto g = test::make_data(lay.numel(), 30 + s, test::distribution::laplace);
      std::vector<float> u(lay.numel());
      for (std::size_t i = 0; i < u.size(); ++i) u[i] = g[i] + e[i];
      auto r = run(c, lay, g, e, test::params_for(lay, f, s));
      for (std::size_t i = 0; i < u.size(); ++i) REQUIRE(bit_equal(r.dense[i] + r.residual[i], u[i]));
      e = r.residual;
    }
  }
}

TEST_CASE("threshold reports NaN and infinity and never sends them", "[threshold][non_finite]") {
  const std::size_t n = 100000;
  const auto lay = layout::flat(n);
  threshold c(lay);
  auto g = test::make_data(n, 8);
  for (std::size_t i = 0; i < n; i += 997)
    g[i] = (i % 2) ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  auto r = run(c, lay, g, std::vector<float>(n, 0.0f), test::params_for(lay, 0.01));
  CHECK(r.st.non_finite);
  for (std::size_t i = 0; i < n; i += 997) {
    CHECK(r.dense[i] == 0.0f);
    CHECK_FALSE(std::isfinite(r.residual[i]));
  }
  CHECK(r.st.layers[0].kept > 0);
}

TEST_CASE("threshold packets are summable by index and validate", "[threshold]") {
  STATIC_REQUIRE(threshold::summable_by_index);
  STATIC_REQUIRE(SummableCompressor<threshold>);
  const auto lay = test::mixed_layout();
  threshold c(lay);
  const auto g = test::make_data(lay.numel(), 4);
  std::vector<float> e(lay.numel(), 0.0f);
  std::vector<std::byte> packet(c.max_packet_bytes());
  compress_stats st;
  std::vector<float> gg = g;
  const auto bytes = c.compress(host_view(gg), host_view(e), test::params_for(lay, 0.1), packet, st);
  CHECK(c.validate(std::span<const std::byte>(packet.data(), bytes)));
  // A corrupted index is rejected before any memory is touched.
  std::vector<std::byte> bad(packet.begin(), packet.begin() + static_cast<std::ptrdiff_t>(bytes));
  const std::size_t first_index = sizeof(packet_header) + sizeof(segment_header);
  const std::uint32_t huge = 0xfffffff0u;
  std::memcpy(bad.data() + first_index, &huge, sizeof huge);
  CHECK_FALSE(c.validate(bad));
}

TEST_CASE("threshold rejects invalid options at construction", "[threshold][options]") {
  const auto lay = layout::flat(10);
  CHECK_THROWS_AS(threshold(lay, {.expected_hits = 0}), gravac::error);
  CHECK_THROWS_AS(threshold(lay, {.run_length = 0}), gravac::error);
  CHECK_THROWS_AS(threshold(lay, {.full_histogram_above = 0.0}), gravac::error);
}
