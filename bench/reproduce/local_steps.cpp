// reproduce_local_steps: does choosing how often to communicate (local steps, DiLoCo family)
// as well as how hard to compress reach the target sooner, from fast networks to slow and
// changing ones? On the reproduction's MLP and CNN passes (real Fashion-MNIST, 4 thread
// ranks, the same data order and initialisation per seed) it trains
//
//   - the per-step methods: dense SGD and top-k over Allgather at CF 10 once per seed,
//     charged on every network at once (their decisions do not depend on it); the
//     recommended configuration (GraVAC with dense among its choices) once per network;
//   - DiLoCo at a fixed H of 10 and 50 (dense pseudo-gradient, outer Nesterov 0.7 / 0.9)
//     and SparseLoCo-style at H = 50 (sparseloco: top-k per chunk at 2% with 2-bit values and
//     decaying error feedback) once per seed, charged on every network;
//   - the adaptive policy (local_steps_policy over sparseloco: H in 1..8 and the kept
//     fraction in {dense, 10%, 2%}) once per network, on that network, which it learns
//     from the modeled times of its own exchanges.
//
// Networks: fast cells of the grid (with --full-grid, all 15 of network_grid's cells:
// 0.1-100 Gbit/s by 5 us-32 ms), 50 Mbit/s / 50 ms and 10 Mbit/s / 100 ms, and the
// random-walk traces. The target is dense's final test accuracy (mean over the seeds) minus
// 1 point; a time is the modeled time to reach it (compute per step plus the communication
// the simulated network charges; compression time is not charged, so every clock is
// deterministic), the mean over the seeds that reached it.
//
// Writes into --out: results.md (setting, tables, targets met or missed), results.csv (one
// row per method, network and seed) and heat_<model>.png (time to target over the best
// method's, per network).
//
//   reproduce_local_steps           # MLP and CNN, 3 seeds (about 20 minutes on 2 cores)
//   reproduce_local_steps --quick   # the MLP, one seed
//   reproduce_local_steps --full-grid  # every cell of the grid (about 35 minutes)
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <gravac/compress/identity.hpp>
#include <gravac/compress/sparseloco.hpp>
#include <gravac/policy/local_steps_policy.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "local_steps_train.hpp"
#include "method_configs.hpp"
#include "summary_stats.hpp"

namespace {

using namespace repro;

struct network_cell {
  std::string spec;                                     // fmnist::network_config spelling
  std::string label;                                    // table label
  enum class kind { fast, slow, changing, grid } type;  // grid: a slow cell of the full grid (no target)
};

// The methods, in table order. Static ones run once per seed on every network.
enum method_id { dense, topk_cf10, recommended, diloco_h10, diloco_h50, sparseloco_h50, adaptive, method_count };
const char* const method_key[] = {"dense",      "topk_cf10",      "recommended", "diloco_h10",
                                  "diloco_h50", "sparseloco_h50", "adaptive"};
const char* const method_label[] = {"dense SGD",   "top-k CF 10",     "GraVAC + dense",        "DiLoCo H=10",
                                    "DiLoCo H=50", "SparseLoCo H=50", "adaptive (H and ratio)"};
bool per_network(int m) { return m == recommended || m == adaptive; }
bool per_step(int m) { return m == dense || m == topk_cf10 || m == recommended; }

// One run's figures on one network.
struct outcome {
  double final_acc = 0;
  double time_to_target = -1;
  double wire = 0;
  std::string detail;  // the adaptive policy's choices
};

fmnist::run_result train_once(const fmnist::run_config& cfg, const fmnist::dataset& train, const fmnist::dataset& test,
                              int ranks) {
  fmnist::run_result out;
  gravac::run_ranks(ranks, [&](gravac::thread_communicator& comm) {
    auto r = fmnist::train(comm, train, test, cfg);
    if (comm.rank() == 0) out = std::move(r);
  });
  out.final_params = {};
  return out;
}

template <class C, class K, class P>
local_run local_once(const fmnist::run_config& cfg, const typename gravac::local_steps<C, K, P>::options& opt,
                     const std::vector<fmnist::network_config>& nets, const fmnist::dataset& train,
                     const fmnist::dataset& test, int ranks) {
  local_run out;
  gravac::run_ranks(ranks, [&](gravac::thread_communicator& comm) {
    auto r = train_local<C, K, P>(comm, train, test, cfg, opt, nets);
    if (comm.rank() == 0) out = std::move(r);
  });
  return out;
}

using diloco_t = gravac::local_steps<gravac::identity, gravac::dense_allreduce, gravac::fixed_policy>;
using sparseloco_t = gravac::local_steps<gravac::sparseloco, gravac::allgather, gravac::fixed_policy>;
using adaptive_t = gravac::local_steps<gravac::sparseloco, gravac::allgather, gravac::local_steps_policy>;

// DiLoCo's outer step as published; SparseLoCo (and the adaptive policy over it) average:
// its decaying error feedback plays the outer momentum's part.
const gravac::outer_options diloco_outer{gravac::outer_kind::nesterov, 0.7, 0.9};
const gravac::outer_options averaging_outer{gravac::outer_kind::averaging, 1.0, 0.0};
// The adaptive policy's staleness bound and error-feedback decay (--adaptive-max-period,
// --adaptive-decay). Its rounds are short (H <= 8), and over many short rounds a decay below 1
// fades most of what waits in the residual: it keeps plain error feedback.
std::size_t adaptive_max_period = 8;
float adaptive_decay = 1.0f;

diloco_t::options diloco_options(std::size_t h) {
  diloco_t::options o;
  o.outer = diloco_outer;
  o.period = h;
  o.exchange.policy.kept_fraction = 1.0;
  return o;
}
sparseloco_t::options sparseloco_options(std::size_t h) {
  sparseloco_t::options o;
  o.outer = averaging_outer;
  o.period = h;
  o.exchange.policy.kept_fraction = 0.02;
  o.exchange.compressor.decay = 0.95f;  // SparseLoCo's
  return o;
}
adaptive_t::options adaptive_options(double compute_s) {
  adaptive_t::options o;
  o.outer = averaging_outer;
  auto& p = o.exchange.policy;
  p.kept_fractions = {1.0, 0.1, 0.02};
  p.max_period = adaptive_max_period;
  o.exchange.compressor.decay = adaptive_decay;
  p.source = gravac::network_source::modeled;
  p.time.source = gravac::time_source::simulated;
  p.time.compute_s = compute_s;
  return o;
}

std::string choices_of(const local_run& r) {
  std::ostringstream o;
  std::size_t n = 0;
  for (const auto& [h, c] : r.rounds_by_period) n += c;
  o << n << " exchanges: H";
  for (const auto& [h, c] : r.rounds_by_period) o << ' ' << h << "x" << c;
  o << "; kept";
  for (const auto& [f, c] : r.rounds_by_fraction) o << ' ' << fmt("%g", f) << "x" << c;
  return o.str();
}

bool heat_map(const std::string& out, const std::string& name, const std::vector<network_cell>& cells,
              const std::vector<std::vector<double>>& ratio) {
  const std::string data = out + "/heat_" + name + ".dat", script = out + "/heat_" + name + ".gp";
  {
    std::ofstream f(data);
    for (std::size_t k = 0; k < cells.size(); ++k)
      for (int m = 0; m < method_count; ++m) {
        const double r = ratio[k][static_cast<std::size_t>(m)];
        f << k << ' ' << m << ' ' << (std::isfinite(r) ? std::min(std::log10(r), 2.0) : 2.0) << ' '
          << (std::isfinite(r) ? fmt("%.2fx", r) : std::string("n/a")) << '\n';
      }
  }
  {
    std::ofstream f(script);
    // Wide enough for each cell's ratio (the full grid has 20 networks).
    const std::size_t width = std::max<std::size_t>(1100, 260 + 85 * cells.size());
    f << "# Regenerate with: gnuplot " << script << "\nset terminal pngcairo size " << width << ",560\nset output '"
      << out << "/heat_" << name << ".png'\nset title 'time to target over the fastest method on each network (" << name
      << ")'\nset cbrange [0:2]\nset cblabel 'log10 ratio'\n"
      << "set palette defined (0 '#1a9641', 0.05 '#ffffbf', 0.5 '#fdae61', 2 '#d7191c')\n"
      << "set xrange [-0.5:" << cells.size() - 0.5 << "]\nset yrange [-0.5:" << static_cast<int>(method_count) - 0.5
      << "]\nset xtics rotate by -30 (";
    for (std::size_t k = 0; k < cells.size(); ++k) f << (k ? ", " : "") << "'" << cells[k].label << "' " << k;
    f << ")\nset ytics (";
    for (int m = 0; m < method_count; ++m) f << (m ? ", " : "") << "'" << method_label[m] << "' " << m;
    f << ")\nplot '" << data << "' using 1:2:3 with image notitle, '' using 1:2:4 with labels font ',9' notitle\n";
  }
  return std::system(("gnuplot '" + script + "' > /dev/null 2>&1").c_str()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Local steps and the adaptive choice of H and ratio against per-step methods"};
  std::string model = "both", out = "out/reproduce/local_steps", data_dir = fmnist::default_data_dir;
  int seeds = 3, ranks = 4, walks = 3;
  bool quick = false;
  double target_below_dense = 1.0;
  app.add_option("--model", model, "mlp, cnn or both")
      ->check(CLI::IsMember({"mlp", "cnn", "both"}))
      ->capture_default_str();
  app.add_option("--seeds", seeds, "seeds per method")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--random-walks", walks, "changing networks random-walk:1..N")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--quick", quick, "development: the MLP, one seed");
  app.add_option("--adaptive-decay", adaptive_decay, "the adaptive policy's error-feedback decay (sparseloco)")
      ->capture_default_str();
  app.add_option("--adaptive-max-period", adaptive_max_period, "the adaptive policy's bound on H")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bool only_local = false, full_grid = false;
  app.add_flag("--only-local", only_local, "development: the local-step methods only");
  app.add_flag("--full-grid", full_grid,
               "every cell of the network grid (0.1-100 Gbit/s by 5 us-32 ms), not only its three fast ones");
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
    std::vector<network_cell> cells{{"100gbps:0.005ms", "100 Gbit/s, 5 us", network_cell::kind::fast},
                                    {"10gbps:0.005ms", "10 Gbit/s, 5 us", network_cell::kind::fast},
                                    {"1gbps:1ms", "1 Gbit/s, 1 ms", network_cell::kind::fast}};
    if (full_grid) {  // network_grid's cells: fast at 1 Gbit/s or more and 1 ms or less
      cells.clear();
      for (const char* b : {"0.1", "1", "10", "25", "100"})
        for (const char* l : {"0.005", "1", "32"}) {
          const bool fast = std::string(b) != "0.1" && std::string(l) != "32";
          const std::string bl = std::string(b) == "0.1" ? "100 Mbit/s" : std::string(b) + " Gbit/s";
          const std::string ll = std::string(l) == "0.005" ? "5 us" : std::string(l) + " ms";
          cells.push_back({std::string(b) + "gbps:" + l + "ms", bl + ", " + ll,
                           fast ? network_cell::kind::fast : network_cell::kind::grid});
        }
    }
    cells.push_back({"0.05gbps:50ms", "50 Mbit/s, 50 ms", network_cell::kind::slow});
    cells.push_back({"0.01gbps:100ms", "10 Mbit/s, 100 ms", network_cell::kind::slow});
    for (int w = 1; w <= walks; ++w)
      cells.push_back(
          {"random-walk:" + std::to_string(w), "random walk " + std::to_string(w), network_cell::kind::changing});
    std::vector<fmnist::network_config> nets;
    for (const auto& c : cells) nets.push_back(fmnist::network_config::parse(c.spec));

    struct pass {
      std::string name;
      fmnist::run_config base;
    };
    std::vector<pass> passes;
    fmnist::run_config mlp;  // the reproduction's passes (network_grid's)
    mlp.model = fmnist::model_kind::mlp;
    mlp.epochs = 12;
    mlp.batch = 128;
    mlp.train_subset = 19200;
    mlp.lr = {0.05, 0.1, {9}};
    mlp.charge_codec = false;
    if (model != "cnn") passes.push_back({"mlp", mlp});
    if (model != "mlp") {
      fmnist::run_config cnn = mlp;
      cnn.model = fmnist::model_kind::cnn;
      cnn.epochs = 8;
      cnn.lr.milestones = {6};
      passes.push_back({"cnn", cnn});
    }

    const auto t_start = std::chrono::steady_clock::now();
    const auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    };
    const auto announce = [&](const std::string& what) {
      std::printf("[%6.0f s] %s ...", elapsed(), what.c_str());
      std::fflush(stdout);
    };

    std::ostringstream md, csv;
    csv.precision(9);
    csv << "model,network,method,seed,final_test_acc,time_to_target_s,wire_bytes_received_per_rank,choices\n";
    md << "# Local steps and the adaptive choice of H and ratio\n\nMachine: " << machine_line() << ". Command:";
    for (int i = 0; i < argc; ++i) md << ' ' << (i ? argv[i] : "reproduce_local_steps");
    md << "\n\nMethods: dense SGD and top-k over Allgather at CF 10 (per step, static), GraVAC with dense among its "
          "choices (per step, adaptive; the recommended configuration), DiLoCo at H = 10 and H = 50 (the dense "
          "pseudo-gradient averaged, outer Nesterov with lr 0.7 and momentum 0.9), SparseLoCo-style at H = 50 "
          "(sparseloco at 2% per chunk of 4096, 2-bit values, error feedback decaying by 0.95, which stands in for "
          "the outer momentum: the outer step averages), "
          "and the adaptive policy (local_steps_policy over sparseloco: H from 1 to 8, its staleness bound, and the "
          "kept fraction from dense, 10% and 2%, priced from the modeled times of its own exchanges; not told the "
          "network; plain error feedback, the outer step averaging). The inner "
          "optimizer is every method's SGD with momentum 0.9. Time to target: modeled (compute per step + the "
          "communication the simulated network charges; compression is not charged), the mean over the seeds that "
          "reached it. Target: dense's final test accuracy (mean over the seeds) minus "
       << target_below_dense << " point. The model of a local-step method is its global point (as of its last "
       << "exchange).\n\n";

    bool slow_ok = true, changing_ok = true, fast_ok = true, acc_ok = true;
    std::string slow_detail, changing_detail, fast_detail, acc_detail, grid_detail;
    for (auto& p : passes) {
      const double t_pass = elapsed();
      // runs[m][seed][network]
      std::vector<std::vector<std::vector<outcome>>> runs(
          method_count,
          std::vector<std::vector<outcome>>(static_cast<std::size_t>(seeds), std::vector<outcome>(cells.size())));
      std::vector<double> finals;
      for (int s = 1; s <= seeds; ++s) {
        const auto si = static_cast<std::size_t>(s - 1);
        fmnist::run_config cfg = p.base;
        cfg.seed = static_cast<std::uint64_t>(s);
        // Per-step static methods, charged on every network (shadows).
        for (int m : {dense, topk_cf10}) {
          if (only_local && m == topk_cf10) continue;
          cfg.method = m == dense
                           ? fixed_config(fmnist::compressor_id::identity, fmnist::collective_id::dense_allreduce, 1.0)
                           : fixed_config(fmnist::compressor_id::topk, fmnist::collective_id::allgather, 0.1);
          cfg.network = nets[0];
          cfg.shadow_networks.assign(nets.begin() + 1, nets.end());
          announce(p.name + " seed " + std::to_string(s) + " " + method_label[m] + " (every network)");
          const auto r = train_once(cfg, train, test, ranks);
          if (p.base.compute_s < 0) p.base.compute_s = cfg.compute_s = r.compute_per_step_s;  // calibrated once
          for (std::size_t k = 0; k < cells.size(); ++k) {
            auto& o = runs[m][si][k];
            o.final_acc = r.epochs.back().test_acc;
            o.wire = r.total_wire_bytes_received_per_rank();  // the same decisions on every network
          }
          if (m == dense) finals.push_back(r.epochs.back().test_acc);
          // Times need the target, known once every dense run is in: keep the epochs' clocks.
          for (std::size_t k = 0; k < cells.size(); ++k) {
            std::ostringstream d;
            d.precision(9);
            for (const auto& e : r.epochs)
              d << e.test_acc << ':' << (k == 0 ? e.modeled_time_s : e.shadow_time_s[k - 1]) << ' ';
            runs[m][si][k].detail = d.str();
          }
          std::printf(" test acc %.2f%%\n", 100 * r.epochs.back().test_acc);
        }
        cfg.shadow_networks.clear();
        // Local-step static methods, charged on every network.
        const auto record_local = [&](int m, const local_run& r) {
          for (std::size_t k = 0; k < cells.size(); ++k) {
            auto& o = runs[m][si][k];
            o.final_acc = r.test_acc.back();
            o.wire = r.wire_received[k];
            std::ostringstream d;
            d.precision(9);
            for (std::size_t e = 0; e < r.test_acc.size(); ++e) d << r.test_acc[e] << ':' << r.clock[k][e] << ' ';
            o.detail = d.str();
          }
          std::printf(" test acc %.2f%%, %s\n", 100 * r.test_acc.back(), choices_of(r).c_str());
        };
        for (int m : {diloco_h10, diloco_h50, sparseloco_h50}) {
          announce(p.name + " seed " + std::to_string(s) + " " + method_label[m] + " (every network)");
          if (m == sparseloco_h50)
            record_local(m, local_once<gravac::sparseloco, gravac::allgather, gravac::fixed_policy>(
                                cfg, sparseloco_options(50), nets, train, test, ranks));
          else
            record_local(m, local_once<gravac::identity, gravac::dense_allreduce, gravac::fixed_policy>(
                                cfg, diloco_options(m == diloco_h10 ? 10 : 50), nets, train, test, ranks));
        }
        // The adaptive methods, once per network, on it.
        for (std::size_t k = 0; k < cells.size(); ++k) {
          if (!only_local) {
            announce(p.name + " seed " + std::to_string(s) + " " + method_label[recommended] + " on " + cells[k].spec);
            fmnist::run_config c = cfg;
            c.method = recommended_config(0);
            c.network = nets[k];
            const auto r = train_once(c, train, test, ranks);
            auto& o = runs[recommended][si][k];
            o.final_acc = r.epochs.back().test_acc;
            o.wire = r.total_wire_bytes_received_per_rank();
            std::ostringstream d;
            d.precision(9);
            for (const auto& e : r.epochs) d << e.test_acc << ':' << e.modeled_time_s << ' ';
            o.detail = d.str();
            std::printf(" test acc %.2f%%\n", 100 * o.final_acc);
          }
          announce(p.name + " seed " + std::to_string(s) + " " + method_label[adaptive] + " on " + cells[k].spec);
          const auto a = local_once<gravac::sparseloco, gravac::allgather, gravac::local_steps_policy>(
              cfg, adaptive_options(p.base.compute_s), {nets[k]}, train, test, ranks);
          auto& oa = runs[adaptive][si][k];
          oa.final_acc = a.test_acc.back();
          oa.wire = a.wire_received[0];
          std::ostringstream da;
          da.precision(9);
          for (std::size_t e = 0; e < a.test_acc.size(); ++e) da << a.test_acc[e] << ':' << a.clock[0][e] << ' ';
          oa.detail = da.str() + "| " + choices_of(a);
          std::printf(" test acc %.2f%%, %s\n", 100 * oa.final_acc, choices_of(a).c_str());
        }
      }
      double dense_acc = 0;
      for (double f : finals) dense_acc += f / static_cast<double>(finals.size());
      const double target = dense_acc - target_below_dense / 100.0;
      // Times to target from each run's (accuracy:clock) pairs per epoch.
      for (int m = 0; m < method_count; ++m)
        for (auto& by_seed : runs[static_cast<std::size_t>(m)])
          for (auto& o : by_seed) {
            std::istringstream in(o.detail);
            std::string pair;
            while (in >> pair && pair != "|") {
              const auto colon = pair.find(':');
              if (std::stod(pair.substr(0, colon)) >= target) {
                o.time_to_target = std::stod(pair.substr(colon + 1));
                break;
              }
            }
            const auto bar = o.detail.find("| ");
            o.detail = bar == std::string::npos ? "" : o.detail.substr(bar + 2);
          }

      md << "## " << (p.name == "mlp" ? "MLP" : "CNN") << "\n\n"
         << p.base.epochs << " epochs of " << p.base.train_subset << " samples, " << seeds << " seed(s), " << ranks
         << " thread ranks; modeled compute " << fmt("%.2f", 1e3 * p.base.compute_s)
         << " ms per step (calibrated once). Dense's final accuracy " << fmt("%.2f", 100 * dense_acc) << "%, target "
         << fmt("%.2f", 100 * target) << "%.\n\nTime to target in modeled seconds (mean over the seeds that reached "
         << "it; '-' where none did):\n\n| network |";
      for (int m = 0; m < method_count; ++m) md << ' ' << method_label[m] << " |";
      md << " adaptive / best static | adaptive / best per-step |\n|---|";
      for (int m = 0; m < method_count + 2; ++m) md << "---:|";
      md << '\n';
      std::vector<std::vector<double>> ratio(cells.size(), std::vector<double>(method_count, INFINITY));
      std::ostringstream acc_md, wire_md, choice_md;
      for (std::size_t k = 0; k < cells.size(); ++k) {
        std::vector<summary> t(method_count);
        std::vector<double> acc(method_count, 0), wire(method_count, 0);
        for (int m = 0; m < method_count; ++m) {
          std::vector<double> ts;
          for (int s = 0; s < seeds; ++s) {
            const auto& o = runs[static_cast<std::size_t>(m)][static_cast<std::size_t>(s)][k];
            ts.push_back(o.time_to_target);
            acc[static_cast<std::size_t>(m)] += o.final_acc / seeds;
            wire[static_cast<std::size_t>(m)] += o.wire / seeds;
            csv << p.name << ',' << cells[k].spec << ',' << method_key[m] << ',' << s + 1 << ',' << o.final_acc << ','
                << o.time_to_target << ',' << o.wire << ",\"" << o.detail << "\"\n";
          }
          t[static_cast<std::size_t>(m)] = reached(ts);
          // A method that missed the target on some seed is not counted as reaching it.
          if (t[static_cast<std::size_t>(m)].n != seeds) t[static_cast<std::size_t>(m)].mean = INFINITY;
        }
        double best = INFINITY, best_static = INFINITY, best_step = INFINITY;
        int best_static_m = -1;
        for (int m = 0; m < method_count; ++m) {
          const double v = t[static_cast<std::size_t>(m)].mean;
          best = std::min(best, v);
          if (!per_network(m) && v < best_static) {
            best_static = v;
            best_static_m = m;
          }
          if (per_step(m)) best_step = std::min(best_step, v);
        }
        for (int m = 0; m < method_count; ++m)
          ratio[k][static_cast<std::size_t>(m)] = t[static_cast<std::size_t>(m)].mean / best;
        // A ratio is NaN where the adaptive policy or every method compared missed the target.
        const double ad = t[adaptive].mean;
        const double vs_static = std::isfinite(ad) && std::isfinite(best_static) ? ad / best_static : std::nan("");
        const double vs_step = std::isfinite(ad) && std::isfinite(best_step) ? best_step / ad : std::nan("");
        md << "| " << cells[k].label << " |";
        for (int m = 0; m < method_count; ++m) {
          const auto& x = t[static_cast<std::size_t>(m)];
          md << ' ' << (std::isfinite(x.mean) ? fmt("%.2f", x.mean) : std::string("-")) << " |";
        }
        md << ' ' << (std::isfinite(vs_static) ? fmt("%.2fx", vs_static) : std::string("n/a")) << " ("
           << (best_static_m >= 0 ? method_label[best_static_m] : "none") << ") | "
           << (std::isfinite(vs_step) ? fmt("%.1fx sooner", vs_step) : std::string("n/a")) << " |\n";
        acc_md << "| " << cells[k].label << " |";
        wire_md << "| " << cells[k].label << " |";
        for (int m = 0; m < method_count; ++m) {
          acc_md << ' ' << fmt("%.2f", 100 * acc[static_cast<std::size_t>(m)]) << " |";
          wire_md << ' ' << fmt("%.3g", wire[static_cast<std::size_t>(m)] / 1e6) << " |";
        }
        acc_md << '\n';
        wire_md << '\n';
        choice_md << "- " << cells[k].label << ": " << runs[adaptive][0][k].detail << '\n';
        const std::string where = p.name + " " + cells[k].label;
        const double acc_gap = 100 * (dense_acc - acc[adaptive]);
        if (acc_gap > 0.5) {
          acc_ok = false;
          acc_detail += " " + where + " " + fmt("%.2f", acc_gap) + " points below;";
        }
        switch (cells[k].type) {
          case network_cell::kind::slow:
            // Met where the adaptive policy reached the target and no per-step method did, too.
            if (!(vs_step >= 3) && !(std::isfinite(ad) && !std::isfinite(best_step))) slow_ok = false;
            slow_detail +=
                " " + where + " " + (std::isfinite(vs_step) ? fmt("%.1fx", vs_step) : std::string("n/a")) + ";";
            break;
          case network_cell::kind::changing:
            if (!(1 / vs_static >= 1.37) && !(std::isfinite(ad) && !std::isfinite(best_static))) changing_ok = false;
            changing_detail +=
                " " + where + " " + (std::isfinite(vs_static) ? fmt("%.2fx", 1 / vs_static) : std::string("n/a")) + ";";
            break;
          case network_cell::kind::fast:
            if (!(vs_static <= 1.1)) fast_ok = false;
            fast_detail +=
                " " + where + " " + (std::isfinite(vs_static) ? fmt("%.2fx", vs_static) : std::string("n/a")) + ";";
            break;
          case network_cell::kind::grid:
            grid_detail +=
                " " + where + " " + (std::isfinite(vs_static) ? fmt("%.2fx", vs_static) : std::string("n/a")) + ";";
            break;
        }
      }
      md << "\nFinal test accuracy (%, mean over the seeds):\n\n| network |";
      for (int m = 0; m < method_count; ++m) md << ' ' << method_label[m] << " |";
      md << "\n|---|";
      for (int m = 0; m < method_count; ++m) md << "---:|";
      md << '\n'
         << acc_md.str() << "\nWire bytes a rank received over the run (MB, mean over the seeds):\n\n| network |";
      for (int m = 0; m < method_count; ++m) md << ' ' << method_label[m] << " |";
      md << "\n|---|";
      for (int m = 0; m < method_count; ++m) md << "---:|";
      md << '\n' << wire_md.str() << "\nWhat the adaptive policy chose (seed 1):\n\n" << choice_md.str();
      const bool plotted = heat_map(out, p.name, cells, ratio);
      md << "\nHeat map: `heat_" << p.name << ".png`" << (plotted ? "" : " (gnuplot failed; the data is in the .dat)")
         << ". Wall time of the pass: " << fmt("%.0f", elapsed() - t_pass) << " s.\n\n";
    }
    md << "## Targets\n\n"
       << "- At 50 Mbit/s / 50 ms and slower, the adaptive policy reaches the target at least 3x sooner than the best "
          "per-step method: "
       << met(slow_ok) << " (" << slow_detail << ")\n"
       << "- On changing networks, at least 1.37x faster than the best static strategy (fixed H included): "
       << met(changing_ok) << " (" << changing_detail << ")\n"
       << "- On the fast cells, within 1.1x of the best static choice: " << met(fast_ok) << " (" << fast_detail << ")\n"
       << (grid_detail.empty() ? std::string()
                               : "- The other cells of the grid (no target), adaptive over the best static choice: " +
                                     grid_detail + "\n")
       << "- Final accuracy within 0.5 points of dense: " << met(acc_ok) << (acc_ok ? "" : " (" + acc_detail + ")")
       << "\n- The whole run in under 30 minutes on 2 cores: " << met(elapsed() < 1800) << " ("
       << fmt("%.0f", elapsed()) << " s)\n";
    std::ofstream(out + "/results.md") << md.str();
    std::ofstream(out + "/results.csv") << csv.str();
    std::printf("wrote %s/results.md (%.0f s)\n", out.c_str(), elapsed());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reproduce_local_steps: %s\n", e.what());
    return 1;
  }
  return 0;
}
