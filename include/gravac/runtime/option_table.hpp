#pragma once
//! \file option_table.hpp
//! \brief The one table of a runtime method's options: name, type, range or choices,
//! default and a line of doc. The example's command line, gravac-bench, the C ABI and the
//! Python package all read it, so a knob is added in one place.

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "gravac/core/error.hpp"
#include "gravac/runtime/method_config.hpp"

namespace gravac::runtime {

//! The type of an option's value.
enum class option_type : std::uint8_t { boolean, integer, real, choice };

//! One option: how to parse it into a method_config and read it back.
struct option_spec {
  std::string_view name;                          //!< "kept_fraction" (the command line writes --kept-fraction)
  option_type type;                               //!< its type
  double min;                                     //!< least value (integer, real)
  double max;                                     //!< greatest value (integer, real)
  std::string_view choices;                       //!< choice: the values, comma-separated
  std::string_view doc;                           //!< one line
  void (*set)(method_config&, std::string_view);  //!< parses and stores (validated)
  std::string (*get)(const method_config&);       //!< the value, as text set() reads
};

namespace detail {

[[noreturn]] inline void bad_option(std::string_view name, std::string_view value, const std::string& why) {
  throw error(status::invalid_argument, "option " + std::string(name) + ": '" + std::string(value) + "' " + why);
}

inline bool parse_bool(std::string_view name, std::string_view v) {
  if (v == "true" || v == "1" || v == "on" || v == "True") return true;
  if (v == "false" || v == "0" || v == "off" || v == "False") return false;
  bad_option(name, v, "is not a boolean (true or false)");
}

inline double parse_number(std::string_view name, std::string_view v, bool integer, double lo, double hi) {
  double x = 0;
  const auto* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, x);
  if (ec != std::errc{} || p != end || !std::isfinite(x)) bad_option(name, v, "is not a number");
  if (integer && x != std::floor(x)) bad_option(name, v, "is not an integer");
  if (x < lo || x > hi) {
    char b[128];
    std::snprintf(b, sizeof b, "is out of range [%g, %g]", lo, hi);
    bad_option(name, v, b);
  }
  return x;
}

inline std::string_view parse_choice(std::string_view name, std::string_view v, std::string_view choices) {
  std::string_view rest = choices;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const auto c = rest.substr(0, comma);
    if (c == v) return c;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  bad_option(name, v, "is not one of " + std::string(choices));
}

// The shortest text that reads back as \p x.
inline std::string number_text(double x) {
  char b[64];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(b, sizeof b, "%.*g", digits, x);
    if (std::strtod(b, nullptr) == x) break;
  }
  return b;
}

inline constexpr double no_limit = std::numeric_limits<double>::max();

}  // namespace detail

// A numeric or boolean field of method_config. The lambdas are captureless, so the table
// is a static array of plain function pointers. The macros are #undef'd after the table.
//! The option_spec of a real-valued method_config field, in [lo, hi].
#define GRAVAC_RUNTIME_REAL(key, field, lo, hi, text)                                            \
  option_spec {                                                                                  \
    key, option_type::real, lo, hi, "", text,                                                    \
        [](method_config& m, std::string_view v) {                                               \
          m.field = static_cast<decltype(m.field)>(detail::parse_number(key, v, false, lo, hi)); \
        },                                                                                       \
        [](const method_config& m) { return detail::number_text(static_cast<double>(m.field)); } \
  }
//! The option_spec of an integer method_config field, in [lo, hi].
#define GRAVAC_RUNTIME_INT(key, field, lo, hi, text)                                             \
  option_spec {                                                                                  \
    key, option_type::integer, lo, hi, "", text,                                                 \
        [](method_config& m, std::string_view v) {                                               \
          m.field = static_cast<decltype(m.field)>(detail::parse_number(key, v, true, lo, hi));  \
        },                                                                                       \
        [](const method_config& m) { return detail::number_text(static_cast<double>(m.field)); } \
  }
//! The option_spec of a boolean method_config field.
#define GRAVAC_RUNTIME_BOOL(key, field, text)                                               \
  option_spec {                                                                             \
    key, option_type::boolean, 0, 1, "", text,                                              \
        [](method_config& m, std::string_view v) { m.field = detail::parse_bool(key, v); }, \
        [](const method_config& m) { return std::string(m.field ? "true" : "false"); }      \
  }

//! trainer options::bucket_bytes for a bucket of \p mb MiB: 0 (below one byte) is one
//! bucket per layer; 1e12 MiB or more is one bucket.
inline std::size_t bucket_bytes_of(double mb) {
  const double bytes = mb * 1048576.0;
  return bytes < 1 ? bucket_per_layer : mb >= 1e12 ? one_bucket : static_cast<std::size_t>(bytes);
}

//! Every option of a runtime method, in a stable order.
inline std::span<const option_spec> option_table() {
  using detail::no_limit;
  static const option_spec table[] = {
      GRAVAC_RUNTIME_REAL("kept_fraction", fixed.kept_fraction, 1e-9, 1.0, "fixed policy: kept fraction (1 / CF)"),
      option_spec{"bucket_mb", option_type::real, 0.0, 1e12, "",
                  "bucket size in MiB of float gradient (0: one bucket per layer; the model's size or more: one)",
                  [](method_config& m, std::string_view v) {
                    m.bucket_bytes = bucket_bytes_of(detail::parse_number("bucket_mb", v, false, 0.0, 1e12));
                  },
                  [](const method_config& m) {
                    return detail::number_text(m.bucket_bytes == bucket_per_layer ? 0.0
                                               : m.bucket_bytes == one_bucket     ? 1e12
                                                                                  : double(m.bucket_bytes) / 1048576.0);
                  }},
      GRAVAC_RUNTIME_BOOL("topk_whole_buffer", topk.whole_buffer,
                          "topk: select over the whole buffer instead of per layer"),
      GRAVAC_RUNTIME_INT("qsgd_levels", qsgd.levels, 1.0, 32767.0, "qsgd: levels s"),
      GRAVAC_RUNTIME_INT("powersgd_rank", powersgd.rank, 1.0, 1024.0, "powersgd: rank r"),
      GRAVAC_RUNTIME_BOOL("powersgd_warm_start", powersgd.warm_start, "powersgd: start from the last step's Q"),
      option_spec{
          "cast16_format", option_type::choice, 0, 0, "fp16,bf16", "cast16: fp16 or bf16",
          [](method_config& m, std::string_view v) {
            m.cast16.format = detail::parse_choice("cast16_format", v, "fp16,bf16") == "bf16" ? cast16_format::bf16
                                                                                              : cast16_format::fp16;
          },
          [](const method_config& m) { return std::string(m.cast16.format == cast16_format::bf16 ? "bf16" : "fp16"); }},
      option_spec{"ar_rule", option_type::choice, 0, 0, "star,var", "allreduce_compatible: index rank rule",
                  [](method_config& m, std::string_view v) {
                    m.allreduce_compatible.rule = detail::parse_choice("ar_rule", v, "star,var") == "var"
                                                      ? index_rank_rule::var
                                                      : index_rank_rule::star;
                    m.flexible.ar_topk.rule = m.allreduce_compatible.rule;
                  },
                  [](const method_config& m) {
                    return std::string(m.allreduce_compatible.rule == index_rank_rule::var ? "var" : "star");
                  }},
      option_spec{"network_source", option_type::choice, 0, 0, "measured,modeled,profile,fixed",
                  "flexible, moo and adaptive local steps: where alpha and beta come from",
                  [](method_config& m, std::string_view v) {
                    const auto c = detail::parse_choice("network_source", v, "measured,modeled,profile,fixed");
                    m.flexible.source = m.moo.source = m.local.policy.source =
                        c == "measured"  ? network_source::measured
                        : c == "modeled" ? network_source::modeled
                        : c == "profile" ? network_source::profile
                                         : network_source::fixed;
                  },
                  [](const method_config& m) {
                    switch (m.flexible.source) {
                      case network_source::measured:
                        return std::string("measured");
                      case network_source::modeled:
                        return std::string("modeled");
                      case network_source::profile:
                        return std::string("profile");
                      case network_source::fixed:
                        break;
                    }
                    return std::string("fixed");
                  }},
      option_spec{"network_gbps", option_type::real, 1e-6, 1e6, "",
                  "flexible, moo and adaptive local steps: bandwidth of the fixed network (and the measured "
                  "estimate's prior), Gbit/s",
                  [](method_config& m, std::string_view v) {
                    const double beta = 8.0 / (detail::parse_number("network_gbps", v, false, 1e-6, 1e6) * 1e9);
                    m.flexible.network.beta = m.moo.network.beta = m.local.policy.network.beta = beta;
                  },
                  [](const method_config& m) { return detail::number_text(8.0 / m.flexible.network.beta / 1e9); }},
      option_spec{"network_latency_ms", option_type::real, 0.0, 1e6, "",
                  "flexible, moo and adaptive local steps: latency of the fixed network (and the prior), ms",
                  [](method_config& m, std::string_view v) {
                    const double alpha = detail::parse_number("network_latency_ms", v, false, 0.0, 1e6) / 1e3;
                    m.flexible.network.alpha = m.moo.network.alpha = m.local.policy.network.alpha = alpha;
                  },
                  [](const method_config& m) { return detail::number_text(m.flexible.network.alpha * 1e3); }},
      GRAVAC_RUNTIME_REAL("gravac_cf_min", gravac.cf_min, 1.0, 1e9, "gravac: CF_min"),
      GRAVAC_RUNTIME_REAL("gravac_cf_max", gravac.cf_max, 1.0, 1e9, "gravac: CF_max"),
      GRAVAC_RUNTIME_REAL("gravac_eps", gravac.epsilon, 0.0, 1.0, "gravac: least gain sent"),
      GRAVAC_RUNTIME_REAL("gravac_omega", gravac.omega, 0.0, 0.999999, "gravac: CT difference that stops the search"),
      GRAVAC_RUNTIME_INT("gravac_window", gravac.window, 1.0, 1e6, "gravac: gain EWMA window (steps)"),
      GRAVAC_RUNTIME_INT("gravac_warmup", gravac.warmup_steps, 0.0, 1e9, "gravac: warm-up steps at CF_min"),
      GRAVAC_RUNTIME_INT("gravac_period", gravac.period_steps, 0.0, 1e12,
                         "gravac: steps per evaluation period (0: one epoch)"),
      GRAVAC_RUNTIME_BOOL("gravac_dense", gravac.dense_candidate,
                          "gravac: dense among the choices, weighed by the same progress per second"),
      GRAVAC_RUNTIME_INT("gravac_dense_probe", gravac.dense_probe_steps, 2.0, 1e6,
                         "gravac: steps of a probe of the other choice"),
      option_spec{"gravac_time", option_type::choice, 0, 0, "measured,modeled,simulated",
                  "gravac: clock of the throughput",
                  [](method_config& m, std::string_view v) {
                    const auto c = detail::parse_choice("gravac_time", v, "measured,modeled,simulated");
                    m.gravac.time.source = c == "measured"  ? time_source::measured
                                           : c == "modeled" ? time_source::modeled
                                                            : time_source::simulated;
                  },
                  [](const method_config& m) { return std::string(to_string(m.gravac.time.source)); }},
      GRAVAC_RUNTIME_REAL("accordion_low", accordion.low_compression, 1e-9, 1.0,
                          "accordion: kept fraction when critical"),
      GRAVAC_RUNTIME_REAL("accordion_high", accordion.high_compression, 1e-9, 1.0,
                          "accordion: kept fraction otherwise"),
      GRAVAC_RUNTIME_REAL("accordion_eta", accordion.eta, 0.0, no_limit,
                          "accordion: relative norm change that is critical"),
      GRAVAC_RUNTIME_INT("adacomp_conv_bin", adacomp_policy.conv_bin, 1.0, 1e9, "adacomp: L_T of conv layers"),
      GRAVAC_RUNTIME_INT("adacomp_dense_bin", adacomp_policy.dense_bin, 1.0, 1e9, "adacomp: L_T of dense layers"),
      GRAVAC_RUNTIME_INT("moo_warmup", moo.warmup_steps, 0.0, 1e9, "moo: warm-up steps"),
      GRAVAC_RUNTIME_REAL("moo_weight_time", moo.weight_time, 0.0, 1.0,
                          "moo: weight of the time objective (gain: 1 - it)"),
      GRAVAC_RUNTIME_INT("topk_threads", topk.threads, 1.0, 256.0,
                         "topk: threads of the fused pass over large layers (1: none started)"),
      GRAVAC_RUNTIME_REAL("topk_guess_margin", topk.guess_margin, 1e-9, 1.0,
                          "topk: the fused pass's floor, as a fraction of the last threshold"),
      GRAVAC_RUNTIME_INT("threshold_expected_hits", threshold.expected_hits, 1.0, 1e12,
                         "threshold: sampled values expected above the threshold (error about 1/sqrt of it)"),
      GRAVAC_RUNTIME_INT("threshold_run_length", threshold.run_length, 1.0, 1e9,
                         "threshold: neighbours per sampled run"),
      GRAVAC_RUNTIME_REAL("threshold_full_histogram_above", threshold.full_histogram_above, 1e-9, 1.0,
                          "threshold: sample fraction of a layer from which the whole layer's histogram is used"),
      GRAVAC_RUNTIME_BOOL("randomk_rescale", randomk.rescale, "randomk: scale sent values by numel / k (unbiased)"),
      GRAVAC_RUNTIME_INT("qsgd_bucket", qsgd.bucket, 0.0, 4294967232.0,
                         "qsgd: elements per bucket sharing one norm, a multiple of 64 (0: one per layer)"),
      GRAVAC_RUNTIME_INT("terngrad_bucket", terngrad.bucket, 0.0, 4294967232.0,
                         "terngrad: elements per bucket sharing one scale, a multiple of 64 (0: one per layer)"),
      option_spec{
          "mxfp8_element", option_type::choice, 0, 0, "e4m3,e5m2", "mxfp8: element format (FP8 E4M3 or E5M2)",
          [](method_config& m, std::string_view v) {
            m.mxfp8.element = detail::parse_choice("mxfp8_element", v, "e4m3,e5m2") == "e5m2" ? mxfp8_element::e5m2
                                                                                              : mxfp8_element::e4m3;
          },
          [](const method_config& m) { return std::string(m.mxfp8.element == mxfp8_element::e5m2 ? "e5m2" : "e4m3"); }},
      // One knob for the three block-scaled formats: a run names one of them.
      option_spec{"block_rounding", option_type::choice, 0, 0, "nearest_even,stochastic",
                  "mxfp8, mxfp4, nvfp4: rounding of the elements (stochastic: seeded, counter-based)",
                  [](method_config& m, std::string_view v) {
                    const auto r = detail::parse_choice("block_rounding", v, "nearest_even,stochastic") == "stochastic"
                                       ? block_rounding::stochastic
                                       : block_rounding::nearest_even;
                    m.mxfp8.rounding = m.mxfp4.rounding = m.nvfp4.rounding = r;
                  },
                  [](const method_config& m) {
                    return std::string(m.mxfp8.rounding == block_rounding::stochastic ? "stochastic" : "nearest_even");
                  }},
      option_spec{"block_error_feedback", option_type::boolean, 0, 1, "",
                  "mxfp8, mxfp4, nvfp4: keep the coding error in the residual (false: measure what it brings)",
                  [](method_config& m, std::string_view v) {
                    m.mxfp8.error_feedback = m.mxfp4.error_feedback = m.nvfp4.error_feedback =
                        detail::parse_bool("block_error_feedback", v);
                  },
                  [](const method_config& m) { return std::string(m.mxfp8.error_feedback ? "true" : "false"); }},
      GRAVAC_RUNTIME_INT("fp8_row", fp8_rowwise.row, 1.0, 4294967295.0, "fp8_rowwise: elements per float scale"),
      GRAVAC_RUNTIME_BOOL("fp8_rowwise_error_feedback", fp8_rowwise.error_feedback,
                          "fp8_rowwise: keep the coding error in the residual (torchft has none)"),
      GRAVAC_RUNTIME_REAL("sparseloco_decay", sparseloco.decay, 1e-6, 1.0,
                          "sparseloco: beta, the residual's decay before each selection (1: plain error feedback)"),
      GRAVAC_RUNTIME_INT("sparseloco_chunk", sparseloco.chunk, 1.0, 65536.0,
                         "sparseloco: elements per chunk of the top-k and of the 2-bit scale"),
      GRAVAC_RUNTIME_INT("local_period", local.period, 1.0, 1e9,
                         "local steps: H, inner steps per exchange (fixed policy)"),
      GRAVAC_RUNTIME_BOOL("local_adaptive", local.adaptive,
                          "local steps: H and the kept fraction chosen from the network and the compute per step"),
      GRAVAC_RUNTIME_INT("local_max_period", local.policy.max_period, 1.0, 1e6,
                         "local steps, adaptive: the largest H (the staleness bound)"),
      GRAVAC_RUNTIME_REAL("local_compute_s", local.policy.time.compute_s, 0.0, no_limit,
                          "local steps, adaptive: compute seconds per step charged by the simulated clock"),
      option_spec{"local_time", option_type::choice, 0, 0, "measured,simulated",
                  "local steps, adaptive: compute per step measured between exchanges, or local_compute_s",
                  [](method_config& m, std::string_view v) {
                    m.local.policy.time.source =
                        detail::parse_choice("local_time", v, "measured,simulated") == "simulated"
                            ? time_source::simulated
                            : time_source::measured;
                  },
                  [](const method_config& m) { return std::string(to_string(m.local.policy.time.source)); }},
      GRAVAC_RUNTIME_BOOL("local_overlap", local.overlap,
                          "local steps: each exchange runs behind the next round, applied one round late"),
      option_spec{"outer", option_type::choice, 0, 0, "nesterov,averaging",
                  "local steps: the outer optimizer (nesterov: DiLoCo's; averaging: local SGD)",
                  [](method_config& m, std::string_view v) {
                    m.local.outer.kind = detail::parse_choice("outer", v, "nesterov,averaging") == "averaging"
                                             ? outer_kind::averaging
                                             : outer_kind::nesterov;
                  },
                  [](const method_config& m) {
                    return std::string(m.local.outer.kind == outer_kind::averaging ? "averaging" : "nesterov");
                  }},
      GRAVAC_RUNTIME_REAL("outer_lr", local.outer.lr, 1e-9, no_limit, "local steps: outer learning rate (nesterov)"),
      GRAVAC_RUNTIME_REAL("outer_momentum", local.outer.momentum, 0.0, 0.999999,
                          "local steps: outer momentum (nesterov)"),
  };
  return table;
}

#undef GRAVAC_RUNTIME_REAL
#undef GRAVAC_RUNTIME_INT
#undef GRAVAC_RUNTIME_BOOL

//! The option named \p name (nullptr if none).
inline const option_spec* find_option(std::string_view name) {
  for (const auto& o : option_table())
    if (o.name == name) return &o;
  return nullptr;
}

//! Sets option \p name of \p m from \p value; gravac::error (invalid_argument) for an
//! unknown name (listing the known ones) or a value out of its domain.
inline void set_option(method_config& m, std::string_view name, std::string_view value) {
  const option_spec* o = find_option(name);
  if (o == nullptr) {
    std::string known;
    for (const auto& e : option_table()) known += (known.empty() ? "" : ", ") + std::string(e.name);
    throw error(status::invalid_argument, "unknown option '" + std::string(name) + "' (known: " + known + ")");
  }
  o->set(m, value);
}

}  // namespace gravac::runtime
