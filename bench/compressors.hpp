#pragma once
// Every CPU compressor behind one runtime name, for the dynamic benchmarks and the
// gravac-bench tool: a compressor of a layout with its options, its packet buffer and the
// step parameters of a kept fraction, called as compress(g, e).
//
// The compressors' options are those of a gravac::runtime::method_config (m.topk,
// m.threshold, m.qsgd, ...), set by name through the library's option table
// (gravac/runtime/option_table.hpp, compressor_settings::set): the table is the one way to
// set a compressor's knob, here as in the example's command line and the bindings. What is
// the benchmarks' own (ranks, gain candidates, AdaComp's L_T and PowerSGD's rank on every
// layer of a step) stays in compressor_settings. The runtime headers include PowerSGD, so
// the benchmarks need Eigen (gravac::powersgd), as gravac::runtime does.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gravac/compress/adacomp.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/powersgd.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/randomk.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/runtime/method_config.hpp"
#include "gravac/runtime/option_table.hpp"

namespace gravac_bench {

//! The method whose options the benchmarks start from: the library's defaults but for
//! PowerSGD's rank, 4 (powersgd_options: 2). The kept fraction is fixed.kept_fraction
//! (0.01, the table's kept_fraction).
inline gravac::runtime::method_config bench_method() {
  gravac::runtime::method_config m;
  m.powersgd.rank = 4;
  return m;
}

//! The options of every compressor, as the benchmarks and gravac-bench set them.
struct compressor_settings {
  //! Every compressor's options (m.topk, m.threshold, m.qsgd, m.terngrad, m.cast16,
  //! m.randomk, m.adacomp, m.powersgd) and the kept fraction (m.fixed.kept_fraction):
  //! set them by the option table's names with set().
  gravac::runtime::method_config method = bench_method();
  //! QSGD's bucket follows its levels (64 below 127 levels, else 512: both keep the residual
  //! bounded) until qsgd_bucket is set.
  bool qsgd_bucket_by_levels = true;
  std::uint32_t bin_length = 0;         //!< AdaComp's L_T for every layer (0: by layer kind, m.adacomp)
  std::uint32_t rank = 0;               //!< PowerSGD's rank of every layer in a step (0: m.powersgd.rank)
  int ranks = 4;                        //!< ranks the step is for (cast16 divides by it)
  std::vector<double> gain_candidates;  //!< kept fractions whose gain the step reports (a policy's request)

  //! Sets the option table's option \p name (gravac::runtime::set_option: gravac::error,
  //! invalid_argument, for an unknown name or a value out of its range).
  compressor_settings& set(std::string_view name, std::string_view value) {
    gravac::runtime::set_option(method, name, value);
    if (name == "qsgd_bucket") qsgd_bucket_by_levels = false;
    return *this;
  }
  //! The kept fraction of the selection compressors (top-k, threshold, random-k).
  [[nodiscard]] double fraction() const noexcept { return method.fixed.kept_fraction; }
};

//! One compressor ready to step: compress(g, e) with the step counter advanced each call.
struct bench_compressor {
  std::string name;                //!< as given
  bool floor_second_pass = false;  //!< its residual needs a layer-wide scale first (EF-sign)
  bool one_step_residual = false;  //!< its residual is one step's coding error (the quantizers)
  std::function<std::size_t(std::span<float>, std::span<float>)> compress;  //!< returns packet bytes
  std::function<const gravac::compress_stats&()> stats;                     //!< of the last compress
};

//! The names make_compressor accepts: gravac::runtime::compressor_names, identity (no
//! compression, the baseline) last.
inline std::vector<std::string> compressor_names() {
  std::vector<std::string> v;
  for (const auto& n : gravac::runtime::compressor_names)
    if (n.value != gravac::runtime::compressor_id::identity) v.emplace_back(n.name);
  v.emplace_back(gravac::runtime::name_of(gravac::runtime::compressor_names, gravac::runtime::compressor_id::identity));
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
  st->p.kept_fraction.assign(lay.size(), s.fraction());
  st->p.global_fraction = s.fraction();
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

//! The compressor \p name for \p lay with settings \p s: its options are s.method's. Throws
//! std::invalid_argument for an unknown name (listing the known ones) or a kept fraction
//! outside (0, 1], gravac::error for options a compressor rejects.
inline bench_compressor make_compressor(const std::string& name, const gravac::layout& lay,
                                        const compressor_settings& s) {
  using gravac::runtime::compressor_id;
  if (!(s.fraction() > 0.0 && s.fraction() <= 1.0))
    throw std::invalid_argument("fraction must be in (0, 1], got " + std::to_string(s.fraction()));
  const gravac::runtime::method_config& m = s.method;
  for (const auto& n : gravac::runtime::compressor_names) {
    if (n.name != name) continue;
    switch (n.value) {
      case compressor_id::identity:
        return detail::wrap<gravac::identity>(name, lay, m.identity, s);
      case compressor_id::topk:
        return detail::wrap<gravac::topk>(name, lay, m.topk, s);
      case compressor_id::randomk:
        return detail::wrap<gravac::randomk>(name, lay, m.randomk, s);
      case compressor_id::threshold:
        return detail::wrap<gravac::threshold>(name, lay, m.threshold, s);
      case compressor_id::adacomp:
        return detail::wrap<gravac::adacomp>(name, lay, m.adacomp, s);
      case compressor_id::qsgd: {
        gravac::qsgd_options o = m.qsgd;
        if (s.qsgd_bucket_by_levels) o.bucket = o.levels < 127 ? 64u : 512u;
        return detail::wrap<gravac::qsgd>(name, lay, o, s);
      }
      case compressor_id::terngrad:
        return detail::wrap<gravac::terngrad>(name, lay, m.terngrad, s);
      case compressor_id::sign:
        return detail::wrap<gravac::sign>(name, lay, m.sign, s);
      case compressor_id::cast16:
        return detail::wrap<gravac::cast16>(name, lay, m.cast16, s);
      case compressor_id::powersgd:
        return detail::wrap<gravac::powersgd>(name, lay, m.powersgd, s);
    }
  }
  std::string known;
  for (const auto& n : compressor_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown compressor '" + name + "' (known: " + known + ")");
}

}  // namespace gravac_bench
