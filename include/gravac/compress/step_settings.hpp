#pragma once
//! \file step_settings.hpp
//! \brief The per-step settings of the compressors that act on one (Compressor's
//! step_settings, docs/concept_compressor.md): AdaComp's bin length and PowerSGD's rank per
//! layer. A policy that decides one fills it in plan_settings(); the trainer hands each
//! bucket's compressor its layers' part. Light on purpose: policies include it without
//! the compressors (PowerSGD needs Eigen).
//!
//! Every settings type lists its per-layer vectors in per_layer() (a tuple of references),
//! so that the trainer can slice them per bucket and hash them without knowing the type.

#include <cstdint>
#include <tuple>
#include <vector>

namespace gravac {

//! AdaComp's settings for a step (gravac::adacomp, gravac::adacomp_cuda).
struct adacomp_settings {
  //! L_T per layer; 0 (or a layer past the end, or an empty vector): the compressor's
  //! option for the layer's kind.
  std::vector<std::uint32_t> bin_length;

  //! The per-layer vectors.
  auto per_layer() noexcept { return std::tie(bin_length); }
  //! The per-layer vectors.
  auto per_layer() const noexcept { return std::tie(bin_length); }
};

//! PowerSGD's settings for a step (gravac::powersgd).
struct powersgd_settings {
  //! The rank of each layer's approximation, capped by powersgd_options::rank; 0 for a
  //! layer, or an empty vector: options.rank. Empty or one per layer.
  std::vector<std::uint32_t> approximation_rank;

  //! The per-layer vectors.
  auto per_layer() noexcept { return std::tie(approximation_rank); }
  //! The per-layer vectors.
  auto per_layer() const noexcept { return std::tie(approximation_rank); }
};

}  // namespace gravac
