#pragma once
// One training run of the reproduction on N thread ranks, which may diverge. A non-finite
// gradient (gravac::error with status::non_finite: the trainer's protocol agrees on it in
// the step's collective and throws it on every rank) ends the run as *diverged*: the run is
// recorded (where it stopped, every rank's message, the records up to there) and the
// experiment goes on with the next one. Any other failure propagates. Shared by
// reproduce.cpp, network_grid.cpp and block_scaled.cpp.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <gravac/comm/thread_communicator.hpp>
#include <gravac/core/error.hpp>
#include <string>
#include <vector>

#include "fmnist/method.hpp"
#include "fmnist/models.hpp"
#include "fmnist/report.hpp"
#include "fmnist/train.hpp"

namespace repro {

struct run_outcome {
  //! The run's records: complete when it finished; up to the last step before the failing
  //! one when it diverged (epochs: those evaluated before it).
  fmnist::run_result r;
  bool diverged = false;
  std::uint64_t diverged_step = 0;   //!< 0-based index of the step that failed (= steps done)
  std::size_t diverged_epoch = 0;    //!< 0-based epoch of that step
  std::string error;                 //!< the failing rank's message (the lowest such rank)
  std::vector<std::string> by_rank;  //!< every rank's message, by rank

  //! "diverged at step S (epoch E): message", 1-based step and epoch as a reader counts them.
  [[nodiscard]] std::string where() const {
    return "diverged at step " + std::to_string(diverged_step + 1) + " (epoch " + std::to_string(diverged_epoch + 1) +
           "): " + error;
  }
};

//! Trains \p cfg on \p ranks thread ranks. Returns the run, or, when a non-finite gradient
//! ended it, the run marked diverged. Throws whatever else failed (and a non-finite error
//! that did not reach every rank: the protocol says it must).
inline run_outcome train_run(int ranks, const fmnist::dataset& train, const fmnist::dataset& test,
                             const fmnist::run_config& cfg) {
  run_outcome o;
  // Rank 0's records so far, kept should a later step fail: the run so far at each epoch's
  // end, and each step after it.
  fmnist::run_result partial;
  std::size_t steps_per_epoch = 0;
  fmnist::train_observer obs;
  obs.on_step = [&](const fmnist::step_record& s, std::size_t, std::size_t per_epoch) {
    partial.steps.push_back(s);
    steps_per_epoch = per_epoch;
  };
  obs.on_epoch = [&](const fmnist::epoch_record&, const fmnist::run_result& so_far) { partial = so_far; };
  std::vector<gravac::status> codes(static_cast<std::size_t>(ranks), gravac::status::ok);
  std::vector<std::string> messages(static_cast<std::size_t>(ranks));
  try {
    gravac::run_ranks(ranks, [&](gravac::thread_communicator& comm) {
      const auto me = static_cast<std::size_t>(comm.rank());
      try {
        auto r = fmnist::train(comm, train, test, cfg, obs);
        if (comm.rank() == 0) o.r = std::move(r);
      } catch (const gravac::error& e) {
        codes[me] = e.code();
        messages[me] = e.what();
        throw;  // run_ranks aborts the team, so no rank waits on one that left
      }
    });
  } catch (const gravac::error& e) {
    if (e.code() != gravac::status::non_finite) throw;
    // The protocol throws the same error on every rank; a rank that did not (aborted by
    // the team, or finished) would mean the ranks disagreed on the step: a defect, not a
    // divergence.
    for (std::size_t r = 0; r < codes.size(); ++r)
      if (codes[r] != gravac::status::non_finite)
        throw gravac::error(gravac::status::diverged,
                            "a non-finite gradient was not reported on every rank (rank " + std::to_string(r) +
                                (messages[r].empty() ? std::string(" returned") : ": " + messages[r]) +
                                "); first: " + e.what());
    o.diverged = true;
    o.r = std::move(partial);
    if (o.r.epochs.empty()) {  // diverged before its first epoch ended: what the run is
      const auto net = fmnist::make_model(cfg.model, cfg.mlp_hidden);
      o.r.method = fmnist::method_name(cfg.method);
      o.r.model = net->name();
      o.r.params = net->num_params();
      o.r.network = cfg.network.describe();
      o.r.ranks = ranks;
      o.r.steps_per_epoch = steps_per_epoch;
    }
    o.diverged_step = o.r.steps.size();
    o.diverged_epoch = steps_per_epoch ? o.r.steps.size() / steps_per_epoch : 0;
    o.by_rank = messages;
    // Which rank's message is reported must not depend on which thread threw first: the
    // lowest rank that found the bad layer (a failing rank names it; the others name the
    // failing rank), else rank 0.
    o.error = messages.front();
    for (const auto& m : messages)
      if (m.find(" layer '") != std::string::npos) {
        o.error = m;
        break;
      }
  }
  return o;
}

//! Writes the run's steps.csv and epochs.csv into \p dir and, for a diverged run,
//! diverged.txt (where it stopped and every rank's message).
inline void write_run(const run_outcome& o, const std::string& dir) {
  fmnist::write_csv(o.r, dir);
  const std::string path = dir + "/diverged.txt";
  if (!o.diverged) {
    std::filesystem::remove(path);
    return;
  }
  std::ofstream f(path);
  f << o.where() << "\n";
  for (std::size_t r = 0; r < o.by_rank.size(); ++r) f << "rank " << r << ": " << o.by_rank[r] << "\n";
  if (!f) throw gravac::error(gravac::status::io_failure, "writing " + path + " failed");
}

//! A CSV field: quoted, with inner quotes doubled.
inline std::string csv_quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c == '\n' ? ' ' : c;
  }
  return q + "\"";
}

//! The CSV columns a run's row ends with: status (finished / diverged), diverged_epoch and
//! diverged_step (0-based; empty when it finished), error (the message).
inline std::string status_columns(const run_outcome& o) {
  if (!o.diverged) return "finished,,,";
  return "diverged," + std::to_string(o.diverged_epoch) + "," + std::to_string(o.diverged_step) + "," +
         csv_quoted(o.error);
}

}  // namespace repro
