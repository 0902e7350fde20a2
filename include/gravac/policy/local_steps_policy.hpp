#pragma once
//! \file local_steps_policy.hpp
//! \brief One policy over the period H of local-step training and the kept fraction of what
//! each exchange sends, driven by the time of compute and of communication.
//!
//! It prices every (H, fraction) pair with the cost model under a current estimate of the
//! network and the measured (or given) compute per step (only what H steps of compute do
//! not hide counts, with overlap), and takes the densest fraction, then the smallest H,
//! whose time per step is within a slack of the fastest pair's: no compression and no
//! staleness that does not buy real time. H = 1 is ordinary per-step training, so a fast
//! network keeps the per-step method; max_period bounds H (the staleness bound).
//! docs/algorithms.md, "Local steps", has the rule, the measure of progress it uses and why.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/network/cost_model.hpp"
#include "gravac/network/network_profile.hpp"
#include "gravac/network/network_source.hpp"
#include "gravac/policy/detail/policy_state.hpp"
#include "gravac/policy/time_source.hpp"

namespace gravac {

//! Options of local_steps_policy.
struct local_steps_policy_options {
  //! Candidate kept fractions of an exchange, each in (0, 1]; 1 sends dense. Tried in
  //! decreasing order (the densest first).
  std::vector<double> kept_fractions{dense_fraction, 0.1, 0.01};
  std::size_t max_period = 64;  //!< the staleness bound: the largest H, >= 1
  //! How much slower per step than the fastest pair a choice may be, in (0, 1): the first
  //! pair in the order of preference (the largest fraction, then the smallest H) within
  //! (1 + slack) of the fastest pair's time per step is chosen.
  double slack = 0.25;
  //! Hysteresis: a pair earlier in the order than the current one must fit slack / (1 +
  //! margin); the current one is kept while it fits slack * (1 + margin).
  double margin = 0.25;
  //! The exchange runs behind the next round's compute (local_steps options::overlap): only
  //! what exceeds H steps of compute counts. local_steps sets it from its own option.
  bool overlap = false;
  //! Compute per step: `simulated` charges time.compute_s; the others take the rounds'
  //! measured time between exchanges, averaged over the ranks (it rides in the exchange).
  time_options time{};
  //! Where the network's alpha and beta come from: `measured` fits the exchanges' measured
  //! times (averaged over the ranks, one exchange late), `modeled` the network model's clock,
  //! `profile` reads `profile` at the inner step, `fixed` takes `network`.
  network_source source = network_source::measured;
  network_params network{};                          //!< fixed source, and the fitted estimate's prior
  std::shared_ptr<const network_profile> profile{};  //!< profile source
  //! Exchanges the fitted estimate remembers: few, so that it follows a network that changes.
  std::size_t estimate_window = 8;
  //! Bytes an exchange sends per kept value before the first compressed exchange measures
  //! it (8: a 32-bit value and a 32-bit index).
  double initial_bytes_per_kept = 8;
};

//! What the policy chose for the next round.
struct period_choice {
  std::size_t period = 1;                 //!< H: inner steps per exchange
  double kept_fraction = dense_fraction;  //!< what each exchange keeps
  double predicted_step_s = 0;            //!< predicted seconds per inner step (compute and exposed communication)
  double predicted_share = 0;             //!< predicted share of a step's time spent communicating
  //! Equal choices.
  friend bool operator==(const period_choice&, const period_choice&) = default;
};

//! Chooses H and the kept fraction of local-step training (local_steps.hpp). Models
//! Policy: it plans the kept fraction of every exchange; local_steps reads period() at the
//! start of each round and tells it each round's length and compute (round_ended). Every
//! input of a decision is the same on every rank (averaged in the exchange itself, or
//! modeled), so every rank decides the same, with no collective of its own.
class local_steps_policy {
 public:
  //! Opt-in tag for the Policy concept.
  using policy_tag = void;
  //! Options (see local_steps_policy_options).
  using options = local_steps_policy_options;
  //! No per-layer statistics are needed.
  static constexpr bool needs_statistics = false;
  //! Version of the bytes save() writes.
  static constexpr std::uint32_t state_version = 1;

  //! A policy for \p lay; rejects options out of their domain.
  local_steps_policy(const layout& lay, const options& opt = {})
      : options_(opt), numel_(static_cast<double>(lay.numel())), bytes_per_kept_(opt.initial_bytes_per_kept) {
    const std::string who = "local_steps_policy";
    require(!opt.kept_fractions.empty(), who + ": kept_fractions must not be empty");
    for (double f : opt.kept_fractions)
      require(f > 0 && f <= 1, who + ": every kept fraction must be in (0, 1], got " + std::to_string(f));
    require(opt.max_period >= 1, who + ": max_period must be >= 1");
    require(opt.slack > 0 && opt.slack < 1, who + ": slack must be in (0, 1), got " + std::to_string(opt.slack));
    require(std::isfinite(opt.margin) && opt.margin >= 0, who + ": margin must be finite and >= 0");
    require(opt.estimate_window >= 2, who + ": estimate_window must be >= 2");
    require(std::isfinite(opt.initial_bytes_per_kept) && opt.initial_bytes_per_kept > 0,
            who + ": initial_bytes_per_kept must be finite and > 0");
    require(opt.source != network_source::profile || opt.profile, who + ": the profile source needs a profile");
    opt.time.validate(who);
    fractions_ = opt.kept_fractions;
    std::sort(fractions_.begin(), fractions_.end(), std::greater<>());
    fractions_.erase(std::unique(fractions_.begin(), fractions_.end()), fractions_.end());
    for (std::size_t h = 1; h < opt.max_period; h *= 2) periods_.push_back(h);
    periods_.push_back(opt.max_period);
    choice_.kept_fraction = fractions_.front();
    fingerprint_ = detail::fingerprint(lay)
                       .add(opt.slack)
                       .add(opt.margin)
                       .add(std::uint64_t{opt.overlap})
                       .add(std::uint64_t{opt.max_period})
                       .add(std::uint64_t(opt.source))
                       .add(std::uint64_t{opt.estimate_window})
                       .add(opt.time.compute_s)
                       .add(std::uint64_t(opt.time.source))
                       .value();
    for (double f : fractions_) fingerprint_ = detail::fingerprint(lay).add(fingerprint_).add(f).value();
  }

  //! H for the next round (1 until the first exchange has been timed).
  [[nodiscard]] std::size_t period() const noexcept { return choice_.period; }
  //! The current choice and its prediction.
  [[nodiscard]] const period_choice& choice() const noexcept { return choice_; }
  //! Decisions that changed the choice so far.
  [[nodiscard]] std::uint64_t changes() const noexcept { return changes_; }
  //! The network the last decision priced with.
  [[nodiscard]] const network_params& decision_network() const noexcept { return decision_net_; }
  //! The compute per step the last decision used (seconds).
  [[nodiscard]] double compute_per_step() const noexcept { return compute_per_step_; }

  //! Called by local_steps before each exchange: the round that ends took \p steps inner
  //! steps and \p compute_s seconds of this rank's compute, and \p inner_step inner steps
  //! have been taken in all (where the profile source reads the network).
  void round_ended(std::size_t steps, double compute_s, std::uint64_t inner_step) noexcept {
    round_steps_ = std::max<std::size_t>(steps, 1);
    round_compute_s_ = std::isfinite(compute_s) && compute_s > 0 ? compute_s : 0.0;
    inner_step_ = inner_step;
  }

  //! Every exchange keeps the chosen fraction.
  void plan(step_params& p) {
    p.set_all(choice_.kept_fraction);
    p.collective = collective_kind::automatic;
    p.gain_candidates.clear();
    ranks_ = p.ranks;
    planned_ = choice_;
  }

  //! What rides in the exchange to be averaged over the ranks: this round's compute and the
  //! previous exchange's measured communication (none when nothing measured is used).
  [[nodiscard]] std::span<const double> agreement_request() const noexcept {
    if (!uses_measured_compute() && options_.source != network_source::measured) return {};
    request_[0] = round_compute_s_;
    request_[1] = last_comm_s_;
    return {request_.data(), request_.size()};
  }
  //! The ranks' sums of agreement_request().
  void agreed(std::span<const double> sums) {
    if (sums.size() != request_.size() || ranks_ < 1) return;
    const double n = static_cast<double>(ranks_);
    agreed_compute_s_ = sums[0] / n;
    if (options_.source == network_source::measured && has_pending_ && sums[1] > 0) add_sample(pending_, sums[1] / n);
  }

  //! Learns from the exchange and decides the next round.
  void observe(const step_report& r) {
    if (r.skipped) return;
    const double f = planned_.kept_fraction;
    if (f < dense_fraction && r.collective != collective_kind::dense_allreduce) {
      compressed_collective_ = r.collective;
      const double values = f * numel_;
      if (values >= 1 && r.bytes_sent > 0) bytes_per_kept_ = static_cast<double>(r.bytes_sent) / values;
    }
    const cost_terms ran = terms(f, r.collective, static_cast<double>(r.bytes_sent));
    if (options_.source == network_source::modeled) {
      add_sample(ran, r.modeled_communicate_s);
    } else if (options_.source == network_source::measured) {
      pending_ = ran;
      has_pending_ = true;
      last_comm_s_ = r.communicate_s;
    }
    if (options_.time.source == time_source::simulated)
      compute_per_step_ = options_.time.compute_s;
    else if (agreed_compute_s_ > 0)
      compute_per_step_ = agreed_compute_s_ / static_cast<double>(round_steps_);
    ++exchanges_;
    decide();
  }

  //! Nothing to do at interval ends.
  void on_interval(const interval_info&) noexcept {}

  //! Serializes the state (the choice, the learned costs, the estimate's samples).
  void save(std::vector<std::byte>& out) const {
    out.clear();
    detail::state_writer w(out);
    w.header(state_tag, state_version, fingerprint_);
    w.put<std::uint64_t>(choice_.period);
    w.put(choice_.kept_fraction);
    w.put(choice_.predicted_step_s);
    w.put(choice_.predicted_share);
    w.put(compute_per_step_);
    w.put(agreed_compute_s_);
    w.put(bytes_per_kept_);
    w.put(last_comm_s_);
    w.put(pending_);
    w.put<std::uint8_t>(has_pending_ ? 1 : 0);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(compressed_collective_));
    w.put(exchanges_);
    w.put(changes_);
    w.put(decision_net_);
    w.put<std::uint64_t>(round_steps_);
    w.put(round_compute_s_);
    w.put(inner_step_);
    w.put_vector(samples_);
  }
  //! Restores what save() wrote; throws gravac::error, changing nothing, on bytes of
  //! another policy, version or configuration, or truncated bytes.
  void load(std::span<const std::byte> in) {
    detail::state_reader r(in, "local_steps_policy");
    r.header(state_tag, state_version, fingerprint_);
    period_choice c;
    c.period = static_cast<std::size_t>(r.get<std::uint64_t>());
    c.kept_fraction = r.get<double>();
    c.predicted_step_s = r.get<double>();
    c.predicted_share = r.get<double>();
    if (std::find(periods_.begin(), periods_.end(), c.period) == periods_.end() ||
        std::find(fractions_.begin(), fractions_.end(), c.kept_fraction) == fractions_.end())
      r.fail("the saved choice is not one of the candidates");
    const double compute = r.get<double>(), agreed = r.get<double>(), bpk = r.get<double>(),
                 last_comm = r.get<double>();
    const auto pending = r.get<cost_terms>();
    const auto has_pending = r.get<std::uint8_t>();
    const auto coll = r.get<std::uint8_t>();
    const auto exchanges = r.get<std::uint64_t>(), changes = r.get<std::uint64_t>();
    const auto net = r.get<network_params>();
    const auto steps = static_cast<std::size_t>(r.get<std::uint64_t>());
    const double round_compute = r.get<double>();
    const auto inner = r.get<std::uint64_t>();
    std::vector<sample> samples;
    const auto n = r.get<std::uint64_t>();
    if (n > options_.estimate_window) r.fail("the saved state holds more samples than the window");
    samples.resize(static_cast<std::size_t>(n));
    for (auto& s : samples) s = r.get<sample>();
    r.finish();
    if (has_pending > 1) r.fail("a flag holds a value other than 0 or 1");
    choice_ = c;
    compute_per_step_ = compute;
    agreed_compute_s_ = agreed;
    bytes_per_kept_ = bpk;
    last_comm_s_ = last_comm;
    pending_ = pending;
    has_pending_ = has_pending == 1;
    compressed_collective_ = static_cast<collective_kind>(coll);
    exchanges_ = exchanges;
    changes_ = changes;
    decision_net_ = net;
    round_steps_ = std::max<std::size_t>(steps, 1);
    round_compute_s_ = round_compute;
    inner_step_ = inner;
    samples_ = std::move(samples);
  }

  //! Predicted seconds of one exchange at kept fraction \p f under \p net.
  [[nodiscard]] double exchange_seconds(double f, const network_params& net) const noexcept {
    return terms(f, f >= dense_fraction ? collective_kind::dense_allreduce : compressed_collective_,
                 bytes_per_kept_ * f * numel_)
        .seconds(net);
  }

 private:
  static constexpr std::uint32_t state_tag = 0x5043534c;  // "LSCP"

  struct sample {
    cost_terms terms;
    double seconds = 0;
  };

  [[nodiscard]] bool uses_measured_compute() const noexcept { return options_.time.source != time_source::simulated; }

  // The cost terms of an exchange at fraction f that ran as collective c and sent
  // packet_bytes (one rank's packet).
  [[nodiscard]] cost_terms terms(double f, collective_kind c, double packet_bytes) const noexcept {
    const int n = std::max(ranks_, 1);
    if (f >= dense_fraction || c == collective_kind::dense_allreduce) return cost_model::dense_allreduce(n, numel_);
    switch (c) {
      case collective_kind::allreduce_compatible:
        return cost_model::ar_topk(n, numel_, f);
      case collective_kind::compressed_allreduce:
        return cost_model::compressed_allreduce(n, packet_bytes);
      default:
        return cost_model::allgather_packets(n, packet_bytes);
    }
  }

  void add_sample(const cost_terms& t, double seconds) {
    if (!(seconds > 0) || !std::isfinite(seconds)) return;
    samples_.push_back({t, seconds});
    if (samples_.size() > options_.estimate_window) samples_.erase(samples_.begin());
  }

  [[nodiscard]] network_params network_now() const {
    switch (options_.source) {
      case network_source::fixed:
        return options_.network;
      case network_source::profile:
        return options_.profile->at(inner_step_, 0.0);
      default:
        return fitted_network();
    }
  }

  // The network that best explains the window's exchange times in seconds (least squares
  // on absolute times, not relative ones: the policy prices the expected time of an
  // exchange, so a slow half of a changing network must weigh as much as it costs). One
  // shape of samples cannot split alpha from beta: the prior's split is scaled to them.
  [[nodiscard]] network_params fitted_network() const noexcept {
    const network_params& prior = options_.network;
    if (samples_.empty()) return prior;
    double sll = 0, slb = 0, sbb = 0, slt = 0, sbt = 0, smm = 0, smt = 0;
    for (const auto& s : samples_) {
      const double l = s.terms.latency * prior.alpha, b = s.terms.bytes * prior.beta, m = l + b;
      sll += l * l;
      slb += l * b;
      sbb += b * b;
      slt += l * s.seconds;
      sbt += b * s.seconds;
      smm += m * m;
      smt += m * s.seconds;
    }
    const double det = sll * sbb - slb * slb;
    double x = 0, y = 0;
    if (det > 1e-6 * sll * sbb) {
      x = (slt * sbb - sbt * slb) / det;
      y = (sll * sbt - slb * slt) / det;
      if (x < 0) {
        x = 0;
        y = sbb > 0 ? sbt / sbb : 0;
      } else if (y < 0) {
        y = 0;
        x = sll > 0 ? slt / sll : 0;
      }
    } else {
      x = y = smm > 0 ? smt / smm : 1.0;
    }
    // A fit of zero would make communication free: keep a sliver of the prior.
    return {std::max(x, 1e-6) * prior.alpha, std::max(y, 1e-6) * prior.beta};
  }

  // Seconds per inner step, and the share of it spent communicating, of H = h at fraction f.
  [[nodiscard]] period_choice price(std::size_t h, double f, const network_params& net) const noexcept {
    const double tc = exchange_seconds(f, net), hs = static_cast<double>(h);
    const double exposed = options_.overlap ? std::max(0.0, tc - hs * compute_per_step_) : tc;
    const double step = compute_per_step_ + exposed / hs;
    return {h, f, step, step > 0 ? (exposed / hs) / step : 0.0};
  }

  // The rule: T* is the fastest pair's time per step; in the order of preference (the
  // largest fraction, then the smallest H) the first pair within (1 + slack) T*. The current
  // pair keeps a wider slack, pairs before it in the order a narrower one (hysteresis).
  void decide() {
    const network_params net = network_now();
    decision_net_ = net;
    const double s = options_.slack, m = 1 + options_.margin;
    const auto rank_of = [&](const period_choice& c) {
      const auto h = std::find(periods_.begin(), periods_.end(), c.period) - periods_.begin();
      const auto f = std::find(fractions_.begin(), fractions_.end(), c.kept_fraction) - fractions_.begin();
      return f * static_cast<std::ptrdiff_t>(periods_.size()) + h;
    };
    const auto current = rank_of(choice_);
    period_choice fastest{};
    fastest.predicted_step_s = INFINITY;
    for (double f : fractions_)
      for (std::size_t h : periods_) {
        const period_choice c = price(h, f, net);
        if (c.predicted_step_s < fastest.predicted_step_s) fastest = c;
      }
    period_choice next = fastest;
    for (double f : fractions_)
      for (std::size_t h : periods_) {
        const period_choice c = price(h, f, net);
        const auto at = rank_of(c);
        const double limit = at == current ? s * m : (at < current ? s / m : s);
        if (at < rank_of(next) && c.predicted_step_s <= fastest.predicted_step_s * (1 + limit)) next = c;
      }
    if (next.period != choice_.period || next.kept_fraction != choice_.kept_fraction) ++changes_;
    choice_ = next;
  }

  options options_;
  double numel_ = 0;
  std::vector<double> fractions_;     // decreasing
  std::vector<std::size_t> periods_;  // increasing
  std::vector<sample> samples_;       // the estimate's window, for save/load (replayed in order)
  period_choice choice_{};
  period_choice planned_{};
  double compute_per_step_ = 0;
  double agreed_compute_s_ = 0;
  double bytes_per_kept_ = 8;
  double last_comm_s_ = 0;
  cost_terms pending_{};
  bool has_pending_ = false;
  collective_kind compressed_collective_ = collective_kind::allgather;
  std::uint64_t exchanges_ = 0;
  std::uint64_t changes_ = 0;
  network_params decision_net_{};
  int ranks_ = 1;
  std::size_t round_steps_ = 1;
  double round_compute_s_ = 0;
  std::uint64_t inner_step_ = 0;
  mutable std::array<double, 2> request_{};
  std::uint64_t fingerprint_ = 0;
};
static_assert(Policy<local_steps_policy>);

}  // namespace gravac
