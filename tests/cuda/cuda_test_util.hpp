#pragma once
// Helpers shared by the GPU tests (test_cuda_kernels, test_cuda_adacomp,
// test_cuda_quantizers, test_nccl): copies between host vectors and device buffers, a
// bitwise comparison that tolerates NaN payloads, and a host and a device compressor
// stepped together on the same data.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <utility>
#include <vector>

#include "gravac/cuda/cuda_error.hpp"
#include "gravac/cuda/device_buffer.hpp"
#include "gravac/layout.hpp"
#include "gravac/memory.hpp"
#include "gravac/step.hpp"

namespace gravac::test {

//! A GPU test's size where it runs: as written on a GPU; on the host double of CUDA
//! (tests/cuda/host_double, where every device thread is a fiber) sizes of 2^20 and more
//! are divided by 16, keeping what lies past a power of two (2^22 + 5 becomes 2^18 + 5), so
//! that the whole label runs in minutes on CI's two cores. The paths the sizes choose
//! (sampled against whole-layer histograms, several blocks, grid-stride rounds) stay taken.
constexpr std::size_t device_size(std::size_t n) {
#if defined(GRAVAC_CUDA_HOST_DOUBLE)
  if (n >= (std::size_t{1} << 20)) return (n >> 4) + (n & 15);
#endif
  return n;
}

//! A device copy of \p h, of at least \p min_elements elements (zero-filled past h).
template <class T>
gravac::device_buffer<T> to_device(const std::vector<T>& h, std::size_t min_elements = 0) {
  gravac::device_buffer<T> d(std::max(h.size(), min_elements));
  if (!h.empty()) GRAVAC_TRY_CUDA(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

//! A host copy of the \p n elements at device address \p d.
template <class T>
std::vector<T> to_host(const T* d, std::size_t n) {
  std::vector<T> h(n);
  if (n) GRAVAC_TRY_CUDA(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

//! Equal bytes; with \p nan_equal, 4-byte words that are both NaN also count as equal.
//! The device returns the canonical NaN where the host propagates the input's payload, so
//! NaN bits may differ; every packet field and every residual element is a 4-byte word
//! (or a pair of them) at a 4-byte boundary.
inline bool same_words(const void* a, const void* b, std::size_t bytes, bool nan_equal = true) {
  if (!nan_equal || bytes % 4 != 0) return std::memcmp(a, b, bytes) == 0;
  for (std::size_t i = 0; i < bytes / 4; ++i) {
    std::uint32_t x, y;
    std::memcpy(&x, static_cast<const std::byte*>(a) + 4 * i, 4);
    std::memcpy(&y, static_cast<const std::byte*>(b) + 4 * i, 4);
    const bool nan_x = (x & 0x7fffffffu) > 0x7f800000u, nan_y = (y & 0x7fffffffu) > 0x7f800000u;
    if (x != y && !(nan_x && nan_y)) return false;
  }
  return true;
}

//! \p v with every element multiplied by \p s.
inline std::vector<float> scaled(std::vector<float> v, float s) {
  for (auto& x : v) x *= s;
  return v;
}

//! One layout, a host and a device compressor of it, their residuals and packet buffers.
template <class Host, class Dev>
struct compressor_pair {
  gravac::layout lay;                           //!< the layout both compress
  Host host;                                    //!< the host (reference) compressor
  Dev dev;                                      //!< the device compressor under test
  std::vector<float> e_host;                    //!< the host residual
  gravac::device_buffer<float> e_dev;           //!< the device residual
  std::vector<std::byte> packet_host;           //!< the host packet buffer
  gravac::device_buffer<std::byte> packet_dev;  //!< the device packet buffer
  std::size_t bytes = 0;                        //!< the last step's packet size

  //! Both with default options; the device residual holds at least \p min_elements.
  explicit compressor_pair(gravac::layout l, std::size_t min_elements = 0)
      : lay(std::move(l)),
        host(lay),
        dev(lay),
        e_host(lay.numel(), 0.0f),
        e_dev(std::max(lay.numel(), min_elements)),
        packet_host(host.max_packet_bytes()),
        packet_dev(dev.max_packet_bytes()) {}

  //! Both with the given options; the device residual holds at least \p min_elements.
  template <class HostOptions, class DevOptions>
  compressor_pair(gravac::layout l, const HostOptions& ho, const DevOptions& dopt, std::size_t min_elements = 0)
      : lay(std::move(l)),
        host(lay, ho),
        dev(lay, dopt),
        e_host(lay.numel(), 0.0f),
        e_dev(std::max(lay.numel(), min_elements)),
        packet_host(host.max_packet_bytes()),
        packet_dev(dev.max_packet_bytes()) {}
};

//! A compressor_pair stepped together: each step checks identical packets and residuals,
//! the same counts and close statistics.
template <class Host, class Dev, bool ExactNorms = true>
struct pair_run : compressor_pair<Host, Dev> {
  using compressor_pair<Host, Dev>::compressor_pair;

  //! Whether the norms (||g||^2, ||u||^2, the kept energy) must equal the host's bit for
  //! bit: the compressors whose kernels sum them in the host's tree
  //! (gravac/cuda/detail/square_sums.hpp). Otherwise they must be within norm_eps.
  bool exact_norms = ExactNorms;
  //! Relative tolerance of the norms of a pair without exact_norms: such a device
  //! compressor sums in double per thread, the host in float lanes (about 1e-7 apart).
  double norm_eps = 1e-5;
  //! Whether two NaN norms count as close (a NaN gradient makes both norms NaN); when
  //! false every NaN norm fails the comparison.
  bool nan_norms_equal = true;
  gravac::compress_stats last_host;  //!< the host's statistics of the last step

  //! Equal bits, or both NaN where nan_norms_equal (a NaN's payload is not a statistic).
  [[nodiscard]] bool same_norm(double a, double b) const {
    if (std::isnan(a) || std::isnan(b)) return nan_norms_equal && std::isnan(a) && std::isnan(b);
    return std::memcmp(&a, &b, sizeof a) == 0;
  }
  //! Relatively close (within norm_eps), or both NaN where nan_norms_equal.
  [[nodiscard]] bool close(double a, double b) const {
    if (nan_norms_equal && (std::isnan(a) || std::isnan(b))) return std::isnan(a) && std::isnan(b);
    return a == Approx(b).epsilon(norm_eps).margin(1e-30);
  }

  //! One step on both: identical packets and residuals, the same counts, close statistics.
  void step(const std::vector<float>& g, const gravac::step_params& p) {
    auto& self = *this;
    std::vector<float> gh = g;
    gravac::compress_stats sh, sd;
    const auto bh = self.host.compress(gravac::host_view(gh), gravac::host_view(self.e_host), p, self.packet_host, sh);
    auto gd = to_device(g);
    const auto bd =
        self.dev.compress(gravac::device_view(gd), gravac::device_view(self.e_dev), p, self.packet_dev.span(), sd);
    REQUIRE(bd == bh);
    self.bytes = bd;
    const auto pd = to_host(self.packet_dev.data(), bd);
    REQUIRE(same_words(pd.data(), self.packet_host.data(), bh));
    const auto ed = to_host(self.e_dev.data(), self.e_dev.size());
    REQUIRE(same_words(ed.data(), self.e_host.data(), ed.size() * sizeof(float)));
    REQUIRE(sd.non_finite == sh.non_finite);
    for (std::size_t i = 0; i < self.lay.size(); ++i) {
      INFO("layer " << i);
      CHECK(sd.layers[i].kept == sh.layers[i].kept);
      INFO(std::setprecision(17) << "grad_sq dev " << sd.layers[i].grad_sq << " host " << sh.layers[i].grad_sq
                                 << " input_sq dev " << sd.layers[i].input_sq << " host " << sh.layers[i].input_sq);
      if (exact_norms) {
        CHECK(same_norm(sd.layers[i].grad_sq, sh.layers[i].grad_sq));
        CHECK(same_norm(sd.layers[i].input_sq, sh.layers[i].input_sq));
        CHECK(same_norm(sd.layers[i].kept_sq, sh.layers[i].kept_sq));
      } else {
        CHECK(close(sd.layers[i].grad_sq, sh.layers[i].grad_sq));
        CHECK(close(sd.layers[i].input_sq, sh.layers[i].input_sq));
        CHECK(close(sd.layers[i].kept_sq, sh.layers[i].kept_sq));
      }
    }
    // The gain curve too (large layers: both sides' sampled estimate, gain_sampling.hpp).
    for (std::size_t c = 0; c < p.gain_candidates.size(); ++c) {
      INFO("gain candidate " << c << std::setprecision(17) << ": dev " << sd.candidate_kept_sq[c] << " host "
                             << sh.candidate_kept_sq[c]);
      CHECK(same_norm(sd.candidate_kept_sq[c], sh.candidate_kept_sq[c]));
    }
    last_host = sh;
  }
};

//! Equal bits (NaN payloads included): statistics must repeat exactly, not closely.
inline bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

//! The statistics of two runs of one step equal bit for bit: counts, norms, kept energies,
//! the gain curve and the non-finite flag.
inline void require_same_statistics(const gravac::compress_stats& sa, const gravac::compress_stats& sb) {
  REQUIRE(sa.non_finite == sb.non_finite);
  REQUIRE(sa.layers.size() == sb.layers.size());
  for (std::size_t i = 0; i < sa.layers.size(); ++i) {
    INFO("layer " << i << std::setprecision(17) << ": grad_sq " << sa.layers[i].grad_sq << " / " << sb.layers[i].grad_sq
                  << ", input_sq " << sa.layers[i].input_sq << " / " << sb.layers[i].input_sq << ", kept_sq "
                  << sa.layers[i].kept_sq << " / " << sb.layers[i].kept_sq);
    CHECK(sa.layers[i].kept == sb.layers[i].kept);
    CHECK(same_bits(sa.layers[i].grad_sq, sb.layers[i].grad_sq));
    CHECK(same_bits(sa.layers[i].input_sq, sb.layers[i].input_sq));
    CHECK(same_bits(sa.layers[i].kept_sq, sb.layers[i].kept_sq));
  }
  REQUIRE(sa.candidate_kept_sq.size() == sb.candidate_kept_sq.size());
  for (std::size_t c = 0; c < sa.candidate_kept_sq.size(); ++c) {
    INFO("gain candidate " << c << std::setprecision(17) << ": " << sa.candidate_kept_sq[c] << " / "
                           << sb.candidate_kept_sq[c]);
    CHECK(same_bits(sa.candidate_kept_sq[c], sb.candidate_kept_sq[c]));
  }
}

//! Two device compressors of one layout, stepped on the same data: same seed, same bits.
//! On the host double every launch takes a fresh seed, so the twins see the blocks of
//! each grid in different orders (at once, under concurrent blocks): a statistic summed
//! in the order the blocks happen to finish differs in its last bits between them, as it
//! would between two runs on a GPU. Each step requires identical packets, residuals and
//! statistics, bit for bit.
template <class Dev>
struct device_twins {
  gravac::layout lay;                       //!< the layout both compress
  Dev a;                                    //!< the first run
  Dev b;                                    //!< the second run
  gravac::device_buffer<float> ea, eb;      //!< their residuals
  gravac::device_buffer<std::byte> pa, pb;  //!< their packet buffers
  gravac::compress_stats last;              //!< the last step's statistics (a's)

  //! Both constructed from \p l and the same \p options (none: the defaults).
  template <class... Options>
  explicit device_twins(gravac::layout l, const Options&... options)
      : lay(std::move(l)),
        a(lay, options...),
        b(lay, options...),
        ea(lay.numel()),
        eb(lay.numel()),
        pa(a.max_packet_bytes()),
        pb(b.max_packet_bytes()) {}

  //! One step of each on \p g with \p p.
  void step(const std::vector<float>& g, const gravac::step_params& p) {
    gravac::compress_stats sa, sb;
    auto ga = to_device(g), gb = to_device(g);
    const auto na = a.compress(gravac::device_view(ga), gravac::device_view(ea), p, pa.span(), sa);
    const auto nb = b.compress(gravac::device_view(gb), gravac::device_view(eb), p, pb.span(), sb);
    REQUIRE(na == nb);
    const auto ha = to_host(pa.data(), na), hb = to_host(pb.data(), nb);
    REQUIRE(same_words(ha.data(), hb.data(), na, false));
    const auto ra = to_host(ea.data(), ea.size()), rb = to_host(eb.data(), eb.size());
    REQUIRE(same_words(ra.data(), rb.data(), ra.size() * sizeof(float), false));
    require_same_statistics(sa, sb);
    last = sa;
  }
};

}  // namespace gravac::test
