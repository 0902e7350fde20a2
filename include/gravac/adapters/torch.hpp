#pragma once
//! \file torch.hpp
//! \brief LibTorch adapter: a layout and one flat gradient buffer built from a
//! torch::nn::Module's parameters, with the module's gradients living in that buffer.
//!
//! \code
//! auto net = std::make_shared<Net>();
//! gravac::torch_gradients grads(*net);           // .grad() of every parameter is now a slice of one buffer
//! gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy> t{comm, grads.get_layout(), opt};
//! torch::optim::SGD sgd(net->parameters(), 0.1);
//! for (...) {
//!   sgd.zero_grad();                             // zeroes the buffer in place
//!   loss_fn(net->forward(x), y).backward();     // LibTorch accumulates into the buffer
//!   grads.step(t);                               // compress, aggregate, average: in place
//!   sgd.step();                                  // reads the averaged gradient
//! }
//! \endcode
//!
//! Link gravac::torch (created when CMake finds LibTorch). Host (CPU) float32
//! parameters only: LibTorch's CUDA tensors would need gravac's device compressors.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "gravac/error.hpp"
#include "gravac/layout.hpp"
#include "gravac/step.hpp"

namespace gravac {

//! The layer kind of parameter \p param of a module whose type name is \p module_type
//! (as torch::nn::Module::name() gives it, e.g. "torch::nn::Conv2dImpl").
//!
//! 1-D (and scalar) parameters and every parameter of a normalization module are
//! bias_or_norm; Conv* modules give conv, LSTM/GRU/RNN (and their cells) recurrent,
//! Linear/Bilinear/Embedding dense. Parameters of other modules go by shape: three or
//! more dimensions conv, two dense.
inline layer_kind torch_layer_kind(std::string_view module_type, const torch::Tensor& param) {
  const auto has = [&](std::string_view s) { return module_type.find(s) != std::string_view::npos; };
  if (param.dim() <= 1 || has("Norm")) return layer_kind::bias_or_norm;
  if (has("Conv")) return layer_kind::conv;
  if (has("LSTM") || has("GRU") || has("RNN")) return layer_kind::recurrent;
  if (has("Linear") || has("Embedding")) return layer_kind::dense;
  return param.dim() >= 3 ? layer_kind::conv : layer_kind::dense;
}

//! Options of torch_gradients.
struct torch_gradients_options {
  //! Optional override of the layer kind: called with the parameter's qualified name
  //! ("conv1.weight"), its module's type name and the parameter; std::nullopt keeps
  //! torch_layer_kind's choice.
  std::function<std::optional<layer_kind>(const std::string&, std::string_view, const torch::Tensor&)> classify;
};

//! The gradients of a torch::nn::Module as one flat float buffer described by a layout.
//!
//! Construction allocates one contiguous 1-D tensor and makes every trainable
//! parameter's `.grad()` an alias of its slice (no copies: LibTorch's backward
//! accumulates into the buffer in place, and trainer::step averages it in place, so the
//! optimizer reads the averaged gradient). Parameters come in the module's registration
//! order, depth first, which is the same on every rank for the same model code; shared
//! parameters appear once, frozen ones (requires_grad false) not at all.
//!
//! The aliases are detached (not autograd views), so Optimizer::zero_grad() and
//! Module::zero_grad() zero them in place and keep them. Module::zero_grad(true) (set to
//! none) detaches them from the buffer: call attach() afterwards, or step() will throw.
//! The module must outlive this object and keep its parameters.
class torch_gradients {
 public:
  //! Options (see torch_gradients_options).
  using options = torch_gradients_options;

  //! Builds the layout and buffer of \p model's trainable parameters and attaches the
  //! gradients. Throws gravac::error for a parameter that is not CPU float32 or a model
  //! without trainable parameters.
  explicit torch_gradients(torch::nn::Module& model, const options& opt = {}) {
    std::unordered_set<const void*> seen;
    const auto add_module = [&](const std::string& prefix, const torch::nn::Module& m) {
      const std::string type = m.name();
      for (const auto& item : m.named_parameters(/*recurse=*/false)) {
        const torch::Tensor& p = item.value();
        // Undefined (bias = false), frozen and already seen (shared) parameters are skipped.
        if (!p.defined() || !p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
        const std::string name = prefix.empty() ? item.key() : prefix + "." + item.key();
        require(p.device().is_cpu() && p.scalar_type() == torch::kFloat32,
                "torch_gradients: parameter '" + name + "' is not a CPU float32 tensor");
        std::optional<layer_kind> kind;
        if (opt.classify) kind = opt.classify(name, type, p);
        std::vector<std::size_t> shape;
        for (auto s : p.sizes()) shape.push_back(static_cast<std::size_t>(s));
        if (shape.empty()) shape.push_back(1);  // a scalar parameter is a 1-element layer
        layout_.add(name, std::move(shape), kind.value_or(torch_layer_kind(type, p)));
        params_.push_back(p);
      }
    };
    add_module("", model);
    // include_self = false: named_modules() on the root would need it held by a shared_ptr.
    for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false))
      add_module(item.key(), *item.value());
    require(!params_.empty(), "torch_gradients: the model has no trainable parameters");
    flat_ = torch::zeros({static_cast<std::int64_t>(layout_.numel())}, torch::dtype(torch::kFloat32));
    attach();
  }

  //! The layout of the trainable parameters, in buffer order.
  [[nodiscard]] const layout& get_layout() const noexcept { return layout_; }
  //! The flat gradient buffer as a 1-D float32 tensor (shares memory with every grad).
  [[nodiscard]] const torch::Tensor& flat() const noexcept { return flat_; }
  //! The flat gradient buffer, for trainer::step.
  [[nodiscard]] std::span<float> grads() noexcept {
    return {flat_.data_ptr<float>(), static_cast<std::size_t>(flat_.numel())};
  }
  //! The trainable parameters, in layout order.
  [[nodiscard]] const std::vector<torch::Tensor>& parameters() const noexcept { return params_; }

  //! Makes every parameter's gradient the slice of the buffer its layer describes,
  //! keeping the values it had when it was already attached. A gradient that was
  //! replaced (set to none, or assigned) is copied into its slice first.
  void attach() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& l = layout_[i];
      // detach(): a plain alias, not an autograd view, so detach_() in zero_grad works.
      auto slice = flat_.narrow(0, static_cast<std::int64_t>(l.offset), static_cast<std::int64_t>(l.numel))
                       .view(params_[i].sizes())
                       .detach();
      auto& g = params_[i].mutable_grad();
      if (g.defined() && g.data_ptr() != slice.data_ptr()) slice.copy_(g);
      g = slice;
    }
  }

  //! True when every parameter's gradient still lives in the buffer.
  [[nodiscard]] bool attached() const {
    const float* base = flat_.data_ptr<float>();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const auto& g = params_[i].grad();
      if (!g.defined() || g.scalar_type() != torch::kFloat32 || !g.is_contiguous() ||
          g.data_ptr<float>() != base + layout_[i].offset)
        return false;
    }
    return true;
  }

  //! Zeroes the whole buffer at once (what Optimizer::zero_grad does, one parameter at a time).
  void zero_grad() {
    torch::NoGradGuard no_grad;
    flat_.zero_();
  }

  //! Runs \p t.step on the buffer: every rank's gradients become their (compressed)
  //! average, in place, where the optimizer reads them. Throws gravac::error when a
  //! gradient was moved out of the buffer (see attach()).
  template <class Trainer>
  const step_report& step(Trainer& t) {
    if (!attached())
      throw error(status::invalid_argument,
                  "torch_gradients::step: a parameter's gradient no longer lives in the flat buffer "
                  "(zero_grad(set_to_none) or an assignment replaced it); call attach() after such calls");
    return t.step(grads());
  }

 private:
  layout layout_;
  std::vector<torch::Tensor> params_;
  torch::Tensor flat_;
};

}  // namespace gravac
