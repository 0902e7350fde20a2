#pragma once
//! \file powersgd.hpp
//! \brief PowerSGD (Vogels et al. 2019): each matrix-shaped layer M (rows x cols) is sent
//! as a rank-r product P Q^T found by one power iteration with a warm start, with error
//! feedback. Needs Eigen (link gravac::powersgd); aggregate it with low_rank_allreduce.

#if !__has_include(<Eigen/Core>)
#error "gravac/compress/powersgd.hpp needs Eigen 3: link the gravac::powersgd target"
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "gravac/compress/detail/eigen_core.hpp"  // <Eigen/Core>, without GCC 12's false positives
#include "gravac/compress/layered.hpp"
#include "gravac/compress/step_settings.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/random.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/stats/gain_curve.hpp"

namespace gravac {

//! Options of PowerSGD.
struct powersgd_options {
  //! r, the rank of the approximation (at least 1; capped by min(rows, cols)). Also the
  //! workspace: a policy may ask for less per layer and step (powersgd_settings::approximation_rank).
  std::uint32_t rank = 2;
  bool warm_start = true;  //!< reuse last step's Q (the paper's default); false draws Q afresh every step
};

//! Segment encoding of a low-rank layer inside a packet_kind::low_rank packet.
inline constexpr std::uint8_t low_rank_encoding = 1;

//! PowerSGD with error feedback. Models Compressor and LowRankCompressor.
//!
//! Per compressed layer, with u = g + e viewed as M (rows = the first dimension, cols =
//! the product of the others), and Q (cols x r) from the previous step:
//!   P = M Q; P = sum over ranks; P^ = orthonormalize(P) (Gram-Schmidt);
//!   Q_local = M^T P^; e = M - P^ Q_local^T; Q = sum over ranks of Q_local;
//!   result = P^ Q^T / N, and Q / N is kept for the next step (warm start).
//! Because P^ is the same on every rank, the rank average of P^ Q_local^T is P^ (mean Q)^T:
//! two allreduces of r (rows + cols) floats replace one of rows * cols. That needs the
//! three-phase protocol project() / factor() / reconstruct() which low_rank_allreduce
//! drives; a compress-then-gather collective (allgather) cannot run it, which is a compile
//! error (LowRankCompressor, CollectiveAccepts).
//!
//! compress() / decompress_add() also exist (the Compressor contract): they run the same
//! iteration on this rank's M alone and write P^ and Q_local into a packet_kind::low_rank
//! packet. dense_allreduce uses them (each rank's own rank-r approximation, summed densely),
//! which is correct but keeps the warm start per rank.
//!
//! The rank of layer i in a step is min(powersgd_settings::approximation_rank[i],
//! options.rank) when set (> 0, set_step_settings), else options.rank; always capped by
//! min(rows, cols). The kept fraction's value does not set r. Layers sent raw: 1-D layers,
//! layers whose kept fraction is >= 1, and layers where r (rows + cols) >= rows * cols (no
//! saving at the step's r). When a layer's rank changes, its warm start keeps its first columns; the
//! columns dropped are zeroed, so that a later rise draws them afresh (as for a fresh Q).
//! Error feedback invariant: P^ Q_local^T + e_new == u up to one rounding of the
//! subtraction and of the addition (the decoder computes P^ Q_local^T in exactly the order
//! the residual update does).
//! Q columns that are exactly zero (first step, or a zero gradient) are drawn afresh from
//! splitmix64(seed, step, layer id), uniform in [-1, 1): identical on every rank.
class powersgd {
 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! What it acts on (composition.hpp): the rank of each layer's approximation.
  static constexpr decision acts_on = decision::approximation_rank;
  //! Opt-in tag for LowRankCompressor: aggregated by two allreduces (P, then Q).
  using low_rank_tag = void;
  //! Works on host memory.
  using memory_space = host_space;
  //! Options (see powersgd_options).
  using options = powersgd_options;
  //! Per-step settings: the rank per layer (set_step_settings).
  using step_settings = powersgd_settings;
  //! Factors of different ranks cannot be summed elementwise.
  static constexpr bool summable_by_index = false;
  //! Packet kind written by compress().
  static constexpr packet_kind kind = packet_kind::low_rank;

  //! A compressor for \p lay; rejects rank 0. Every workspace is sized here.
  powersgd(const layout& lay, const options& opt = {}) : layout_(lay), options_(opt) {
    require(opt.rank >= 1, "powersgd: rank must be at least 1");
    layers_.resize(lay.size());
    std::size_t q_total = 0, p_total = 0, max_cols = 0;
    for (std::size_t i = 0; i < lay.size(); ++i) {
      auto& s = layers_[i];
      const auto& l = lay[i];
      s.rows = l.rows();
      s.cols = l.cols();
      s.r_max = std::min<std::size_t>({opt.rank, s.rows, s.cols});
      s.r = s.r_max;
      // Compressible at some rank (at least at rank 1); the workspace holds r_max columns.
      s.matrix = l.rank() >= 2 && s.rows >= 2 && s.cols >= 2 && s.rows + s.cols < l.numel;
      if (!s.matrix) continue;
      s.warm_at = q_total;
      q_total += s.cols * s.r_max;
      p_total += s.rows * s.r_max;
      max_cols = std::max(max_cols, s.cols);
    }
    warm_q_.assign(q_total, 0.0f);
    q_buf_.assign(q_total, 0.0f);
    p_buf_.assign(p_total + lay.numel(), 0.0f);  // P factors, then raw layers (at most all)
    row_.assign(max_cols, 0.0f);
    gain_scratch_.reserve(lay.max_layer_numel());
  }

  //! Upper bound of the packet size of compress().
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(layout_, [&](std::size_t i, const layer&) {
      const auto& s = layers_[i];
      return s.matrix ? factor_segment_bytes(s.rows, s.cols, s.r_max) : std::size_t{0};
    });
  }

  //! The ranks of the following steps, one per layer of this layout (0: options.rank;
  //! empty: options.rank everywhere), each capped by options.rank, until set again. Rejects
  //! any other length, keeping the previous settings.
  void set_step_settings(const step_settings& s) {
    require(s.approximation_rank.empty() || s.approximation_rank.size() == layout_.size(),
            "powersgd: approximation_rank must be empty or hold one rank per layer");
    settings_.approximation_rank.assign(s.approximation_rank.begin(), s.approximation_rank.end());
  }
  //! The settings in use (set_step_settings).
  [[nodiscard]] const step_settings& settings() const noexcept { return settings_; }

  // ----- the low-rank protocol (driven by low_rank_allreduce) -----

  //! Phase 1: e += g (e then holds u), P = M Q for the low-rank layers, u of the raw
  //! layers copied out (their e becomes 0). Returns [P factors | raw values], to be summed
  //! over the ranks in place. Fills grad and input norms. Sets each layer's rank for the
  //! step (the step settings' approximation_rank).
  std::span<float> project(host_view g, host_view e, const step_params& p, compress_stats& st) {
    require(g.size() == layout_.numel() && e.size() == layout_.numel(),
            "powersgd: buffer size does not match the layout");
    require(p.kept_fraction.size() == layout_.size(), "powersgd: one kept fraction per layer is required");
    st.reset(layout_.size(), p.gain_candidates.size());
    auto gs = g.span(), es = e.span();
    std::size_t at = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i) {  // P factors first
      auto& s = layers_[i];
      const auto& l = layout_[i];
      s.r = step_rank(i);
      s.low_rank = s.matrix && p.kept_fraction[i] < dense_fraction && s.r * (s.rows + s.cols) < l.numel;
      s.u_max = accumulate(gs.subspan(l.offset, l.numel), es.subspan(l.offset, l.numel), st.layers[i]);
      if (!p.gain_candidates.empty() && l.numel > 0)
        detail::add_reference_gain_curve(es.subspan(l.offset, l.numel), p.gain_candidates, st.candidate_kept_sq,
                                         gain_scratch_);
      if (!s.low_rank) continue;
      s.p_at = at;
      at += s.rows * s.r;
      refresh_warm_start(i, p);
      const auto m = matrix(es, i);
      const auto q = warm(i);
      auto pm = p_factor(i);
      // One pass over M, row by row (Eigen's dot products; a GEMM here could allocate blocks).
      for (Eigen::Index row = 0; row < m.rows(); ++row)
        for (Eigen::Index j = 0; j < q.cols(); ++j) pm(row, j) = m.row(row).dot(q.col(j).transpose());
    }
    for (std::size_t i = 0; i < layout_.size(); ++i) {  // then the raw layers
      auto& s = layers_[i];
      const auto& l = layout_[i];
      if (s.low_rank || l.numel == 0) continue;
      s.p_at = at;
      std::copy_n(es.begin() + static_cast<std::ptrdiff_t>(l.offset), l.numel,
                  p_buf_.begin() + static_cast<std::ptrdiff_t>(at));
      std::fill_n(es.begin() + static_cast<std::ptrdiff_t>(l.offset), l.numel, 0.0f);
      at += l.numel;
      st.layers[i].kept = l.numel;
      st.layers[i].kept_sq = st.layers[i].input_sq;
    }
    p_used_ = at;
    return {p_buf_.data(), at};
  }

  //! Phase 2, after P was summed: P^ = orthonormalize(P), Q_local = M^T P^ and
  //! e = u - P^ Q_local^T. Returns the Q factors, to be summed over the ranks in place.
  std::span<float> factor(host_view e, const step_params& p, compress_stats& st) {
    (void)p;
    auto es = e.span();
    std::size_t at = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      auto& s = layers_[i];
      if (!s.low_rank) continue;
      s.q_at = at;
      at += s.cols * s.r;
      auto pm = p_factor(i);
      orthonormalize(pm);
      const auto m = matrix(es, i);
      auto q = q_factor(i);
      q.setZero();  // Q_local = M^T P^, one pass over M accumulating rows (no GEMM workspace)
      for (Eigen::Index row = 0; row < m.rows(); ++row)
        for (Eigen::Index j = 0; j < q.cols(); ++j) q.col(j).noalias() += pm(row, j) * m.row(row).transpose();
      keep_residual_finite(q, s.u_max);
      subtract_product(i, es);
      // ||P^ Q^T|| = ||Q|| (P^ orthonormal); in double: float squares of |Q| above about
      // 1.8e19 overflow and below about 1e-19 underflow (Q is small: no cost).
      const double kept = q.template cast<double>().squaredNorm();
      st.layers[i].kept = s.r * (s.rows + s.cols);
      st.layers[i].kept_sq = kept;
    }
    q_used_ = at;
    return {q_buf_.data(), at};
  }

  //! Phase 3, after Q was summed: out = P^ (scale * Q)^T for the low-rank layers and
  //! scale * the summed raw values elsewhere; scale * Q becomes the next warm start.
  void reconstruct(host_view out, float scale) {
    auto os = out.span();
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      auto& s = layers_[i];
      const auto& l = layout_[i];
      if (l.numel == 0) continue;
      auto o = os.subspan(l.offset, l.numel);
      if (!s.low_rank) {
        for (std::size_t k = 0; k < l.numel; ++k) o[k] = scale * p_buf_[s.p_at + k];
        continue;
      }
      auto q = q_factor(i);
      q *= scale;
      store_warm(i, q);
      std::fill(o.begin(), o.end(), 0.0f);
      add_product(p_buf_.data() + s.p_at, q_buf_.data() + s.q_at, s.rows, s.cols, s.r, o, 1.0f);
    }
  }

  // ----- the Compressor contract (one rank's own approximation) -----

  //! Runs the power iteration on this rank's u alone and writes P^ and Q_local per
  //! low-rank layer (raw segments elsewhere); e = u - P^ Q_local^T. Q_local becomes the warm start.
  std::size_t compress(host_view g, host_view e, const step_params& p, std::span<std::byte> out, compress_stats& st) {
    project(g, e, p, st);
    factor(e, p, st);
    byte_writer w(out);
    std::byte* head = begin_packet(w);
    std::uint32_t segments = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& s = layers_[i];
      const auto& l = layout_[i];
      if (l.numel == 0) continue;
      segment_header sh;
      sh.layer = static_cast<std::uint32_t>(i);
      sh.numel = l.numel;
      if (s.low_rank) {
        sh.encoding = low_rank_encoding;
        sh.count = s.r;
        write_segment(w, sh, [&](byte_writer& bw) {
          bw.put_array(std::span<const float>(p_buf_.data() + s.p_at, s.rows * s.r));
          bw.put_array(std::span<const float>(q_buf_.data() + s.q_at, s.cols * s.r));
        });
        store_warm(i, q_factor(i));
      } else {
        sh.encoding = raw_encoding;
        sh.count = l.numel;
        write_segment(w, sh,
                      [&](byte_writer& bw) { bw.put_array(std::span<const float>(p_buf_.data() + s.p_at, l.numel)); });
      }
      ++segments;
    }
    finish_packet(w, head, kind, segments, layout_.hash());
    return w.size();
  }

  //! Validates an untrusted packet: per low-rank segment the rank (1..min(rows, cols)),
  //! sizes, and finite factors.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    return validate_layers(packet, layout_, kind, [&](const segment_header& sh, std::span<const std::byte> pl) {
      if (sh.encoding != low_rank_encoding) return validation::fail("low-rank segment: unknown encoding");
      if (sh.index_width != 0) return validation::fail("low-rank segment with indices");
      const auto& l = layout_[sh.layer];
      const std::size_t rows = l.rows(), cols = l.cols();
      if (l.rank() < 2 || sh.count == 0 || sh.count > std::min(rows, cols))
        return validation::fail("low-rank segment: rank out of range");
      const std::size_t r = sh.count;
      if (pl.size() != pad8(rows * r * sizeof(float)) + pad8(cols * r * sizeof(float)))
        return validation::fail("low-rank segment: payload size wrong");
      const std::size_t qa = pad8(rows * r * sizeof(float));
      bool finite = true;
      for (std::size_t k = 0; k < rows * r; ++k) finite &= std::isfinite(load_at<float>(pl, k));
      for (std::size_t k = 0; k < cols * r; ++k) finite &= std::isfinite(load_at<float>(pl.subspan(qa), k));
      if (!finite) return validation::fail("low-rank segment: factor not finite");
      return validation{};
    });
  }

  //! Adds scale * P^ Q^T (or the raw values) to \p out.
  void decompress_add(std::span<const std::byte> packet, host_view out, float scale) const {
    decompress_layers(packet, layout_, out.span(), scale,
                      [&](const segment_header& sh, std::span<const std::byte> pl, std::span<float> o, float s) {
                        const auto& l = layout_[sh.layer];
                        const std::size_t rows = l.rows(), cols = l.cols(), r = sh.count;
                        // Unaligned-safe copies of the factors into the decode workspace.
                        decode_p_.resize(rows * r);  // sized by the first packet of this shape
                        decode_q_.resize(cols * r);
                        std::memcpy(decode_p_.data(), pl.data(), rows * r * sizeof(float));
                        std::memcpy(decode_q_.data(), pl.data() + pad8(rows * r * sizeof(float)),
                                    cols * r * sizeof(float));
                        add_product(decode_p_.data(), decode_q_.data(), rows, cols, r, o, s);
                      });
  }

  //! The warm-start Q of layer \p index (cols x options.rank capped by the shape,
  //! column-major; columns beyond the last step's rank are zero); empty for layers never compressed.
  [[nodiscard]] std::span<const float> warm_start(std::size_t index) const noexcept {
    const auto& s = layers_[index];
    if (!s.matrix) return {};
    return {warm_q_.data() + s.warm_at, s.cols * s.r_max};
  }
  //! The rank layer \p index is sent at when no per-layer rank is asked for (options.rank
  //! capped by the shape; 0 when that rank saves nothing, or the layer is always sent raw).
  [[nodiscard]] std::size_t layer_rank(std::size_t index) const noexcept {
    const auto& s = layers_[index];
    return s.matrix && s.r_max * (s.rows + s.cols) < layout_[index].numel ? s.r_max : 0;
  }
  //! The rank layer \p index was sent at in the last step (0: sent raw, or no step yet).
  [[nodiscard]] std::size_t last_rank(std::size_t index) const noexcept {
    return layers_[index].low_rank ? layers_[index].r : 0;
  }

  //! Bytes of a low-rank segment of a rows x cols layer at rank r.
  static constexpr std::size_t factor_segment_bytes(std::size_t rows, std::size_t cols, std::size_t r) noexcept {
    return sizeof(segment_header) + pad8(rows * r * sizeof(float)) + pad8(cols * r * sizeof(float));
  }

 private:
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using col_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

  struct layer_state {
    std::size_t rows = 0, cols = 0;
    std::size_t r_max = 0;  // workspace columns: options.rank capped by the shape
    std::size_t r = 0;      // this step's rank (<= r_max)
    bool matrix = false;    // compressible at all (shape and size)
    bool low_rank = false;  // compressed this step
    float u_max = 0;        // max |u| of the layer this step
    std::size_t warm_at = 0, p_at = 0, q_at = 0;
  };

  Eigen::Map<row_major> matrix(std::span<float> e, std::size_t i) const {
    const auto& s = layers_[i];
    return {e.data() + layout_[i].offset, static_cast<Eigen::Index>(s.rows), static_cast<Eigen::Index>(s.cols)};
  }
  Eigen::Map<col_major> p_factor(std::size_t i) {
    const auto& s = layers_[i];
    return {p_buf_.data() + s.p_at, static_cast<Eigen::Index>(s.rows), static_cast<Eigen::Index>(s.r)};
  }
  Eigen::Map<col_major> q_factor(std::size_t i) {
    const auto& s = layers_[i];
    return {q_buf_.data() + s.q_at, static_cast<Eigen::Index>(s.cols), static_cast<Eigen::Index>(s.r)};
  }
  Eigen::Map<col_major> warm(std::size_t i) {
    const auto& s = layers_[i];
    return {warm_q_.data() + s.warm_at, static_cast<Eigen::Index>(s.cols), static_cast<Eigen::Index>(s.r)};
  }

  // u = g + e into e, with the layer's norms (u must be materialized for M anyway).
  // Returns max |u| (keep_residual_finite's bound).
  static float accumulate(std::span<const float> g, std::span<float> e, layer_stats& ls) {
    double gsq = 0, usq = 0;
    float mx = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      e[i] += g[i];
      gsq += static_cast<double>(g[i]) * g[i];
      usq += static_cast<double>(e[i]) * e[i];
      mx = std::max(mx, std::fabs(e[i]));
    }
    ls.grad_sq = gsq;
    ls.input_sq = usq;
    return mx;
  }

  // This rank's Q_local may be any matrix (e = M - P^ Q_local^T keeps the invariant), so
  // where the residual could overflow it sends nothing: every entry of P^ Q^T is at most
  // sum_j max |Q_j| (P^ has unit columns), and M - P^ Q^T stays finite while that plus
  // max |M| stays below the float maximum (with a margin for rounding). Only values within
  // a factor of about r sqrt(rows) of the float maximum get there; Q_local is then zero
  // and the residual keeps all of M. Zero columns are redrawn for the next warm start.
  static void keep_residual_finite(Eigen::Map<col_major>& q, float u_max) {
    double bound = u_max;
    for (Eigen::Index j = 0; j < q.cols(); ++j) bound += static_cast<double>(q.col(j).cwiseAbs().maxCoeff());
    if (!q.allFinite() || !(bound * (1.0 + 0x1p-10) < static_cast<double>(std::numeric_limits<float>::max())))
      q.setZero();
  }

  // Multiplies column \p c by a power of two (exact) so its largest |entry| is near 1 when
  // it is outside [2^-40, 2^40]: Gram-Schmidt and the norm are then free of float
  // overflow (squares of |x| above about 1.8e19) and underflow (tiny gradients), and give
  // the same bits as unscaled (every step commutes with a power-of-two scale). Columns in
  // the range, the common case, are left untouched; infinity and NaN too.
  template <class Column>
  static void bring_to_unit_range(Column&& c) {
    const float m = c.cwiseAbs().maxCoeff();
    if (!(m > 0x1p40f || (m > 0 && m < 0x1p-40f)) || !std::isfinite(m)) return;
    const double f = std::ldexp(1.0, -std::ilogb(m));
    c = (c.template cast<double>() * f).template cast<float>();
  }

  // This step's rank of layer \p i: the policy's (capped by the workspace) or options.rank.
  std::size_t step_rank(std::size_t i) const noexcept {
    const auto& s = layers_[i];
    const auto& r = settings_.approximation_rank;
    const std::size_t asked = r.empty() ? 0 : r[i];
    return asked > 0 ? std::min(asked, s.r_max) : s.r_max;
  }

  // The next warm start: \p q in the first r columns, zero in the rest of the workspace
  // (columns a lower rank dropped are drawn afresh if the rank rises again).
  template <class Q>
  void store_warm(std::size_t i, const Q& q) {
    const auto& s = layers_[i];
    warm(i) = q;
    std::fill(warm_q_.begin() + static_cast<std::ptrdiff_t>(s.warm_at + s.cols * s.r),
              warm_q_.begin() + static_cast<std::ptrdiff_t>(s.warm_at + s.cols * s.r_max), 0.0f);
  }

  // Draws the warm-start columns that are exactly zero (or all of them without warm start).
  void refresh_warm_start(std::size_t i, const step_params& p) {
    auto q = warm(i);
    for (Eigen::Index j = 0; j < q.cols(); ++j) {
      if (options_.warm_start && q.col(j).squaredNorm() > 0) continue;
      detail::splitmix64 rng(detail::mix_seed(p.seed, p.step, layout_[i].id ^ static_cast<std::uint64_t>(j)));
      for (Eigen::Index k = 0; k < q.rows(); ++k) q(k, j) = static_cast<float>(2.0 * rng.uniform() - 1.0);
    }
  }

  // Modified Gram-Schmidt, twice ("twice is enough" for orthogonality in float). A column
  // that vanishes (linearly dependent or zero) becomes zero, so its Q column is zero too.
  static void orthonormalize(Eigen::Map<col_major>& pm) {
    for (Eigen::Index j = 0; j < pm.cols(); ++j) {
      auto cj = pm.col(j);
      bring_to_unit_range(cj);  // P^ does not depend on the column's scale
      const float before = cj.norm();
      for (int pass = 0; pass < 2; ++pass)
        for (Eigen::Index k = 0; k < j; ++k) cj -= pm.col(k).dot(cj) * pm.col(k);
      const float n = cj.norm();
      if (n > before * 1e-6f && n > 0 && std::isfinite(n))
        cj /= n;
      else
        cj.setZero();
    }
  }

  // Row by row: d = sum_j P[i, j] * Q[:, j] (j ascending), then e_row -= d. The decoder
  // (add_product) forms d in exactly the same order, so the residual matches what is sent.
  void subtract_product(std::size_t i, std::span<float> e) {
    const auto& s = layers_[i];
    const float* pp = p_buf_.data() + s.p_at;
    const float* qq = q_buf_.data() + s.q_at;
    float* m = e.data() + layout_[i].offset;
    for (std::size_t row = 0; row < s.rows; ++row) {
      row_product(pp, qq, s.rows, s.cols, s.r, row, row_.data());
      float* mr = m + row * s.cols;
      for (std::size_t c = 0; c < s.cols; ++c) mr[c] -= row_[c];
    }
  }

  // out += scale * P Q^T, row by row in the order of subtract_product.
  void add_product(const float* pp, const float* qq, std::size_t rows, std::size_t cols, std::size_t r,
                   std::span<float> out, float scale) const {
    if (row_.size() < cols) row_.resize(cols);  // only for a packet of a shape never seen (decode-only use)
    for (std::size_t row = 0; row < rows; ++row) {
      row_product(pp, qq, rows, cols, r, row, row_.data());
      float* o = out.data() + row * cols;
      for (std::size_t c = 0; c < cols; ++c) o[c] += scale * row_[c];
    }
  }

  static void row_product(const float* pp, const float* qq, std::size_t rows, std::size_t cols, std::size_t r,
                          std::size_t row, float* d) noexcept {
    const float p0 = pp[row];
    for (std::size_t c = 0; c < cols; ++c) d[c] = p0 * qq[c];
    for (std::size_t j = 1; j < r; ++j) {
      const float pj = pp[j * rows + row];
      const float* qj = qq + j * cols;
      for (std::size_t c = 0; c < cols; ++c) d[c] += pj * qj[c];
    }
  }

  layout layout_;
  options options_;
  step_settings settings_;  // set_step_settings
  std::vector<layer_state> layers_;
  std::vector<float> warm_q_;
  std::vector<float> q_buf_;
  std::vector<float> p_buf_;
  mutable std::vector<float> row_;
  mutable std::vector<float> decode_p_, decode_q_;
  std::vector<double> gain_scratch_;
  std::size_t p_used_ = 0, q_used_ = 0;
};
static_assert(Compressor<powersgd>);
static_assert(LowRankCompressor<powersgd>);

}  // namespace gravac
