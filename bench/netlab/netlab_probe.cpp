// netlab_probe: what the network lab's links really carry and how fast (scripts/netlab runs
// it, one rank per lab host; docs/network_lab.md).
//
//   netlab_probe bytes [--mib M] [--calls K]
//       K Allreduces of M MiB through gravac::mpi_communicator; each rank reads its own link's
//       counters (/sys/class/net/eth0) before and after and compares what left the host with
//       what the collective sends (gravac::wire_bytes). Exit 1 when a rank's link carried less
//       than that, or more than 12% over it (TCP/IP headers and acknowledgements): then the
//       ranks talked some other way than through the shaped link, or something else did.
//   netlab_probe fit --rate-mbps R [--reps N]
//       times Allreduce and Allgather(v) (gravac's: the sizes, then the blocks) over sizes from 1 KiB to 16 MiB (median
//       of N calls, slowest rank), prints each beside the cost model's time at rate R and 50 us (the Allreduce as Open
//       MPI 4.1's rules choose it), and the online estimate (gravac::network_estimate) fitted to the timings against
//       rate R.
//
//   netlab_probe time --sizes B1,B2,... [--reps N]
//       the median Allreduce time at each size in bytes (slowest rank), e.g. under an
//       algorithm forced with --mca coll_tuned_allreduce_algorithm, to tell which one Open
//       MPI's default rules chose; beside it, what gravac's model of those rules
//       (cost_model::open_mpi_4_1_allreduce) says they choose.
//   netlab_probe exchange [--mib M]
//       two hosts: M MiB sent one way, then exchanged both ways at once (MPI_Sendrecv, as
//       recursive doubling and Rabenseifner do at every step); the rate of each. On a
//       full-duplex link both reach the link rate.
//
// Output: CSV on rank 0's stdout (lines starting with '#' are comments).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <gravac/comm/mpi_communicator.hpp>
#include <gravac/comm/mpi_guard.hpp>
#include <gravac/network/cost_model.hpp>
#include <gravac/network/network_estimate.hpp>
#include <gravac/network/wire_bytes.hpp>
#include <span>
#include <string>
#include <vector>

namespace {

// A counter of this host's lab link.
double link_counter(const char* which) {
  std::ifstream in(std::string("/sys/class/net/eth0/statistics/") + which);
  double v = -1;
  in >> v;
  gravac::require(in && v >= 0, std::string("netlab_probe: cannot read eth0's ") + which +
                                    " (run in a lab host: scripts/netlab -- netlab_probe ...)");
  return v;
}

std::string option(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 2; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}

int probe_bytes(gravac::mpi_communicator& comm, double mib, int calls) {
  const int n = comm.size();
  std::vector<float> buf(static_cast<std::size_t>(mib * 1024 * 1024 / 4), 1.0f);
  comm.allreduce_sum(std::span<float>(buf));  // connections made before counting
  comm.barrier();
  const double tx0 = link_counter("tx_bytes"), rx0 = link_counter("rx_bytes");
  for (int i = 0; i < calls; ++i) comm.allreduce_sum(std::span<float>(buf));
  // A rank may return while its last bytes still wait in its socket or in the link's
  // queue: after the barrier every rank has received everything sent to it.
  comm.barrier();
  const double tx1 = link_counter("tx_bytes"), rx1 = link_counter("rx_bytes");
  const auto want = gravac::wire_bytes::allreduce(n, 4.0 * static_cast<double>(buf.size()));
  double r[2] = {(tx1 - tx0) / (calls * want.sent), (rx1 - rx0) / (calls * want.received)};
  std::vector<double> all(2 * static_cast<std::size_t>(n));
  MPI_Gather(r, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  bool ok = true;
  if (comm.rank() == 0) {
    std::printf("# %d Allreduces of %.1f MiB on %d hosts; link bytes over the collective's wire bytes\n", calls, mib,
                n);
    std::printf("host,collective_sent_bytes,link_tx_ratio,link_rx_ratio\n");
    for (int h = 0; h < n; ++h) {
      const double tx = all[2 * h], rx = all[2 * h + 1];
      std::printf("%d,%.0f,%.4f,%.4f\n", h, calls * want.sent, tx, rx);
      ok = ok && tx >= 1.0 && tx <= 1.12 && rx >= 1.0 && rx <= 1.12;
    }
    std::printf("# %s\n", ok ? "every link carried the collective's bytes (plus TCP/IP overhead)"
                             : "FAILED: a link carried less than the collective, or over 12% more");
  }
  int bad = ok ? 0 : 1;
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return bad;
}

template <class F>
double median_seconds(gravac::mpi_communicator& comm, int reps, F&& call) {
  call();  // warm: connections, buffers
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    comm.barrier();
    const double t0 = MPI_Wtime();
    call();
    double dt = MPI_Wtime() - t0;
    comm.allreduce_max(std::span<double>(&dt, 1));
    t.push_back(dt);
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[static_cast<std::size_t>(reps / 2)];
}

int probe_fit(gravac::mpi_communicator& comm, double rate_mbps, int reps) {
  const int n = comm.size();
  const auto configured = gravac::network_params::from_gbps(50e-6, rate_mbps / 1000);
  gravac::network_estimate est;
  if (comm.rank() == 0) {
    std::printf("# %d hosts at %.0f Mbit/s; modeled: the cost model at that rate and 50 us\n", n, rate_mbps);
    std::printf("collective,bytes,measured_s,modeled_s,measured_over_modeled\n");
  }
  for (double bytes = 1024; bytes <= 16.0 * 1024 * 1024; bytes *= 4) {
    std::vector<float> buf(static_cast<std::size_t>(bytes / 4), 1.0f);
    const double ar = median_seconds(comm, reps, [&] { comm.allreduce_sum(std::span<float>(buf)); });
    // Priced as the algorithm Open MPI's default rules run at this size (what the lab's
    // algos part checks), so that the fit sees the latencies and bytes really sent.
    const auto ar_terms = gravac::cost_model::allreduce(n, bytes, gravac::cost_model::open_mpi_4_1_allreduce(n, bytes));
    est.add(ar_terms, ar);
    const std::size_t share = buf.size() / static_cast<std::size_t>(n);
    gravac::mpi_communicator::byte_buffer gathered;
    std::vector<std::size_t> sizes;
    const double ag = median_seconds(comm, reps, [&] {
      comm.allgatherv(std::as_bytes(std::span<const float>(buf.data(), share)), gathered, sizes);
    });
    const double total = 4.0 * static_cast<double>(share) * n;
    const auto ag_terms = gravac::cost_model::allgather(n, total);
    est.add(ag_terms, ag);
    if (comm.rank() == 0) {
      std::printf("allreduce,%.0f,%.6f,%.6f,%.3f\n", bytes, ar, ar_terms.seconds(configured),
                  ar / ar_terms.seconds(configured));
      std::printf("allgather,%.0f,%.6f,%.6f,%.3f\n", total, ag, ag_terms.seconds(configured),
                  ag / ag_terms.seconds(configured));
    }
  }
  if (comm.rank() == 0) {
    const auto& p = est.params();
    std::printf("# online estimate: alpha %.1f us, bandwidth %.1f Mbit/s (configured %.0f Mbit/s: %.3f of it)%s\n",
                p.alpha * 1e6, p.gbps() * 1000, rate_mbps, p.gbps() * 1000 / rate_mbps,
                est.identifiable() ? "" : " (not identifiable)");
  }
  return 0;
}

const char* algorithm_name(gravac::allreduce_algorithm a) {
  switch (a) {
    case gravac::allreduce_algorithm::ring:
      return "ring";
    case gravac::allreduce_algorithm::tree:
      return "reduce + broadcast";
    case gravac::allreduce_algorithm::recursive_doubling:
      return "recursive doubling";
    case gravac::allreduce_algorithm::rabenseifner:
      return "Rabenseifner";
    case gravac::allreduce_algorithm::pipelined_tree:
      return "pipelined tree";
    default:
      return "basic linear";
  }
}

int probe_time(gravac::mpi_communicator& comm, const std::string& sizes, int reps) {
  if (comm.rank() == 0) std::printf("hosts,bytes,measured_s,open_mpi_4_1_rule\n");
  std::size_t at = 0;
  while (at < sizes.size()) {
    const std::size_t end = std::min(sizes.find(',', at), sizes.size());
    const double bytes = std::stod(sizes.substr(at, end - at));
    gravac::require(bytes >= 4, "netlab_probe: every size must be at least 4 bytes");
    std::vector<float> buf(static_cast<std::size_t>(bytes / 4), 1.0f);
    const double t = median_seconds(comm, reps, [&] { comm.allreduce_sum(std::span<float>(buf)); });
    if (comm.rank() == 0)
      std::printf("%d,%.0f,%.6f,%s\n", comm.size(), bytes, t,
                  algorithm_name(gravac::cost_model::open_mpi_4_1_allreduce(comm.size(), bytes)));
    at = end + 1;
  }
  return 0;
}

int probe_exchange(gravac::mpi_communicator& comm, double mib) {
  gravac::require(comm.size() == 2, "netlab_probe exchange: run it on 2 hosts");
  const int peer = 1 - comm.rank();
  std::vector<char> out(static_cast<std::size_t>(mib * 1024 * 1024)), in(out.size());
  const int n = static_cast<int>(out.size());
  const auto exchange = [&] {
    MPI_Sendrecv(out.data(), n, MPI_BYTE, peer, 0, in.data(), n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  };
  const auto one_way = [&] {
    if (comm.rank() == 0)
      MPI_Send(out.data(), n, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
    else
      MPI_Recv(in.data(), n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  };
  const double t1 = median_seconds(comm, 3, one_way), t2 = median_seconds(comm, 3, exchange);
  if (comm.rank() == 0) {
    std::printf("pattern,bytes,measured_s,mbit_per_s_each_way\n");
    std::printf("one_way,%d,%.6f,%.1f\n", n, t1, n * 8.0 / t1 / 1e6);
    std::printf("exchange,%d,%.6f,%.1f\n", n, t2, n * 8.0 / t2 / 1e6);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  gravac::run_or_abort(MPI_COMM_WORLD, [&] {
    const std::string mode = argc > 1 ? argv[1] : "";
    gravac::mpi_communicator comm;
    if (mode == "bytes")
      rc =
          probe_bytes(comm, std::stod(option(argc, argv, "--mib", "8")), std::stoi(option(argc, argv, "--calls", "3")));
    else if (mode == "fit")
      rc = probe_fit(comm, std::stod(option(argc, argv, "--rate-mbps", "1000")),
                     std::stoi(option(argc, argv, "--reps", "5")));
    else if (mode == "exchange")
      rc = probe_exchange(comm, std::stod(option(argc, argv, "--mib", "4")));
    else if (mode == "time")
      rc =
          probe_time(comm, option(argc, argv, "--sizes", "4096,1048576"), std::stoi(option(argc, argv, "--reps", "5")));
    else
      throw gravac::error(
          gravac::status::invalid_argument,
          "netlab_probe: the mode must be bytes, fit, exchange or time (see the head of netlab_probe.cpp)");
  });
  MPI_Finalize();
  return rc;
}
