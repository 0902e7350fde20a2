#pragma once
//! \file cnn.hpp
//! \brief A small convolutional network: two (3x3 convolution, ReLU, 2x2 max-pool)
//! blocks, then two dense layers. Convolutions are im2col + one GEMM over the whole
//! batch (Eigen), so there is no hand-written matrix multiply.
//!
//! Activations of the convolutional part are kept channel-major across the batch
//! ("CNHW": channel, sample, row, column), which is exactly the layout the GEMM
//! W (C_out x C_in*k*k) * cols (C_in*k*k x N*H*W) produces and the next im2col reads.

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "fmnist/model.hpp"

namespace fmnist {

//! Shape of the small CNN.
struct cnn_shape {
  std::size_t image = 28;      //!< image side (square, one channel)
  std::size_t channels1 = 8;   //!< filters of the first convolution
  std::size_t channels2 = 16;  //!< filters of the second convolution
  std::size_t hidden = 64;     //!< units of the hidden dense layer
  std::size_t classes = 10;    //!< output classes
};

namespace detail {

// One 3x3 (k x k), stride 1, zero-padded ("same") convolution over CNHW activations.
struct conv_geometry {
  std::size_t in_ch, out_ch, side, k, pad;
  [[nodiscard]] std::size_t plane() const noexcept { return side * side; }
  [[nodiscard]] std::size_t patch() const noexcept { return in_ch * k * k; }
};

// cols(r, s*HW + oy*W + ox) = x[c][s][oy + ky - pad][ox + kx - pad] (0 outside), r = (c*k + ky)*k + kx.
inline void im2col(const conv_geometry& g, const float* x, std::size_t n, row_matrix& cols) {
  const std::size_t hw = g.plane(), side = g.side;
  cols.resize(static_cast<Eigen::Index>(g.patch()), static_cast<Eigen::Index>(n * hw));
  for (std::size_t c = 0; c < g.in_ch; ++c)
    for (std::size_t ky = 0; ky < g.k; ++ky)
      for (std::size_t kx = 0; kx < g.k; ++kx) {
        float* row = cols.data() + ((c * g.k + ky) * g.k + kx) * n * hw;
        for (std::size_t s = 0; s < n; ++s) {
          const float* src = x + (c * n + s) * hw;
          float* dst = row + s * hw;
          for (std::size_t oy = 0; oy < side; ++oy) {
            const auto iy = static_cast<std::ptrdiff_t>(oy + ky) - static_cast<std::ptrdiff_t>(g.pad);
            float* d = dst + oy * side;
            if (iy < 0 || iy >= static_cast<std::ptrdiff_t>(side)) {
              std::fill(d, d + side, 0.0f);
              continue;
            }
            const float* srow = src + static_cast<std::size_t>(iy) * side;
            for (std::size_t ox = 0; ox < side; ++ox) {
              const auto ix = static_cast<std::ptrdiff_t>(ox + kx) - static_cast<std::ptrdiff_t>(g.pad);
              d[ox] = (ix < 0 || ix >= static_cast<std::ptrdiff_t>(side)) ? 0.0f : srow[ix];
            }
          }
        }
      }
}

// The adjoint of im2col: dx[c][s][iy][ix] = sum of the cols entries that read it.
inline void col2im(const conv_geometry& g, const row_matrix& dcols, std::size_t n, float* dx) {
  const std::size_t hw = g.plane(), side = g.side;
  std::fill(dx, dx + g.in_ch * n * hw, 0.0f);
  for (std::size_t c = 0; c < g.in_ch; ++c)
    for (std::size_t ky = 0; ky < g.k; ++ky)
      for (std::size_t kx = 0; kx < g.k; ++kx) {
        const float* row = dcols.data() + ((c * g.k + ky) * g.k + kx) * n * hw;
        for (std::size_t s = 0; s < n; ++s) {
          float* dst = dx + (c * n + s) * hw;
          const float* src = row + s * hw;
          for (std::size_t oy = 0; oy < side; ++oy) {
            const auto iy = static_cast<std::ptrdiff_t>(oy + ky) - static_cast<std::ptrdiff_t>(g.pad);
            if (iy < 0 || iy >= static_cast<std::ptrdiff_t>(side)) continue;
            float* drow = dst + static_cast<std::size_t>(iy) * side;
            for (std::size_t ox = 0; ox < side; ++ox) {
              const auto ix = static_cast<std::ptrdiff_t>(ox + kx) - static_cast<std::ptrdiff_t>(g.pad);
              if (ix >= 0 && ix < static_cast<std::ptrdiff_t>(side)) drow[ix] += src[oy * side + ox];
            }
          }
        }
      }
}

// 2x2 max-pool, stride 2, over planes of side x side; remembers which input won.
inline void max_pool(const float* x, std::size_t planes, std::size_t side, float* y, std::vector<std::uint32_t>& arg) {
  const std::size_t o = side / 2;
  arg.resize(planes * o * o);
  for (std::size_t p = 0; p < planes; ++p) {
    const float* src = x + p * side * side;
    for (std::size_t oy = 0; oy < o; ++oy)
      for (std::size_t ox = 0; ox < o; ++ox) {
        std::uint32_t best = static_cast<std::uint32_t>((2 * oy) * side + 2 * ox);
        for (std::size_t dy = 0; dy < 2; ++dy)
          for (std::size_t dx = 0; dx < 2; ++dx) {
            const auto at = static_cast<std::uint32_t>((2 * oy + dy) * side + 2 * ox + dx);
            if (src[at] > src[best]) best = at;
          }
        const std::size_t out = p * o * o + oy * o + ox;
        y[out] = src[best];
        arg[out] = best;
      }
  }
}

// Routes each pooled gradient back to the input that won the max.
inline void max_unpool(const float* dy, std::size_t planes, std::size_t side, const std::vector<std::uint32_t>& arg,
                       float* dx) {
  const std::size_t o = side / 2;
  std::fill(dx, dx + planes * side * side, 0.0f);
  for (std::size_t p = 0; p < planes; ++p)
    for (std::size_t i = 0; i < o * o; ++i) dx[p * side * side + arg[p * o * o + i]] += dy[p * o * o + i];
}

}  // namespace detail

//! conv(3x3, C1) -> ReLU -> pool -> conv(3x3, C2) -> ReLU -> pool -> dense(H) -> ReLU -> dense(10).
//! Convolution weights are "convI.weight" {C_out, C_in, 3, 3} (layer_kind::conv), dense
//! weights "fcI.weight" {out, in} (dense), every bias bias_or_norm.
class cnn final : public model {
 public:
  //! A CNN of shape \p s (the image side must be divisible by 4).
  explicit cnn(const cnn_shape& s = {}) : s_(s) {
    g1_ = {1, s.channels1, s.image, 3, 1};
    g2_ = {s.channels1, s.channels2, s.image / 2, 3, 1};
    flat_ = s.channels2 * (s.image / 4) * (s.image / 4);
    c1w_ = layout_.add("conv1.weight", {s.channels1, 1, 3, 3}, gravac::layer_kind::conv);
    c1b_ = layout_.add("conv1.bias", {s.channels1}, gravac::layer_kind::bias_or_norm);
    c2w_ = layout_.add("conv2.weight", {s.channels2, s.channels1, 3, 3}, gravac::layer_kind::conv);
    c2b_ = layout_.add("conv2.bias", {s.channels2}, gravac::layer_kind::bias_or_norm);
    f1w_ = layout_.add("fc1.weight", {s.hidden, flat_}, gravac::layer_kind::dense);
    f1b_ = layout_.add("fc1.bias", {s.hidden}, gravac::layer_kind::bias_or_norm);
    f2w_ = layout_.add("fc2.weight", {s.classes, s.hidden}, gravac::layer_kind::dense);
    f2b_ = layout_.add("fc2.bias", {s.classes}, gravac::layer_kind::bias_or_norm);
  }

  [[nodiscard]] std::string name() const override {
    return "cnn(conv3x3x" + std::to_string(s_.channels1) + "-pool-conv3x3x" + std::to_string(s_.channels2) +
           "-pool-fc" + std::to_string(s_.hidden) + "-fc" + std::to_string(s_.classes) + ")";
  }

  batch_result forward_backward(std::span<const float> params, const float* x, const int* y, std::size_t n,
                                std::span<float> grads, const gradient_final_fn& on_final = {}) override {
    batch_result r;
    forward(params, x, n);
    const auto announce = [&](std::size_t w, std::size_t b) {
      if (on_final) {
        on_final(w);
        on_final(b);
      }
    };
    detail::softmax_cross_entropy(logits_, y, r, &dlogits_);
    // Dense part: logits = h fc2^T + b, h = relu(feat fc1^T + b).
    dense_grads(grads, f2w_, f2b_, dlogits_, hidden_);
    announce(f2w_, f2b_);
    dhidden_.noalias() = dlogits_ * weights(params, f2w_);
    dhidden_ = (hidden_.array() > 0.0f).select(dhidden_, 0.0f);
    dense_grads(grads, f1w_, f1b_, dhidden_, feat_);
    announce(f1w_, f1b_);
    dfeat_.noalias() = dhidden_ * weights(params, f1w_);
    // Un-flatten into CNHW, through pool 2 and ReLU 2.
    const std::size_t q = s_.image / 4, hw2 = g2_.plane();
    pooled2_.resize(static_cast<Eigen::Index>(s_.channels2), static_cast<Eigen::Index>(n * q * q));
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t c = 0; c < s_.channels2; ++c)
        std::copy_n(dfeat_.data() + s * flat_ + c * q * q, q * q, pooled2_.data() + (c * n + s) * q * q);
    dconv_.resize(static_cast<Eigen::Index>(s_.channels2), static_cast<Eigen::Index>(n * hw2));
    detail::max_unpool(pooled2_.data(), s_.channels2 * n, g2_.side, arg2_, dconv_.data());
    dconv_ = (conv2_.array() > 0.0f).select(dconv_, 0.0f);
    conv_grads(grads, c2w_, c2b_, dconv_, cols2_);
    announce(c2w_, c2b_);
    // Into the first block: dcols = W2^T dY2, col2im, pool 1, ReLU 1.
    dcols_.noalias() = weights(params, c2w_).transpose() * dconv_;
    dpool1_.resize(static_cast<Eigen::Index>(s_.channels1), static_cast<Eigen::Index>(n * g2_.plane()));
    detail::col2im(g2_, dcols_, n, dpool1_.data());
    dconv_.resize(static_cast<Eigen::Index>(s_.channels1), static_cast<Eigen::Index>(n * g1_.plane()));
    detail::max_unpool(dpool1_.data(), s_.channels1 * n, g1_.side, arg1_, dconv_.data());
    dconv_ = (conv1_.array() > 0.0f).select(dconv_, 0.0f);
    conv_grads(grads, c1w_, c1b_, dconv_, cols1_);
    announce(c1w_, c1b_);
    return r;
  }

  batch_result evaluate(std::span<const float> params, const float* x, const int* y, std::size_t n) override {
    batch_result r;
    constexpr std::size_t chunk = 250;
    for (std::size_t at = 0; at < n; at += chunk) {
      const std::size_t m = std::min(chunk, n - at);
      forward(params, x + at * s_.image * s_.image, m);
      detail::softmax_cross_entropy(logits_, y + at, r, nullptr);
    }
    return r;
  }

 private:
  [[nodiscard]] const_row_map weights(std::span<const float> p, std::size_t i) const {
    const auto& l = layout_[i];
    return {p.data() + l.offset, static_cast<Eigen::Index>(l.rows()), static_cast<Eigen::Index>(l.cols())};
  }
  [[nodiscard]] const_vec_map bias(std::span<const float> p, std::size_t i) const {
    const auto& l = layout_[i];
    return {p.data() + l.offset, static_cast<Eigen::Index>(l.numel)};
  }

  // y = relu(W * im2col(x) + b) in CNHW, then 2x2 max-pool.
  void conv_block(std::span<const float> p, const detail::conv_geometry& g, std::size_t wi, std::size_t bi,
                  const float* x, std::size_t n, row_matrix& cols, row_matrix& conv, row_matrix& pooled,
                  std::vector<std::uint32_t>& arg) {
    detail::im2col(g, x, n, cols);
    conv.noalias() = weights(p, wi) * cols;
    conv.colwise() += bias(p, bi);
    conv = conv.cwiseMax(0.0f);
    const std::size_t o = g.side / 2;
    pooled.resize(static_cast<Eigen::Index>(g.out_ch), static_cast<Eigen::Index>(n * o * o));
    detail::max_pool(conv.data(), g.out_ch * n, g.side, pooled.data(), arg);
  }

  void forward(std::span<const float> p, const float* x, std::size_t n) {
    // A single-channel NCHW batch is already CNHW.
    conv_block(p, g1_, c1w_, c1b_, x, n, cols1_, conv1_, pool1_, arg1_);
    conv_block(p, g2_, c2w_, c2b_, pool1_.data(), n, cols2_, conv2_, pool2_, arg2_);
    const std::size_t q = s_.image / 4;
    feat_.resize(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(flat_));
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t c = 0; c < s_.channels2; ++c)
        std::copy_n(pool2_.data() + (c * n + s) * q * q, q * q, feat_.data() + s * flat_ + c * q * q);
    hidden_.noalias() = feat_ * weights(p, f1w_).transpose();
    hidden_.rowwise() += bias(p, f1b_).transpose();
    hidden_ = hidden_.cwiseMax(0.0f);
    logits_.noalias() = hidden_ * weights(p, f2w_).transpose();
    logits_.rowwise() += bias(p, f2b_).transpose();
  }

  // dW = delta^T * in, db = column sums of delta (batch-major dense layer).
  void dense_grads(std::span<float> g, std::size_t wi, std::size_t bi, const row_matrix& delta, const row_matrix& in) {
    const auto& wl = layout_[wi];
    const auto& bl = layout_[bi];
    row_map dw(g.data() + wl.offset, static_cast<Eigen::Index>(wl.rows()), static_cast<Eigen::Index>(wl.cols()));
    vec_map db(g.data() + bl.offset, static_cast<Eigen::Index>(bl.numel));
    dw.noalias() = delta.transpose() * in;
    detail::column_sums(delta, db);  // not colwise().sum(): its bits depend on db's address
  }

  // dW = dY * cols^T, db = row sums of dY (CNHW convolution).
  void conv_grads(std::span<float> g, std::size_t wi, std::size_t bi, const row_matrix& dy, const row_matrix& cols) {
    const auto& wl = layout_[wi];
    const auto& bl = layout_[bi];
    row_map dw(g.data() + wl.offset, static_cast<Eigen::Index>(wl.rows()), static_cast<Eigen::Index>(wl.cols()));
    vec_map db(g.data() + bl.offset, static_cast<Eigen::Index>(bl.numel));
    dw.noalias() = dy * cols.transpose();
    db = dy.rowwise().sum();
  }

  cnn_shape s_;
  detail::conv_geometry g1_{}, g2_{};
  std::size_t flat_ = 0;
  std::size_t c1w_ = 0, c1b_ = 0, c2w_ = 0, c2b_ = 0, f1w_ = 0, f1b_ = 0, f2w_ = 0, f2b_ = 0;
  row_matrix cols1_, conv1_, pool1_, cols2_, conv2_, pool2_, feat_, hidden_, logits_;
  row_matrix dlogits_, dhidden_, dfeat_, pooled2_, dconv_, dcols_, dpool1_;
  std::vector<std::uint32_t> arg1_, arg2_;
};

}  // namespace fmnist
