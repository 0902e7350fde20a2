// The scaling study's methods on real MPI ranks (run under mpiexec, N = 2, 4, 8 by
// scripts/scaling): the same gradients as the thread-rank program, so the same packets.
// Rank 0 prints one CSV row per method:
//   ranks,method,wire_sent,wire_received,counted_ok,latency_terms,byte_terms,measured_s,modeled_s,error
// wire_* are the busiest rank's step_report figures (they must equal the thread-rank
// program's at the same N); counted_ok says whether every rank's report equals the
// simulated network's count. measured_s is the median over the steps of the slowest rank's
// measured time in the collective; modeled_s is the cost model's time for the step's calls
// under (alpha, beta) fitted by network_estimate to all methods' measured steps of this run,
// and error its relative difference: how well the alpha-beta model describes this engine.
//   scaling_mpi [--layout mlp|25m] [--steps 20]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "gravac/comm/mpi_communicator.hpp"
#include "scaling.hpp"

using namespace gravac;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rc = 0;
  {
    CLI::App app{"gravac scaling study on MPI ranks"};
    std::string layout_name = "mlp";
    int steps = 20;
    app.add_option("--layout", layout_name, "mlp or 25m")->check(CLI::IsMember({"mlp", "25m"}));
    app.add_option("--steps", steps, "steps per method")->check(CLI::Range(2, 1000));
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      rc = app.exit(e);
      MPI_Finalize();
      return rc;
    }
    const layout lay = layout_name == "mlp" ? scaling::mlp_layout() : scaling::synthetic_25m_layout();
    mpi_communicator comm;
    struct row {
      std::string name;
      double sent, received, measured;
      bool counted;
      cost_terms terms;
    };
    std::vector<row> rows;
    network_estimate fit;
    for (const auto& m : scaling::methods()) {
      simulated_communicator<mpi_communicator> sim(comm, network_profile::constant({}));
      const scaling::sample s = scaling::run_method(m.name, sim, lay, m.kept_fraction, steps);
      double v[3] = {s.wire_sent, s.wire_received,
                     s.wire_sent == s.counted_sent && s.wire_received == s.counted_received ? 0.0 : 1.0};
      MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_DOUBLE, MPI_MAX, comm.native());
      // The slowest rank's time per step (the step ends when it does), then the median step.
      std::vector<double> t = s.step_communicate_s;
      MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, comm.native());
      t.erase(t.begin());  // the first step allocates
      for (double x : t) fit.add(s.terms, x);
      std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
      rows.push_back({m.name, v[0], v[1], t[t.size() / 2], v[2] == 0.0, s.terms});
      if (v[2] != 0.0) rc = 1;
    }
    if (comm.rank() == 0) {
      const network_params net = fit.params();
      std::printf("# fitted on this engine: alpha %.3g s, beta %.3g s/B (%.2f Gbit/s)\n", net.alpha, net.beta,
                  net.gbps());
      std::printf(
          "ranks,method,wire_sent,wire_received,counted_ok,latency_terms,byte_terms,measured_s,modeled_s,error\n");
      for (const auto& r : rows) {
        const double modeled = r.terms.seconds(net);
        std::printf("%d,%s,%.0f,%.0f,%s,%g,%.0f,%.6g,%.6g,%.3f\n", comm.size(), r.name.c_str(), r.sent, r.received,
                    r.counted ? "yes" : "no", r.terms.latency, r.terms.bytes, r.measured, modeled,
                    r.measured > 0 ? (modeled - r.measured) / r.measured : 0.0);
      }
    }
  }
  MPI_Finalize();
  return rc;
}
