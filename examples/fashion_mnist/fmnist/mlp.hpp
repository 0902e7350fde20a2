#pragma once
//! \file mlp.hpp
//! \brief A multi-layer perceptron (dense + ReLU, softmax output) over flat buffers.

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "fmnist/model.hpp"

namespace fmnist {

//! Dense layers with ReLU between them. Weights are (out x in) row-major ("fcI.weight",
//! layer_kind::dense), biases ("fcI.bias", layer_kind::bias_or_norm).
class mlp final : public model {
 public:
  //! An MLP \p inputs -> hidden... -> \p classes.
  mlp(std::size_t inputs, std::vector<std::size_t> hidden, std::size_t classes) {
    sizes_.push_back(inputs);
    sizes_.insert(sizes_.end(), hidden.begin(), hidden.end());
    sizes_.push_back(classes);
    for (std::size_t i = 0; i + 1 < sizes_.size(); ++i) {
      w_.push_back(
          layout_.add("fc" + std::to_string(i + 1) + ".weight", {sizes_[i + 1], sizes_[i]}, gravac::layer_kind::dense));
      b_.push_back(
          layout_.add("fc" + std::to_string(i + 1) + ".bias", {sizes_[i + 1]}, gravac::layer_kind::bias_or_norm));
    }
    act_.resize(sizes_.size());
  }

  [[nodiscard]] std::string name() const override {
    std::string s = "mlp(";
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      // Appended piece by piece: `"-" + std::to_string(...)` trips GCC 12's -Wrestrict
      // false positive in std::string's operator+.
      if (i) s += '-';
      s += std::to_string(sizes_[i]);
    }
    return s + ")";
  }

  batch_result forward_backward(std::span<const float> params, const float* x, const int* y, std::size_t n,
                                std::span<float> grads, const gradient_final_fn& on_final = {}) override {
    batch_result r;
    forward(params, x, n);
    detail::softmax_cross_entropy(act_.back(), y, r, &delta_);
    // delta_ holds dL/dZ of the current layer; walk back through the layers.
    for (std::size_t i = w_.size(); i-- > 0;) {
      const auto& wl = layout_[w_[i]];
      const auto& bl = layout_[b_[i]];
      row_map dw(grads.data() + wl.offset, static_cast<Eigen::Index>(wl.rows()), static_cast<Eigen::Index>(wl.cols()));
      vec_map db(grads.data() + bl.offset, static_cast<Eigen::Index>(bl.numel));
      const row_matrix* in = i == 0 ? nullptr : &act_[i];
      if (in) {
        dw.noalias() = delta_.transpose() * *in;
      } else {
        const_row_map xin(x, static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(sizes_[0]));
        dw.noalias() = delta_.transpose() * xin;
      }
      detail::column_sums(delta_, db);  // not colwise().sum(): its bits depend on db's address
      if (on_final) {
        on_final(w_[i]);
        on_final(b_[i]);
      }
      if (i == 0) break;
      const_row_map w(params.data() + wl.offset, static_cast<Eigen::Index>(wl.rows()),
                      static_cast<Eigen::Index>(wl.cols()));
      // dL/dA of the layer below, then through its ReLU (act_[i] is its output).
      back_.noalias() = delta_ * w;
      delta_ = (act_[i].array() > 0.0f).select(back_, 0.0f);
    }
    return r;
  }

  batch_result evaluate(std::span<const float> params, const float* x, const int* y, std::size_t n) override {
    batch_result r;
    constexpr std::size_t chunk = 500;
    for (std::size_t at = 0; at < n; at += chunk) {
      const std::size_t m = std::min(chunk, n - at);
      forward(params, x + at * sizes_[0], m);
      detail::softmax_cross_entropy(act_.back(), y + at, r, nullptr);
    }
    return r;
  }

 private:
  // act_[i] (i >= 1) is the output of layer i: ReLU'd for hidden layers, logits for the last.
  void forward(std::span<const float> params, const float* x, std::size_t n) {
    for (std::size_t i = 0; i < w_.size(); ++i) {
      const auto& wl = layout_[w_[i]];
      const auto& bl = layout_[b_[i]];
      const_row_map w(params.data() + wl.offset, static_cast<Eigen::Index>(wl.rows()),
                      static_cast<Eigen::Index>(wl.cols()));
      const_vec_map b(params.data() + bl.offset, static_cast<Eigen::Index>(bl.numel));
      auto& out = act_[i + 1];
      if (i == 0) {
        const_row_map xin(x, static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(sizes_[0]));
        out.noalias() = xin * w.transpose();
      } else {
        out.noalias() = act_[i] * w.transpose();
      }
      out.rowwise() += b.transpose();
      if (i + 1 < w_.size()) out = out.cwiseMax(0.0f);
    }
  }

  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> w_, b_;  // layer indices in the layout
  std::vector<row_matrix> act_;
  row_matrix delta_, back_;
};

}  // namespace fmnist
