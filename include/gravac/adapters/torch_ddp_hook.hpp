#pragma once
//! \file torch_ddp_hook.hpp
//! \brief A DDP communication hook backed by a gravac trainer: DDP's buckets feed one
//! trainer over the whole model, whose compressor, collective and policy replace DDP's
//! Allreduce.
//!
//! DDP calls a hook once per bucket, in bucket order, as backward fills them. The hook
//! copies the bucket's gradients into the trainer's flat buffer (the model's trainable
//! parameters in registration order) and marks their layers ready, so the trainer's own
//! buckets are compressed and aggregated on its communication thread while backward goes
//! on. The last bucket's call ends the step and writes every bucket's averaged gradient
//! back; the futures DDP waits on complete then. Because the trainer's layout is the
//! model's, not DDP's buckets, error feedback, the policy's state and checkpoints stay
//! the same when DDP rebuilds its buckets (after the first step) or when a resumed run
//! starts with other buckets.
//!
//! \code
//! // C++: a c10d::Reducer built by the program (what PyTorch's DDP builds)
//! gravac::process_group_communicator comm(pg);
//! auto params = gravac::ddp_parameters(*model);
//! gravac::trainer<gravac::topk, gravac::allgather, gravac::gravac_policy> t{comm, gravac::ddp_layout(params)};
//! gravac::ddp_hook_core<decltype(t)> core(t, params);
//! reducer->register_comm_hook(std::make_unique<gravac::ddp_comm_hook<decltype(t)>>(core));
//! \endcode
//!
//! From Python, `gravac.torch.ddp_hook` wraps the same core (python/). Link gravac::torch.

#include <torch/nn/module.h>
#include <torch/torch.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gravac/adapters/torch.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"

namespace gravac {

//! A trainable parameter as the hook sees it: its qualified name ("fc1.weight"), the type
//! name of the module that owns it ("Linear", "torch::nn::LinearImpl") and the tensor.
struct ddp_parameter {
  std::string name;         //!< qualified name, the layer's name (and stable id) in the layout
  std::string module_type;  //!< owner's type name: chooses the layer kind (torch_layer_kind)
  torch::Tensor tensor;     //!< the parameter
};

//! The trainable parameters of \p model in registration order, depth first, shared ones
//! once: the order DDP and torch_gradients use.
inline std::vector<ddp_parameter> ddp_parameters(torch::nn::Module& model) {
  std::vector<ddp_parameter> out;
  std::unordered_set<const void*> seen;
  const auto add = [&](const std::string& prefix, const torch::nn::Module& m) {
    for (const auto& item : m.named_parameters(/*recurse=*/false)) {
      const torch::Tensor& p = item.value();
      if (!p.defined() || !p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
      out.push_back({prefix.empty() ? item.key() : prefix + "." + item.key(), m.name(), p});
    }
  };
  add("", model);
  for (const auto& item : model.named_modules("", /*include_self=*/false)) add(item.key(), *item.value());
  return out;
}

//! The layout of \p params, in their order: one layer per parameter, named after it, its
//! kind from its module's type (torch_layer_kind). Throws gravac::error for a parameter that
//! is not a CPU float32 tensor, a repeated name, or an empty list.
inline layout ddp_layout(const std::vector<ddp_parameter>& params) {
  require(!params.empty(), "ddp_layout: no trainable parameters");
  layout lay;
  std::unordered_set<std::string> names;
  for (const auto& p : params) {
    require(p.tensor.defined() && p.tensor.device().is_cpu() && p.tensor.scalar_type() == torch::kFloat32,
            "ddp_layout: parameter '" + p.name + "' is not a CPU float32 tensor");
    require(names.insert(p.name).second, "ddp_layout: parameter name '" + p.name + "' appears twice");
    std::vector<std::size_t> shape;
    for (auto s : p.tensor.sizes()) shape.push_back(static_cast<std::size_t>(s));
    if (shape.empty()) shape.push_back(1);
    lay.add(p.name, std::move(shape), torch_layer_kind(p.module_type, p.tensor));
  }
  return lay;
}

//! The state behind a DDP communication hook: a trainer (or anything with its
//! begin_step / ready / finish), the flat gradient buffer it steps, and the buckets of the
//! step in progress. One per rank; DDP calls it from its autograd thread.
template <class Stepper>
class ddp_hook_core {
 public:
  //! Feeds \p stepper, whose layout must be ddp_layout(\p params): \p params are the
  //! parameters DDP reduces, in layout order. Both must outlive this object.
  //! With \p overlap false the buckets are only copied as they come and the last one runs
  //! the trainer's synchronous step(): no communication thread, and no overlap with backward
  //! (cheaper where backward is short, as for a small model on few cores).
  ddp_hook_core(Stepper& stepper, const std::vector<ddp_parameter>& params, bool overlap = true)
      : stepper_(stepper), overlap_(overlap) {
    layout lay = ddp_layout(params);
    require(stepper.get_layout().hash() == lay.hash(),
            "ddp_hook_core: the trainer's layout is not the layout of the parameters (build it with ddp_layout)");
    offsets_.reserve(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      layer_of_.emplace(params[i].tensor.unsafeGetTensorImpl(), i);
      offsets_.push_back({lay[i].offset, lay[i].numel});
    }
    flat_.assign(lay.numel(), 0.0f);
    seen_.assign(params.size(), false);
  }
  ddp_hook_core(const ddp_hook_core&) = delete;
  ddp_hook_core& operator=(const ddp_hook_core&) = delete;

  //! DDP's bucket \p index: its flat \p buffer, its \p params and their \p grads (views into
  //! the buffer, in the same order). Copies the gradients into the trainer's buffer and
  //! marks their layers ready (the first bucket of a step starts the trainer's step). With
  //! \p is_last the step ends: every bucket's buffer of the step receives its averaged
  //! gradient and true is returned. Throws gravac::error for a parameter the hook does not
  //! know, a bucket seen twice in a step, or a failed step; the step is then abandoned and
  //! the next bucket starts a new one.
  bool on_bucket(std::size_t index, const torch::Tensor& buffer, const std::vector<torch::Tensor>& params,
                 const std::vector<torch::Tensor>& grads, bool is_last) {
    std::lock_guard lock(m_);
    try {
      require(params.size() == grads.size(), "ddp hook: a bucket's parameters and gradients differ in number");
      require(buffer.device().is_cpu() && buffer.scalar_type() == torch::kFloat32 && buffer.is_contiguous(),
              "ddp hook: the bucket is not a contiguous CPU float32 tensor");
      for (const auto& b : pending_)
        require(b.index != index, "ddp hook: bucket " + std::to_string(index) +
                                      " came twice in one step (did a backward end without its last bucket?)");
      // The whole bucket is checked before the step starts or a layer is marked ready.
      bucket_slot slot{index, buffer, {}};
      const float* base = buffer.data_ptr<float>();
      for (std::size_t j = 0; j < params.size(); ++j) {
        const auto it = layer_of_.find(params[j].unsafeGetTensorImpl());
        require(it != layer_of_.end(), "ddp hook: a bucket holds a parameter the hook was not built with");
        const std::size_t layer = it->second;
        require(!seen_[layer], "ddp hook: a parameter came twice in one step");
        const auto& g = grads[j];
        require(g.scalar_type() == torch::kFloat32 && g.is_contiguous() &&
                    static_cast<std::size_t>(g.numel()) == offsets_[layer].numel,
                "ddp hook: a gradient is not a contiguous float32 view of its parameter's size");
        const float* src = g.data_ptr<float>();
        require(src >= base && src + offsets_[layer].numel <= base + buffer.numel(),
                "ddp hook: a gradient does not lie in its bucket's buffer");
        slot.layers.push_back({layer, static_cast<std::size_t>(src - base)});
      }
      if (!in_step_) {
        if (overlap_) stepper_.begin_step(std::span<float>(flat_));
        in_step_ = true;
      }
      for (const auto& l : slot.layers) {
        std::memcpy(flat_.data() + offsets_[l.layer].offset, base + l.at, offsets_[l.layer].numel * sizeof(float));
        seen_[l.layer] = true;
        if (overlap_) stepper_.ready(l.layer);
      }
      pending_.push_back(std::move(slot));
      if (!is_last) return false;
      for (std::size_t l = 0; l < seen_.size(); ++l)
        require(seen_[l],
                "ddp hook: the last bucket came and a parameter had not (is it left out of DDP, by "
                "parameters_to_ignore?)");
      in_step_ = false;
      report_ = overlap_ ? stepper_.finish() : stepper_.step(std::span<float>(flat_));
      for (auto& b : pending_) {
        float* out = b.buffer.template data_ptr<float>();
        for (const auto& l : b.layers)
          std::memcpy(out + l.at, flat_.data() + offsets_[l.layer].offset, offsets_[l.layer].numel * sizeof(float));
      }
      reset();
      return true;
    } catch (...) {
      abandon();
      throw;
    }
  }

  //! The report of the last completed step.
  [[nodiscard]] const step_report& last_report() const noexcept { return report_; }
  //! The trainer.
  [[nodiscard]] Stepper& stepper() noexcept { return stepper_; }
  //! Whether a step is in progress (a bucket came, the last one did not yet).
  [[nodiscard]] bool in_step() const noexcept { return in_step_; }

 private:
  struct span_of {
    std::size_t offset, numel;
  };
  struct layer_at {
    std::size_t layer, at;  // the layer, and where its gradient starts in the bucket
  };
  struct bucket_slot {
    std::size_t index;
    torch::Tensor buffer;
    std::vector<layer_at> layers;
  };
  void reset() {
    pending_.clear();
    std::fill(seen_.begin(), seen_.end(), false);
  }
  // A failure once the step started ends it: with overlap the trainer finishes it (so this
  // rank makes the collectives the other ranks are in, and none waits forever) and its own
  // error, if any, is dropped (the caller gets the first one); the next backward starts
  // afresh. Without overlap nothing was sent yet.
  void abandon() noexcept {
    if (in_step_ && overlap_) {
      try {
        stepper_.finish();
      } catch (...) {
      }
    }
    in_step_ = false;
    reset();
  }

  Stepper& stepper_;
  std::unordered_map<const void*, std::size_t> layer_of_;
  std::vector<span_of> offsets_;
  std::vector<float> flat_;
  std::vector<bool> seen_;
  std::vector<bucket_slot> pending_;
  bool overlap_;
  bool in_step_ = false;
  step_report report_;
  std::mutex m_;
};

//! The C++ communication hook for a c10d::Reducer (what PyTorch's DDP runs):
//! `reducer.register_comm_hook(std::make_unique<ddp_comm_hook<T>>(core))`. Each bucket's
//! future completes, holding its averaged gradient, when the step's last bucket ends the
//! step; a failed step fails every pending future with the error.
template <class Stepper>
class ddp_comm_hook final : public c10d::CommHookInterface {
 public:
  //! A hook over \p core, which must outlive it.
  explicit ddp_comm_hook(ddp_hook_core<Stepper>& core) : core_(core) {}

  //! Feeds bucket \p bucket to the core; returns the bucket's future.
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
    futures_.push_back({fut, bucket.getBuffer()});
    try {
      if (core_.on_bucket(bucket.getIndex(), bucket.getBuffer(), bucket.getParameters(), bucket.getGradients(),
                          bucket.isLast())) {
        for (auto& f : futures_) f.future->markCompleted(c10::IValue(f.buffer));
        futures_.clear();
      }
    } catch (...) {
      for (auto& f : futures_) f.future->setError(std::current_exception());
      futures_.clear();
    }
    return fut;
  }
  //! The bucket's averaged gradient.
  at::Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }

 private:
  struct pending {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    at::Tensor buffer;
  };
  ddp_hook_core<Stepper>& core_;
  std::vector<pending> futures_;
};

}  // namespace gravac
