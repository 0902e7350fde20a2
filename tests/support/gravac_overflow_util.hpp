#pragma once
// Helpers of the overflow tests (test_quantizer_overflow, test_powersgd_overflow): finite
// data whose squares, sums or norms pass the float maximum, and the checks of one step.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac_test_util.hpp"

namespace gravac::test::overflow {

// Kinds of finite data.
enum class data_kind {
  huge19,      // Gaussian * 1e19: squares pass the float maximum
  huge30,      // Gaussian * 1e30
  near_max,    // alternating signs, |x| in [2.7e38, FLT_MAX]: sums of |x| overflow too
  mixed_tiny,  // subnormal and tiny values with a few of 3e38, 1e20 and FLT_MAX among them
  all_max,     // every value FLT_MAX: a norm of sqrt(n) * FLT_MAX
  tiny,        // Gaussian * 1e-30: squares underflow
};

inline constexpr data_kind all_kinds[] = {data_kind::huge19,     data_kind::huge30,  data_kind::near_max,
                                          data_kind::mixed_tiny, data_kind::all_max, data_kind::tiny};

inline const char* kind_name(data_kind k) {
  switch (k) {
    case data_kind::huge19:
      return "1e19";
    case data_kind::huge30:
      return "1e30";
    case data_kind::near_max:
      return "near FLT_MAX";
    case data_kind::mixed_tiny:
      return "tiny mixed with huge";
    case data_kind::all_max:
      return "all FLT_MAX";
    default:
      return "1e-30";
  }
}

inline std::vector<float> make_huge(std::size_t n, data_kind kind, std::uint64_t seed) {
  auto v = make_data(n, seed);
  for (std::size_t i = 0; i < n; ++i) {
    float& x = v[i];
    switch (kind) {
      case data_kind::huge19:
        x *= 1e19f;
        break;
      case data_kind::huge30:
        x *= 1e30f;
        break;
      case data_kind::near_max:
        x = (i % 2 ? -FLT_MAX : FLT_MAX) * (0.8f + 0.2f * std::fabs(std::tanh(x)));
        break;
      case data_kind::mixed_tiny:
        x = i % 37 == 3 ? 3e38f : i % 41 == 5 ? -1e20f : i % 101 == 7 ? -FLT_MAX : x * (i % 2 ? 1e-42f : 1e-30f);
        break;
      case data_kind::all_max:
        x = FLT_MAX;
        break;
      case data_kind::tiny:
        x *= 1e-30f;
        break;
    }
  }
  return v;
}

// A gradient of the huge data again on top of residual \p e: 0.5 h - 0.5 e, so that
// u = e + g = (e + h) / 2 stays finite even when e and h are both near the float maximum.
inline std::vector<float> second_huge_step(const std::vector<float>& h, const std::vector<float>& e) {
  std::vector<float> g(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) g[i] = 0.5f * h[i] - 0.5f * e[i];
  return g;
}

// The rounding bound of e = u - d, then d + e: half an ulp of the larger magnitude, taken
// as one ulp (and at least the smallest subnormal).
inline double rounding_bound(float a, float b) {
  const float m = std::max(std::fabs(a), std::fabs(b));
  return m == 0 ? 0.0 : std::max(std::ldexp(1.0, std::ilogb(m) - 23), std::ldexp(1.0, -149));
}

// One step of \p c on gradient \p g with residual \p e (updated): u = g + e must be finite
// (the data are chosen so); then the packet validates, the residual and the decoded values
// are finite, decoded + e == u up to one rounding, every statistic is finite (grad and
// input norms equal to double references), non_finite is not set, and when \p must_send
// something was kept, in every non-zero layer of 64 elements or more.
template <class C>
void check_step(C& c, const layout& lay, std::vector<float> g, std::vector<float>& e, const step_params& p,
                bool must_send) {
  const std::size_t n = lay.numel();
  std::vector<float> u(n);
  for (std::size_t i = 0; i < n; ++i) {
    u[i] = g[i] + e[i];
    REQUIRE(std::isfinite(u[i]));
  }
  std::vector<std::byte> packet(c.max_packet_bytes());
  compress_stats st;
  packet.resize(c.compress(host_view(g), host_view(e), p, packet, st));
  const auto v = c.validate(packet);
  INFO("validation: " << v.reason);
  REQUIRE(v);
  std::vector<float> dec(n, 0.0f);
  c.decompress_add(packet, host_view(dec), 1.0f);
  std::size_t bad = 0, first_bad = n;
  for (std::size_t i = 0; i < n; ++i) {
    const bool ok = std::isfinite(e[i]) && std::isfinite(dec[i]) &&
                    std::fabs(static_cast<double>(dec[i]) + e[i] - u[i]) <= rounding_bound(u[i], dec[i]);
    if (!ok && bad++ == 0) first_bad = i;
  }
  INFO("element " << first_bad << ": u " << (first_bad < n ? u[first_bad] : 0.0f) << ", decoded "
                  << (first_bad < n ? dec[first_bad] : 0.0f) << ", e " << (first_bad < n ? e[first_bad] : 0.0f));
  CHECK(bad == 0);
  CHECK_FALSE(st.non_finite);
  double kept = 0;
  for (std::size_t l = 0; l < lay.size(); ++l) {
    const auto& L = lay[l];
    if (L.numel == 0) continue;
    double gsq = 0, usq = 0;
    for (std::size_t i = L.offset; i < L.offset + L.numel; ++i) {
      gsq += static_cast<double>(g[i]) * g[i];
      usq += static_cast<double>(u[i]) * u[i];
    }
    const auto& ls = st.layers[l];
    INFO("layer " << L.name);
    CHECK(std::isfinite(ls.grad_sq));
    CHECK(std::isfinite(ls.input_sq));
    CHECK(std::isfinite(ls.kept_sq));
    CHECK(ls.grad_sq == Approx(gsq).epsilon(1e-5).margin(1e-300));
    CHECK(ls.input_sq == Approx(usq).epsilon(1e-5).margin(1e-300));
    if (must_send && L.numel >= 64 && usq > 0) CHECK(ls.kept_sq > 0);  // a layer of any size sends something
    kept += ls.kept_sq;
  }
  if (must_send) CHECK(kept > 0);
}

}  // namespace gravac::test::overflow
