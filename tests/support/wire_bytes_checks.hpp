#pragma once
// The wire-byte check shared by test_wire_bytes*.cpp: a trainer step's report counts
// exactly the wire bytes the simulated network counted for the calls the step made, on
// every rank and every step (the report's rules and the network's are wire_bytes.hpp's).

#include <catch2/catch.hpp>
#include <cstddef>
#include <vector>

#include "gravac/comm/simulated_communicator.hpp"
#include "gravac/comm/thread_communicator.hpp"
#include "gravac/trainer.hpp"
#include "policy_test_util.hpp"

namespace gravac::test {

//! One step on one rank: what the report said and what the simulated network counted.
struct wire_step {
  double report_sent = 0, report_received = 0;  // step_report::wire_bytes_*
  double net_sent = 0, net_received = 0;        // the increase of simulated_communicator's counters
  collective_kind kind = collective_kind::automatic;
};

//! Runs trainer T with options \p opt on \p ranks thread ranks through a simulated network
//! for \p steps steps (the network charging Allreduces as \p net_opt says); returns
//! [rank][step]. No assertions inside the rank threads.
template <class T>
std::vector<std::vector<wire_step>> wire_steps(const layout& lay, const typename T::options& opt, int steps,
                                               int ranks = 4, const simulated_network_options& net_opt = {}) {
  std::vector<std::vector<wire_step>> out(static_cast<std::size_t>(ranks),
                                          std::vector<wire_step>(static_cast<std::size_t>(steps)));
  run_ranks(ranks, [&](thread_communicator& comm) {
    const auto net = network_profile::constant(network_params::from_gbps(1e-3, 10));
    simulated_communicator<thread_communicator> sim(comm, net, net_opt);
    T t(sim, lay, opt);
    auto& mine = out[static_cast<std::size_t>(comm.rank())];
    for (int s = 0; s < steps; ++s) {
      auto g = rank_gradient(lay, s, comm.rank());
      const double sent = sim.wire_bytes_sent(), received = sim.wire_bytes_received();
      const step_report& r = t.step(g);
      mine[static_cast<std::size_t>(s)] = {r.wire_bytes_sent, r.wire_bytes_received, sim.wire_bytes_sent() - sent,
                                           sim.wire_bytes_received() - received, r.collective};
    }
  });
  return out;
}

//! Checks that every step's report equals the network's count (and that the step sent
//! something when there is more than one rank), and that every step ran collective \p kind.
inline void check_wire_steps(const std::vector<std::vector<wire_step>>& w, collective_kind kind) {
  for (std::size_t r = 0; r < w.size(); ++r)
    for (std::size_t s = 0; s < w[r].size(); ++s) {
      const wire_step& x = w[r][s];
      INFO("rank " << r << " step " << s);
      CHECK(x.kind == kind);
      CHECK(x.report_sent == x.net_sent);
      CHECK(x.report_received == x.net_received);
      if (w.size() > 1) CHECK(x.net_sent > 0);
    }
}

}  // namespace gravac::test
