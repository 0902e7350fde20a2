// network_grid: does the recommended configuration ever lose to the best choice a user could
// have made by hand for their network? On real Fashion-MNIST training (the reproduction's MLP
// and CNN passes: the same models, data, schedules and 4 thread ranks), it trains
//
//   - the static choices (dense SGD, top-k over Allgather at CF 10 and at CF 100) once per
//     seed, charged on every network of a grid at once (shadow clocks: their decisions do
//     not depend on the network);
//   - the recommended configuration (method_configs.hpp) once per network and seed, on that
//     network, which it is not told;
//   - on networks that keep changing (--random-walks N: random-walk:1..N, bandwidth 0.1-100
//     Gbit/s and latency 10 us-5 ms moving every 10-200 steps), the recommended configuration
//     and GraVAC as the paper on each walk and seed, against the static choices charged on
//     the same walks;
//   - then, with compute-heavy steps as on GPUs, the same four methods with the modeled
//     compute per step set so that dense's communication is 10%, 50% and 200% of it, with
//     buckets per layer overlapped with backward (each its own run: overlap and shadow
//     clocks do not mix), on the CNN by default (--heavy-model): its layers overlap with
//     backward, while the MLP's first layer holds 85% of its gradient and comes last.
//
// The target is dense's final test accuracy (mean over the seeds) minus 1 point; every
// time is the modeled time to reach it (compute + measured compression + the exposed
// communication the simulated network charges), the mean over the seeds.
//
// Writes into --out: results.md (the setting, the tables, the targets met or missed),
// results.csv (one row per method, network and seed) and grid_<model>.png, a heat map of the
// recommended configuration's time over the best static choice's.
//
//   network_grid            # MLP and CNN, 3 seeds, 5 x 3 networks; 3 compute settings (CNN)
//   network_grid --quick    # development: the MLP, one seed, its compute settings too
//   network_grid --bandwidths 0.1,100 --latencies 0.005 --no-heavy   # a few cells
//
// A run whose gradient goes non-finite is recorded as diverged (train_run.hpp): it does not
// reach the target, its row of results.csv says status diverged, results.md lists it, and
// the grid goes on.
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

#include "fmnist/train.hpp"
#include "method_configs.hpp"
#include "summary_stats.hpp"
#include "train_run.hpp"

namespace {

using namespace repro;

// One network of the grid.
struct cell {
  double gbps = 1;
  double latency_ms = 0.005;
  [[nodiscard]] std::string spec() const { return fmt("%ggbps", gbps) + fmt(":%gms", latency_ms); }
  [[nodiscard]] std::string bandwidth_label() const {
    return gbps < 1 ? fmt("%g Mbit/s", gbps * 1000) : fmt("%g Gbit/s", gbps);
  }
  [[nodiscard]] std::string latency_label() const {
    return latency_ms < 1 ? fmt("%g us", latency_ms * 1000) : fmt("%g ms", latency_ms);
  }
};

// The changing network number \p w (fmnist::network_config's random-walk).
std::string walk_spec(int w) { return "random-walk:" + std::to_string(w); }

struct method {
  std::string key, label;
  fmnist::method_config m;
  bool is_static = true;
};

std::vector<method> compared() {
  using fmnist::collective_id;
  using fmnist::compressor_id;
  return {{"dense", "dense SGD", fixed_config(compressor_id::identity, collective_id::dense_allreduce, 1.0)},
          {"topk_cf10", "top-k CF 10", fixed_config(compressor_id::topk, collective_id::allgather, 0.1)},
          {"topk_cf100", "top-k CF 100", fixed_config(compressor_id::topk, collective_id::allgather, 0.01)},
          {"recommended", "recommended (GraVAC + dense)", recommended_config(0), false}};
}

// Time to target of one run on one clock (negative: not reached).
using times = std::vector<double>;  // per seed

// Best static choice among the first three methods: reaches the target in the most seeds,
// then in the least mean time. Returns its index, or -1.
int best_static(const std::vector<times>& t) {
  int best = -1;
  summary bs;
  for (int i = 0; i < 3; ++i) {
    const summary s = reached(t[static_cast<std::size_t>(i)]);
    if (s.n == 0) continue;
    if (best < 0 || s.n > bs.n || (s.n == bs.n && s.mean < bs.mean)) {
      best = i;
      bs = s;
    }
  }
  return best;
}

struct verdict {
  double ratio = std::nan("");  // recommended over best static (means)
  double vs_dense = std::nan("");
  bool all_reached = false;
  int best = -1;
  int rec_diverged = 0;  // seeds in which the recommended configuration diverged
};
verdict judge(const std::vector<times>& t, int seeds) {
  verdict v;
  v.best = best_static(t);
  const summary r = reached(t[3]), d = reached(t[0]);
  v.all_reached = r.n == seeds;
  if (v.best >= 0 && r.n > 0) v.ratio = r.mean / reached(t[static_cast<std::size_t>(v.best)]).mean;
  if (d.n > 0 && r.n > 0) v.vs_dense = r.mean / d.mean;
  return v;
}

// One run; a non-finite gradient ends it as diverged (train_run.hpp) and the grid goes on.
run_outcome train_once(const fmnist::run_config& cfg, const fmnist::dataset& train, const fmnist::dataset& test,
                       int ranks) {
  run_outcome out = train_run(ranks, train, test, cfg);
  out.r.final_params = {};  // not needed here; the grid holds many runs
  return out;
}
// A run's figures: a diverged run has no final accuracy or bytes (NaN) and does not reach
// the target (-1), whatever it reached before it failed.
double final_acc(const run_outcome& o) { return o.diverged ? std::nan("") : o.r.epochs.back().test_acc; }
double wire_received(const run_outcome& o) {
  return o.diverged ? std::nan("") : o.r.total_wire_bytes_received_per_rank();
}
double time_to(const run_outcome& o, double target, int shadow = -1) {
  return o.diverged ? -1.0 : o.r.modeled_time_to(target, shadow);
}

struct model_pass {
  std::string name;  // "mlp" or "cnn"
  fmnist::run_config base;
};

// Writes the heat map's data and gnuplot script and runs gnuplot; false when it cannot.
bool heat_map(const std::string& out, const std::string& name, const std::vector<cell>& grid,
              const std::vector<double>& bws, const std::vector<double>& lats, const std::vector<verdict>& v,
              const std::string& title) {
  const std::string data = out + "/grid_" + name + ".dat", script = out + "/grid_" + name + ".gp";
  {
    std::ofstream f(data);
    for (std::size_t i = 0; i < grid.size(); ++i) {
      std::size_t x = 0, y = 0;
      for (std::size_t k = 0; k < lats.size(); ++k)
        if (lats[k] == grid[i].latency_ms) x = k;
      for (std::size_t k = 0; k < bws.size(); ++k)
        if (bws[k] == grid[i].gbps) y = k;
      const double r = std::isfinite(v[i].ratio) && v[i].all_reached ? v[i].ratio : 2.0;
      f << x << ' ' << y << ' ' << r << ' '
        << (std::isfinite(v[i].ratio) ? fmt("%.2fx", v[i].ratio) : std::string("n/a")) << '\n';
    }
  }
  {
    std::ofstream f(script);
    f << "# Regenerate with: gnuplot " << script << "\nset terminal pngcairo size 720,520\nset output '" << out
      << "/grid_" << name << ".png'\nset title '" << title << "'\nset xlabel 'latency'\nset ylabel 'bandwidth'\n"
      << "set cbrange [0.5:1.5]\nset cblabel 'time to target / best static choice'\n"
      << "set palette defined (0.5 '#1a9641', 1.0 '#ffffbf', 1.1 '#fdae61', 1.5 '#d7191c')\n"
      << "set xrange [-0.5:" << lats.size() - 0.5 << "]\nset yrange [-0.5:" << bws.size() - 0.5 << "]\nset xtics (";
    for (std::size_t k = 0; k < lats.size(); ++k)
      f << (k ? ", " : "") << "'" << cell{1, lats[k]}.latency_label() << "' " << k;
    f << ")\nset ytics (";
    for (std::size_t k = 0; k < bws.size(); ++k)
      f << (k ? ", " : "") << "'" << cell{bws[k], 1}.bandwidth_label() << "' " << k;
    f << ")\nplot '" << data << "' using 1:2:3 with image notitle, '' using 1:2:4 with labels notitle\n";
  }
  return std::system(("gnuplot '" + script + "' > /dev/null 2>&1").c_str()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The recommended configuration against the best static choice on a grid of networks"};
  std::vector<double> bandwidths{0.1, 1, 10, 25, 100};  // Gbit/s
  std::vector<double> latencies{0.005, 1, 32};          // ms
  std::vector<double> heavy_ratios{0.1, 0.5, 2.0};      // dense's communication / compute
  std::string heavy_network = "10gbps:0.005ms", model = "both", out = "out/network_grid";
  std::string data_dir = fmnist::default_data_dir;
  int seeds = 3, ranks = 4, walks = 3;
  bool quick = false, no_heavy = false;
  std::string heavy_model = "cnn";
  double target_below_dense = 1.0;
  app.add_option("--bandwidths", bandwidths, "bandwidths of the grid, Gbit/s")->delimiter(',');
  app.add_option("--latencies", latencies, "latencies of the grid, ms")->delimiter(',');
  app.add_option("--heavy-ratios", heavy_ratios, "compute-heavy settings: dense's communication over compute")
      ->delimiter(',');
  app.add_option("--heavy-network", heavy_network, "the network of the compute-heavy settings")->capture_default_str();
  app.add_flag("--no-heavy", no_heavy, "leave out the compute-heavy settings");
  app.add_option("--random-walks", walks, "changing networks random-walk:1..N (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--heavy-model", heavy_model,
                 "the model(s) of the compute-heavy settings: cnn (its layers overlap with backward), mlp or both")
      ->check(CLI::IsMember({"mlp", "cnn", "both"}))
      ->capture_default_str();
  app.add_option("--model", model, "mlp, cnn or both")
      ->check(CLI::IsMember({"mlp", "cnn", "both"}))
      ->capture_default_str();
  app.add_option("--seeds", seeds, "seeds 1..N")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--quick", quick, "development: --model mlp --seeds 1");
  app.add_option("--ranks", ranks, "thread ranks")->capture_default_str();
  app.add_option("--target-below-dense", target_below_dense, "target = dense's final accuracy minus this many points")
      ->capture_default_str();
  app.add_option("--out", out, "output directory")->capture_default_str();
  app.add_option("--data-dir", data_dir, "Fashion-MNIST directory")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    model = "mlp";
    seeds = 1;
  }
  try {
    const auto train = fmnist::load_fashion_mnist(data_dir, fmnist::split::train);
    const auto test = fmnist::load_fashion_mnist(data_dir, fmnist::split::test);
    std::filesystem::create_directories(out);
    // The reproduction's two passes (bench/reproduce/reproduce.cpp).
    std::vector<model_pass> passes;
    fmnist::run_config mlp;
    mlp.model = fmnist::model_kind::mlp;
    mlp.epochs = 12;
    mlp.batch = 128;
    mlp.train_subset = 19200;
    mlp.lr = {0.05, 0.1, {9}};
    if (model != "cnn") passes.push_back({"mlp", mlp});
    if (model != "mlp") {
      fmnist::run_config cnn = mlp;
      cnn.model = fmnist::model_kind::cnn;
      cnn.epochs = 8;
      cnn.lr.milestones = {6};
      passes.push_back({"cnn", cnn});
    }
    std::vector<cell> grid;
    for (double b : bandwidths)
      for (double l : latencies) grid.push_back({b, l});
    const auto methods = compared();
    const auto t_start = std::chrono::steady_clock::now();
    const auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    };
    const auto announce = [&](const std::string& what) {
      std::printf("[%6.0f s] %s ...", elapsed(), what.c_str());
      std::fflush(stdout);
    };
    // Every diverged run, one line each, for the report.
    std::vector<std::string> diverged_runs;
    const auto done = [&](const run_outcome& o, const std::string& what) {
      if (o.diverged) {
        std::printf(" %s\n", o.where().c_str());
        diverged_runs.push_back(what + ": " + o.where());
        return;
      }
      const auto& r = o.r;
      double codec = 0;
      for (const auto& e : r.epochs) codec += e.codec_s;
      std::printf(" test acc %.2f%%, modeled %.1f s, compression %.3f ms per step\n", 100 * r.epochs.back().test_acc,
                  r.epochs.back().modeled_time_s, 1e3 * codec / static_cast<double>(r.steps.size()));
    };

    std::ostringstream md, csv;
    csv.precision(9);
    // status: finished or diverged (a non-finite gradient stopped the run: nan accuracy and
    // bytes, time to target -1).
    csv << "model,setting,network,method,seed,final_test_acc,time_to_target_s,wire_bytes_received_per_rank,status\n";
    const auto status = [](const run_outcome& o) { return o.diverged ? "diverged" : "finished"; };
    md << "# The recommended configuration on a grid of networks\n\nMachine: " << machine_line() << ". Command:";
    for (int i = 0; i < argc; ++i) md << ' ' << (i ? argv[i] : "network_grid");
    md << "\n\nMethods: dense SGD, top-k over Allgather at CF 10 and CF 100 (the static choices), and the recommended "
          "configuration (GraVAC over top-k and Allgather at its default eps, with dense among its choices; not told "
          "the network). Time to target: modeled (compute per step + measured compression + the communication the "
          "simulated network charges and backward does not hide), the mean over the seeds that reached it. Target: "
          "dense's final test accuracy (mean over the seeds) minus "
       << target_below_dense << " point.\n\n";
    bool all_cells_ok = true, slow_ok = true, dense_ok = true, heavy_ok = true, walks_ok = true;
    std::string slow_detail, worst_detail, walk_detail;
    double worst = 0;
    for (auto& p : passes) {
      const auto t_pass = elapsed();
      // --- the static choices, charged on every cell at once -----------------------------
      std::vector<std::vector<run_outcome>> stat(3);
      for (int s = 1; s <= seeds; ++s)
        for (std::size_t i = 0; i < 3; ++i) {
          fmnist::run_config cfg = p.base;
          cfg.seed = static_cast<std::uint64_t>(s);
          cfg.method = methods[i].m;
          cfg.network = fmnist::network_config::parse(grid[0].spec());
          for (std::size_t k = 1; k < grid.size(); ++k)
            cfg.shadow_networks.push_back(fmnist::network_config::parse(grid[k].spec()));
          for (int w = 1; w <= walks; ++w) cfg.shadow_networks.push_back(fmnist::network_config::parse(walk_spec(w)));
          const std::string what = p.name + " seed " + std::to_string(s) + " " + methods[i].label + " (every network)";
          announce(what);
          stat[i].push_back(train_once(cfg, train, test, ranks));
          // Calibrated once (a run that diverged before its first epoch ended has not said).
          if (p.base.compute_s < 0 && stat[i].back().r.compute_per_step_s > 0)
            p.base.compute_s = stat[i].back().r.compute_per_step_s;
          done(stat[i].back(), what);
        }
      // Dense's mean over the seeds that finished; none: no target (every time -1, every
      // target missed).
      std::vector<double> dense_accs;
      int dense_diverged = 0;
      for (const auto& o : stat[0]) {
        dense_accs.push_back(final_acc(o));
        dense_diverged += o.diverged ? 1 : 0;
      }
      const double dense_acc = summarize(dense_accs).mean;
      const double target = dense_acc - target_below_dense / 100.0;
      // --- the recommended configuration on each cell --------------------------------------
      std::vector<verdict> verdicts;
      std::vector<std::vector<times>> cell_times;
      for (std::size_t k = 0; k < grid.size(); ++k) {
        std::vector<times> t(4);
        for (std::size_t i = 0; i < 3; ++i)
          for (int s = 0; s < seeds; ++s) {
            const auto& o = stat[i][static_cast<std::size_t>(s)];
            t[i].push_back(k == 0 ? time_to(o, target) : time_to(o, target, static_cast<int>(k) - 1));
            csv << p.name << ",grid," << grid[k].spec() << ',' << methods[i].key << ',' << s + 1 << ',' << final_acc(o)
                << ',' << t[i].back() << ',' << (k == 0 ? wire_received(o) : std::nan("")) << ',' << status(o) << '\n';
          }
        int rec_diverged = 0;
        for (int s = 1; s <= seeds; ++s) {
          fmnist::run_config cfg = p.base;
          cfg.seed = static_cast<std::uint64_t>(s);
          cfg.method = methods[3].m;
          cfg.network = fmnist::network_config::parse(grid[k].spec());
          const std::string what = p.name + " seed " + std::to_string(s) + " recommended on " + grid[k].spec();
          announce(what);
          const auto o = train_once(cfg, train, test, ranks);
          done(o, what);
          std::printf("           policy at each epoch's end:");
          for (const auto& e : o.r.epochs) std::printf(" [%s]", e.policy_state.c_str());
          std::printf("\n");
          t[3].push_back(time_to(o, target));
          rec_diverged += o.diverged ? 1 : 0;
          csv << p.name << ",grid," << grid[k].spec() << ",recommended," << s << ',' << final_acc(o) << ','
              << t[3].back() << ',' << wire_received(o) << ',' << status(o) << '\n';
        }
        verdicts.push_back(judge(t, seeds));
        verdicts.back().rec_diverged = rec_diverged;
        cell_times.push_back(std::move(t));
      }
      // --- the tables --------------------------------------------------------------------
      const std::string label = p.name == "cnn" ? "CNN" : "MLP";
      md << "## " << label << "\n\n"
         << label << " (" << stat[0][0].r.params << " parameters), " << p.base.epochs << " epochs of "
         << p.base.train_subset << " samples, " << seeds << " seed(s), " << ranks << " thread ranks; modeled compute "
         << fmt("%.2f", 1e3 * p.base.compute_s) << " ms per step (calibrated once). Dense's final accuracy "
         << (std::isfinite(dense_acc) ? fmt("%.2f", 100 * dense_acc) + "%, target " + fmt("%.2f", 100 * target) + "%"
                                      : std::string("none (dense diverged in every seed), so no target: every "
                                                    "target below is missed"))
         << (dense_diverged > 0 && std::isfinite(dense_acc)
                 ? " (dense diverged in " + std::to_string(dense_diverged) + "/" + std::to_string(seeds) +
                       " seeds, whose runs are left out)"
                 : std::string())
         << ".\n\n"
         << "Each cell: the best static choice and its time to target (s), then the recommended configuration's time "
            "and its ratio to the best static choice's.\n\n| bandwidth |";
      for (double l : latencies) md << ' ' << cell{1, l}.latency_label() << " |";
      md << "\n|---|";
      for (std::size_t k = 0; k < latencies.size(); ++k) md << "---|";
      md << '\n';
      for (std::size_t b = 0; b < bandwidths.size(); ++b) {
        md << "| " << cell{bandwidths[b], 1}.bandwidth_label() << " |";
        for (std::size_t l = 0; l < latencies.size(); ++l) {
          const std::size_t k = b * latencies.size() + l;
          const auto& v = verdicts[k];
          const auto& t = cell_times[k];
          const summary rec = reached(t[3]);
          md << ' '
             << (v.best >= 0 ? methods[static_cast<std::size_t>(v.best)].label + " " +
                                   fmt("%.2f", reached(t[static_cast<std::size_t>(v.best)]).mean)
                             : std::string("none reached"))
             << "; rec. " << (rec.n ? fmt("%.2f", rec.mean) : std::string("not reached"))
             << (rec.n && rec.n < seeds ? " (" + std::to_string(rec.n) + "/" + std::to_string(seeds) + ")" : "")
             << (v.rec_diverged > 0 ? " (" + diverged_of(v.rec_diverged, static_cast<std::size_t>(seeds)) + ")"
                                    : std::string())
             << (std::isfinite(v.ratio) ? " (**" + fmt("%.2fx", v.ratio) + "**)" : std::string()) << " |";
          const bool ok = v.all_reached && std::isfinite(v.ratio) && v.ratio <= 1.1;
          all_cells_ok = all_cells_ok && ok;
          if (std::isfinite(v.ratio) && v.ratio > worst) {
            worst = v.ratio;
            worst_detail = label + " " + grid[k].bandwidth_label() + ", " + grid[k].latency_label();
          }
          if (!v.all_reached) {
            worst = std::max(worst, 1e9);
            worst_detail = label + " " + grid[k].bandwidth_label() + ", " + grid[k].latency_label() + " (not reached)";
          }
          if (v.best == 0 && !(std::isfinite(v.vs_dense) && v.vs_dense <= 1.05)) dense_ok = false;
          if (grid[k].gbps <= 0.1) {
            const bool half = std::isfinite(v.vs_dense) && v.vs_dense <= 0.5 && v.all_reached;
            slow_ok = slow_ok && half;
            slow_detail += (slow_detail.empty() ? "" : "; ") + label + " " + grid[k].latency_label() + " " +
                           (std::isfinite(v.vs_dense) ? fmt("%.2fx", v.vs_dense) : std::string("n/a"));
          }
        }
        md << '\n';
      }
      if (heat_map(out, p.name, grid, bandwidths, latencies, verdicts,
                   "Fashion-MNIST " + label + ": recommended / best static choice, time to target"))
        md << "\nHeat map: `grid_" << p.name << ".png`.\n\n";
      else
        md << "\n(gnuplot is missing or failed: no heat map.)\n\n";

      // --- networks that keep changing ------------------------------------------------------
      if (walks > 0) {
        md << "Networks that keep changing (`random-walk:W`: bandwidth 0.1-100 Gbit/s and latency 10 us-5 ms, each "
              "moving by up to half a decade after holds of 10-200 steps, the same walk for every method). The "
              "static choices are charged on each walk; the recommended configuration and GraVAC as the paper run "
              "on it (their decisions follow the network). Time to target in s, mean over the seeds.\n\n"
           << "| walk | best static | GraVAC as the paper | recommended | rec. / best static | rec. / paper |\n"
              "|---|---:|---:|---:|---:|---:|\n";
        const fmnist::method_config paper =
            gravac_config(gravac::gravac_policy_options{}.epsilon, fmnist::collective_id::allgather, 0, false);
        for (int w = 1; w <= walks; ++w) {
          const int shadow = static_cast<int>(grid.size()) - 1 + (w - 1);
          std::vector<times> t(5);     // dense, CF 10, CF 100, recommended, paper
          std::vector<int> div(5, 0);  // diverged seeds of each
          for (std::size_t i = 0; i < 3; ++i)
            for (int s = 0; s < seeds; ++s) {
              const auto& o = stat[i][static_cast<std::size_t>(s)];
              t[i].push_back(time_to(o, target, shadow));
              csv << p.name << ",walk," << walk_spec(w) << ',' << methods[i].key << ',' << s + 1 << ',' << final_acc(o)
                  << ',' << t[i].back() << ",," << status(o) << '\n';
            }
          for (std::size_t j = 3; j < 5; ++j)
            for (int s = 1; s <= seeds; ++s) {
              fmnist::run_config cfg = p.base;
              cfg.seed = static_cast<std::uint64_t>(s);
              cfg.method = j == 3 ? methods[3].m : paper;
              cfg.network = fmnist::network_config::parse(walk_spec(w));
              const std::string key = j == 3 ? "recommended" : "gravac_paper";
              const std::string what = p.name + " seed " + std::to_string(s) + " " + key + " on " + walk_spec(w);
              announce(what);
              const auto o = train_once(cfg, train, test, ranks);
              done(o, what);
              t[j].push_back(time_to(o, target));
              div[j] += o.diverged ? 1 : 0;
              csv << p.name << ",walk," << walk_spec(w) << ',' << key << ',' << s << ',' << final_acc(o) << ','
                  << t[j].back() << ',' << wire_received(o) << ',' << status(o) << '\n';
            }
          const verdict v = judge(t, seeds);
          const summary rec = reached(t[3]), pap = reached(t[4]);
          const double vs_paper = rec.n == seeds && pap.n > 0 ? rec.mean / pap.mean : std::nan("");
          const bool ok =
              v.all_reached && std::isfinite(v.ratio) && v.ratio <= 1.1 && std::isfinite(vs_paper) && vs_paper <= 1.0;
          walks_ok = walks_ok && ok;
          walk_detail += (walk_detail.empty() ? "" : "; ") + label + " walk " + std::to_string(w) + " " +
                         (std::isfinite(v.ratio) ? fmt("%.2fx", v.ratio) : std::string("n/a")) + " / " +
                         (std::isfinite(vs_paper) ? fmt("%.2fx", vs_paper) : std::string("n/a"));
          md << "| " << w << " | "
             << (v.best >= 0 ? methods[static_cast<std::size_t>(v.best)].label + " " +
                                   fmt("%.2f", reached(t[static_cast<std::size_t>(v.best)]).mean)
                             : std::string("none reached"))
             << " | " << time_cell(t[4], div[4]) << " | " << time_cell(t[3], div[3]) << " | "
             << (std::isfinite(v.ratio) ? fmt("%.2fx", v.ratio) : std::string("-")) << " | "
             << (std::isfinite(vs_paper) ? fmt("%.2fx", vs_paper) : std::string("-")) << " |\n";
        }
        md << '\n';
      }

      // --- compute-heavy steps, overlap on -------------------------------------------------
      if (!no_heavy && (heavy_model == "both" || heavy_model == p.name || (quick && p.name == "mlp"))) {
        // Dense's synchronous communication per step on the heavy network, from a short run.
        fmnist::run_config probe = p.base;
        probe.method = methods[0].m;
        probe.network = fmnist::network_config::parse(heavy_network);
        probe.max_steps = 20;
        const auto po = train_once(probe, train, test, ranks);
        if (po.diverged) {
          // No communication to set the compute from: the settings are not run, and missed.
          md << "Compute-heavy steps on " << heavy_network << ": not run, the dense probe " << po.where() << ".\n\n";
          diverged_runs.push_back(p.name + " dense probe on " + heavy_network + ": " + po.where());
          heavy_ok = false;
        }
        const auto& pr = po.r;
        double comm = 0;
        for (const auto& s : pr.steps) comm += s.modeled_comm_s;
        comm /= static_cast<double>(std::max<std::size_t>(pr.steps.size(), 1));
        if (!po.diverged) {
          md << "Compute-heavy steps on " << heavy_network << ": dense's communication is " << fmt("%.3f", 1e3 * comm)
             << " ms per step; the modeled compute is set to that over the ratio below, and every method's buckets "
                "(one per layer) are aggregated as backward produces them (overlap on).\n\n"
             << "| dense comm. / compute | compute per step (ms) | dense (s) | top-k CF 10 (s) | top-k CF 100 (s) | "
                "recommended (s) | vs best static | vs dense |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n";
          for (double ratio : heavy_ratios) {
            std::vector<times> t(4);
            std::vector<int> div(4, 0);  // diverged seeds of each method
            for (int s = 1; s <= seeds; ++s)
              for (std::size_t i = 0; i < 4; ++i) {
                fmnist::run_config cfg = p.base;
                cfg.seed = static_cast<std::uint64_t>(s);
                cfg.method = methods[i].m;
                cfg.method.bucket_bytes = gravac::bucket_per_layer;
                cfg.network = fmnist::network_config::parse(heavy_network);
                cfg.compute_s = comm / ratio;
                cfg.overlap = true;
                const std::string what =
                    p.name + " seed " + std::to_string(s) + " " + methods[i].label + fmt(", comm/compute %g", ratio);
                announce(what);
                const auto o = train_once(cfg, train, test, ranks);
                done(o, what);
                t[i].push_back(time_to(o, target));
                div[i] += o.diverged ? 1 : 0;
                csv << p.name << ",heavy" << ratio << ',' << heavy_network << ',' << methods[i].key << ',' << s << ','
                    << final_acc(o) << ',' << t[i].back() << ',' << wire_received(o) << ',' << status(o) << '\n';
              }
            const verdict v = judge(t, seeds);
            const bool ok = v.all_reached && std::isfinite(v.ratio) && v.ratio <= 1.1 &&
                            (v.best != 0 || (std::isfinite(v.vs_dense) && v.vs_dense <= 1.05));
            heavy_ok = heavy_ok && ok;
            md << "| " << fmt("%.0f%%", 100 * ratio) << " | " << fmt("%.2f", 1e3 * comm / ratio);
            for (std::size_t i = 0; i < 4; ++i) md << " | " << time_cell(t[i], div[i]);
            md << " | " << (std::isfinite(v.ratio) ? fmt("%.2fx", v.ratio) : std::string("-")) << " | "
               << (std::isfinite(v.vs_dense) ? fmt("%.2fx", v.vs_dense) : std::string("-")) << " |\n";
          }
          md << '\n';
        }
      }
      md << "Wall time of the " << label << " pass: " << fmt("%.0f", elapsed() - t_pass) << " s.\n\n";
    }
    if (!diverged_runs.empty()) {
      md << "## Runs that diverged\n\nA non-finite gradient stopped these runs: they count as not reaching the "
            "target (so a target that needs them is missed), and their accuracy and bytes are nan in results.csv "
            "(status diverged).\n\n";
      for (const auto& d : diverged_runs) md << "- " << d << "\n";
      md << "\n";
    }
    md << "## Targets (means over the seeds)\n\n"
       << "- The recommended configuration reaches the target in every seed and in at most 1.1x the best static "
          "choice's time in every cell: "
       << met(all_cells_ok) << " (worst: " << (worst >= 1e9 ? worst_detail : fmt("%.2fx", worst) + ", " + worst_detail)
       << ").\n- Where dense is the best static choice, at most 5% slower than dense: " << met(dense_ok) << ".\n"
       << "- At 100 Mbit/s, at most 0.5x dense's time: " << met(slow_ok) << " (" << slow_detail << ").\n";
    if (walks > 0)
      md << "- On the random walks, the recommended configuration within 1.1x the best static choice and no slower "
            "than GraVAC as the paper (rec. / best static, rec. / paper): "
         << met(walks_ok) << " (" << walk_detail << ").\n";
    if (!no_heavy)
      md << "- Compute-heavy settings, at most 1.1x the best static choice and at most 5% slower than dense where "
            "dense is best: "
         << met(heavy_ok) << ".\n";
    md << "\nWall time: " << fmt("%.0f", elapsed()) << " s.\n";
    std::ofstream(out + "/results.md") << md.str();
    std::ofstream(out + "/results.csv") << csv.str();
    std::printf("\n%s\nresults: %s/results.md, %s/results.csv\n", md.str().c_str(), out.c_str(), out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "network_grid: %s\n", e.what());
    return 1;
  }
  return 0;
}
