// PowerSGD: error feedback, exact recovery of low-rank matrices, the two-allreduce
// protocol on 4 thread ranks against a plain reference, warm start, validation, and a
// per-layer rank from the policy (Accordion's levels).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "gravac/collective/low_rank_allreduce.hpp"
#include "gravac/compress/powersgd.hpp"
#include "gravac/policy/accordion_policy.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

static_assert(!allgather::accepts<powersgd>, "PowerSGD cannot be gathered");
static_assert(dense_allreduce::accepts<powersgd>);
static_assert(low_rank_allreduce::accepts<powersgd>);
static_assert(!low_rank_allreduce::accepts<topk>);

namespace {

layout matrix_layout() {
  layout l;
  l.add("conv", {6, 3, 3, 3}, layer_kind::conv);  // 6 x 27
  l.add("bias", {6}, layer_kind::bias_or_norm);   // 1-D: raw
  l.add("fc", {40, 25}, layer_kind::dense);
  l.add("tiny", {2, 2}, layer_kind::dense);  // r (rows + cols) >= numel: raw
  return l;
}

// The plain reference of one PowerSGD step over N ranks for one layer (double precision,
// the textbook order): P = sum_r M_r Q; P^ = Gram-Schmidt(P); Q_r = M_r^T P^;
// e_r = M_r - P^ Q_r^T; result = P^ (sum_r Q_r / N)^T; Q = sum_r Q_r / N.
struct reference_layer {
  std::size_t rows, cols, r;
  std::vector<double> q;  // cols x r column-major
};
std::vector<double> reference_step(reference_layer& L,
                                   std::vector<std::vector<double>>& m /* per rank, u in, e out */) {
  const std::size_t n = m.size(), rows = L.rows, cols = L.cols, r = L.r;
  std::vector<double> p(rows * r, 0.0);
  for (std::size_t k = 0; k < n; ++k)
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < r; ++j)
        for (std::size_t c = 0; c < cols; ++c) p[j * rows + i] += m[k][i * cols + c] * L.q[j * cols + c];
  for (std::size_t j = 0; j < r; ++j) {
    for (std::size_t k = 0; k < j; ++k) {
      double d = 0;
      for (std::size_t i = 0; i < rows; ++i) d += p[k * rows + i] * p[j * rows + i];
      for (std::size_t i = 0; i < rows; ++i) p[j * rows + i] -= d * p[k * rows + i];
    }
    double nn = 0;
    for (std::size_t i = 0; i < rows; ++i) nn += p[j * rows + i] * p[j * rows + i];
    for (std::size_t i = 0; i < rows; ++i) p[j * rows + i] /= std::sqrt(nn);
  }
  std::vector<double> qsum(cols * r, 0.0);
  for (std::size_t k = 0; k < n; ++k) {
    std::vector<double> qk(cols * r, 0.0);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < r; ++j)
        for (std::size_t c = 0; c < cols; ++c) qk[j * cols + c] += m[k][i * cols + c] * p[j * rows + i];
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t c = 0; c < cols; ++c)
        for (std::size_t j = 0; j < r; ++j) m[k][i * cols + c] -= p[j * rows + i] * qk[j * cols + c];
    for (std::size_t x = 0; x < qk.size(); ++x) qsum[x] += qk[x];
  }
  for (auto& x : qsum) x /= static_cast<double>(n);
  L.q = qsum;
  std::vector<double> out(rows * cols, 0.0);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < cols; ++c)
      for (std::size_t j = 0; j < r; ++j) out[i * cols + c] += p[j * rows + i] * qsum[j * cols + c];
  return out;
}

// The documented initial Q: splitmix64(mix_seed(seed, step, id ^ column)), uniform in [-1, 1).
std::vector<double> initial_q(const layer& l, std::size_t r, std::uint64_t seed) {
  std::vector<double> q(l.cols() * r);
  for (std::size_t j = 0; j < r; ++j) {
    detail::splitmix64 rng(detail::mix_seed(seed, 0, l.id ^ j));
    for (std::size_t c = 0; c < l.cols(); ++c) q[j * l.cols() + c] = static_cast<float>(2.0 * rng.uniform() - 1.0);
  }
  return q;
}

}  // namespace

TEST_CASE("powersgd error feedback: P^ Q^T + e_new == u", "[compress][powersgd][ef]") {
  const auto lay = matrix_layout();
  for (std::uint32_t rank : {1u, 2u, 4u}) {
    powersgd c(lay, {.rank = rank});
    auto e = test::make_data(lay.numel(), 2);
    for (int step = 0; step < 3; ++step) {
      const auto g = test::make_data(lay.numel(), 10 + step);
      const auto e_old = e;
      std::vector<std::byte> packet(c.max_packet_bytes());
      compress_stats st;
      auto gg = g;
      const auto bytes = c.compress(host_view(gg), host_view(e), test::params_for(lay, 0.1, step), packet, st);
      const std::span<const std::byte> pk(packet.data(), bytes);
      REQUIRE(c.validate(pk));
      std::vector<float> dec(lay.numel(), 0.0f);
      c.decompress_add(pk, host_view(dec), 1.0f);
      for (std::size_t i = 0; i < lay.numel(); ++i) {
        const float u = g[i] + e_old[i];
        const float m = std::max(std::fabs(u), std::fabs(dec[i]));
        INFO("rank " << rank << " step " << step << " element " << i);
        REQUIRE(std::fabs(dec[i] + e[i] - u) <= (m == 0 ? 0.0f : std::ldexp(1.0f, std::ilogb(m) - 23)));
      }
      CHECK(st.layers[2].kept == std::min<std::size_t>(rank, 25) * (40 + 25));
      CHECK(st.layers[1].kept == 6);  // the bias went raw
      for (std::size_t i = 0; i < 6; ++i) CHECK(e[lay[1].offset + i] == 0.0f);
    }
  }
  CHECK_THROWS_AS(powersgd(lay, {.rank = 0}), gravac::error);
  CHECK(powersgd(lay).layer_rank(1) == 0);
  CHECK(powersgd(lay).layer_rank(3) == 0);
}

TEST_CASE("powersgd recovers a rank-r matrix in one iteration", "[compress][powersgd]") {
  layout lay;
  lay.add("w", {30, 20}, layer_kind::dense);
  const auto a = test::make_data(30 * 2, 1), b = test::make_data(20 * 2, 2);
  std::vector<float> m(600, 0.0f);
  for (std::size_t i = 0; i < 30; ++i)
    for (std::size_t c = 0; c < 20; ++c) m[i * 20 + c] = a[i] * b[c] + a[30 + i] * b[20 + c];
  powersgd c(lay, {.rank = 2});
  std::vector<float> e(600, 0.0f);
  std::vector<std::byte> packet(c.max_packet_bytes());
  compress_stats st;
  auto g = m;
  const auto bytes = c.compress(host_view(g), host_view(e), test::params_for(lay, 0.1), packet, st);
  std::vector<float> dec(600, 0.0f);
  c.decompress_add(std::span<const std::byte>(packet.data(), bytes), host_view(dec), 1.0f);
  CHECK(test::max_rel_diff(dec, m) < 1e-4);
  CHECK(bytes == sizeof(packet_header) + powersgd::factor_segment_bytes(30, 20, 2));
  // A rank-2 matrix with rank 1 leaves a residual, which error feedback carries.
  powersgd c1(lay, {.rank = 1});
  std::fill(e.begin(), e.end(), 0.0f);
  g = m;
  c1.compress(host_view(g), host_view(e), test::params_for(lay, 0.1), packet, st);
  double esq = 0;
  for (float x : e) esq += double(x) * x;
  CHECK(esq > 1e-3);
}

TEST_CASE("powersgd x low_rank_allreduce on 4 ranks equals the reference", "[compress][powersgd][threads]") {
  constexpr int ranks = 4;
  constexpr std::uint32_t rank = 2;
  constexpr std::uint64_t seed = 17;
  const auto lay = matrix_layout();
  const int steps = 4;
  std::vector<std::vector<std::vector<float>>> outputs(steps, std::vector<std::vector<float>>(ranks));
  std::vector<std::vector<float>> residuals(ranks);
  std::vector<std::size_t> bytes(ranks);
  auto grad = [&](int s, int r) {
    return test::make_data(lay.numel(), 100 * s + r,
                           r % 2 ? test::distribution::laplace : test::distribution::gaussian);
  };
  run_ranks(ranks, [&](thread_communicator& comm) {
    using T = trainer<powersgd, low_rank_allreduce, fixed_policy>;
    T::options opt;
    opt.compressor.rank = rank;
    opt.policy.kept_fraction = 0.1;
    opt.seed = seed;
    T t(comm, lay, opt);
    for (int s = 0; s < steps; ++s) {
      auto g = grad(s, comm.rank());
      bytes[comm.rank()] = t.step(g).bytes_sent;
      outputs[s][comm.rank()] = g;
    }
    residuals[comm.rank()].assign(t.residual().begin(), t.residual().end());
  });
  // The reference, layer by layer in double.
  std::vector<std::vector<double>> e(ranks, std::vector<double>(lay.numel(), 0.0));
  std::vector<reference_layer> ref_layers;
  for (std::size_t li = 0; li < lay.size(); ++li)
    ref_layers.push_back({lay[li].rows(), lay[li].cols(), std::min<std::size_t>({rank, lay[li].rows(), lay[li].cols()}),
                          initial_q(lay[li], std::min<std::size_t>({rank, lay[li].rows(), lay[li].cols()}), seed)});
  for (int s = 0; s < steps; ++s) {
    std::vector<double> expect(lay.numel(), 0.0);
    for (std::size_t li = 0; li < lay.size(); ++li) {
      const auto& l = lay[li];
      std::vector<std::vector<double>> m(ranks);
      for (int r = 0; r < ranks; ++r) {
        const auto g = grad(s, r);
        m[r].resize(l.numel);
        for (std::size_t i = 0; i < l.numel; ++i) m[r][i] = e[r][l.offset + i] + g[l.offset + i];
      }
      const bool low_rank = li == 0 || li == 2;
      std::vector<double> out(l.numel, 0.0);
      if (low_rank) {
        out = reference_step(ref_layers[li], m);
      } else {
        for (int r = 0; r < ranks; ++r)
          for (std::size_t i = 0; i < l.numel; ++i) {
            out[i] += m[r][i] / ranks;
            m[r][i] = 0;
          }
      }
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < l.numel; ++i) e[r][l.offset + i] = m[r][i];
      for (std::size_t i = 0; i < l.numel; ++i) expect[l.offset + i] = out[i];
    }
    for (int r = 0; r < ranks; ++r) {
      INFO("step " << s << " rank " << r);
      CHECK(outputs[s][r] == outputs[s][0]);  // identical bits on every rank
      std::vector<float> ef(expect.begin(), expect.end());
      CHECK(test::max_rel_diff(outputs[s][r], ef) < 2e-4);
    }
  }
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> ef(e[r].begin(), e[r].end());
    CHECK(test::max_rel_diff(residuals[r], ef) < 2e-4);
  }
  const std::size_t floats = 2 * (6 + 27) + 6 + 2 * (40 + 25) + 4;
  CHECK(bytes[0] == floats * sizeof(float));
}

TEST_CASE("powersgd x dense_allreduce equals the serial reference", "[compress][powersgd][threads]") {
  constexpr int ranks = 4;
  const auto lay = matrix_layout();
  const int steps = 3;
  std::vector<std::vector<std::vector<float>>> outputs(steps, std::vector<std::vector<float>>(ranks));
  auto grad = [&](int s, int r) { return test::make_data(lay.numel(), 300 * s + r); };
  run_ranks(ranks, [&](thread_communicator& comm) {
    using T = trainer<powersgd, dense_allreduce, fixed_policy>;
    T::options opt;
    opt.policy.kept_fraction = 0.1;
    opt.seed = 3;
    T t(comm, lay, opt);
    for (int s = 0; s < steps; ++s) {
      auto g = grad(s, comm.rank());
      t.step(g);
      outputs[s][comm.rank()] = g;
    }
  });
  // Serial: one persistent compressor per rank (the warm start is per rank here).
  std::vector<powersgd> cs;
  for (int r = 0; r < ranks; ++r) cs.emplace_back(lay, powersgd_options{});
  std::vector<std::vector<float>> res(ranks, std::vector<float>(lay.numel(), 0.0f));
  for (int s = 0; s < steps; ++s) {
    std::vector<float> sum(lay.numel(), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      auto g = grad(s, r);
      std::vector<std::byte> packet(cs[r].max_packet_bytes());
      compress_stats st;
      const auto b = cs[r].compress(host_view(g), host_view(res[r]), test::params_for(lay, 0.1, s, 3), packet, st);
      cs[r].decompress_add(std::span<const std::byte>(packet.data(), b), host_view(sum), 1.0f);
    }
    for (auto& x : sum) x /= ranks;
    for (int r = 0; r < ranks; ++r) CHECK(test::max_rel_diff(outputs[s][r], sum) < 1e-5);
  }
}

TEST_CASE("powersgd validation rejects malformed packets", "[compress][powersgd][validation]") {
  const auto lay = matrix_layout();
  powersgd c(lay);
  auto g = test::make_data(lay.numel(), 1);
  std::vector<float> e(lay.numel(), 0.0f);
  std::vector<std::byte> packet(c.max_packet_bytes());
  compress_stats st;
  packet.resize(c.compress(host_view(g), host_view(e), test::params_for(lay, 0.1), packet, st));
  REQUIRE(c.validate(packet));
  for (std::size_t cut = 0; cut < packet.size(); cut += 7)
    CHECK_FALSE(c.validate(std::span<const std::byte>(packet.data(), cut)));
  const std::size_t seg = sizeof(packet_header);
  auto bad = packet;
  std::uint64_t r = 7;  // rank above min(rows, cols) = 6 of the first layer
  std::memcpy(bad.data() + seg + 16, &r, 8);
  CHECK_FALSE(c.validate(bad));
  bad = packet;
  r = 0;
  std::memcpy(bad.data() + seg + 16, &r, 8);
  CHECK_FALSE(c.validate(bad));
  bad = packet;
  const float nan = std::nanf("");
  std::memcpy(bad.data() + seg + sizeof(segment_header) + 4, &nan, 4);
  CHECK_FALSE(c.validate(bad));
  bad = packet;
  bad[seg + 5] = std::byte{2};  // unknown encoding
  CHECK_FALSE(c.validate(bad));
}

TEST_CASE("powersgd: a per-layer rank from its step settings, capped by options.rank", "[compress][powersgd][rank]") {
  layout lay = matrix_layout();
  lay.add("small", {3, 3}, layer_kind::dense);  // raw at rank 2 (2 * 6 >= 9), compressed at rank 1
  powersgd c(lay, {.rank = 2});
  CHECK(c.layer_rank(4) == 0);
  auto e = test::make_data(lay.numel(), 5);
  std::vector<std::byte> packet(c.max_packet_bytes());
  compress_stats st;
  auto run = [&](std::vector<std::uint32_t> ranks, int step) {
    auto p = test::params_for(lay, 0.1, static_cast<std::uint64_t>(step));
    c.set_step_settings({.approximation_rank = std::move(ranks)});
    auto g = test::make_data(lay.numel(), 40 + static_cast<std::uint64_t>(step));
    const auto e_old = e;
    const auto bytes = c.compress(host_view(g), host_view(e), p, packet, st);
    const std::span<const std::byte> pk(packet.data(), bytes);
    REQUIRE(c.validate(pk));
    std::vector<float> dec(lay.numel(), 0.0f);
    c.decompress_add(pk, host_view(dec), 1.0f);
    for (std::size_t i = 0; i < lay.numel(); ++i) {  // error feedback holds at every rank
      const float u = g[i] + e_old[i];
      const float m = std::max(std::fabs(u), std::fabs(dec[i]));
      REQUIRE(std::fabs(dec[i] + e[i] - u) <= (m == 0 ? 0.0f : std::ldexp(1.0f, std::ilogb(m) - 23)));
    }
    return bytes;
  };
  // conv at 1, fc at the compressor's own (0), small at 1; 5 asks more than the workspace.
  const auto b1 = run({1, 0, 0, 0, 1}, 0);
  CHECK(c.last_rank(0) == 1);
  CHECK(c.last_rank(2) == 2);
  CHECK(c.last_rank(4) == 1);
  CHECK(st.layers[0].kept == 6 + 27);
  CHECK(st.layers[4].kept == 3 + 3);
  const auto b2 = run({5, 5, 5, 5, 5}, 1);
  CHECK(c.last_rank(0) == 2);
  CHECK(c.last_rank(4) == 0);  // rank 2 saves nothing on a 3 x 3 layer: raw
  CHECK(st.layers[4].kept == 9);
  CHECK(b2 > b1);
  // Down to rank 1: the warm start keeps its first column, the second is zeroed (and drawn
  // afresh if the rank rises again).
  run({1, 1, 1, 1, 1}, 2);
  const auto w = c.warm_start(2);
  REQUIRE(w.size() == 25 * 2);
  CHECK(std::all_of(w.begin() + 25, w.end(), [](float x) { return x == 0.0f; }));
  CHECK(std::any_of(w.begin(), w.begin() + 25, [](float x) { return x != 0.0f; }));
  run({2, 2, 2, 2, 2}, 3);
  CHECK(c.last_rank(2) == 2);
  const auto w2 = c.warm_start(2);
  CHECK(std::any_of(w2.begin() + 25, w2.end(), [](float x) { return x != 0.0f; }));
  // A wrong length is rejected before anything changes: the previous ranks stay in use.
  CHECK_THROWS_WITH(c.set_step_settings({.approximation_rank = {1, 1}}), Catch::Contains("approximation_rank"));
  CHECK(c.settings().approximation_rank == std::vector<std::uint32_t>{2, 2, 2, 2, 2});
  run({}, 4);  // empty: options.rank everywhere
  CHECK(c.last_rank(2) == 2);
}

TEST_CASE("powersgd x accordion_policy: the rank follows the level, identical on every rank",
          "[compress][powersgd][accordion][threads]") {
  constexpr int ranks = 4;
  const auto lay = matrix_layout();  // conv 6 x 27, bias (dense), fc 40 x 25, tiny (raw)
  constexpr int steps = 12;
  // Intervals of 2 steps, a decision at each. The gradient keeps its direction; its size is
  // 1 for steps 0-5 and 3 from step 6: decisions (applied 2 steps after their interval)
  // low (first), high (step 5), high, low (step 9, r = 2), high (step 11).
  const std::vector<std::uint32_t> expect_rank{2, 2, 2, 2, 2, 1, 1, 1, 1, 2, 2, 1};
  auto grad = [&](int s, int r) {
    auto g = test::make_data(lay.numel(), 900 + static_cast<std::uint64_t>(r));
    for (auto& x : g) x *= s >= 6 ? 3.0f : 1.0f;
    return g;
  };
  std::vector<std::vector<std::vector<float>>> out(ranks);
  std::vector<std::vector<std::size_t>> bytes(ranks), fc_rank(ranks);
  run_ranks(ranks, [&](thread_communicator& comm) {
    using T = trainer<powersgd, low_rank_allreduce, accordion_policy>;
    T::options opt;
    opt.compressor.rank = 4;  // the workspace: Accordion asks 2 or 1
    opt.policy = {.interval_steps = 2, .compare_every = 1};
    opt.seed = 5;
    T t(comm, lay, opt);
    for (int s = 0; s < steps; ++s) {
      auto g = grad(s, comm.rank());
      bytes[comm.rank()].push_back(t.step(g).bytes_sent);
      fc_rank[comm.rank()].push_back(t.compressor().last_rank(2));
      out[comm.rank()].push_back(g);
    }
  });
  for (int r = 1; r < ranks; ++r) {
    CHECK(out[r] == out[0]);  // identical bits on every rank
    CHECK(bytes[r] == bytes[0]);
  }
  // Floats of both allreduces: r (rows + cols) per low-rank layer, plus the raw bias and tiny.
  auto floats_at = [](std::size_t r) { return r * (6 + 27) + r * (40 + 25) + 6 + 4; };
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s);
    CHECK(fc_rank[0][s] == expect_rank[s]);
    CHECK(bytes[0][s] == floats_at(expect_rank[s]) * sizeof(float));
  }
  // A rank-1 step sends about half the floats of a rank-2 step (the raw layers aside).
  CHECK(static_cast<double>(bytes[0][5]) / static_cast<double>(bytes[0][0]) == Approx(0.5).margin(0.03));
}
