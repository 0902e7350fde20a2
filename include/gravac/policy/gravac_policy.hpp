#pragma once
//! \file gravac_policy.hpp
//! \brief GraVAC (Tyagi & Swany 2023): adapt the compression factor during training by
//! weighing compression throughput against the information compression loses.
//!
//! Every decision reads only what all ranks share (the trainer's rank averages, or a clock
//! they share), so all ranks choose alike with no collective of their own. The rules, the
//! deviations from the paper and dense among the choices: docs/algorithms.md, "GraVAC".

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/policy/detail/persistent_fields.hpp"
#include "gravac/policy/detail/policy_state.hpp"
#include "gravac/policy/detail/step_time_sums.hpp"
#include "gravac/policy/time_source.hpp"

namespace gravac {

//! Options of gravac_policy; defaults are those of docs/algorithms.md, "GraVAC".
struct gravac_policy_options {
  double cf_min = 10;               //!< CF_min: warm-up and fallback compression factor, >= 1
  double cf_max = 1000;             //!< CF_max: the last candidate, >= cf_min
  double scale = 0.5;               //!< s in (0, 1): each candidate is the previous one times 1/s
  std::uint32_t window = 25;        //!< w >= 1: EWMA window of the gain
  std::uint32_t warmup_steps = 25;  //!< steps sent at CF_min before the search (w in the paper)
  double epsilon = 0.7;             //!< eps in [0, 1]: the least gain a ratio must keep to be sent
  double omega = 0.05;              //!< omega in [0, 1): relative CT difference below which the search stops
  std::uint64_t period_steps = 0;   //!< P: steps per evaluation period; 0 = one interval (an epoch, see end_interval)
  double samples_per_step = 0;      //!< global batch size; 0 = from interval_info::samples, else 1 (steps per second)
  time_options time{};              //!< the clock CT is measured with (measured, modeled or simulated)
  bool one_dim_dense = false;       //!< send 1-D tensors (biases, norms) uncompressed
  collective_kind collective = collective_kind::automatic;  //!< hint for switching collectives
  //! Weigh sending dense against the ratios (docs/algorithms.md, "GraVAC with dense among the choices").
  bool dense_candidate = false;
  std::uint32_t dense_probe_steps = 10;  //!< steps of a probe of the other choice, >= 2 (the first is not timed)
  //! Relative change in the kept choice's smoothed communication time that makes the policy
  //! probe the other choice, > 0; used until a probe has timed both choices together (then
  //! the other choice is predicted from that pair: docs/algorithms.md).
  double recheck_drift = 0.25;
};

//! Where gravac_policy is in its life.
enum class gravac_phase : std::uint8_t {
  warmup,       //!< sending at CF_min for the first warmup_steps steps
  searching,    //!< evaluating candidates one period each
  monitoring,   //!< search over: the kept CF, with the eps fallback every step (or dense, when kept)
  dense_probe,  //!< options::dense_candidate: the first steps, sent dense and timed
};

//! Short name of a gravac phase.
constexpr std::string_view to_string(gravac_phase p) noexcept {
  switch (p) {
    case gravac_phase::warmup:
      return "warmup";
    case gravac_phase::searching:
      return "searching";
    case gravac_phase::monitoring:
      return "monitoring";
    case gravac_phase::dense_probe:
      return "dense_probe";
  }
  return "unknown";
}

//! GraVAC's adaptive compression factor. Models Policy. Every input of a decision comes
//! from the trainer's rank-synchronized report, so all ranks decide identically.
class gravac_policy {
 public:
  //! Opt-in tag for the Policy concept.
  using policy_tag = void;
  //! What it decides (composition.hpp): the kept fraction (the compression factor).
  static constexpr decision decides = decision::kept_fraction;
  //! Options (see gravac_policy_options).
  using options = gravac_policy_options;
  //! Decisions use gains and times averaged (times: maximized) over the ranks.
  static constexpr bool needs_statistics = true;
  //! Most candidates a configuration may produce (guards against s close to 1).
  static constexpr std::size_t max_candidates = 4096;
  //! Version of the bytes save() writes.
  static constexpr std::uint32_t state_version = 4;

  //! A policy for \p lay; throws gravac::error on an option out of its domain.
  gravac_policy(const layout& lay, const options& opt = {}) : opt_(opt) {
    const auto num = [](double v) { return std::to_string(v); };
    require(std::isfinite(opt.cf_min) && opt.cf_min >= 1,
            "gravac_policy: cf_min must be finite and >= 1, got " + num(opt.cf_min));
    require(std::isfinite(opt.cf_max) && opt.cf_max >= opt.cf_min,
            "gravac_policy: cf_max must be finite and >= cf_min, got " + num(opt.cf_max));
    require(opt.scale > 0 && opt.scale < 1, "gravac_policy: scale (s) must be in (0, 1), got " + num(opt.scale));
    require(opt.window >= 1, "gravac_policy: window must be >= 1");
    require(opt.epsilon >= 0 && opt.epsilon <= 1, "gravac_policy: epsilon must be in [0, 1], got " + num(opt.epsilon));
    require(opt.omega >= 0 && opt.omega < 1, "gravac_policy: omega must be in [0, 1), got " + num(opt.omega));
    require(std::isfinite(opt.samples_per_step) && opt.samples_per_step >= 0,
            "gravac_policy: samples_per_step must be finite and >= 0, got " + num(opt.samples_per_step));
    opt.time.validate("gravac_policy");
    require(!opt.dense_candidate || opt.dense_probe_steps >= 2,
            "gravac_policy: dense_probe_steps must be >= 2 (the first step of a probe is not timed)");
    require(std::isfinite(opt.recheck_drift) && opt.recheck_drift > 0,
            "gravac_policy: recheck_drift must be finite and > 0, got " + num(opt.recheck_drift));
    // Candidates: multiply by 1/s while below CF_max (a relative margin absorbs rounding), then CF_max.
    for (double c = opt.cf_min; c < opt.cf_max * (1 - 1e-9); c /= opt.scale) {
      candidates_.push_back(c);
      require(candidates_.size() < max_candidates, "gravac_policy: cf_min, cf_max and scale give more than ",
              max_candidates, " candidates");
    }
    candidates_.push_back(opt.cf_max);
    ct_.assign(candidates_.size(), std::numeric_limits<double>::quiet_NaN());
    one_dim_.resize(lay.size());
    for (std::size_t i = 0; i < lay.size(); ++i) one_dim_[i] = opt.one_dim_dense && lay[i].rank() <= 1;
    alpha_ = 2.0 / (static_cast<double>(opt.window) + 1.0);
    phase_ = opt.dense_candidate    ? gravac_phase::dense_probe
             : opt.warmup_steps > 0 ? gravac_phase::warmup
                                    : gravac_phase::searching;
    probe_left_ = opt.dense_candidate ? opt.dense_probe_steps : 0;
    fingerprint_ = detail::fingerprint(lay)
                       .add(opt.cf_min)
                       .add(opt.cf_max)
                       .add(opt.scale)
                       .add(std::uint64_t{opt.window})
                       .add(std::uint64_t{opt.warmup_steps})
                       .add(opt.epsilon)
                       .add(opt.omega)
                       .add(opt.period_steps)
                       .add(opt.samples_per_step)
                       .add(std::uint64_t(opt.time.source))
                       .add(opt.time.compute_s)
                       .add(std::uint64_t{opt.time.include_codec})
                       .add(std::uint64_t{opt.one_dim_dense})
                       .add(std::uint64_t(opt.collective))
                       .add(std::uint64_t{opt.dense_candidate})
                       .add(std::uint64_t{opt.dense_probe_steps})
                       .add(opt.recheck_drift)
                       .value();
  }

  //! Fills the next step's kept fractions (1 / CF, or dense), says why when it falls back,
  //! and asks for the gains of the current candidate (gain_curve[0]) and of CF_min
  //! (gain_curve[1], unless the candidate is CF_min). Changes no decision state.
  void plan(step_params& p) {
    const double cf = current_cf();
    const double f = cf <= 1 ? dense_fraction : 1.0 / cf;
    p.kept_fraction.resize(one_dim_.size());
    for (std::size_t i = 0; i < one_dim_.size(); ++i) p.kept_fraction[i] = one_dim_[i] ? dense_fraction : f;
    p.global_fraction = f;
    p.collective = opt_.collective;
    p.collect_norms = false;  // GraVAC reads gains, never norms: a dense step skips that pass
    planned_candidate_ = candidate_;
    planned_cf_ = cf;
    planned_measure_ = measure_of_next(cf);
    if (dense_by_choice()) {
      // Dense is chosen, not fallen back to: no gain is asked for, so that the step runs
      // without the compressor (once the residual is empty) and is timed as dense is.
      fallback_ = fallback_reason::none;
      planned_next_ = false;
      p.gain_candidates.clear();
      return;
    }
    fallback_ = phase_ == gravac_phase::warmup || cf == candidates_[candidate_] ? fallback_reason::none
                : cf > 1 ? fallback_reason::candidate_gain_below_eps
                         : fallback_reason::minimum_gain_below_eps;
    // gain_curve[0]: the candidate; [1]: CF_min (unless that is the candidate); then the
    // next candidate while searching.
    std::size_t n = 0;
    request_[n++] = 1.0 / candidates_[candidate_];
    if (candidate_ != 0) request_[n++] = 1.0 / opt_.cf_min;
    planned_next_ = phase_ != gravac_phase::monitoring && candidate_ + 1 < candidates_.size();
    if (planned_next_) request_[n++] = 1.0 / candidates_[candidate_ + 1];
    p.gain_candidates.assign(request_.begin(), request_.begin() + static_cast<std::ptrdiff_t>(n));
  }

  //! Why the step plan() planned last is sent less compressed than the current candidate
  //! (fallback_reason::none when it is not); the trainer copies it into step_report::fallback.
  [[nodiscard]] fallback_reason fallback() const noexcept { return fallback_; }

  //! Takes in one step's rank-averaged gains and the times of this step (a shared clock)
  //! or of the previous one (averaged over the ranks).
  void observe(const step_report& r) {
    if (r.skipped) return;
    ++observed_;
    ++interval_steps_;
    just_stopped_ = false;
    // The gains are index-aligned with the request plan() made for this step.
    const bool has_c = !r.gain_curve.empty();
    const bool has_min = planned_candidate_ == 0 ? has_c : r.gain_curve.size() >= 2;
    const double g_c = has_c ? r.gain_curve[0] : 0.0;
    const double g_min = planned_candidate_ == 0 ? g_c : (has_min ? r.gain_curve[1] : 0.0);
    if (has_min) gain_min_.update(g_min, alpha_);
    if (candidate_ == 0)
      gain_c_ = gain_min_;
    else if (has_c && planned_candidate_ == candidate_)
      gain_c_.update(g_c, alpha_);
    const std::size_t next_at = planned_candidate_ == 0 ? 1 : 2;
    if (planned_next_ && planned_candidate_ == candidate_ && r.gain_curve.size() > next_at)
      gain_next_.update(r.gain_curve[next_at], alpha_);

    const step_record now{planned_candidate_, planned_cf_, g_c, has_c, phase_ == gravac_phase::searching, true,
                          planned_measure_};
    expect(now);
    if (shared_clock()) {
      account(now, step_seconds(r, opt_.time), communication_seconds(r, opt_.time));
    } else {
      if (previous_.valid) {
        if (r.previous_times_agreed) {
          const step_report prev = previous_report(r);
          account(previous_, step_seconds(prev, opt_.time), communication_seconds(prev, opt_.time));
        } else {
          drop(previous_);
        }
      }
      previous_ = now;
      previous_modeled_s_ = r.modeled_exposed_s;
    }
    if (close_pending_) close_period(close_samples_per_step_);
    if (phase_ == gravac_phase::dense_probe && --probe_left_ == 0)
      phase_ = opt_.warmup_steps > 0 ? gravac_phase::warmup : gravac_phase::searching;
    if (phase_ == gravac_phase::warmup && observed_ >= warmup_end()) {
      phase_ = gravac_phase::searching;
      period_ = {};
      dominance_pending_ = opt_.dense_candidate;
    }
    // A search that stopped during this step has set up its probe: nothing to advance yet.
    if (opt_.dense_candidate && !just_stopped_) advance_dense_choice();
  }

  //! The end of an interval: closes the evaluation period when periods are intervals (with a
  //! clock read one step late, once the interval's last step has its time).
  void on_interval(const interval_info& info) {
    const std::uint64_t steps = interval_steps_;
    interval_steps_ = 0;
    const bool last_step_pending = !shared_clock() && previous_.valid && previous_.searching;
    if (phase_ != gravac_phase::searching || opt_.period_steps > 0 || (period_.steps == 0 && !last_step_pending))
      return;
    double per_step = 1.0;
    if (opt_.samples_per_step > 0)
      per_step = opt_.samples_per_step;
    else if (info.samples > 0 && steps > 0)
      per_step = info.samples / static_cast<double>(steps);  // the period may be the tail of the interval
    if (last_step_pending) {
      close_pending_ = true;
      close_samples_per_step_ = per_step;
    } else {
      close_period(per_step);
    }
  }

  //! Appends the full state (versioned) to \p out: the fields of persistent_fields, in order.
  void save(std::vector<std::byte>& out) const {
    detail::state_writer w(out);
    w.header(state_tag, state_version, fingerprint_);
    detail::save_fields<persistent_fields>(w, *this);
  }
  //! Restores what save() wrote; throws gravac::error (and changes nothing) on bytes from
  //! another policy, version, options or layout, or on truncated or corrupt bytes.
  void load(std::span<const std::byte> in) {
    detail::state_reader r(in, "gravac_policy");
    r.header(state_tag, state_version, fingerprint_);
    detail::load_fields<persistent_fields>(r, *this, [&](const state_stage& s) { check_loaded(s, r); });
  }

  //! The compression factor the next step will use (1 = dense).
  [[nodiscard]] double current_cf() const noexcept {
    if (dense_by_choice()) return 1.0;
    if (recheck_ == recheck_kind::compressed && probe_left_ > 0) return candidates_[candidate_];  // a probe: forced
    if (phase_ == gravac_phase::warmup) return opt_.cf_min;
    const double c = candidates_[candidate_];
    if (gain_c_.ready && gain_c_.value >= opt_.epsilon) return c;
    if (gain_min_.ready && gain_min_.value >= opt_.epsilon) return opt_.cf_min;
    return 1.0;
  }
  //! The phase: warm-up, searching or monitoring.
  [[nodiscard]] gravac_phase phase() const noexcept { return phase_; }
  //! True while candidates are being evaluated (warm-up included).
  [[nodiscard]] bool searching() const noexcept { return phase_ != gravac_phase::monitoring; }
  //! The candidate under evaluation, or the one kept after the search.
  [[nodiscard]] double candidate_cf() const noexcept { return candidates_[candidate_]; }
  //! Index of candidate_cf() in candidates().
  [[nodiscard]] std::size_t candidate_index() const noexcept { return candidate_; }
  //! All candidate compression factors, CF_min first, CF_max last.
  [[nodiscard]] std::span<const double> candidates() const noexcept { return candidates_; }
  //! CT of each candidate (samples per second * mean gain); NaN where not evaluated.
  [[nodiscard]] std::span<const double> throughput_table() const noexcept { return ct_; }
  //! Smoothed gain of the current candidate (NaN before its first measurement).
  [[nodiscard]] double smoothed_gain() const noexcept { return gain_c_.get(); }
  //! Smoothed gain of CF_min (NaN before its first measurement).
  [[nodiscard]] double smoothed_gain_min() const noexcept { return gain_min_.get(); }
  //! Steps observed so far.
  [[nodiscard]] std::uint64_t steps_observed() const noexcept { return observed_; }
  //! Steps of the evaluation period in progress.
  [[nodiscard]] std::uint64_t period_steps_done() const noexcept { return period_.steps; }
  //! options::dense_candidate: dense is the kept choice (set by the probe that confirms the
  //! search's choice of dense, changed by later probes while monitoring).
  [[nodiscard]] bool dense_kept() const noexcept { return kept_dense_; }
  //! options::dense_candidate: dense's CT (samples per second, gain 1) at the last comparison
  //! that closed a period; NaN before one.
  [[nodiscard]] double dense_throughput() const noexcept { return ct_dense_; }
  //! Probes of the other choice started while monitoring (options::dense_candidate).
  [[nodiscard]] std::uint64_t rechecks() const noexcept { return rechecks_; }
  //! Of them, those that switched between dense and the kept ratio.
  [[nodiscard]] std::uint64_t switches() const noexcept { return switches_; }
  //! The options.
  [[nodiscard]] const options& get_options() const noexcept { return opt_; }

 private:
  static constexpr std::uint32_t state_tag = 0x43565247;  // "GRVC"

  // EWMA that starts from its first sample.
  struct ewma {
    double value = 0;
    bool ready = false;
    void update(double x, double alpha) noexcept {
      value = ready ? value + alpha * (x - value) : x;
      ready = true;
    }
    [[nodiscard]] double get() const noexcept { return ready ? value : std::numeric_limits<double>::quiet_NaN(); }
    using persistent_fields = detail::field_list<detail::field<&ewma::value>, detail::field<&ewma::ready>>;
  };
  // What the evaluation period in progress has accumulated.
  struct period_sums {
    std::uint64_t steps = 0;  // steps of the period
    double seconds = 0;       // this rank's seconds of the steps sent at the candidate
    double gain_sum = 0;      // their gains
    std::uint64_t gain_count = 0;
    std::uint64_t sent_at_c = 0;  // steps sent at the candidate
    double comm_seconds = 0;      // of seconds, the communication
  };
  // What a step's time measures besides the search's period (options::dense_candidate).
  enum class measure : std::uint8_t {
    none,         // nothing (the first step of a probe, a fallback step)
    dense_probe,  // dense at the start
    warmup,       // CF_min during the warm-up
    kept,         // the kept choice while monitoring
    recheck,      // the other choice, probed while monitoring
    kept_fresh,   // the kept choice, timed afresh before a probe
  };
  // Which choice a probe while monitoring measures.
  enum class recheck_kind : std::uint8_t { none, dense, compressed };

  // What the policy remembers of a step until its time is known.
  struct step_record {
    std::size_t candidate = 0;  // the candidate when it was planned
    double cf = 0;              // the CF it was sent at (1: dense)
    double gain = 0;            // the candidate's gain (rank average)
    bool has_gain = false;
    bool searching = false;  // planned during the search
    bool valid = false;
    measure what = measure::none;
  };

  // The last paired timing of both choices (dense_candidate): what the watch predicts from.
  struct pair_anchor {
    bool valid = false;
    double kept_comm = 0;   // the kept choice's communication per step, seconds
    double kept_fixed = 0;  // the rest of its step (compute, codec)
    double kept_gain = 1;
    double other_comm = 0;  // the other choice's
    double other_fixed = 0;
    double other_gain = 1;
    using persistent_fields =
        detail::field_list<detail::field<&pair_anchor::valid>, detail::field<&pair_anchor::kept_comm>,
                           detail::field<&pair_anchor::kept_fixed>, detail::field<&pair_anchor::kept_gain>,
                           detail::field<&pair_anchor::other_comm>, detail::field<&pair_anchor::other_fixed>,
                           detail::field<&pair_anchor::other_gain>>;
  };

  // True when every rank reads the same clock (no measured part): its time is used at once.
  [[nodiscard]] bool shared_clock() const noexcept {
    return opt_.time.source == time_source::simulated && !opt_.time.include_codec;
  }
  // The previous step's times, from the ranks' averages, as a report step_seconds() reads.
  [[nodiscard]] step_report previous_report(const step_report& r) const {
    step_report prev;
    prev.compress_s = r.previous_times.compress_s;
    prev.communicate_s = r.previous_times.communicate_s;
    prev.decompress_s = r.previous_times.decompress_s;
    prev.iteration_s = r.previous_times.iteration_s;
    prev.modeled_communicate_s = prev.modeled_exposed_s = previous_modeled_s_;
    return prev;
  }
  // The sums a step's time belongs to (null: none).
  detail::step_time_sums* sums_of(const step_record& s) noexcept {
    switch (s.what) {
      case measure::dense_probe:
        return &dense_;
      case measure::warmup:
        return &warm_;
      case measure::recheck:
        return &recheck_sums_;
      case measure::kept_fresh:
        return &kept_fresh_;
      default:
        return nullptr;
    }
  }
  void expect(const step_record& s) {
    if (auto* t = sums_of(s)) t->expect();
  }
  // A step whose time will never come (the ranks did not agree on it).
  void drop(const step_record& s) {
    if (auto* t = sums_of(s)) t->drop();
  }
  // Adds a step whose time is known to what it measures: the evaluation period (closed
  // after P steps) or, with dense_candidate, a probe, the warm-up or the kept choice.
  void account(const step_record& s, double seconds, double comm) {
    const double gain = s.cf <= 1 || !s.has_gain ? 1.0 : s.gain;
    if (auto* t = sums_of(s)) t->add(seconds, comm, gain);
    if (s.what == measure::kept) {
      kept_comm_.update(comm, alpha_);
      ++kept_steps_;
    }
    // A period holds the steps planned while its candidate was under evaluation.
    if (!s.searching || phase_ != gravac_phase::searching || s.candidate != candidate_) return;
    ++period_.steps;
    if (s.candidate == candidate_ && s.cf == candidates_[candidate_]) {
      ++period_.sent_at_c;
      period_.seconds += seconds;
      period_.comm_seconds += comm;
      if (s.has_gain) {
        period_.gain_sum += s.gain;
        ++period_.gain_count;
      }
    }
    if (opt_.period_steps > 0 && period_.steps == opt_.period_steps)
      close_period(opt_.samples_per_step > 0 ? opt_.samples_per_step : 1.0);
  }
  void close_period(double samples_per_step) {
    close_pending_ = false;
    if (phase_ != gravac_phase::searching) return;
    end_period(samples_per_step * static_cast<double>(period_.sent_at_c), period_.seconds);
  }

  // CT of the candidate under evaluation (from the steps sent at it), then the stop /
  // advance rules of the algorithm.
  void end_period(double samples, double seconds) {
    const double mean_gain = period_.gain_count ? period_.gain_sum / static_cast<double>(period_.gain_count) : 0.0;
    ct_[candidate_] = seconds > 0 && period_.sent_at_c > 0 ? samples / seconds * mean_gain : 0.0;
    const period_sums done = period_;
    period_ = {};
    bool dominated = false;
    if (opt_.dense_candidate && dense_.timed > 0 && done.sent_at_c > 0 && seconds > 0) {
      const auto n = static_cast<double>(done.sent_at_c);
      ct_dense_ = samples / n / dense_.mean_s();  // the same samples per step, gain 1
      dominated = detail::dense_dominates(dense_, seconds / n, done.comm_seconds / n, mean_gain);
    }
    const std::size_t i = candidate_;
    std::size_t best = 0, second = 0;
    // Candidates 0..i are evaluated (the search goes in order). Ties go to the more aggressive.
    for (std::size_t j = 1; j <= i; ++j) {
      if (ct_[j] >= ct_[best]) {
        second = best;
        best = j;
      } else if (second == best || ct_[j] >= ct_[second]) {
        second = j;
      }
    }
    if (dominated) return stop(best, true);
    if (i >= 1) {
      const double top = ct_[best], next = ct_[second];
      const bool close = top <= 0 ? true : (top - next) < opt_.omega * top;
      if (close) return stop(best > second ? best : second);
      if (ct_[i] < ct_[i - 1]) return stop(best);
    }
    if (i + 1 == candidates_.size()) return stop(best);
    ++candidate_;
    gain_c_ = gain_next_;  // measured while the previous candidate was evaluated
    gain_next_ = {};
  }

  // Ends the search keeping candidate \p keep. With dense_candidate, when \p dense_wins or
  // dense's CT is at least the kept ratio's, dense is not taken at once: its timing may come
  // from another network (the dense probe ran before the warm-up and the search), so the ratio
  // and dense are timed afresh, one after the other, and close_recheck decides.
  void stop(std::size_t keep, bool dense_wins = false) {
    phase_ = gravac_phase::monitoring;
    just_stopped_ = true;
    dominance_pending_ = false;
    if (keep != candidate_) {
      candidate_ = keep;
      gain_c_ = keep == 0 ? gain_min_ : ewma{};  // the kept ratio's gain is measured afresh
    }
    if (!opt_.dense_candidate) return;
    settle(false);
    if (dense_wins || (std::isfinite(ct_dense_) && std::isfinite(ct_[keep]) && ct_dense_ >= ct_[keep])) {
      start_recheck(recheck_kind::dense);
      confirming_ = true;  // as the search's rule: dense wins a tie, no hysteresis
    }
  }
  // Times the kept choice afresh for dense_probe_steps, then \p other for as many.
  void start_recheck(recheck_kind other) {
    recheck_ = other;
    kept_left_ = opt_.dense_probe_steps;
    recheck_sums_ = kept_fresh_ = {};
    ++rechecks_;
  }
  // The other choice's progress rate over the kept one's, predicted from the last paired
  // timing (anchor_) and how the kept choice's communication has changed since (the network's
  // speed now against then); 0 when there is nothing to predict from.
  [[nodiscard]] double predicted_advantage() const noexcept {
    if (!(anchor_.kept_comm > 0) || !kept_comm_.ready) return 0.0;
    const double f = kept_comm_.value / anchor_.kept_comm;
    const double kept_gain = kept_dense_ ? 1.0 : (gain_c_.ready ? gain_c_.value : anchor_.kept_gain);
    const double other_gain = kept_dense_ ? anchor_.other_gain : 1.0;
    const double kept = detail::progress_rate(kept_gain, anchor_.kept_fixed + kept_comm_.value);
    const double other = detail::progress_rate(other_gain, anchor_.other_fixed + anchor_.other_comm * f);
    return kept > 0 ? other / kept : 0.0;
  }

  // The first step after warm_up_end() searches; with a dense probe first, it ends later.
  [[nodiscard]] std::uint64_t warmup_end() const noexcept {
    return opt_.warmup_steps + (opt_.dense_candidate ? opt_.dense_probe_steps : 0);
  }
  // Dense is sent by choice (a probe, or kept), not as the eps fallback.
  [[nodiscard]] bool dense_by_choice() const noexcept {
    if (!opt_.dense_candidate) return false;
    if (phase_ == gravac_phase::dense_probe) return true;
    if (recheck_ != recheck_kind::none && probe_left_ > 0) return recheck_ == recheck_kind::dense;
    return phase_ == gravac_phase::monitoring && kept_dense_;
  }
  // What the time of the step about to be sent at \p cf measures (dense_candidate only).
  [[nodiscard]] measure measure_of_next(double cf) const noexcept {
    if (!opt_.dense_candidate) return measure::none;
    const bool probing = phase_ == gravac_phase::dense_probe || (recheck_ != recheck_kind::none && probe_left_ > 0);
    if (probing)  // the first step of a probe changes what the residual holds: not timed
      return probe_left_ == opt_.dense_probe_steps ? measure::none
             : phase_ == gravac_phase::dense_probe ? measure::dense_probe
                                                   : measure::recheck;
    if (phase_ == gravac_phase::warmup) return measure::warmup;
    if (phase_ != gravac_phase::monitoring) return measure::none;
    const bool at_kept = kept_dense_ ? cf <= 1 : cf == candidates_[candidate_];
    if (!at_kept) return measure::none;
    if (recheck_ == recheck_kind::none) return measure::kept;
    return kept_left_ > 0 ? measure::kept_fresh : measure::none;
  }
  // Sets the kept choice and starts watching its communication time afresh.
  void settle(bool dense) {
    kept_dense_ = dense;
    kept_comm_ = ewma{};
    kept_steps_ = 0;
    kept_ref_comm_ = 0;
  }
  // After a step, with dense_candidate: the dominance check once the warm-up is timed, and
  // while monitoring the drift watch and the probes it starts.
  void advance_dense_choice() {
    if (dominance_pending_ && dense_.complete() && warm_.accounted >= warm_.expected) {
      dominance_pending_ = false;
      if (phase_ == gravac_phase::searching && warm_.timed > 0 &&
          detail::dense_dominates(dense_, warm_.mean_s(), warm_.mean_comm_s(), warm_.mean_gain())) {
        ct_dense_ = (opt_.samples_per_step > 0 ? opt_.samples_per_step : 1.0) / dense_.mean_s();
        return stop(0, true);
      }
    }
    if (phase_ != gravac_phase::monitoring) return;
    if (recheck_ != recheck_kind::none) {
      if (kept_left_ > 0) {  // the kept choice, timed afresh; then the other one
        if (--kept_left_ == 0) probe_left_ = opt_.dense_probe_steps;
        return;
      }
      if (probe_left_ > 0) --probe_left_;
      if (probe_left_ == 0 && recheck_sums_.accounted >= recheck_sums_.expected &&
          kept_fresh_.accounted >= kept_fresh_.expected)
        close_recheck();
      return;
    }
    if (kept_steps_ < opt_.window) return;  // the watch has not settled yet
    if (anchor_.valid) {                    // both choices were timed together: predict the other from the kept one
      // A clear advantage (over 3 omega) is probed at once. A smaller one must beat omega times
      // a margin that shrinks from 2 to 1 as the watch sees more steps (its confidence grows),
      // and waits the longer after probes that found the choices close: each doubles the wait,
      // up to 16 windows, so a network near the break-even point is not probed over and over.
      const double adv = predicted_advantage();
      const double margin =
          std::min(2.0, 1 + std::sqrt(static_cast<double>(opt_.window) / static_cast<double>(kept_steps_)));
      const bool waited = kept_steps_ >= (std::uint64_t{opt_.window} << std::min<std::uint64_t>(close_probes_, 4));
      if (adv > 1 + 3 * opt_.omega || (waited && adv > 1 + opt_.omega * margin))
        start_recheck(kept_dense_ ? recheck_kind::compressed : recheck_kind::dense);
      return;
    }
    if (kept_ref_comm_ <= 0) {
      kept_ref_comm_ = kept_comm_.value;  // where the kept choice settled
      return;
    }
    const double change = kept_comm_.value / kept_ref_comm_ - 1;
    if (kept_dense_ ? change > opt_.recheck_drift : change < -opt_.recheck_drift)
      start_recheck(kept_dense_ ? recheck_kind::compressed : recheck_kind::dense);
  }
  // A probe while monitoring is timed: switch if the other choice's progress rate beats the
  // kept one's by more than omega, and watch the kept choice afresh either way. The pair of
  // timings becomes the anchor the watch predicts the other choice from. A kept ratio that was
  // never sent at its factor while it was timed (its gain fell below eps) loses to dense.
  void close_recheck() {
    const bool other_dense = recheck_ == recheck_kind::dense;
    recheck_ = recheck_kind::none;
    bool switch_over = false;
    const bool confirming = confirming_;
    confirming_ = false;
    const bool paired = recheck_sums_.timed > 0 && kept_fresh_.timed > 0;
    if (paired) {
      const double other = detail::progress_rate(other_dense ? 1.0 : recheck_sums_.mean_gain(), recheck_sums_.mean_s());
      const double kept = detail::progress_rate(kept_dense_ ? 1.0 : kept_fresh_.mean_gain(), kept_fresh_.mean_s());
      switch_over = confirming ? other >= kept : other > kept * (1 + opt_.omega);
      const double far = 1 + 3 * opt_.omega;  // a clear verdict resets the back-off
      close_probes_ = other > kept * far || kept > other * far ? 0 : close_probes_ + 1;
    } else {
      switch_over = other_dense && recheck_sums_.timed > 0;
    }
    if (switch_over && other_dense) dense_ = recheck_sums_;
    if (switch_over) ++switches_;
    const bool dense_now = switch_over ? other_dense : kept_dense_;
    anchor_ = {};
    if (paired) {
      const auto& kept = switch_over ? recheck_sums_ : kept_fresh_;
      const auto& other = switch_over ? kept_fresh_ : recheck_sums_;
      anchor_.valid = true;
      anchor_.kept_comm = kept.mean_comm_s();
      anchor_.kept_fixed = kept.mean_s() - kept.mean_comm_s();
      anchor_.kept_gain = dense_now ? 1.0 : kept.mean_gain();
      anchor_.other_comm = other.mean_comm_s();
      anchor_.other_fixed = other.mean_s() - other.mean_comm_s();
      anchor_.other_gain = dense_now ? other.mean_gain() : 1.0;
    }
    settle(dense_now);
  }

  options opt_;
  std::vector<double> candidates_;
  std::vector<double> ct_;
  std::vector<bool> one_dim_;
  double alpha_ = 0;
  std::uint64_t fingerprint_ = 0;
  std::array<double, 3> request_{};
  // Decision state (saved and restored).
  gravac_phase phase_ = gravac_phase::warmup;
  std::uint64_t observed_ = 0;
  std::uint64_t interval_steps_ = 0;
  std::size_t candidate_ = 0;
  ewma gain_c_;
  ewma gain_min_;
  ewma gain_next_;  // the next candidate's, measured during the search
  period_sums period_;
  std::size_t planned_candidate_ = 0;                 // the candidate when the step in flight was planned
  double planned_cf_ = 0;                             // the CF it was sent at (1: dense)
  bool planned_next_ = false;                         // it asked for the next candidate's gain
  fallback_reason fallback_ = fallback_reason::none;  // why it was sent below the candidate
  step_record previous_;                              // a clock read one step late: the step whose time comes next
  double previous_modeled_s_ = 0;                     // its exposed modeled communication (the same on every rank)
  bool close_pending_ = false;  // an interval ended: close the period once its last step has its time
  double close_samples_per_step_ = 0;
  // options::dense_candidate (saved and restored).
  measure planned_measure_ = measure::none;                     // what the step in flight's time measures
  recheck_kind recheck_ = recheck_kind::none;                   // the probe in progress while monitoring
  bool kept_dense_ = false;                                     // dense is the kept choice
  bool dominance_pending_ = false;                              // check dense's dominance once the warm-up is timed
  std::uint64_t probe_left_ = 0;                                // steps of the probe in progress still to send
  detail::step_time_sums dense_;                                // dense's latest measurement
  detail::step_time_sums warm_;                                 // CF_min during the warm-up
  detail::step_time_sums recheck_sums_;                         // the probe in progress while monitoring
  detail::step_time_sums kept_fresh_;                           // the kept choice, timed afresh before it
  std::uint64_t kept_left_ = 0;                                 // steps of kept_fresh_ still to send
  ewma kept_comm_;                                              // the kept choice's communication, smoothed
  std::uint64_t kept_steps_ = 0;                                // steps in kept_comm_
  double kept_ref_comm_ = 0;                                    // where kept_comm_ settled (0: not yet)
  double ct_dense_ = std::numeric_limits<double>::quiet_NaN();  // dense's CT at the last comparison
  std::uint64_t rechecks_ = 0;
  std::uint64_t switches_ = 0;
  pair_anchor anchor_;              // the last paired timing (version 4)
  bool confirming_ = false;         // the probe in progress confirms the search's choice of dense (version 4)
  std::uint64_t close_probes_ = 0;  // probes in a row that found the choices within 3 omega (version 4)
  bool just_stopped_ = false;       // the search stopped during the step being observed (not saved)

  // The decision state a checkpoint holds, in the order of its bytes (state_version 4). The
  // order is the history of the format (fields were appended as versions grew): keep it.
  using self = gravac_policy;
  template <auto... Path>
  using field = detail::field<Path...>;
  template <auto... Path>
  using at = detail::path<Path...>;
  using persistent_fields = detail::field_list<
      field<&self::phase_>, field<&self::observed_>, field<&self::interval_steps_>, field<&self::candidate_>,
      field<&self::gain_c_>, field<&self::gain_min_>, field<&self::gain_next_>,  //
      field<&self::period_, &period_sums::steps>, field<&self::period_, &period_sums::seconds>,
      field<&self::period_, &period_sums::gain_sum>, field<&self::period_, &period_sums::gain_count>,
      field<&self::period_, &period_sums::sent_at_c>,  //
      field<&self::ct_>, field<&self::planned_candidate_>, field<&self::planned_cf_>, field<&self::planned_next_>,
      field<&self::previous_, &step_record::candidate>, field<&self::previous_, &step_record::cf>,
      field<&self::previous_, &step_record::gain>,
      detail::packed_flags<std::uint8_t, at<&self::previous_, &step_record::has_gain>,
                           at<&self::previous_, &step_record::searching>, at<&self::previous_, &step_record::valid>,
                           at<&self::close_pending_>>,
      field<&self::previous_modeled_s_>, field<&self::close_samples_per_step_>,
      field<&self::period_, &period_sums::comm_seconds>,
      // options::dense_candidate (version 3)
      field<&self::planned_measure_>, field<&self::previous_, &step_record::what>, field<&self::recheck_>,
      detail::packed_flags<std::uint8_t, at<&self::kept_dense_>, at<&self::dominance_pending_>>,
      field<&self::probe_left_>, field<&self::kept_left_>, field<&self::dense_>, field<&self::warm_>,
      field<&self::recheck_sums_>, field<&self::kept_fresh_>, field<&self::kept_comm_>, field<&self::kept_steps_>,
      field<&self::kept_ref_comm_>, field<&self::ct_dense_>, field<&self::rechecks_>, field<&self::switches_>,
      // the watch's anchor (version 4)
      field<&self::anchor_>, field<&self::confirming_>, field<&self::close_probes_>>;
  using state_stage = detail::field_stage<gravac_policy, persistent_fields>;

  // Refuses a loaded state that these options and this layout cannot hold (corrupt bytes).
  void check_loaded(const state_stage& s, const detail::state_reader& r) const {
    constexpr auto last_measure = measure::kept_fresh;
    const auto& prev = s.get<&self::previous_>();
    if (s.get<&self::planned_measure_>() > last_measure || prev.what > last_measure) r.fail("unknown measurement");
    if (s.get<&self::recheck_>() > recheck_kind::compressed) r.fail("unknown re-check");
    const auto probe_left = s.get<&self::probe_left_>(), kept_left = s.get<&self::kept_left_>();
    if (probe_left > opt_.dense_probe_steps || kept_left > opt_.dense_probe_steps) r.fail("probe steps out of range");
    if (s.get<&self::planned_candidate_>() >= candidates_.size() || prev.candidate >= candidates_.size())
      r.fail("planned candidate index out of range");
    const auto phase = s.get<&self::phase_>();
    if (phase > gravac_phase::dense_probe) r.fail("unknown phase");
    if (!opt_.dense_candidate &&
        (phase == gravac_phase::dense_probe || s.get<&self::kept_dense_>() || s.get<&self::dominance_pending_>() ||
         s.get<&self::recheck_>() != recheck_kind::none || probe_left != 0 || kept_left != 0))
      r.fail("dense choice state without options::dense_candidate");
    if (!opt_.dense_candidate && (s.get<&self::anchor_>().valid || s.get<&self::confirming_>()))
      r.fail("a timing anchor or confirmation without options::dense_candidate");
    if (s.get<&self::candidate_>() >= candidates_.size()) r.fail("candidate index out of range");
  }
};
static_assert(Policy<gravac_policy>);

}  // namespace gravac
