#pragma once
//! \file
//! \brief What a policy decides for a step (step_params) and what a step reports back
//! (compress_stats from the compressor, step_report from the trainer).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace gravac {

//! Which aggregation a switching collective should use; fixed collectives ignore it.
enum class collective_kind : std::uint8_t {
  automatic = 0,             //!< let the collective decide (e.g. by its cost model)
  dense_allreduce = 1,       //!< decompress locally, Allreduce the dense buffer
  allgather = 2,             //!< Allgather variable-length packets
  allreduce_compatible = 3,  //!< AR-Topk: shared indices, Allreduce of the values
  compressed_allreduce = 4,  //!< reduce-scatter of compressed shards, recompression, Allgather
};

//! Short name of a collective kind.
constexpr std::string_view to_string(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::automatic:
      return "automatic";
    case collective_kind::dense_allreduce:
      return "dense_allreduce";
    case collective_kind::allgather:
      return "allgather";
    case collective_kind::allreduce_compatible:
      return "allreduce_compatible";
    case collective_kind::compressed_allreduce:
      return "compressed_allreduce";
  }
  return "unknown";
}

//! Why a policy sent a step less compressed than its current choice.
enum class fallback_reason : std::uint8_t {
  none = 0,                  //!< sent at the policy's choice
  candidate_gain_below_eps,  //!< GraVAC: the candidate's smoothed gain was below eps, sent at CF_min
  minimum_gain_below_eps,    //!< GraVAC: the gains of the candidate and of CF_min were below eps, sent dense
};

//! Short name of a fallback reason.
constexpr std::string_view to_string(fallback_reason f) noexcept {
  switch (f) {
    case fallback_reason::none:
      return "none";
    case fallback_reason::candidate_gain_below_eps:
      return "candidate_gain_below_eps";
    case fallback_reason::minimum_gain_below_eps:
      return "minimum_gain_below_eps";
  }
  return "unknown";
}

//! A kept fraction of 1 (or more) means "send this layer uncompressed".
inline constexpr double dense_fraction = 1.0;

//! Number of values kept of \p numel at kept fraction \p fraction: rounded to nearest,
//! at least one when the fraction is positive and the layer is not empty, at most numel.
//! Every compressor uses this so that ranks and compressors agree on k.
constexpr std::size_t kept_count(std::size_t numel, double fraction) noexcept {
  if (numel == 0 || !(fraction > 0.0)) return 0;
  if (fraction >= 1.0) return numel;
  const double k = std::floor(fraction * static_cast<double>(numel) + 0.5);
  return std::clamp<std::size_t>(static_cast<std::size_t>(k), 1, numel);
}

//! The parameters of one step, decided by the policy identically on every rank. A setting
//! that only one compressor acts on is that compressor's step_settings (AdaComp's bin
//! length, PowerSGD's rank: concept_compressor.md), not a field here.
struct step_params {
  std::uint64_t step = 0;                   //!< global step counter
  std::uint64_t seed = 0;                   //!< seed shared by all ranks (random-k, stochastic rounding)
  std::vector<double> kept_fraction;        //!< per layer; >= 1 sends the layer dense
  double global_fraction = dense_fraction;  //!< kept fraction when a compressor selects over the whole buffer
  collective_kind collective = collective_kind::automatic;  //!< hint for switching collectives
  //! Kept fractions whose gain the compressor must report, in the order of
  //! step_report::gain_curve (owned: a policy copies its request; no allocation once sized).
  std::vector<double> gain_candidates;
  bool collect_norms = true;  //!< fill per-layer norms even on the dense fast path
  int ranks = 1;              //!< number of ranks (cast16 divides by it before the sum)

  //! Sets every layer (and the whole-buffer fraction) to \p f.
  void set_all(double f) {
    std::fill(kept_fraction.begin(), kept_fraction.end(), f);
    global_fraction = f;
  }
  //! True when every layer is sent dense.
  [[nodiscard]] bool all_dense() const noexcept {
    return global_fraction >= dense_fraction &&
           std::all_of(kept_fraction.begin(), kept_fraction.end(), [](double f) { return f >= dense_fraction; });
  }
};

//! What a compressor measured about one layer while compressing.
struct layer_stats {
  std::size_t kept = 0;  //!< values (or codes) sent for this layer
  double grad_sq = 0;    //!< ||g_l||^2 of the local gradient
  double input_sq = 0;   //!< ||u_l||^2, u = g + e
  double kept_sq = 0;    //!< ||C(u_l)||^2, the energy sent
};

//! What a compressor measured while compressing one step's buffer.
struct compress_stats {
  std::vector<layer_stats> layers;        //!< one per layer of the layout
  std::vector<double> candidate_kept_sq;  //!< for each gain candidate: ||C_c(u)||^2 over the buffer
  bool non_finite = false;                //!< a NaN or infinity was seen in g or e

  //! Resets counters without releasing memory (no allocation after the first step).
  void reset(std::size_t n_layers, std::size_t n_candidates) {
    layers.assign(n_layers, layer_stats{});
    candidate_kept_sq.assign(n_candidates, 0.0);
    non_finite = false;
  }
  //! Joins a bucket's statistics \p st, whose first layer here is \p first_layer: its
  //! layers copied into place, its gain-curve energies added (in the order buckets join,
  //! so every rank sums the same bits), its non-finite flag or-ed in.
  void add_bucket(const compress_stats& st, std::size_t first_layer) {
    if (candidate_kept_sq.size() < st.candidate_kept_sq.size())
      candidate_kept_sq.resize(st.candidate_kept_sq.size(), 0.0);
    for (std::size_t i = 0; i < st.layers.size(); ++i) layers[first_layer + i] = st.layers[i];
    for (std::size_t c = 0; c < st.candidate_kept_sq.size(); ++c) candidate_kept_sq[c] += st.candidate_kept_sq[c];
    non_finite = non_finite || st.non_finite;
  }
  //! ||u||^2 over the buffer.
  [[nodiscard]] double input_sq() const noexcept {
    double s = 0;
    for (const auto& l : layers) s += l.input_sq;
    return s;
  }
  //! ||C(u)||^2 over the buffer.
  [[nodiscard]] double kept_sq() const noexcept {
    double s = 0;
    for (const auto& l : layers) s += l.kept_sq;
    return s;
  }
};

//! Compression gain ||C(u)|| / ||u|| from squared norms; 1 for an all-zero input.
constexpr double gain_from_sq(double kept_sq, double input_sq) noexcept {
  return input_sq > 0 ? std::sqrt(kept_sq / input_sq) : 1.0;
}

//! The measured times of one step.
struct step_times {
  double compress_s = 0;     //!< seconds compressing
  double communicate_s = 0;  //!< seconds in the collective
  double decompress_s = 0;   //!< seconds decompressing and averaging
  double iteration_s = 0;    //!< the caller's compute before the step
};

//! What one trainer step did: the parameters used, bytes, gains and times.
//! Reused from step to step (no allocation after the first).
struct step_report {
  std::uint64_t step = 0;  //!< the step this reports
  std::vector<double>
      kept_fraction;  //!< per layer: values sent / numel (achieved; averaged over ranks when the policy asks)
  std::vector<double> layer_grad_norm;  //!< per layer ||g_l|| (averaged over ranks when the policy asks)
  std::vector<double> gain_candidates;  //!< the candidate kept fractions of gain_curve (step_params order)
  //! gain_curve[i]: the gain at gain_candidates[i] (averaged over ranks when the policy asks).
  std::vector<double> gain_curve;
  double gain = 1;              //!< ||C(u)|| / ||u|| of what was sent
  std::size_t bytes_sent = 0;   //!< bytes this rank put on the wire
  std::size_t dense_bytes = 0;  //!< bytes a dense fp32 Allreduce would have sent
  //! Bytes this rank sent on the wire by the algorithm of the collective used (a ring
  //! Allreduce's 2(N-1)/N of the buffer, an Allgather's forwarding of the N-1 other
  //! packets, an all-to-all's blocks to the others; the rules of network/wire_bytes.hpp).
  //! 0 where a collective does not count them.
  double wire_bytes_sent = 0;
  double wire_bytes_received = 0;  //!< bytes this rank received on the wire (as wire_bytes_sent)
  collective_kind collective = collective_kind::dense_allreduce;  //!< the aggregation used
  fallback_reason fallback = fallback_reason::none;               //!< why the policy sent this step less compressed
  double compress_s = 0;             //!< seconds spent compressing (this rank's; times are not agreed per step)
  double communicate_s = 0;          //!< seconds in the collective (measured)
  double decompress_s = 0;           //!< seconds decompressing and averaging
  double modeled_communicate_s = 0;  //!< seconds charged by a network model (0 without one)
  //! Of modeled_communicate_s, the part not hidden behind backward: the buckets' modeled
  //! messages on one communication timeline, each bucket starting once it is ready and the
  //! previous one is done, minus the backward time (all of it for the synchronous step).
  double modeled_exposed_s = 0;
  //! Measured seconds the caller waited for communication after backward: finish()'s wait
  //! in an asynchronous step, the whole aggregation in the synchronous one.
  double exposed_communicate_s = 0;
  std::size_t buckets = 1;  //!< buckets the step was aggregated in (trainer options::bucket_bytes)
  double iteration_s =
      0;  //!< wall time from the previous step's return to this step's call: the caller's compute (0 at first)
  bool skipped = false;                  //!< the step was skipped (non-finite gradient, skip mode)
  bool statistics_synchronized = false;  //!< norms, gains and kept fractions were averaged over ranks
  //! The previous step's measured times averaged over the ranks: they ride in this step's
  //! collective (a step's times are known only after its collective), for statistics
  //! policies. Valid when previous_times_agreed is set.
  step_times previous_times{};
  bool previous_times_agreed = false;  //!< previous_times holds the ranks' average of the previous step
};

}  // namespace gravac

namespace gravac {

//! The end of an interval (an epoch, or every F steps), passed to Policy::on_interval.
struct interval_info {
  std::uint64_t step = 0;    //!< steps completed so far
  std::uint64_t epoch = 0;   //!< epochs completed so far
  double learning_rate = 0;  //!< the learning rate for the next interval
  double samples = 0;        //!< samples processed (all ranks) during the interval
};

}  // namespace gravac
