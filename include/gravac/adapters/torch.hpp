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

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"

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

//! Overlaps a trainer's step with LibTorch's backward, as PyTorch DDP does: a hook on every
//! parameter's gradient accumulator tells the trainer that the parameter's gradient is
//! final (trainer::ready), so each bucket is compressed and aggregated on the trainer's
//! communication thread while backward goes on with the layers below.
//!
//! \code
//! gravac::torch_gradients grads(*net);
//! gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy> t{comm, grads.get_layout(), opt};
//! gravac::torch_backward_hooks<decltype(t)> hooks(grads, t);
//! for (...) {
//!   sgd.zero_grad();
//!   hooks.begin_step();                        // the policy fixes the step's decisions
//!   loss_fn(net->forward(x), y).backward();    // buckets start as their gradients are final
//!   hooks.finish();                            // waits for the last buckets
//!   sgd.step();
//! }
//! \endcode
//!
//! A parameter that gets no gradient in a backward is marked ready by finish(). With
//! gradient accumulation over several backward passes, call begin_step() before the last
//! one only. The hooks are removed when this object goes; it must not outlive the model,
//! \p grads or the trainer.
template <class Trainer>
class torch_backward_hooks {
 public:
  //! Installs the hooks on the gradient accumulators of \p grads' parameters.
  torch_backward_hooks(torch_gradients& grads, Trainer& t) : grads_(grads), trainer_(t) {
    require(t.get_layout().hash() == grads.get_layout().hash(),
            "torch_backward_hooks: the trainer's layout is not the gradients' layout");
    const auto& params = grads.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      // The accumulator is held here: the parameter keeps only a weak reference, so a
      // hook on an accumulator nobody holds could vanish between backward passes.
      auto acc = torch::autograd::impl::grad_accumulator(params[i]);
      require(acc != nullptr, "torch_backward_hooks: parameter '" + grads.get_layout()[i].name +
                                  "' has no gradient accumulator (not a leaf that requires grad)");
      const auto key = acc->add_post_hook(std::make_unique<ready_hook>(this, i));
      hooks_.push_back({std::move(acc), key});
    }
  }
  torch_backward_hooks(const torch_backward_hooks&) = delete;
  torch_backward_hooks& operator=(const torch_backward_hooks&) = delete;
  //! Removes the hooks.
  ~torch_backward_hooks() {
    for (auto& h : hooks_) h.accumulator->del_post_hook(h.key);
  }

  //! Starts the trainer's asynchronous step on the flat buffer (call after zero_grad,
  //! before backward). Throws gravac::error when a gradient left the buffer (attach()).
  void begin_step() {
    if (!grads_.attached())
      throw error(status::invalid_argument,
                  "torch_backward_hooks::begin_step: a parameter's gradient no longer lives in the flat buffer "
                  "(zero_grad(set_to_none) or an assignment replaced it); call attach() after such calls");
    std::lock_guard lock(m_);
    trainer_.begin_step(grads_.grads());
    active_ = true;
  }
  //! Ends the step after backward: waits for every bucket and returns the step's report.
  const step_report& finish() {
    std::lock_guard lock(m_);
    active_ = false;
    return trainer_.finish();
  }

 private:
  // Runs after AccumulateGrad has added the parameter's gradient into its slice.
  struct ready_hook final : torch::autograd::FunctionPostHook {
    ready_hook(torch_backward_hooks* owner, std::size_t layer) noexcept : owner(owner), layer(layer) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      owner->on_ready(layer);
      return outputs;
    }
    torch_backward_hooks* owner;
    std::size_t layer;
  };
  struct installed {
    std::shared_ptr<torch::autograd::Node> accumulator;
    std::uintptr_t key;
  };

  // Backward outside a step (evaluation with grad, a warm-up) is not the step's.
  void on_ready(std::size_t layer) {
    std::lock_guard lock(m_);  // autograd may run hooks on its own threads
    if (active_) trainer_.ready(layer);
  }

  torch_gradients& grads_;
  Trainer& trainer_;
  std::vector<installed> hooks_;
  std::mutex m_;
  bool active_ = false;
};

}  // namespace gravac
