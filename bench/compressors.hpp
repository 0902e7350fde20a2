#pragma once
// Every CPU compressor behind one runtime name, for the dynamic benchmarks and the
// gravac-bench tool: a compressor of a layout with its options, its packet buffer and the
// step parameters of a kept fraction, called as compress(g, e).

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/randomk.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"
#if __has_include(<Eigen/Core>)
#include "gravac/compress/powersgd.hpp"
#define GRAVAC_BENCH_HAS_POWERSGD 1
#endif

namespace gravac_bench {

//! The options of every compressor, as gravac-bench reads them (0: the compressor's default).
struct compressor_settings {
  double fraction = 0.01;               //!< kept fraction (top-k, threshold, random-k)
  unsigned threads = 1;                 //!< top-k's threads for the fused pass
  bool whole_buffer = false;            //!< top-k over the whole buffer instead of per layer
  float guess_margin = 0;               //!< top-k's floor margin (0: default)
  std::size_t expected_hits = 0;        //!< threshold's sample size (0: default)
  std::uint32_t levels = 0;             //!< QSGD's s (0: 127)
  std::uint32_t bucket = 0;             //!< QSGD / TernGrad bucket (0: 512; QSGD with levels 7 and no bucket: 64)
  bool bf16 = false;                    //!< cast16 format bf16 instead of fp16
  std::uint32_t bin_length = 0;         //!< AdaComp's L_T for every layer (0: by layer kind)
  std::uint32_t rank = 0;               //!< PowerSGD's rank (0: 4)
  int ranks = 4;                        //!< ranks the step is for (cast16 divides by it)
  std::vector<double> gain_candidates;  //!< kept fractions whose gain the step reports (a policy's request)
};

//! One compressor ready to step: compress(g, e) with the step counter advanced each call.
struct bench_compressor {
  std::string name;                //!< as given
  bool floor_second_pass = false;  //!< its residual needs a layer-wide scale first (EF-sign)
  bool one_step_residual = false;  //!< its residual is one step's coding error (the quantizers)
  std::function<std::size_t(std::span<float>, std::span<float>)> compress;  //!< returns packet bytes
  std::function<const gravac::compress_stats&()> stats;                     //!< of the last compress
};

//! The names make_compressor accepts.
inline std::vector<std::string> compressor_names() {
  std::vector<std::string> v{"topk",     "threshold", "randomk", "adacomp", "qsgd",
                             "terngrad", "sign",      "cast16",  "identity"};
#ifdef GRAVAC_BENCH_HAS_POWERSGD
  v.push_back("powersgd");
#endif
  return v;
}

namespace detail {
template <class C>
bench_compressor wrap(std::string name, const gravac::layout& lay, const typename C::options& opt,
                      const compressor_settings& s) {
  struct state {
    C c;
    std::vector<std::byte> packet;
    gravac::step_params p;
    gravac::compress_stats st;
    state(const gravac::layout& l, const typename C::options& o) : c(l, o), packet(c.max_packet_bytes()) {}
  };
  auto st = std::make_shared<state>(lay, opt);
  st->p.kept_fraction.assign(lay.size(), s.fraction);
  st->p.global_fraction = s.fraction;
  st->p.ranks = s.ranks;
  st->p.seed = 1;
  st->p.gain_candidates = s.gain_candidates;
  // The compressor's own step settings: AdaComp's L_T, PowerSGD's rank, on every layer.
  if constexpr (requires { st->c.set_step_settings(gravac::adacomp_settings{}); })
    st->c.set_step_settings(gravac::adacomp_settings{std::vector<std::uint32_t>(lay.size(), s.bin_length)});
  if constexpr (requires { st->c.set_step_settings(gravac::powersgd_settings{}); })
    if (s.rank != 0) st->c.set_step_settings(gravac::powersgd_settings{std::vector<std::uint32_t>(lay.size(), s.rank)});
  bench_compressor b;
  b.name = std::move(name);
  b.floor_second_pass = std::is_same_v<C, gravac::sign>;
  b.one_step_residual = std::is_same_v<C, gravac::sign> || std::is_same_v<C, gravac::qsgd> ||
                        std::is_same_v<C, gravac::terngrad> || std::is_same_v<C, gravac::cast16> ||
                        std::is_same_v<C, gravac::identity>;
  b.compress = [st](std::span<float> g, std::span<float> e) {
    const std::size_t bytes = st->c.compress(gravac::host_view(g), gravac::host_view(e), st->p, st->packet, st->st);
    ++st->p.step;
    return bytes;
  };
  b.stats = [st]() -> const gravac::compress_stats& { return st->st; };
  return b;
}
}  // namespace detail

//! The compressor \p name for \p lay with settings \p s. Throws std::invalid_argument for
//! an unknown name (listing the known ones) or settings a compressor rejects.
inline bench_compressor make_compressor(const std::string& name, const gravac::layout& lay,
                                        const compressor_settings& s) {
  if (!(s.fraction > 0.0 && s.fraction <= 1.0))
    throw std::invalid_argument("fraction must be in (0, 1], got " + std::to_string(s.fraction));
  if (name == "topk") {
    gravac::topk_options o{.whole_buffer = s.whole_buffer, .threads = s.threads};
    if (s.guess_margin != 0) o.guess_margin = s.guess_margin;
    return detail::wrap<gravac::topk>(name, lay, o, s);
  }
  if (name == "threshold") {
    gravac::threshold_options o;
    if (s.expected_hits != 0) o.expected_hits = s.expected_hits;
    return detail::wrap<gravac::threshold>(name, lay, o, s);
  }
  if (name == "randomk") return detail::wrap<gravac::randomk>(name, lay, {}, s);
  if (name == "adacomp") return detail::wrap<gravac::adacomp>(name, lay, {}, s);
  if (name == "qsgd") {
    gravac::qsgd_options o;
    if (s.levels != 0) o.levels = s.levels;
    o.bucket = s.bucket != 0 ? s.bucket : (o.levels < 127 ? 64u : 512u);
    return detail::wrap<gravac::qsgd>(name, lay, o, s);
  }
  if (name == "terngrad") {
    gravac::terngrad_options o;
    if (s.bucket != 0) o.bucket = s.bucket;
    return detail::wrap<gravac::terngrad>(name, lay, o, s);
  }
  if (name == "sign") return detail::wrap<gravac::sign>(name, lay, {}, s);
  if (name == "cast16")
    return detail::wrap<gravac::cast16>(
        name, lay, gravac::cast16_options{.format = s.bf16 ? gravac::cast16_format::bf16 : gravac::cast16_format::fp16},
        s);
  if (name == "identity") return detail::wrap<gravac::identity>(name, lay, {}, s);
#ifdef GRAVAC_BENCH_HAS_POWERSGD
  if (name == "powersgd") return detail::wrap<gravac::powersgd>(name, lay, {.rank = s.rank != 0 ? s.rank : 4u}, s);
#endif
  std::string known;
  for (const auto& n : compressor_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown compressor '" + name + "' (known: " + known + ")");
}

}  // namespace gravac_bench
