#pragma once
//! \file dataset.hpp
//! \brief Fashion-MNIST as float images in [0, 1] and integer labels, loaded from
//! Debian's dataset-fashion-mnist files and checked against each other.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fmnist/idx.hpp"

namespace fmnist {

//! Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr const char* default_data_dir = "/usr/share/datasets/fashion-mnist";

//! The ten classes, in label order.
inline constexpr const char* class_names[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

//! One split of the dataset: n images of rows x cols pixels, scaled to [0, 1].
struct dataset {
  std::size_t n = 0;          //!< number of images
  std::size_t rows = 0;       //!< pixel rows per image
  std::size_t cols = 0;       //!< pixel columns per image
  std::vector<float> pixels;  //!< n * rows * cols values, image-major
  std::vector<int> labels;    //!< n labels in [0, 10)

  //! Pixels per image.
  [[nodiscard]] std::size_t pixels_per_image() const noexcept { return rows * cols; }
  //! Pointer to image \p i.
  [[nodiscard]] const float* image(std::size_t i) const noexcept { return pixels.data() + i * rows * cols; }
};

//! Reads an images file and its labels file and checks that they belong together
//! (same count, 2-D images, labels in [0, 10)).
inline dataset load_idx_pair(const std::string& images_path, const std::string& labels_path) {
  const idx_array img = read_idx_u8(images_path, 3);
  const idx_array lab = read_idx_u8(labels_path, 1);
  if (img.items() != lab.items())
    throw data_error(labels_path, "holds " + std::to_string(lab.items()) + " labels but " + images_path + " holds " +
                                      std::to_string(img.items()) + " images");
  dataset d;
  d.n = img.items();
  d.rows = img.dims[1];
  d.cols = img.dims[2];
  d.pixels.resize(img.data.size());
  for (std::size_t i = 0; i < img.data.size(); ++i) d.pixels[i] = static_cast<float>(img.data[i]) * (1.0f / 255.0f);
  d.labels.resize(d.n);
  for (std::size_t i = 0; i < d.n; ++i) {
    if (lab.data[i] > 9)
      throw data_error(labels_path,
                       "label " + std::to_string(lab.data[i]) + " of item " + std::to_string(i) + " is outside 0..9");
    d.labels[i] = lab.data[i];
  }
  return d;
}

//! Which split to load.
enum class split : std::uint8_t { train, test };

//! Loads the train or test split of Fashion-MNIST from \p dir. When a file is missing the
//! error says which package provides it; every file is validated (see read_idx_u8) and the
//! images must be 28 x 28.
inline dataset load_fashion_mnist(const std::string& dir, split s) {
  const std::string stem = s == split::train ? "train" : "t10k";
  const std::string images = dir + "/" + stem + "-images-idx3-ubyte.gz";
  const std::string labels = dir + "/" + stem + "-labels-idx1-ubyte.gz";
  for (const auto& p : {images, labels})
    if (!std::filesystem::exists(p))
      throw data_error(p,
                       "missing. Install the data with `sudo apt-get install dataset-fashion-mnist` "
                       "(or scripts/install-deps), or pass --data-dir to a directory holding the four "
                       "Fashion-MNIST IDX .gz files");
  dataset d = load_idx_pair(images, labels);
  if (d.rows != 28 || d.cols != 28)
    throw data_error(images, "images are " + std::to_string(d.rows) + " x " + std::to_string(d.cols) +
                                 ", Fashion-MNIST images are 28 x 28");
  return d;
}

}  // namespace fmnist
