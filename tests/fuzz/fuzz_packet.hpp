#pragma once
// The shared body of gravac's packet fuzzers. Each fuzz_<name>.cpp names one compressor
// (whose validate/decompress_add pair is the decoder of one packet kind) with
// GRAVAC_FUZZ_COMPRESSOR; this header turns it into
//  - LLVMFuzzerTestOneInput: validate the untrusted bytes and, only when they are valid,
//    decompress them into a heap buffer of exactly the layout's size, so AddressSanitizer
//    sees any read or write out of bounds and UBSan any undefined arithmetic (and, for a
//    decoder that promises finite output, check_finite, that every layer a coded segment
//    decoded into is finite);
//  - a seed-corpus writer: `fuzz_<name> --make-corpus=DIR` compresses a range of
//    gradients (dense, sparse, mixed per-layer fractions, zeros, heavy tails) and writes
//    every packet as a file, then exits without fuzzing.
// The layout is fixed (the packet header carries its hash): tests' mixed_layout, which has
// a conv, a dense, a 1-D bias, an empty layer and odd sizes not divisible by bin lengths.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gravac_test_util.hpp"

namespace gravac::fuzz {

inline const layout& fuzz_layout() {
  static const layout lay = test::mixed_layout();
  return lay;
}

// What decode_one checks of a decoded packet beyond memory safety.
enum class check_output : bool {
  none,    // raw or coded values may be anything a float holds
  finite,  // coded (non-raw) segments decode to finite values (raw ones carry any float)
};

// Decodes one untrusted packet; returns 0 (libFuzzer's "keep going").
template <class C>
int decode_one(C& c, const std::uint8_t* data, std::size_t size, const layout& lay = fuzz_layout(),
               check_output check = check_output::none) {
  const auto bytes = std::as_bytes(std::span<const std::uint8_t>(data, size));
  const validation v = c.validate(bytes);
  if (!v) {
    if (v.reason.empty()) std::abort();  // a rejection must say why
    return 0;
  }
  std::vector<float> out(lay.numel(), 0.0f);
  c.decompress_add(bytes, host_view(out), 0.25f);
  if (check == check_output::finite)
    for_each_segment(bytes, [&](const segment_header& sh, std::span<const std::byte>) {
      if (sh.encoding == raw_encoding) return;
      const layer& l = lay[sh.layer];
      for (std::size_t i = 0; i < l.numel; ++i)
        if (!std::isfinite(out[l.offset + i])) std::abort();
    });
  // Validation must be a pure function of the bytes.
  if (!c.validate(bytes)) std::abort();
  return 0;
}

// Step parameters filled the way the trainer fills them.
inline step_params corpus_params(const layout& lay, std::uint64_t step, double fraction, bool mixed) {
  step_params p;
  p.step = step;
  p.seed = 0x5eed + step;
  p.kept_fraction.assign(lay.size(), fraction);
  if (mixed)
    for (std::size_t i = 0; i < lay.size(); i += 2) p.kept_fraction[i] = dense_fraction;
  p.global_fraction = fraction;
  p.ranks = 4;
  return p;
}

inline void write_seed(const std::string& dir, int n, std::span<const std::byte> bytes,
                       const std::string& prefix = "seed_") {
  const std::string path = dir + "/" + prefix + std::to_string(n);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(2);
  }
  std::fclose(f);
}

// Writes valid packets of compressor C into dir (which must exist), named prefix + number;
// every packet is validated first, so a seed that does not validate is a bug in the compressor.
template <class C>
int make_corpus(const std::string& dir, const typename C::options& opt, const layout& lay = fuzz_layout(),
                const std::string& prefix = "seed_") {
  C c(lay, opt);
  std::vector<std::byte> packet(c.max_packet_bytes());
  std::vector<float> e(lay.numel(), 0.0f);
  int n = 0;
  const test::distribution dists[] = {test::distribution::gaussian, test::distribution::laplace,
                                      test::distribution::all_equal, test::distribution::narrow};
  std::uint64_t step = 0;
  for (double f : {0.001, 0.01, 0.1, 0.5, 1.0})
    for (bool mixed : {false, true})
      for (auto d : dists) {
        auto g = test::make_data(lay.numel(), 17 + step, d);
        if (step % 7 == 3) std::fill(g.begin(), g.end(), 0.0f);
        compress_stats st;
        const auto p = corpus_params(lay, step, f, mixed);
        const std::size_t bytes = c.compress(host_view(g), host_view(e), p, packet, st);
        const auto pk = std::span<const std::byte>(packet.data(), bytes);
        const validation v = c.validate(pk);
        if (!v) {
          std::fprintf(stderr, "corpus: a packet of the compressor does not validate: %s\n", v.reason.c_str());
          return 1;
        }
        write_seed(dir, n++, pk, prefix);
        ++step;
      }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
  return 0;
}

// Handles --make-corpus=DIR from LLVMFuzzerInitialize: writes the corpus and exits.
template <class Make>
void corpus_mode(int* argc, char*** argv, Make&& make) {
  const std::string flag = "--make-corpus=";
  for (int i = 1; i < *argc; ++i) {
    const std::string a = (*argv)[i];
    if (a.rfind(flag, 0) == 0) std::exit(make(a.substr(flag.size())));
  }
}

}  // namespace gravac::fuzz

// One fuzz target for compressor type C built with options expression OPT, on the layout
// expression LAYOUT (a `const gravac::layout&` that outlives the target).
#define GRAVAC_FUZZ_COMPRESSOR_ON(C, OPT, LAYOUT)                                                                     \
  extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {                                                      \
    gravac::fuzz::corpus_mode(argc, argv,                                                                             \
                              [](const std::string& dir) { return gravac::fuzz::make_corpus<C>(dir, OPT, LAYOUT); }); \
    return 0;                                                                                                         \
  }                                                                                                                   \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {                                 \
    static C c(LAYOUT, OPT);                                                                                          \
    return gravac::fuzz::decode_one(c, data, size, LAYOUT);                                                           \
  }

// One fuzz target for compressor type C built with options expression OPT.
#define GRAVAC_FUZZ_COMPRESSOR(C, OPT)                                                                        \
  extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {                                              \
    gravac::fuzz::corpus_mode(argc, argv,                                                                     \
                              [](const std::string& dir) { return gravac::fuzz::make_corpus<C>(dir, OPT); }); \
    return 0;                                                                                                 \
  }                                                                                                           \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {                         \
    static C c(gravac::fuzz::fuzz_layout(), OPT);                                                             \
    return gravac::fuzz::decode_one(c, data, size);                                                           \
  }
