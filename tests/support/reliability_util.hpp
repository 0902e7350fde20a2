#pragma once
// Helpers of the reliability tests: a tiny real model (multi-output linear regression
// trained by SGD through a trainer), scratch directories, and bitwise comparison.

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gravac/core/detail/random.hpp"
#include "gravac_test_util.hpp"

#if defined(__unix__)
#include <unistd.h>
#endif

namespace gravac::test {

// y = W x + b with W of outputs x inputs; the layout holds W, an empty tensor and b, so
// the flat buffer has a layer boundary that is not 8-aligned and an empty layer.
struct linear_model {
  static constexpr std::size_t inputs = 24, outputs = 3, batch = 8;
  layout lay;
  std::vector<float> params;

  linear_model() {
    lay.add("linear.weight", {outputs, inputs}, layer_kind::dense);
    lay.add("unused", {0}, layer_kind::dense);
    lay.add("linear.bias", {outputs}, layer_kind::bias_or_norm);
    params.assign(lay.numel(), 0.0f);
  }

  // The true model every rank samples from: fixed, so the run converges somewhere.
  static float truth(std::size_t o, std::size_t i) { return static_cast<float>((o + 1) * 0.1 - i * 0.01); }

  // The MSE gradient of a batch that depends only on (rank, step): reruns and resumed runs
  // see the same data at the same step.
  void gradient(int rank, std::uint64_t step, std::vector<float>& g) const {
    g.assign(lay.numel(), 0.0f);
    detail::splitmix64 rng(detail::mix_seed(0xda7a, step, static_cast<std::uint64_t>(rank)));
    const std::size_t b_off = lay[2].offset;
    for (std::size_t s = 0; s < batch; ++s) {
      float x[inputs];
      for (auto& xi : x) xi = rng.uniform_float() * 2.0f - 1.0f;
      for (std::size_t o = 0; o < outputs; ++o) {
        float y = 0.3f * static_cast<float>(o), pred = params[b_off + o];
        for (std::size_t i = 0; i < inputs; ++i) {
          y += truth(o, i) * x[i];
          pred += params[o * inputs + i] * x[i];
        }
        y += (rng.uniform_float() - 0.5f) * 0.01f;
        const float err = (pred - y) / static_cast<float>(batch);
        for (std::size_t i = 0; i < inputs; ++i) g[o * inputs + i] += err * x[i];
        g[b_off + o] += err;
      }
    }
  }

  // Runs steps [t.steps(), until) of SGD through trainer t.
  template <class Trainer>
  void train(Trainer& t, int rank, std::uint64_t until, float lr = 0.05f) {
    std::vector<float> g;
    while (t.steps() < until) {
      gradient(rank, t.steps(), g);
      t.step(g);
      for (std::size_t i = 0; i < params.size(); ++i) params[i] -= lr * g[i];
    }
  }
};

// True when a and b hold the same bits (NaN-safe, distinguishes -0 from +0).
inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A fresh directory under the system temp dir, removed at scope exit.
struct scratch_dir {
  std::filesystem::path path;
  explicit scratch_dir(const std::string& tag) {
#if defined(__unix__)
    const auto pid = static_cast<long>(::getpid());
#else
    const long pid = 0;
#endif
    path = std::filesystem::temp_directory_path() / ("gravac-" + tag + "-" + std::to_string(pid));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace gravac::test
