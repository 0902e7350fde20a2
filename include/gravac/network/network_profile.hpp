#pragma once
//! \file network_profile.hpp
//! \brief How a simulated network's latency and bandwidth change over a run: constant,
//! a (cyclic) step schedule, or a trace read from a CSV file. Indexed by training step
//! or by the virtual time of the simulated clock.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/network/cost_model.hpp"

namespace gravac {

//! What a profile is indexed by.
enum class profile_index : std::uint8_t {
  step,  //!< the training step (simulated_communicator::set_step)
  time,  //!< the virtual time of the simulated clock, in seconds
};

//! One phase of a schedule: \p length steps (or seconds) of network \p net.
struct network_phase {
  double length = 1;     //!< how long the phase lasts, in steps or seconds (> 0)
  network_params net{};  //!< the network during the phase
};

//! A piecewise-constant network over steps or virtual time. Cheap to copy.
class network_profile {
 public:
  //! The same network for ever.
  static network_profile constant(const network_params& net) {
    network_profile p;
    p.starts_ = {0.0};
    p.nets_ = {net};
    return p;
  }

  //! Phases one after the other, indexed by \p by; when \p cyclic, the sequence repeats
  //! (e.g. {fast for 3 epochs, slow for 3 epochs}), otherwise the last phase holds.
  static network_profile schedule(const std::vector<network_phase>& phases, profile_index by, bool cyclic = true) {
    require(!phases.empty(), "network_profile: a schedule needs at least one phase");
    network_profile p;
    p.by_ = by;
    double at = 0;
    for (const auto& ph : phases) {
      require(ph.length > 0 && std::isfinite(ph.length), "network_profile: every phase length must be finite and > 0");
      check(ph.net, "network_profile: schedule phase");
      p.starts_.push_back(at);
      p.nets_.push_back(ph.net);
      at += ph.length;
    }
    p.period_ = cyclic ? at : 0.0;
    return p;
  }

  //! The schedule of the flexible-communication paper: latency 1 ms and 25 Gbit/s, then
  //! 32 ms and 1 Gbit/s, then back, each for \p phase_steps steps.
  static network_profile fast_slow_schedule(double phase_steps) {
    return schedule(
        {{phase_steps, network_params::from_gbps(1e-3, 25)}, {phase_steps, network_params::from_gbps(32e-3, 1)}},
        profile_index::step, true);
  }

  //! Parses a trace: a header naming the columns, then one row per change, e.g.
  //! \code
  //! # comments and blank lines are ignored
  //! step,latency_ms,bandwidth_gbps
  //! 0,1,25
  //! 500,32,1
  //! \endcode
  //! Index column: `step` or `time_s`. Latency: `latency_s`, `latency_ms` or `latency_us`.
  //! Bandwidth: `bandwidth_gbps` or `bandwidth_bytes_per_s`. The first row must start at 0
  //! and rows must be strictly increasing; each row holds until the next one, the last for
  //! ever. Throws gravac::error(invalid_argument) naming \p source and the line.
  static network_profile parse_csv(std::string_view text, std::string_view source = "trace") {
    network_profile p;
    const std::string src(source);
    std::size_t line_no = 0;
    bool header = false;
    double lat_unit = 1, bw_mode = 0;  // bw_mode: Gbit/s (0) or bytes/s (1)
    std::size_t pos = 0;
    while (pos <= text.size()) {
      const std::size_t end = std::min(text.find('\n', pos), text.size());
      std::string_view line = text.substr(pos, end - pos);
      pos = end + 1;
      ++line_no;
      line = trim(line);
      if (line.empty() || line.front() == '#') {
        if (end == text.size()) break;
        continue;
      }
      std::string_view cols[3];
      if (!split3(line, cols))
        fail(src, line_no, "expected 3 comma-separated columns, got '" + std::string(line) + "'");
      if (!header) {
        if (cols[0] == "step")
          p.by_ = profile_index::step;
        else if (cols[0] == "time_s")
          p.by_ = profile_index::time;
        else
          fail(src, line_no, "first column must be 'step' or 'time_s', got '" + std::string(cols[0]) + "'");
        if (cols[1] == "latency_s")
          lat_unit = 1;
        else if (cols[1] == "latency_ms")
          lat_unit = 1e-3;
        else if (cols[1] == "latency_us")
          lat_unit = 1e-6;
        else
          fail(src, line_no,
               "second column must be latency_s, latency_ms or latency_us, got '" + std::string(cols[1]) + "'");
        if (cols[2] == "bandwidth_gbps")
          bw_mode = 0;
        else if (cols[2] == "bandwidth_bytes_per_s")
          bw_mode = 1;
        else
          fail(src, line_no,
               "third column must be bandwidth_gbps or bandwidth_bytes_per_s, got '" + std::string(cols[2]) + "'");
        header = true;
      } else {
        double v[3];
        for (int c = 0; c < 3; ++c)
          if (!to_double(cols[c], v[c])) fail(src, line_no, "not a number: '" + std::string(cols[c]) + "'");
        if (!(v[0] >= 0)) fail(src, line_no, "the index must be >= 0");
        if (p.starts_.empty() && v[0] != 0) fail(src, line_no, "the first row must start at 0");
        if (!p.starts_.empty() && !(v[0] > p.starts_.back())) fail(src, line_no, "rows must be strictly increasing");
        if (!(v[1] >= 0)) fail(src, line_no, "latency must be >= 0");
        if (!(v[2] > 0)) fail(src, line_no, "bandwidth must be > 0");
        p.starts_.push_back(v[0]);
        p.nets_.push_back({v[1] * lat_unit, bw_mode == 0 ? 8.0 / (v[2] * 1e9) : 1.0 / v[2]});
      }
      if (end == text.size()) break;
    }
    if (!header) fail(src, line_no, "no header line");
    if (p.starts_.empty()) fail(src, line_no, "no data rows");
    return p;
  }

  //! Reads a trace from the CSV file \p path (see parse_csv).
  static network_profile from_csv(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw error(status::io_failure, "network_profile: cannot open trace '" + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_csv(ss.str(), path);
  }

  //! The network at \p step (step-indexed) or at virtual time \p time_s (time-indexed).
  [[nodiscard]] const network_params& at(std::uint64_t step, double time_s) const noexcept {
    double x = by_ == profile_index::step ? static_cast<double>(step) : time_s;
    if (period_ > 0) x = std::fmod(x, period_);
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), x);
    return nets_[it == starts_.begin() ? 0 : static_cast<std::size_t>(it - starts_.begin()) - 1];
  }
  //! What the profile is indexed by.
  [[nodiscard]] profile_index index() const noexcept { return by_; }
  //! Number of phases (rows of a trace).
  [[nodiscard]] std::size_t phases() const noexcept { return nets_.size(); }

 private:
  static void check(const network_params& n, const char* what) {
    require(n.alpha >= 0 && std::isfinite(n.alpha) && n.beta > 0 && std::isfinite(n.beta),
            std::string(what) + ": latency must be >= 0 and beta (seconds per byte) > 0");
  }
  [[noreturn]] static void fail(const std::string& src, std::size_t line, const std::string& why) {
    throw error(status::invalid_argument, "network trace " + src + " line " + std::to_string(line) + ": " + why);
  }
  static std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
  }
  static bool split3(std::string_view line, std::string_view (&out)[3]) {
    for (int c = 0; c < 3; ++c) {
      const auto comma = line.find(',');
      if ((c < 2) != (comma != std::string_view::npos)) return false;
      out[c] = trim(line.substr(0, comma));
      if (out[c].empty()) return false;
      line = c < 2 ? line.substr(comma + 1) : std::string_view{};
    }
    return true;
  }
  static bool to_double(std::string_view s, double& v) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    return r.ec == std::errc{} && r.ptr == s.data() + s.size() && std::isfinite(v);
  }

  profile_index by_ = profile_index::step;
  std::vector<double> starts_;
  std::vector<network_params> nets_;
  double period_ = 0;
};

}  // namespace gravac
