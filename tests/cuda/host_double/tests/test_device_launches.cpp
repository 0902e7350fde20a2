// Every kernel launch of a device step, counted and failed one at a time (the host double
// of CUDA counts accepted launches and can make any one of them fail: cuda_double::launches,
// cuda_double::fail_launch_in). Double-only: label cuda_double.
//
// - Launches per step against the number of layers (4, 64, 300): flat where the passes go
//   through a segment table (the quantizers' job table, the fused pass over every layer of
//   their gain curve and of AR-Topk's accumulate), and bounded per layer where a
//   compressor still launches per layer (the test fails if that grows).
// - A launch that fails at any point of a queued step: the step throws a gravac::error that
//   names the compressor, nothing is left running on its stream, and the residual holds all
//   of u = g + e (nothing was sent), so the next step loses nothing.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/cuda/adacomp_cuda.hpp"
#include "gravac/cuda/block_scaled_cuda.hpp"
#include "gravac/cuda/cast16_cuda.hpp"
#include "gravac/cuda/qsgd_cuda.hpp"
#include "gravac/cuda/sign_cuda.hpp"
#include "gravac/cuda/threshold_cuda.hpp"
#include "gravac/cuda/topk_cuda.hpp"
#include "gravac/gravac.hpp"
#include "gravac_test_util.hpp"
#include "lone_rank_device_comm.hpp"

namespace {

using gravac::test::same_words;
using gravac::test::to_device;
using gravac::test::to_host;

// L layers of 96 values each.
gravac::layout layers_of(std::size_t L) {
  gravac::layout lay;
  for (std::size_t i = 0; i < L; ++i) lay.add("l" + std::to_string(i), {96}, gravac::layer_kind::dense);
  return lay;
}

// The launches of one compress() of Dev on \p lay (after a first step, which may size its
// buffers), at 5% with \p gains gain candidates; with \p raw_every, every raw_every-th
// layer is sent raw.
template <class Dev, class... Options>
std::uint64_t launches_per_step(const gravac::layout& lay, bool gains, std::size_t raw_every,
                                const Options&... options) {
  Dev dev(lay, options...);
  gravac::device_buffer<float> e(lay.numel());
  gravac::device_buffer<std::byte> packet(dev.max_packet_bytes());
  auto p = gravac::test::params_for(lay, 0.05);
  if (gains) p.gain_candidates = {0.1, 0.01};
  for (std::size_t i = 0; raw_every > 0 && i < lay.size(); i += raw_every) p.kept_fraction[i] = 1.0;
  std::uint64_t n = 0;
  for (std::uint64_t s = 0; s < 2; ++s) {
    auto g = to_device(gravac::test::make_data(lay.numel(), 5 + s));
    gravac::compress_stats st;
    const std::uint64_t before = cuda_double::launches();
    (void)dev.compress(gravac::device_view(g), gravac::device_view(e), p, packet.span(), st);
    n = cuda_double::launches() - before;
  }
  return n;
}

// Launches per step at 4, 64 and 300 layers; prints them.
template <class Dev, class... Options>
std::vector<std::uint64_t> launch_counts(const char* name, bool gains, std::size_t raw_every,
                                         const Options&... options) {
  std::vector<std::uint64_t> n;
  for (std::size_t L : {4, 64, 300}) n.push_back(launches_per_step<Dev>(layers_of(L), gains, raw_every, options...));
  WARN(name << (gains ? " with a gain curve" : "") << (raw_every ? ", a third of the layers raw" : "")
            << ": launches per step at 4 / 64 / 300 layers: " << n[0] << " / " << n[1] << " / " << n[2]);
  return n;
}

// The layout and step of the failure sweeps: small layers, a large one, one sent raw,
// with or without a gain curve.
gravac::layout sweep_layout() {
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {3000}, gravac::layer_kind::dense);
  return lay;
}
gravac::step_params sweep_params(const gravac::layout& lay, bool gains) {
  auto p = gravac::test::params_for(lay, 0.05);
  p.kept_fraction[1] = 1.0;  // a layer sent raw
  if (gains) p.gain_candidates = {0.1, 0.01};
  return p;
}

// After a failed step: e = g + e_before bit for bit (nothing sent, nothing lost).
void require_residual_is_u(const gravac::device_buffer<float>& e, const std::vector<float>& g,
                           const std::vector<float>& e_before) {
  std::vector<float> u(g.size());
  for (std::size_t j = 0; j < u.size(); ++j) u[j] = g[j] + e_before[j];
  const auto e_after = to_host(e.data(), u.size());
  REQUIRE(same_words(e_after.data(), u.data(), u.size() * sizeof(float), false));
}

// Steps one Dev on \p lay with the launch n of the step made to fail, for n = 0, 1, ...
// until a step runs through. Each failed step must throw a gravac::error that names the
// compressor and says the residual holds u, and must leave e = g + e_before bit for bit
// (nothing sent, nothing lost); the clean step after them must give the packet and the
// residual a fresh compressor gives on the same g and e (no state left behind).
template <class Dev, class... Options>
void fail_every_launch(const char* name, bool gains, const Options&... options) {
  const auto lay = sweep_layout();
  const auto p = sweep_params(lay, gains);
  const std::size_t numel = lay.numel();
  Dev dev(lay, options...);
  gravac::device_buffer<float> e(numel);
  gravac::device_buffer<std::byte> packet(dev.max_packet_bytes());
  gravac::compress_stats st;
  {  // a first step: a residual that is not zero
    auto g = to_device(gravac::test::make_data(numel, 3));
    (void)dev.compress(gravac::device_view(g), gravac::device_view(e), p, packet.span(), st);
  }
  long long failed = 0;
  for (long long n = 0;; ++n) {
    INFO(name << (gains ? " with a gain curve" : "") << ": launch " << n << " of the step fails");
    const auto g_host = gravac::test::make_data(numel, 100 + static_cast<std::uint64_t>(n));
    auto g = to_device(g_host);
    const auto e_before = to_host(e.data(), numel);
    bool threw = false;
    cuda_double::fail_launch_in(n);
    try {
      (void)dev.compress(gravac::device_view(g), gravac::device_view(e), p, packet.span(), st);
    } catch (const gravac::error& err) {
      threw = true;
      const std::string what = err.what();
      INFO(what);
      CHECK(err.code() == gravac::status::backend_failure);
      CHECK(err.engine() == gravac::backend::cuda);
      CHECK(what.find(std::string(name) + "::compress") != std::string::npos);
      CHECK(what.find("the residual holds u = g + e") != std::string::npos);
      CHECK(what.find("cudaErrorLaunchOutOfResources") != std::string::npos);
    }
    cuda_double::fail_launch_in(-1);
    if (!threw) break;  // the step has n launches: this one ran through
    ++failed;
    require_residual_is_u(e, g_host, e_before);
  }
  WARN(name << (gains ? " with a gain curve" : "") << ": failed at each of its " << failed << " launches");
  CHECK(failed > 2);
  // A clean step against a fresh compressor's on the same g and e.
  Dev fresh(lay, options...);
  const auto e_now = to_host(e.data(), numel);
  auto e2 = to_device(e_now);
  gravac::device_buffer<std::byte> packet2(fresh.max_packet_bytes());
  const auto g_host = gravac::test::make_data(numel, 999);
  auto g1 = to_device(g_host), g2 = to_device(g_host);
  gravac::compress_stats st2;
  const auto b1 = dev.compress(gravac::device_view(g1), gravac::device_view(e), p, packet.span(), st);
  const auto b2 = fresh.compress(gravac::device_view(g2), gravac::device_view(e2), p, packet2.span(), st2);
  REQUIRE(b1 == b2);
  const auto p1 = to_host(packet.data(), b1), p2 = to_host(packet2.data(), b2);
  REQUIRE(same_words(p1.data(), p2.data(), b1, false));
  const auto r1 = to_host(e.data(), numel), r2 = to_host(e2.data(), numel);
  REQUIRE(same_words(r1.data(), r2.data(), numel * sizeof(float), false));
}

// AR-Topk's device passes (allreduce_compatible with topk_cuda on one rank) with the
// launch n of a step made to fail, for n = 0, 1, ... until a step runs through. A failure
// before anything was summed must leave e = u; one after (the averaged gradient not yet
// written) says so, and return_sent() then gives e = u. The clean step after them must
// equal a fresh collective's.
void ar_topk_fail_every_launch(bool gains) {
  const auto lay = sweep_layout();
  const auto p = sweep_params(lay, gains);
  const std::size_t numel = lay.numel();
  gravac::allreduce_compatible k(lay);
  gravac::topk_cuda c(lay);
  k.prepare(c);
  gravac::test::lone_rank_device_comm comm;
  gravac::device_buffer<float> e(numel);
  gravac::compress_stats st;
  gravac::step_report rep;
  auto step = [&](gravac::allreduce_compatible& kk, gravac::topk_cuda& cc, gravac::device_buffer<float>& g,
                  gravac::device_buffer<float>& r, bool first) {
    gravac::step_buffers<gravac::cuda_space> b{gravac::device_view(g), gravac::device_view(r), first};
    kk.aggregate(cc, comm, b, p, st, rep);
  };
  {
    auto g = to_device(gravac::test::make_data(numel, 3));
    step(k, c, g, e, true);
  }
  long long failed = 0;
  for (long long n = 0;; ++n) {
    INFO("allreduce_compatible" << (gains ? " with a gain curve" : "") << ": launch " << n << " of the step fails");
    const auto g_host = gravac::test::make_data(numel, 200 + static_cast<std::uint64_t>(n));
    auto g = to_device(g_host);
    const auto e_before = to_host(e.data(), numel);
    bool threw = false;
    cuda_double::fail_launch_in(n);
    try {
      step(k, c, g, e, false);
    } catch (const gravac::error& err) {
      threw = true;
      const std::string what = err.what();
      INFO(what);
      CHECK(err.code() == gravac::status::backend_failure);
      CHECK(what.find("allreduce_compatible") != std::string::npos);
      CHECK(what.find("cudaErrorLaunchOutOfResources") != std::string::npos);
      if (what.find("return_sent()") != std::string::npos) {
        gravac::step_buffers<gravac::cuda_space> b{gravac::device_view(g), gravac::device_view(e), false};
        k.return_sent(c, b);
      } else {
        CHECK(what.find("the residual holds u = g + e") != std::string::npos);
      }
    }
    cuda_double::fail_launch_in(-1);
    if (!threw) break;
    ++failed;
    require_residual_is_u(e, g_host, e_before);
  }
  WARN("allreduce_compatible" << (gains ? " with a gain curve" : "") << ": failed at each of its " << failed
                              << " launches");
  CHECK(failed > 2);
  gravac::allreduce_compatible k2(lay);
  gravac::topk_cuda c2(lay);
  k2.prepare(c2);
  auto e2 = to_device(to_host(e.data(), numel));
  const auto g_host = gravac::test::make_data(numel, 999);
  auto g1 = to_device(g_host), g2 = to_device(g_host);
  step(k, c, g1, e, false);
  step(k2, c2, g2, e2, false);
  const auto a1 = to_host(g1.data(), numel), a2 = to_host(g2.data(), numel);
  REQUIRE(same_words(a1.data(), a2.data(), numel * sizeof(float), false));
  const auto r1 = to_host(e.data(), numel), r2 = to_host(e2.data(), numel);
  REQUIRE(same_words(r1.data(), r2.data(), numel * sizeof(float), false));
}

}  // namespace

// threshold_cuda options under which the estimate of a layer of 96 values at 5% samples it
// (its refining passes run).
gravac::threshold_cuda_options sampled_estimate() {
  gravac::threshold_cuda_options o;
  o.expected_hits = 1;
  o.run_length = 1;
  return o;
}

TEST_CASE("launches per step: flat in the number of layers for the job tables, gain curve and raw layers included") {
  for (const auto& n :
       {launch_counts<gravac::qsgd_cuda>("qsgd_cuda", false, 0, gravac::qsgd_cuda_options{}),
        launch_counts<gravac::cast16_cuda>("cast16_cuda", false, 0, gravac::cast16_cuda_options{}),
        launch_counts<gravac::mxfp8_cuda>("mxfp8_cuda", false, 0, gravac::mxfp8_cuda_options{}),
        launch_counts<gravac::qsgd_cuda>("qsgd_cuda", true, 0, gravac::qsgd_cuda_options{}),
        launch_counts<gravac::topk_cuda>("topk_cuda", false, 0), launch_counts<gravac::topk_cuda>("topk_cuda", true, 0),
        launch_counts<gravac::topk_cuda>("topk_cuda", true, 3),
        launch_counts<gravac::threshold_cuda>("threshold_cuda", false, 0),
        launch_counts<gravac::threshold_cuda>("threshold_cuda", true, 3),
        launch_counts<gravac::threshold_cuda>("threshold_cuda, sampled estimate", false, 0, sampled_estimate()),
        launch_counts<gravac::adacomp_cuda>("adacomp_cuda", false, 0),
        launch_counts<gravac::adacomp_cuda>("adacomp_cuda", true, 3)}) {
    CHECK(n[1] == n[0]);
    CHECK(n[2] == n[0]);
  }
}

// The launches of one AR-Topk step (allreduce_compatible with topk_cuda, one rank) on L
// layers of 96 values at 5%, after a first step.
std::uint64_t ar_topk_launches_per_step(std::size_t L) {
  const auto lay = layers_of(L);
  gravac::allreduce_compatible k(lay);
  gravac::topk_cuda c(lay);
  k.prepare(c);
  gravac::test::lone_rank_device_comm comm;
  gravac::device_buffer<float> e(lay.numel());
  gravac::compress_stats st;
  gravac::step_report rep;
  const auto p = gravac::test::params_for(lay, 0.05);
  std::uint64_t n = 0;
  for (std::uint64_t s = 0; s < 2; ++s) {
    auto g = to_device(gravac::test::make_data(lay.numel(), 5 + s));
    gravac::step_buffers<gravac::cuda_space> b{gravac::device_view(g), gravac::device_view(e), s == 0};
    const std::uint64_t before = cuda_double::launches();
    k.aggregate(c, comm, b, p, st, rep);
    n = cuda_double::launches() - before;
  }
  return n;
}

TEST_CASE("launches per step: AR-Topk's step is flat in the number of layers, its index selection included") {
  // Accumulate, validation, gather and scatter are one launch each over every layer, and the
  // root's index selection one set of launches over the layers it lists (select_jobs'
  // queue_lists). Before, the selection added 6 launches a layer, gather and scatter 2 more.
  std::uint64_t n[3];
  const std::size_t layers[3] = {4, 64, 300};
  for (int i = 0; i < 3; ++i) n[i] = ar_topk_launches_per_step(layers[i]);
  WARN("allreduce_compatible: launches per step at 4 / 64 / 300 layers: " << n[0] << " / " << n[1] << " / " << n[2]);
  CHECK(n[1] == n[0]);
  CHECK(n[2] == n[0]);
}

TEST_CASE("launches per step: AR-Topk's accumulate is one launch at any number of layers") {
  for (std::size_t L : {4, 64, 300}) {
    INFO(L << " layers");
    const auto lay = layers_of(L);
    gravac::topk_cuda c(lay);
    gravac::detail::ar_topk_device_passes<gravac::cuda_space> passes;
    passes.prepare(c, lay);
    auto g = to_device(gravac::test::make_data(lay.numel(), 5));
    gravac::device_buffer<float> e(lay.numel());
    auto p = gravac::test::params_for(lay, 0.05);
    p.gain_candidates = {0.1, 0.01};
    gravac::compress_stats st;
    st.layers.resize(L);
    st.candidate_kept_sq.resize(p.gain_candidates.size());
    const std::uint64_t before = cuda_double::launches();
    (void)passes.accumulate(lay, gravac::device_view(g), gravac::device_view(e), p, st);
    CHECK(cuda_double::launches() - before == 1);
    CHECK(st.input_sq() > 0);
  }
}

TEST_CASE("a device step that fails at any launch leaves every residual at u = g + e and the compressor usable") {
  for (bool gains : {false, true}) {
    fail_every_launch<gravac::topk_cuda>("topk_cuda", gains);
    gravac::topk_cuda_options whole;
    whole.whole_buffer = true;
    fail_every_launch<gravac::topk_cuda>("topk_cuda", gains, whole);
    fail_every_launch<gravac::threshold_cuda>("threshold_cuda", gains);
    fail_every_launch<gravac::adacomp_cuda>("adacomp_cuda", gains);
    fail_every_launch<gravac::qsgd_cuda>("qsgd_cuda", gains, gravac::qsgd_cuda_options{});
    fail_every_launch<gravac::sign_cuda>("sign_cuda", gains, gravac::sign_cuda_options{});
    fail_every_launch<gravac::cast16_cuda>("cast16_cuda", gains, gravac::cast16_cuda_options{});
    fail_every_launch<gravac::mxfp8_cuda>("mxfp8_cuda", gains, gravac::mxfp8_cuda_options{});
  }
}

TEST_CASE("AR-Topk's device passes: a step that fails at any launch loses nothing and leaves them usable") {
  ar_topk_fail_every_launch(false);
  ar_topk_fail_every_launch(true);
}
