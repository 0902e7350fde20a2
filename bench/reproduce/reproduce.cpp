// reproduce: the papers' comparisons on real Fashion-MNIST training, at the scale one
// machine allows. Every method trains the same model from the same seed on the same data
// order for the same number of epochs, on N thread ranks, with communication charged by
// gravac's simulated network:
//
//   dense SGD; static top-k at CF 10, 100 and 1000; GraVAC; Accordion; AdaComp;
//   AR-Topk with the multi-objective policy; the flexible collective (with that policy)
//
// under 1 Gbit/s, 10 Gbit/s and the changing schedule (25 Gbit/s, 1 ms <-> 1 Gbit/s,
// 32 ms). Methods whose decisions do not depend on the network train once and are charged
// on all three networks at the same time (shadow clocks); GraVAC (whose throughput uses
// the modeled clock), AR-Topk + MOO and the flexible collective train once per network.
//
// Writes, into --out: one directory per run (steps.csv, epochs.csv), results.md (the
// tables and the targets, met or missed), results.csv, and comparison plots.
//
//   reproduce                 # the reduced run (MLP, subset, 12 epochs, 4 thread ranks): about 10 min on 2 cores
//   reproduce --only gravac   # one method
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/utsname.h>

#include <gravac/comm/thread_communicator.hpp>

#include "fmnist/report.hpp"
#include "fmnist/train.hpp"

namespace {

struct method_spec {
  std::string key;          // directory and --only name
  std::string label;        // table label
  fmnist::method_config m;  // the method
  bool network_dependent;   // trains once per network
};

const std::vector<std::string> network_specs = {"1gbps", "10gbps", "schedule"};
const std::vector<std::string> network_labels = {"1 Gbit/s", "10 Gbit/s", "schedule"};

std::vector<method_spec> methods(std::uint64_t gravac_period) {
  using namespace fmnist;
  std::vector<method_spec> v;
  const auto fixed = [](compressor_id c, collective_id k, double f) {
    method_config m;
    m.compressor = c;
    m.collective = k;
    m.policy = policy_id::fixed;
    m.fixed.kept_fraction = f;
    return m;
  };
  v.push_back({"dense", "dense SGD", fixed(compressor_id::identity, collective_id::dense_allreduce, 1.0), false});
  v.push_back({"topk_cf10", "top-k CF 10", fixed(compressor_id::topk, collective_id::allgather, 0.1), false});
  v.push_back({"topk_cf100", "top-k CF 100", fixed(compressor_id::topk, collective_id::allgather, 0.01), false});
  v.push_back({"topk_cf1000", "top-k CF 1000", fixed(compressor_id::topk, collective_id::allgather, 0.001), false});
  {
    method_config m = fixed(compressor_id::topk, collective_id::allgather, 1);
    m.policy = policy_id::gravac;
    m.gravac.period_steps = gravac_period;
    m.gravac.time.source = gravac::time_source::simulated;
    v.push_back({"gravac", "GraVAC (top-k)", m, true});
  }
  {
    method_config m = fixed(compressor_id::topk, collective_id::allgather, 1);
    m.policy = policy_id::accordion;  // low 0.1 (CF 10), high 0.01 (CF 100), per epoch
    v.push_back({"accordion", "Accordion (top-k 10/100)", m, false});
  }
  {
    method_config m = fixed(compressor_id::adacomp, collective_id::allgather, 1);
    m.policy = policy_id::adacomp;
    v.push_back({"adacomp", "AdaComp", m, false});
  }
  {
    method_config m = fixed(compressor_id::topk, collective_id::allreduce_compatible, 1);
    m.policy = policy_id::moo;
    m.moo.source = gravac::network_source::modeled;
    m.moo.collective = gravac::collective_kind::allreduce_compatible;
    v.push_back({"artopk_moo", "AR-Topk + MOO", m, true});
  }
  {
    method_config m = fixed(compressor_id::topk, collective_id::flexible, 1);
    m.policy = policy_id::moo;
    m.moo.source = gravac::network_source::modeled;
    m.flexible.source = gravac::network_source::modeled;
    v.push_back({"flexible_moo", "flexible + MOO", m, true});
  }
  return v;
}

struct run_entry {
  const method_spec* spec;
  int network;  // index into network_specs of the primary network
  fmnist::run_result r;
  std::string dir;
};

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string machine_line() {
  utsname u{};
  uname(&u);
  std::string cpu = "unknown CPU";
  std::ifstream ci("/proc/cpuinfo");
  for (std::string line; std::getline(ci, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  const std::time_t t = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&t));
  return cpu + ", " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads, " + u.sysname + " " +
         u.release + "; " + date;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Reproduce the papers' comparisons on Fashion-MNIST (see bench/reproduce/README.md)"};
  fmnist::run_config base;
  base.model = fmnist::model_kind::mlp;
  base.epochs = 12;
  base.batch = 128;
  base.train_subset = 19200;  // 150 steps per epoch
  base.test_subset = 5000;
  base.lr = {0.05, 0.1, {9}};
  base.seed = 1;
  std::string out = "out/reproduce", only, model = "mlp", data_dir = fmnist::default_data_dir;
  int ranks = 4;
  double target_below_dense = 1.0;
  std::uint64_t gravac_period = 0;
  std::vector<std::size_t> milestones{9};
  app.add_option("--out", out, "output directory")->capture_default_str();
  app.add_option("--only", only, "run only these methods (comma-separated keys: dense, topk_cf10, topk_cf100, "
                                 "topk_cf1000, gravac, accordion, adacomp, artopk_moo, flexible_moo)");
  app.add_option("--model", model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}))->capture_default_str();
  app.add_option("--epochs", base.epochs, "epochs")->capture_default_str();
  app.add_option("--train-subset", base.train_subset, "training samples per epoch (0: all)")->capture_default_str();
  app.add_option("--test-subset", base.test_subset, "test samples evaluated (0: all)")->capture_default_str();
  app.add_option("--batch", base.batch, "global batch")->capture_default_str();
  app.add_option("--lr", base.lr.base, "learning rate")->capture_default_str();
  app.add_option("--lr-milestones", milestones, "epochs at which the rate is multiplied by 0.1")->delimiter(',');
  app.add_option("--ranks", ranks, "thread ranks")->capture_default_str();
  app.add_option("--seed", base.seed, "seed")->capture_default_str();
  app.add_option("--gravac-period", gravac_period, "GraVAC evaluation period in steps (0: one epoch)")->capture_default_str();
  app.add_option("--target-below-dense", target_below_dense,
                 "target accuracy = dense's final test accuracy minus this many points")->capture_default_str();
  app.add_option("--compute-s", base.compute_s, "modeled compute per step (negative: calibrate once, shared by all runs)")
      ->capture_default_str();
  app.add_option("--data-dir", data_dir, "Fashion-MNIST directory")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  base.model = model == "cnn" ? fmnist::model_kind::cnn : fmnist::model_kind::mlp;
  base.lr.milestones = milestones;

  try {
    const auto train = fmnist::load_fashion_mnist(data_dir, fmnist::split::train);
    const auto test = fmnist::load_fashion_mnist(data_dir, fmnist::split::test);
    const auto all = methods(gravac_period);
    std::vector<const method_spec*> chosen;
    for (const auto& s : all)
      if (only.empty() || ("," + only + ",").find("," + s.key + ",") != std::string::npos) chosen.push_back(&s);
    if (chosen.empty()) throw std::runtime_error("--only matched no method");
    std::filesystem::create_directories(out);

    std::vector<run_entry> runs;
    const auto t_start = std::chrono::steady_clock::now();
    for (const auto* spec : chosen) {
      for (int n = 0; n < static_cast<int>(network_specs.size()); ++n) {
        if (!spec->network_dependent && n > 0) break;
        fmnist::run_config cfg = base;
        cfg.method = spec->m;
        cfg.network = fmnist::network_config::parse(network_specs[static_cast<std::size_t>(n)]);
        if (!spec->network_dependent)
          for (std::size_t k = 1; k < network_specs.size(); ++k)
            cfg.shadow_networks.push_back(fmnist::network_config::parse(network_specs[k]));
        run_entry e{spec, n, {}, out + "/" + spec->key + (spec->network_dependent ? "-" + network_specs[static_cast<std::size_t>(n)] : "")};
        std::printf("[%6.0f s] %-26s network %-9s ...", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(),
                    spec->label.c_str(), network_specs[static_cast<std::size_t>(n)].c_str());
        std::fflush(stdout);
        gravac::run_ranks(ranks, [&](gravac::thread_communicator& comm) {
          auto r = fmnist::train(comm, train, test, cfg);
          if (comm.rank() == 0) e.r = std::move(r);
        });
        // Every later run is charged the compute per step the first one calibrated.
        if (base.compute_s < 0) base.compute_s = e.r.compute_per_step_s;
        fmnist::write_csv(e.r, e.dir);
        std::printf(" test acc %.2f%%, %.2f MB per rank, modeled %.1f s\n", 100 * e.r.epochs.back().test_acc,
                    e.r.total_bytes_per_rank() / 1e6, e.r.epochs.back().modeled_time_s);
        std::fflush(stdout);
        runs.push_back(std::move(e));
      }
    }
    const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

    // --- tables -----------------------------------------------------------------------
    const run_entry* dense = nullptr;
    for (const auto& e : runs)
      if (e.spec->key == "dense") dense = &e;
    const double dense_acc = dense ? dense->r.epochs.back().test_acc : std::nan("");
    const double dense_bytes = dense ? dense->r.total_bytes_per_rank() : std::nan("");
    const double target = dense_acc - target_below_dense / 100.0;
    // Time to target of run e on network n (its own clock or a shadow clock).
    const auto time_to = [&](const run_entry& e, int n) {
      if (e.spec->network_dependent) return e.network == n ? e.r.modeled_time_to(target) : std::nan("");
      return n == 0 ? e.r.modeled_time_to(target) : e.r.modeled_time_to(target, n - 1);
    };
    const auto run_for = [&](const method_spec* s, int n) -> const run_entry* {
      for (const auto& e : runs)
        if (e.spec == s && (!s->network_dependent || e.network == n)) return &e;
      return nullptr;
    };
    std::ostringstream md;
    md << "Fashion-MNIST, " << runs.front().r.model << " (" << runs.front().r.params << " parameters), " << ranks
       << " thread ranks, global batch " << base.batch << ", " << base.epochs << " epochs of "
       << (base.train_subset ? std::to_string(base.train_subset) : std::string("60000")) << " samples ("
       << runs.front().r.steps_per_epoch << " steps each), learning rate " << base.lr.base
       << " (x0.1 at epochs";
    for (auto ms : base.lr.milestones) md << " " << ms + 1;
    md << "), momentum 0.9, seed " << base.seed << "; test accuracy on " << (base.test_subset ? base.test_subset : 10000)
       << " test images. Modeled compute " << fmt("%.2f", 1e3 * base.compute_s)
       << " ms per step (calibrated once, the same for every run). Machine: " << machine_line() << ". Wall time of the "
       << "whole experiment: " << fmt("%.0f", total_s) << " s.\n\n";
    md << "Target accuracy: dense's final test accuracy minus " << target_below_dense << " point = "
       << fmt("%.2f", 100 * target) << "%.\n\n";
    md << "| method | final test acc. (%) | vs dense (points) | MB sent per rank | less than dense | "
          "modeled time to target, 1 Gbit/s (s) | measured compute (s) | measured compression (s) |\n"
       << "|---|---:|---:|---:|---:|---:|---:|---:|\n";
    std::ofstream csv(out + "/results.csv");
    csv << "method,network,final_test_acc,bytes_per_rank,time_to_target_1gbps,time_to_target_10gbps,"
           "time_to_target_schedule,compute_s,codec_s,modeled_time_s\n";
    for (const auto* s : chosen) {
      const run_entry* e = run_for(s, 0);
      if (!e) continue;
      double compute = 0, codec = 0;
      for (const auto& ep : e->r.epochs) {
        compute += ep.compute_s;
        codec += ep.codec_s;
      }
      const double acc = e->r.epochs.back().test_acc, bytes = e->r.total_bytes_per_rank();
      const double t1 = time_to(*e, 0);
      md << "| " << s->label << (s->network_dependent ? " (1 Gbit/s run)" : "") << " | " << fmt("%.2f", 100 * acc) << " | "
         << fmt("%+.2f", 100 * (acc - dense_acc)) << " | " << fmt("%.2f", bytes / 1e6) << " | "
         << fmt("%.1fx", dense_bytes / bytes) << " | " << (t1 >= 0 ? fmt("%.2f", t1) : std::string("not reached"))
         << " | " << fmt("%.2f", compute) << " | " << fmt("%.2f", codec) << " |\n";
    }
    md << "\nModeled time to the target accuracy on each network (s; each adaptive method's own run on that network):\n\n"
       << "| method | 1 Gbit/s | 10 Gbit/s | schedule | final acc. per network (%) | MB per rank per network |\n"
       << "|---|---:|---:|---:|---|---|\n";
    for (const auto* s : chosen) {
      md << "| " << s->label;
      std::string accs, mbs;
      for (int n = 0; n < 3; ++n) {
        const run_entry* e = run_for(s, n);
        const double t = e ? time_to(*e, n) : std::nan("");
        md << " | " << (e ? (t >= 0 ? fmt("%.2f", t) : std::string("not reached")) : std::string("-"));
        if (e && (s->network_dependent || n == 0)) {
          accs += (accs.empty() ? "" : " / ") + fmt("%.2f", 100 * e->r.epochs.back().test_acc);
          mbs += (mbs.empty() ? "" : " / ") + fmt("%.2f", e->r.total_bytes_per_rank() / 1e6);
        }
      }
      md << " | " << accs << " | " << mbs << " |\n";
    }
    for (const auto& e : runs) {
      double compute = 0, codec = 0;
      for (const auto& ep : e.r.epochs) {
        compute += ep.compute_s;
        codec += ep.codec_s;
      }
      csv << e.spec->key << ',' << network_specs[static_cast<std::size_t>(e.network)] << ',' << e.r.epochs.back().test_acc
          << ',' << e.r.total_bytes_per_rank() << ',' << time_to(e, 0) << ',' << time_to(e, 1) << ',' << time_to(e, 2)
          << ',' << compute << ',' << codec << ',' << e.r.epochs.back().modeled_time_s << '\n';
    }

    // --- the papers' claims, checked ---------------------------------------------------------
    md << "\n## Targets\n\n";
    const auto find = [&](const std::string& key) -> const method_spec* {
      for (const auto* s : chosen)
        if (s->key == key) return s;
      return nullptr;
    };
    if (const auto* g = find("gravac"); g && dense) {
      const run_entry* e = run_for(g, 0);
      const double acc = e->r.epochs.back().test_acc, less = dense_bytes / e->r.total_bytes_per_rank();
      md << "- GraVAC within 0.5 points of dense's final accuracy (1 Gbit/s run): "
         << (acc >= dense_acc - 0.005 ? "**met**" : "**missed**") << " (" << fmt("%+.2f", 100 * (acc - dense_acc))
         << " points).\n";
      md << "- GraVAC sends at least 10x fewer bytes than dense: " << (less >= 10 ? "**met**" : "**missed**") << " ("
         << fmt("%.1fx", less) << ").\n";
      const double tg = time_to(*e, 0);
      std::string beaten, lost;
      for (const auto* key : {"dense", "topk_cf10", "topk_cf100", "topk_cf1000"}) {
        const auto* s = find(key);
        if (!s) continue;
        const double t = time_to(*run_for(s, 0), 0);
        if (t < 0) continue;  // a static CF that never reaches the target is not a competitor
        ((tg >= 0 && tg < t) ? beaten : lost) += (std::string(beaten.empty() && lost.empty() ? "" : ", ") + s->label +
                                                  " " + fmt("%.2f s", t));
      }
      md << "- GraVAC reaches the target in less modeled time at 1 Gbit/s than dense and every static CF that reaches it: "
         << (tg >= 0 && lost.empty() ? "**met**" : "**missed**") << " (GraVAC "
         << (tg >= 0 ? fmt("%.2f s", tg) : std::string("never")) << "; faster than: " << (beaten.empty() ? "-" : beaten)
         << "; not faster than: " << (lost.empty() ? "-" : lost) << ").\n";
    }
    if (const auto* a = find("accordion"), *low = find("topk_cf10"); a && low) {
      const auto& ea = run_for(a, 0)->r;
      const auto& el = run_for(low, 0)->r;
      const double d = ea.epochs.back().test_acc - el.epochs.back().test_acc;
      const double less = el.total_bytes_per_rank() / ea.total_bytes_per_rank();
      md << "- Accordion ends close to its low-compression run (top-k CF 10; within 0.5 points): "
         << (d >= -0.005 ? "**met**" : "**missed**") << " (" << fmt("%+.2f", 100 * d) << " points), sending "
         << fmt("%.1fx", less) << " less (" << (less >= 1.5 ? "**clearly less**" : "**not clearly less**") << ").\n";
    }
    {
      std::ofstream f(out + "/results.md");
      f << md.str();
    }
    std::printf("\n%s\n", md.str().c_str());

    // --- plots: every method at 1 Gbit/s ------------------------------------------------------
    std::vector<fmnist::plot_series> series;
    for (const auto* s : chosen)
      if (const auto* e = run_for(s, 0)) series.push_back({s->label, e->dir});
    const bool plotted = fmnist::make_plots(series, out + "/plots", "Fashion-MNIST, " + runs.front().r.model + ", " +
                                                                      std::to_string(ranks) + " ranks, 1 Gbit/s");
    std::printf("results: %s/results.md, %s/results.csv%s\n", out.c_str(), out.c_str(),
                plotted ? (", plots in " + out + "/plots").c_str() : "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reproduce: %s\n", e.what());
    return 1;
  }
  return 0;
}
