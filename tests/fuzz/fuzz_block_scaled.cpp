// Fuzzes the block-scaled packet decoders (packet_kind::quantized, encodings mxfp8_e4m3,
// mxfp8_e5m2, mxfp4, nvfp4, fp8_rowwise): every input goes through the validate/decompress_add
// pair of all five compressors, mxfp8 with E4M3 and with E5M2 elements, mxfp4, nvfp4 and
// fp8_rowwise (E4M3 with a float scale per row), so one target (one build, one share of the
// fuzzing time) covers the five segment checks and decoders, and a mutation of the encoding
// byte carries one format's payload into another's check. A packet a compressor accepts must
// decode to finite values in every layer a quantized segment covers (the codecs promise
// nothing non-finite on the wire; raw segments, for layers sent dense, carry any float).
//
// Seeds (--make-corpus): fuzz_packet.hpp's make_corpus for each of the five (e4m3_N,
// e5m2_N, mxfp4_N, nvfp4_N, rowwise_N), and for each a few packets of extreme gradients
// (extreme_*): magnitudes near the float maximum (the largest scales), subnormal ones (the
// smallest), NaN and infinities among them, with stochastic rounding where the format has it.
#include <limits>

#include "fuzz_packet.hpp"

namespace {

using gravac::fuzz::fuzz_layout;

const gravac::mxfp8_options e4m3{.element = gravac::mxfp8_element::e4m3};
const gravac::mxfp8_options e5m2{.element = gravac::mxfp8_element::e5m2};

// Packets of compressor C (options opt, then the same with stochastic rounding where C's
// options have it) over gradients at the edges of float's range, written as <prefix>N.
template <class C>
int make_extreme(const std::string& dir, typename C::options opt, const std::string& prefix) {
  const auto& lay = fuzz_layout();
  constexpr bool has_rounding = requires { opt.rounding; };
  int n = 0;
  for (auto rounding : {gravac::block_rounding::nearest_even, gravac::block_rounding::stochastic}) {
    if constexpr (has_rounding)
      opt.rounding = rounding;
    else if (rounding != gravac::block_rounding::nearest_even)
      break;
    C c(lay, opt);
    std::vector<std::byte> packet(c.max_packet_bytes());
    std::vector<float> e(lay.numel(), 0.0f);
    for (float magnitude : {3.0e38f, 1.0e-39f, 1.0e-44f, 1.0f}) {
      auto g = gravac::test::make_data(lay.numel(), 99 + static_cast<std::uint64_t>(n));
      for (auto& x : g) x *= magnitude;
      if (magnitude == 1.0f)  // non-finite values among ordinary ones
        for (std::size_t i = 0; i < g.size(); i += 7)
          g[i] = i % 3 == 0   ? std::numeric_limits<float>::quiet_NaN()
                 : i % 3 == 1 ? std::numeric_limits<float>::infinity()
                              : -std::numeric_limits<float>::max();
      gravac::compress_stats st;
      const auto p = gravac::fuzz::corpus_params(lay, static_cast<std::uint64_t>(n), 0.5, n % 2 == 1);
      const std::size_t bytes = c.compress(gravac::host_view(g), gravac::host_view(e), p, packet, st);
      const auto pk = std::span<const std::byte>(packet.data(), bytes);
      if (const gravac::validation v = c.validate(pk); !v) {
        std::fprintf(stderr, "corpus: a packet of the compressor does not validate: %s\n", v.reason.c_str());
        return 1;
      }
      gravac::fuzz::write_seed(dir, n++, pk, prefix);
    }
  }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
  return 0;
}

int make(const std::string& dir) {
  using gravac::fuzz::make_corpus;
  const auto& lay = fuzz_layout();
  if (make_corpus<gravac::mxfp8>(dir, e4m3, lay, "e4m3_") != 0 ||
      make_corpus<gravac::mxfp8>(dir, e5m2, lay, "e5m2_") != 0 ||
      make_corpus<gravac::mxfp4>(dir, gravac::mxfp4_options{}, lay, "mxfp4_") != 0 ||
      make_corpus<gravac::nvfp4>(dir, gravac::nvfp4_options{}, lay, "nvfp4_") != 0 ||
      make_corpus<gravac::fp8_rowwise>(dir, gravac::fp8_rowwise_options{}, lay, "rowwise_") != 0)
    return 1;
  if (make_extreme<gravac::mxfp8>(dir, e4m3, "extreme_e4m3_") != 0 ||
      make_extreme<gravac::mxfp8>(dir, e5m2, "extreme_e5m2_") != 0 ||
      make_extreme<gravac::mxfp4>(dir, gravac::mxfp4_options{}, "extreme_mxfp4_") != 0 ||
      make_extreme<gravac::nvfp4>(dir, gravac::nvfp4_options{}, "extreme_nvfp4_") != 0 ||
      make_extreme<gravac::fp8_rowwise>(dir, gravac::fp8_rowwise_options{.row = 48}, "extreme_rowwise_") != 0)
    return 1;
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  gravac::fuzz::corpus_mode(argc, argv, make);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using gravac::fuzz::check_output;
  using gravac::fuzz::decode_one;
  static gravac::mxfp8 mx8_e4m3(fuzz_layout(), e4m3);
  static gravac::mxfp8 mx8_e5m2(fuzz_layout(), e5m2);
  static gravac::mxfp4 mx4(fuzz_layout());
  static gravac::nvfp4 nv4(fuzz_layout());
  static gravac::fp8_rowwise rowwise(fuzz_layout());
  decode_one(mx8_e4m3, data, size, fuzz_layout(), check_output::finite);
  decode_one(mx8_e5m2, data, size, fuzz_layout(), check_output::finite);
  decode_one(mx4, data, size, fuzz_layout(), check_output::finite);
  decode_one(rowwise, data, size, fuzz_layout(), check_output::finite);
  return decode_one(nv4, data, size, fuzz_layout(), check_output::finite);
}
