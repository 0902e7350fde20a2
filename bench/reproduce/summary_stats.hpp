#pragma once
// What the reproduction's tables are made of: numbers formatted, means and deviations over
// seeds, times to target over seeds, the machine line and the met / missed marks. Shared by
// reproduce.cpp and network_grid.cpp.
#include <sys/utsname.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace repro {

inline std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Mean and sample standard deviation of the finite values of v.
struct summary {
  double mean = std::nan("");
  double sd = std::nan("");
  int n = 0;
};
inline summary summarize(const std::vector<double>& v) {
  summary s;
  double sum = 0;
  for (double x : v)
    if (std::isfinite(x)) {
      sum += x;
      ++s.n;
    }
  if (s.n == 0) return s;
  s.mean = sum / s.n;
  double ss = 0;
  for (double x : v)
    if (std::isfinite(x)) ss += (x - s.mean) * (x - s.mean);
  s.sd = s.n > 1 ? std::sqrt(ss / (s.n - 1)) : 0.0;
  return s;
}

// "m ± sd" (m alone from one seed) of the values times scale; a signed format's sign is
// kept off the deviation.
inline std::string pm(const summary& s, const char* f, double scale = 1.0) {
  if (s.n == 0) return "-";
  std::string r = fmt(f, s.mean * scale), unsigned_f = f;
  if (const auto plus = unsigned_f.find('+'); plus != std::string::npos) unsigned_f.erase(plus, 1);
  if (s.n > 1) r += " ± " + fmt(unsigned_f.c_str(), s.sd * scale);
  return r;
}

// Runs that diverged (a non-finite gradient ended them, train_run.hpp) have no final
// figures: their values are NaN, which summarize leaves out, and a cell says how many of
// the runs diverged: "k/N diverged", or "diverged" for a single run.
inline std::string diverged_of(int k, std::size_t runs) {
  if (k <= 0) return {};
  if (runs == 1) return "diverged";
  return std::to_string(k) + "/" + std::to_string(runs) + " diverged";
}
// pm over the runs that finished, with "(k/N diverged)" after it; the count alone when none
// finished.
inline std::string pm_finished(const summary& s, int diverged, std::size_t runs, const char* f, double scale = 1.0) {
  if (diverged <= 0) return pm(s, f, scale);
  if (s.n == 0) return diverged_of(diverged, runs);
  return pm(s, f, scale) + " (" + diverged_of(diverged, runs) + ")";
}

// Times to target over the seeds (negative: not reached; a diverged run counts as not
// reached): the mean ± sd over the seeds that reached it, and "k/N reached" when not all
// did, "k/N diverged" when some diverged.
inline summary reached(const std::vector<double>& t) {
  std::vector<double> ok;
  for (double x : t)
    if (x >= 0) ok.push_back(x);
  return summarize(ok);
}
inline std::string time_cell(const std::vector<double>& t, int diverged = 0) {
  if (t.empty()) return "-";
  const summary s = reached(t);
  const auto runs = static_cast<int>(t.size());
  if (diverged > 0 && diverged == runs) return diverged_of(diverged, t.size());
  std::string of;
  if (s.n < runs && runs > 1) of = std::to_string(s.n) + "/" + std::to_string(runs) + " reached";
  if (diverged > 0) of += (of.empty() ? "" : ", ") + diverged_of(diverged, t.size());
  if (!of.empty()) of = " (" + of + ")";
  if (s.n == 0) return "not reached" + of;
  return pm(s, "%.2f") + of;
}

inline std::string machine_line() {
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
  return cpu + ", " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads, " + u.sysname + "; " +
         date;
}

inline std::string met(bool ok) { return ok ? "**met**" : "**missed**"; }

}  // namespace repro
