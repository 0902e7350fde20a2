#pragma once
//! \file make_device_trainer.hpp
//! \brief From a runtime method to a trainer over CUDA device memory: the compressor names
//! mapped to gravac's device compressors (topk -> topk_cuda, threshold -> threshold_cuda,
//! adacomp -> adacomp_cuda, qsgd -> qsgd_cuda, terngrad -> terngrad_cuda, sign -> sign_cuda,
//! cast16 -> cast16_cuda, mxfp8 -> mxfp8_cuda, mxfp4 -> mxfp4_cuda, nvfp4 -> nvfp4_cuda),
//! every composition of them that composition_verdict accepts,
//! built over any device communicator, with every compressor kernel on one stream. A CUDA
//! header (compile as CUDA C++); link gravac::runtime_cuda, where the instantiations are
//! compiled once.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstdint>
#include <memory>
#include <optional>

#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/cuda/device_buffer.hpp"
#include "gravac/cuda/stream.hpp"
#include "gravac/runtime/any_trainer.hpp"

namespace gravac::runtime {

// Declared here, defined in gravac/runtime/method_config.hpp (which needs Eigen, for
// PowerSGD's options): include it to fill a method_config.
struct method_config;
enum class compressor_id : std::uint8_t;

//! The communicator a device trainer runs on (nccl_communicator, callback_device_communicator).
using device_comm = communicator_ref<cuda_space>;

//! Whether compressor \p c has a device form (a gravac::*_cuda compressor).
bool has_device_form(compressor_id c) noexcept;

//! Why the library refuses \p m's composition over device memory: std::nullopt when the
//! compressor has no device form, else composition_verdict of the device compressor, the
//! collective and the policy (rejection::none: accepted).
std::optional<rejection> device_verdict(const method_config& m);

//! Throws gravac::error (invalid_argument) with the reason and what the library accepts on
//! the device when device_verdict(m) is not rejection::none.
void require_device_accepted(const method_config& m);

//! Builds trainer<C_cuda, K, P> for \p m over \p comm and \p lay, with the compressor's
//! stream option set to \p stream (every compressor kernel runs there; pass the stream that
//! produces the gradients). The returned trainer's step / begin_step take device pointers
//! (the std::span is a device buffer of lay.numel() floats). Its save_state / load_state /
//! checkpoints copy the device residual (and a device collective's) through the host, on
//! \p stream, between steps. Throws as require_device_accepted for a refused composition.
std::unique_ptr<any_trainer> make_device_trainer(const method_config& m, device_comm comm, const layout& lay,
                                                 stream_ref stream);

}  // namespace gravac::runtime
