// The magnitude histogram and the gain curve read from it, against brute force.
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

std::vector<float> data_for(int kind, std::size_t n, std::uint64_t seed) {
  if (kind < 4) return test::make_data(n, seed, static_cast<test::distribution>(kind));
  std::mt19937_64 rng(seed);  // heavy tails
  std::student_t_distribution<float> t(1.5f);
  std::vector<float> v(n);
  for (auto& x : v) x = t(rng);
  return v;
}

magnitude_histogram histogram_of(const std::vector<float>& v) {
  magnitude_histogram h;
  const std::vector<float> zero(v.size(), 0.0f);
  add_sum_to_histogram(v, zero, h);
  return h;
}

// Brute force: energy of the k largest |v|.
double top_energy(std::vector<float> v, std::size_t k) {
  std::vector<double> sq(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) sq[i] = double(v[i]) * v[i];
  std::sort(sq.begin(), sq.end(), std::greater<>());
  double s = 0;
  for (std::size_t i = 0; i < k; ++i) s += sq[i];
  return s;
}

const std::vector<double> candidates{0.5, 0.1, 0.033, 0.011, 0.004, 0.001};

}  // namespace

TEST_CASE("histogram counts and energies match brute force", "[gain][histogram]") {
  const auto v = data_for(1, 10007, 3);
  auto h = histogram_of(v);
  std::uint64_t total = 0;
  double energy = 0;
  for (std::uint32_t b = h.low_bin(); b <= h.high_bin(); ++b) {
    total += h.count(b);
    energy += h.sumsq(b);
  }
  double brute = 0;
  for (float x : v) brute += double(x) * x;
  CHECK(total == v.size());
  CHECK(h.finite_count() == v.size());
  CHECK(energy == Approx(brute).epsilon(1e-9));  // fixed point: each square loses under 2^-30 of itself
  // Every value lies in its bin's range.
  for (float x : v) {
    const auto b = magnitude_histogram::bin_of(magnitude_key(x));
    CHECK(std::fabs(x) >= key_magnitude(magnitude_histogram::lower_key(b)));
    CHECK(std::fabs(x) < key_magnitude(magnitude_histogram::lower_key(b + 1)));
  }
  h.clear();
  CHECK(h.empty());
  CHECK(h.finite_count() == 0);
}

TEST_CASE("find_boundary locates the k-th largest magnitude", "[gain][histogram]") {
  for (int kind : {0, 1, 3, 4}) {
    const auto v = data_for(kind, 4099, 10 + kind);
    const auto h = histogram_of(v);
    std::vector<float> mags(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) mags[i] = std::fabs(v[i]);
    std::sort(mags.begin(), mags.end(), std::greater<>());
    for (std::size_t k : {1u, 2u, 41u, 410u, 2049u, 4099u}) {
      INFO("kind " << kind << " k " << k);
      const auto hb = find_boundary(h, k);
      CHECK(magnitude_histogram::bin_of(magnitude_key(mags[k - 1])) == hb.bin);
      CHECK(hb.above + hb.need == k);
      CHECK(hb.need >= 1);
      CHECK(hb.need <= h.count(hb.bin));
    }
  }
}

TEST_CASE("the histogram gain curve is exact at bin edges", "[gain][histogram]") {
  // Distinct powers of two: one value per bin, so every k falls on a bin edge.
  std::vector<float> v;
  for (int e = -60; e < 60; ++e) v.push_back((e % 3 ? -1.0f : 1.0f) * std::ldexp(1.0f, e));
  std::shuffle(v.begin(), v.end(), std::mt19937_64(5));
  const auto h = histogram_of(v);
  std::vector<double> got(candidates.size(), 0.0);
  add_gain_curve(h, v.size(), candidates, got);
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    INFO("candidate " << candidates[c]);
    CHECK(got[c] == Approx(top_energy(v, kept_count(v.size(), candidates[c]))).epsilon(1e-9));
  }
}

TEST_CASE("the histogram gain curve is within the boundary bin's width of brute force", "[gain][histogram]") {
  for (int kind = 0; kind < 5; ++kind) {
    for (std::size_t n : {1u, 17u, 1000u, 65537u}) {
      const auto v = data_for(kind, n, 100 + n);
      const auto h = histogram_of(v);
      std::vector<double> got(candidates.size(), 0.0);
      add_gain_curve(h, n, candidates, got);
      for (std::size_t c = 0; c < candidates.size(); ++c) {
        const std::size_t k = kept_count(n, candidates[c]);
        const double exact = top_energy(v, k);
        // Inside a gain bin (1/8 octave) squares differ by at most 2^(1/4) - 1 < 19%, and
        // only the boundary bin is modelled: the error is below 19% of that bin's energy.
        const auto hb = find_boundary(h, k);
        const std::uint32_t first = hb.bin & ~1u;  // the two histogram bins of its gain bin
        const double bin_energy = h.sumsq(first) + h.sumsq(first + 1);
        INFO("kind " << kind << " n " << n << " k " << k);
        CHECK(std::fabs(got[c] - exact) <= 0.19 * bin_energy + 1e-9 * exact);
      }
    }
  }
}

TEST_CASE("partial_bin_energy is exact at the ends and grows with m", "[gain][histogram]") {
  const std::uint32_t b = magnitude_key(1.3f) >> gain_bin_shift;
  CHECK(partial_bin_energy(b, 0, 10, 17.0) == 0.0);
  CHECK(partial_bin_energy(b, 10, 10, 17.0) == 17.0);
  double prev = 0;
  for (std::uint64_t m = 1; m <= 10; ++m) {
    const double e = partial_bin_energy(b, m, 10, 17.0);
    CHECK(e > prev);
    // the top m of 10 hold at least m/10 of the energy (they are the largest)
    CHECK(e >= 17.0 * double(m) / 10.0 - 1e-12);
    prev = e;
  }
}

TEST_CASE("compressors report the histogram gain curve of u = g + e", "[gain][compress]") {
  const auto lay = test::mixed_layout();
  const auto g = test::make_data(lay.numel(), 61, test::distribution::laplace);
  auto e0 = test::make_data(lay.numel(), 62);
  for (auto& x : e0) x *= 0.2f;
  // Expected: per layer, the curve of that layer's u.
  std::vector<double> want(candidates.size(), 0.0);
  for (const auto& l : lay.layers()) {
    std::vector<float> u(l.numel);
    for (std::size_t j = 0; j < l.numel; ++j) u[j] = g[l.offset + j] + e0[l.offset + j];
    add_gain_curve(histogram_of(u), l.numel, candidates, want);
  }
  auto check = [&](auto c, bool whole_dense_bias) {
    auto p = test::params_for(lay, 0.05);
    if (whole_dense_bias) p.kept_fraction[1] = 1.0;  // a dense layer goes through the skeleton
    p.gain_candidates = candidates;
    std::vector<float> gg = g, e = e0;
    std::vector<std::byte> packet(c.max_packet_bytes());
    compress_stats st;
    c.compress(host_view(gg), host_view(e), p, packet, st);
    REQUIRE(st.candidate_kept_sq.size() == candidates.size());
    for (std::size_t i = 0; i < candidates.size(); ++i)
      CHECK(st.candidate_kept_sq[i] == Approx(want[i]).epsilon(1e-12));
  };
  check(topk(lay), false);
  check(topk(lay), true);
  check(topk(lay, {.whole_buffer = true}), true);
  check(threshold(lay), true);
  check(randomk(lay), true);
  check(identity(lay), false);
}

TEST_CASE("a large layer's curve is the sample below the sending threshold's bin and exact above", "[gain][sampled]") {
  // The estimator the device computes too, built here from u itself: the blocks of 256
  // whose index is step modulo the stride, weight stride, for the bins up to the k-th
  // largest key's; every value above. One layer: its own selection and the whole buffer's
  // are the same.
  const std::size_t n = (std::size_t{1} << 20) + 300;
  const std::uint32_t stride = detail::gain_sample_stride(n);
  REQUIRE(stride == 4);
  const auto lay = layout::flat(n);
  const std::vector<double> fractions{0.2, 0.05, 0.01, 0.002};
  const auto g = data_for(1, n, 7);
  std::vector<std::uint32_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = magnitude_key(g[i]);
  std::vector<std::uint32_t> sorted = keys;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  for (bool whole : {false, true}) {
    topk c(lay, {.whole_buffer = whole});
    std::vector<std::byte> packet(c.max_packet_bytes());
    for (std::uint64_t step : {0, 1, 2, 3, 6}) {
      const double kept = step % 2 ? 0.01 : 0.003;
      const std::uint32_t exact_from = detail::exact_gain_from(sorted[kept_count(n, kept) - 1]);
      magnitude_histogram want;
      for (std::size_t i = 0; i < n; ++i) {
        if ((keys[i] >> gain_bin_shift) >= exact_from)
          want.add(keys[i]);
        else if ((i / detail::fused_block) % stride == step % stride)
          for (std::uint32_t w = 0; w < stride; ++w) want.add(keys[i]);
      }
      std::vector<double> want_sq(fractions.size(), 0.0);
      add_gain_curve(want, n, fractions, want_sq);
      auto p = test::params_for(lay, kept, step);
      p.gain_candidates = fractions;
      std::vector<float> gg = g, e(n, 0.0f);
      compress_stats st;
      c.compress(host_view(gg), host_view(e), p, packet, st);
      for (std::size_t i = 0; i < fractions.size(); ++i) {
        INFO("whole buffer " << whole << " step " << step << " fraction " << fractions[i]);
        CHECK(std::memcmp(&st.candidate_kept_sq[i], &want_sq[i], sizeof(double)) == 0);
      }
    }
  }
}

TEST_CASE("large layers estimate the gain curve from the candidates and a sample, close to brute force",
          "[gain][sampled]") {
  // 2^21 + 5 elements: above 2^19, so the fused pass histograms one block in 8 (weight 8);
  // the bins above the sending threshold's come exactly from the candidates.
  const std::size_t n = (std::size_t{1} << 21) + 5;
  REQUIRE(detail::gain_sample_stride(n) == 8);
  REQUIRE(detail::gain_sample_stride(std::size_t{1} << 19) == 1);
  const auto lay = layout::flat(n);
  const std::vector<double> fractions{0.1, 0.033, 0.011, 0.004, 0.001};
  for (int kind : {0, 1, 4}) {
    const auto g = data_for(kind, n, 91 + kind);
    std::vector<double> exact(fractions.size());
    for (std::size_t c = 0; c < fractions.size(); ++c) exact[c] = top_energy(g, kept_count(n, fractions[c]));
    for (int which = 0; which < 3; ++which) {
      auto check = [&](auto c) {
        std::vector<std::byte> packet(c.max_packet_bytes());
        for (std::uint64_t step : {0, 1, 2, 5}) {  // step 0 has no guess yet (a miss); the blocks rotate
          auto p = test::params_for(lay, 0.01, step);
          p.gain_candidates = fractions;
          std::vector<float> gg = g, e(n, 0.0f);  // u = g at every step
          compress_stats st;
          c.compress(host_view(gg), host_view(e), p, packet, st);
          for (std::size_t i = 0; i < fractions.size(); ++i) {
            INFO("data " << kind << " compressor " << which << " step " << step << " fraction " << fractions[i]);
            // Above the threshold's bin exact; below it, 2^18 sampled values (heavy tails
            // spread more).
            const double tol = kind == 4 ? 0.1 : 0.02;
            CHECK(std::fabs(st.candidate_kept_sq[i] - exact[i]) <= tol * exact[i]);
            // Fractions below the kept one lie above its bin: exact up to the bin model.
            if (step > 0 && fractions[i] <= 0.004) CHECK(st.candidate_kept_sq[i] == Approx(exact[i]).epsilon(0.002));
          }
        }
      };
      if (which == 0) check(topk(lay));
      if (which == 1) check(topk(lay, {.whole_buffer = true, .threads = 2}));
      if (which == 2) check(threshold(lay));
    }
  }
}
