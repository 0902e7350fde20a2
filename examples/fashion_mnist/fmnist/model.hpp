#pragma once
//! \file model.hpp
//! \brief The interface of the example's models: parameters and gradients live in flat
//! buffers described by a gravac::layout, so the gradient a model writes is exactly the
//! buffer gravac's trainer steps on.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <gravac/compress/detail/eigen_core.hpp>  // <Eigen/Core>, without GCC 12's false positives
#include <gravac/layout.hpp>
#include <memory>
#include <random>
#include <span>
#include <string>

namespace fmnist {

//! Row-major float matrix (the models keep batch-major activations).
using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
//! View of a flat buffer as a row-major matrix.
using row_map = Eigen::Map<row_matrix>;
//! Read-only view of a flat buffer as a row-major matrix.
using const_row_map = Eigen::Map<const row_matrix>;
//! View of a flat buffer as a column vector.
using vec_map = Eigen::Map<Eigen::VectorXf>;
//! Read-only view of a flat buffer as a column vector.
using const_vec_map = Eigen::Map<const Eigen::VectorXf>;

//! What a forward pass over some samples measured.
struct batch_result {
  double loss_sum = 0;      //!< sum over samples of the cross-entropy loss
  std::size_t correct = 0;  //!< samples whose largest logit is the label
  std::size_t samples = 0;  //!< samples seen
};

//! Called by forward_backward with a layer's index in the layout as soon as backward has
//! written that layer's gradient for good (weights and biases each), in backward order:
//! what an asynchronous gravac step needs (trainer::ready), so that a bucket's compression
//! and communication start while backward goes on below it. The model does not touch a
//! layer's gradient after announcing it.
using gradient_final_fn = std::function<void(std::size_t layer)>;

//! A classifier over flat parameters: forward, backward into a flat gradient, evaluation.
//! One object per rank (it owns activation workspaces, sized for the largest batch seen).
class model {
 public:
  virtual ~model() = default;

  //! The parameter tensors, in buffer order, each with its gravac layer kind.
  [[nodiscard]] const gravac::layout& get_layout() const noexcept { return layout_; }
  //! Number of parameters (the length of the parameter and gradient buffers).
  [[nodiscard]] std::size_t num_params() const noexcept { return layout_.numel(); }
  //! Short name, e.g. "mlp(784-256-128-10)".
  [[nodiscard]] virtual std::string name() const = 0;

  //! Initialises \p params from \p seed (He-normal weights, zero biases): the same seed
  //! gives the same parameters on every rank.
  void init(std::span<float> params, std::uint64_t seed) const {
    std::mt19937_64 rng(seed);
    for (const auto& l : layout_.layers()) {
      float* p = params.data() + l.offset;
      if (l.kind == gravac::layer_kind::bias_or_norm) {
        std::fill(p, p + l.numel, 0.0f);
        continue;
      }
      const double fan_in = static_cast<double>(l.cols());
      std::normal_distribution<float> nd(0.0f, static_cast<float>(std::sqrt(2.0 / fan_in)));
      for (std::size_t i = 0; i < l.numel; ++i) p[i] = nd(rng);
    }
  }

  //! Forward and backward over \p n samples (\p x: n images back to back, \p y: labels).
  //! Overwrites \p grads with the gradient of the mean loss over these samples and
  //! returns the loss sum and accuracy counts. \p on_final, when set, is called for every
  //! layer once, as soon as its gradient is final (gradient_final_fn), last layers first.
  virtual batch_result forward_backward(std::span<const float> params, const float* x, const int* y, std::size_t n,
                                        std::span<float> grads, const gradient_final_fn& on_final = {}) = 0;

  //! Forward only over \p n samples, in chunks, returning loss sum and correct count.
  virtual batch_result evaluate(std::span<const float> params, const float* x, const int* y, std::size_t n) = 0;

 protected:
  gravac::layout layout_;  //!< filled by the derived model's constructor
};

namespace detail {

//! Writes the column sums of \p m (0 + row 0 + row 1 + ..., in row order) into \p out: the
//! bias gradient of a batch-major layer. Not `out = m.colwise().sum().transpose()`: \p out
//! maps the flat gradient buffer, which is only float-aligned, and Eigen evaluates the
//! unaligned head of such a destination coefficient by coefficient (a sequential sum down
//! the column) and the rest in packets (rows added four at a time, pairwise): two summation
//! orders, and which elements take which depends on the buffer's address modulo the vector
//! width (64 bytes with AVX-512), i.e. on what the allocator handed back. A run that
//! followed other runs in the process (whose freed blocks, from whichever thread arena a
//! rank got, shifted that address) then computed different last bits than the same run
//! alone. Adding whole rows is elementwise, so every element is summed in the same order in
//! packets and in scalars alike, wherever the buffer lies.
inline void column_sums(const row_matrix& m, vec_map out) {
  out.setZero();
  for (Eigen::Index i = 0; i < m.rows(); ++i) out += m.row(i).transpose();
}

//! Softmax cross-entropy over the rows of \p logits (n x classes) with labels \p y:
//! adds the loss and hits to \p r and, when \p dlogits is given, writes
//! d(mean loss)/d(logits) = (softmax - onehot) / n into it.
inline void softmax_cross_entropy(const row_matrix& logits, const int* y, batch_result& r, row_matrix* dlogits) {
  const auto n = logits.rows(), k = logits.cols();
  if (dlogits) dlogits->resize(n, k);
  for (Eigen::Index i = 0; i < n; ++i) {
    Eigen::Index arg = 0;
    const float mx = logits.row(i).maxCoeff(&arg);
    const Eigen::ArrayXf e = (logits.row(i).array() - mx).exp().transpose();
    const float z = e.sum();
    r.loss_sum += static_cast<double>(std::log(z) - (logits(i, y[i]) - mx));
    r.correct += arg == y[i] ? 1u : 0u;
    if (dlogits) {
      dlogits->row(i) = (e / (z * static_cast<float>(n))).matrix().transpose();
      (*dlogits)(i, y[i]) -= 1.0f / static_cast<float>(n);
    }
  }
  r.samples += static_cast<std::size_t>(n);
}

}  // namespace detail

}  // namespace fmnist
