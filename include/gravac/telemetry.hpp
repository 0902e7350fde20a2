#pragma once
//! \file telemetry.hpp
//! \brief Writes step reports as CSV or JSON lines through a sink the user can replace.
//!
//! \code
//! std::ofstream file("steps.csv");
//! gravac::csv_sink sink(file, lay);          // header line now, one row per step
//! for (...) { backward(grads); sink.write(t.step(grads)); }
//! \endcode
//!
//! Sinks format numbers with std::to_chars into a buffer on the stack, so writing a
//! report allocates nothing beyond what the stream itself does.

#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"
#include "gravac/trainer/detail/telemetry_format.hpp"

namespace gravac {

//! Where step reports go. Derive from it to send reports elsewhere (a metrics server,
//! a ring buffer); the trainer itself never calls a sink, the training loop does.
class telemetry_sink {
 public:
  virtual ~telemetry_sink() = default;
  //! Records one step's report.
  virtual void write(const step_report& report) = 0;
  //! Pushes buffered output to its destination (default: nothing to do).
  virtual void flush() {}
};

//! The fixed columns of csv_sink, in order. Per-layer columns follow when the sink
//! was given a layout: `kept_fraction:<layer>` for every layer, then `grad_norm:<layer>`.
inline constexpr std::array<std::string_view, 14> csv_columns = {"step",
                                                                 "skipped",
                                                                 "collective",
                                                                 "gain",
                                                                 "bytes_sent",
                                                                 "dense_bytes",
                                                                 "compress_s",
                                                                 "communicate_s",
                                                                 "decompress_s",
                                                                 "modeled_communicate_s",
                                                                 "iteration_s",
                                                                 "statistics_synchronized",
                                                                 "mean_kept_fraction",
                                                                 "fallback"};

//! Writes one CSV row per step, after a header line written at construction.
//!
//! Columns are csv_columns in order; mean_kept_fraction is the element-weighted kept
//! fraction over the layers (when given a layout; otherwise the plain mean). Non-finite
//! numbers are written as nan, inf and -inf.
class csv_sink final : public telemetry_sink {
 public:
  //! A sink with the fixed columns only; writes the header line now when \p header.
  explicit csv_sink(std::ostream& os, bool header = true) : os_(&os) {
    if (header) write_header();
  }
  //! A sink that also writes per-layer kept fractions and gradient norms of \p lay.
  csv_sink(std::ostream& os, const layout& lay, bool header = true) : os_(&os), layers_(lay.size()) {
    weights_.reserve(lay.size());
    for (const auto& l : lay.layers()) weights_.push_back(static_cast<double>(l.numel));
    if (header) write_header(&lay);
  }

  //! Writes one row; throws gravac::error when the report's layer count differs from
  //! the layout's or the stream fails.
  void write(const step_report& r) override {
    if (layers_ > 0)
      require(r.kept_fraction.size() == layers_ && r.layer_grad_norm.size() == layers_,
              "csv_sink: the report's layer count differs from the layout given to the sink");
    std::ostream& os = *os_;
    detail::put_integer(os, r.step);
    os << (r.skipped ? ",1," : ",0,") << to_string(r.collective) << ',';
    number(r.gain);
    os << ',';
    detail::put_integer(os, r.bytes_sent);
    os << ',';
    detail::put_integer(os, r.dense_bytes);
    for (double v : {r.compress_s, r.communicate_s, r.decompress_s, r.modeled_communicate_s, r.iteration_s}) field(v);
    os << (r.statistics_synchronized ? ",1," : ",0,");
    number(mean_kept(r));
    os << ',' << to_string(r.fallback);
    if (layers_ > 0) {
      for (double v : r.kept_fraction) field(v);
      for (double v : r.layer_grad_norm) field(v);
    }
    os << '\n';
    detail::check_stream(os, "csv_sink");
  }
  //! Flushes the stream.
  void flush() override { os_->flush(); }

 private:
  void write_header(const layout* lay = nullptr) {
    std::ostream& os = *os_;
    for (std::size_t i = 0; i < csv_columns.size(); ++i) os << (i ? "," : "") << csv_columns[i];
    if (lay) {
      for (const auto& l : lay->layers()) quoted("kept_fraction:", l.name);
      for (const auto& l : lay->layers()) quoted("grad_norm:", l.name);
    }
    os << '\n';
    detail::check_stream(os, "csv_sink");
  }
  // RFC 4180: a field with a comma, quote or line break is quoted, quotes doubled.
  void quoted(std::string_view prefix, std::string_view name) {
    std::ostream& os = *os_;
    const bool quote = name.find_first_of(",\"\r\n") != std::string_view::npos;
    os << ',' << (quote ? "\"" : "") << prefix;
    for (char c : name) os << (c == '"' ? "\"\"" : std::string_view(&c, 1));
    if (quote) os << '"';
  }
  void number(double v) { detail::put_number(*os_, v, "nan", "inf", "-inf"); }
  void field(double v) {
    *os_ << ',';
    number(v);
  }
  double mean_kept(const step_report& r) const {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < r.kept_fraction.size(); ++i) {
      const double w = i < weights_.size() ? weights_[i] : 1.0;
      num += w * r.kept_fraction[i];
      den += w;
    }
    return den > 0 ? num / den : 0.0;
  }

  std::ostream* os_;
  std::size_t layers_ = 0;
  std::vector<double> weights_;
};

//! Writes one JSON object per line and step. Keys: step, skipped, collective, gain,
//! bytes_sent, dense_bytes, compress_s, communicate_s, decompress_s,
//! modeled_communicate_s, iteration_s, statistics_synchronized, fallback, then the arrays
//! kept_fraction, layer_grad_norm (layout order), gain_candidates and gain_curve.
//! Non-finite numbers are written as null (JSON has no NaN).
class jsonl_sink final : public telemetry_sink {
 public:
  //! A sink writing to \p os.
  explicit jsonl_sink(std::ostream& os) : os_(&os) {}

  //! Writes one line; throws gravac::error when the stream fails.
  void write(const step_report& r) override {
    std::ostream& os = *os_;
    os << "{\"step\":";
    detail::put_integer(os, r.step);
    os << ",\"skipped\":" << (r.skipped ? "true" : "false") << ",\"collective\":\"" << to_string(r.collective)
       << "\",\"gain\":";
    number(r.gain);
    os << ",\"bytes_sent\":";
    detail::put_integer(os, r.bytes_sent);
    os << ",\"dense_bytes\":";
    detail::put_integer(os, r.dense_bytes);
    key_number("compress_s", r.compress_s);
    key_number("communicate_s", r.communicate_s);
    key_number("decompress_s", r.decompress_s);
    key_number("modeled_communicate_s", r.modeled_communicate_s);
    key_number("iteration_s", r.iteration_s);
    os << ",\"statistics_synchronized\":" << (r.statistics_synchronized ? "true" : "false");
    os << ",\"fallback\":\"" << to_string(r.fallback) << '"';
    array("kept_fraction", r.kept_fraction);
    array("layer_grad_norm", r.layer_grad_norm);
    array("gain_candidates", r.gain_candidates);
    array("gain_curve", r.gain_curve);
    os << "}\n";
    detail::check_stream(os, "jsonl_sink");
  }
  //! Flushes the stream.
  void flush() override { os_->flush(); }

 private:
  void number(double v) { detail::put_number(*os_, v, "null", "null", "null"); }
  void key_number(std::string_view key, double v) {
    *os_ << ",\"" << key << "\":";
    number(v);
  }
  void array(std::string_view key, std::span<const double> values) {
    std::ostream& os = *os_;
    os << ",\"" << key << "\":[";
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (i) os << ',';
      number(values[i]);
    }
    os << ']';
  }

  std::ostream* os_;
};

}  // namespace gravac
