#pragma once
// Helpers shared by gravac's tests: layouts with awkward shapes, gradient generators,
// and the serial reference of a data-parallel step.

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "gravac/gravac.hpp"

namespace gravac::test {

//! The rank count of the thread-rank tests that need no particular one. Shared rather than
//! defined in each file, so that unity batches of test files do not define it twice.
inline constexpr int ranks = 4;

// A layout with a conv, a dense, a bias, an empty layer and an odd-sized tail.
inline layout mixed_layout() {
  layout l;
  l.add("conv1.weight", {8, 3, 3, 3}, layer_kind::conv);
  l.add("conv1.bias", {8}, layer_kind::bias_or_norm);
  l.add("fc1.weight", {33, 17}, layer_kind::dense);
  l.add("empty", {0}, layer_kind::dense);
  l.add("fc2.weight", {10, 33}, layer_kind::dense);
  l.add("tail", {13}, layer_kind::bias_or_norm);
  return l;
}

enum class distribution { gaussian, laplace, all_equal, narrow };

// Deterministic test data: std::mt19937_64 is specified exactly; only the distributions
// are implementation-defined, which is fine within one build.
inline std::vector<float> make_data(std::size_t n, std::uint64_t seed, distribution d = distribution::gaussian) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::exponential_distribution<float> expo(1.0f);
  std::uniform_real_distribution<float> unif(1.0f, 1.00003f);
  std::bernoulli_distribution coin(0.5);
  for (auto& x : v) {
    switch (d) {
      case distribution::gaussian:
        x = normal(rng);
        break;
      case distribution::laplace:
        x = (coin(rng) ? 1.0f : -1.0f) * expo(rng);
        break;
      case distribution::all_equal:
        x = 0.5f;
        break;
      case distribution::narrow:
        x = (coin(rng) ? 1.0f : -1.0f) * unif(rng);
        break;
    }
  }
  return v;
}

// Parameters with every layer at fraction f.
inline step_params params_for(const layout& lay, double f, std::uint64_t step = 0, std::uint64_t seed = 7) {
  step_params p;
  p.kept_fraction.assign(lay.size(), f);
  p.global_fraction = f;
  p.step = step;
  p.seed = seed;
  return p;
}

// The serial reference of one step: rank r's packet is C(g_r + e_r); the result is
// sum_r (1/N) * decompress(packet_r), accumulated in rank order (as allgather does).
// Residuals are updated as each rank's would be. \p setup(c) runs on each rank's fresh
// compressor first (to give it its step settings).
struct no_setup {
  template <class C>
  void operator()(C&) const noexcept {}
};
template <class C, class Setup = no_setup>
std::vector<float> serial_reference(const layout& lay, const typename C::options& opt, const step_params& p,
                                    const std::vector<std::vector<float>>& grads,
                                    std::vector<std::vector<float>>& residuals, const Setup& setup = {}) {
  const auto n = grads.size();
  std::vector<float> out(lay.numel(), 0.0f);
  for (std::size_t r = 0; r < n; ++r) {
    C c(lay, opt);
    setup(c);
    std::vector<std::byte> packet(c.max_packet_bytes());
    std::vector<float> g = grads[r];
    compress_stats st;
    const auto bytes = c.compress(host_view(g), host_view(residuals[r]), p, packet, st);
    c.decompress_add(std::span<const std::byte>(packet.data(), bytes), host_view(out), 1.0f / static_cast<float>(n));
  }
  return out;
}

// Largest |a - b| relative to max(1, |b|).
inline double max_rel_diff(std::span<const float> a, std::span<const float> b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])) / std::max(1.0, std::fabs(double(b[i]))));
  return m;
}

// Heavy-tailed data: Student-t with 1.5 degrees of freedom, rows of 64 of varying scale.
inline std::vector<float> heavy_tailed(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::student_t_distribution<float> t(1.5f);
  std::lognormal_distribution<float> scale(0.0f, 1.0f);
  std::vector<float> v(n);
  float s = 1;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 64 == 0) s = scale(rng);
    v[i] = s * t(rng);
  }
  return v;
}

// Data of kind 0..3 (the distributions of make_data, in order) or 4 (heavy_tailed).
inline std::vector<float> data_of_kind(int kind, std::size_t n, std::uint64_t seed) {
  if (kind < 4) return make_data(n, seed, static_cast<distribution>(kind));
  return heavy_tailed(n, seed);
}

}  // namespace gravac::test
