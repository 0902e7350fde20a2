// Fuzzes the SparseLoCo packet decoder (packet_kind::sparse_quantized: per-chunk offsets,
// 2-bit codes and a scale per chunk, with raw segments mixed in). Chunks of 16 elements, so
// the fuzz layout's layers hold several chunks and a short last one. A packet that validates
// must decode to finite values everywhere: the compressor never sends a non-finite value
// (raw segments included), and validation refuses one.
//
// Seeds (--make-corpus): fuzz_packet.hpp's make_corpus (seed_N), and packets of extreme
// gradients (extreme_N): magnitudes near the float maximum and subnormal ones, and NaN and
// infinities among ordinary values (those layers are sent empty).
#include <limits>

#include "fuzz_packet.hpp"
#include "gravac/compress/sparseloco.hpp"

namespace {

using gravac::fuzz::fuzz_layout;

const gravac::sparseloco_options options{.decay = 0.9f, .chunk = 16};

int make_extreme(const std::string& dir) {
  const auto& lay = fuzz_layout();
  gravac::sparseloco c(lay, options);
  std::vector<std::byte> packet(c.max_packet_bytes());
  std::vector<float> e(lay.numel(), 0.0f);
  int n = 0;
  for (float magnitude : {3.0e38f, 1.0e-39f, 1.0e-44f, 1.0f}) {
    auto g = gravac::test::make_data(lay.numel(), 99 + static_cast<std::uint64_t>(n));
    for (auto& x : g) x *= magnitude;
    if (magnitude == 1.0f)
      for (std::size_t i = 0; i < g.size(); i += 97)
        g[i] = i % 2 ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::infinity();
    gravac::compress_stats st;
    const auto p = gravac::fuzz::corpus_params(lay, static_cast<std::uint64_t>(n), 0.25, n % 2 == 1);
    const std::size_t bytes = c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, st);
    const auto pk = std::span<const std::byte>(packet.data(), bytes);
    if (const gravac::validation v = c.validate(pk); !v) {
      std::fprintf(stderr, "corpus: a packet of the compressor does not validate: %s\n", v.reason.c_str());
      return 1;
    }
    gravac::fuzz::write_seed(dir, n++, pk, "extreme_");
  }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
  return 0;
}

int make(const std::string& dir) {
  if (gravac::fuzz::make_corpus<gravac::sparseloco>(dir, options) != 0) return 1;
  return make_extreme(dir);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  gravac::fuzz::corpus_mode(argc, argv, make);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static gravac::sparseloco c(fuzz_layout(), options);
  const int r = gravac::fuzz::decode_one(c, data, size, fuzz_layout(), gravac::fuzz::check_output::finite);
  // Raw segments too: validation refuses a non-finite raw value.
  const auto bytes = std::as_bytes(std::span<const std::uint8_t>(data, size));
  if (c.validate(bytes)) {
    std::vector<float> out(fuzz_layout().numel(), 0.0f);
    c.decompress_add(bytes, gravac::host_view(out), 1.0f);
    for (const float x : out)
      if (!std::isfinite(x)) std::abort();
  }
  return r;
}
