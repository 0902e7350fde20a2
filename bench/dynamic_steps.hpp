#pragma once
// Timing a stateful compressor as training runs it: a sequence of steps, a fresh gradient
// every step (gradient_data.hpp), the residual carried from step to step by error
// feedback, timed only once the residual has reached its steady state.
//
//   steady_detector  the residual's norm changes by less than a tolerance (1%) per step,
//                    on average over a window of steps (8): the steady state. run_dynamic
//                    feeds it the residual's norm over the mean gradient norm of the last
//                    window steps (of this step only for the quantizers, whose residual is
//                    one step's coding error), so that a gradient whose scale drifts
//                    (generated data) or changes from step to step (recorded training) does
//                    not read as a residual still settling;
//   run_dynamic      untimed warm-up steps until then (or a cap), then timed samples.
//
// A timed sample is `batch` consecutive steps (one at 2^22 floats and above; enough for
// about a millisecond of memcpy below, as bench_common.hpp's calls_for), their gradients
// written beforehand, untimed. Beside each sample, in the same process and in rotating
// order, the same number of memcpy calls of those gradient buffers and of the
// error-feedback floor (bench_common.hpp: read g and e, write e and a packet of the
// kernel's last size) are timed. Reported figures are medians over the samples of the
// per-sample ratios: the drift of a shared machine's memory bandwidth over seconds cancels
// in a ratio of neighbouring timings.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "gradient_data.hpp"

namespace gravac_bench {

//! Decides when a residual has reached its steady state: the mean relative change of its
//! norm per step, over the last \p window steps, is below \p tolerance.
class steady_detector {
 public:
  //! Throws std::invalid_argument unless 0 < tolerance < 1 and window >= 1.
  explicit steady_detector(double tolerance = 0.01, std::size_t window = 8) : tolerance_(tolerance), window_(window) {
    if (!(tolerance > 0.0 && tolerance < 1.0))
      throw std::invalid_argument("steady_detector: tolerance must be in (0, 1), got " + std::to_string(tolerance));
    if (window < 1) throw std::invalid_argument("steady_detector: window must be at least 1 step");
  }

  //! Adds the residual norm after one more step; returns steady(). Throws
  //! std::invalid_argument on a negative or non-finite norm (a diverging residual).
  bool add(double norm) {
    if (!std::isfinite(norm) || norm < 0.0)
      throw std::invalid_argument("steady_detector: residual norm " + std::to_string(norm) + " after step " +
                                  std::to_string(norms_.size()) + " is not a finite norm");
    norms_.push_back(norm);
    return steady();
  }

  //! The mean relative change per step over the last window steps (infinity until the
  //! window is full, or when the residual leaves zero).
  [[nodiscard]] double change_per_step() const noexcept {
    if (norms_.size() < window_ + 1) return HUGE_VAL;
    double sum = 0;
    for (std::size_t i = norms_.size() - window_; i < norms_.size(); ++i) {
      if (norms_[i - 1] == 0.0) {
        if (norms_[i] != 0.0) return HUGE_VAL;  // a residual that stays zero is steady (identity)
        continue;
      }
      sum += std::fabs(norms_[i] - norms_[i - 1]) / norms_[i - 1];
    }
    return sum / static_cast<double>(window_);
  }

  //! True when change_per_step() is below the tolerance.
  [[nodiscard]] bool steady() const noexcept { return change_per_step() < tolerance_; }
  //! Norms added so far (one per step).
  [[nodiscard]] const std::vector<double>& norms() const noexcept { return norms_; }
  [[nodiscard]] double tolerance() const noexcept { return tolerance_; }  //!< the tolerance per step
  [[nodiscard]] std::size_t window() const noexcept { return window_; }   //!< steps averaged

 private:
  double tolerance_;
  std::size_t window_;
  std::vector<double> norms_;
};

//! How run_dynamic runs.
struct dynamic_options {
  std::size_t max_warmup = 1000;  //!< warm-up steps at most; the steady state is reported as not reached then
  std::size_t min_warmup = 16;    //!< warm-up steps at least (also with a residual that settles at once)
  std::size_t samples = 15;       //!< timed samples (each of batch steps)
  std::size_t batch = 0;          //!< steps per sample (0: calls_for(n))
  double tolerance = 0.01;        //!< steady_detector's tolerance per step
  std::size_t window = 8;         //!< steady_detector's window
  //! Steps whose mean gradient norm the residual's norm is divided by: window for a
  //! residual that accumulates over steps (selection, AdaComp); 1 for one that is one
  //! step's coding error (the quantizers), which follows that step's gradient.
  std::size_t gradient_window = 8;
  //! Exactly min_warmup warm-up steps, whatever the detector says: for a residual that is
  //! one step's coding error (the quantizers), the state after one step is already the
  //! steady one, and the detector's verdict is reported, not waited for.
  bool fixed_warmup = false;
  bool floor_second_pass = false;  //!< the floor reads and writes e twice (EF-sign)
};

//! What run_dynamic measured.
struct dynamic_result {
  bool steady = false;               //!< the steady state was reached before timing
  std::size_t warmup_steps = 0;      //!< untimed steps before the first timed one
  std::size_t first_timed_step = 0;  //!< the step index of the first timed step
  std::size_t batch = 1;             //!< steps per sample
  double change_at_start = 0;        //!< steady_detector::change_per_step() when timing began
  double max_change_timed = 0;       //!< largest relative norm change per step over the timed samples
  std::vector<double> step_s;        //!< per sample: kernel seconds per step
  std::vector<double> to_memcpy;     //!< per sample: kernel / memcpy
  std::vector<double> to_floor;      //!< per sample: kernel / error-feedback floor
  std::vector<double> to_other;      //!< per sample: kernel / the other kernel (when given)
  std::size_t packet_bytes = 0;      //!< the last step's packet

  //! Median of \p v (0 when empty).
  static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  }
  [[nodiscard]] double ratio_to_memcpy() const { return median(to_memcpy); }  //!< median kernel / memcpy
  [[nodiscard]] double ratio_to_floor() const { return median(to_floor); }    //!< median kernel / floor
  [[nodiscard]] double seconds_per_step() const { return median(step_s); }    //!< median kernel time per step
  [[nodiscard]] double ratio_to_other() const { return median(to_other); }    //!< median kernel / other kernel
  //! The floor against memcpy, from the two medians.
  [[nodiscard]] double floor_to_memcpy() const { return ratio_to_memcpy() / ratio_to_floor(); }
};

//! ||x||_2 in double.
inline double norm_of(std::span<const float> x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

//! A step of a stateful kernel: compresses gradient g of step t into the residual it
//! carries; returns the packet bytes.
using step_function = std::function<std::size_t(std::size_t, std::span<float>)>;

//! Runs \p step over the gradients of \p data, watching \p residual (the residual the step
//! carries), as described at the top of this file. With \p other (another kernel with a
//! residual of its own, e.g. the same selection without the gain curve, or on one thread),
//! it steps on the same gradients, warm-up included, and is timed as a fourth turn.
inline dynamic_result run_dynamic(const gradient_stream& data, std::span<const float> residual,
                                  const step_function& step, const dynamic_options& opt = {},
                                  const step_function& other = {}) {
  if (opt.samples == 0) throw std::invalid_argument("run_dynamic: samples must be at least 1");
  if (opt.min_warmup > opt.max_warmup) throw std::invalid_argument("run_dynamic: min_warmup exceeds max_warmup");
  const std::size_t n = data.size();
  steady_detector detector(opt.tolerance, opt.window);
  dynamic_result r;
  r.batch = opt.batch != 0 ? opt.batch : calls_for(n);
  std::vector<std::vector<float>> g(r.batch, std::vector<float>(n));
  std::size_t t = 0;
  std::vector<double> grad_norms;
  for (; t < opt.max_warmup; ++t) {
    data.fill(t, g[0]);
    grad_norms.push_back(norm_of(g[0]));
    if (other) other(t, g[0]);  // compress reads g only, so both see the same gradient
    r.packet_bytes = step(t, g[0]);
    double mean_grad = 0;
    const std::size_t from =
        grad_norms.size() - std::min(grad_norms.size(), std::max<std::size_t>(1, opt.gradient_window));
    for (std::size_t i = from; i < grad_norms.size(); ++i) mean_grad += grad_norms[i];
    mean_grad /= static_cast<double>(grad_norms.size() - from);
    detector.add(mean_grad > 0.0 ? norm_of(residual) / mean_grad : norm_of(residual));
    if (t + 1 >= opt.min_warmup && (opt.fixed_warmup || detector.steady())) {
      ++t;
      break;
    }
  }
  r.steady = detector.steady();
  r.warmup_steps = t;
  r.first_timed_step = t;
  r.change_at_start = detector.change_per_step();
  std::vector<std::function<void()>> copies, floors;
  for (auto& b : g) copies.push_back(memcpy_of(b));
  for (auto& b : g) floors.push_back(ef_floor_of(b, r.packet_bytes, opt.floor_second_pass));
  const auto time_all = [&](auto&& each) {
    const auto a = clock_type::now();
    for (std::size_t b = 0; b < r.batch; ++b) each(b);
    return seconds(a, clock_type::now());
  };
  double before = norm_of(residual);
  for (std::size_t s = 0; s < opt.samples; ++s) {
    for (std::size_t b = 0; b < r.batch; ++b) data.fill(t + b, g[b]);
    double tk = 0, tm = 0, tf = 0, to = 0;
    const int turns = other ? 4 : 3;
    for (int turn = 0; turn < turns; ++turn) {  // the first turn rotates with the sample
      switch ((turn + static_cast<int>(s)) % turns) {
        case 0:
          tk = time_all([&](std::size_t b) { r.packet_bytes = step(t + b, g[b]); });
          break;
        case 1:
          tm = time_all([&](std::size_t b) { copies[b](); });
          break;
        case 2:
          tf = time_all([&](std::size_t b) { floors[b](); });
          break;
        default:
          to = time_all([&](std::size_t b) { other(t + b, g[b]); });
          break;
      }
    }
    t += r.batch;
    const double after = norm_of(residual);
    if (before > 0.0)
      r.max_change_timed =
          std::max(r.max_change_timed, std::fabs(after - before) / before / static_cast<double>(r.batch));
    before = after;
    r.step_s.push_back(tk / static_cast<double>(r.batch));
    r.to_memcpy.push_back(tk / tm);
    r.to_floor.push_back(tk / tf);
    if (other) r.to_other.push_back(tk / to);
  }
  return r;
}

}  // namespace gravac_bench
