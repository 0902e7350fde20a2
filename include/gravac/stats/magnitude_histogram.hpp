#pragma once
//! \file
//! \brief A histogram of |u| by the top bits of its IEEE-754 pattern (count and sum of
//! squares per bin). For non-negative floats the bit pattern orders like the value, so
//! the bins are ordered magnitude ranges of 1/16 octave each: exact counts and energies
//! above any bin edge, which is what exact top-k, threshold estimation and the gain curve
//! need. Shared by the CPU compressors.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gravac/core/detail/isa_dispatch.hpp"

namespace gravac {

//! The 31-bit magnitude key of \p x: its bit pattern without the sign. Keys order like |x|
//! for every finite x; NaN and infinity have keys >= non_finite_key.
[[nodiscard]] inline std::uint32_t magnitude_key(float x) noexcept {
  return std::bit_cast<std::uint32_t>(x) & 0x7fffffffu;
}
//! The magnitude whose key is \p key.
[[nodiscard]] inline float key_magnitude(std::uint32_t key) noexcept { return std::bit_cast<float>(key); }
//! Keys at or above this are infinity or NaN.
inline constexpr std::uint32_t non_finite_key = 0x7f800000u;

//! Bits of a square's 48-bit significand product dropped per value in a bin's energy: the
//! rest fits 32 bits, so a bin of up to 2^32 values sums in 64 (each term errs by less than
//! 2^-30 of itself, downward).
inline constexpr int energy_shift = 16;

//! The square of the finite magnitude of key \p key in the fixed-point units of its
//! exponent: |u| = M * 2^(max(E, 1) - 150), M the 24-bit significand (a subnormal's
//! fraction), so u^2 = (M^2 >> energy_shift) units of 2^(energy_shift + 2 (max(E, 1) - 150)).
//! Integer sums of them are exact, so a bin's energy has one value whatever order, threads
//! or device added its values in (the device: gravac/cuda/detail/bin_energy.hpp).
[[nodiscard]] GRAVAC_KERNEL_INLINE constexpr std::uint64_t energy_units(std::uint32_t key) noexcept {
  const std::uint32_t e = key >> 23, m = key & 0x7fffffu;
  const std::uint64_t sig = e ? (m | 0x800000u) : m;
  return (sig * sig) >> energy_shift;
}

//! The energy of \p units fixed-point units of values whose biased exponent is \p exponent.
[[nodiscard]] inline double units_energy(std::uint64_t units, std::uint32_t exponent) noexcept {
  const int e = exponent ? static_cast<int>(exponent) : 1;
  return std::ldexp(static_cast<double>(units), energy_shift + 2 * (e - 150));
}

//! Histogram of |u| over 4096 bins: the exponent and the top 4 mantissa bits of |u|, with
//! each bin's count and energy (energy_units). Allocated once at construction; clear()
//! resets only the bins used, so small layers cost little.
class magnitude_histogram {
 public:
  //! Bits of the key dropped to form the bin.
  static constexpr unsigned shift = 19;
  //! Number of bins.
  static constexpr std::size_t bins = std::size_t{1} << (31 - shift);
  //! The first bin of infinity and NaN (every bin below it holds finite values only).
  static constexpr std::uint32_t first_non_finite_bin = non_finite_key >> shift;

  //! An empty histogram.
  magnitude_histogram() : bin_(bins) {}

  //! Bin of \p key.
  [[nodiscard]] static constexpr std::uint32_t bin_of(std::uint32_t key) noexcept { return key >> shift; }
  //! Smallest key of bin \p b (its lower edge).
  [[nodiscard]] static constexpr std::uint32_t lower_key(std::uint32_t b) noexcept { return b << shift; }

  //! Adds one value of key \p key (its magnitude squared goes to the bin's energy).
  void add(std::uint32_t key) noexcept {
    add_unchecked(key);
    const std::uint32_t b = bin_of(key);
    lo_ = std::min(lo_, b);
    hi_ = std::max(hi_, b);
  }
  //! Adds one value by bin, with the used range widened by the caller (see note_range).
  //! Inlined into the vector passes that call it per element (a call there costs as much).
  GRAVAC_KERNEL_INLINE void add_unchecked(std::uint32_t key) noexcept {
    const std::uint32_t b = bin_of(key);
    bin_sums& s = bin_[b];
    ++s.count;
    s.units += energy_units(key);
  }
  //! Adds \p weight values of key \p key (a sample standing for that many), range widened
  //! by the caller.
  GRAVAC_KERNEL_INLINE void add_weighted_unchecked(std::uint32_t key, std::uint32_t weight) noexcept {
    const std::uint32_t b = bin_of(key);
    bin_sums& s = bin_[b];
    s.count += weight;
    s.units += weight * energy_units(key);
  }
  //! Counts one value by bin without its energy (selection only needs counts).
  GRAVAC_KERNEL_INLINE void count_unchecked(std::uint32_t key) noexcept { ++bin_[bin_of(key)].count; }
  //! Declares that keys in [min_key, max_key] were added with the *_unchecked functions.
  void note_range(std::uint32_t min_key, std::uint32_t max_key) noexcept {
    if (min_key > max_key) return;
    lo_ = std::min(lo_, bin_of(min_key));
    hi_ = std::max(hi_, bin_of(max_key));
  }
  //! Adds every bin of \p o.
  void merge(const magnitude_histogram& o) noexcept {
    if (o.empty()) return;
    for (std::uint32_t b = o.lo_; b <= o.hi_; ++b) {
      bin_[b].count += o.bin_[b].count;
      bin_[b].units += o.bin_[b].units;
    }
    lo_ = std::min(lo_, o.lo_);
    hi_ = std::max(hi_, o.hi_);
  }
  //! Empties bins \p first and above, leaving the bins below as they are.
  void clear_from(std::uint32_t first) noexcept {
    if (empty() || first > hi_) return;
    if (first <= lo_) {
      clear();
      return;
    }
    std::fill(bin_.begin() + first, bin_.begin() + hi_ + 1, bin_sums{});
    hi_ = first - 1;
  }
  //! Empties the histogram (touches only the bins used).
  void clear() noexcept {
    if (!empty()) {
      std::fill(bin_.begin() + lo_, bin_.begin() + hi_ + 1, bin_sums{});
    }
    lo_ = bins;
    hi_ = 0;
  }

  //! True when nothing was added.
  [[nodiscard]] bool empty() const noexcept { return lo_ > hi_; }
  //! Lowest bin used (bins when empty).
  [[nodiscard]] std::uint32_t low_bin() const noexcept { return lo_; }
  //! Highest bin used.
  [[nodiscard]] std::uint32_t high_bin() const noexcept { return hi_; }
  //! Values in bin \p b.
  [[nodiscard]] std::uint64_t count(std::uint32_t b) const noexcept { return bin_[b].count; }
  //! Bin \p b's energy in fixed-point units (energy_units; zero when only counts were taken).
  [[nodiscard]] std::uint64_t units(std::uint32_t b) const noexcept { return bin_[b].units; }
  //! Sum of squared magnitudes in finite bin \p b (zero when only counts were taken).
  [[nodiscard]] double sumsq(std::uint32_t b) const noexcept { return units_energy(bin_[b].units, b >> (23 - shift)); }
  //! Number of finite values.
  [[nodiscard]] std::uint64_t finite_count() const noexcept {
    std::uint64_t n = 0;
    if (empty()) return 0;
    for (std::uint32_t b = lo_; b <= std::min(hi_, first_non_finite_bin - 1); ++b) n += bin_[b].count;
    return n;
  }
  //! Number of infinities and NaNs.
  [[nodiscard]] std::uint64_t non_finite_count() const noexcept {
    std::uint64_t n = 0;
    if (empty()) return 0;
    for (std::uint32_t b = std::max(lo_, first_non_finite_bin); b <= hi_; ++b) n += bin_[b].count;
    return n;
  }

 private:
  struct bin_sums {  // side by side: a value touches one cache line
    std::uint64_t count = 0;
    std::uint64_t units = 0;
  };
  std::vector<bin_sums> bin_;
  std::uint32_t lo_ = bins;
  std::uint32_t hi_ = 0;
};

//! Where the k-th largest finite magnitude lies: its bin, and how many values lie in the
//! bins above it.
struct histogram_boundary {
  std::uint32_t bin = 0;    //!< the bin holding the k-th largest finite magnitude
  std::uint64_t above = 0;  //!< finite values in bins above `bin`
  std::uint64_t need = 0;   //!< values still to take from `bin` (1 .. count(bin)); 0 when k == 0
};

//! Locates the k-th largest finite value of \p h; \p k must not exceed h.finite_count().
[[nodiscard]] inline histogram_boundary find_boundary(const magnitude_histogram& h, std::uint64_t k) noexcept {
  histogram_boundary r;
  if (k == 0 || h.empty()) return r;
  const std::uint32_t top = std::min<std::uint32_t>(h.high_bin(), magnitude_histogram::first_non_finite_bin - 1);
  for (std::uint32_t b = top + 1; b-- > h.low_bin();) {
    const std::uint64_t c = h.count(b);
    if (r.above + c >= k) {
      r.bin = b;
      r.need = k - r.above;
      return r;
    }
    r.above += c;
  }
  r.bin = h.low_bin();  // k exceeds the finite count: everything is above
  r.need = 0;
  return r;
}

//! Adds |g[i] + e[i]| for every i to \p h (u = g + e is formed on the fly, not stored).
inline void add_sum_to_histogram(std::span<const float> g, std::span<const float> e, magnitude_histogram& h) noexcept {
  std::uint32_t kmin = 0xffffffffu, kmax = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const std::uint32_t key = magnitude_key(g[i] + e[i]);
    kmin = std::min(kmin, key);
    kmax = std::max(kmax, key);
    h.add_unchecked(key);
  }
  h.note_range(kmin, kmax);
}

}  // namespace gravac
