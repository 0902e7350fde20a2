// fashion_mnist: data-parallel training of an MLP or a small CNN on the real
// Fashion-MNIST data, with gravac compressing and aggregating the gradients.
//
//   mpiexec -n 4 ./fashion_mnist                      # 4 MPI ranks, GraVAC + top-k, 1 Gbit/s modeled
//   ./fashion_mnist --ranks 4                         # 4 ranks as threads in one process
//   ./fashion_mnist --policy fixed --kept-fraction 0.01 --network 10gbps
//   ./fashion_mnist --help                            # every compressor, collective, policy and knob
//   mpiexec -n 4 ./fashion_mnist --checkpoint-dir ck --checkpoint-every 100   # checkpoint every 100 steps
//   mpiexec -n 4 ./fashion_mnist --checkpoint-dir ck --checkpoint-every 100 --resume  # after a crash
//   mpiexec -n 4 ./fashion_mnist --model cnn --overlap on --bucket-mb 0.05   # buckets overlapped with backward
//   mpiexec -n 4 ./fashion_mnist --collective-timeout 600   # a hung rank ends the job after 10 minutes
//   ./fashion_mnist --ranks 4 --local-steps --compressor sparseloco --policy fixed --local-adaptive
//       --outer averaging --network 0.05gbps:50ms   # (one command) local steps, H chosen from the network
//
// Each rank trains on its shard of every global batch; gravac turns the local gradients
// into their (compressed) average; every rank applies the same SGD step. Rank 0 prints a
// progress bar, one line per epoch and a summary, and writes steps.csv, epochs.csv and
// PNG plots into the output directory.
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <gravac/comm/mpi_communicator.hpp>
#include <gravac/comm/mpi_guard.hpp>
#include <gravac/comm/thread_communicator.hpp>
#include <gravac/runtime/option_table.hpp>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fmnist/report.hpp"
#include "fmnist/train.hpp"

namespace {

// The command-line names of an enum's table, in the table's order. The enum options are
// parsed as these names (CLI::IsMember) and mapped to their values after parsing, so that
// --help and the error of a wrong value list the names only (a CLI::CheckedTransformer
// over the enum's map printed the raw std::uint8_t values as control characters).
template <class E, std::size_t N>
std::vector<std::string> names(const fmnist::named<E> (&table)[N]) {
  std::vector<std::string> v;
  for (const auto& n : table) v.emplace_back(n.name);
  return v;
}

// The value whose name is \p name (a name that IsMember accepted).
template <class E, std::size_t N>
E value_of(const fmnist::named<E> (&table)[N], const std::string& name) {
  for (const auto& n : table)
    if (n.name == name) return n.value;
  throw std::invalid_argument("unknown choice '" + name + "'");
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel Fashion-MNIST training with gravac's compressed gradient aggregation"};
  fmnist::run_config cfg;
  std::string backend = "auto", network = "1gbps", out_dir, data_dir = fmnist::default_data_dir, model = "mlp";
  std::string network_allreduce = "ring";
  int ranks = 4;
  bool progress = isatty(STDOUT_FILENO) != 0, no_plots = false;
  double lr_gamma = 0.1;
  std::string overlap = "off";
  std::vector<std::size_t> milestones;

  app.add_option("--backend", backend,
                 "mpi (one rank per process, under mpiexec), threads (--ranks threads in one "
                 "process) or auto (mpi when launched by mpiexec)")
      ->check(CLI::IsMember({"auto", "mpi", "threads"}))
      ->capture_default_str();
  app.add_option("--ranks", ranks, "ranks for the threads backend")->check(CLI::Range(1, 256))->capture_default_str();
  double collective_timeout_s = 0;
  app.add_option("--collective-timeout", collective_timeout_s,
                 "mpi backend: seconds one collective may take before the job ends with a message naming the rank "
                 "and the collective, as when a peer rank hangs; choose it well above the longest a healthy rank "
                 "spends between two collectives (a step, an evaluation, a checkpoint). 0: off, wait forever")
      ->check(CLI::Validator(
          [](std::string& v) {
            // Not CLI::NonNegativeNumber: its error prints the range up to DBL_MAX in full, and NaN passes it.
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            const bool ok = !v.empty() && end == v.c_str() + v.size() && std::isfinite(x) && x >= 0;
            return ok ? std::string() : "must be 0 (off) or a positive number of seconds, not " + v;
          },
          "SECONDS"))
      ->capture_default_str();
  app.add_option("--data-dir", data_dir, "directory of the Fashion-MNIST IDX .gz files")->capture_default_str();
  app.add_option("--out", out_dir,
                 "output directory for CSV files and plots (default out/fashion_mnist-<policy>-<compressor>)");
  app.add_flag("--progress,!--no-progress", progress, "progress bar per epoch (default: when stdout is a terminal)");
  app.add_flag("--no-plots", no_plots, "do not run gnuplot");

  auto* tr = app.add_option_group("training");
  tr->add_option("--model", model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}))->capture_default_str();
  tr->add_option("--hidden", cfg.mlp_hidden, "hidden layer sizes of the MLP")->delimiter(',')->capture_default_str();
  tr->add_option("--epochs", cfg.epochs, "epochs")->check(CLI::PositiveNumber)->capture_default_str();
  tr->add_option("--batch", cfg.batch, "global batch size (all ranks; divisible by the rank count)")
      ->capture_default_str();
  tr->add_option("--train-subset", cfg.train_subset,
                 "training samples per epoch, a fresh random subset each epoch (0: all 60000)")
      ->capture_default_str();
  tr->add_option("--test-subset", cfg.test_subset, "test samples evaluated per epoch (0: all 10000)")
      ->capture_default_str();
  tr->add_option("--lr", cfg.lr.base, "learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  tr->add_option("--lr-gamma", lr_gamma, "step decay factor")->capture_default_str();
  tr->add_option("--lr-milestones", milestones, "epochs (0-based) at which the learning rate is multiplied by gamma")
      ->delimiter(',');
  tr->add_option("--momentum", cfg.momentum, "SGD momentum")->capture_default_str();
  tr->add_option("--weight-decay", cfg.weight_decay, "L2 weight decay")->capture_default_str();
  tr->add_option("--seed", cfg.seed, "seed of data order and initialisation")->capture_default_str();
  tr->add_option("--max-steps", cfg.max_steps, "stop after this many steps (0: all epochs)");
  tr->add_option("--mark-start", cfg.start_marker,
                 "create this file (rank 0) when every rank is about to take the first step: the network lab "
                 "(scripts/netlab --start-file) starts its rate schedule then");

  std::string checkpoint_every = "1e", save_params;
  auto* ck = app.add_option_group("checkpoints");
  ck->add_option("--checkpoint-dir", cfg.checkpoint.dir,
                 "write checkpoints into this directory (each rank its own files; the last two are kept)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  ck->add_option("--checkpoint-every", checkpoint_every,
                 "checkpoint period: N or Ns = every N steps, Ne = every N epochs (after the evaluation)")
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  ck->add_flag("--resume", cfg.checkpoint.resume,
               "resume from the newest checkpoint in --checkpoint-dir that every rank can use (a corrupted or "
               "truncated newer one is reported and skipped); start afresh when the directory holds none. With a "
               "fixed --compute-s and --no-codec-time the run ends bit for bit as if it had not stopped");
  ck->add_option("--save-params", save_params, "write the final parameters to this file (raw float32)");
  ck->add_option("--fault-kill-rank", cfg.fault.kill_rank,
                 "testing: this rank sends itself SIGKILL before step --fault-kill-step")
      ->check(CLI::NonNegativeNumber);
  ck->add_option("--fault-kill-step", cfg.fault.kill_step, "testing: the step (0-based) --fault-kill-rank dies before");

  auto& m = cfg.method;
  // The example's defaults, where they differ from the library's: GraVAC evaluates a
  // candidate every 100 steps (the library's default is one epoch), so that a run of a few
  // epochs shows the search; its clock and the flexible collective's alpha and beta come
  // from the modeled network; top-k keeps 1% under the fixed policy.
  m.gravac.period_steps = 100;
  m.gravac.time.source = gravac::time_source::simulated;
  m.flexible.source = m.moo.source = m.local.policy.source = gravac::network_source::modeled;
  m.local.policy.time.source = gravac::time_source::simulated;
  m.fixed.kept_fraction = 0.01;
  auto* me = app.add_option_group("method");
  std::string compressor(fmnist::name_of(fmnist::compressor_names, m.compressor));
  std::string collective(fmnist::name_of(fmnist::collective_names, m.collective));
  std::string policy(fmnist::name_of(fmnist::policy_names, m.policy));
  me->add_option("--compressor", compressor, "compressor")
      ->check(CLI::IsMember(names(fmnist::compressor_names)))
      ->capture_default_str();
  me->add_option("--collective", collective, "collective")
      ->check(CLI::IsMember(names(fmnist::collective_names)))
      ->capture_default_str();
  me->add_option("--policy", policy, "policy")
      ->check(CLI::IsMember(names(fmnist::policy_names)))
      ->capture_default_str();
  // Every option of the library's option table, as --name-with-dashes: booleans are flags,
  // the rest take a value that gravac::runtime::set_option checks after parsing.
  std::map<std::string, std::string> method_values;
  std::map<std::string, bool> method_flags;
  for (const auto& o : gravac::runtime::option_table()) {
    std::string flag = "--" + std::string(o.name);
    std::replace(flag.begin(), flag.end(), '_', '-');
    std::string doc(o.doc);
    if (o.type == gravac::runtime::option_type::boolean) {
      bool& on = method_flags[std::string(o.name)];
      on = o.get(m) == "true";
      me->add_flag(flag + ",!--no-" + flag.substr(2), on, doc)->capture_default_str();
    } else {
      if (o.type == gravac::runtime::option_type::choice) doc += " (" + std::string(o.choices) + ")";
      method_values[std::string(o.name)] = o.get(m);
      me->add_option(flag, method_values[std::string(o.name)], doc)->capture_default_str();
    }
  }
  me->add_flag("--local-steps", cfg.local_steps,
               "local-step training: --local-period inner steps per exchange (or --local-adaptive), the exchange "
               "through --compressor and --collective with --policy fixed, then the --outer step (local SGD, DiLoCo)");
  auto* ne = app.add_option_group("network");
  ne->add_option("--network", network,
                 "modeled network: none, <B>gbps[:<L>ms], schedule[:<epochs per phase>] "
                 "(25 Gbit/s 1 ms <-> 1 Gbit/s 32 ms), trace:<file.csv> or random-walk:<seed> (0.1-100 Gbit/s, "
                 "10 us-5 ms, a change every 10-200 steps)")
      ->capture_default_str();
  ne->add_option("--network-allreduce", network_allreduce,
                 "how the modeled network prices an Allreduce: ring (always), open-mpi-4.1 or nccl (the algorithm "
                 "that engine runs for the rank count and size)")
      ->check(CLI::IsMember({"ring", "open-mpi-4.1", "nccl"}))
      ->capture_default_str();
  ne->add_option("--compute-s", cfg.compute_s, "modeled compute seconds per step (negative: calibrate at the start)")
      ->capture_default_str();
  ne->add_flag("--codec-time,!--no-codec-time", cfg.charge_codec,
               "charge the measured compression time to the modeled clocks (off, with a given --compute-s: modeled "
               "times and GraVAC's decisions depend on the data alone, so runs repeat exactly and a resumed run "
               "matches an uninterrupted one)")
      ->capture_default_str();
  auto* ov = app.add_option_group("overlap");
  ov->add_option("--overlap", overlap,
                 "on: gravac's buckets are compressed and aggregated on a communication thread while backward "
                 "goes on (each layer announced as its gradient is final); the modeled clock charges only the "
                 "communication backward does not hide. Same parameters and records as off, times aside. Not with "
                 "shadow networks")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  {
    try {
      const auto every = fmnist::checkpoint_config::parse_every(checkpoint_every);
      cfg.checkpoint.every = every.every;
      cfg.checkpoint.every_unit = every.every_unit;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
      return 2;
    }
    if (cfg.checkpoint.resume && cfg.checkpoint.dir.empty()) {
      std::fprintf(stderr, "fashion_mnist: --resume needs --checkpoint-dir\n");
      return 2;
    }
  }
  try {
    for (const auto& [name, value] : method_values) gravac::runtime::set_option(m, name, value);
    for (const auto& [name, on] : method_flags) gravac::runtime::set_option(m, name, on ? "true" : "false");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 2;
  }
  m.compressor = value_of(fmnist::compressor_names, compressor);
  m.collective = value_of(fmnist::collective_names, collective);
  m.policy = value_of(fmnist::policy_names, policy);
  cfg.overlap = overlap == "on";
  bool use_mpi = backend == "mpi" || (backend == "auto" && launched_by_mpi());
  // The asynchronous step's communication thread calls MPI while the main thread computes,
  // one call at a time: MPI_THREAD_SERIALIZED. Asked for always (the synchronous step
  // needs less); refused below only when --overlap on needs it.
  int provided = MPI_THREAD_SINGLE;
  if (use_mpi) MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int world_rank = 0;
  if (use_mpi) MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (use_mpi && cfg.overlap && provided < MPI_THREAD_SERIALIZED) {
    if (world_rank == 0)
      std::fprintf(stderr,
                   "fashion_mnist: --overlap on needs MPI initialised with MPI_THREAD_SERIALIZED, but this MPI "
                   "provides only level %d (%s); use --overlap off, or an MPI library built with thread support\n",
                   provided, provided == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE" : "MPI_THREAD_FUNNELED");
    MPI_Finalize();
    return world_rank == 0 ? 2 : 0;
  }
  int rc = 0;
  try {
    cfg.model = model == "cnn" ? fmnist::model_kind::cnn : fmnist::model_kind::mlp;
    cfg.lr.gamma = lr_gamma;
    cfg.lr.milestones = milestones;
    cfg.network = fmnist::network_config::parse(network);
    cfg.network_allreduce = network_allreduce == "open-mpi-4.1" ? gravac::allreduce_rule::open_mpi_4_1
                            : network_allreduce == "nccl"       ? gravac::allreduce_rule::nccl
                                                                : gravac::allreduce_rule::fixed;
    cfg.codec_cpu_time = !use_mpi;
    if (out_dir.empty())
      out_dir = "out/fashion_mnist-" + std::string(fmnist::name_of(fmnist::policy_names, m.policy)) + "-" +
                std::string(fmnist::name_of(fmnist::compressor_names, m.compressor));

    const auto train_set = fmnist::load_fashion_mnist(data_dir, fmnist::split::train);
    const auto test_set = fmnist::load_fashion_mnist(data_dir, fmnist::split::test);
    std::optional<fmnist::run_result> result;
    const auto observer = fmnist::console_observer(progress);
    if (use_mpi) {
      gravac::run_or_abort(MPI_COMM_WORLD, [&] {
        gravac::mpi_communicator comm({.collective_timeout = std::chrono::duration<double>(collective_timeout_s)});
        if (comm.rank() == 0)
          std::printf("fashion_mnist: %s, %d MPI ranks, batch %zu, network %s\n",
                      fmnist::run_method_name(m, cfg.local_steps).c_str(), comm.size(), cfg.batch,
                      cfg.network.describe().c_str());
        auto r = fmnist::train(comm, train_set, test_set, cfg, observer);
        if (comm.rank() == 0) result = std::move(r);
      });
    } else {
      std::printf("fashion_mnist: %s, %d thread ranks, batch %zu, network %s\n",
                  fmnist::run_method_name(m, cfg.local_steps).c_str(), ranks, cfg.batch,
                  cfg.network.describe().c_str());
      gravac::run_ranks(ranks, [&](gravac::thread_communicator& comm) {
        auto r = fmnist::train(comm, train_set, test_set, cfg, comm.rank() == 0 ? observer : fmnist::train_observer{});
        if (comm.rank() == 0) result = std::move(r);
      });
    }
    if (result) {
      fmnist::print_summary(*result);
      const auto param_bytes = std::as_bytes(std::span<const float>(result->final_params));
      std::printf("  final parameters FNV-1a 64: %016llx\n",
                  static_cast<unsigned long long>(fmnist::fnv1a64(param_bytes)));
      if (!save_params.empty()) {
        fmnist::write_file_atomically(save_params, param_bytes);
        std::printf("  final parameters %s\n", save_params.c_str());
      }
      fmnist::write_csv(*result, out_dir);
      std::printf("\n  per-step CSV   %s/steps.csv\n  per-epoch CSV  %s/epochs.csv\n", out_dir.c_str(),
                  out_dir.c_str());
      if (!no_plots && fmnist::make_plots({{result->method, out_dir}}, out_dir,
                                          result->method + " on " + result->model + ", " +
                                              std::to_string(result->ranks) + " ranks, " + result->network))
        std::printf("  plots          %s/{accuracy_vs_epoch,accuracy_vs_time,ratio_vs_step,bytes_vs_step}.png\n",
                    out_dir.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    rc = 1;
  }
  if (use_mpi) MPI_Finalize();
  return world_rank == 0 ? rc : 0;
}
