// reproduce_block_scaled: the block-scaled formats on real Fashion-MNIST training against
// dense SGD, each with and without error feedback, and the peer users run today: torchft's
// fp8 row-wise allreduce without error feedback (fp8_rowwise). Every method goes through
// the compressed allreduce (reduce-scatter of packets, fp32 sums, allgather of the sum
// coded again), on 4 thread ranks, the MLP and the CNN of the reproduction, once per seed,
// with the same data order and initialisation per seed. Communication is charged by the
// simulated network at 1 Gbit/s (the methods' decisions do not depend on it).
//
// Writes into --out: results.md (the setting, one table per model, the targets met
// or missed), results.csv (one row per run) and each run's steps.csv and epochs.csv.
//
//   reproduce_block_scaled                      # MLP and CNN, 3 seeds (about 15 minutes on 2 cores)
//   reproduce_block_scaled --model mlp --seeds 1 --epochs 2   # a quick look
//
// A run whose gradient goes non-finite is recorded as diverged (train_run.hpp): results.md
// lists it, its cells say "k/N diverged", a target that needs it is missed, and the next
// run starts.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <gravac/comm/thread_communicator.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fmnist/report.hpp"
#include "fmnist/train.hpp"
#include "summary_stats.hpp"
#include "train_run.hpp"

namespace {

using namespace repro;
using fmnist::compressor_id;

struct method_spec {
  std::string key;          // directory name
  std::string label;        // table label
  fmnist::method_config m;  // the method
  std::string paired_with;  // the key of the same format with error feedback (rows without it)
};

fmnist::method_config over_compressed_allreduce(compressor_id c, bool feedback) {
  fmnist::method_config m;
  m.compressor = c;
  m.collective = fmnist::collective_id::compressed_allreduce;
  m.policy = fmnist::policy_id::fixed;
  m.fixed.kept_fraction = 0.01;  // below 1: every layer coded (a kept fraction of 1 sends it raw)
  m.mxfp8.error_feedback = m.mxfp4.error_feedback = m.nvfp4.error_feedback = feedback;
  return m;
}

std::vector<method_spec> methods() {
  std::vector<method_spec> v;
  fmnist::method_config dense;
  dense.compressor = compressor_id::identity;
  dense.collective = fmnist::collective_id::dense_allreduce;
  dense.policy = fmnist::policy_id::fixed;
  dense.fixed.kept_fraction = 1.0;
  v.push_back({"dense", "dense SGD (fp32 allreduce)", dense, ""});
  for (const auto& [c, key, name] :
       {std::tuple{compressor_id::mxfp8, "mxfp8", "MXFP8 (E4M3)"}, std::tuple{compressor_id::mxfp4, "mxfp4", "MXFP4"},
        std::tuple{compressor_id::nvfp4, "nvfp4", "NVFP4"}}) {
    v.push_back({key, std::string(name) + ", error feedback", over_compressed_allreduce(c, true), ""});
    v.push_back({std::string(key) + "_no_ef", std::string(name) + ", no error feedback",
                 over_compressed_allreduce(c, false), key});
  }
  v.push_back({"fp8_rowwise", "fp8 row-wise, no error feedback (torchft's scheme)",
               over_compressed_allreduce(compressor_id::fp8_rowwise, false), ""});
  return v;
}

struct run_entry {
  const method_spec* spec;
  int seed;
  fmnist::run_result r;
  bool diverged = false;  // a non-finite gradient stopped it (train_run.hpp)
  std::string where;      // where and why
};

// The runs of one method, by seed (nullptr where absent, and where it diverged: a diverged
// run has no final figures; diverged_in counts them).
std::vector<const run_entry*> runs_of(const std::vector<run_entry>& runs, const std::string& key, int seeds) {
  std::vector<const run_entry*> out(static_cast<std::size_t>(seeds), nullptr);
  for (const auto& e : runs)
    if (e.spec->key == key && !e.diverged) out[static_cast<std::size_t>(e.seed - 1)] = &e;
  return out;
}
// The seeds in which method key's run diverged.
int diverged_in(const std::vector<run_entry>& runs, const std::string& key) {
  int k = 0;
  for (const auto& e : runs) k += e.spec->key == key && e.diverged ? 1 : 0;
  return k;
}
// The seeds in which method a's run or method b's run diverged: their paired difference is
// missing there.
int diverged_pairs(const std::vector<run_entry>& runs, const std::string& a, const std::string& b) {
  std::vector<int> seeds;
  for (const auto& e : runs)
    if (e.diverged && (e.spec->key == a || e.spec->key == b) &&
        std::find(seeds.begin(), seeds.end(), e.seed) == seeds.end())
      seeds.push_back(e.seed);
  return static_cast<int>(seeds.size());
}

double final_acc(const fmnist::run_result& r) { return r.epochs.back().test_acc; }

// Per seed: f(run of a) - f(run of b), paired by seed.
template <class F>
std::vector<double> paired(const std::vector<const run_entry*>& a, const std::vector<const run_entry*>& b, F f) {
  std::vector<double> d;
  for (std::size_t s = 0; s < a.size(); ++s)
    if (a[s] && b[s]) d.push_back(f(a[s]->r) - f(b[s]->r));
  return d;
}
template <class F>
std::vector<double> per_seed(const std::vector<const run_entry*>& a, F f) {
  std::vector<double> d;
  for (const auto* e : a)
    if (e) d.push_back(f(e->r));
  return d;
}

struct model_pass {
  std::string name;  // "mlp" or "cnn"
  fmnist::run_config base;
  std::vector<run_entry> runs;
  double wall_s = 0;
};

// The table and the targets of one model.
std::string report(const model_pass& p, const std::vector<method_spec>& all, int seeds) {
  std::ostringstream md;
  const auto dense = runs_of(p.runs, "dense", seeds);
  const double dense_wire =
      summarize(per_seed(dense, [](const auto& r) { return r.total_wire_bytes_received_per_rank(); })).mean;
  const int dense_diverged = diverged_in(p.runs, "dense");
  const auto n_seeds = static_cast<std::size_t>(seeds);
  const fmnist::run_result* first = &p.runs.front().r;  // the first run with an evaluated epoch
  for (const auto& e : p.runs)
    if (!e.r.epochs.empty()) {
      first = &e.r;
      break;
    }
  const auto& r0 = *first;
  md << "## " << r0.model << "\n\n"
     << r0.params << " parameters, 4 thread ranks, global batch " << p.base.batch << ", " << p.base.epochs
     << " epochs of " << p.base.train_subset << " samples, seeds 1.." << seeds
     << " (cells: mean ± sample standard deviation over the seeds; differences paired by seed). Modeled compute "
     << fmt("%.2f", 1e3 * r0.compute_per_step_s) << " ms per step; communication charged at 1 Gbit/s. Wall time "
     << fmt("%.0f", p.wall_s) << " s.\n\n";
  std::string diverged_list;
  for (const auto& e : p.runs)
    if (e.diverged) diverged_list += "- " + e.spec->label + ", seed " + std::to_string(e.seed) + ": " + e.where + "\n";
  if (!diverged_list.empty())
    md << "Runs that **diverged** (a non-finite gradient stopped them: their figures are left out of the means, the "
          "cells say \"k/N diverged\", and a target that needs them is missed):\n\n"
       << diverged_list << "\n";
  md << "| method | final test acc. (%) | − dense (points) | EF − no EF (points) | wire MB received per rank | "
        "fewer wire bytes than dense | modeled time, 1 Gbit/s (s) |\n"
     << "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& s : all) {
    const auto mine = runs_of(p.runs, s.key, seeds);
    const int k = diverged_in(p.runs, s.key);
    if (per_seed(mine, final_acc).empty() && k == 0) continue;
    const auto wire = summarize(per_seed(mine, [](const auto& r) { return r.total_wire_bytes_received_per_rank(); }));
    std::string ef = "-";
    if (!s.paired_with.empty())
      ef = pm_finished(summarize(paired(runs_of(p.runs, s.paired_with, seeds), mine, final_acc)),
                       diverged_pairs(p.runs, s.key, s.paired_with), n_seeds, "%+.2f", 100);
    md << "| " << s.label << " | " << pm_finished(summarize(per_seed(mine, final_acc)), k, n_seeds, "%.2f", 100)
       << " | "
       << (s.key == "dense" ? "-"
                            : pm_finished(summarize(paired(mine, dense, final_acc)),
                                          diverged_pairs(p.runs, s.key, "dense"), n_seeds, "%+.2f", 100))
       << " | " << ef << " | " << pm(wire, "%.1f", 1e-6) << " | "
       << (wire.n > 0 && std::isfinite(dense_wire) ? fmt("%.2fx", dense_wire / wire.mean) : std::string("-")) << " | "
       << pm(summarize(per_seed(mine, [](const auto& r) { return r.epochs.back().modeled_time_s; })), "%.2f") << " |\n";
  }
  // The targets: within 0.1 points of dense at about 3.9x (mxfp8), within 0.5 at
  // about 7x (mxfp4, nvfp4), each better than its own row without error feedback.
  md << "\nTargets (" << r0.model << ", means over the seeds):\n\n";
  for (const auto& [key, points, ratio] :
       {std::tuple{"mxfp8", 0.1, 3.9}, std::tuple{"mxfp4", 0.5, 7.0}, std::tuple{"nvfp4", 0.5, 7.0}}) {
    const auto mine = runs_of(p.runs, key, seeds);
    const int k = diverged_in(p.runs, key), k_no_ef = diverged_in(p.runs, std::string(key) + "_no_ef");
    if (per_seed(mine, final_acc).empty() && k == 0) continue;
    const auto gap = summarize(paired(mine, dense, final_acc));
    const double fewer =
        dense_wire /
        summarize(per_seed(mine, [](const auto& r) { return r.total_wire_bytes_received_per_rank(); })).mean;
    const auto ef = summarize(paired(mine, runs_of(p.runs, std::string(key) + "_no_ef", seeds), final_acc));
    md << "- `" << key << "` with error feedback within " << points << " points of dense at about " << ratio
       << "x fewer wire bytes: "
       << met(k == 0 && dense_diverged == 0 && gap.mean * 100 >= -points && fewer >= 0.95 * ratio) << " ("
       << pm(gap, "%+.2f", 100) << " points, " << (std::isfinite(fewer) ? fmt("%.2fx", fewer) : std::string("-"));
    // A diverged seed (this format's, dense's or the run without error feedback) leaves a
    // comparison without its figure: missed.
    if (k > 0) md << "; diverged in " << k << "/" << seeds << " seeds";
    if (dense_diverged > 0) md << "; dense diverged in " << dense_diverged << "/" << seeds << " seeds";
    md << "); better than without error feedback: " << met(k == 0 && k_no_ef == 0 && ef.mean > 0) << " ("
       << pm(ef, "%+.2f", 100) << " points";
    if (k_no_ef > 0) md << "; without error feedback diverged in " << k_no_ef << "/" << seeds << " seeds";
    md << ").\n";
  }
  return md.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The block-scaled formats against dense SGD and fp8 row-wise on Fashion-MNIST"};
  fmnist::run_config mlp;  // the reproduction's MLP pass
  mlp.model = fmnist::model_kind::mlp;
  mlp.epochs = 12;
  mlp.batch = 128;
  mlp.train_subset = 19200;
  mlp.lr = {0.05, 0.1, {9}};
  fmnist::run_config cnn = mlp;  // and its CNN pass
  cnn.model = fmnist::model_kind::cnn;
  cnn.epochs = 8;
  cnn.lr.milestones = {6};
  int seeds = 3;
  std::string model = "both", out = "out/reproduce/block_scaled", data_dir = fmnist::default_data_dir;
  std::size_t epochs = 0;
  app.add_option("--model", model, "mlp, cnn or both")
      ->check(CLI::IsMember({"mlp", "cnn", "both"}))
      ->capture_default_str();
  app.add_option("--seeds", seeds, "seeds 1..N")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--epochs", epochs, "epochs of every pass (0: the reproduction's, 12 MLP and 8 CNN)");
  app.add_option("--out", out, "output directory")->capture_default_str();
  app.add_option("--data-dir", data_dir, "Fashion-MNIST directory")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (epochs > 0) {
    mlp.epochs = cnn.epochs = epochs;
    mlp.lr.milestones.clear();
    cnn.lr.milestones.clear();
  }
  try {
    const auto train = fmnist::load_fashion_mnist(data_dir, fmnist::split::train);
    const auto test = fmnist::load_fashion_mnist(data_dir, fmnist::split::test);
    const auto all = methods();
    std::vector<model_pass> passes;
    if (model != "cnn") passes.push_back({"mlp", mlp, {}, 0});
    if (model != "mlp") passes.push_back({"cnn", cnn, {}, 0});
    std::filesystem::create_directories(out);
    std::ofstream csv(out + "/results.csv");
    csv << "model,seed,method,final_test_acc,wire_bytes_received_per_rank,packet_bytes_per_rank,modeled_time_s,"
           "status,diverged_epoch,diverged_step,error\n";
    const auto t_start = std::chrono::steady_clock::now();
    const auto since = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    };
    for (auto& p : passes) {
      const double t0 = since();
      for (int seed = 1; seed <= seeds; ++seed)
        for (const auto& s : all) {
          fmnist::run_config cfg = p.base;
          cfg.seed = static_cast<std::uint64_t>(seed);
          cfg.method = s.m;
          cfg.network = fmnist::network_config::parse("1gbps");
          std::printf("[%6.0f s] %s seed %d  %-48s ...", since(), p.name.c_str(), seed, s.label.c_str());
          std::fflush(stdout);
          // A non-finite gradient ends the run as diverged (every rank throws it), and the
          // next run starts; any other failure ends the experiment.
          repro::run_outcome o = repro::train_run(4, train, test, cfg);
          run_entry e{&s, seed, o.r, o.diverged, o.diverged ? o.where() : std::string()};
          // One calibration per model (a run that diverged before its first epoch ended
          // has not said: the next one calibrates).
          if (p.base.compute_s < 0 && e.r.compute_per_step_s > 0) p.base.compute_s = e.r.compute_per_step_s;
          repro::write_run(o, out + "/" + p.name + "/seed" + std::to_string(seed) + "/" + s.key);
          if (e.diverged) {
            std::printf(" %s\n", e.where.c_str());
            csv << p.name << ',' << seed << ',' << s.key << ",nan,nan,nan,nan," << repro::status_columns(o) << '\n';
          } else {
            std::printf(" test acc %.2f%%, wire %.1f MB received\n", 100 * final_acc(e.r),
                        e.r.total_wire_bytes_received_per_rank() / 1e6);
            csv << p.name << ',' << seed << ',' << s.key << ',' << final_acc(e.r) << ','
                << e.r.total_wire_bytes_received_per_rank() << ',' << e.r.total_bytes_per_rank() << ','
                << e.r.epochs.back().modeled_time_s << ',' << repro::status_columns(o) << '\n';
          }
          p.runs.push_back(std::move(e));
        }
      p.wall_s = since() - t0;
    }
    std::ofstream md(out + "/results.md");
    md << "# Block-scaled formats on Fashion-MNIST\n\nMachine: " << machine_line()
       << ". Command: reproduce_block_scaled";
    for (int i = 1; i < argc; ++i) md << ' ' << argv[i];
    md << ". Wall time " << fmt("%.0f", since()) << " s.\n\n"
       << "Every method but dense goes through the compressed allreduce: each rank codes its shard of every layer "
          "for each owner, the owner sums the decoded shards in fp32 and codes the average again (with its server "
          "residual when error feedback is on) for the allgather. Dense is the fp32 ring allreduce. Wire bytes "
          "received per rank as the simulated network counts them.\n\n";
    for (const auto& p : passes) md << report(p, all, seeds) << "\n";
    std::printf("wrote %s/results.md\n", out.c_str());
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "reproduce_block_scaled: %s\n", ex.what());
    return 1;
  }
  return 0;
}
