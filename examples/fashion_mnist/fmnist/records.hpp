#pragma once
//! \file records.hpp
//! \brief What a Fashion-MNIST run records per step and per epoch (the rows of steps.csv
//! and epochs.csv).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fmnist {

//! One step, averaged (or maximized, for times) over the ranks.
struct step_record {
  std::uint64_t step = 0;    //!< global step
  std::size_t epoch = 0;     //!< 0-based epoch
  double lr = 0;             //!< learning rate used
  double loss = 0;           //!< mean training loss over the global batch (before the update)
  double train_acc = 0;      //!< training accuracy over the global batch
  double kept_fraction = 1;  //!< kept fraction the policy chose (numel-weighted over layers)
  double bytes_sent = 0;     //!< packet bytes: the size of a rank's own packet (mean over ranks)
  double dense_bytes = 0;    //!< what a dense fp32 Allreduce would send
  //! Wire bytes a rank sent since the previous step's record (mean over ranks), as the
  //! primary simulated network counts them: every collective of the step, control traffic
  //! included (0 without a simulated network).
  double wire_bytes_sent = 0;
  double wire_bytes_received = 0;  //!< wire bytes a rank received, counted like wire_bytes_sent
  std::string collective;          //!< the aggregation used
  double gain = 1;                 //!< compression gain of what was sent
  double compute_s = 0;            //!< measured compute (slowest rank)
  double codec_s = 0;              //!< measured compression + decompression (slowest rank)
  double modeled_comm_s = 0;       //!< communication time charged by the simulated network
  //! Of modeled_comm_s, the part not hidden behind backward (step_report::modeled_exposed_s
  //! with --overlap on; all of it for the synchronous step).
  double modeled_exposed_s = 0;
  double modeled_time_s = 0;  //!< modeled clock after this step
  double bandwidth_gbps = 0;  //!< modeled bandwidth during the step (0 without a network)
  double latency_ms = 0;      //!< modeled latency during the step
  //! Measured wall time of the step, forward to optimizer (slowest rank): the clock a
  //! user's loop sees, on the network the ranks really use.
  double wall_s = 0;
  //! Of wall_s, the measured wall time of the gradient exchange outside backward
  //! (compression, communication, decompression; with overlap, what finish() waited;
  //! slowest rank).
  double exchange_wall_s = 0;
};

//! One epoch.
struct epoch_record {
  std::size_t epoch = 0;                    //!< 0-based epoch
  double lr = 0;                            //!< learning rate of the epoch
  double train_loss = 0;                    //!< mean training loss over the epoch
  double train_acc = 0;                     //!< training accuracy over the epoch
  double test_loss = 0;                     //!< test loss after the epoch
  double test_acc = 0;                      //!< test accuracy after the epoch
  double bytes_per_rank = 0;                //!< packet bytes a rank handed over during the epoch
  double dense_bytes_per_rank = 0;          //!< what dense fp32 Allreduce would have sent
  double wire_bytes_sent_per_rank = 0;      //!< wire bytes a rank sent during the epoch (mean over ranks)
  double wire_bytes_received_per_rank = 0;  //!< wire bytes a rank received during the epoch (mean over ranks)
  double kept_fraction = 1;                 //!< mean chosen kept fraction over the epoch's steps
  double compute_s = 0;                     //!< measured compute during the epoch
  double codec_s = 0;                       //!< measured compression time during the epoch
  double modeled_comm_s = 0;                //!< modeled communication time during the epoch
  double modeled_exposed_s = 0;             //!< of modeled_comm_s, the part not hidden behind backward
  double modeled_time_s = 0;                //!< modeled clock at the end of the epoch
  std::vector<double> shadow_time_s;        //!< modeled clock on each shadow network at the end of the epoch
  double wall_s = 0;                        //!< wall time of the epoch (with evaluation)
  double train_wall_s = 0;     //!< wall time of the epoch's steps (no evaluation): time to accuracy on the clock
  double exchange_wall_s = 0;  //!< measured exchange wall time during the epoch (step_record::exchange_wall_s summed)
  std::string policy_state;    //!< the policy's state at the end of the epoch
};

}  // namespace fmnist
