// The quantizers' kernels and the fused selection pass of top-k and threshold, compiled for
// AVX2 (run where the processor has it) and for the build's baseline, give the same
// packets, residuals and statistics, bit for bit: the dispatch must never change what is sent.
#include <catch2/catch.hpp>
#include <cstring>

#include "gravac/compress/cast16.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac/compress/threshold.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/core/detail/isa_dispatch.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {

struct outcome {
  std::vector<std::byte> packet;
  std::vector<float> residual;
  compress_stats st;
};

template <class C>
outcome compress_with(detail::kernel_isa isa, const layout& lay, const typename C::options& opt,
                      const std::vector<float>& g, const std::vector<float>& e0, std::uint64_t step) {
  detail::kernel_isa_choice().store(isa);
  C c(lay, opt);
  outcome o;
  o.packet.resize(c.max_packet_bytes());
  std::vector<float> gg = g;
  o.residual = e0;
  auto p = test::params_for(lay, 0.5, step);
  p.ranks = 4;
  const auto bytes = c.compress(host_view(gg), host_view(o.residual), p, o.packet, o.st);
  o.packet.resize(bytes);
  detail::kernel_isa_choice().store(detail::kernel_isa::best);
  return o;
}

template <class C>
void check_same(const typename C::options& opt) {
  const auto lay = test::mixed_layout();
  for (int dist = 0; dist < 4; ++dist) {
    const auto g = test::make_data(lay.numel(), 300 + dist, static_cast<test::distribution>(dist));
    auto e0 = test::make_data(lay.numel(), 400 + dist);
    for (auto& x : e0) x *= 0.25f;
    for (std::uint64_t step : {0, 9}) {
      const auto best = compress_with<C>(detail::kernel_isa::best, lay, opt, g, e0, step);
      const auto base = compress_with<C>(detail::kernel_isa::baseline, lay, opt, g, e0, step);
      INFO("distribution " << dist << " step " << step << " avx2 kernels " << detail::runs_avx2_kernels());
      REQUIRE(best.packet.size() == base.packet.size());
      CHECK(std::memcmp(best.packet.data(), base.packet.data(), best.packet.size()) == 0);
      CHECK(std::memcmp(best.residual.data(), base.residual.data(), best.residual.size() * sizeof(float)) == 0);
      for (std::size_t i = 0; i < lay.size(); ++i) CHECK(best.st.layers[i].kept_sq == base.st.layers[i].kept_sq);
    }
  }
}

}  // namespace

TEST_CASE("the AVX2 and baseline kernels of the quantizers give the same bits", "[quantizers][isa]") {
  // Where the processor has no AVX2 both runs take the baseline path and agree trivially.
  WARN("AVX2 kernels available here: " << (detail::cpu_has_avx2()));
  check_same<qsgd>({.levels = 127, .bucket = 512});
  check_same<qsgd>({.levels = 7, .bucket = 0});
  check_same<terngrad>({});
  check_same<sign>({});
  check_same<cast16>({.format = cast16_format::fp16});
  check_same<cast16>({.format = cast16_format::bf16});
}

// Three steps of one compressor (top-k's later steps collect from the previous threshold,
// its first builds a histogram), with the AVX2 pass and with the baseline one, on a layout
// with a layer large enough for the sampled gain histogram and the threaded pass.
template <class C>
std::vector<outcome> run_steps(detail::kernel_isa isa, const layout& lay, const typename C::options& opt,
                               const std::vector<float>& g, const std::vector<float>& e0) {
  detail::kernel_isa_choice().store(isa);
  C c(lay, opt);
  std::vector<outcome> out;
  std::vector<float> e = e0;
  const std::vector<double> candidates = {0.1, 0.01, 0.001};
  for (std::uint64_t step = 0; step < 3; ++step) {
    outcome o;
    o.packet.resize(c.max_packet_bytes());
    std::vector<float> gg = g;
    auto p = test::params_for(lay, 0.01, step);
    p.gain_candidates = candidates;
    o.packet.resize(c.compress(host_view(gg), host_view(e), p, o.packet, o.st));
    o.residual = e;
    out.push_back(std::move(o));
  }
  detail::kernel_isa_choice().store(detail::kernel_isa::best);
  return out;
}

template <class C>
void check_same_selection(const typename C::options& opt) {
  layout lay = test::mixed_layout();
  lay.add("big", {std::size_t{1} << 20}, layer_kind::dense);
  for (int dist : {0, 1}) {
    const auto g = test::make_data(lay.numel(), 500 + dist, static_cast<test::distribution>(dist));
    auto e0 = test::make_data(lay.numel(), 600 + dist);
    for (auto& x : e0) x *= 0.25f;
    const auto best = run_steps<C>(detail::kernel_isa::best, lay, opt, g, e0);
    const auto base = run_steps<C>(detail::kernel_isa::baseline, lay, opt, g, e0);
    for (std::size_t s = 0; s < best.size(); ++s) {
      INFO("distribution " << dist << " step " << s << " avx2 kernels " << detail::cpu_has_avx2());
      REQUIRE(best[s].packet.size() == base[s].packet.size());
      CHECK(std::memcmp(best[s].packet.data(), base[s].packet.data(), best[s].packet.size()) == 0);
      CHECK(std::memcmp(best[s].residual.data(), base[s].residual.data(), best[s].residual.size() * sizeof(float)) ==
            0);
      for (std::size_t i = 0; i < lay.size(); ++i) {
        CHECK(best[s].st.layers[i].grad_sq == base[s].st.layers[i].grad_sq);
        CHECK(best[s].st.layers[i].input_sq == base[s].st.layers[i].input_sq);
        CHECK(best[s].st.layers[i].kept_sq == base[s].st.layers[i].kept_sq);
      }
      CHECK(best[s].st.candidate_kept_sq == base[s].st.candidate_kept_sq);
    }
  }
}

TEST_CASE("the AVX2 and baseline fused selection passes give the same bits", "[topk][threshold][isa]") {
  WARN("AVX2 kernels available here: " << (detail::cpu_has_avx2()));
  check_same_selection<topk>({});
  check_same_selection<topk>({.threads = 2});
  check_same_selection<topk>({.whole_buffer = true});
  check_same_selection<threshold>({});
}

TEST_CASE("kernel_isa_choice selects the baseline kernels", "[isa]") {
  detail::kernel_isa_choice().store(detail::kernel_isa::baseline);
  CHECK_FALSE(detail::runs_avx2_kernels());
  detail::kernel_isa_choice().store(detail::kernel_isa::best);
  CHECK(detail::runs_avx2_kernels() == detail::cpu_has_avx2());
}
