// reproduce: the papers' comparisons on real Fashion-MNIST training, at the scale one
// machine allows. Every method trains the same model on the same data order for the same
// number of epochs, once per seed, on N thread ranks, with communication charged by
// gravac's simulated network:
//
//   dense SGD; static top-k at CF 10, 100 and 1000; GraVAC with dense among its choices (top-k
//   over Allgather, the recommended configuration: method_configs.hpp) and the same at other
//   eps (the sweep behind the default); GraVAC as the paper (no dense choice); Accordion, also
//   at the paper's top-k levels; AdaComp; AR-Topk with the multi-objective policy; the
//   flexible collective with the multi-objective policy, also with the paper's warm-up
//
// under 1 Gbit/s, 10 Gbit/s and the changing schedule (25 Gbit/s, 1 ms <-> 1 Gbit/s,
// 32 ms). Methods whose decisions do not depend on the network train once per seed and are
// charged on all three networks at the same time (shadow clocks); GraVAC (whose throughput
// uses the modeled clock), AR-Topk + MOO and flexible + MOO train once per network and
// seed. Every table cell is the mean +- standard deviation over the seeds.
//
// Bytes are reported twice: the packet bytes (what a rank's collective hands over) and the
// wire bytes the simulated network counts for the algorithm it charges (an Allgather
// delivers the N-1 other packets into every rank). Comparisons use the wire bytes.
//
// The MLP pass runs first, then the quantizer comparison (QSGD 8-bit and EF-sign, each
// through the Allgather and through the compressed allreduce, on the MLP pass's setting and
// seeds; --quantizers runs it alone, --no-quantizers leaves it out), then (unless
// --mlp-only or --quick) a CNN pass with its own epochs and seeds (--cnn-*), reported in a
// table of its own.
//
// Writes, into --out: one directory per run (<model>/seed<k>/<method>[-<network>] with
// steps.csv and epochs.csv), results.md (the setting, the tables and the targets, met or
// missed), results.csv (one row per run) and comparison plots of seed 1 at 1 Gbit/s.
//
// A run whose gradient goes non-finite (gravac::error, status::non_finite, thrown on every
// rank) is recorded as diverged (train_run.hpp) and the experiment goes on: the tables say
// "diverged" / "k/N diverged", it counts as not reaching the target, and a target that
// needs it is missed. Any other error ends the experiment.
//
//   reproduce                 # MLP (3 seeds) + CNN (3 seeds): see README.md for the time it takes
//   reproduce --quick         # MLP, one seed: for development
//   reproduce --only gravac   # one method
//   reproduce --overlap-only  # the overlap run: the CNN, 4 ranks, 1 Gbit/s, --overlap off vs on
//   reproduce --quantizers    # the quantizer comparison alone
//
// --overlap (or --overlap-only) adds the overlap run: each of --overlap-methods trains the
// CNN with gravac's buckets aggregated after backward (the synchronous step) and overlapped
// with it (fmnist::run_config::overlap), from the same seed, with the same modeled compute
// and per-layer ready times (calibrated by the first run), plus the synchronous step with
// one bucket (the step before buckets existed). It prints the exposed communication over
// the total from the same run and checks the target (at most 30%).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <gravac/comm/thread_communicator.hpp>
#include <gravac/core/error.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "fmnist/report.hpp"
#include "fmnist/train.hpp"
#include "method_configs.hpp"
#include "summary_stats.hpp"
#include "train_run.hpp"

namespace {

using namespace repro;

// The library's recommended adaptive configuration (method_configs.hpp): GraVAC over top-k
// and Allgather at the default eps, with dense among its choices. The method table, the
// runs and the targets follow recommended_key.
constexpr const char* recommended_key = "gravac";

enum class kind : unsigned char { fixed_choice, adaptive };  // statics: dense and top-k at a fixed CF

struct method_spec {
  std::string key;          // directory and --only name
  std::string label;        // table label
  fmnist::method_config m;  // the method
  bool network_dependent;   // trains once per network
  kind k;
  bool first_network_only = false;  // a network-dependent check that matters only where compression pays
};

const std::vector<std::string> network_specs = {"1gbps", "10gbps", "schedule"};
const std::vector<std::string> network_labels = {"1 Gbit/s", "10 Gbit/s", "schedule"};
constexpr int n_networks = 3;

std::vector<method_spec> methods(std::uint64_t gravac_period) {
  using namespace fmnist;
  std::vector<method_spec> v;
  const auto fixed = fixed_config;
  const auto stat = kind::fixed_choice;
  const auto adapt = kind::adaptive;
  v.push_back({"dense", "dense SGD", fixed(compressor_id::identity, collective_id::dense_allreduce, 1.0), false, stat});
  v.push_back({"topk_cf10", "top-k CF 10", fixed(compressor_id::topk, collective_id::allgather, 0.1), false, stat});
  v.push_back({"topk_cf100", "top-k CF 100", fixed(compressor_id::topk, collective_id::allgather, 0.01), false, stat});
  v.push_back(
      {"topk_cf1000", "top-k CF 1000", fixed(compressor_id::topk, collective_id::allgather, 0.001), false, stat});
  v.push_back({recommended_key, "GraVAC + dense (top-k), recommended", recommended_config(gravac_period), true, adapt});
  const double eps = gravac::gravac_policy_options{}.epsilon;
  v.push_back({"gravac_paper", "GraVAC (top-k), as the paper",
               gravac_config(eps, collective_id::allgather, gravac_period, false), true, adapt});
  // The eps sweep that justifies the default: gravac's gain has error feedback in its
  // denominator (u = g + e), which makes it stricter than the authors'.
  // On the first network only (1 Gbit/s), where the ratio it picks is what is sent.
  for (double e : {0.5, 0.6, 0.8}) {
    const std::string t = std::to_string(e).substr(0, 3);  // "0.5"
    v.push_back({"gravac_eps" + t, "GraVAC + dense eps " + t,
                 gravac_config(e, collective_id::allgather, gravac_period, true), true, adapt, true});
  }
  {
    method_config m = fixed(compressor_id::topk, collective_id::allgather, 1);
    m.policy = policy_id::accordion;  // low 0.1 (CF 10), high 0.01 (CF 100), one interval per epoch
    // The authors compare statistics 10 epochs apart in runs of about 200 epochs; this run has
    // 12 (8 for the CNN), so decisions every 2 epochs: at the ends of epochs 1, 3, 5, ...
    m.accordion.compare_every = 2;
    v.push_back({"accordion", "Accordion (top-k 10/100)", m, false, adapt});
    // The authors' top-k levels (99% and 10% kept), the same decisions.
    m.accordion.low_compression = 0.99;
    m.accordion.high_compression = 0.1;
    v.push_back({"accordion_paper", "Accordion (top-k 99%/10%, the paper's levels)", m, false, adapt});
  }
  {
    method_config m = fixed(compressor_id::adacomp, collective_id::allgather, 1);
    m.policy = policy_id::adacomp;
    v.push_back({"adacomp", "AdaComp", m, false, adapt});
  }
  {
    method_config m = fixed(compressor_id::topk, collective_id::allreduce_compatible, 1);
    m.policy = policy_id::moo;
    m.moo.source = gravac::network_source::modeled;
    m.moo.collective = gravac::collective_kind::allreduce_compatible;
    v.push_back({"artopk_moo", "AR-Topk + MOO", m, true, adapt});
  }
  {
    method_config m = fixed(compressor_id::topk, collective_id::flexible, 1);
    m.policy = policy_id::moo;
    m.moo.source = gravac::network_source::modeled;
    m.flexible.source = gravac::network_source::modeled;
    v.push_back({"flexible_moo", "flexible + MOO", m, true, adapt});
    // The authors' warm-up: 5 epochs, the kept fraction falling from 1 to 0.1.
    m.moo.warmup_intervals = 5;
    v.push_back({"flexible_moo_paper", "flexible + MOO (5-epoch warm-up, the paper's)", m, true, adapt});
  }
  return v;
}

// The quantizer comparison: does the compressed allreduce's second quantization (of each
// shard's average, with the server residual) cost accuracy against an Allgather of whole
// packets, which decodes every rank's packet once? QSGD 8-bit (the library's defaults:
// 127 levels, buckets of 512) and EF-sign, each through both collectives with the fixed
// policy, on the MLP pass's setting and seeds. Their decisions do not depend on the
// network, so each trains once per seed.
constexpr const char* quantizer_pass = "mlp_quantizers";
std::vector<method_spec> quantizer_methods() {
  using namespace fmnist;
  std::vector<method_spec> v;
  const auto make = [](compressor_id c, collective_id k) {
    method_config m;
    m.compressor = c;
    m.collective = k;
    m.policy = policy_id::fixed;
    // A quantizer ignores the fraction, but 1 would send every layer raw (the dense path).
    m.fixed.kept_fraction = 0.01;
    return m;
  };
  for (const auto& [c, key, name] :
       {std::tuple{compressor_id::qsgd, "qsgd", "QSGD 8-bit"}, std::tuple{compressor_id::sign, "sign", "EF-sign"}}) {
    v.push_back({std::string(key) + "_allgather", std::string(name) + ", Allgather", make(c, collective_id::allgather),
                 false, kind::fixed_choice});
    v.push_back({std::string(key) + "_compressed_allreduce", std::string(name) + ", compressed allreduce",
                 make(c, collective_id::compressed_allreduce), false, kind::fixed_choice});
  }
  return v;
}

struct run_entry {
  const method_spec* spec;
  int network;  // index into network_specs of the primary network
  int seed;
  run_outcome o;  // the run, or where it diverged (train_run.hpp)
  std::string dir;
  [[nodiscard]] const fmnist::run_result& r() const { return o.r; }
  [[nodiscard]] bool diverged() const { return o.diverged; }
};

// The first run of pass p with an evaluated epoch (a diverged one may have none): what the
// setting paragraph and the plots' title read.
const fmnist::run_result& first_with_epochs(const std::vector<run_entry>& runs) {
  for (const auto& e : runs)
    if (!e.r().epochs.empty()) return e.r();
  return runs.front().r();
}

// One model's runs: every chosen method, once per seed (and per network where it matters).
struct pass {
  std::string name;  // "mlp" or "cnn": directory and CSV column
  fmnist::run_config base;
  int seeds = 1;
  std::vector<const method_spec*> chosen;
  std::string note;  // what this pass reduced, and why
  std::vector<run_entry> runs;
  double wall_s = 0;
};

// What the tables read from a pass's runs.
class view {
 public:
  view(const pass& p, double target_below_dense) : p_(p) {
    dense_ = find("dense");
    if (dense_) {
      dense_acc_ = summarize(per_seed(dense_, 0, [](const fmnist::run_result& r) { return r.epochs.back().test_acc; }));
      dense_wire_ = summarize(per_seed(dense_, 0, wire_received));
      target_ = dense_acc_.mean - target_below_dense / 100.0;
    }
  }

  static double wire_received(const fmnist::run_result& r) { return r.total_wire_bytes_received_per_rank(); }
  static double wire_sent(const fmnist::run_result& r) { return r.total_wire_bytes_sent_per_rank(); }
  static double packet(const fmnist::run_result& r) { return r.total_bytes_per_rank(); }
  static double final_acc(const fmnist::run_result& r) { return r.epochs.back().test_acc; }

  [[nodiscard]] const method_spec* find(const std::string& key) const {
    for (const auto* s : p_.chosen)
      if (s->key == key) return s;
    return nullptr;
  }
  [[nodiscard]] const run_entry* run(const method_spec* s, int n, int seed) const {
    for (const auto& e : p_.runs)
      if (e.spec == s && e.seed == seed && (!s->network_dependent || e.network == n)) return &e;
    return nullptr;
  }
  // f(run) for each seed of method s's run charged on network n (NaN where it is missing
  // or diverged: a diverged run has no final figures, and summarize leaves NaN out; the
  // cells say how many seeds diverged, diverged()).
  template <class F>
  [[nodiscard]] std::vector<double> per_seed(const method_spec* s, int n, F&& f) const {
    std::vector<double> v;
    for (int seed = 1; seed <= p_.seeds; ++seed) {
      const run_entry* e = run(s, n, seed);
      v.push_back(e && !e->diverged() ? f(e->r()) : std::nan(""));
    }
    return v;
  }
  // The seeds in which method s's run charged on network n diverged.
  [[nodiscard]] int diverged(const method_spec* s, int n) const {
    int k = 0;
    for (int seed = 1; seed <= p_.seeds; ++seed)
      if (const run_entry* e = run(s, n, seed); e && e->diverged()) ++k;
    return k;
  }
  // The seeds in which method a's run or method b's run (on network n) diverged: a paired
  // difference is missing there.
  [[nodiscard]] int diverged_pairs(const method_spec* a, const method_spec* b, int n) const {
    int k = 0;
    for (int seed = 1; seed <= p_.seeds; ++seed) {
      const run_entry* x = run(a, n, seed);
      const run_entry* y = run(b, n, seed);
      if ((x && x->diverged()) || (y && y->diverged())) ++k;
    }
    return k;
  }
  // The time to target of run e on network n (its own clock or a shadow clock). A diverged
  // run did not reach it (-1), whatever it reached before it failed.
  [[nodiscard]] double time_to(const run_entry& e, int n) const {
    if (!std::isfinite(target_)) return -1;
    if (e.spec->network_dependent && e.network != n) return std::nan("");
    if (e.diverged()) return -1;
    if (e.spec->network_dependent) return e.r().modeled_time_to(target_);
    return n == 0 ? e.r().modeled_time_to(target_) : e.r().modeled_time_to(target_, n - 1);
  }
  [[nodiscard]] std::vector<double> times(const method_spec* s, int n) const {
    std::vector<double> v;
    for (int seed = 1; seed <= p_.seeds; ++seed)
      if (const run_entry* e = run(s, n, seed)) v.push_back(time_to(*e, n));
    return v;
  }
  // The static choice (dense or top-k at a fixed CF) that reaches the target on network n
  // in the most seeds, and among those in the least mean modeled time; null if none does.
  [[nodiscard]] const method_spec* best_static(int n) const {
    const method_spec* best = nullptr;
    summary bs;
    for (const auto* s : p_.chosen) {
      if (s->k != kind::fixed_choice) continue;
      const summary t = reached(times(s, n));
      if (t.n == 0) continue;
      if (!best || t.n > bs.n || (t.n == bs.n && t.mean < bs.mean)) {
        best = s;
        bs = t;
      }
    }
    return best;
  }

  [[nodiscard]] const pass& p() const { return p_; }
  [[nodiscard]] const method_spec* dense() const { return dense_; }
  [[nodiscard]] const summary& dense_acc() const { return dense_acc_; }
  [[nodiscard]] const summary& dense_wire() const { return dense_wire_; }
  [[nodiscard]] double target() const { return target_; }

 private:
  const pass& p_;
  const method_spec* dense_ = nullptr;
  summary dense_acc_, dense_wire_;
  double target_ = std::nan("");
};

// The paragraph that describes pass p's setting (model, data, schedule, seeds, compute).
std::string setting(const pass& p, int ranks) {
  const auto& b = p.base;
  const auto& first = first_with_epochs(p.runs);
  std::ostringstream md;
  md << "Fashion-MNIST, " << first.model << " (" << first.params << " parameters), " << ranks
     << " thread ranks, global batch " << b.batch << ", " << b.epochs << " epochs of "
     << (b.train_subset ? std::to_string(b.train_subset) : std::string("60000")) << " samples ("
     << first.steps_per_epoch << " steps each), learning rate " << b.lr.base << " (x" << b.lr.gamma << " at epochs";
  for (auto ms : b.lr.milestones) md << " " << ms + 1;
  md << "), momentum " << b.momentum
     << (p.seeds > 1 ? ", seeds 1.." + std::to_string(p.seeds) +
                           " (every method once per seed; each cell is the mean ± sample standard deviation over the "
                           "seeds)"
                     : std::string(", seed 1 (one run per method, so no deviations)"))
     << "; test accuracy on " << (b.test_subset ? b.test_subset : 10000) << " test images. Modeled compute ";
  const double compute = first.compute_per_step_s > 0 ? first.compute_per_step_s : b.compute_s;
  if (compute > 0)
    md << fmt("%.2f", 1e3 * compute) << " ms per step (calibrated once, the same for every run of this model).";
  else
    md << "not calibrated (every run diverged before its first epoch ended).";
  md << " Wall time of this pass: " << fmt("%.0f", p.wall_s) << " s.";
  if (!p.note.empty()) md << " " << p.note;
  return md.str();
}

// Pass p's rows of results.csv (one per run). A diverged run's final figures are nan, its
// times to target -1 (not reached), and its status columns say where it failed and why.
void csv_rows(const pass& p, const view& v, std::ostream& csv) {
  for (const auto& e : p.runs) {
    const auto& r = e.r();
    double compute = 0, codec = 0;
    for (const auto& ep : r.epochs) {
      compute += ep.compute_s;
      codec += ep.codec_s;
    }
    const double nan = std::nan("");
    const bool d = e.diverged();
    csv << p.name << ',' << e.seed << ',' << e.spec->key << ',' << network_specs[static_cast<std::size_t>(e.network)]
        << ',' << (d ? nan : r.epochs.back().test_acc) << ',' << (d ? nan : r.total_bytes_per_rank()) << ','
        << (d ? nan : r.total_wire_bytes_sent_per_rank()) << ',' << (d ? nan : r.total_wire_bytes_received_per_rank())
        << ',' << v.target() << ',' << v.time_to(e, 0) << ',' << v.time_to(e, 1) << ',' << v.time_to(e, 2) << ','
        << (d ? nan : compute) << ',' << (d ? nan : codec) << ',' << (d ? nan : r.epochs.back().modeled_time_s) << ','
        << (d ? nan : fmnist::exposure_of(r).total_s) << ',' << (d ? nan : fmnist::exposure_of(r).exposed_s) << ",off,"
        << status_columns(e.o) << "\n";
  }
}

// The runs of pass p that diverged, one line each (where, and the message), or nothing.
std::string diverged_runs(const pass& p) {
  std::string list;
  for (const auto& e : p.runs)
    if (e.diverged())
      list += "- " + e.spec->label +
              (e.spec->network_dependent ? ", " + network_labels[static_cast<std::size_t>(e.network)] + " run"
                                         : std::string()) +
              ", seed " + std::to_string(e.seed) + ": " + e.o.where() + "\n";
  if (list.empty()) return list;
  return "Runs that **diverged** (a non-finite gradient stopped them: they count as not reaching the target, their "
         "figures are left out of the means, the cells say \"k/N diverged\", and a target that needs them is "
         "missed):\n\n" +
         list + "\n";
}

// The tables and the targets of one pass, in Markdown; its rows of results.csv into csv.
std::string report(const pass& p, double target_below_dense, int ranks, std::ostream& csv) {
  const view v(p, target_below_dense);
  std::ostringstream md;
  md << "## " << (p.name == "cnn" ? "CNN" : "MLP") << "\n\n" << setting(p, ranks) << "\n\n";
  const int dense_diverged = v.dense() ? v.diverged(v.dense(), 0) : 0;
  if (!v.dense()) {
    md << "Dense SGD was not run, so there is no target accuracy and no comparison with dense.\n\n";
  } else if (v.dense_acc().n == 0) {
    md << "Dense SGD diverged in every seed, so there is no target accuracy: no method reaches it, and every "
          "target below is missed.\n\n";
  } else {
    md << "Target accuracy: dense's final test accuracy (mean over the seeds, " << pm(v.dense_acc(), "%.2f", 100)
       << "%";
    if (dense_diverged > 0)
      md << "; dense diverged in " << dense_diverged << " of " << p.seeds << " seeds, whose runs are left out";
    md << ") minus " << target_below_dense << " point = " << fmt("%.2f", 100 * v.target()) << "%.\n\n";
  }
  md << diverged_runs(p);

  // --- the main table: network-dependent methods by their 1 Gbit/s run ---------------------
  md << "Bytes per rank over the whole run: **packet** = what a rank's collective hands over; **wire** = what "
        "the simulated network counts for the algorithm it charges (ring Allreduce: 2(N-1)/N of the buffer each way; "
        "Allgather: the N-1 other packets received, as many forwarded by a ring; broadcast: the payload received "
        "off the root, the tree's per-rank average sent). Averaged over the ranks, sent and received are equal (every "
        "byte one rank sends another receives); they differ rank by rank. \"Less than dense\": dense's mean wire bytes "
        "received over the method's.\n\n";
  md << "| method | final test acc. (%) | vs dense (points) | packet MB | wire MB received | wire MB sent | "
        "less than dense | time to target, 1 Gbit/s (s) | modeled comm. / exposed, 1 Gbit/s (s) | measured compute (s) "
        "| measured compression (s) |\n"
     << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  const auto sum_epochs = [](double fmnist::epoch_record::*field) {
    return [field](const fmnist::run_result& r) {
      double s = 0;
      for (const auto& e : r.epochs) s += e.*field;
      return s;
    };
  };
  for (const auto* s : p.chosen) {
    const auto acc = v.per_seed(s, 0, view::final_acc);
    std::vector<double> diff;  // paired by seed: the same data order and initialisation
    if (v.dense()) {
      const auto d = v.per_seed(v.dense(), 0, view::final_acc);
      for (std::size_t i = 0; i < acc.size(); ++i) diff.push_back(acc[i] - d[i]);
    }
    const summary rx = summarize(v.per_seed(s, 0, view::wire_received));
    const auto seeds = static_cast<std::size_t>(p.seeds);
    md << "| " << s->label << (s->network_dependent ? " (1 Gbit/s run)" : "") << " | "
       << pm_finished(summarize(acc), v.diverged(s, 0), seeds, "%.2f", 100) << " | "
       << (v.dense() ? pm_finished(summarize(diff), v.diverged_pairs(s, v.dense(), 0), seeds, "%+.2f", 100) : "-")
       << " | " << pm(summarize(v.per_seed(s, 0, view::packet)), "%.2f", 1e-6) << " | " << pm(rx, "%.2f", 1e-6) << " | "
       << pm(summarize(v.per_seed(s, 0, view::wire_sent)), "%.2f", 1e-6) << " | "
       << (v.dense() && rx.mean > 0 ? fmt("%.1fx", v.dense_wire().mean / rx.mean) : std::string("-")) << " | "
       << time_cell(v.times(s, 0), v.diverged(s, 0)) << " | "
       << pm(summarize(v.per_seed(s, 0, sum_epochs(&fmnist::epoch_record::modeled_comm_s))), "%.2f") << " / "
       << pm(summarize(v.per_seed(s, 0, sum_epochs(&fmnist::epoch_record::modeled_exposed_s))), "%.2f") << " | "
       << pm(summarize(v.per_seed(s, 0, sum_epochs(&fmnist::epoch_record::compute_s))), "%.2f") << " | "
       << pm(summarize(v.per_seed(s, 0, sum_epochs(&fmnist::epoch_record::codec_s))), "%.2f") << " |\n";
  }

  // --- time to target on every network, against the best static choice ---------------------
  std::vector<const method_spec*> best(n_networks);
  std::vector<summary> best_t(n_networks);
  for (int n = 0; n < n_networks; ++n) {
    const auto i = static_cast<std::size_t>(n);
    best[i] = v.best_static(n);
    if (best[i]) best_t[i] = reached(v.times(best[i], n));
  }
  md << "\nModeled time to the target accuracy on each network (s; network-dependent methods by their own run on "
        "that network). **Bold**: the best static choice on that network (dense or top-k at a fixed CF: reached in "
        "the most seeds, then least mean time). \"vs best static\": an adaptive method's mean time over the "
        "best static choice's.\n\n"
     << "| method | 1 Gbit/s | vs best static | 10 Gbit/s | vs best static | schedule | vs best static |\n"
     << "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const auto* s : p.chosen) {
    md << "| " << s->label;
    for (int n = 0; n < n_networks; ++n) {
      const auto t = v.times(s, n);
      const bool is_best = best[static_cast<std::size_t>(n)] == s;
      const std::string cell = time_cell(t, v.diverged(s, n));
      md << " | " << (is_best ? "**" + cell + "**" : cell) << " | ";
      const summary st = reached(t), bt = best_t[static_cast<std::size_t>(n)];
      if (s->k == kind::adaptive && st.n > 0 && bt.n > 0)
        md << fmt("%.2fx", st.mean / bt.mean);
      else
        md << "-";
    }
    md << " |\n";
  }
  bool any_dependent = false;
  for (const auto* s : p.chosen) any_dependent = any_dependent || s->network_dependent;
  if (any_dependent) {
    md << "\nNetwork-dependent methods, per network: final test accuracy (%) and wire MB received per rank.\n\n"
       << "| method | acc. 1 Gbit/s | acc. 10 Gbit/s | acc. schedule | wire MB 1 Gbit/s | wire MB 10 Gbit/s | "
          "wire MB schedule |\n|---|---:|---:|---:|---:|---:|---:|\n";
    for (const auto* s : p.chosen) {
      if (!s->network_dependent) continue;
      md << "| " << s->label;
      for (int n = 0; n < n_networks; ++n)
        md << " | "
           << pm_finished(summarize(v.per_seed(s, n, view::final_acc)), v.diverged(s, n),
                          static_cast<std::size_t>(p.seeds), "%.2f", 100);
      for (int n = 0; n < n_networks; ++n)
        md << " | " << pm(summarize(v.per_seed(s, n, view::wire_received)), "%.2f", 1e-6);
      md << " |\n";
    }
  }

  csv_rows(p, v, csv);

  // --- the targets, checked on the means over the seeds ------------------------------------
  md << "\n### Targets (" << (p.name == "cnn" ? "CNN" : "MLP") << ", means over the seeds)\n\n";
  const auto secs = [](const summary& s) { return s.n > 0 ? fmt("%.2f s", s.mean) : std::string("not reached"); };
  const auto seeds_of = [&](const summary& s) {
    return s.n > 0 && s.n < p.seeds ? " (" + std::to_string(s.n) + "/" + std::to_string(p.seeds) + " seeds reached it)"
                                    : std::string();
  };
  // ", k/N seeds diverged" for method s's runs on network n (none: empty). A diverged seed
  // counts as not reaching the target, so a target that needs every seed is missed.
  const auto diverged_note = [&](const method_spec* s, int n) {
    const int k = v.diverged(s, n);
    return k > 0 ? ", " + std::to_string(k) + "/" + std::to_string(p.seeds) + " seeds diverged" : std::string();
  };
  const method_spec* rec = v.find(recommended_key);
  if (rec && v.dense()) {
    for (int n = 0; n < n_networks; ++n) {
      const summary tr = reached(v.times(rec, n));
      const method_spec* bs = best[static_cast<std::size_t>(n)];
      const summary& bt = best_t[static_cast<std::size_t>(n)];
      const bool all = tr.n == p.seeds;
      const bool ok = all && (!bs || tr.mean <= 1.1 * bt.mean);
      md << "- (a) " << rec->label << " reaches the target in every seed, in at most 1.1x the modeled time of "
         << "the best static choice, " << network_labels[static_cast<std::size_t>(n)] << ": " << met(ok) << " ("
         << secs(tr) << seeds_of(tr) << diverged_note(rec, n) << "; best static "
         << (bs ? bs->label + " " + secs(bt) + seeds_of(bt) : std::string("none reaches it"));
      if (bs && tr.n > 0) md << "; ratio " << fmt("%.2fx", tr.mean / bt.mean);
      md << ")";
      if (n == 0) {
        const summary td = reached(v.times(v.dense(), 0));
        const bool before = all && (td.n == 0 || tr.mean < td.mean);
        md << "; and strictly before dense: " << met(before) << " (dense " << secs(td) << seeds_of(td)
           << diverged_note(v.dense(), 0) << ")";
      }
      md << ".\n";
    }
  } else {
    md << "- (a) not checked: needs dense and the recommended configuration (" << recommended_key
       << ") in this pass.\n";
  }
  if (v.dense()) {
    const summary td = reached(v.times(v.dense(), 2));
    std::string slower, fine;
    for (const auto* s : p.chosen) {
      if (s->k != kind::adaptive || s->first_network_only) continue;  // the eps sweep ran at 1 Gbit/s only
      const summary t = reached(v.times(s, 2));
      // Not reaching the target in a seed where dense did counts as slower.
      const bool ok = td.n == 0 || (t.n >= td.n && t.mean <= td.mean);
      std::string& list = ok ? fine : slower;
      list += (list.empty() ? "" : ", ") + s->label + " " + secs(t) + seeds_of(t) + diverged_note(s, 2);
    }
    // Without a target (dense diverged in every seed) nothing can be checked: missed.
    const bool no_target = !std::isfinite(v.target());
    md << "- (b) on the schedule network no adaptive method reaches the target later than dense (" << secs(td)
       << seeds_of(td) << diverged_note(v.dense(), 2)
       << "; missing the target in a seed where dense reaches it counts as later): "
       << met(slower.empty() && !no_target) << (no_target ? " (no target: dense diverged in every seed)" : "")
       << " (slower: " << (slower.empty() ? "-" : slower) << "; not slower: " << (fine.empty() ? "-" : fine) << ").\n";
  }
  if (const auto* g = v.find("gravac_paper"); g && v.dense()) {
    bool all_ok = true;
    std::string per;
    for (int n = 0; n < n_networks; ++n) {
      const summary acc = summarize(v.per_seed(g, n, view::final_acc));
      const summary rx = summarize(v.per_seed(g, n, view::wire_received));
      const double d = acc.mean - v.dense_acc().mean, less = v.dense_wire().mean / rx.mean;
      // A diverged seed (of GraVAC's run or of dense's) leaves no figure to compare: missed.
      const int k = v.diverged(g, n), kd = dense_diverged;
      const bool ok = k == 0 && kd == 0 && d >= -0.005 && less >= 5;
      all_ok = all_ok && ok;
      per += std::string(n ? "; " : "") + network_labels[static_cast<std::size_t>(n)] + " run ";
      if (k > 0 || kd > 0)  // the means would be over different seeds
        per += "no figure over every seed";
      else
        per += fmt("%+.2f", 100 * d) + " points, " + fmt("%.1fx", less) + " fewer";
      if (k > 0) per += ", " + std::to_string(k) + "/" + std::to_string(p.seeds) + " seeds diverged";
      if (kd > 0) per += ", dense diverged in " + std::to_string(kd) + "/" + std::to_string(p.seeds) + " seeds";
      per += std::string(" (") + (ok ? "met" : "missed") + ")";
    }
    md << "- (c) GraVAC as the paper ends within 0.5 points of dense with at least 5x fewer wire bytes received, on "
          "every "
          "network's run: "
       << met(all_ok) << " (" << per << ").\n";
  }
  if (const auto* a = v.find("accordion"), *low = v.find("topk_cf10"); a && low) {
    const auto mean = [&](const method_spec* s, double (*f)(const fmnist::run_result&)) {
      return summarize(v.per_seed(s, 0, f)).mean;
    };
    const double d = mean(a, view::final_acc) - mean(low, view::final_acc);
    const double less = mean(low, view::wire_received) / mean(a, view::wire_received);
    // A diverged seed of either run leaves no figure to compare: missed.
    const int ka = v.diverged(a, 0), kl = v.diverged(low, 0);
    md << "- (d) Accordion ends within 0.5 points of its low-compression run (top-k CF 10) with at least 2x fewer "
          "wire bytes received: "
       << met(ka == 0 && kl == 0 && d >= -0.005 && less >= 2) << " (";
    if (ka == 0 && kl == 0)
      md << fmt("%+.2f", 100 * d) << " points, " << fmt("%.1fx", less) << " fewer";
    else  // the means would be over different seeds
      md << "no figure over every seed";
    if (ka > 0) md << "; Accordion diverged in " << ka << "/" << p.seeds << " seeds";
    if (kl > 0) md << "; top-k CF 10 diverged in " << kl << "/" << p.seeds << " seeds";
    md << ").\n";
  }
  return md.str();
}

// The quantizer comparison's section: for each compressor, its Allgather run and its
// compressed allreduce run side by side, and the target: the compressed allreduce ends no
// more than 0.5 points below the Allgather (means over the seeds). Its rows of results.csv
// into csv.
std::string quantizer_report(const pass& p, int ranks, std::ostream& csv) {
  const view v(p, 0);
  csv_rows(p, v, csv);
  std::ostringstream md;
  md << "## Quantizers: compressed allreduce against Allgather (MLP)\n\n"
     << setting(p, ranks)
     << " Fixed policy. The Allgather decodes every rank's packet once; the compressed allreduce sums each shard's "
        "N decoded packets in fp32 and quantizes that average a second time (with the shard's server residual) "
        "before its Allgather. Wire bytes received per rank as the simulated network counts them (alltoallv: the "
        "blocks from the other ranks; Allgather: the N-1 other packets). Differences are paired by seed (the same "
        "data order and initialisation).\n\n"
     << diverged_runs(p)
     << "| method | final test acc. (%) | compressed − Allgather (points) | packet MB | wire MB received | "
        "Allgather / compressed wire bytes | modeled comm., 1 Gbit/s (s) |\n"
     << "|---|---:|---:|---:|---:|---:|---:|\n";
  const auto comm_s = [](const fmnist::run_result& r) {
    double t = 0;
    for (const auto& e : r.epochs) t += e.modeled_comm_s;
    return t;
  };
  std::string targets;
  for (std::size_t i = 0; i + 1 < p.chosen.size(); i += 2) {
    const method_spec* ag = p.chosen[i];
    const method_spec* car = p.chosen[i + 1];
    const auto acc_ag = v.per_seed(ag, 0, view::final_acc), acc_car = v.per_seed(car, 0, view::final_acc);
    std::vector<double> diff;
    for (std::size_t k = 0; k < acc_ag.size(); ++k) diff.push_back(acc_car[k] - acc_ag[k]);
    const summary d = summarize(diff);
    const summary rx_ag = summarize(v.per_seed(ag, 0, view::wire_received));
    const summary rx_car = summarize(v.per_seed(car, 0, view::wire_received));
    const auto seeds = static_cast<std::size_t>(p.seeds);
    const int k_ag = v.diverged(ag, 0), k_car = v.diverged(car, 0), k_pair = v.diverged_pairs(ag, car, 0);
    for (const method_spec* s : {ag, car}) {
      const bool is_car = s == car;
      md << "| " << s->label << " | "
         << pm_finished(summarize(is_car ? acc_car : acc_ag), is_car ? k_car : k_ag, seeds, "%.2f", 100) << " | "
         << (is_car ? pm_finished(d, k_pair, seeds, "%+.2f", 100) : std::string("-")) << " | "
         << pm(summarize(v.per_seed(s, 0, view::packet)), "%.2f", 1e-6) << " | "
         << pm(is_car ? rx_car : rx_ag, "%.2f", 1e-6) << " | "
         << (is_car && rx_car.mean > 0 ? fmt("%.2fx", rx_ag.mean / rx_car.mean) : std::string("-")) << " | "
         << pm(summarize(v.per_seed(s, 0, comm_s)), "%.2f") << " |\n";
    }
    // On the means, as targets (c) and (d): the difference of the means is the mean of
    // the paired differences.
    // A seed where either run diverged leaves no difference to compare: missed.
    const bool ok = k_pair == 0 && d.n > 0 && d.mean >= -0.005;
    const std::string name = ag->label.substr(0, ag->label.find(','));
    targets += "- (" + std::string(1, static_cast<char>('f' + i / 2)) + ") " + name +
               " through the compressed allreduce ends within 0.5 points of the same compressor through the "
               "Allgather (no more than 0.5 points below): " +
               met(ok) + " (" +
               (d.n > 0 ? pm_finished(d, k_pair, seeds, "%+.2f", 100) + " points" : std::string("no difference")) +
               "; " +
               (rx_ag.n > 0 && rx_car.n > 0 ? fmt("%.2fx", rx_ag.mean / rx_car.mean) + " fewer wire bytes received"
                                            : std::string("no wire bytes to compare"));
    const auto of_seeds = [&](int k) { return std::to_string(k) + "/" + std::to_string(p.seeds) + " seeds"; };
    if (k_ag > 0) targets += "; through the Allgather it diverged in " + of_seeds(k_ag);
    if (k_car > 0) targets += "; through the compressed allreduce it diverged in " + of_seeds(k_car);
    targets += ")";
    // A baseline that never learned makes the difference meaningless: say so next to the
    // verdict rather than let a near-chance pair read as a cost (or a win) of the collective.
    const summary base = summarize(acc_ag);
    if (base.n > 0 && base.mean < 0.2)
      targets += "; but through the Allgather it ends at " + pm(base, "%.2f", 100) +
                 "% itself (chance is 10%): it does not train in this setting, so the difference does not measure "
                 "the second quantization";
    targets += ".\n";
  }
  md << "\n### Targets (quantizers, means over the seeds)\n\n" << targets;
  return md.str();
}

// Trains every chosen method of pass p once per seed (and per network where it matters).
void run_pass(pass& p, const fmnist::dataset& train, const fmnist::dataset& test, int ranks, const std::string& out,
              std::chrono::steady_clock::time_point t_start) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int seed = 1; seed <= p.seeds; ++seed) {
    for (const auto* spec : p.chosen) {
      for (int n = 0; n < n_networks; ++n) {
        if ((!spec->network_dependent || spec->first_network_only) && n > 0) break;
        const auto& net = network_specs[static_cast<std::size_t>(n)];
        fmnist::run_config cfg = p.base;
        cfg.seed = static_cast<std::uint64_t>(seed);
        cfg.method = spec->m;
        cfg.network = fmnist::network_config::parse(net);
        if (!spec->network_dependent)
          for (int k = 1; k < n_networks; ++k)
            cfg.shadow_networks.push_back(fmnist::network_config::parse(network_specs[static_cast<std::size_t>(k)]));
        run_entry e{spec,
                    n,
                    seed,
                    {},
                    out + "/" + p.name + "/seed" + std::to_string(seed) + "/" + spec->key +
                        (spec->network_dependent ? "-" + net : "")};
        std::printf("[%6.0f s] %s seed %d  %-28s network %-9s ...",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(), p.name.c_str(),
                    seed, spec->label.c_str(), net.c_str());
        std::fflush(stdout);
        // A non-finite gradient ends this run as diverged (every rank throws it); the pass
        // goes on with the next run. Any other failure ends the experiment.
        e.o = train_run(ranks, train, test, cfg);
        // Every later run of this model is charged the compute per step the first one
        // calibrated (a run that diverged before its first epoch ended has not said: the
        // next one calibrates).
        if (p.base.compute_s < 0 && e.r().compute_per_step_s > 0) p.base.compute_s = e.r().compute_per_step_s;
        write_run(e.o, e.dir);
        if (e.diverged())
          std::printf(" %s\n", e.o.where().c_str());
        else
          std::printf(" test acc %.2f%%, per rank: packet %.2f MB, wire %.2f MB received; modeled %.1f s\n",
                      100 * e.r().epochs.back().test_acc, e.r().total_bytes_per_rank() / 1e6,
                      e.r().total_wire_bytes_received_per_rank() / 1e6, e.r().epochs.back().modeled_time_s);
        std::fflush(stdout);
        p.runs.push_back(std::move(e));
      }
    }
  }
  p.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The overlap run: every method of `chosen` trains `base` (the CNN at 1 Gbit/s) with
// its buckets overlapped with backward, then after backward with the same buckets (the
// same bits: checked), then after backward in one bucket. The first run calibrates the
// modeled compute and the layers' ready shares (unless --compute-s is given); every other
// run is charged the same. Returns the Markdown section; rows of results.csv into csv.
std::string run_overlap(fmnist::run_config base, const std::vector<const method_spec*>& chosen,
                        const fmnist::dataset& train, const fmnist::dataset& test, int ranks, const std::string& out,
                        std::chrono::steady_clock::time_point t_start, std::ostream& csv) {
  struct row {
    const method_spec* spec;
    fmnist::run_result on, off, one;
    std::string diverged;  // "<tag> run diverged at ..." when one of the three did
  };
  std::vector<row> rows;
  const bool calibrated = base.compute_s < 0;
  const auto t0 = std::chrono::steady_clock::now();
  const auto train_one = [&](const method_spec* spec, bool overlap, bool one_bucket, const std::string& tag) {
    fmnist::run_config cfg = base;
    cfg.method = spec->m;
    cfg.overlap = overlap;
    if (one_bucket) cfg.method.bucket_bytes = gravac::one_bucket;
    std::printf("[%6.0f s] overlap  %-28s %-22s ...",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(), spec->label.c_str(),
                tag.c_str());
    std::fflush(stdout);
    run_outcome o = train_run(ranks, train, test, cfg);
    write_run(o, out + "/overlap/" + spec->key + "-" + tag);
    if (o.diverged) {
      std::printf(" %s\n", o.where().c_str());
      std::fflush(stdout);
      csv << "overlap," << base.seed << ',' << spec->key << ',' << base.network.describe() << ",nan,nan,nan,nan,,,,,"
          << 0 << ',' << 0 << ",nan,nan,nan," << tag << ',' << status_columns(o) << '\n';
      return o;
    }
    const fmnist::run_result& r = o.r;
    if (base.compute_s < 0) {
      base.compute_s = r.compute_per_step_s;
      base.ready_share = r.ready_share;
    }
    const auto x = fmnist::exposure_of(r);
    std::printf(" %zu buckets, modeled comm. %.3f s, exposed %.3f s (%.1f%%), modeled %.2f s, test acc %.2f%%\n",
                r.buckets, x.total_s, x.exposed_s, 100 * x.ratio(), r.epochs.back().modeled_time_s,
                100 * r.epochs.back().test_acc);
    std::fflush(stdout);
    csv << "overlap," << base.seed << ',' << spec->key << ',' << base.network.describe() << ','
        << r.epochs.back().test_acc << ',' << r.total_bytes_per_rank() << ',' << r.total_wire_bytes_sent_per_rank()
        << ',' << r.total_wire_bytes_received_per_rank() << ",,,,," << 0 << ',' << 0 << ','
        << r.epochs.back().modeled_time_s << ',' << x.total_s << ',' << x.exposed_s << ',' << tag << ','
        << status_columns(o) << '\n';
    return o;
  };
  for (const auto* spec : chosen) {
    row w{spec, {}, {}, {}, {}};
    // A diverged run ends the method's row: its three runs compare the same training.
    for (const auto& [slot, overlap, one_bucket, tag] :
         {std::tuple{&row::on, true, false, "on"}, std::tuple{&row::off, false, false, "off"},
          std::tuple{&row::one, false, true, "off-one-bucket"}}) {
      run_outcome o = train_one(spec, overlap, one_bucket, tag);
      if (o.diverged) {
        w.diverged = std::string(tag) + " run " + o.where();
        break;
      }
      w.*slot = std::move(o.r);
    }
    rows.push_back(std::move(w));
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const row* finished = nullptr;  // the first method whose three runs finished
  for (const auto& w : rows)
    if (w.diverged.empty()) {
      finished = &w;
      break;
    }
  std::ostringstream md;
  if (!finished) {
    md << "## Overlap with backward\n\nEvery method diverged (a non-finite gradient stopped it):\n\n";
    for (const auto& w : rows) md << "- " << w.spec->label << ": " << w.diverged << "\n";
    md << "\n- (e) exposed communication with overlap at most 30% of the synchronous step's communication: "
       << met(false) << " (no run finished).\n";
    return md.str();
  }
  const auto& first = finished->on;
  md << "## Overlap with backward\n\n"
     << "Fashion-MNIST, " << first.model << " (" << first.params << " parameters), " << ranks
     << " thread ranks, network " << first.network << ", global batch " << base.batch << ", " << base.epochs
     << " epochs of " << (base.train_subset ? std::to_string(base.train_subset) : std::string("60000"))
     << " samples, seed " << base.seed << ". Modeled compute " << fmt("%.2f", 1e3 * first.compute_per_step_s)
     << " ms per step; each layer's gradient is final at that times its share of the step (";
  {
    const auto net = fmnist::make_model(base.model, base.mlp_hidden);
    const gravac::layout& lay = net->get_layout();
    for (std::size_t i = first.ready_share.size(); i-- > 0;)
      md << lay[i].name << " " << fmt("%.3f", first.ready_share[i]) << (i ? ", " : "");
  }
  md << (calibrated ? "), measured with the compute by the first run (median of 7 backward passes, the slowest rank) "
                      "and charged to every run. "
                    : "; --compute-s was given: the deterministic model, forward a third, backward by parameters). ")
     << "\"Synchronous\": gravac's step after backward (--overlap off), with the same buckets (" << first.buckets
     << ", from the last layer to the first) and with one bucket; \"overlap\": the buckets aggregated on the "
        "trainer's communication thread as backward announces their layers (--overlap on), each charged on the "
        "simulated network from its modeled ready time. Exposed: the communication not hidden behind backward. Wall "
        "time of these runs: "
     << fmt("%.0f", wall) << " s.\n\n"
     << "| method | modeled comm., synchronous (s) | exposed with overlap (s) | exposed / total, same run | one "
        "bucket, "
        "synchronous comm. (s) | exposed / one-bucket comm. | modeled time, sync. / overlap (s) | final acc. (%) | "
        "parameters equal |\n"
     << "|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
  bool all_met = true;
  std::string ratios;
  for (const auto& w : rows) {
    if (!w.diverged.empty()) {  // no figure, and the target is missed
      all_met = false;
      ratios += (ratios.empty() ? "" : "; ") + w.spec->label + " diverged";
      md << "| " << w.spec->label << " | " << w.diverged << " | | | | | | | |\n";
      continue;
    }
    const auto xon = fmnist::exposure_of(w.on), xoff = fmnist::exposure_of(w.off), xone = fmnist::exposure_of(w.one);
    const bool same = w.on.final_params == w.off.final_params;
    all_met = all_met && xon.ratio() <= 0.30;
    ratios += (ratios.empty() ? "" : "; ") + w.spec->label + " " + fmt("%.1f%%", 100 * xon.ratio());
    md << "| " << w.spec->label << " | " << fmt("%.3f", xoff.total_s) << " | " << fmt("%.3f", xon.exposed_s) << " | "
       << fmt("%.1f%%", 100 * xon.ratio()) << " | " << fmt("%.3f", xone.total_s) << " | "
       << fmt("%.1f%%", xone.total_s > 0 ? 100 * xon.exposed_s / xone.total_s : 100.0) << " | "
       << fmt("%.2f", w.off.epochs.back().modeled_time_s) << " / " << fmt("%.2f", w.on.epochs.back().modeled_time_s)
       << " | " << fmt("%.2f", 100 * w.on.epochs.back().test_acc) << " | " << (same ? "yes, bit for bit" : "**no**")
       << " |\n";
  }
  md << "\n- (e) exposed communication with overlap at most 30% of the synchronous step's communication (the same "
        "run's total; threads): "
     << met(all_met) << " (" << ratios << ").\n";
  return md.str();
}

std::vector<const method_spec*> choose(const std::vector<method_spec>& all, const std::string& only) {
  std::vector<const method_spec*> chosen;
  for (const auto& s : all)
    if (only.empty() || ("," + only + ",").find("," + s.key + ",") != std::string::npos) chosen.push_back(&s);
  if (chosen.empty()) throw std::runtime_error("--only matched no method: " + only);
  return chosen;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Reproduce the papers' comparisons on Fashion-MNIST (see bench/reproduce/README.md)"};
  // The MLP pass. 12 epochs of 19200 samples: 150 steps per epoch, the learning rate
  // decayed for the last 3 epochs.
  fmnist::run_config mlp;
  mlp.model = fmnist::model_kind::mlp;
  mlp.epochs = 12;
  mlp.batch = 128;
  mlp.train_subset = 19200;
  mlp.test_subset = 0;
  mlp.lr = {0.05, 0.1, {9}};
  // The CNN pass: 8 epochs (decay for the last 2) so that both passes fit the time budget
  // the README gives.
  std::size_t cnn_epochs = 8, cnn_train_subset = 19200;
  std::vector<std::size_t> cnn_milestones{6};
  int seeds = 3, cnn_seeds = 3;
  std::string out = "out/reproduce", only, cnn_only, model = "both", data_dir = fmnist::default_data_dir;
  int ranks = 4;
  double target_below_dense = 1.0;
  std::uint64_t gravac_period = 0;
  std::vector<std::size_t> milestones{9};
  bool quick = false, mlp_only = false, overlap = false, overlap_only = false, quantizers_only = false,
       no_quantizers = false;
  std::size_t overlap_epochs = 2;
  // 0.1 MiB: the CNN's dense layers (fc1.weight alone is 0.2 MB) in one bucket, ready once
  // backward leaves them, its convolutions in another, ready at the end.
  double overlap_bucket_mb = 0.1;
  std::string overlap_methods = "dense,gravac";
  app.add_option("--out", out, "output directory")->capture_default_str();
  app.add_option("--only", only,
                 "run only these methods (comma-separated keys: dense, topk_cf10, topk_cf100, "
                 "topk_cf1000, gravac (the recommended configuration), gravac_paper, gravac_eps0.5, "
                 "gravac_eps0.6, gravac_eps0.8, accordion, accordion_paper, adacomp, artopk_moo, flexible_moo, "
                 "flexible_moo_paper)");
  app.add_option("--model", model, "mlp, cnn or both (the MLP pass, then the CNN pass)")
      ->check(CLI::IsMember({"mlp", "cnn", "both"}))
      ->capture_default_str();
  app.add_flag("--mlp-only", mlp_only, "the MLP pass only (= --model mlp)");
  app.add_flag("--quick", quick, "for development: --seeds 1 --model mlp");
  app.add_option("--seeds", seeds, "seeds of the MLP pass (1..N; every method runs once per seed)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--epochs", mlp.epochs, "epochs of the MLP pass")->capture_default_str();
  app.add_option("--train-subset", mlp.train_subset, "training samples per epoch of the MLP pass (0: all)")
      ->capture_default_str();
  app.add_option("--lr-milestones", milestones, "MLP pass: epochs (0-based) at which the rate is multiplied by 0.1")
      ->delimiter(',');
  app.add_option("--cnn-seeds", cnn_seeds, "seeds of the CNN pass")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--cnn-epochs", cnn_epochs, "epochs of the CNN pass")->capture_default_str();
  app.add_option("--cnn-train-subset", cnn_train_subset, "training samples per epoch of the CNN pass (0: all)")
      ->capture_default_str();
  app.add_option("--cnn-lr-milestones", cnn_milestones, "CNN pass: epochs (0-based) of the 0.1 decay")->delimiter(',');
  app.add_option("--cnn-only", cnn_only,
                 "methods of the CNN pass (default: those of --only; without --only, all but the eps sweep)");
  app.add_option("--test-subset", mlp.test_subset, "test samples evaluated, both passes (0: all 10000)")
      ->capture_default_str();
  app.add_option("--batch", mlp.batch, "global batch, both passes")->capture_default_str();
  app.add_option("--lr", mlp.lr.base, "learning rate, both passes")->capture_default_str();
  app.add_option("--ranks", ranks, "thread ranks")->capture_default_str();
  app.add_option("--gravac-period", gravac_period, "GraVAC evaluation period in steps (0: one epoch)")
      ->capture_default_str();
  app.add_option("--target-below-dense", target_below_dense,
                 "target accuracy = dense's final test accuracy (mean over the seeds) minus this many points")
      ->capture_default_str();
  app.add_option("--compute-s", mlp.compute_s,
                 "modeled compute per step, both passes (negative: calibrate once per model, shared by its runs)")
      ->capture_default_str();
  app.add_option("--data-dir", data_dir, "Fashion-MNIST directory")->capture_default_str();
  app.add_flag("--overlap", overlap,
               "after the passes, the overlap run: the CNN at 1 Gbit/s, each of --overlap-methods with "
               "its buckets aggregated after backward and overlapped with it");
  app.add_flag("--overlap-only", overlap_only, "the overlap run alone (no MLP or CNN pass)");
  app.add_flag("--quantizers", quantizers_only,
               "the quantizer comparison alone (no MLP or CNN pass): QSGD 8-bit and EF-sign, each through the "
               "Allgather and the compressed allreduce, on the MLP pass's setting and --seeds");
  app.add_flag("--no-quantizers", no_quantizers,
               "leave out the quantizer comparison, which otherwise follows the MLP pass (unless --only is given)");
  app.add_option("--overlap-epochs", overlap_epochs, "epochs of each overlap run (of --cnn-train-subset samples)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--overlap-bucket-mb", overlap_bucket_mb, "bucket size of the overlap run in MiB (0: one per layer)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--overlap-methods", overlap_methods, "methods of the overlap run (keys as for --only)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    seeds = 1;
    model = "mlp";
  }
  if (mlp_only) model = "mlp";
  mlp.lr.milestones = milestones;

  try {
    const auto train = fmnist::load_fashion_mnist(data_dir, fmnist::split::train);
    const auto test = fmnist::load_fashion_mnist(data_dir, fmnist::split::test);
    const auto all = methods(gravac_period);
    const auto quantizers = quantizer_methods();
    std::filesystem::create_directories(out);

    std::vector<pass> passes;
    if (overlap_only || quantizers_only) model = "none";
    // The comparison belongs to the MLP pass's setting; --only names methods of the passes,
    // so it asks for those alone.
    const bool with_quantizers =
        quantizers_only || (!no_quantizers && only.empty() && (model == "mlp" || model == "both"));
    if (model != "cnn" && model != "none") {
      pass p;
      p.name = "mlp";
      p.base = mlp;
      p.seeds = seeds;
      p.chosen = choose(all, only);
      passes.push_back(std::move(p));
    }
    if (with_quantizers) {
      pass p;
      p.name = quantizer_pass;
      p.base = mlp;
      p.seeds = seeds;
      for (const auto& q : quantizers) p.chosen.push_back(&q);
      passes.push_back(std::move(p));
    }
    if (model != "mlp" && model != "none") {
      pass p;
      p.name = "cnn";
      p.base = mlp;
      p.base.model = fmnist::model_kind::cnn;
      p.base.epochs = cnn_epochs;
      p.base.train_subset = cnn_train_subset;
      p.base.lr.milestones = cnn_milestones;
      p.seeds = cnn_seeds;
      p.chosen = choose(all, cnn_only.empty() ? only : cnn_only);
      // The eps sweep and the papers' settings of Accordion and MOO are the MLP pass's (they
      // justify a default and check a shortfall); the CNN pass leaves them out unless asked
      // for by name.
      if (cnn_only.empty() && only.empty())
        std::erase_if(p.chosen, [](const method_spec* s) {
          return s->key.rfind("gravac_eps", 0) == 0 || (s->key.ends_with("_paper") && s->key != "gravac_paper");
        });
      if (model == "both" && (cnn_epochs < mlp.epochs || cnn_seeds < seeds))
        p.note = "The CNN pass runs " + std::to_string(cnn_epochs) + " epochs and " + std::to_string(cnn_seeds) +
                 " seeds (the MLP pass " + std::to_string(mlp.epochs) + " and " + std::to_string(seeds) +
                 ") so that both passes fit the time budget in README.md.";
      passes.push_back(std::move(p));
    }

    const auto t_start = std::chrono::steady_clock::now();
    for (auto& p : passes) {
      // The comparison is charged the compute per step the MLP pass calibrated, when it ran.
      if (p.name == quantizer_pass && p.base.compute_s < 0 && passes.front().name == "mlp")
        p.base.compute_s = passes.front().base.compute_s;
      run_pass(p, train, test, ranks, out, t_start);
    }
    std::string overlap_md;
    std::ostringstream overlap_csv;
    overlap_csv.precision(9);
    if (overlap || overlap_only) {
      fmnist::run_config b = mlp;
      b.model = fmnist::model_kind::cnn;
      b.epochs = overlap_epochs;
      b.train_subset = cnn_train_subset;
      b.lr.milestones.clear();
      b.seed = 1;
      b.network = fmnist::network_config::parse("1gbps");
      const double bytes = overlap_bucket_mb * 1048576.0;
      auto chosen = choose(all, overlap_methods);
      std::vector<method_spec> specs;
      for (const auto* c : chosen) {
        specs.push_back(*c);
        specs.back().m.bucket_bytes = bytes < 1 ? gravac::bucket_per_layer : static_cast<std::size_t>(bytes);
      }
      std::vector<const method_spec*> ptrs;
      for (const auto& x : specs) ptrs.push_back(&x);
      overlap_md = run_overlap(b, ptrs, train, test, ranks, out, t_start, overlap_csv);
    }
    const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

    std::ostringstream md;
    md << "# Fashion-MNIST reproduction\n\nMachine: " << machine_line()
       << ". Wall time of the whole experiment: " << fmt("%.0f", total_s) << " s. Command:";
    // The arguments that shape the result; where the output went (--out) is left out.
    md << " reproduce";
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--out" && i + 1 < argc) {
        ++i;
        continue;
      }
      if (a.rfind("--out=", 0) == 0) continue;
      md << ' ' << a;
    }
    md << "\n\nEvery step's modeled time = the modeled compute per step + the measured compression time (thread CPU "
          "time) + the communication the simulated network charged. Methods whose decisions do not depend on the "
          "network train once per seed and are charged on the three networks at once; the others train once per "
          "network and seed.\n\n";
    std::ofstream csv(out + "/results.csv");
    csv.precision(9);
    csv << "model,seed,method,network,final_test_acc,bytes_per_rank,wire_bytes_sent_per_rank,"
           "wire_bytes_received_per_rank,target_acc,time_to_target_1gbps,time_to_target_10gbps,"
           "time_to_target_schedule,compute_s,codec_s,modeled_time_s,modeled_comm_s,modeled_exposed_s,overlap,status,"
           "diverged_epoch,diverged_step,error\n";
    for (const auto& p : passes)
      md << (p.name == quantizer_pass ? quantizer_report(p, ranks, csv) : report(p, target_below_dense, ranks, csv))
         << "\n";
    if (!overlap_md.empty()) md << overlap_md << "\n";
    csv << overlap_csv.str();
    {
      std::ofstream f(out + "/results.md");
      f << md.str();
    }
    std::printf("\n%s\n", md.str().c_str());

    // --- plots: every method of each pass, seed 1, at 1 Gbit/s ---------------------------------
    for (const auto& p : passes) {
      std::vector<fmnist::plot_series> series;
      // A diverged run is drawn up to where it stopped, if it evaluated an epoch.
      for (const auto& e : p.runs)
        if (e.seed == 1 && e.network == 0 && !e.r().epochs.empty())
          series.push_back({e.spec->label + (e.diverged() ? " (diverged)" : ""), e.dir});
      if (series.empty()) continue;
      const std::string dir = out + "/" + p.name + "/plots";
      const bool plotted = fmnist::make_plots(series, dir,
                                              "Fashion-MNIST, " + first_with_epochs(p.runs).model + ", " +
                                                  std::to_string(ranks) + " ranks, 1 Gbit/s, seed 1");
      if (plotted) std::printf("plots: %s\n", dir.c_str());
    }
    std::printf("results: %s/results.md, %s/results.csv\n", out.c_str(), out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reproduce: %s\n", e.what());
    return 1;
  }
  return 0;
}
