#pragma once
//! \file train.hpp
//! \brief Data-parallel training of a Fashion-MNIST model on N ranks (MPI processes or
//! threads) with gravac between backward and optimizer, and what the run records.
//!
//! Every rank holds the whole (read-only) dataset and takes its shard of every global
//! batch: rank r of N trains on samples [r B/N, (r+1) B/N) of each batch of B drawn from
//! a permutation that every rank computes from the same seed. The gradient of the local
//! mean loss goes into the flat buffer, gravac turns it into the rank average, and every
//! rank applies the same SGD step, so parameters stay identical on all ranks.
//!
//! Two clocks are kept apart: the measured compute time (thread CPU time of forward,
//! backward and optimizer, the slowest rank per step) and the modeled time, which adds
//! per step a fixed compute time (calibrated once at the start, or given), the measured
//! compression time, and the communication time the simulated network charged.
//!
//! Two byte counts are kept apart too: the packet bytes (the size of what a rank's
//! collective hands over, gravac::step_report::bytes_sent) and the wire bytes the
//! simulated network counts for the algorithm it charges (an Allgather delivers the N-1
//! other packets into every rank; an Allreduce moves 2(N-1)/N of its buffer each way).
//! Comparisons between collectives should use the wire bytes.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <gravac/network/network_profile.hpp>
#include <string>
#include <vector>

#include "fmnist/checkpoint.hpp"
#include "fmnist/dataset.hpp"
#include "fmnist/method.hpp"
#include "fmnist/models.hpp"
#include "fmnist/records.hpp"
#include "fmnist/sgd.hpp"

namespace fmnist {

//! The modeled network the run is charged for.
struct network_config {
  //! none: no simulated network (communication is not modeled); constant: one bandwidth
  //! and latency; schedule: the flexible-communication paper's schedule (25 Gbit/s, 1 ms
  //! and 1 Gbit/s, 32 ms alternating every `phase_epochs` epochs); trace: a CSV file;
  //! random_walk: gravac::random_walk_profile's defaults (0.1-100 Gbit/s, 10 us-5 ms, a
  //! change every 10-200 steps) from `walk_seed`.
  enum class kind : std::uint8_t { none, constant, schedule, trace, random_walk } type = kind::constant;
  double gbps = 1;              //!< constant: bandwidth in Gbit/s
  double latency_s = 50e-6;     //!< constant: latency of one message in seconds
  double phase_epochs = 1;      //!< schedule: epochs per phase
  std::string trace_path;       //!< trace: the CSV file (see gravac::network_profile::parse_csv)
  std::uint64_t walk_seed = 1;  //!< random_walk: the walk's seed

  //! Parses "none", "1gbps", "10gbps", "2.5gbps:0.2ms", "schedule", "schedule:2" (epochs
  //! per phase), "trace:FILE" or "random-walk:SEED". Throws gravac::error on anything else.
  static network_config parse(const std::string& spec);
  //! The spelling parse() accepts, e.g. "1gbps:0.05ms".
  [[nodiscard]] std::string describe() const;
};

//! Everything a training run needs besides the data.
struct run_config {
  model_kind model = model_kind::mlp;             //!< which model
  std::vector<std::size_t> mlp_hidden{256, 128};  //!< hidden layers of the MLP
  std::size_t epochs = 5;                         //!< epochs to train
  std::size_t batch = 128;                        //!< global batch (all ranks together); divisible by the rank count
  std::size_t train_subset = 0;                   //!< samples per epoch (a fresh random subset each epoch); 0 = all
  //! Test samples evaluated after each epoch (a fixed random subset); 0 = all.
  std::size_t test_subset = 0;
  step_decay lr{0.05, 0.1, {}};  //!< learning-rate schedule (per epoch)
  double momentum = 0.9;         //!< SGD momentum
  double weight_decay = 1e-4;    //!< L2 weight decay
  std::uint64_t seed = 1;        //!< data order and initialisation (same on every rank)
  method_config method;          //!< compressor, collective, policy and their options
  network_config network;        //!< the modeled network (what policies and collectives see)
  //! Further networks charged for the same calls, whose clocks are only recorded
  //! (epoch_record::shadow_time_s): one run of a method whose decisions do not depend on
  //! the network gives its modeled time on several networks.
  std::vector<network_config> shadow_networks;
  //! How every simulated network prices an Allreduce: always a ring (`fixed`, the default),
  //! or the algorithm Open MPI 4.1 or NCCL would run for the call's rank count and size.
  gravac::allreduce_rule network_allreduce = gravac::allreduce_rule::fixed;
  double compute_s = -1;  //!< modeled compute per step; < 0 = calibrate at the start
  //! Overlap gravac's buckets with backward (--overlap on): each step is
  //! begin_step, forward_backward announcing each layer's gradient as it is final
  //! (trainer::ready with the layer's modeled ready time), finish. The parameters and
  //! every record but the times are those of the synchronous step with the same buckets;
  //! the modeled clock charges only the exposed communication (step_report::modeled_exposed_s).
  //! A layer's modeled ready time is compute_s times its share of the step's compute:
  //! measured (median of the calibration runs) when compute_s is calibrated, else the
  //! deterministic model of ready_share_model(). Not with shadow networks (refused).
  bool overlap = false;
  //! Local-step training (--local-steps): method.local's rounds of inner steps, each ending
  //! in an exchange of the pseudo-gradient through the method's compressor and collective
  //! (gravac::runtime::make_local_steps; the policy must be fixed). A step without an
  //! exchange records no bytes. The run ends with finish_round, after its last checkpoint:
  //! the round in progress is exchanged (charged to the last step and epoch), and the last
  //! epoch's test figures and final_params are the global point every rank holds. Not with
  //! overlap (local.overlap runs an exchange behind the next round instead; the records of
  //! the steps it runs behind are then written once it has completed).
  bool local_steps = false;
  //! With overlap: each layer's ready time as a share of compute_s (layout order), given
  //! (e.g. run_result::ready_share of a calibrated run, so that several runs share one
  //! modeled timeline); empty: measured or modeled as described above.
  std::vector<double> ready_share;
  bool codec_cpu_time = true;  //!< compression time as thread CPU time (threads) or wall time (MPI)
  //! Charge the measured compression time to the modeled clocks (the run's, the simulated
  //! networks', GraVAC's simulated one). Off, every modeled figure and every decision
  //! depends on the data alone, not on the machine: the run is reproducible, and a resumed
  //! run matches an uninterrupted one in everything but the measured times.
  bool charge_codec = true;
  std::size_t max_steps = 0;  //!< stop after this many steps (0 = all epochs)
  //! Rank 0 creates this file when every rank is about to take the first step (empty:
  //! none); the network lab starts its rate schedule then (scripts/netlab --start-file).
  std::string start_marker;
  checkpoint_config checkpoint;  //!< checkpoints and resume (off when checkpoint.dir is empty)
  fault_config fault;            //!< test hook: a rank that kills itself
};

//! The settings a checkpoint must have been written with to be resumed (model, data,
//! optimizer, method, networks, rank count); epochs and max_steps may change between
//! runs. One line, for the error that names what differs.
std::string describe_settings(const run_config& cfg, int ranks);

//! What a run recorded (complete on every rank).
struct run_result {
  std::string method;               //!< "topk + allgather + gravac"
  std::string model;                //!< the model's name
  std::string network;              //!< the network's spelling
  int ranks = 1;                    //!< ranks that trained
  std::size_t params = 0;           //!< parameters of the model
  std::size_t steps_per_epoch = 0;  //!< optimizer steps per epoch
  double compute_per_step_s = 0;    //!< the modeled compute per step
  bool overlap = false;             //!< buckets overlapped with backward (run_config::overlap)
  std::size_t buckets = 1;          //!< buckets of a step
  //! With overlap: each layer's modeled ready time as a share of compute_per_step_s.
  std::vector<double> ready_share;
  std::vector<step_record> steps;    //!< one per step
  std::vector<epoch_record> epochs;  //!< one per epoch
  //! The parameters after the last step, identical on every rank (with local steps, the
  //! global point after finish_round).
  std::vector<float> final_params;
  //! The step the run resumed from (the checkpoint's steps done); 0 when it started afresh.
  std::uint64_t resumed_from_step = 0;
  bool resumed = false;  //!< the run resumed from a checkpoint
  //! Total packet bytes a rank handed over (step_record::bytes_sent summed).
  [[nodiscard]] double total_bytes_per_rank() const;
  //! Total wire bytes a rank sent (mean over ranks; 0 without a simulated network).
  [[nodiscard]] double total_wire_bytes_sent_per_rank() const;
  //! Total wire bytes a rank received (mean over ranks; 0 without a simulated network).
  [[nodiscard]] double total_wire_bytes_received_per_rank() const;
  //! Modeled time at which test accuracy first reached \p target (negative if never);
  //! \p shadow selects a shadow network's clock (-1: the primary network).
  [[nodiscard]] double modeled_time_to(double target, int shadow = -1) const;
};

//! The deterministic model of the layers' ready times used with --overlap on and a given
//! --compute-s: forward takes a third of the step's compute, backward the rest, each
//! layer's backward in proportion to its parameter count, in the order \p backward_order
//! (the order the model announces its layers in). Returns each layer's ready time as a
//! share of the step's compute (layout order); the last layer announced ends at 1.
std::vector<double> ready_share_model(const gravac::layout& lay, const std::vector<std::size_t>& backward_order);

//! Total modeled communication and its exposed part of a run (per-rank sums of the
//! epochs), and their ratio (1 without communication).
struct exposure {
  double total_s = 0;    //!< modeled communication
  double exposed_s = 0;  //!< of it, not hidden behind backward
  [[nodiscard]] double ratio() const { return total_s > 0 ? exposed_s / total_s : 1.0; }
};
//! The exposure of \p r (its epochs summed).
exposure exposure_of(const run_result& r);

//! Rank-0 callbacks while training (progress bar, per-epoch lines); may be empty.
struct train_observer {
  //! After each step.
  std::function<void(const step_record&, std::size_t step_in_epoch, std::size_t steps_per_epoch)> on_step;
  std::function<void(const epoch_record&, const run_result&)> on_epoch;  //!< after each epoch's evaluation
};

//! Trains on this rank (\p comm is this rank's engine; every rank calls this together).
//! \p obs is called on rank 0 only. Throws gravac::error on invalid settings.
run_result train(host_comm comm, const dataset& train_set, const dataset& test_set, const run_config& cfg,
                 const train_observer& obs = {});

}  // namespace fmnist
