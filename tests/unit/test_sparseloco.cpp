// sparseloco: chunked top-k against a brute-force reference, the 2-bit levels and the
// exact wire bytes, the decaying residual bit for bit, malformed packets rejected before
// the output is touched, and the compressor in a trainer on thread ranks.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "gravac/compress/sparseloco.hpp"
#include "gravac_test_util.hpp"
#include "packet_battery.hpp"

using namespace gravac;

namespace sparseloco_test {

// Layers of one short chunk, of several whole chunks, and of whole chunks and a short tail.
inline layout chunked_layout() {
  layout l;
  l.add("small", {37}, layer_kind::dense);
  l.add("whole", {4, 64}, layer_kind::dense);
  l.add("empty", {0}, layer_kind::dense);
  l.add("tail", {1000}, layer_kind::dense);
  return l;
}

struct compressed {
  std::vector<std::byte> packet;
  std::vector<float> decoded;  // decompress(packet), scale 1, from zeros
  compress_stats st;
};

inline compressed run(sparseloco& c, const layout& lay, std::vector<float> g, std::vector<float>& e,
                      const step_params& p) {
  compressed r;
  r.packet.resize(c.max_packet_bytes());
  r.packet.resize(c.compress(host_view(g), host_view(e), p, r.packet, r.st));
  const validation v = c.validate(r.packet);
  INFO(v.reason);
  REQUIRE(v);
  r.decoded.assign(lay.numel(), 0.0f);
  c.decompress_add(r.packet, host_view(r.decoded), 1.0f);
  return r;
}

// u = g + beta * e, the way the compressor forms it.
inline std::vector<float> folded(const std::vector<float>& g, const std::vector<float>& e, float beta) {
  std::vector<float> u(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float decayed = beta * e[i];
    u[i] = g[i] + decayed;
  }
  return u;
}

// Brute force: the offsets of the k largest |u| of a chunk, ties to the lower offset, ascending.
inline std::vector<std::size_t> reference_topk(std::span<const float> u, std::size_t k) {
  std::vector<std::size_t> order(u.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return std::fabs(u[a]) > std::fabs(u[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// The nearest of {s/3, s} to |x| (the midpoint to s/3), with x's sign: computed apart from
// the library's code/level pair.
inline float reference_level(float x, float s) {
  const double a = std::fabs(static_cast<double>(x));
  const float third = s / 3.0f;
  const float m = std::fabs(a - s) < std::fabs(a - third) ? s : third;
  return x < 0 ? -m : m;
}

// One segment of a packet, read by hand from the documented format (not by the library's decoder).
struct segment_view {
  std::uint32_t layer = 0;
  std::uint8_t encoding = 0;
  std::uint32_t chunk = 0, chunks = 0, k_full = 0, k_last = 0;
  std::vector<float> scales;
  std::vector<std::uint16_t> offsets;
  std::vector<std::uint8_t> codes;
  std::size_t bytes = 0;  // header + payload
};
inline std::vector<segment_view> read_segments(const std::vector<std::byte>& p) {
  std::vector<segment_view> out;
  packet_header h;
  std::memcpy(&h, p.data(), sizeof h);
  std::size_t at = sizeof h;
  for (std::uint32_t s = 0; s < h.segment_count; ++s) {
    segment_header sh;
    std::memcpy(&sh, p.data() + at, sizeof sh);
    const std::byte* pl = p.data() + at + sizeof sh;
    segment_view v;
    v.layer = sh.layer;
    v.encoding = sh.encoding;
    v.bytes = sizeof sh + sh.payload_bytes;
    if (sh.encoding == sparse_quantized_encoding) {
      std::uint32_t pre[4];
      std::memcpy(pre, pl, sizeof pre);
      v.chunk = pre[0];
      v.chunks = pre[1];
      v.k_full = pre[2];
      v.k_last = pre[3];
      v.scales.resize(v.chunks);
      std::memcpy(v.scales.data(), pl + 16, 4 * v.chunks);
      const std::byte* offs = pl + 16 + pad8(4 * v.chunks);
      v.offsets.resize(sh.count);
      std::memcpy(v.offsets.data(), offs, 2 * sh.count);
      const std::byte* codes = offs + pad8(2 * sh.count);
      for (std::size_t i = 0; i < sh.count; ++i)
        v.codes.push_back(static_cast<std::uint8_t>((static_cast<unsigned>(codes[i / 4]) >> (2 * (i % 4))) & 3u));
    }
    out.push_back(v);
    at += v.bytes;
  }
  return out;
}

// Validation first, then decoding: what a collective does with a peer's packet.
inline void checked_decode(const sparseloco& c, const std::vector<std::byte>& p, std::vector<float>& out) {
  throw_if_invalid(c.validate(p), 1);
  c.decompress_add(p, host_view(out), 1.0f);
}

template <class T>
void put(std::vector<std::byte>& p, std::size_t at, T v) {
  REQUIRE(at + sizeof v <= p.size());
  std::memcpy(p.data() + at, &v, sizeof v);
}

// The test cases stay inside the namespace too: the unit tests compile in unity batches,
// where a using-directive would make these helpers' names clash with other files'.

TEST_CASE("sparseloco: options are validated at construction", "[sparseloco]") {
  const layout lay = chunked_layout();
  for (float d : {0.0f, -0.5f, 1.0001f, std::numeric_limits<float>::quiet_NaN()}) {
    INFO("decay " << d);
    CHECK_THROWS_AS(sparseloco(lay, {.decay = d}), gravac::error);
  }
  for (std::uint32_t ch : {0u, 65537u}) {
    INFO("chunk " << ch);
    CHECK_THROWS_AS(sparseloco(lay, {.chunk = ch}), gravac::error);
  }
  CHECK_NOTHROW(sparseloco(lay, {.decay = 1.0f, .chunk = 1}));
  CHECK_NOTHROW(sparseloco(lay, {.decay = 1e-3f, .chunk = 65536}));
}

TEST_CASE("sparseloco: k per chunk is ceil(fraction * chunk length)", "[sparseloco]") {
  CHECK(sparseloco_kept_count(4096, 1.0 / 64) == 64);
  CHECK(sparseloco_kept_count(100, 0.07) == 7);  // 0.07 * 100 is 7.000000000000001 in double
  CHECK(sparseloco_kept_count(10, 0.15) == 2);   // 1.5 -> 2 (kept_count would round to 2 as well)
  CHECK(sparseloco_kept_count(13, 0.5) == 7);    // 6.5 -> 7
  CHECK(sparseloco_kept_count(1000, 0.0101) == 11);
  CHECK(sparseloco_kept_count(5, 1e-6) == 1);
  CHECK(sparseloco_kept_count(5, 0.0) == 0);
  CHECK(sparseloco_kept_count(5, 1.0) == 5);
  CHECK(sparseloco_kept_count(0, 0.5) == 0);
}

TEST_CASE("sparseloco: per-chunk selection and codes equal a brute-force reference", "[sparseloco]") {
  const layout lay = chunked_layout();
  for (std::uint32_t chunk : {1u, 7u, 64u, 100u, 4096u}) {
    for (double f : {0.01, 0.1, 0.37, 0.999}) {
      INFO("chunk " << chunk << " fraction " << f);
      sparseloco c(lay, {.decay = 0.9f, .chunk = chunk});
      auto g = test::make_data(lay.numel(), 3 + chunk);
      // Ties: equal magnitudes of both signs, and runs of equal values.
      for (std::size_t i = 0; i < g.size(); i += 5) g[i] = (i % 2 ? -1.0f : 1.0f) * 0.75f;
      for (std::size_t i = 1; i < g.size(); i += 11) g[i] = 0.0f;
      auto e = test::make_data(lay.numel(), 99, test::distribution::laplace);
      const auto u = folded(g, e, 0.9f);
      const auto r = run(c, lay, g, e, test::params_for(lay, f));
      const auto segs = read_segments(r.packet);
      REQUIRE(segs.size() == 3);  // the empty layer has none
      std::vector<float> want(lay.numel(), 0.0f);
      for (const auto& s : segs) {
        const layer& l = lay[s.layer];
        REQUIRE(s.encoding == sparse_quantized_encoding);
        REQUIRE(s.chunk == chunk);
        REQUIRE(s.chunks == (l.numel + chunk - 1) / chunk);
        std::size_t at = 0;
        for (std::size_t ch = 0; ch < s.chunks; ++ch) {
          const std::size_t begin = ch * chunk, len = std::min<std::size_t>(chunk, l.numel - begin);
          const std::size_t k = static_cast<std::size_t>(std::ceil(f * static_cast<double>(len) - 1e-9));
          REQUIRE((ch + 1 < s.chunks ? s.k_full : s.k_last) == k);
          const auto uc = std::span<const float>(u).subspan(l.offset + begin, len);
          const auto ref = reference_topk(uc, k);
          float s_ref = 0;
          for (std::size_t j : ref) s_ref = std::max(s_ref, std::fabs(uc[j]));
          CHECK(s.scales[ch] == s_ref);
          for (std::size_t j = 0; j < k; ++j, ++at) {
            REQUIRE(s.offsets[at] == ref[j]);
            const float lv = reference_level(uc[ref[j]], s_ref);
            const float from_code = (s.codes[at] & 1 ? s_ref : s_ref / 3.0f) * (s.codes[at] & 2 ? -1.0f : 1.0f);
            CHECK(from_code == lv);
            want[l.offset + begin + ref[j]] = lv;
          }
        }
      }
      CHECK(r.decoded == want);
    }
  }
}

TEST_CASE("sparseloco: the four levels and exact wire bytes", "[sparseloco]") {
  layout lay;
  lay.add("w", {10000}, layer_kind::dense);
  lay.add("b", {6}, layer_kind::bias_or_norm);
  sparseloco c(lay);  // chunk 4096: chunks of 4096, 4096 and 1808
  std::vector<float> g(lay.numel(), 0.0f);
  // Chunk 0 keeps 64 values (ceil(4096 / 64)); its largest is 3, so the levels are +-3, +-1.
  for (std::size_t i = 0; i < 64; ++i) g[i * 64] = (i % 2 ? -1.0f : 1.0f) * (0.5f + 2.5f * static_cast<float>(i) / 63);
  g[4096] = -6.0f;
  g[4097] = 1.0f;
  std::vector<float> e(lay.numel(), 0.0f);
  auto p = test::params_for(lay, 1.0 / 64);
  p.kept_fraction[1] = 1.0;  // the bias raw
  const auto r = run(c, lay, g, e, p);
  // Packet header 32; the layer: segment header 32, prefix 16, 3 scales 12 -> 16, count =
  // 64 + 64 + ceil(1808 / 64) = 157 offsets 314 -> 320, 157 codes 40 bytes -> 40; the
  // bias raw: 32 + 24.
  CHECK(r.packet.size() == 32 + (32 + 16 + 16 + 320 + 40) + (32 + 24));
  CHECK(r.st.layers[0].kept == 157);
  CHECK(r.st.layers[1].kept == 6);
  for (std::size_t i = 0; i < 64; ++i) {
    const float x = g[i * 64];
    const float m = std::fabs(x) > 2.0f ? 3.0f : 1.0f;  // nearest of 1 and 3, the midpoint 2 to 1
    INFO("value " << x);
    CHECK(r.decoded[i * 64] == (x < 0 ? -m : m));
  }
  CHECK(r.decoded[4096] == -6.0f);
  CHECK(r.decoded[4097] == 2.0f);  // s / 3 with s = 6
  // The chunk has only two non-zeros, so 62 zeros are kept too: with no zero level each is
  // sent as +s/3 and the residual takes -s/3 (error feedback returns it later).
  CHECK(r.decoded[4098] == 2.0f);
  CHECK(e[4098] == -2.0f);
  CHECK(sparse_quantized_level(0, 6.0f) == 2.0f);
  CHECK(sparse_quantized_level(1, 6.0f) == 6.0f);
  CHECK(sparse_quantized_level(2, 6.0f) == -2.0f);
  CHECK(sparse_quantized_level(3, 6.0f) == -6.0f);
  CHECK(sparse_quantized_code(4.0f, 6.0f) == 0);  // the midpoint goes to s / 3
  CHECK(sparse_quantized_code(4.001f, 6.0f) == 1);
  CHECK(sparse_quantized_code(-0.0f, 0.0f) == 0);
  CHECK(c.max_packet_bytes() >= r.packet.size());
}

TEST_CASE("sparseloco: e_after = beta * e_before + g - decoded, bit for bit", "[sparseloco]") {
  const layout lay = chunked_layout();
  for (float beta : {0.95f, 0.5f, 1.0f}) {
    INFO("decay " << beta);
    sparseloco c(lay, {.decay = beta, .chunk = 64});
    std::vector<float> e(lay.numel(), 0.0f);
    for (std::uint64_t step = 0; step < 4; ++step) {
      const auto g = test::make_data(lay.numel(), 40 + step, test::distribution::laplace);
      auto p = test::params_for(lay, 0.05, step);
      if (step == 2) p.kept_fraction[1] = 1.0;  // one layer raw
      const auto before = e;
      const auto r = run(c, lay, g, e, p);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < e.size(); ++i) {
        const float decayed = beta * before[i];
        const float u = g[i] + decayed;
        wrong += e[i] != u - r.decoded[i];
      }
      CHECK(wrong == 0);
      if (step == 2)
        for (std::size_t i = lay[1].offset; i < lay[1].offset + lay[1].numel; ++i) CHECK(e[i] == 0.0f);
    }
  }
}

TEST_CASE("sparseloco: decay 1 is plain error feedback; below 1 the residual forgets", "[sparseloco]") {
  const layout lay = chunked_layout();
  std::vector<double> sent_plus_left(2);
  std::vector<double> total_g(lay.numel(), 0.0);
  for (int which = 0; which < 2; ++which) {
    const float beta = which == 0 ? 1.0f : 0.5f;
    sparseloco c(lay, {.decay = beta, .chunk = 64});
    std::vector<float> e(lay.numel(), 0.0f);
    std::vector<double> sent(lay.numel(), 0.0);
    for (std::uint64_t step = 0; step < 6; ++step) {
      const auto g = test::make_data(lay.numel(), 70 + step);
      const auto before = e;
      const auto r = run(c, lay, g, e, test::params_for(lay, 0.02, step));
      if (beta == 1.0f)
        for (std::size_t i = 0; i < e.size(); ++i) REQUIRE(e[i] == (g[i] + before[i]) - r.decoded[i]);
      for (std::size_t i = 0; i < e.size(); ++i) {
        sent[i] += r.decoded[i];
        if (which == 0) total_g[i] += g[i];
      }
    }
    // With decay 1 nothing is lost: everything sent plus the residual is the sum of the
    // gradients (up to float rounding); with 0.5 what waited in the residual has faded.
    double err = 0;
    for (std::size_t i = 0; i < e.size(); ++i) err = std::max(err, std::fabs(sent[i] + e[i] - total_g[i]));
    sent_plus_left[which] = err;
  }
  CHECK(sent_plus_left[0] < 1e-4);
  CHECK(sent_plus_left[1] > 0.1);
}

TEST_CASE("sparseloco: a layer with a non-finite value sends nothing and keeps it all", "[sparseloco]") {
  const layout lay = chunked_layout();
  sparseloco c(lay, {.chunk = 64});
  auto g = test::make_data(lay.numel(), 5);
  g[lay[3].offset + 500] = std::numeric_limits<float>::quiet_NaN();
  g[lay[0].offset + 3] = std::numeric_limits<float>::infinity();
  std::vector<float> e(lay.numel(), 0.0f);
  auto p = test::params_for(lay, 0.1);
  p.kept_fraction[0] = 1.0;  // a dense layer is held back too, not sent raw with its infinity
  const auto r = run(c, lay, g, e, p);
  CHECK(r.st.non_finite);
  CHECK(r.st.layers[0].kept == 0);
  CHECK(r.st.layers[3].kept == 0);
  CHECK(r.st.layers[1].kept > 0);
  for (float x : r.decoded) CHECK(std::isfinite(x));
  for (std::size_t i : {std::size_t{0}, std::size_t{3}})
    for (std::size_t j = 0; j < lay[i].numel; ++j) {
      const float want = g[lay[i].offset + j];
      const float have = e[lay[i].offset + j];
      CHECK((std::isnan(want) ? std::isnan(have) : have == want));
    }
}

TEST_CASE("sparseloco: malformed packets survive the battery", "[sparseloco][packet]") {
  test::packet_battery<sparseloco>({.decay = 0.9f, .chunk = 16}, -1);
}

TEST_CASE("sparseloco: every malformed class is rejected before the output is touched", "[sparseloco][packet]") {
  layout lay;
  lay.add("a", {37}, layer_kind::dense);    // one chunk of 37: 4 kept
  lay.add("r", {13}, layer_kind::dense);    // raw
  lay.add("t", {1000}, layer_kind::dense);  // 15 chunks of 64 keeping 7, one of 40 keeping 4
  sparseloco c(lay, {.decay = 0.9f, .chunk = 64});
  std::vector<float> e(lay.numel(), 0.0f);
  auto p = test::params_for(lay, 0.1);
  p.kept_fraction[1] = 1.0;
  const auto good = run(c, lay, test::make_data(lay.numel(), 8), e, p).packet;
  // Byte offsets from the documented format: packet header 32, each segment header 32.
  // Segment 0: prefix 16, scale 4 + 4 padding, 4 offsets 8, codes 1 + 7 padding.
  const std::size_t seg0 = 32, pl0 = 64, scales0 = 80, offs0 = 88, codes0 = 96;
  // Segment 1: 13 raw floats, 52 + 4 padding.
  const std::size_t pl1 = 136;
  // Segment 2: prefix 16, 16 scales 64, 109 offsets 218 + 6 padding, codes 28 + 4 padding.
  const std::size_t seg2 = 192, pl2 = 224, scales2 = 240, offs2 = 304, codes2 = 528;
  REQUIRE(good.size() == codes2 + 32);
  const auto segs = read_segments(good);
  REQUIRE(segs.size() == 3);
  REQUIRE(segs[0].k_last == 4);
  REQUIRE(segs[2].k_full == 7);
  REQUIRE(segs[2].k_last == 4);

  struct mutation {
    const char* what;
    std::function<void(std::vector<std::byte>&)> apply;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const auto u16 = [](const std::vector<std::byte>& b, std::size_t at) {
    std::uint16_t v;
    std::memcpy(&v, b.data() + at, 2);
    return v;
  };
  const std::vector<mutation> cases = {
      {"magic", [](auto& b) { put<std::uint32_t>(b, 0, 0x1234); }},
      {"kind", [](auto& b) { put<std::uint8_t>(b, 6, static_cast<std::uint8_t>(packet_kind::sparse)); }},
      {"truncated", [](auto& b) { b.resize(b.size() - 8); }},
      {"truncated in the prefix", [&](auto& b) { b.resize(pl0 + 8); }},
      {"more segments than layers", [](auto& b) { put<std::uint32_t>(b, 8, 4); }},
      {"segment layers not increasing", [&](auto& b) { put<std::uint32_t>(b, seg2, 1); }},
      {"segment numel", [&](auto& b) { put<std::uint64_t>(b, seg0 + 8, 36); }},
      {"index width", [&](auto& b) { put<std::uint8_t>(b, seg0 + 4, 4); }},
      {"encoding", [&](auto& b) { put<std::uint8_t>(b, seg0 + 5, 2); }},
      {"reserved", [&](auto& b) { put<std::uint16_t>(b, seg0 + 6, 1); }},
      {"count", [&](auto& b) { put<std::uint64_t>(b, seg2 + 16, 108); }},
      {"chunk length", [&](auto& b) { put<std::uint32_t>(b, pl0, 32); }},
      {"chunk count", [&](auto& b) { put<std::uint32_t>(b, pl2 + 4, 15); }},
      {"one chunk, two counts", [&](auto& b) { put<std::uint32_t>(b, pl0 + 8, 3); }},
      {"k beyond the short chunk", [&](auto& b) { put<std::uint32_t>(b, pl2 + 12, 41); }},
      {"k_full against count", [&](auto& b) { put<std::uint32_t>(b, pl2 + 8, 6); }},
      {"NaN scale", [&](auto& b) { put<float>(b, scales2 + 4, nan); }},
      {"infinite scale", [&](auto& b) { put<float>(b, scales2 + 60, inf); }},
      {"negative scale", [&](auto& b) { put<float>(b, scales0, -1.0f); }},
      {"negative zero scale", [&](auto& b) { put<float>(b, scales0, -0.0f); }},
      {"scale padding", [&](auto& b) { put<std::uint8_t>(b, scales0 + 4, 1); }},
      {"index out of the one chunk", [&](auto& b) { put<std::uint16_t>(b, offs0 + 2 * 3, 37); }},
      {"index out of a full chunk", [&](auto& b) { put<std::uint16_t>(b, offs2 + 2 * 6, 64); }},
      {"index out of the short chunk", [&](auto& b) { put<std::uint16_t>(b, offs2 + 2 * 108, 40); }},
      {"index repeated", [&](auto& b) { put<std::uint16_t>(b, offs2 + 2, u16(b, offs2)); }},
      {"indices decreasing",
       [&](auto& b) {
         const auto x = u16(b, offs2), y = u16(b, offs2 + 2);
         put<std::uint16_t>(b, offs2, y);
         put<std::uint16_t>(b, offs2 + 2, x);
       }},
      {"index padding", [&](auto& b) { put<std::uint8_t>(b, offs2 + 2 * 109, 1); }},
      {"code padding bits",
       [&](auto& b) {
         put<std::uint8_t>(b, codes2 + 27, static_cast<std::uint8_t>(static_cast<unsigned>(b[codes2 + 27]) | 0x40u));
       }},
      {"code padding bytes", [&](auto& b) { put<std::uint8_t>(b, codes2 + 28, 1); }},
      {"code padding bytes of a one-byte code run", [&](auto& b) { put<std::uint8_t>(b, codes0 + 1, 0x80); }},
      {"raw NaN", [&](auto& b) { put<float>(b, pl1 + 4, nan); }},
      {"raw infinity", [&](auto& b) { put<float>(b, pl1 + 48, -inf); }},
      {"raw padding", [&](auto& b) { put<std::uint32_t>(b, pl1 + 52, 1); }},
      {"trailing bytes", [](auto& b) { b.insert(b.end(), 8, std::byte{0}); }},
  };
  const auto out0 = test::make_data(lay.numel(), 77);
  for (const auto& m : cases) {
    INFO(m.what);
    auto bad = good;
    m.apply(bad);
    REQUIRE(bad != good);
    auto out = out0;
    CHECK_THROWS_AS(checked_decode(c, bad, out), gravac::error);
    CHECK(std::memcmp(out.data(), out0.data(), out.size() * sizeof(float)) == 0);
  }
  auto out = out0;
  CHECK_NOTHROW(checked_decode(c, good, out));
  CHECK(out != out0);
}

TEST_CASE("sparseloco: allgather on thread ranks equals a hand-computed average", "[sparseloco][trainer][threads]") {
  layout lay;
  lay.add("w", {8}, layer_kind::dense);
  using T = trainer<sparseloco, allgather, fixed_policy>;
  T::options opt;
  opt.compressor = {.decay = 0.5f, .chunk = 4};
  opt.policy.kept_fraction = 0.5;  // 2 of each chunk of 4
  // Rank r sends (r + 1) * v: in chunk 0 the kept values are 3 (= s) and -1 (= s/3), in chunk
  // 1 -6 (= s) and 2 (= s/3), so every rank's packet decodes to exactly (r + 1) * kept(v).
  const std::vector<float> v = {3.0f, 0.125f, -1.0f, 0.25f, 0.5f, -6.0f, 0.125f, 2.0f};
  const std::vector<float> kept = {3.0f, 0.0f, -1.0f, 0.0f, 0.0f, -6.0f, 0.0f, 2.0f};
  constexpr int n = 4;
  std::vector<std::vector<float>> out(n), res(n), second(n);
  run_ranks(n, [&](thread_communicator& comm) {
    T t(comm, lay, opt);
    const float m = static_cast<float>(comm.rank() + 1);
    std::vector<float> g(8);
    for (std::size_t i = 0; i < 8; ++i) g[i] = m * v[i];
    t.step(g);
    out[comm.rank()] = g;
    res[comm.rank()].assign(t.residual().begin(), t.residual().end());
    // A second step with g = 0: u = 0.5 * e, the halved leftovers of step one.
    std::vector<float> zero(8, 0.0f);
    t.step(zero);
    second[comm.rank()] = zero;
  });
  // (1 + 2 + 3 + 4) / 4 = 2.5 times the kept values.
  const std::vector<float> want = {7.5f, 0.0f, -2.5f, 0.0f, 0.0f, -15.0f, 0.0f, 5.0f};
  // Step two: rank r's u = (r + 1) * {0, 0.0625, 0, 0.125 | 0.25, 0, 0.0625, 0}; chunk 0
  // keeps 0.125 (= s) and 0.0625 (= s/3 + 1/48: nearer s/3 = 1/24), chunk 1 keeps 0.25 and
  // 0.0625 (nearer s/3 = 1/12). Averaged: 2.5 times that.
  const float a = 2.5f * (0.125f / 3.0f), b = 2.5f * (0.25f / 3.0f);
  const std::vector<float> want2 = {0.0f, a, 0.0f, 2.5f * 0.125f, 2.5f * 0.25f, 0.0f, b, 0.0f};
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(out[r] == want);
    const float m = static_cast<float>(r + 1);
    const std::vector<float> left = {0.0f, m * 0.125f, 0.0f, m * 0.25f, m * 0.5f, 0.0f, m * 0.125f, 0.0f};
    CHECK(res[r] == left);
    for (std::size_t i = 0; i < 8; ++i) CHECK(second[r][i] == Approx(want2[i]).epsilon(1e-6));
    CHECK(second[r] == second[0]);  // the same bits on every rank
  }
}

TEST_CASE("sparseloco: the trainer equals the serial reference and repeats its bits",
          "[sparseloco][trainer][threads]") {
  const layout lay = test::mixed_layout();
  using T = trainer<sparseloco, allgather, fixed_policy>;
  T::options opt;
  opt.compressor = {.decay = 0.9f, .chunk = 64};
  opt.policy.kept_fraction = 0.05;
  opt.seed = 5;
  constexpr int n = 3, steps = 3;
  const auto grad = [&](int s, int r) { return test::make_data(lay.numel(), 500 * s + r + 1); };
  const auto train = [&] {
    std::vector<std::vector<std::vector<float>>> outs(steps, std::vector<std::vector<float>>(n));
    run_ranks(n, [&](thread_communicator& comm) {
      T t(comm, lay, opt);
      for (int s = 0; s < steps; ++s) {
        auto g = grad(s, comm.rank());
        t.step(g);
        outs[s][comm.rank()] = g;
      }
    });
    return outs;
  };
  const auto first = train();
  const auto again = train();
  CHECK(first == again);  // same seed, same bits
  std::vector<std::vector<float>> residuals(n, std::vector<float>(lay.numel(), 0.0f));
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> grads;
    for (int r = 0; r < n; ++r) grads.push_back(grad(s, r));
    const auto ref =
        test::serial_reference<sparseloco>(lay, opt.compressor, test::params_for(lay, 0.05, s, 5), grads, residuals);
    for (int r = 0; r < n; ++r) {
      INFO("step " << s << " rank " << r);
      CHECK(first[s][r] == ref);
    }
  }
}

TEST_CASE("sparseloco: which collectives take it", "[sparseloco][composition]") {
  STATIC_REQUIRE(CollectiveAccepts<allgather, sparseloco>);
  STATIC_REQUIRE(CollectiveAccepts<dense_allreduce, sparseloco>);
  STATIC_REQUIRE(CollectiveAccepts<flexible, sparseloco>);
  STATIC_REQUIRE(detail::composition_verdict<sparseloco, allgather, gravac_policy>() == rejection::none);
  STATIC_REQUIRE(detail::composition_verdict<sparseloco, allreduce_compatible, fixed_policy>() ==
                 rejection::not_summable);
  STATIC_REQUIRE(detail::composition_verdict<sparseloco, compressed_allreduce, fixed_policy>() ==
                 rejection::not_accepted);
}

}  // namespace sparseloco_test
