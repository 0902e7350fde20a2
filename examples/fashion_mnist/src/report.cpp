// Console output, CSV files and gnuplot plots of the Fashion-MNIST example.
#include "fmnist/report.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <gravac/error.hpp>
#include <memory>

namespace fmnist {

namespace {

std::string megabytes(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", bytes / 1e6);
  return b;
}

double cf_of(double fraction) { return fraction > 0 ? 1.0 / fraction : 0.0; }

std::ofstream open_for_writing(const std::string& path) {
  std::ofstream f(path);
  if (!f) throw gravac::error(gravac::status::invalid_argument, "cannot write " + path + ": " + std::strerror(errno));
  f.precision(9);
  return f;
}

// gnuplot string literal: single quotes, a quote doubled.
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

// POSIX shell literal: single quotes, a quote as '\''.
std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

std::string epoch_header() {
  // pkt MB: the rank's own packets; wire MB: what it received on the simulated wire;
  // model comm s: the modeled communication, exposed s: the part of it not hidden behind
  // backward (all of it without --overlap on), exp/comm: their ratio.
  return "epoch   test acc   loss      pkt MB   wire MB  CF chosen   pkt CF  compute s  codec s  model comm s  "
         "exposed s  exp/comm  model time s  policy";
}

train_observer console_observer(bool progress, std::FILE* out) {
  train_observer o;
  auto header_done = std::make_shared<bool>(false);
  auto last_drawn = std::make_shared<std::size_t>(static_cast<std::size_t>(-1));
  if (progress) {
    o.on_step = [out, last_drawn](const step_record& r, std::size_t s, std::size_t n) {
      // Redraw at most 100 times per epoch.
      const std::size_t cell = (s + 1) * 100 / n;
      if (cell == *last_drawn && s + 1 != n) return;
      *last_drawn = cell;
      const int width = 30, filled = static_cast<int>((s + 1) * width / n);
      std::fprintf(out, "\r  epoch %zu [%.*s%*s] %3zu%%  loss %.4f  CF %.0f ", r.epoch + 1, filled,
                   "##############################", width - filled, "", cell, r.loss, cf_of(r.kept_fraction));
      std::fflush(out);
    };
  }
  o.on_epoch = [out, progress, header_done, last_drawn](const epoch_record& e, const run_result&) {
    if (progress) std::fprintf(out, "\r%100s\r", "");
    *last_drawn = static_cast<std::size_t>(-1);
    if (!*header_done) {
      std::fprintf(out, "%s\n", epoch_header().c_str());
      *header_done = true;
    }
    std::fprintf(out,
                 "%5zu   %6.2f%%   %.4f  %8s  %8s  %9.1f  %7.1f  %9.2f  %7.2f  %12.3f  %9.3f  %7.1f%%  %12.3f  %s\n",
                 e.epoch + 1, 100 * e.test_acc, e.train_loss, megabytes(e.bytes_per_rank).c_str(),
                 megabytes(e.wire_bytes_received_per_rank).c_str(), cf_of(e.kept_fraction),
                 e.bytes_per_rank > 0 ? e.dense_bytes_per_rank / e.bytes_per_rank : 0.0, e.compute_s, e.codec_s,
                 e.modeled_comm_s, e.modeled_exposed_s,
                 e.modeled_comm_s > 0 ? 100 * e.modeled_exposed_s / e.modeled_comm_s : 100.0, e.modeled_time_s,
                 e.policy_state.c_str());
    std::fflush(out);
  };
  return o;
}

void print_summary(const run_result& r, std::FILE* out) {
  if (r.epochs.empty()) return;
  const auto& last = r.epochs.back();
  double dense = 0, compute = 0, codec = 0, comm = 0;
  for (const auto& e : r.epochs) {
    dense += e.dense_bytes_per_rank;
    compute += e.compute_s;
    codec += e.codec_s;
    comm += e.modeled_comm_s;
  }
  const double sent = r.total_bytes_per_rank();
  std::fprintf(out, "\nsummary: %s on %s (%zu parameters), %d ranks, network %s\n", r.method.c_str(), r.model.c_str(),
               r.params, r.ranks, r.network.c_str());
  std::fprintf(out, "  final test accuracy    %.2f%% after %zu epochs (%zu steps)\n", 100 * last.test_acc,
               r.epochs.size(), r.steps.size());
  std::fprintf(out, "  packet bytes per rank  %s MB (a dense fp32 Allreduce's buffer: %s MB, %.1fx less)\n",
               megabytes(sent).c_str(), megabytes(dense).c_str(), sent > 0 ? dense / sent : 0.0);
  // The wire bytes exist only under a simulated network (they are the algorithm it charges).
  if (r.total_wire_bytes_received_per_rank() > 0)
    std::fprintf(out, "  wire bytes per rank    %s MB received, %s MB sent\n",
                 megabytes(r.total_wire_bytes_received_per_rank()).c_str(),
                 megabytes(r.total_wire_bytes_sent_per_rank()).c_str());
  std::fprintf(out, "  measured compute       %.2f s (+ %.2f s compression); modeled compute %.2f ms per step\n",
               compute, codec, 1e3 * r.compute_per_step_s);
  const exposure x = exposure_of(r);
  std::fprintf(
      out, "  modeled time           %.2f s (communication %.2f s, of which exposed %.2f s: %.1f%%; %s, %zu %s)\n",
      last.modeled_time_s, comm, x.exposed_s, 100 * x.ratio(),
      r.overlap ? "overlapped with backward" : "after backward", r.buckets, r.buckets == 1 ? "bucket" : "buckets");
}

void write_csv(const run_result& r, const std::string& dir) {
  std::filesystem::create_directories(dir);
  {
    auto f = open_for_writing(dir + "/steps.csv");
    f << "step,epoch,lr,loss,train_acc,kept_fraction,cf,bytes_sent,dense_bytes,wire_bytes_sent,wire_bytes_received,"
         "collective,gain,compute_s,codec_s,modeled_comm_s,modeled_exposed_s,modeled_time_s,bandwidth_gbps,latency_"
         "ms,wall_s,exchange_wall_s\n";
    for (const auto& s : r.steps)
      f << s.step << ',' << s.epoch << ',' << s.lr << ',' << s.loss << ',' << s.train_acc << ',' << s.kept_fraction
        << ',' << cf_of(s.kept_fraction) << ',' << s.bytes_sent << ',' << s.dense_bytes << ',' << s.wire_bytes_sent
        << ',' << s.wire_bytes_received << ',' << s.collective << ',' << s.gain << ',' << s.compute_s << ','
        << s.codec_s << ',' << s.modeled_comm_s << ',' << s.modeled_exposed_s << ',' << s.modeled_time_s << ','
        << s.bandwidth_gbps << ',' << s.latency_ms << ',' << s.wall_s << ',' << s.exchange_wall_s << '\n';
    if (!f) throw gravac::error(gravac::status::invalid_argument, "writing " + dir + "/steps.csv failed");
  }
  auto f = open_for_writing(dir + "/epochs.csv");
  f << "epoch,lr,train_loss,train_acc,test_loss,test_acc,bytes_per_rank,dense_bytes_per_rank,"
       "wire_bytes_sent_per_rank,wire_bytes_received_per_rank,kept_fraction,cf,"
       "compute_s,codec_s,modeled_comm_s,modeled_exposed_s,modeled_time_s,wall_s,train_wall_s,exchange_wall_s,"
       "policy_state\n";
  for (const auto& e : r.epochs)
    f << e.epoch + 1 << ',' << e.lr << ',' << e.train_loss << ',' << e.train_acc << ',' << e.test_loss << ','
      << e.test_acc << ',' << e.bytes_per_rank << ',' << e.dense_bytes_per_rank << ',' << e.wire_bytes_sent_per_rank
      << ',' << e.wire_bytes_received_per_rank << ',' << e.kept_fraction << ',' << cf_of(e.kept_fraction) << ','
      << e.compute_s << ',' << e.codec_s << ',' << e.modeled_comm_s << ',' << e.modeled_exposed_s << ','
      << e.modeled_time_s << ',' << e.wall_s << ',' << e.train_wall_s << ',' << e.exchange_wall_s << ",\""
      << e.policy_state << "\"\n";
  if (!f) throw gravac::error(gravac::status::invalid_argument, "writing " + dir + "/epochs.csv failed");
}

bool make_plots(const std::vector<plot_series>& series, const std::string& dir, const std::string& title) {
  std::filesystem::create_directories(dir);
  const std::string script = dir + "/plots.gp";
  {
    auto f = open_for_writing(script);
    f << "# Regenerate with: gnuplot " << script << "\n"
      << "set datafile separator ','\nset terminal pngcairo size 900,560 font ',10'\nset grid\n"
      << "set key bottom right\n";
    const auto plot = [&](const std::string& png, const std::string& file, const std::string& using_,
                          const std::string& xl, const std::string& yl, const std::string& extra) {
      f << "set output " << quoted(dir + "/" + png) << "\nset title " << quoted(title) << "\nset xlabel " << quoted(xl)
        << "\nset ylabel " << quoted(yl) << "\n"
        << extra << "plot ";
      for (std::size_t i = 0; i < series.size(); ++i)
        f << (i ? ", \\\n     " : "") << quoted(series[i].dir + "/" + file) << " using " << using_
          << " with lines lw 2 dt " << 1 + i / 8  // gnuplot cycles 8 colours: dash the next 8
          << " title " << quoted(series[i].label);
      f << "\nunset logscale\n";
    };
    plot("accuracy_vs_epoch.png", "epochs.csv", "'epoch':(100*column('test_acc'))", "epoch", "test accuracy (%)", "");
    plot("accuracy_vs_time.png", "epochs.csv", "'modeled_time_s':(100*column('test_acc'))", "modeled time (s)",
         "test accuracy (%)", "");
    plot("ratio_vs_step.png", "steps.csv", "'step':'cf'", "step", "compression factor chosen (1 / kept fraction)",
         "set logscale y\nset key top left\n");
    plot("bytes_vs_step.png", "steps.csv", "'step':'bytes_sent'", "step", "packet bytes per rank per step",
         "set logscale y\nset key top right\n");
  }
  const std::string cmd = "gnuplot " + shell_quoted(script) + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) {
    std::fprintf(stderr, "plots: cannot run gnuplot (install gnuplot-nox); the script is %s\n", script.c_str());
    return false;
  }
  std::string msg;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p.get())) msg += buf;
  const int rc = pclose(p.release());
  if (rc != 0) {
    std::fprintf(stderr, "plots: gnuplot failed (%s)%s%s\n", script.c_str(), msg.empty() ? "" : ": ", msg.c_str());
    if (msg.find("not found") != std::string::npos) std::fprintf(stderr, "plots: install gnuplot-nox\n");
    return false;
  }
  return true;
}

}  // namespace fmnist
