#pragma once
//! \file report.hpp
//! \brief What a person sees and keeps from a run: a progress bar, one line per epoch,
//! a final summary, the per-step and per-epoch CSV files and gnuplot PNG plots.

#include <cstdio>
#include <string>
#include <vector>

#include "fmnist/train.hpp"

namespace fmnist {

//! A train_observer that draws a progress bar per epoch (when \p progress) and prints
//! one line per epoch to \p out.
train_observer console_observer(bool progress, std::FILE* out = stdout);

//! The header line matching the per-epoch lines of console_observer.
std::string epoch_header();

//! Prints the summary of \p r (final accuracy, packet bytes, and wire bytes when a simulated
//! network counted them; times) to \p out.
void print_summary(const run_result& r, std::FILE* out = stdout);

//! Writes \p dir/steps.csv and \p dir/epochs.csv (creating \p dir), packet and wire bytes in
//! separate columns. Throws on I/O errors.
void write_csv(const run_result& r, const std::string& dir);

//! One series of a comparison plot: a label and the directory holding its CSV files.
struct plot_series {
  std::string label;  //!< legend entry
  std::string dir;    //!< directory with steps.csv and epochs.csv
};

//! Writes \p dir/plots.gp and runs gnuplot on it, producing accuracy_vs_epoch.png,
//! accuracy_vs_time.png, ratio_vs_step.png and bytes_vs_step.png in \p dir, one curve
//! per series. Returns false (and says why on stderr) when gnuplot is missing or fails.
bool make_plots(const std::vector<plot_series>& series, const std::string& dir, const std::string& title);

}  // namespace fmnist
