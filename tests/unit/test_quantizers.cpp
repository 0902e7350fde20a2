// QSGD, TernGrad, EF-sign and cast16: error feedback, unbiasedness (statistical, fixed
// seeds), packing sizes, fp16/bf16 conversions, overflow-free cast16 on many ranks, and
// validation of corrupt packets.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "gravac/compress/cast16.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {

template <class C>
std::vector<std::byte> make_packet(C& c, std::vector<float> g, std::vector<float>& e, const step_params& p,
                                   compress_stats& st) {
  std::vector<std::byte> packet(c.max_packet_bytes());
  packet.resize(c.compress(host_view(g), host_view(e), p, packet, st));
  return packet;
}

template <class C>
std::vector<float> decode(const C& c, std::span<const std::byte> packet, std::size_t n) {
  std::vector<float> out(n, 0.0f);
  REQUIRE(c.validate(packet));
  c.decompress_add(packet, host_view(out), 1.0f);
  return out;
}

// One ulp of the larger of two magnitudes: the rounding bound of e = u - d, then d + e.
float ulp_of_max(float a, float b) {
  const float m = std::max(std::fabs(a), std::fabs(b));
  return m == 0 ? 0.0f : std::ldexp(1.0f, std::ilogb(m) - 23);
}

template <class C>
void check_error_feedback(const typename C::options& opt, int ranks = 1) {
  const auto lay = test::mixed_layout();
  C c(lay, opt);
  auto p = test::params_for(lay, 0.5, 3, 11);
  p.ranks = ranks;
  const auto g = test::make_data(lay.numel(), 31, test::distribution::laplace);
  auto e = test::make_data(lay.numel(), 32);
  for (auto& x : e) x *= 0.2f;
  const auto e_old = e;
  compress_stats st;
  const auto packet = make_packet(c, g, e, p, st);
  const auto dec = decode(c, packet, lay.numel());
  for (std::size_t i = 0; i < lay.numel(); ++i) {
    const float u = g[i] + e_old[i];
    INFO("element " << i << " u " << u << " dec " << dec[i] << " e " << e[i]);
    REQUIRE(std::fabs((dec[i] + e[i]) - u) <= ulp_of_max(u, dec[i]));
  }
}

// Mean of decompress(C(u)) over many steps (each step draws afresh) against u, in units
// of each element's standard error. The draws are fixed by the seeds, so this is
// deterministic; the bound (6 sigma per element, 5 / sqrt(n) for the mean z) has a
// negligible chance of failing for an unbiased quantizer and fails for a biased one.
template <class C>
void check_unbiased(const typename C::options& opt, float step_of_scale) {
  const std::size_t n = 700;
  const auto lay = layout::flat(n);
  C c(lay, opt);
  const auto u = test::make_data(n, 77, test::distribution::laplace);
  const int trials = 3000;
  std::vector<double> sum(n, 0.0);
  float scale = 0;
  for (int t = 0; t < trials; ++t) {
    std::vector<float> e(n, 0.0f);
    compress_stats st;
    const auto packet = make_packet(c, u, e, test::params_for(lay, 0.5, t, 1234), st);
    const auto dec = decode(c, packet, n);
    for (std::size_t i = 0; i < n; ++i) sum[i] += dec[i];
    if (t == 0)
      scale = load_at<float>(
          std::span<const std::byte>(packet).subspan(sizeof(packet_header) + sizeof(segment_header) + 8), 0);
  }
  REQUIRE(scale > 0);
  // A stochastic rounding between two points step apart has variance <= step^2 / 4.
  const double sigma = step_of_scale * scale / 2.0 / std::sqrt(static_cast<double>(trials));
  double z_sum = 0, z_max = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double z = (sum[i] / trials - u[i]) / sigma;
    z_sum += z;
    z_max = std::max(z_max, std::fabs(z));
  }
  INFO("max |z| " << z_max << " mean z " << z_sum / n);
  CHECK(z_max < 6.0);
  CHECK(std::fabs(z_sum / n) < 5.0 / std::sqrt(static_cast<double>(n)));
}

}  // namespace

TEST_CASE("splitmix64_nth is the splitmix64 stream", "[compress][random]") {
  detail::splitmix64 rng(42);
  for (std::uint64_t i = 0; i < 100; ++i) CHECK(rng.next() == detail::splitmix64_nth(42, i));
}

TEST_CASE("element_bits: a pure function of (stream, i), uniform, independent of chunking", "[compress][random]") {
  // fill_uniforms from any group-aligned start and length equals the per-element definition.
  for (std::size_t first : {std::size_t{0}, std::size_t{64}, std::size_t{1} << 33})
    for (std::size_t m : {1u, 63u, 64u, 65u, 200u, 1024u}) {
      std::vector<float> u(m);
      detail::fill_uniforms(99, first, m, u.data());
      for (std::size_t k = 0; k < m; ++k) REQUIRE(u[k] == detail::uniform24(detail::element_bits(99, first + k)));
    }
  // The definition: a SplitMix32 step inside each group of 64, keyed by splitmix64.
  CHECK(detail::element_bits(5, 130) ==
        detail::fmix32(static_cast<std::uint32_t>(detail::splitmix64_nth(5, 2)) + 2u * detail::random_step));
  // Uniform: chi-square over 64 cells of the top bits, and no correlation between
  // neighbours, over 2^16 draws of several streams (fixed, so deterministic).
  for (std::uint64_t stream : {std::uint64_t{1}, std::uint64_t{12345}, detail::mix_seed(7, 3, 2)}) {
    const std::size_t n = 1 << 16;
    std::vector<double> cells(64, 0.0);
    double corr = 0, mean = 0;
    float prev = detail::uniform24(detail::element_bits(stream, 0));
    for (std::size_t i = 0; i < n; ++i) {
      const float x = detail::uniform24(detail::element_bits(stream, i));
      REQUIRE((x >= 0.0f && x < 1.0f));
      cells[static_cast<std::size_t>(x * 64)] += 1;
      mean += x;
      if (i > 0) corr += (x - 0.5) * (prev - 0.5);
      prev = x;
    }
    double chi2 = 0;
    for (double c : cells) chi2 += (c - n / 64.0) * (c - n / 64.0) / (n / 64.0);
    INFO("stream " << stream << " chi2 " << chi2 << " mean " << mean / n << " lag-1 corr " << corr / n * 12);
    CHECK(chi2 < 120);  // 63 degrees of freedom: p < 1e-4 beyond 120
    CHECK(std::fabs(mean / n - 0.5) < 5 * std::sqrt(1.0 / 12 / n));
    CHECK(std::fabs(corr / n * 12) < 5 / std::sqrt(double(n)));
  }
  // Neighbouring groups, streams and steps differ.
  CHECK(detail::element_bits(1, 0) != detail::element_bits(1, 64));
  CHECK(detail::element_bits(1, 0) != detail::element_bits(2, 0));
}

// QSGD and TernGrad against a plain per-element reading of their definition with the
// documented draw (uniform24(element_bits(mix_seed(seed, step, layer id), i))): every code
// and every residual bit for bit. The bucket scale is read from the packet and checked
// against the norm (max) computed here in double.
template <detail::level_scale Scale, class C>
void check_leveled_reference(C& c, const layout& lay, std::uint32_t levels, std::uint32_t bucket) {
  const auto g = test::make_data(lay.numel(), 41, test::distribution::laplace);
  auto e = test::make_data(lay.numel(), 42);
  for (auto& x : e) x *= 0.3f;
  const auto e_old = e;
  auto p = test::params_for(lay, 0.5, 6, 77);
  compress_stats st;
  const auto packet = make_packet(c, g, e, p, st);
  REQUIRE(c.validate(packet));
  const unsigned width = code_width(levels);
  std::size_t seen = 0;
  for_each_segment(std::span<const std::byte>(packet), [&](const segment_header& sh, std::span<const std::byte> pl) {
    const layer& l = lay[sh.layer];
    const std::uint64_t stream = detail::mix_seed(p.seed, p.step, l.id);
    const std::size_t n = l.numel, B = bucket ? bucket : n, nb = bucket_count(n, bucket);
    const std::byte* codes = pl.data() + quant_prefix_bytes + pad8(nb * 4);
    for (std::size_t b = 0; b < nb; ++b) {
      const float scale = load_at<float>(pl.subspan(quant_prefix_bytes), b);
      double norm = 0, mx = 0;
      for (std::size_t i = b * B; i < std::min(n, (b + 1) * B); ++i) {
        const double u = static_cast<float>(g[l.offset + i] + e_old[l.offset + i]);
        norm += u * u;
        mx = std::max(mx, std::fabs(u));
      }
      const double want = Scale == detail::level_scale::l2_norm ? std::sqrt(norm) : mx;
      REQUIRE(std::fabs(scale - want) <= 1e-6 * want);
      const float f = scale / static_cast<float>(levels);
      const float inv = scale > 0 ? static_cast<float>(levels) / scale : 0.0f;
      for (std::size_t i = b * B; i < std::min(n, (b + 1) * B); ++i) {
        const float u = g[l.offset + i] + e_old[l.offset + i];
        const float a = std::fabs(u) * inv;
        const float fl = std::floor(a);
        const float r = detail::uniform24(detail::element_bits(stream, i));
        const auto level = static_cast<std::uint32_t>(std::min<float>(fl + (r < a - fl ? 1.0f : 0.0f), float(levels)));
        const bool neg = u < 0 && level > 0;
        const std::uint32_t want_code = level | (neg ? 1u << (width - 1) : 0u);
        std::uint64_t word = 0;
        std::memcpy(&word, codes + (i * width / 64) * 8,
                    std::min<std::size_t>(8, detail::code_bytes(n, width) - (i * width / 64) * 8));
        const auto code = static_cast<std::uint32_t>((word >> (i * width % 64)) & ((1ull << width) - 1));
        INFO("layer " << sh.layer << " element " << i << " u " << u << " a " << a << " r " << r);
        REQUIRE(code == want_code);
        const float v = f * static_cast<float>(level);
        const float want_e = u - (neg ? -v : v);
        REQUIRE(std::memcmp(&e[l.offset + i], &want_e, 4) == 0);
        ++seen;
      }
    }
  });
  std::size_t quantized = 0;
  for (const auto& l : lay.layers()) quantized += l.numel;
  CHECK(seen == quantized);
}

TEST_CASE("QSGD and TernGrad equal a per-element reference with the documented draws", "[compress][quant][reference]") {
  // mixed_layout plus a layer longer than one chunk, not a multiple of any vector width.
  auto lay = test::mixed_layout();
  lay.add("long", {3000 + 13}, layer_kind::dense);
  for (std::uint32_t levels : {1u, 3u, 7u, 127u, 1000u})
    for (std::uint32_t bucket : {0u, 64u, 512u}) {
      INFO("qsgd levels " << levels << " bucket " << bucket);
      qsgd c(lay, {.levels = levels, .bucket = bucket});
      check_leveled_reference<detail::level_scale::l2_norm>(c, lay, levels, bucket);
    }
  for (std::uint32_t bucket : {0u, 64u, 512u}) {
    INFO("terngrad bucket " << bucket);
    terngrad c(lay, {.bucket = bucket});
    check_leveled_reference<detail::level_scale::max_abs>(c, lay, 1, bucket);
  }
}

TEST_CASE("cast16 and EF-sign equal a per-element reference", "[compress][quant][reference]") {
  auto lay = test::mixed_layout();
  lay.add("long", {3000 + 13}, layer_kind::dense);
  const auto g = test::make_data(lay.numel(), 51, test::distribution::laplace);
  auto e0 = test::make_data(lay.numel(), 52);
  // Values across fp16's range: subnormal, normal, beyond the largest (clamped).
  for (std::size_t i = 0; i < e0.size(); ++i) e0[i] *= std::ldexp(1.0f, static_cast<int>(i % 48) - 30);
  for (int ranks : {1, 3, 8})
    for (auto fmt : {cast16_format::fp16, cast16_format::bf16}) {
      INFO("ranks " << ranks << " format " << static_cast<int>(fmt));
      cast16 c(lay, {.format = fmt});
      auto p = test::params_for(lay, 0.5);
      p.ranks = ranks;
      auto e = e0;
      compress_stats st;
      const auto packet = make_packet(c, g, e, p, st);
      REQUIRE(c.validate(packet));
      const float limit = fmt == cast16_format::fp16 ? detail::fp16_max : detail::bf16_max;
      for_each_segment(
          std::span<const std::byte>(packet), [&](const segment_header& sh, std::span<const std::byte> pl) {
            const layer& l = lay[sh.layer];
            for (std::size_t i = 0; i < l.numel; ++i) {
              const float u = e0[l.offset + i] + g[l.offset + i];
              const float q = std::clamp(u * (1.0f / static_cast<float>(ranks)), -limit, limit);
              const std::uint16_t h = fmt == cast16_format::fp16 ? detail::float_to_fp16(q) : detail::float_to_bf16(q);
              const float v = (fmt == cast16_format::fp16 ? detail::fp16_to_float(h) : detail::bf16_to_float(h)) *
                              static_cast<float>(ranks);
              const float want_e = u - v;
              INFO("element " << i << " u " << u);
              REQUIRE(load_at<std::uint16_t>(pl.subspan(quant_prefix_bytes), i) == h);
              REQUIRE(std::memcmp(&e[l.offset + i], &want_e, 4) == 0);
            }
          });
    }
  sign c(lay);
  auto e = e0;
  compress_stats st;
  const auto packet = make_packet(c, g, e, test::params_for(lay, 0.5), st);
  REQUIRE(c.validate(packet));
  for_each_segment(std::span<const std::byte>(packet), [&](const segment_header& sh, std::span<const std::byte> pl) {
    const layer& l = lay[sh.layer];
    double abs_sum = 0;
    for (std::size_t i = 0; i < l.numel; ++i) abs_sum += std::fabs(e0[l.offset + i] + g[l.offset + i]);
    const float scale = load_at<float>(pl, 0);
    REQUIRE(std::fabs(scale - abs_sum / static_cast<double>(l.numel)) <= 1e-6 * scale);
    for (std::size_t i = 0; i < l.numel; ++i) {
      const float u = e0[l.offset + i] + g[l.offset + i];
      const bool negative = (static_cast<unsigned>(pl[quant_prefix_bytes + i / 8]) >> (i % 8)) & 1u;
      const float want_e = u - (u < 0 ? -scale : scale);
      INFO("element " << i << " u " << u);
      REQUIRE(negative == (u < 0));
      REQUIRE(std::memcmp(&e[l.offset + i], &want_e, 4) == 0);
    }
  });
  // Decoding adds s * (±scale), for a negative s too.
  std::vector<float> out(lay.numel(), 1.0f);
  c.decompress_add(packet, host_view(out), -0.5f);
  for_each_segment(std::span<const std::byte>(packet), [&](const segment_header& sh, std::span<const std::byte> pl) {
    const layer& l = lay[sh.layer];
    const float scale = load_at<float>(pl, 0);
    for (std::size_t i = 0; i < l.numel; ++i) {
      const bool negative = (static_cast<unsigned>(pl[quant_prefix_bytes + i / 8]) >> (i % 8)) & 1u;
      REQUIRE(out[l.offset + i] == 1.0f + -0.5f * (negative ? -scale : scale));
    }
  });
}

template <unsigned W>
void check_code_bytes_round_trip() {
  for (std::size_t m : {1u, 7u, 8u, 9u, 63u, 64u, 65u, 1000u, 1024u}) {
    std::vector<std::uint8_t> codes((m + 7) / 8 * 8, 0), back(codes.size(), 0xff);
    for (std::size_t k = 0; k < m; ++k) codes[k] = static_cast<std::uint8_t>((k * 2654435761u >> 7) & ((1u << W) - 1));
    std::vector<std::byte> packed(detail::code_bytes(m, W) + 8, std::byte{0xee});
    detail::pack_code_bytes<W>(codes.data(), m, packed.data());
    // Bit layout: code k at bits [k*W, (k+1)*W) of the stream, as code_writer writes it.
    std::vector<std::byte> ref(detail::code_bytes(m, W));
    detail::code_writer<W> cw(ref.data());
    for (std::size_t k = 0; k < m; ++k) cw.put(codes[k]);
    cw.flush();
    INFO("W " << W << " m " << m);
    REQUIRE(std::memcmp(packed.data(), ref.data(), ref.size()) == 0);
    REQUIRE(packed[ref.size()] == std::byte{0xee});  // nothing written past the codes
    detail::unpack_code_bytes<W>(packed.data(), m, back.data());
    for (std::size_t k = 0; k < m; ++k) REQUIRE(back[k] == codes[k]);
  }
}

TEST_CASE("code packing by words equals the bit-stream layout and round-trips", "[compress][quant][packing]") {
  check_code_bytes_round_trip<1>();
  check_code_bytes_round_trip<2>();
  check_code_bytes_round_trip<4>();
}

TEST_CASE("quantizers keep the error-feedback invariant", "[compress][quant][ef]") {
  for (std::uint32_t levels : {1u, 3u, 7u, 127u, 1000u})
    for (std::uint32_t bucket : {0u, 64u, 512u}) {
      INFO("qsgd levels " << levels << " bucket " << bucket);
      check_error_feedback<qsgd>({.levels = levels, .bucket = bucket});
    }
  for (std::uint32_t bucket : {0u, 64u, 512u}) check_error_feedback<terngrad>({.bucket = bucket});
  check_error_feedback<sign>({});
  for (int ranks : {1, 3, 8}) {
    check_error_feedback<cast16>({.format = cast16_format::fp16}, ranks);
    check_error_feedback<cast16>({.format = cast16_format::bf16}, ranks);
  }
}

TEST_CASE("QSGD and TernGrad are unbiased", "[compress][quant][statistics]") {
  check_unbiased<qsgd>({.levels = 1, .bucket = 0}, 1.0f);
  check_unbiased<qsgd>({.levels = 7, .bucket = 0}, 1.0f / 7);
  check_unbiased<terngrad>({.bucket = 0}, 1.0f);
  // Deterministic rounding (what a broken draw would do) must fail the same test: rounding
  // every level down is biased by about half a step on average.
  const std::size_t n = 700;
  const auto u = test::make_data(n, 77, test::distribution::laplace);
  double norm = 0;
  for (float x : u) norm += double(x) * x;
  norm = std::sqrt(norm);
  double z_sum = 0;
  const double sigma = norm / 2.0 / std::sqrt(3000.0);
  for (float x : u) z_sum += (std::floor(std::fabs(x) / norm) * norm * (x < 0 ? -1 : 1) - x) / sigma;
  CHECK(std::fabs(z_sum / n) > 5.0 / std::sqrt(static_cast<double>(n)));
}

// ||e|| after \p steps of error feedback with a fresh Gaussian gradient (norm about
// sqrt(n)) each step, starting from e = 0.
template <class C>
double residual_norm_after(const typename C::options& opt, int steps) {
  const std::size_t n = 4096;
  const auto lay = layout::flat(n);
  C c(lay, opt);
  std::vector<float> e(n, 0.0f);
  for (int t = 0; t < steps; ++t) {
    compress_stats st;
    make_packet(c, test::make_data(n, 500 + static_cast<unsigned>(t)), e, test::params_for(lay, 0.5, t, 99), st);
  }
  double sq = 0;
  for (float x : e) sq += double(x) * x;
  return std::sqrt(sq);
}

// Error feedback stays bounded only for a quantizer whose error is smaller than its input
// (E||Q(u) - u||^2 < ||u||^2); QSGD's variance bound is min(B / s^2, sqrt(B) / s) ||u||^2
// for buckets of B, so s >= about sqrt(B) keeps it. Documented in qsgd_options::levels.
TEST_CASE("QSGD's error feedback stays bounded for s >= sqrt(bucket), not below", "[compress][quant][ef]") {
  const double g_norm = std::sqrt(4096.0);             // of each step's gradient
  CHECK(residual_norm_after<qsgd>({}, 150) < g_norm);  // the defaults: s = 127, buckets of 512
  CHECK(residual_norm_after<qsgd>({.levels = 7, .bucket = 64}, 150) < g_norm);
  CHECK(residual_norm_after<qsgd>({.levels = 127, .bucket = 0}, 150) < g_norm);
  // Below: the residual grows geometrically (a documented limit, checked so that the
  // documentation stays true).
  CHECK(residual_norm_after<qsgd>({.levels = 1, .bucket = 512}, 150) > 1e3 * g_norm);
  // TernGrad stays bounded, a few gradient norms for buckets of 512.
  CHECK(residual_norm_after<terngrad>({}, 150) < 20 * g_norm);
}

TEST_CASE("quantizers draw from the shared seed: same step, same bits", "[compress][quant]") {
  const auto lay = test::mixed_layout();
  qsgd a(lay), b(lay);
  const auto g = test::make_data(lay.numel(), 9);
  std::vector<float> ea(lay.numel(), 0.0f), eb(lay.numel(), 0.0f), ec(lay.numel(), 0.0f);
  compress_stats st;
  const auto pa = make_packet(a, g, ea, test::params_for(lay, 0.5, 4), st);
  const auto pb = make_packet(b, g, eb, test::params_for(lay, 0.5, 4), st);
  const auto pc = make_packet(b, g, ec, test::params_for(lay, 0.5, 5), st);
  CHECK(pa == pb);
  CHECK(pa != pc);
}

TEST_CASE("quantized packet sizes", "[compress][quant][size]") {
  CHECK(code_width(1) == 2);
  CHECK(code_width(3) == 4);
  CHECK(code_width(7) == 4);
  CHECK(code_width(8) == 8);
  CHECK(code_width(127) == 8);
  CHECK(code_width(128) == 16);
  const std::size_t n = 4096 * 3 + 17;
  const auto lay = layout::flat(n);
  const auto g = test::make_data(n, 1);
  const std::size_t head = sizeof(packet_header) + sizeof(segment_header) + quant_prefix_bytes;
  compress_stats st;
  auto size_of = [&](auto&& c) {
    std::vector<float> e(n, 0.0f);
    return make_packet(c, g, e, test::params_for(lay, 0.5), st).size();
  };
  CHECK(size_of(qsgd(lay, {.levels = 127, .bucket = 512})) == head + pad8(((n + 511) / 512) * 4) + pad8(n));
  CHECK(size_of(qsgd(lay, {.levels = 7, .bucket = 0})) == head + 8 + pad8((n * 4 + 7) / 8));
  CHECK(size_of(terngrad(lay, {.bucket = 0})) == head + 8 + pad8((n * 2 + 7) / 8));
  CHECK(size_of(sign(lay)) == head + pad8((n + 7) / 8));
  CHECK(size_of(cast16(lay)) == head + pad8(2 * n));
}

TEST_CASE("fp16 and bf16 conversions round to nearest even", "[compress][cast16]") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    if (!detail::fp16_non_finite(b)) {
      const float f = detail::fp16_to_float(b);
      REQUIRE(detail::float_to_fp16(f) == ((b & 0x7fff) == 0 ? b : b));
    }
    if (!detail::bf16_non_finite(b)) REQUIRE(detail::float_to_bf16(detail::bf16_to_float(b)) == b);
  }
  // Against the compiler's own half type where it has one (GCC 12+ on x86-64).
#if defined(__FLT16_MAX__)
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    if (detail::fp16_non_finite(b)) continue;
    _Float16 ref;
    std::memcpy(&ref, &b, 2);
    INFO("fp16 bits " << h);
    REQUIRE(std::bit_cast<std::uint32_t>(detail::fp16_to_float(b)) ==
            std::bit_cast<std::uint32_t>(static_cast<float>(ref)));
  }
  const auto v = test::make_data(20000, 3, test::distribution::laplace);
  for (float x : v)
    for (float s : {1e-7f, 1e-5f, 0.01f, 1.0f, 3000.0f}) {
      const float f = x * s;
      const _Float16 ref = static_cast<_Float16>(f);
      std::uint16_t rb;
      std::memcpy(&rb, &ref, 2);
      INFO("value " << f);
      REQUIRE(detail::float_to_fp16(f) == rb);
    }
#endif
  // bf16: the result is the nearer neighbour, ties to even.
  for (std::uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f807fffu}) {
    const float f = std::bit_cast<float>(bits);
    const std::uint16_t r = detail::float_to_bf16(f);
    const float lo = std::bit_cast<float>(bits & 0xffff0000u),
                hi = std::bit_cast<float>((bits & 0xffff0000u) + 0x10000u);
    const float got = detail::bf16_to_float(r);
    CHECK((got == lo || got == hi));
    CHECK(std::fabs(got - f) <= std::fabs((got == lo ? hi : lo) - f));
  }
  CHECK(detail::float_to_bf16(std::bit_cast<float>(0x3f808000u)) == 0x3f80);  // tie to even (down)
  CHECK(detail::float_to_bf16(std::bit_cast<float>(0x3f818000u)) == 0x3f82);  // tie to even (up)
}

TEST_CASE("cast16 divides by N: no overflow near the fp16 maximum on 8 ranks", "[compress][cast16][threads]") {
  constexpr int ranks = 8;
  const auto lay = layout::flat(1000);
  std::vector<std::vector<float>> grads(ranks);
  std::vector<double> mean(lay.numel(), 0.0);
  for (int r = 0; r < ranks; ++r) {
    grads[r] = test::make_data(lay.numel(), 50 + r);
    for (auto& x : grads[r]) x = 60000.0f + 5000.0f * std::fabs(std::tanh(x));  // 60000 .. 65000
    for (std::size_t i = 0; i < lay.numel(); ++i) mean[i] += grads[r][i] / double(ranks);
  }
  for (auto fmt : {cast16_format::fp16, cast16_format::bf16}) {
    std::vector<std::vector<float>> out(ranks);
    std::vector<std::vector<std::byte>> packets(ranks);
    run_ranks(ranks, [&](thread_communicator& comm) {
      using T = trainer<cast16, allgather, fixed_policy>;
      T::options opt;
      opt.compressor.format = fmt;
      opt.policy.kept_fraction = 0.5;
      T t(comm, lay, opt);
      auto g = grads[comm.rank()];
      t.step(g);
      out[comm.rank()] = g;
    });
    for (int r = 0; r < ranks; ++r)
      for (std::size_t i = 0; i < lay.numel(); ++i) {
        INFO("rank " << r << " element " << i);
        REQUIRE(std::isfinite(out[r][i]));
        REQUIRE(std::fabs(out[r][i] - mean[i]) <= (fmt == cast16_format::fp16 ? 1e-3 : 8e-3) * std::fabs(mean[i]));
      }
    // The codes themselves sum without overflow in 16-bit arithmetic (what a half-precision
    // allreduce would do); the same sum of undivided values overflows.
    if (fmt == cast16_format::fp16) {
      float sum16 = 0, sum_raw16 = 0;
      for (int r = 0; r < ranks; ++r) {
        sum16 = detail::fp16_to_float(
            detail::float_to_fp16(sum16 + detail::fp16_to_float(detail::float_to_fp16(grads[r][0] / ranks))));
        const float next = sum_raw16 + grads[r][0];
        sum_raw16 = std::fabs(next) > detail::fp16_max ? INFINITY : detail::fp16_to_float(detail::float_to_fp16(next));
      }
      CHECK(std::isfinite(sum16));
      CHECK(std::fabs(sum16 - mean[0]) < 1e-3 * std::fabs(mean[0]));
      CHECK_FALSE(std::isfinite(sum_raw16));
    }
  }
  // A value beyond the range after the division is clamped, never infinite; e keeps the rest.
  const auto one = layout::flat(2);
  cast16 c(one);
  std::vector<float> g{1e7f, -1e7f}, e(2, 0.0f);
  compress_stats st;
  auto p = test::params_for(one, 0.5);
  p.ranks = 2;
  const auto packet = make_packet(c, g, e, p, st);
  const auto dec = decode(c, packet, 2);
  CHECK(dec[0] == detail::fp16_max * 2);
  CHECK(dec[1] == -detail::fp16_max * 2);
  CHECK(e[0] == 1e7f - detail::fp16_max * 2);
}

TEST_CASE("quantizer validation rejects malformed packets", "[compress][quant][validation]") {
  const std::size_t n = 200;
  const auto lay = layout::flat(n);
  const auto g = test::make_data(n, 4);
  const auto p = test::params_for(lay, 0.5);
  const std::size_t pl = sizeof(packet_header) + sizeof(segment_header);
  compress_stats st;
  auto check_all = [&](auto&& c, auto&& corruptions) {
    std::vector<float> e(n, 0.0f);
    const auto good = make_packet(c, g, e, p, st);
    REQUIRE(c.validate(good));
    for (std::size_t cut = 0; cut < good.size(); cut += 5)
      CHECK_FALSE(c.validate(std::span<const std::byte>(good.data(), cut)));
    for (auto& edit : corruptions) {
      auto bad = good;
      edit(bad);
      CHECK_FALSE(c.validate(bad));
    }
  };
  using edit = std::function<void(std::vector<std::byte>&)>;
  auto put32 = [](std::vector<std::byte>& b, std::size_t at, std::uint32_t v) { std::memcpy(b.data() + at, &v, 4); };
  auto putf = [](std::vector<std::byte>& b, std::size_t at, float v) { std::memcpy(b.data() + at, &v, 4); };
  const std::vector<edit> common{
      [](auto& b) { b[sizeof(packet_header) + 5] = std::byte{9}; },  // unknown encoding
      [](auto& b) { b[sizeof(packet_header) + 4] = std::byte{4}; },  // indices in a quantized segment
      [](auto& b) {
        std::uint64_t c = 5;
        std::memcpy(b.data() + sizeof(packet_header) + 16, &c, 8);
      },  // count != numel
  };
  auto with = [&](std::vector<edit> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  // QSGD with 100 levels uses 8-bit codes that could hold 127: a level of 101 must be caught.
  const std::size_t q_codes = pl + 8 + 8;  // prefix, one bucket norm (n < 512), padded
  check_all(qsgd(lay, {.levels = 100, .bucket = 512}),
            with({[&](auto& b) { b[q_codes + 3] = std::byte{101}; },
                  [&](auto& b) { b[q_codes + 3] = std::byte{0x80}; },  // sign on level 0
                  [&](auto& b) { put32(b, pl, 0); },                   // zero levels
                  [&](auto& b) { put32(b, pl + 4, 100); },             // bucket not a multiple of 64
                  [&](auto& b) { putf(b, pl + 8, std::nanf("")); },    // NaN norm
                  [&](auto& b) { putf(b, pl + 8, -1.0f); }}));         // negative norm
  check_all(terngrad(lay, {.bucket = 0}), with({[&](auto& b) { b[q_codes] = std::byte{0x02}; },   // code 10
                                                [&](auto& b) { put32(b, pl, 2); },                // two levels
                                                [&](auto& b) { b.back() = std::byte{0x40}; }}));  // padding bits
  check_all(sign(lay), with({[&](auto& b) { putf(b, pl, INFINITY); }, [&](auto& b) { put32(b, pl + 4, 1); },
                             [&](auto& b) { b.back() = std::byte{1}; }}));
  check_all(cast16(lay), with({[&](auto& b) { b[pl + 8 + 1] = std::byte{0x7c}; },  // fp16 infinity
                               [&](auto& b) { putf(b, pl, 0.0f); },                // zero multiplier
                               [&](auto& b) { putf(b, pl, std::nanf("")); }}));
  // A packet of one quantizer is not accepted by another.
  std::vector<float> e(n, 0.0f);
  qsgd q(lay);
  const auto qp = make_packet(q, g, e, p, st);
  CHECK_FALSE(terngrad(lay).validate(qp));
  CHECK_FALSE(sign(lay).validate(qp));
  CHECK_FALSE(cast16(lay).validate(qp));
}

TEST_CASE("quantizer options are checked at construction", "[compress][quant][options]") {
  const auto lay = layout::flat(10);
  CHECK_THROWS_AS(qsgd(lay, {.levels = 0}), gravac::error);
  CHECK_THROWS_AS(qsgd(lay, {.levels = 40000}), gravac::error);
  CHECK_THROWS_AS(qsgd(lay, {.levels = 7, .bucket = 100}), gravac::error);
  CHECK_THROWS_AS(terngrad(lay, {.bucket = 30}), gravac::error);
}
