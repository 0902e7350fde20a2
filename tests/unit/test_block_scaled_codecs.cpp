// The element and scale codecs of the block-scaled formats (compress/detail/minifloat.hpp)
// against OCP MX v1.0 / OFP8: every FP8 and FP4 code and every E8M0 code decoded against
// values computed here from sign, exponent and mantissa, round trips, ties to even at every
// midpoint, saturation, NaN and infinity, the exact scaled conversion, and stochastic
// rounding (unbiased, reproducible).
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gravac/compress/detail/minifloat.hpp"
#include "gravac/compress/detail/quantize_kernels.hpp"

using namespace gravac;
using detail::minifloat;

namespace {

// The OCP value of a code, from its fields alone (double arithmetic; NaN for the NaN codes).
struct fields {
  int exponent_bits, mantissa_bits, bias;
  bool ieee_specials;  // E5M2: exponent all ones = infinity (mantissa 0) or NaN
  bool e4m3_nan;       // E4M3: S.1111.111 = NaN, no infinities
};

double reference_value(const fields& f, std::uint32_t code) {
  const std::uint32_t mant = code & ((1u << f.mantissa_bits) - 1u);
  const std::uint32_t expo = (code >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1u);
  const bool neg = (code >> (f.exponent_bits + f.mantissa_bits)) & 1u;
  const std::uint32_t all_ones = (1u << f.exponent_bits) - 1u;
  double v;
  if (f.e4m3_nan && expo == all_ones && mant == (1u << f.mantissa_bits) - 1u) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (f.ieee_specials && expo == all_ones) {
    v = mant == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (expo == 0) {
    v = std::ldexp(static_cast<double>(mant), 1 - f.bias - f.mantissa_bits);
  } else {
    v = std::ldexp(1.0 + static_cast<double>(mant) / (1 << f.mantissa_bits), static_cast<int>(expo) - f.bias);
  }
  return neg ? -v : v;
}

constexpr fields e4m3_fields{4, 3, 7, false, true};
constexpr fields e5m2_fields{5, 2, 15, true, false};
constexpr fields e2m1_fields{2, 1, 1, false, false};

template <minifloat F>
void check_every_code(const fields& f, std::uint32_t codes) {
  for (std::uint32_t c = 0; c < codes; ++c) {
    INFO("code " << c);
    const double ref = reference_value(f, c);
    const float got = detail::decode_minifloat<F>(c);
    const float via_value = detail::minifloat_value(F, c);
    if (std::isnan(ref)) {
      REQUIRE(std::isnan(got));
      REQUIRE(std::isnan(via_value));
      REQUIRE(detail::minifloat_is_nan(F, c));
      continue;
    }
    REQUIRE_FALSE(detail::minifloat_is_nan(F, c));
    // Exactly the reference, the sign of zero included.
    REQUIRE(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(static_cast<float>(ref)));
    REQUIRE(std::bit_cast<std::uint32_t>(via_value) == std::bit_cast<std::uint32_t>(got));
    if (std::isinf(ref)) {
      // Saturating conversion: an infinity becomes the largest finite value, with its sign.
      REQUIRE(detail::encode_minifloat<F>(got) == (c & detail::sign_bit_of(F)) + detail::spec_of(F).max_code);
      continue;
    }
    REQUIRE(detail::encode_minifloat<F>(got) == c);
    REQUIRE(detail::encode_minifloat_stochastic<F>(got, 0xffffffffu) == c);  // exact values never move
    REQUIRE(detail::encode_minifloat_stochastic<F>(got, 0u) == c);
  }
}

// Positive finite codes of F in value order (codes are monotonic in magnitude).
template <minifloat F>
std::vector<std::uint32_t> finite_magnitudes() {
  std::vector<std::uint32_t> v;
  for (std::uint32_t c = 0; c <= detail::spec_of(F).max_code; ++c) v.push_back(c);
  return v;
}

}  // namespace

TEST_CASE("E4M3: all 256 codes decode to the OCP values, and back", "[block_scaled][codec]") {
  check_every_code<minifloat::e4m3>(e4m3_fields, 256);
  CHECK(detail::decode_minifloat<minifloat::e4m3>(0x7e) == 448.0f);
  CHECK(detail::decode_minifloat<minifloat::e4m3>(0xfe) == -448.0f);
  CHECK(detail::decode_minifloat<minifloat::e4m3>(0x01) == 0x1p-9f);  // smallest subnormal
  CHECK(detail::decode_minifloat<minifloat::e4m3>(0x08) == 0x1p-6f);  // smallest normal
  CHECK(detail::decode_minifloat<minifloat::e4m3>(0x78) == 256.0f);   // S.1111.000 is a number, not infinity
  CHECK(std::isnan(detail::decode_minifloat<minifloat::e4m3>(0x7f)));
  CHECK(std::isnan(detail::decode_minifloat<minifloat::e4m3>(0xff)));
  int nans = 0;
  for (std::uint32_t c = 0; c < 256; ++c) nans += detail::minifloat_is_nan(minifloat::e4m3, c);
  CHECK(nans == 2);
}

TEST_CASE("E5M2: all 256 codes decode to the OCP values, and back", "[block_scaled][codec]") {
  check_every_code<minifloat::e5m2>(e5m2_fields, 256);
  CHECK(detail::decode_minifloat<minifloat::e5m2>(0x7b) == 57344.0f);
  CHECK(detail::decode_minifloat<minifloat::e5m2>(0x01) == 0x1p-16f);
  CHECK(detail::decode_minifloat<minifloat::e5m2>(0x04) == 0x1p-14f);
  CHECK(detail::decode_minifloat<minifloat::e5m2>(0x7c) == std::numeric_limits<float>::infinity());
  CHECK(detail::decode_minifloat<minifloat::e5m2>(0xfc) == -std::numeric_limits<float>::infinity());
  int nans = 0;
  for (std::uint32_t c = 0; c < 256; ++c) nans += detail::minifloat_is_nan(minifloat::e5m2, c);
  CHECK(nans == 6);
}

TEST_CASE("E2M1: the 16 codes are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives", "[block_scaled][codec]") {
  check_every_code<minifloat::e2m1>(e2m1_fields, 16);
  const float expected[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (std::uint32_t c = 0; c < 8; ++c) {
    CHECK(detail::decode_minifloat<minifloat::e2m1>(c) == expected[c]);
    CHECK(detail::decode_minifloat<minifloat::e2m1>(c | 8u) == -expected[c]);
    CHECK(std::bit_cast<std::uint32_t>(static_cast<float>(reference_value(e2m1_fields, c))) ==
          std::bit_cast<std::uint32_t>(expected[c]));
  }
}

TEST_CASE("E8M0: 2^(e - 127) for every code, 0xFF is NaN", "[block_scaled][codec]") {
  for (std::uint32_t c = 0; c < 255; ++c) {
    INFO("code " << c);
    REQUIRE(detail::e8m0_value(c) == static_cast<float>(std::ldexp(1.0, static_cast<int>(c) - 127)));
    REQUIRE(detail::e8m0_code(static_cast<int>(c) - 127) == c);
  }
  CHECK(std::isnan(detail::e8m0_value(0xff)));
  CHECK(detail::e8m0_value(0) == 0x1p-127f);  // a subnormal float, exact
  CHECK(detail::e8m0_value(254) == 0x1p127f);
  CHECK(detail::e8m0_code(-500) == 0u);  // clamped: the writer never produces the NaN code
  CHECK(detail::e8m0_code(500) == 254u);
  // The shared exponent: floor(log2 amax) - emax_elem, as the MX reference chooses it.
  CHECK(detail::mx_shared_exponent<minifloat::e4m3>(std::bit_cast<std::uint32_t>(1.0f)) == -8);
  CHECK(detail::mx_shared_exponent<minifloat::e4m3>(std::bit_cast<std::uint32_t>(511.9f)) == 0);
  CHECK(detail::mx_shared_exponent<minifloat::e5m2>(std::bit_cast<std::uint32_t>(3.0f)) == -14);
  CHECK(detail::mx_shared_exponent<minifloat::e2m1>(std::bit_cast<std::uint32_t>(0.75f)) == -3);
  CHECK(detail::mx_shared_exponent<minifloat::e2m1>(std::bit_cast<std::uint32_t>(0x1p-140f)) == -127);  // clamped
  CHECK(detail::mx_shared_exponent<minifloat::e2m1>(std::bit_cast<std::uint32_t>(0x1.8p-145f)) == -127);
  CHECK(detail::mx_shared_exponent<minifloat::e4m3>(0) == -127);                      // a block of zeros
  CHECK(detail::floor_log2_bits(std::bit_cast<std::uint32_t>(0x1.8p-145f)) == -145);  // subnormal float
  CHECK(detail::floor_log2_bits(std::bit_cast<std::uint32_t>(std::numeric_limits<float>::max())) == 127);
}

TEMPLATE_TEST_CASE_SIG("rounding to nearest: ties to even at every midpoint, else the nearer code",
                       "[block_scaled][codec][rounding]", ((minifloat F), F), minifloat::e4m3, minifloat::e5m2,
                       minifloat::e2m1) {
  const auto mags = finite_magnitudes<F>();
  const std::uint32_t sign = detail::sign_bit_of(F);
  for (std::size_t j = 0; j + 1 < mags.size(); ++j) {
    const std::uint32_t lo = mags[j], hi = mags[j + 1];
    const float a = detail::decode_minifloat<F>(lo), b = detail::decode_minifloat<F>(hi);
    const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);  // exact: one bit more than F has
    REQUIRE(static_cast<double>(mid) == (static_cast<double>(a) + b) / 2);
    const std::uint32_t even = (lo & 1u) == 0 ? lo : hi;
    INFO("between codes " << lo << " and " << hi);
    REQUIRE(detail::encode_minifloat<F>(mid) == even);
    REQUIRE(detail::encode_minifloat<F>(-mid) == (even | sign));
    REQUIRE(detail::encode_minifloat<F>(std::nextafter(mid, 0.0f)) == lo);
    REQUIRE(detail::encode_minifloat<F>(std::nextafter(mid, 1e30f)) == hi);
    REQUIRE(detail::encode_minifloat<F>(-std::nextafter(mid, 1e30f)) == (hi | sign));
  }
}

TEMPLATE_TEST_CASE_SIG("saturation, NaN and infinity as the OCP conversion with saturation",
                       "[block_scaled][codec][saturation]", ((minifloat F), F), minifloat::e4m3, minifloat::e5m2,
                       minifloat::e2m1) {
  const std::uint32_t maxc = detail::spec_of(F).max_code, sign = detail::sign_bit_of(F);
  const float maxv = detail::decode_minifloat<F>(maxc);
  for (float x : {maxv, std::nextafter(maxv, 1e30f), maxv * 1.0625f, maxv * 1.5f, maxv * 2.0f, maxv * 1e6f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()}) {
    INFO("value " << x);
    CHECK(detail::encode_minifloat<F>(x) == maxc);
    CHECK(detail::encode_minifloat<F>(-x) == (maxc | sign));
    CHECK(detail::encode_minifloat_stochastic<F>(x, 0xffffffffu) == maxc);
    CHECK(detail::encode_minifloat_stochastic<F>(-x, 0xffffffffu) == (maxc | sign));
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if constexpr (F == minifloat::e2m1) {
    CHECK(detail::encode_minifloat<F>(nan) == 0u);  // no NaN in E2M1: gravac's choice, +0
    CHECK(detail::encode_minifloat<F>(-nan) == 0u);
  } else {
    CHECK(detail::encode_minifloat<F>(nan) == 0x7fu);
    CHECK(detail::encode_minifloat<F>(-nan) == 0xffu);
    CHECK(detail::minifloat_is_nan(F, detail::encode_minifloat<F>(nan)));
    CHECK(detail::minifloat_is_nan(F, detail::encode_minifloat_stochastic<F>(nan, 12345u)));
  }
  // Zero, and values below half the smallest subnormal (ties to even: to zero at exactly half).
  const float tiny = detail::decode_minifloat<F>(1);
  CHECK(detail::encode_minifloat<F>(0.0f) == 0u);
  CHECK(detail::encode_minifloat<F>(-0.0f) == sign);
  CHECK(detail::encode_minifloat<F>(tiny / 2) == 0u);
  CHECK(detail::encode_minifloat<F>(std::nextafter(tiny / 2, 1.0f)) == 1u);
  CHECK(detail::encode_minifloat<F>(std::numeric_limits<float>::denorm_min()) == 0u);
}

TEST_CASE("the scaled conversion codes x * 2^-shift exactly, also where the float product would not be exact",
          "[block_scaled][codec]") {
  // x * 2^-shift formed in float would round (a subnormal product) or overflow; the codec
  // works on the exponent and must match the exact value.
  CHECK(detail::encode_minifloat<minifloat::e4m3>(5 * 0x1p-149f, -145) ==
        detail::encode_minifloat<minifloat::e4m3>(0.3125f));
  CHECK(detail::encode_minifloat<minifloat::e4m3>(0x1.8p-130f, -127) ==
        detail::encode_minifloat<minifloat::e4m3>(0.1875f));
  CHECK(detail::encode_minifloat<minifloat::e2m1>(std::numeric_limits<float>::max(), 125) == 7u);  // 1.99.. * 4 -> 6
  CHECK(detail::encode_minifloat<minifloat::e5m2>(0x1.4p100f, 100) == detail::encode_minifloat<minifloat::e5m2>(1.25f));
  // Every float with 5 significant bits over a range of exponents and shifts, against the
  // same value formed exactly in double and converted with shift 0 where that is exact.
  std::uint32_t checked = 0;
  for (int shift : {-127, -100, -20, -3, 0, 5, 60, 119}) {
    for (int ex = -149; ex <= 127; ex += 3) {
      for (std::uint32_t m = 16; m < 32; ++m) {
        const double xd = std::ldexp(static_cast<double>(m), ex - 4);
        if (xd > std::numeric_limits<float>::max()) continue;
        const auto x = static_cast<float>(xd);
        if (static_cast<double>(x) != xd) continue;  // below the float subnormals' precision
        const double y = std::ldexp(xd, -shift);
        if (y < 0x1p-120 || y > 0x1p120) continue;  // keep the shift-0 reference a normal float
        const auto yf = static_cast<float>(y);
        REQUIRE(static_cast<double>(yf) == y);
        INFO("x " << xd << " shift " << shift);
        REQUIRE(detail::encode_minifloat<minifloat::e4m3>(x, shift) == detail::encode_minifloat<minifloat::e4m3>(yf));
        REQUIRE(detail::encode_minifloat<minifloat::e5m2>(x, shift) == detail::encode_minifloat<minifloat::e5m2>(yf));
        REQUIRE(detail::encode_minifloat<minifloat::e2m1>(x, shift) == detail::encode_minifloat<minifloat::e2m1>(yf));
        ++checked;
      }
    }
  }
  CHECK(checked > 1000);
}

TEMPLATE_TEST_CASE_SIG("stochastic rounding: unbiased over many draws, reproducible, between neighbours only",
                       "[block_scaled][codec][stochastic]", ((minifloat F), F), minifloat::e4m3, minifloat::e5m2,
                       minifloat::e2m1) {
  const auto mags = finite_magnitudes<F>();
  const int draws = 4000;
  // A few points between each pair of neighbours (a fraction of 1/8, 1/2 and 0.8 of the gap).
  for (std::size_t j = 0; j + 1 < mags.size(); j += (F == minifloat::e2m1 ? 1 : 5)) {
    const float a = detail::decode_minifloat<F>(mags[j]), b = detail::decode_minifloat<F>(mags[j + 1]);
    for (double frac : {0.125, 0.5, 0.8}) {
      const float x = static_cast<float>(a + frac * (static_cast<double>(b) - a));
      double sum = 0;
      for (int i = 0; i < draws; ++i) {
        const std::uint32_t r = detail::element_bits(0x5eedull + j, static_cast<std::uint64_t>(i));
        const std::uint32_t c = detail::encode_minifloat_stochastic<F>(x, r);
        REQUIRE((c == mags[j] || c == mags[j + 1]));                 // never past a neighbour
        REQUIRE(detail::encode_minifloat_stochastic<F>(x, r) == c);  // a pure function of (x, r)
        sum += detail::decode_minifloat<F>(c);
      }
      // Each draw is a or b; its standard deviation is at most (b - a) / 2.
      const double sigma = (static_cast<double>(b) - a) / 2 / std::sqrt(static_cast<double>(draws));
      INFO("value " << x << " between " << a << " and " << b);
      REQUIRE(std::fabs(sum / draws - static_cast<double>(x)) < 5 * sigma);
    }
  }
  // The probability of rounding up is the fraction exactly: the top bits of r decide.
  // 1.25 * a + ... : x a quarter of the way from 1 to the next code rounds up for r >= 3/4 2^32.
  const float one = 1.0f;
  const std::uint32_t c1 = detail::encode_minifloat<F>(one);
  const float next = detail::decode_minifloat<F>(c1 + 1);
  const float quarter = one + (next - one) / 4;
  CHECK(detail::encode_minifloat_stochastic<F>(quarter, 0xbfffffffu) == c1);
  CHECK(detail::encode_minifloat_stochastic<F>(quarter, 0xc0000000u) == c1 + 1);
  // Deterministic rounding would fail the mean test: a quarter of the gap always rounds down.
  CHECK(detail::encode_minifloat<F>(quarter) == c1);
}
