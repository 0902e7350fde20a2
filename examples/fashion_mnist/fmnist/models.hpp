#pragma once
//! \file models.hpp
//! \brief Builds the example's models by name.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fmnist/cnn.hpp"
#include "fmnist/mlp.hpp"

namespace fmnist {

//! Which model to build.
enum class model_kind : std::uint8_t { mlp, cnn };

//! Builds \p kind for 28 x 28 single-channel images and 10 classes: the MLP has hidden
//! layers \p mlp_hidden (default 256, 128); the CNN has the cnn_shape defaults.
inline std::unique_ptr<model> make_model(model_kind kind, std::vector<std::size_t> mlp_hidden = {256, 128}) {
  if (kind == model_kind::cnn) return std::make_unique<cnn>();
  return std::make_unique<mlp>(28 * 28, std::move(mlp_hidden), 10);
}

}  // namespace fmnist
