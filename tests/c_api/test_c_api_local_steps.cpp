// Local steps through the C ABI (gravac_local_steps_*): 2 ranks over the thread engine give
// the bits of gravac::local_steps<sparseloco, allgather, fixed_policy>, the state resumes
// mid-round, and the ranks agree on the method and the starting point or all fail.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gravac/collective/allgather.hpp"
#include "gravac/comm/thread_communicator.hpp"
#include "gravac/compress/sparseloco.hpp"
#include "gravac/local_steps.hpp"
#include "gravac/policy/fixed_policy.hpp"
#include "gravac_c.h"

namespace {

const std::size_t shape_a[] = {24, 16};
const std::size_t shape_b[] = {40};
const gravac_layer layers[] = {{"fc.weight", shape_a, 2, GRAVAC_LAYER_DENSE},
                               {"fc.bias", shape_b, 1, GRAVAC_LAYER_BIAS_OR_NORM}};
constexpr std::size_t numel = 24 * 16 + 40;

gravac::layout cxx_layout() {
  gravac::layout l;
  l.add("fc.weight", {24, 16}, gravac::layer_kind::dense);
  l.add("fc.bias", {40}, gravac::layer_kind::bias_or_norm);
  return l;
}

std::vector<float> start_point() {
  std::vector<float> x(numel);
  for (std::size_t i = 0; i < numel; ++i) x[i] = 0.01f * static_cast<float>(static_cast<int>(i % 97) - 48);
  return x;
}

// A rank's gradient at x: towards its own target, so the ranks drift apart between exchanges.
void gradient(const std::vector<float>& x, int rank, unsigned step, std::vector<float>& g) {
  g.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float target = 0.02f * static_cast<float>(static_cast<int>((i * 7 + 13 * rank) % 31) - 15);
    const float noise = 0.001f * static_cast<float>(static_cast<int>((i * 11 + step * 5 + rank) % 17) - 8);
    g[i] = (x[i] - target) + noise;
  }
}

void sgd(std::vector<float>& x, const std::vector<float>& g) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] -= 0.1f * g[i];
}

const char* const option_names[] = {"kept_fraction", "sparseloco_chunk", "local_period", "outer"};
const char* const option_values[] = {"0.1", "32", "3", "nesterov"};

// A method of \p compressor over Allgather, policy fixed, with \p count options.
gravac_method method_of(const char* compressor, const char* const* names, const char* const* values,
                        std::size_t count) {
  gravac_method m{};
  m.struct_size = sizeof m;
  m.compressor = compressor;
  m.collective = "allgather";
  m.policy = "fixed";
  m.bucket_mb = -1;
  m.option_names = names;
  m.option_values = values;
  m.option_count = count;
  return m;
}

gravac_method local_method() { return method_of("sparseloco", option_names, option_values, 4); }

// Runs \p body(rank, comm) on 2 thread ranks of the C ABI's thread engine.
template <class F>
void two_ranks(F&& body) {
  gravac_thread_world* world = nullptr;
  REQUIRE(gravac_thread_world_create(2, &world) == GRAVAC_OK);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      gravac_comm* comm = nullptr;
      if (gravac_comm_from_thread_world(world, r, &comm) != GRAVAC_OK) return;
      body(r, comm);
      gravac_comm_destroy(comm);
    });
  for (auto& t : threads) t.join();
  gravac_thread_world_destroy(world);
}

// H per step, for a failure's message.
std::string testing_periods(const std::vector<std::uint64_t>& h) {
  std::string s;
  for (auto p : h) s += std::to_string(p) + ' ';
  return s;
}

}  // namespace

TEST_CASE("C ABI: local steps over 2 ranks equal gravac::local_steps bit for bit, and resume mid-round",
          "[c_api][local_steps]") {
  constexpr unsigned steps = 10, stop = 4;  // three exchanges; saved one step into the second round
  using LS = gravac::local_steps<gravac::sparseloco, gravac::allgather, gravac::fixed_policy>;
  LS::options opt;
  opt.period = 3;
  opt.exchange.policy.kept_fraction = 0.1;
  opt.exchange.compressor.chunk = 32;
  std::vector<std::vector<float>> ref(2);
  gravac::run_ranks(2, [&](gravac::thread_communicator& comm) {
    std::vector<float> x = start_point(), g;
    LS ls(comm, cxx_layout(), x, opt);
    for (unsigned s = 0; s < steps; ++s) {
      gradient(x, comm.rank(), s, g);
      ls.before_inner_step(g);
      sgd(x, g);
      ls.after_inner_step(x);
    }
    ref[static_cast<std::size_t>(comm.rank())] = x;
  });

  std::vector<std::vector<float>> got(2), resumed(2);
  std::vector<int> exchanges(2, 0), averaged(2, 0);
  std::vector<gravac_local_steps_info> info(2);
  const auto m = local_method();
  two_ranks([&](int r, gravac_comm* comm) {
    auto x = start_point();
    std::vector<float> g, x_saved;
    std::vector<unsigned char> state;
    gravac_local_steps* ls = nullptr;
    REQUIRE(gravac_local_steps_create(&m, layers, 2, comm, x.data(), x.size(), &ls) == GRAVAC_OK);
    for (unsigned s = 0; s < steps; ++s) {
      gradient(x, r, s, g);
      int avg = -1, exch = -1;
      gravac_step_report report{};
      report.struct_size = sizeof report;
      REQUIRE(gravac_local_steps_before(ls, g.data(), g.size(), &avg, nullptr) == GRAVAC_OK);
      sgd(x, g);
      REQUIRE(gravac_local_steps_after(ls, x.data(), x.size(), &exch, &report) == GRAVAC_OK);
      averaged[static_cast<std::size_t>(r)] += avg;
      exchanges[static_cast<std::size_t>(r)] += exch;
      if (exch == 1) CHECK(report.dense_bytes > 0);
      if (s + 1 == stop) {
        std::size_t size = 0;
        REQUIRE(gravac_local_steps_save(ls, nullptr, 0, &size) == GRAVAC_OK);
        state.resize(size);
        std::size_t small = 0;
        CHECK(gravac_local_steps_save(ls, state.data(), size - 1, &small) == GRAVAC_BUFFER_TOO_SMALL);
        REQUIRE(gravac_local_steps_save(ls, state.data(), state.size(), &size) == GRAVAC_OK);
        x_saved = x;
      }
    }
    info[static_cast<std::size_t>(r)].struct_size = sizeof(gravac_local_steps_info);
    REQUIRE(gravac_local_steps_get_info(ls, &info[static_cast<std::size_t>(r)]) == GRAVAC_OK);
    std::vector<float> global(numel);
    REQUIRE(gravac_local_steps_global_params(ls, global.data(), global.size()) == GRAVAC_OK);
    CHECK(global != x);  // one step into a round
    got[static_cast<std::size_t>(r)] = x;
    gravac_local_steps_destroy(ls);

    // A fresh start, restored from the state saved after step `stop`.
    x = start_point();
    REQUIRE(gravac_local_steps_create(&m, layers, 2, comm, x.data(), x.size(), &ls) == GRAVAC_OK);
    CHECK(gravac_local_steps_load(ls, state.data(), state.size() - 1) == GRAVAC_INVALID_ARGUMENT);
    REQUIRE(gravac_local_steps_load(ls, state.data(), state.size()) == GRAVAC_OK);
    x = x_saved;
    for (unsigned s = stop; s < steps; ++s) {
      gradient(x, r, s, g);
      REQUIRE(gravac_local_steps_before(ls, g.data(), g.size(), nullptr, nullptr) == GRAVAC_OK);
      sgd(x, g);
      REQUIRE(gravac_local_steps_after(ls, x.data(), x.size(), nullptr, nullptr) == GRAVAC_OK);
    }
    resumed[static_cast<std::size_t>(r)] = x;
    gravac_local_steps_destroy(ls);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(got[static_cast<std::size_t>(r)] == ref[static_cast<std::size_t>(r)]);
    CHECK(resumed[static_cast<std::size_t>(r)] == ref[static_cast<std::size_t>(r)]);
    CHECK(exchanges[static_cast<std::size_t>(r)] == 3);
    CHECK(averaged[static_cast<std::size_t>(r)] == 0);  // H = 3: no per-step round
    CHECK(info[static_cast<std::size_t>(r)].period == 3);
    CHECK(info[static_cast<std::size_t>(r)].round_step == 1);
    CHECK(info[static_cast<std::size_t>(r)].inner_steps == steps);
    CHECK(info[static_cast<std::size_t>(r)].exchanges == 3);
  }
  CHECK(ref[0] != ref[1]);
}

TEST_CASE("C ABI: local steps say when the inner state must agree, and average it to the same bits",
          "[c_api][local_steps]") {
  constexpr unsigned steps = 7;  // two exchanges at H = 3
  const auto m = local_method();
  constexpr std::size_t state_n = 37;  // any length: the inner optimizer's, not the layout's
  // This rank's state before averaging: different on each rank, and not its own average.
  const auto state_of = [](int r) {
    std::vector<float> v(state_n);
    for (std::size_t i = 0; i < state_n; ++i)
      v[i] = 0.1f * static_cast<float>(i) + (r == 0 ? 0.3f : -1.7f) * static_cast<float>(i % 5 + 1);
    return v;
  };
  std::vector<int> flagged(2, -1), exchanged(2, 0);
  std::vector<std::vector<float>> averaged(2);
  two_ranks([&](int r, gravac_comm* comm) {
    auto x = start_point();
    std::vector<float> g;
    gravac_local_steps* ls = nullptr;
    REQUIRE(gravac_local_steps_create(&m, layers, 2, comm, x.data(), x.size(), &ls) == GRAVAC_OK);
    int any = 0;
    for (unsigned s = 0; s < steps; ++s) {
      gradient(x, r, s, g);
      REQUIRE(gravac_local_steps_before(ls, g.data(), g.size(), nullptr, nullptr) == GRAVAC_OK);
      sgd(x, g);
      int exch = 0, must = -1;
      REQUIRE(gravac_local_steps_after(ls, x.data(), x.size(), &exch, nullptr) == GRAVAC_OK);
      REQUIRE(gravac_local_steps_inner_state_must_agree(ls, &must) == GRAVAC_OK);
      any |= must;  // a fixed H of 3 never begins per-step rounds
      exchanged[static_cast<std::size_t>(r)] += exch;
    }
    flagged[static_cast<std::size_t>(r)] = any;
    auto v = state_of(r);
    REQUIRE(gravac_local_steps_average_inner_state(ls, v.data(), v.size()) == GRAVAC_OK);
    averaged[static_cast<std::size_t>(r)] = v;
    gravac_local_steps_destroy(ls);
  });
  const auto v0 = state_of(0), v1 = state_of(1);
  std::vector<float> mean(state_n);
  for (std::size_t i = 0; i < state_n; ++i) mean[i] = (v0[i] + v1[i]) / 2.0f;  // summed in rank order
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(flagged[static_cast<std::size_t>(r)] == 0);
    CHECK(exchanged[static_cast<std::size_t>(r)] == 2);
    CHECK(averaged[static_cast<std::size_t>(r)] == mean);
  }
  REQUIRE(averaged[0].size() == state_n);
  REQUIRE(averaged[1].size() == state_n);
  CHECK(std::memcmp(averaged[0].data(), averaged[1].data(), state_n * sizeof(float)) == 0);
  CHECK(mean != v0);
  CHECK(mean != v1);
}

// The adaptive policy through the C ABI: a slow prior network (1 kbit/s) makes the round
// after the first exchange one of local steps, and the measured exchanges between thread
// ranks (microseconds, against a simulated 10 ms of compute per step) then make it choose
// per-step rounds.
const char* const adaptive_names[] = {"local_adaptive", "local_max_period", "local_time", "local_compute_s",
                                      "network_source", "network_gbps",     "outer"};
const char* const adaptive_values[] = {"1", "4", "simulated", "0.01", "measured", "0.000001", "averaging"};

gravac_method adaptive_method() { return method_of("topk", adaptive_names, adaptive_values, 7); }

TEST_CASE(
    "C ABI: where the adaptive policy switches to per-step rounds, averaging the momentum keeps the ranks "
    "together, and a state saved at the switch keeps the flag",
    "[c_api][local_steps]") {
  constexpr unsigned steps = 24;
  const auto m = adaptive_method();
  // Per rank, with or without averaging the momentum: H at each step, the parameters after
  // each step, and the steps at which the flag rose.
  struct run {
    std::vector<std::uint64_t> period;
    std::vector<std::vector<float>> x;
    std::vector<unsigned> flagged;
    int restored_flag = -1;
  };
  const auto train = [&](bool average) {
    std::vector<run> runs(2);
    two_ranks([&](int r, gravac_comm* comm) {
      auto& out = runs[static_cast<std::size_t>(r)];
      auto x = start_point();
      std::vector<float> g, v(x.size(), 0.0f);  // heavy-ball momentum: the inner state
      gravac_local_steps* ls = nullptr;
      REQUIRE(gravac_local_steps_create(&m, layers, 2, comm, x.data(), x.size(), &ls) == GRAVAC_OK);
      for (unsigned s = 0; s < steps; ++s) {
        gravac_local_steps_info info{};
        info.struct_size = sizeof info;
        REQUIRE(gravac_local_steps_get_info(ls, &info) == GRAVAC_OK);
        out.period.push_back(info.period);
        gradient(x, r, s, g);
        REQUIRE(gravac_local_steps_before(ls, g.data(), g.size(), nullptr, nullptr) == GRAVAC_OK);
        for (std::size_t i = 0; i < x.size(); ++i) {
          v[i] = 0.9f * v[i] + g[i];
          x[i] -= 0.05f * v[i];
        }
        REQUIRE(gravac_local_steps_after(ls, x.data(), x.size(), nullptr, nullptr) == GRAVAC_OK);
        int must = -1;
        REQUIRE(gravac_local_steps_inner_state_must_agree(ls, &must) == GRAVAC_OK);
        if (must == 1) {
          out.flagged.push_back(s);
          if (out.restored_flag < 0) {  // the state saved here resumes with the flag raised
            std::size_t size = 0;
            REQUIRE(gravac_local_steps_save(ls, nullptr, 0, &size) == GRAVAC_OK);
            std::vector<unsigned char> state(size);
            REQUIRE(gravac_local_steps_save(ls, state.data(), state.size(), &size) == GRAVAC_OK);
            gravac_local_steps* other = nullptr;
            auto x0 = start_point();
            REQUIRE(gravac_local_steps_create(&m, layers, 2, comm, x0.data(), x0.size(), &other) == GRAVAC_OK);
            REQUIRE(gravac_local_steps_inner_state_must_agree(other, &out.restored_flag) == GRAVAC_OK);
            CHECK(out.restored_flag == 0);  // a fresh one: no round ended yet
            REQUIRE(gravac_local_steps_load(other, state.data(), state.size()) == GRAVAC_OK);
            REQUIRE(gravac_local_steps_inner_state_must_agree(other, &out.restored_flag) == GRAVAC_OK);
            gravac_local_steps_destroy(other);
          }
          if (average) REQUIRE(gravac_local_steps_average_inner_state(ls, v.data(), v.size()) == GRAVAC_OK);
        }
        out.x.push_back(x);
      }
      gravac_local_steps_destroy(ls);
    });
    return runs;
  };
  const auto averaged = train(true);
  const auto& h = averaged[0].period;
  INFO("H per step: " << testing_periods(h));
  // A per-step round until the first exchange is timed, a round of local steps under the
  // prior, then per-step rounds: the switch this case is about.
  const auto local = std::find_if(h.begin(), h.end(), [](std::uint64_t k) { return k > 1; });
  REQUIRE(local != h.end());
  const auto per_step = std::find(local, h.end(), std::uint64_t{1});
  REQUIRE(per_step != h.end());
  const auto first = static_cast<std::size_t>(per_step - h.begin());
  REQUIRE(first + 2 < steps);  // some per-step rounds to compare
  for (const auto& r : averaged) {
    CHECK(r.period == h);
    REQUIRE(!r.flagged.empty());
    CHECK(r.flagged.front() + 1 == first);  // raised by the step that ended the last local round
    CHECK(r.restored_flag == 1);
  }
  for (std::size_t s = first; s < steps; ++s) {
    INFO("step " << s << ", H " << h[s]);
    if (h[s] == 1) CHECK(averaged[1].x[s] == averaged[0].x[s]);
  }
  // Without averaging, the same run drifts apart in its first per-step round: what the flag is for.
  const auto apart = train(false);
  REQUIRE(apart[0].period == h);
  CHECK(apart[1].x[first] != apart[0].x[first]);
}

TEST_CASE("C ABI: local steps refuse what they cannot run, on every rank alike", "[c_api][local_steps]") {
  auto m = local_method();
  const auto x = start_point();
  // Ranks that start from different parameters all fail, naming each other.
  std::vector<gravac_status> st(2, GRAVAC_OK);
  std::vector<std::string> msg(2);
  two_ranks([&](int r, gravac_comm* comm) {
    auto mine = x;
    if (r == 1) mine[5] += 1.0f;
    gravac_local_steps* ls = nullptr;
    st[static_cast<std::size_t>(r)] = gravac_local_steps_create(&m, layers, 2, comm, mine.data(), mine.size(), &ls);
    msg[static_cast<std::size_t>(r)] = gravac_last_error();
    CHECK(ls == nullptr);
  });
  CHECK(st[0] == GRAVAC_LAYOUT_MISMATCH);
  CHECK(st[1] == GRAVAC_LAYOUT_MISMATCH);
  CHECK(msg[0].find("rank(s) 1") != std::string::npos);
  CHECK(msg[0].find("parameters") != std::string::npos);

  gravac_thread_world* world = nullptr;
  REQUIRE(gravac_thread_world_create(1, &world) == GRAVAC_OK);
  gravac_comm* comm = nullptr;
  REQUIRE(gravac_comm_from_thread_world(world, 0, &comm) == GRAVAC_OK);
  gravac_local_steps* ls = nullptr;
  m.policy = "gravac";
  CHECK(gravac_local_steps_create(&m, layers, 2, comm, x.data(), x.size(), &ls) == GRAVAC_INVALID_ARGUMENT);
  CHECK(std::string(gravac_last_error()).find("fixed policy") != std::string::npos);
  m = local_method();
  CHECK(gravac_local_steps_create(&m, layers, 2, comm, x.data(), x.size() - 1, &ls) == GRAVAC_INVALID_ARGUMENT);
  CHECK(gravac_local_steps_create(&m, layers, 2, comm, nullptr, x.size(), &ls) == GRAVAC_INVALID_ARGUMENT);
  CHECK(gravac_local_steps_create(&m, layers, 2, comm, x.data(), x.size(), nullptr) == GRAVAC_INVALID_ARGUMENT);
  m.device = GRAVAC_DEVICE_CUDA;
  CHECK(gravac_local_steps_create(&m, layers, 2, comm, x.data(), x.size(), &ls) != GRAVAC_OK);
  m = local_method();
  REQUIRE(gravac_local_steps_create(&m, layers, 2, comm, x.data(), x.size(), &ls) == GRAVAC_OK);
  std::vector<float> g(numel, 0.0f);
  CHECK(gravac_local_steps_before(ls, g.data(), g.size() + 1, nullptr, nullptr) == GRAVAC_INVALID_ARGUMENT);
  CHECK(std::string(gravac_last_error()).find("for a layout of") != std::string::npos);
  CHECK(gravac_local_steps_after(ls, g.data(), g.size(), nullptr, nullptr) == GRAVAC_INVALID_ARGUMENT);  // before first
  int must = -1;
  CHECK(gravac_local_steps_inner_state_must_agree(nullptr, &must) == GRAVAC_INVALID_ARGUMENT);
  CHECK(gravac_local_steps_inner_state_must_agree(ls, nullptr) == GRAVAC_INVALID_ARGUMENT);
  REQUIRE(gravac_local_steps_inner_state_must_agree(ls, &must) == GRAVAC_OK);
  CHECK(must == 0);
  std::vector<float> state(5, 1.0f);
  CHECK(gravac_local_steps_average_inner_state(nullptr, state.data(), state.size()) == GRAVAC_INVALID_ARGUMENT);
  CHECK(gravac_local_steps_average_inner_state(ls, nullptr, state.size()) == GRAVAC_INVALID_ARGUMENT);
  CHECK(std::string(gravac_last_error()).find("state is NULL") != std::string::npos);
  CHECK(gravac_local_steps_average_inner_state(ls, nullptr, 0) == GRAVAC_OK);  // nothing to average
  REQUIRE(gravac_local_steps_before(ls, g.data(), g.size(), nullptr, nullptr) == GRAVAC_OK);
  // Between before and after the inner step: refused, and the state is left as it was.
  CHECK(gravac_local_steps_average_inner_state(ls, state.data(), state.size()) == GRAVAC_INVALID_ARGUMENT);
  CHECK(std::string(gravac_last_error()).find("between inner steps") != std::string::npos);
  CHECK(state == std::vector<float>(5, 1.0f));
  REQUIRE(gravac_local_steps_after(ls, g.data(), g.size(), nullptr, nullptr) == GRAVAC_OK);
  char text[64];
  std::size_t length = 0;
  REQUIRE(gravac_local_steps_policy_state(ls, text, sizeof text, &length) == GRAVAC_OK);
  CHECK(std::string(text) == "H 3");
  CHECK(gravac_local_steps_policy_state(ls, text, 2, &length) == GRAVAC_BUFFER_TOO_SMALL);
  gravac_local_steps_destroy(ls);
  gravac_local_steps_destroy(nullptr);
  gravac_comm_destroy(comm);
  gravac_thread_world_destroy(world);
}
