// The flexible collective with the compressed allreduce as its fourth path, on thread ranks
// over a simulated network: quantizers are priced by their packet size, a slow network at
// 16 ranks picks the compressed allreduce and gives the bits of the compressed_allreduce
// collective, a latency-bound tiny gradient takes the cost model's argmin, every rank picks
// the same, a policy can force the path, and it is refused with a clear error where it
// cannot run.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <type_traits>

#include "gravac/collective/flexible.hpp"
#include "gravac/comm/simulated_communicator.hpp"
#include "gravac/trainer/detail/checkpoint_agreement.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

static_assert(flexible::priced_by_packet<qsgd> && flexible::priced_by_packet<terngrad> &&
              flexible::priced_by_packet<sign> && flexible::priced_by_packet<cast16>);
// Index-hook compressors keep the top-k price of the Allgather; top-k cannot run on shards.
static_assert(!flexible::priced_by_packet<topk> && !flexible::priced_by_packet<identity>);
static_assert(!ShardableCompressor<topk>);
static_assert(detail::has_state<flexible>, "the compressed path's server residual must ride in checkpoints");

namespace {

// Layers of rank >= 2 only, so fixed_policy compresses all of them.
layout matrix_layout() {
  layout lay;
  lay.add("conv.weight", {64, 8, 3, 3}, layer_kind::conv);
  lay.add("fc1.weight", {100, 97}, layer_kind::dense);
  lay.add("fc2.weight", {10, 100}, layer_kind::dense);
  return lay;
}

layout tiny_layout() {
  layout lay;
  lay.add("w", {8, 8}, layer_kind::dense);
  return lay;
}

using flex_qsgd = trainer<qsgd, flexible, fixed_policy>;
using ca_qsgd = trainer<qsgd, compressed_allreduce, fixed_policy>;

// The size of a real qsgd packet over \p lay at kept fraction 0.01: P.
double qsgd_packet_bytes(const layout& lay) {
  qsgd c(lay, {});
  auto g = test::make_data(lay.numel(), 77);
  std::vector<float> e(lay.numel(), 0.0f);
  std::vector<std::byte> out(c.max_packet_bytes());
  compress_stats st;
  return static_cast<double>(c.compress(grad_view<host_space>(g.data(), g.size()),
                                        grad_view<host_space>(e.data(), e.size()), test::params_for(lay, 0.01), out,
                                        st));
}

// The model's choice for qsgd at kept fraction 0.01 on \p lay: the argmin of the four paths
// priced by hand from cost_model (AR-Topk impossible, the Allgather and the compressed
// allreduce by the real packet's size).
collective_kind model_choice(const layout& lay, int n, const network_params& net) {
  const double d = static_cast<double>(lay.numel());
  const double packet = qsgd_packet_bytes(lay);
  const std::array<double, 4> c{cost_model::dense_allreduce(n, d).seconds(net), INFINITY,
                                cost_model::allgather_packets(n, packet).seconds(net),
                                cost_model::compressed_allreduce(n, packet).seconds(net)};
  return flexible::paths[static_cast<std::size_t>(std::min_element(c.begin(), c.end()) - c.begin())];
}

struct run_result {
  std::vector<std::vector<collective_kind>> kinds;
  std::vector<std::vector<std::vector<float>>> grads;  // [rank][step]
  std::vector<std::vector<float>> residual, server;
  std::vector<std::array<double, 4>> costs;  // the last step's, per rank
};

// \p steps steps of trainer T on n thread ranks over a constant simulated network.
template <class T>
run_result run(int n, const layout& lay, const network_params& net, int steps,
               const std::function<void(typename T::options&)>& tweak = {}) {
  run_result out;
  out.kinds.resize(static_cast<std::size_t>(n));
  out.grads.resize(static_cast<std::size_t>(n));
  out.residual.resize(static_cast<std::size_t>(n));
  out.server.resize(static_cast<std::size_t>(n));
  out.costs.resize(static_cast<std::size_t>(n));
  const auto profile = std::make_shared<const network_profile>(network_profile::constant(net));
  run_ranks(n, [&](thread_communicator& tc) {
    const auto r = static_cast<std::size_t>(tc.rank());
    simulated_communicator<thread_communicator> sim(tc, *profile);
    typename T::options opt;
    opt.policy.kept_fraction = 0.01;
    if constexpr (std::is_same_v<typename T::collective_type, flexible>) {
      opt.collective.source = network_source::profile;
      opt.collective.profile = profile;
      opt.collective.charge_codec = false;  // the network model alone decides
    }
    if (tweak) tweak(opt);
    T t(sim, lay, opt);
    for (int s = 0; s < steps; ++s) {
      sim.set_step(static_cast<std::uint64_t>(s));
      auto g = test::make_data(lay.numel(), 41 * s + r + 3);
      out.kinds[r].push_back(t.step(g).collective);
      out.grads[r].push_back(g);
    }
    out.residual[r].assign(t.residual().begin(), t.residual().end());
    if constexpr (std::is_same_v<typename T::collective_type, flexible>) {
      const auto sr = t.collective().compressed().server_residual();
      out.server[r].assign(sr.begin(), sr.end());
      out.costs[r] = t.collective().last_path_costs();
    } else {
      const auto sr = t.collective().server_residual();
      out.server[r].assign(sr.begin(), sr.end());
    }
  });
  return out;
}

}  // namespace

TEST_CASE("cost model: the compressed allreduce is an alltoall of (N-1)/N P and an Allgather of P",
          "[flexible][cost_model]") {
  // N = 16 (L = 4), P = 1000 bytes, alpha = 1, beta = 0.5: alltoall 15 + 937.5 * 0.5,
  // Allgather 4 + 937.5 * 0.5; together 19 + 937.5 = 956.5.
  const network_params unit{1, 0.5};
  const auto t = cost_model::compressed_allreduce(16, 1000);
  CHECK(t.latency == 19.0);
  CHECK(t.bytes == Approx(1875.0));
  CHECK(t.seconds(unit) == Approx(956.5));
  CHECK(cost_model::allgather_packets(16, 1000).bytes == Approx(15000.0));
  CHECK(cost_model::compressed_allreduce(1, 1000).seconds(unit) == 0.0);
  // With neither the compressed path nor packet pricing, path_costs is candidate_costs.
  const auto three = cost_model::candidate_costs(8, 1e5, 0.01, unit, allreduce_algorithm::tree, true);
  cost_model::path_pricing how;
  how.allreduce = allreduce_algorithm::tree;
  const auto four = cost_model::path_costs(8, 1e5, 0.01, unit, how);
  CHECK(four[0] == three[0]);
  CHECK(four[1] == three[1]);
  CHECK(four[2] == three[2]);
  CHECK(four[3] == INFINITY);
}

TEST_CASE("flexible: qsgd on 16 ranks over a slow network runs the compressed allreduce, with its bits",
          "[flexible][compressed_allreduce]") {
  constexpr int n = 16, steps = 3;
  const auto lay = matrix_layout();
  const auto slow = network_params::from_gbps(10e-6, 0.1);
  REQUIRE(model_choice(lay, n, slow) == collective_kind::compressed_allreduce);
  const auto flex = run<flex_qsgd>(n, lay, slow, steps);
  const auto ref = run<ca_qsgd>(n, lay, slow, steps);
  const double packet = qsgd_packet_bytes(lay);
  // 8-bit codes: about a quarter of the raw bound that max_packet_bytes() gives.
  REQUIRE(packet < 0.3 * static_cast<double>(qsgd(lay, {}).max_packet_bytes()));
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const auto ur = static_cast<std::size_t>(r);
    CHECK(flex.kinds[ur] == std::vector<collective_kind>(steps, collective_kind::compressed_allreduce));
    CHECK(flex.grads[ur] == ref.grads[ur]);
    CHECK(flex.residual[ur] == ref.residual[ur]);
    CHECK(flex.server[ur] == ref.server[ur]);
    CHECK(flex.costs[ur] == flex.costs[0]);
  }
  // What it compared: AR-Topk impossible, the Allgather priced by the packet, not by 8 bytes per kept value.
  CHECK(flex.costs[0][1] == INFINITY);
  CHECK(flex.costs[0][2] == Approx(cost_model::allgather_packets(n, packet).seconds(slow)).epsilon(1e-12));
  CHECK(flex.costs[0][3] == Approx(cost_model::compressed_allreduce(n, packet).seconds(slow)).epsilon(1e-12));
}

TEST_CASE("flexible: qsgd takes the cost model's cheapest path, the same on every rank", "[flexible]") {
  struct net_case {
    const char* name;
    layout lay;
    network_params net;
  };
  const std::vector<net_case> cases{
      {"latency-bound, tiny gradient", tiny_layout(), network_params::from_gbps(1e-3, 100)},
      {"slow links", matrix_layout(), network_params::from_gbps(10e-6, 0.1)},
      {"fast links", matrix_layout(), network_params::from_gbps(1e-6, 400)},
  };
  std::set<collective_kind> seen;
  for (const auto& c : cases)
    for (int n : {4, 16}) {
      INFO(c.name << " on " << n << " ranks");
      const auto expected = model_choice(c.lay, n, c.net);
      seen.insert(expected);
      const auto got = run<flex_qsgd>(n, c.lay, c.net, 2);
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        CHECK(got.kinds[static_cast<std::size_t>(r)] == std::vector<collective_kind>(2, expected));
      }
    }
  // A tiny gradient behind a 1 ms latency: the Allgather's log2 N rounds win.
  CHECK(model_choice(tiny_layout(), 16, network_params::from_gbps(1e-3, 100)) == collective_kind::allgather);
  CHECK(seen.count(collective_kind::compressed_allreduce) == 1);
}

TEST_CASE("flexible: with measured codec times and a fitted network every rank still picks the same",
          "[flexible][codec]") {
  constexpr int n = 8, steps = 12;
  const auto lay = matrix_layout();
  const auto got = run<flex_qsgd>(n, lay, network_params::from_gbps(10e-6, 0.1), steps, [](auto& opt) {
    opt.collective.source = network_source::modeled;
    opt.collective.profile = nullptr;
    opt.collective.charge_codec = true;
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(got.kinds[static_cast<std::size_t>(r)] == got.kinds[0]);
    CHECK(got.grads[static_cast<std::size_t>(r)] == got.grads[0]);
  }
}

TEST_CASE("flexible: a forced compressed allreduce runs where it can and is refused clearly where not",
          "[flexible][compressed_allreduce]") {
  constexpr int n = 4, steps = 2;
  const auto lay = matrix_layout();
  // A latency-bound network where the model would not pick it.
  const auto net = network_params::from_gbps(1e-3, 100);
  REQUIRE(model_choice(lay, n, net) != collective_kind::compressed_allreduce);
  const auto forced = run<flex_qsgd>(n, lay, net, steps,
                                     [](auto& opt) { opt.policy.collective = collective_kind::compressed_allreduce; });
  const auto ref = run<ca_qsgd>(n, lay, net, steps);
  for (int r = 0; r < n; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    CHECK(forced.kinds[ur] == std::vector<collective_kind>(steps, collective_kind::compressed_allreduce));
    CHECK(forced.grads[ur] == ref.grads[ur]);
  }
  // Top-k cannot run on shards: the step throws before any path runs, on every rank.
  std::vector<std::string> why(n);
  run_ranks(n, [&](thread_communicator& tc) {
    trainer<topk, flexible, fixed_policy>::options opt;
    opt.policy.collective = collective_kind::compressed_allreduce;
    trainer<topk, flexible, fixed_policy> t(tc, lay, opt);
    auto g = test::make_data(lay.numel(), 5 + tc.rank());
    try {
      t.step(g);
    } catch (const error& e) {
      why[static_cast<std::size_t>(tc.rank())] = e.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << why[static_cast<std::size_t>(r)]);
    CHECK(why[static_cast<std::size_t>(r)].find("compressed_allreduce was forced but the compressor cannot run on "
                                                "shards") != std::string::npos);
  }
}
