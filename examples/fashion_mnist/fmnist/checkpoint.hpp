#pragma once
//! \file checkpoint.hpp
//! \brief The example's checkpoints: what a killed training needs to resume bit for bit,
//! in files written atomically with a checksum.
//!
//! A checkpoint is taken at a step boundary and is two files per rank in the checkpoint
//! directory, both named by the number of steps done:
//!
//! - `step-<steps>.rank-<r>.run`: the run state (run_state): model parameters, optimizer
//!   velocity, the data order (the epoch's permutation, the generator's state, the
//!   position in the epoch), the clocks and counters, the epoch's running sums and every
//!   record (the CSV rows) so far;
//! - `step-<steps>.rank-<r>.gravac`: gravac's trainer checkpoint (residuals, policy,
//!   compressor and collective state; gravac/checkpoint.hpp).
//!
//! Each file is written to a temporary name, flushed to disk (fsync) and renamed, so a
//! file either is complete or does not exist under its name. The run file is
//!
//! | field | bytes |
//! |---|---|
//! | magic "FMNRUN\0\0" | 8 |
//! | format version (u32), 0 (u32) | 8 |
//! | payload bytes (u64) | 8 |
//! | FNV-1a 64 of the payload (u64) | 8 |
//! | payload | payload bytes |
//!
//! A checkpoint counts only when every rank has both files and both decode; a resume picks
//! the newest such checkpoint (every rank the same one) and reports on stderr, naming the
//! file and the reason, every newer one it skips (truncated, corrupted, missing on a rank).

#include <cstddef>
#include <cstdint>
#include <gravac/atomic_file.hpp>
#include <gravac/comm/simulated_communicator.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fmnist/records.hpp"

namespace fmnist {

//! When and where the example writes checkpoints, and whether it resumes from one.
struct checkpoint_config {
  std::string dir;        //!< checkpoint directory; empty: no checkpoints
  std::size_t every = 1;  //!< period, in `unit`s (positive)
  //! steps: after every `every` steps (counted from the run's start, at any point of an
  //! epoch); epochs: after every `every` epochs (after the epoch's evaluation).
  enum class unit : std::uint8_t { steps, epochs } every_unit = unit::epochs;
  bool resume = false;   //!< start from the newest usable checkpoint in `dir`
  std::size_t keep = 2;  //!< checkpoints kept; older ones are deleted once a newer one is complete

  //! Parses a period: "100" or "100s" (steps), "1e" (epochs). Throws gravac::error with
  //! the accepted forms on anything else (0, negative, other suffixes).
  static checkpoint_config parse_every(const std::string& spec);
};

//! Test hook: rank `kill_rank` sends itself SIGKILL just before step `kill_step` (a
//! process killed without warning: no destructor, no flush, no MPI_Abort).
struct fault_config {
  int kill_rank = -1;           //!< the rank to kill (negative: none)
  std::uint64_t kill_step = 0;  //!< the step it dies before (0-based; steps done at that moment)
};

//! Everything of a rank's training loop between two steps that is not gravac's trainer
//! state and not derived from the settings.
struct run_state {
  std::string settings;              //!< describe_settings() of the writer's configuration
  std::int64_t rank = 0;             //!< rank that wrote it
  std::int64_t ranks = 1;            //!< ranks of the writer's run
  std::uint64_t step = 0;            //!< steps done
  std::uint64_t epoch = 0;           //!< the epoch in progress (or the next one, when !epoch_started)
  std::uint64_t step_in_epoch = 0;   //!< steps of `epoch` done
  bool epoch_started = false;        //!< `epoch`'s permutation has been drawn into `order`
  std::string data_rng;              //!< the data-order generator (std::mt19937_64 as operator<< writes it)
  std::vector<std::uint32_t> order;  //!< the permutation of the training set (shuffled in place each epoch)
  std::vector<float> params;         //!< model parameters
  std::vector<float> velocity;       //!< SGD momentum buffer
  double compute_s = 0;              //!< the modeled compute per step (calibrated or given)
  //! With --overlap on: each layer's ready time as a share of compute_s, as the run uses
  //! it (measured with a calibrated compute_s, given, or modeled); empty without overlap.
  std::vector<double> ready_share;
  double modeled_clock = 0;                      //!< the primary network's modeled clock as recorded
  std::vector<double> shadow_clock;              //!< each shadow network's recorded clock
  double wire_sent_before = 0;                   //!< the primary network's wire-bytes counter at the last record
  double wire_received_before = 0;               //!< the same, received
  std::vector<gravac::simulated_counters> sims;  //!< every simulated network's totals (shadows, primary)
  // The epoch in progress (meaningful when epoch_started).
  double loss_sum = 0;               //!< sum of the step losses of the epoch so far
  double correct = 0;                //!< correct training predictions so far
  double seen = 0;                   //!< training samples so far
  double frac_sum = 0;               //!< sum of the chosen kept fractions so far
  double epoch_wall_s = 0;           //!< wall time of the epoch so far
  epoch_record partial;              //!< the epoch's record so far (its sums)
  std::vector<step_record> steps;    //!< every step's record so far
  std::vector<epoch_record> epochs;  //!< every finished epoch's record
  //! --local-steps: the local steps' state (any_local_steps::save_state), kept here, under
  //! the run file's checksum, in place of a gravac trainer file; empty otherwise.
  std::vector<std::byte> local_steps_state;
};

//! Encodes \p s with header and checksum.
std::vector<std::byte> encode_run_state(const run_state& s);
//! Decodes a run file. Throws gravac::error(io_failure) saying why a file is unusable:
//! truncated, not a run file, another format version, checksum mismatch, malformed.
run_state decode_run_state(std::span<const std::byte> bytes, const std::string& what);

//! Writes \p bytes to \p path atomically (gravac::write_file_atomically: a crash leaves
//! the old file or the new one, never a torn one).
using gravac::write_file_atomically;
//! The whole file at \p path. Throws gravac::error(io_failure) if it cannot be read.
std::vector<std::byte> read_whole_file(const std::string& path);

//! `<dir>/step-<steps, 10 digits>.rank-<rank>.<kind>` (kind "run" or "gravac").
std::string checkpoint_file(const std::string& dir, std::uint64_t steps, int rank, const std::string& kind);
//! The step counts of the checkpoints of \p rank found in \p dir (a run file or a gravac
//! file present), newest first.
std::vector<std::uint64_t> checkpoint_steps(const std::string& dir, int rank);
//! Deletes \p rank's files of every checkpoint in \p dir older than the \p keep newest
//! ones at or below \p newest (\p newest, just completed, is kept).
void prune_checkpoints(const std::string& dir, int rank, std::uint64_t newest, std::size_t keep);

//! FNV-1a 64 of \p bytes (the run file's checksum; also the parameters' fingerprint).
std::uint64_t fnv1a64(std::span<const std::byte> bytes) noexcept;

}  // namespace fmnist
