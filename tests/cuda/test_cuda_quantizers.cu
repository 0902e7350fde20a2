// The device quantizers (qsgd_cuda, terngrad_cuda, sign_cuda, cast16_cuda, mxfp8_cuda,
// mxfp4_cuda, nvfp4_cuda) against their host compressors on the same data: packets equal byte for byte (scales, random
// draws, codes, padding), residuals equal bit for bit, statistics close; device validation agrees with the host's on
// good and corrupted packets, and device decoding equals the host's bit for bit. Sizes 1, 7, 1000, 2^16 + 3, 2^20;
// Gaussian, heavy-tailed and adversarial data (all-zero layers, huge values, subnormals, NaN and infinity). The device
// trainer's on_non_finite against the host trainer's, each action on a NaN and on a finite g whose g + e overflows.
// Skipped without a GPU.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_test_util.hpp"
#include "gravac/collective/allgather.hpp"
#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/comm/thread_communicator.hpp"
#include "gravac/compress/block_scaled.hpp"
#include "gravac/compress/cast16.hpp"
#include "gravac/compress/qsgd.hpp"
#include "gravac/compress/sign.hpp"
#include "gravac/compress/terngrad.hpp"
#include "gravac/cuda/block_scaled_cuda.hpp"
#include "gravac/cuda/cast16_cuda.hpp"
#include "gravac/cuda/qsgd_cuda.hpp"
#include "gravac/cuda/sign_cuda.hpp"
#include "gravac/cuda/terngrad_cuda.hpp"
#include "gravac/policy/fixed_policy.hpp"
#include "gravac/trainer.hpp"
#include "gravac_test_util.hpp"
#include "pairwise_cases.hpp"

// The device quantizers plug into the collectives the device top-k uses.
static_assert(gravac::CollectiveAccepts<gravac::allgather, gravac::qsgd_cuda>);
static_assert(gravac::CollectiveAccepts<gravac::allgather, gravac::cast16_cuda>);
static_assert(gravac::CollectiveAccepts<gravac::dense_allreduce, gravac::sign_cuda>);
static_assert(gravac::CollectiveAccepts<gravac::dense_allreduce, gravac::terngrad_cuda>);
static_assert(gravac::CollectiveAccepts<gravac::allgather, gravac::mxfp8_cuda>);
static_assert(gravac::CollectiveAccepts<gravac::allgather, gravac::nvfp4_cuda>);

namespace {

using gravac::test::distribution;
using gravac::test::same_words;
using gravac::test::to_device;
using gravac::test::to_host;

// Index of the first differing 4-byte word (for the failure message).
std::size_t first_difference(const void* a, const void* b, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i)
    if (static_cast<const unsigned char*>(a)[i] != static_cast<const unsigned char*>(b)[i]) return i;
  return bytes;
}

bool same_double(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// One layout, one host and one device compressor with their residuals, stepped together.
template <class Host, class Dev>
struct pair_run : gravac::test::compressor_pair<Host, Dev> {
  using pair_base = gravac::test::compressor_pair<Host, Dev>;
  using pair_base::lay, pair_base::host, pair_base::dev, pair_base::e_host, pair_base::e_dev, pair_base::packet_host,
      pair_base::packet_dev, pair_base::bytes;
  bool last_finite = true;  // the last step's u was finite

  // The device residual holds at least one element, even for an empty layout.
  pair_run(gravac::layout l, const typename Host::options& ho, const typename Dev::options& dopt)
      : pair_base(std::move(l), ho, dopt, 1) {
    REQUIRE(dev.max_packet_bytes() == host.max_packet_bytes());
  }

  // One step on both: packets and residuals identical, statistics close, and non-finite
  // u reported exactly when u = g + e holds a NaN or infinity.
  void step(const std::vector<float>& g, const gravac::step_params& p) {
    std::vector<float> u(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) u[i] = g[i] + e_host[i];
    const bool finite = all_finite(u);
    std::vector<float> gh = g;
    gravac::compress_stats sh, sd;
    const auto bh = host.compress(gravac::host_view(gh), gravac::host_view(e_host), p, packet_host, sh);
    auto gd = to_device(g, 1);
    const auto bd =
        dev.compress(gravac::grad_view<gravac::cuda_space>(gd.data(), lay.numel()),
                     gravac::grad_view<gravac::cuda_space>(e_dev.data(), lay.numel()), p, packet_dev.span(), sd);
    REQUIRE(bd == bh);
    bytes = bd;
    const auto pd = to_host(packet_dev.data(), bd);
    INFO("first differing packet byte: " << first_difference(pd.data(), packet_host.data(), bh) << " of " << bh);
    REQUIRE(same_words(pd.data(), packet_host.data(), bh, !finite));
    const auto ed = to_host(e_dev.data(), lay.numel());
    INFO("first differing residual byte: " << first_difference(ed.data(), e_host.data(), ed.size() * 4));
    // Finite u (even near the float maximum, where float squares and sums overflow) gives
    // a finite residual and a valid packet on both; NaN payloads may differ otherwise.
    REQUIRE(same_words(ed.data(), e_host.data(), ed.size() * sizeof(float), !finite));
    REQUIRE(sd.non_finite == !finite);
    last_finite = finite;
    if (finite) {
      REQUIRE(all_finite(e_host));
      const std::vector<std::byte> pk(packet_host.begin(), packet_host.begin() + static_cast<std::ptrdiff_t>(bh));
      REQUIRE(host.validate(pk));
      REQUIRE(dev.validate(packet_dev.span().first(bd)));
    }
    for (std::size_t i = 0; i < lay.size(); ++i) {
      CHECK(sd.layers[i].kept == sh.layers[i].kept);
      // Statistics of finite u: finite, and the same bits on both (the one order of
      // core/detail/square_sum.hpp: the norms over g and u, the kept energy over the decoded
      // values). A NaN's payload may differ.
      if (!finite) continue;
      INFO("layer " << i << std::setprecision(17) << ": dev " << sd.layers[i].grad_sq << " / " << sd.layers[i].input_sq
                    << " / " << sd.layers[i].kept_sq << ", host " << sh.layers[i].grad_sq << " / "
                    << sh.layers[i].input_sq << " / " << sh.layers[i].kept_sq);
      CHECK(std::isfinite(sd.layers[i].input_sq));
      CHECK(same_double(sd.layers[i].grad_sq, sh.layers[i].grad_sq));
      CHECK(same_double(sd.layers[i].input_sq, sh.layers[i].input_sq));
      CHECK(same_double(sd.layers[i].kept_sq, sh.layers[i].kept_sq));
    }
    // The gain curve: the same histogram (every value of u) read the same way on both
    // (gravac/stats/gain_curve.hpp, gravac/cuda/detail/gain_bins.hpp): equal bits.
    for (std::size_t c = 0; c < p.gain_candidates.size(); ++c) {
      INFO("gain candidate " << c << std::setprecision(17) << ": dev " << sd.candidate_kept_sq[c] << " host "
                             << sh.candidate_kept_sq[c]);
      CHECK(std::memcmp(&sd.candidate_kept_sq[c], &sh.candidate_kept_sq[c], sizeof(double)) == 0);
    }
  }

  // Decoding the step's packet: device validation passes and the sum equals the host's bit for bit.
  void check_decode(float scale) {
    const std::vector<std::byte> good(packet_host.begin(), packet_host.begin() + static_cast<std::ptrdiff_t>(bytes));
    REQUIRE(host.validate(good));
    REQUIRE(dev.validate(packet_dev.span().first(bytes)));
    auto base = gravac::test::make_data(lay.numel(), 99);
    std::vector<float> out_h = base;
    host.decompress_add(good, gravac::host_view(out_h), scale);
    auto out_d = to_device(base, 1);
    dev.decompress_add(packet_dev.span().first(bytes), gravac::grad_view<gravac::cuda_space>(out_d.data(), lay.numel()),
                       scale);
    dev.synchronize();
    const auto back = to_host(out_d.data(), lay.numel());
    REQUIRE(same_words(back.data(), out_h.data(), back.size() * sizeof(float), false));
  }
};

template <class Host, class Dev>
struct typed_pair : pair_run<Host, Dev> {
  using host_opt_t = typename Host::options;
  using dev_opt_t = typename Dev::options;
  using dev_type = Dev;
  using pair_run<Host, Dev>::pair_run;
};

#if defined(GRAVAC_CUDA_HOST_DOUBLE)
// On the host double 2^20 shrinks to 2^16 (device_size), the size before it: it would
// repeat that size's paths at the cost of half the suite's time.
const std::size_t sizes[] = {1, 7, 1000, (1u << 16) + 3};
#else
const std::size_t sizes[] = {1, 7, 1000, (1u << 16) + 3, std::size_t{1} << 20};
#endif

// Adversarial data of n values: \p kind 0 all zero, 1 huge (squares overflow float), 2
// near the float maximum (sums overflow), 3 subnormal and tiny, 4 NaN and infinities among
// Gaussian values, 5 just past the float squares' range (2e19), 6 tiny mixed with a few
// values near the float maximum, 7 every value the float maximum (a norm of sqrt(n)
// times it), 8 tiny (1e-30: squares underflow).
constexpr int adversarial_kinds = 9;
std::vector<float> adversarial(std::size_t n, int kind, std::uint64_t seed) {
  auto v = gravac::test::make_data(n, seed);
  for (std::size_t i = 0; i < n; ++i) {
    switch (kind) {
      case 0:
        v[i] = 0.0f;
        break;
      case 1:
        v[i] *= 1e30f;
        break;
      case 2:
        v[i] = (i % 2 ? -3.0e38f : 3.1e38f) * (0.9f + 0.1f * std::fabs(std::tanh(v[i])));
        break;
      case 3:
        v[i] = v[i] * (i % 3 ? 1e-40f : 1e-20f);
        break;
      case 5:
        v[i] *= 2e19f;
        break;
      case 6:
        v[i] = i % 37 == 3 ? 3e38f : i % 101 == 7 ? -FLT_MAX : v[i] * (i % 2 ? 1e-42f : 1e-30f);
        break;
      case 7:
        v[i] = FLT_MAX;
        break;
      case 8:
        v[i] *= 1e-30f;
        break;
      default:
        if (i % 97 == 5) v[i] = std::numeric_limits<float>::quiet_NaN();
        if (i % 211 == 7) v[i] = std::numeric_limits<float>::infinity();
        if (i % 307 == 11) v[i] = -std::numeric_limits<float>::infinity();
    }
  }
  return v;
}

// Steps a pair at one size: Gaussian and Laplace data, then each adversarial kind.
template <class Pair>
void sweep_at(const typename Pair::host_opt_t& ho, const typename Pair::dev_opt_t& dopt, std::size_t n) {
  INFO("n = " << n);
  Pair r(gravac::layout::flat(n), ho, dopt);
  for (std::uint64_t s = 0; s < 2; ++s) {
    r.step(gravac::test::make_data(n, 11 + s, s ? distribution::laplace : distribution::gaussian),
           gravac::test::params_for(r.lay, 0.1, s));
  }
  r.check_decode(0.25f);
  for (int kind = 0; kind < adversarial_kinds; ++kind) {
    INFO("adversarial kind " << kind);
    Pair a(gravac::layout::flat(n), ho, dopt);
    a.step(adversarial(n, kind, 21 + kind), gravac::test::params_for(a.lay, 0.1, 3));
    if (kind != 4) a.step(adversarial(n, kind, 31 + kind), gravac::test::params_for(a.lay, 0.1, 4));
    if (a.last_finite) a.check_decode(0.25f);
  }
}

// Steps a pair over every size.
template <class Pair>
void sweep(const typename Pair::host_opt_t& ho, const typename Pair::dev_opt_t& dopt) {
  for (auto n : sizes) sweep_at<Pair>(ho, dopt, n);
}

// The block-scaled formats: 0 MXFP8 E4M3, 1 MXFP8 E5M2, 2 MXFP4, 3 NVFP4.
constexpr int block_formats = 4;
const char* const block_format_names[] = {"mxfp8 e4m3", "mxfp8 e5m2", "mxfp4", "nvfp4"};

// Calls fn(std::type_identity<pair type>, host options, device options) for block format
// \p format with rounding \p r and error feedback \p ef.
template <class Fn>
void with_block_format(int format, gravac::block_rounding r, bool ef, Fn&& fn) {
  using gravac::mxfp8_element;
  switch (format) {
    case 0:
    case 1: {
      const auto el = format == 0 ? mxfp8_element::e4m3 : mxfp8_element::e5m2;
      fn(std::type_identity<typed_pair<gravac::mxfp8, gravac::mxfp8_cuda>>{},
         gravac::mxfp8_options{.element = el, .rounding = r, .error_feedback = ef},
         gravac::mxfp8_cuda_options{.element = el, .rounding = r, .error_feedback = ef});
      break;
    }
    case 2:
      fn(std::type_identity<typed_pair<gravac::mxfp4, gravac::mxfp4_cuda>>{},
         gravac::mxfp4_options{.rounding = r, .error_feedback = ef},
         gravac::mxfp4_cuda_options{.rounding = r, .error_feedback = ef});
      break;
    default:
      fn(std::type_identity<typed_pair<gravac::nvfp4, gravac::nvfp4_cuda>>{},
         gravac::nvfp4_options{.rounding = r, .error_feedback = ef},
         gravac::nvfp4_cuda_options{.rounding = r, .error_feedback = ef});
      break;
  }
}

}  // namespace

TEST_CASE("qsgd_cuda equals qsgd: every code width and bucket size, Gaussian and adversarial data") {
  using P = typed_pair<gravac::qsgd, gravac::qsgd_cuda>;
  const std::uint32_t levels[] = {1, 7, 127, 1000};    // codes of 2, 4, 8 and 16 bits
  const std::uint32_t buckets[] = {512, 64, 0, 2048};  // 0: one norm per layer; 2048: two chunks per bucket
  constexpr int n_sizes = static_cast<int>(std::size(sizes));
  // Code width x bucket x size: every case on a GPU, a pairwise cover on the host double.
  for (const auto& c : gravac::test::device_sweep_cases({4, 4, n_sizes})) {
    const auto lv = levels[c[0]];
    const auto b = buckets[c[1]];
    const auto n = sizes[c[2]];
    if (n > 70000 && lv != 127 && b != 512) continue;  // the largest sizes: 8-bit codes or 512 buckets
    INFO("levels = " << lv << ", bucket = " << b);
    sweep_at<P>({.levels = lv, .bucket = b}, {.levels = lv, .bucket = b}, n);
  }
}

TEST_CASE("terngrad_cuda equals terngrad: bucket sizes, Gaussian and adversarial data") {
  using P = typed_pair<gravac::terngrad, gravac::terngrad_cuda>;
  for (std::uint32_t b : {512u, 64u, 0u, 3072u}) {
    INFO("bucket = " << b);
    sweep<P>({.bucket = b}, {.bucket = b});
  }
}

TEST_CASE("sign_cuda equals sign: Gaussian and adversarial data") {
  using P = typed_pair<gravac::sign, gravac::sign_cuda>;
  sweep<P>({}, {});
}

TEST_CASE("cast16_cuda equals cast16: fp16 and bf16, one and several ranks") {
  using P = typed_pair<gravac::cast16, gravac::cast16_cuda>;
  for (auto f : {gravac::cast16_format::fp16, gravac::cast16_format::bf16}) {
    INFO("format = " << static_cast<int>(f));
    sweep<P>({.format = f}, {.format = f});
    for (int ranks : {3, 8}) {
      P r(gravac::layout::flat(70001), {.format = f}, {.format = f});
      auto p = gravac::test::params_for(r.lay, 0.1);
      p.ranks = ranks;
      r.step(gravac::test::make_data(70001, 5), p);
      r.step(adversarial(70001, 1, 6), p);  // clamped to the format's maximum
      r.check_decode(1.0f / static_cast<float>(ranks));
      // Near the float maximum: bf16's maximum times N overflows, so the clamp is lower.
      P m(gravac::layout::flat(70001), {.format = f}, {.format = f});
      m.step(adversarial(70001, 7, 8), p);
      m.check_decode(1.0f / static_cast<float>(ranks));
      P q(gravac::layout::flat(70001), {.format = f}, {.format = f});
      q.step(adversarial(70001, 2, 9), p);
      q.check_decode(1.0f / static_cast<float>(ranks));
    }
  }
}

TEST_CASE("mxfp8_cuda, mxfp4_cuda and nvfp4_cuda equal the host's: every format, rounding, error feedback and size",
          "[block_scaled]") {
  constexpr int n_sizes = static_cast<int>(std::size(sizes));
  // Format x rounding x error feedback x size: every case on a GPU, a pairwise cover on the
  // host double. Sizes 7, 1000 and 2^16 + 3 end in a partial block of 16 and of 32.
  for (const auto& c : gravac::test::device_sweep_cases({block_formats, 2, 2, n_sizes})) {
    const auto r = c[1] ? gravac::block_rounding::stochastic : gravac::block_rounding::nearest_even;
    const bool ef = c[2] == 0;
    if (sizes[c[3]] > 70000 && (c[1] != 0 || !ef)) continue;  // the largest size: nearest even with feedback
    INFO(block_format_names[c[0]] << (c[1] ? ", stochastic" : ", nearest even")
                                  << (ef ? ", error feedback" : ", no error feedback"));
    with_block_format(c[0], r, ef, [&](auto pair, const auto& ho, const auto& dopt) {
      sweep_at<typename decltype(pair)::type>(ho, dopt, sizes[c[3]]);
    });
  }
}

TEST_CASE("device quantizers: mixed layout with dense layers, empty layers and the gain curve") {
  auto lay = gravac::test::mixed_layout();
  lay.add("zero", {4096}, gravac::layer_kind::dense);
  lay.add("big", {300001}, gravac::layer_kind::dense);
  lay.add("second big", {50001}, gravac::layer_kind::dense);  // two layers of many blocks per pass
  const double candidates[] = {0.5, 0.1, 0.01};
  auto run = [&](auto& r) {
    for (std::uint64_t s = 0; s < 3; ++s) {
      auto p = gravac::test::params_for(r.lay, 0.1, s, 17);
      p.kept_fraction[1] = 1.0;              // a layer sent dense
      if (s == 1) p.kept_fraction[6] = 1.0;  // the big one dense on one step
      if (s == 2) p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
      auto g = gravac::test::make_data(r.lay.numel(), 71 + s);
      for (std::size_t j = 0; j < r.lay[5].numel; ++j) g[r.lay[5].offset + j] = 0.0f;
      r.step(g, p);
      r.check_decode(0.5f);
    }
  };
  {
    typed_pair<gravac::qsgd, gravac::qsgd_cuda> r(lay, {.levels = 15, .bucket = 128}, {.levels = 15, .bucket = 128});
    run(r);
  }
  {
    typed_pair<gravac::terngrad, gravac::terngrad_cuda> r(lay, {}, {});
    run(r);
  }
  {
    typed_pair<gravac::sign, gravac::sign_cuda> r(lay, {}, {});
    run(r);
  }
  {
    typed_pair<gravac::cast16, gravac::cast16_cuda> r(lay, {.format = gravac::cast16_format::bf16},
                                                      {.format = gravac::cast16_format::bf16});
    run(r);
  }
  for (int f = 0; f < block_formats; ++f) {
    INFO(block_format_names[f]);
    const auto rounding = f % 2 ? gravac::block_rounding::stochastic : gravac::block_rounding::nearest_even;
    with_block_format(f, rounding, f != 2, [&](auto pair, const auto& ho, const auto& dopt) {
      typename decltype(pair)::type r(lay, ho, dopt);
      run(r);
    });
  }
}

TEST_CASE("device quantizers: same data, same statistics bit for bit, whatever the block order", "[same_bits]") {
  // One family of each statistics path: QSGD's buckets (chunk sums, code pass), NVFP4's
  // layer amax and block codes, MXFP8's; the other families share their passes' sums.
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {100001}, gravac::layer_kind::dense);
  auto p = gravac::test::params_for(lay, 0.1, 0, 17);
  p.kept_fraction[1] = 1.0;  // a layer sent dense
  const double candidates[] = {0.5, 0.1, 0.01};
  p.gain_candidates.assign(std::begin(candidates), std::end(candidates));
  auto run = [&](auto& t) {
    for (std::uint64_t s = 0; s < 2; ++s) t.step(gravac::test::make_data(lay.numel(), 81 + s), p);
  };
  SECTION("qsgd_cuda") {
    gravac::test::device_twins<gravac::qsgd_cuda> t(lay, gravac::qsgd_cuda_options{.levels = 15, .bucket = 128});
    run(t);
  }
  SECTION("block-scaled formats") {
    for (int f : {0, 3}) {
      INFO(block_format_names[f]);
      with_block_format(f, gravac::block_rounding::stochastic, true, [&](auto pair, const auto&, const auto& dopt) {
        using dev_t = typename decltype(pair)::type::dev_type;
        gravac::test::device_twins<dev_t> t(lay, dopt);
        run(t);
      });
    }
  }
}

TEST_CASE("fused_jobs_pass over every layer equals select_fused_pass launched per layer, bit for bit", "[same_bits]") {
  // One launch over every layer (the quantizers' gain pass, AR-Topk's accumulate) against
  // the per-layer launches it replaced: the same u in e, the same norms per layer, the same
  // gain curve (each layer's kept energies added in layer order).
  namespace cd = gravac::detail;
  const std::vector<std::size_t> sizes = {5000, 100, 0, 1, 3, 300001, 4096, 77};
  const std::vector<double> fractions = {0.5, 0.1, 0.01};
  gravac::layout lay;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    lay.add("l" + std::to_string(i), {sizes[i]}, gravac::layer_kind::dense);
  const std::size_t L = lay.size(), numel = lay.numel();
  // The first layer's energy dwarfs the others' (values 1e7 times larger): added first, it
  // absorbs their low bits, so any other order of the layers gives other bits.
  auto g_host = gravac::test::make_data(numel, 91);
  auto e_host = gravac::test::make_data(numel, 92);
  for (std::size_t i = 0; i < sizes[0]; ++i) {
    g_host[i] *= 1e7f;
    e_host[i] *= 1e7f;
  }
  const auto g = to_device(g_host);
  const auto lc = cd::launch_config::current_device();
  const cudaStream_t s = nullptr;

  // The reference: one select_fused_pass per non-empty layer, in layer order.
  auto e_ref = to_device(e_host);
  const auto zero = to_device(std::vector<std::uint32_t>(1, 0));
  gravac::device_buffer<cd::select_state> st_ref(L);
  gravac::device_buffer<cd::layer_sums> sums_ref(L);
  gravac::device_buffer<std::uint32_t> hist_ref(cd::max_bins);
  gravac::device_buffer<unsigned long long> sq_ref(cd::max_bins);
  gravac::device_buffer<double> out_ref(cd::max_gain_candidates);
  cd::block_slots_buffer slots(static_cast<unsigned long long>(lc.max_stride_grid()), {});
  for (std::size_t i = 0; i < L; ++i) {
    const auto& l = lay[i];
    if (l.numel == 0) continue;
    cd::gain_request rq;
    rq.count = static_cast<int>(fractions.size());
    for (int c = 0; c < rq.count; ++c) rq.k[c] = gravac::kept_count(l.numel, fractions[static_cast<std::size_t>(c)]);
    cd::launch(&cd::select_fused_pass, lc.grid_stride(l.numel, cd::square_tile), cd::select_threads, s,
               g.data() + l.offset, e_ref.data() + l.offset, l.numel, 0, st_ref.data() + i, zero.data(),
               hist_ref.data(), sq_ref.data(), nullptr, 0, sums_ref.data() + i, rq, out_ref.data(), false, nullptr,
               slots.view());
  }
  const auto ur = to_host(e_ref.data(), numel);
  const auto gr = to_host(out_ref.data(), fractions.size());
  const auto sr = to_host(sums_ref.data(), L);
  CHECK(gr[0] > gr[1]);  // a real curve: more kept, more energy
  CHECK(gr[2] > 0);

  // One launch over every layer, twice on the same workspace (its histograms and counters
  // must be back at zero after the first).
  cd::fused_jobs jobs(lay, lc, true, {});
  REQUIRE(jobs.count() == L - 1);
  gravac::device_buffer<cd::select_state> st(L);
  gravac::device_buffer<cd::layer_sums> sums(L);
  gravac::device_buffer<double> out(cd::max_gain_candidates);
  for (int run = 0; run < 2; ++run) {
    INFO("run " << run);
    auto e = to_device(e_host);
    GRAVAC_TRY_CUDA(cudaMemsetAsync(st.data(), 0, L * sizeof(cd::select_state), s));
    GRAVAC_TRY_CUDA(cudaMemsetAsync(sums.data(), 0, L * sizeof(cd::layer_sums), s));
    jobs.queue(s, g.data(), e.data(), st.data(), sums.data(), fractions, out.data());
    const auto ue = to_host(e.data(), numel);
    REQUIRE(same_words(ue.data(), ur.data(), numel * sizeof(float), false));
    const auto go = to_host(out.data(), fractions.size());
    REQUIRE(same_words(go.data(), gr.data(), fractions.size() * sizeof(double), false));
    const auto so = to_host(sums.data(), L);
    REQUIRE(same_words(so.data(), sr.data(), L * sizeof(cd::layer_sums), false));
  }
}

// A small case for compute-sanitizer (scripts/gpu-check): QSGD's buckets on a mixed layout
// with a dense and an empty layer.
TEST_CASE("qsgd_cuda: mixed layout, small (compute-sanitizer)", "[sanitize]") {
  auto lay = gravac::test::mixed_layout();
  lay.add("zero", {4096}, gravac::layer_kind::dense);
  typed_pair<gravac::qsgd, gravac::qsgd_cuda> r(lay, {.levels = 15, .bucket = 128}, {.levels = 15, .bucket = 128});
  for (std::uint64_t s = 0; s < 2; ++s) {
    auto p = gravac::test::params_for(r.lay, 0.1, s, 17);
    p.kept_fraction[1] = 1.0;  // a layer sent dense
    auto g = gravac::test::make_data(r.lay.numel(), 81 + s);
    for (std::size_t j = 0; j < r.lay[5].numel; ++j) g[r.lay[5].offset + j] = 0.0f;
    r.step(g, p);
    r.check_decode(0.5f);
  }
}

// A small case for compute-sanitizer (scripts/gpu-check): every block-scaled format on a
// mixed layout with a raw, an empty and an all-zero layer, and partial blocks.
TEST_CASE("mxfp8_cuda, mxfp4_cuda, nvfp4_cuda: mixed layout, small (compute-sanitizer)", "[sanitize]") {
  auto lay = gravac::test::mixed_layout();
  lay.add("zero", {4096}, gravac::layer_kind::dense);
  for (int f = 0; f < block_formats; ++f) {
    INFO(block_format_names[f]);
    const auto rounding = f % 2 ? gravac::block_rounding::nearest_even : gravac::block_rounding::stochastic;
    with_block_format(f, rounding, true, [&](auto pair, const auto& ho, const auto& dopt) {
      typename decltype(pair)::type r(lay, ho, dopt);
      for (std::uint64_t s = 0; s < 2; ++s) {
        auto p = gravac::test::params_for(r.lay, 0.1, s, 17);
        p.kept_fraction[1] = 1.0;  // a layer sent dense
        auto g = gravac::test::make_data(r.lay.numel(), 91 + s);
        for (std::size_t j = 0; j < r.lay[5].numel; ++j) g[r.lay[5].offset + j] = 0.0f;
        r.step(g, p);
        r.check_decode(0.5f);
      }
    });
  }
}

TEST_CASE("device quantizers: invalid options are rejected as on the host") {
  const auto lay = gravac::layout::flat(100);
  CHECK_THROWS_AS(gravac::qsgd_cuda(lay, {.levels = 0}), gravac::error);
  CHECK_THROWS_AS(gravac::qsgd_cuda(lay, {.levels = 40000}), gravac::error);
  CHECK_THROWS_AS(gravac::qsgd_cuda(lay, {.bucket = 100}), gravac::error);
  CHECK_THROWS_AS(gravac::terngrad_cuda(lay, {.bucket = 65}), gravac::error);
  CHECK_THROWS_AS(gravac::cast16_cuda(lay, {.format = static_cast<gravac::cast16_format>(7)}), gravac::error);
  // The block-scaled formats reject what their host compressors reject.
  const auto bad_element = static_cast<gravac::mxfp8_element>(7);
  const auto bad_rounding = static_cast<gravac::block_rounding>(5);
  CHECK_THROWS_AS(gravac::mxfp8(lay, {.element = bad_element}), gravac::error);
  CHECK_THROWS_AS(gravac::mxfp8_cuda(lay, {.element = bad_element}), gravac::error);
  CHECK_THROWS_AS(gravac::mxfp8(lay, {.rounding = bad_rounding}), gravac::error);
  CHECK_THROWS_AS(gravac::mxfp8_cuda(lay, {.rounding = bad_rounding}), gravac::error);
  CHECK_THROWS_AS(gravac::mxfp4(lay, {.rounding = bad_rounding}), gravac::error);
  CHECK_THROWS_AS(gravac::mxfp4_cuda(lay, {.rounding = bad_rounding}), gravac::error);
  CHECK_THROWS_AS(gravac::nvfp4(lay, {.rounding = bad_rounding}), gravac::error);
  CHECK_THROWS_AS(gravac::nvfp4_cuda(lay, {.rounding = bad_rounding}), gravac::error);
  CHECK_NOTHROW(gravac::mxfp8_cuda(lay, {.element = gravac::mxfp8_element::e5m2,
                                         .rounding = gravac::block_rounding::stochastic,
                                         .error_feedback = false}));
}

namespace {

// Corrupts copies of a good packet; the device must reject exactly what the host rejects.
template <class Pair>
void corruptions(Pair& r) {
  const std::vector<std::byte> good(r.packet_host.begin(),
                                    r.packet_host.begin() + static_cast<std::ptrdiff_t>(r.bytes));
  auto check = [&](const std::vector<std::byte>& bad, const char* what, bool expect_bad = true) {
    INFO(what);
    const bool host_ok = static_cast<bool>(r.host.validate(bad));
    gravac::device_buffer<std::byte> d(std::max<std::size_t>(bad.size(), 1));
    GRAVAC_TRY_CUDA(cudaMemcpy(d.data(), bad.data(), bad.size(), cudaMemcpyHostToDevice));
    const bool dev_ok = static_cast<bool>(r.dev.validate(d.span().first(bad.size())));
    CHECK(host_ok == !expect_bad);
    CHECK(dev_ok == host_ok);
  };
  auto put = [&](std::size_t at, auto v) {
    auto b = good;
    std::memcpy(b.data() + at, &v, sizeof v);
    return b;
  };
  check(good, "the good packet", false);
  check(put(0, std::uint32_t{0}), "magic");
  check(std::vector<std::byte>(good.begin(), good.end() - 8), "truncated");
  check(put(offsetof(gravac::packet_header, layout_hash), std::uint64_t{0}), "layout hash");
  // The first quantized segment.
  std::size_t pos = sizeof(gravac::packet_header);
  gravac::segment_header sh;
  for (;;) {
    std::memcpy(&sh, good.data() + pos, sizeof sh);
    if (sh.encoding != gravac::raw_encoding) break;
    pos += sizeof sh + sh.payload_bytes;
    REQUIRE(pos < good.size());
  }
  const std::size_t pl = pos + sizeof sh;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  check(put(pos + offsetof(gravac::segment_header, encoding), std::uint8_t{200}), "encoding");  // no encoding
  check(put(pos + offsetof(gravac::segment_header, index_width), std::uint8_t{4}), "indices");
  check(put(pos + offsetof(gravac::segment_header, count), std::uint64_t{sh.numel - 1}), "count");
  const auto enc = static_cast<gravac::quant_encoding>(sh.encoding);
  if (enc == gravac::quant_encoding::qsgd || enc == gravac::quant_encoding::terngrad) {
    std::uint32_t levels, bucket;
    std::memcpy(&levels, good.data() + pl, 4);
    std::memcpy(&bucket, good.data() + pl + 4, 4);
    check(put(pl, std::uint32_t{0}), "zero levels");
    check(put(pl, std::uint32_t{40000}), "too many levels");
    check(put(pl + 4, bucket + 1), "bucket not a multiple of 64");
    check(put(pl + 8, nan), "NaN scale");
    check(put(pl + 8, -1.0f), "negative scale");
    check(put(pl + 8, std::numeric_limits<float>::infinity()), "infinite scale");
    const std::size_t nb = gravac::bucket_count(sh.numel, bucket);
    const std::size_t codes = pl + 8 + gravac::pad8(nb * 4);
    const unsigned w = gravac::code_width(levels);
    {
      auto b = good;  // a sign on level 0 in code 0
      b[codes] = std::byte{static_cast<unsigned char>((1u << (w - 1)) & 0xffu)};
      if (w == 16) b[codes] = std::byte{0}, b[codes + 1] = std::byte{0x80};
      check(b, "sign on level zero");
    }
    if (w > 2) {
      auto b = good;  // level s + 1 in code 0
      const std::uint32_t c = levels + 1;
      std::memcpy(b.data() + codes, &c, w / 8 ? w / 8 : 1);
      if (w == 4) b[codes] = std::byte{static_cast<unsigned char>((static_cast<unsigned>(b[codes]) & 0xf0u) | c)};
      check(b, "level above s");
    }
    const std::size_t used = sh.numel * w;
    if ((pl + sh.payload_bytes) * 8 > codes * 8 + used) {
      auto b = good;  // the last payload bit (padding)
      b[pl + sh.payload_bytes - 1] |= std::byte{0x80};
      check(b, "padding bit set");
    }
  } else if (enc == gravac::quant_encoding::mxfp8_e4m3 || enc == gravac::quant_encoding::mxfp8_e5m2 ||
             enc == gravac::quant_encoding::mxfp4 || enc == gravac::quant_encoding::nvfp4) {
    namespace gd = gravac::detail;
    const bool nv = enc == gravac::quant_encoding::nvfp4;
    const bool fp8 = enc == gravac::quant_encoding::mxfp8_e4m3 || enc == gravac::quant_encoding::mxfp8_e5m2;
    const std::uint32_t block = nv ? 16 : 32;
    const unsigned w = fp8 ? 8 : 4;
    const std::size_t nb = gravac::bucket_count(sh.numel, block);
    const std::size_t scales = pl + 8, codes = scales + gravac::pad8(nb);
    check(put(pl, std::uint32_t{nv ? 32u : 16u}), "wrong block size");
    if (nv) {
      check(put(pl + 4, nan), "NaN per-layer scale");
      check(put(pl + 4, -1.0f), "negative per-layer scale");
      check(put(pl + 4, std::numeric_limits<float>::infinity()), "infinite per-layer scale");
      check(put(pl + 4, FLT_MAX), "per-layer scale whose largest value overflows");
      check(put(scales, std::uint8_t{0x80}), "negative block scale");
      check(put(scales, std::uint8_t{0x7f}), "NaN block scale");
      check(put(scales, std::uint8_t{0x7e}), "largest block scale", false);
    } else {
      const auto elem = enc == gravac::quant_encoding::mxfp8_e4m3   ? gd::minifloat::e4m3
                        : enc == gravac::quant_encoding::mxfp8_e5m2 ? gd::minifloat::e5m2
                                                                    : gd::minifloat::e2m1;
      const auto top = static_cast<std::uint8_t>(gd::mx_max_scale_code(elem));
      check(put(pl + 4, std::uint32_t{1}), "prefix word set");
      check(put(scales, std::uint8_t{0xff}), "NaN scale");
      check(put(scales, static_cast<std::uint8_t>(top + 1)), "scale above the largest");
      check(put(scales, top), "the largest scale", false);
    }
    if (nb % 8 != 0) check(put(scales + nb, std::uint8_t{1}), "scale padding set");
    if (fp8) {
      check(put(codes, std::uint8_t{0x7f}), "NaN element");
      check(put(codes, std::uint8_t{0xff}), "negative NaN element");
      if (enc == gravac::quant_encoding::mxfp8_e5m2) check(put(codes, std::uint8_t{0xfc}), "infinite element");
    }
    if ((pl + sh.payload_bytes) * 8 > codes * 8 + sh.numel * w) {
      auto b = good;
      b[pl + sh.payload_bytes - 1] |= std::byte{0x80};
      check(b, "padding bit set");
    }
  } else if (enc == gravac::quant_encoding::sign) {
    check(put(pl, nan), "NaN scale");
    check(put(pl, -2.0f), "negative scale");
    check(put(pl + 4, std::uint32_t{1}), "second prefix word");
    if (gravac::pad8(gravac::detail::code_bytes(sh.numel, 1)) * 8 > sh.numel) {
      auto b = good;
      b[pl + sh.payload_bytes - 1] |= std::byte{0x80};
      check(b, "padding bit set");
    }
  } else {
    check(put(pl, 0.0f), "zero multiplier");
    check(put(pl, nan), "NaN multiplier");
    check(put(pl + 4, std::uint32_t{3}), "second prefix word");
    check(put(pl + 8, std::uint16_t{0x7f80u | 0x7c00u}), "infinite code");
    if (sh.numel % 4 != 0) {
      auto b = good;
      b[pl + sh.payload_bytes - 1] = std::byte{1};
      check(b, "padding set");
    }
  }
}

}  // namespace

TEST_CASE("device quantizers: validation agrees with the host's on good and corrupted packets") {
  auto lay = gravac::test::mixed_layout();
  auto p = gravac::test::params_for(lay, 0.1);
  p.kept_fraction[0] = 1.0;  // a raw segment first
  const auto g = gravac::test::make_data(lay.numel(), 81);
  for (std::uint32_t lv : {1u, 7u, 127u, 1000u}) {
    INFO("qsgd levels " << lv);
    typed_pair<gravac::qsgd, gravac::qsgd_cuda> r(lay, {.levels = lv, .bucket = 64}, {.levels = lv, .bucket = 64});
    r.step(g, p);
    corruptions(r);
  }
  {
    typed_pair<gravac::terngrad, gravac::terngrad_cuda> r(lay, {}, {});
    r.step(g, p);
    corruptions(r);
  }
  {
    typed_pair<gravac::sign, gravac::sign_cuda> r(lay, {}, {});
    r.step(g, p);
    corruptions(r);
  }
  for (auto f : {gravac::cast16_format::fp16, gravac::cast16_format::bf16}) {
    typed_pair<gravac::cast16, gravac::cast16_cuda> r(lay, {.format = f}, {.format = f});
    r.step(g, p);
    corruptions(r);
  }
  for (int f = 0; f < block_formats; ++f) {
    INFO(block_format_names[f]);
    with_block_format(f, gravac::block_rounding::nearest_even, true, [&](auto pair, const auto& ho, const auto& dopt) {
      typename decltype(pair)::type r(lay, ho, dopt);
      r.step(g, p);
      corruptions(r);
    });
  }
}

namespace {

// MOCK: a one-rank communicator over device memory (the collectives' device paths without
// NCCL): allgatherv copies this rank's packet, the reductions of one rank are the identity.
struct one_rank_device_comm {
  using communicator_tag = void;
  using memory_space = gravac::cuda_space;
  using byte_buffer = gravac::device_byte_buffer;
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  void allreduce_sum(std::span<float>) {}
  void allreduce_sum(std::span<double>) {}
  void allreduce_max(std::span<double>) {}
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    out.resize(in.size());
    if (!in.empty())
      GRAVAC_TRY_CUDA(cudaMemcpyAsync(out.data(), in.data(), in.size(), cudaMemcpyDeviceToDevice, cudaStreamPerThread));
    GRAVAC_TRY_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
    sizes.assign(1, in.size());
  }
  void broadcast(std::span<std::byte>, int) {}
  void barrier() {}
};
static_assert(gravac::Communicator<one_rank_device_comm>);

// The device trainer's averaged gradient after each step equals the host trainer's bit for bit.
template <class HostC, class DevC, class K>
void trainer_pair(double fraction) {
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {100003}, gravac::layer_kind::conv);
  gravac::fixed_policy_options pol;
  pol.kept_fraction = fraction;
  pol.one_dim_dense = true;  // 1-D layers go raw
  std::vector<std::vector<float>> host_out;
  gravac::run_ranks(1, [&](gravac::thread_communicator& comm) {
    gravac::trainer<HostC, K, gravac::fixed_policy> t(comm, lay, {.policy = pol, .seed = 3});
    for (std::uint64_t s = 0; s < 3; ++s) {
      auto g = gravac::test::make_data(lay.numel(), 200 + s);
      t.step(std::span<float>(g));
      host_out.push_back(g);
    }
  });
  one_rank_device_comm comm;
  gravac::trainer<DevC, K, gravac::fixed_policy> t(comm, lay, {.policy = pol, .seed = 3});
  for (std::uint64_t s = 0; s < 3; ++s) {
    INFO("step " << s);
    auto g = to_device(gravac::test::make_data(lay.numel(), 200 + s), 1);
    t.step(gravac::grad_view<gravac::cuda_space>(g.data(), lay.numel()));
    const auto back = to_host(g.data(), lay.numel());
    REQUIRE(same_words(back.data(), host_out[s].data(), back.size() * sizeof(float), false));
  }
}

}  // namespace

TEST_CASE("trainer with a device quantizer equals the host trainer (one rank, allgather and dense_allreduce)") {
  trainer_pair<gravac::qsgd, gravac::qsgd_cuda, gravac::allgather>(0.1);
  trainer_pair<gravac::terngrad, gravac::terngrad_cuda, gravac::allgather>(0.1);
  trainer_pair<gravac::sign, gravac::sign_cuda, gravac::dense_allreduce>(0.1);
  trainer_pair<gravac::cast16, gravac::cast16_cuda, gravac::dense_allreduce>(0.1);
  trainer_pair<gravac::mxfp8, gravac::mxfp8_cuda, gravac::allgather>(0.1);
  trainer_pair<gravac::mxfp4, gravac::mxfp4_cuda, gravac::allgather>(0.1);
  trainer_pair<gravac::nvfp4, gravac::nvfp4_cuda, gravac::allgather>(0.1);
}

// ---- on_non_finite on device memory --------------------------------------------------------

namespace {

// What a step on a planted non-finite u left behind, on the host or the device trainer.
struct non_finite_outcome {
  bool threw = false;
  gravac::status code{};
  std::string what;
  bool skipped = false;
  std::uint64_t steps = 0;
  std::size_t buckets = 0;
  std::vector<float> g, e, g_before, e_before;  // after the step; before it
};

enum class planted { nan_in_layer, overflow };

// A NaN in the gradient of fc1.weight, or a finite gradient and residual of the same sign
// in "big" whose sum overflows the float range.
constexpr float overflow_half = 0.75f * std::numeric_limits<float>::max();

gravac::layout non_finite_layout() {
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {100003}, gravac::layer_kind::conv);
  return lay;
}
std::size_t planted_at(const gravac::layout& lay, planted p) {
  const auto& l = lay[p == planted::nan_in_layer ? 2 : lay.size() - 1];
  return l.offset + l.numel / 2;
}
std::string planted_layer(const gravac::layout& lay, planted p) {
  return lay[p == planted::nan_in_layer ? 2 : lay.size() - 1].name;
}

template <class T>
typename T::options non_finite_options(gravac::non_finite_action a) {
  gravac::fixed_policy_options pol;
  pol.kept_fraction = 0.1;
  pol.one_dim_dense = true;
  return {.policy = pol, .seed = 3, .on_non_finite = a};
}

template <class Step>
void step_into(non_finite_outcome& out, Step&& step) {
  try {
    out.skipped = step().skipped;
  } catch (const gravac::error& e) {
    out.threw = true;
    out.code = e.code();
    out.what = e.what();
  }
}

// The host trainer (one thread rank): a finite warm-up step, then the planted one.
template <class HostC, class K>
non_finite_outcome host_non_finite(gravac::non_finite_action a, planted p) {
  const auto lay = non_finite_layout();
  const std::size_t at = planted_at(lay, p);
  non_finite_outcome out;
  gravac::run_ranks(1, [&](gravac::thread_communicator& comm) {
    using T = gravac::trainer<HostC, K, gravac::fixed_policy>;
    T t(comm, lay, non_finite_options<T>(a));
    auto g0 = gravac::test::make_data(lay.numel(), 11);
    t.step(std::span<float>(g0));
    auto g = gravac::test::make_data(lay.numel(), 23);
    if (p == planted::overflow) {
      t.residual()[at] = overflow_half;
      g[at] = overflow_half;
    } else {
      g[at] = std::numeric_limits<float>::quiet_NaN();
    }
    out.g_before = g;
    out.e_before.assign(t.residual().begin(), t.residual().end());
    step_into(out, [&]() -> const gravac::step_report& { return t.step(std::span<float>(g)); });
    out.steps = t.steps();
    out.buckets = t.bucket_count();
    out.g = g;
    out.e.assign(t.residual().begin(), t.residual().end());
  });
  return out;
}

// The device trainer on the same data (one_rank_device_comm).
template <class DevC, class K>
non_finite_outcome device_non_finite(gravac::non_finite_action a, planted p) {
  const auto lay = non_finite_layout();
  const std::size_t n = lay.numel(), at = planted_at(lay, p);
  non_finite_outcome out;
  one_rank_device_comm comm;
  using T = gravac::trainer<DevC, K, gravac::fixed_policy>;
  T t(comm, lay, non_finite_options<T>(a));
  auto g0 = to_device(gravac::test::make_data(n, 11), 1);
  t.step(gravac::grad_view<gravac::cuda_space>(g0.data(), n));
  auto g = gravac::test::make_data(n, 23);
  const auto ev = t.residual_view();  // as the host's mutable residual(): e is no longer assumed zero
  if (p == planted::overflow) {
    GRAVAC_TRY_CUDA(cudaMemcpy(ev.data() + at, &overflow_half, sizeof(float), cudaMemcpyHostToDevice));
    g[at] = overflow_half;
  } else {
    g[at] = std::numeric_limits<float>::quiet_NaN();
  }
  out.g_before = g;
  out.e_before = to_host(ev.data(), n);
  auto gd = to_device(g, 1);
  step_into(
      out, [&]() -> const gravac::step_report& { return t.step(gravac::grad_view<gravac::cuda_space>(gd.data(), n)); });
  out.steps = t.steps();
  out.buckets = t.bucket_count();
  out.g = to_host(gd.data(), n);
  out.e = to_host(ev.data(), n);
  return out;
}

bool all_zero(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; });
}

// The host semantics of each action, then the device's outcome against the host's: the
// error (status and message), the skip, the step counter, the residual and the gradient
// bit for bit. Two differences are by design: under throw_error the device decides before
// sending, so its gradient is the one given (the host's holds what its collective left);
// under ignore the trainer does nothing, and each compressor treats NaN its own way (the
// host's qsgd sends a NaN scale, which the collective rejects as a malformed packet).
template <class HostC, class DevC, class K>
void non_finite_pair(gravac::non_finite_action a, planted p) {
  using gravac::non_finite_action;
  const auto lay = non_finite_layout();
  const auto h = host_non_finite<HostC, K>(a, p);
  const auto d = device_non_finite<DevC, K>(a, p);
  REQUIRE(h.buckets == 1);  // one bucket: the host's throw gives back all it sent
  REQUIRE(d.buckets == 1);
  const std::size_t bytes = h.e.size() * sizeof(float);
  REQUIRE(d.g.size() == h.g.size());
  REQUIRE(d.e.size() == h.e.size());
  if (a == non_finite_action::ignore) {
    CHECK_FALSE(h.skipped);
    CHECK_FALSE(d.skipped);
    CHECK((!h.threw || h.code != gravac::status::non_finite));
    CHECK((!d.threw || d.code != gravac::status::non_finite));
    return;
  }
  switch (a) {
    case non_finite_action::throw_error:
      REQUIRE(h.threw);
      CHECK(h.code == gravac::status::non_finite);
      CHECK_THAT(h.what, Catch::Contains("layer '" + planted_layer(lay, p) + "'"));
      if (p == planted::overflow) CHECK_THAT(h.what, Catch::Contains("overflows"));
      CHECK(h.steps == 1);
      CHECK(same_words(h.e.data(), h.e_before.data(), bytes, false));  // nothing lost
      break;
    case non_finite_action::skip_step:
      CHECK_FALSE(h.threw);
      CHECK(h.skipped);
      CHECK(h.steps == 2);
      CHECK(same_words(h.e.data(), h.e_before.data(), bytes, false));
      CHECK(all_zero(h.g));
      break;
    default:  // zero_values
      CHECK_FALSE(h.threw);
      CHECK_FALSE(h.skipped);
      CHECK(h.steps == 2);
      CHECK(all_finite(h.g));
      CHECK(all_finite(h.e));
      break;
  }
  CHECK(d.threw == h.threw);
  CHECK(d.code == h.code);
  CHECK(d.what == h.what);
  CHECK(d.skipped == h.skipped);
  CHECK(d.steps == h.steps);
  CHECK(same_words(d.e.data(), h.e.data(), bytes, false));
  if (a == non_finite_action::throw_error)
    CHECK(same_words(d.g.data(), d.g_before.data(), bytes));  // untouched (NaN payloads aside)
  else
    CHECK(same_words(d.g.data(), h.g.data(), bytes, false));
}

}  // namespace

TEST_CASE("device trainer: on_non_finite acts as the host trainer's on a NaN and on an overflowing g + e") {
  using gravac::non_finite_action;
  for (const auto a : {non_finite_action::throw_error, non_finite_action::skip_step, non_finite_action::zero_values,
                       non_finite_action::ignore})
    for (const auto p : {planted::nan_in_layer, planted::overflow}) {
      INFO("action " << static_cast<int>(a) << ", " << (p == planted::overflow ? "overflow" : "NaN"));
      non_finite_pair<gravac::qsgd, gravac::qsgd_cuda, gravac::allgather>(a, p);
      non_finite_pair<gravac::sign, gravac::sign_cuda, gravac::dense_allreduce>(a, p);
    }
}
