#pragma once
// The tensors of two real models, as layouts in the order their frameworks list the
// parameters: torchvision's ResNet-50 (161 tensors, 25,557,032 parameters: convolutions
// without biases, a weight and a bias per batch norm) and GPT-2 small (148 tensors,
// 124,439,808 parameters: the output projection tied to the token embedding). A
// benchmark on them sees the many small tensors (norms, biases) beside the few large ones
// that equal layers hide: per-layer work, launches above all, grows with the tensor count.
#include <cstddef>
#include <string>

#include "gravac/core/layout.hpp"

namespace gravac_bench {

//! torchvision's resnet50(): conv1 and bn1, four stages of 3, 4, 6 and 3 bottlenecks
//! (1x1, 3x3, 1x1 convolutions, each with a batch norm; a 1x1 downsample and its norm in
//! each stage's first block), then the 1000-way classifier.
inline gravac::layout resnet50_layout() {
  using gravac::layer_kind;
  gravac::layout lay;
  auto conv = [&](const std::string& name, std::size_t out, std::size_t in, std::size_t k) {
    lay.add(name + ".weight", {out, in, k, k}, layer_kind::conv);
  };
  auto norm = [&](const std::string& name, std::size_t c) {
    lay.add(name + ".weight", {c}, layer_kind::bias_or_norm);
    lay.add(name + ".bias", {c}, layer_kind::bias_or_norm);
  };
  conv("conv1", 64, 3, 7);
  norm("bn1", 64);
  const std::size_t blocks[] = {3, 4, 6, 3};
  std::size_t in = 64;
  for (std::size_t s = 0; s < 4; ++s) {
    const std::size_t width = std::size_t{64} << s, out = 4 * width;
    for (std::size_t b = 0; b < blocks[s]; ++b) {
      const std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(b);
      conv(p + ".conv1", width, in, 1);
      norm(p + ".bn1", width);
      conv(p + ".conv2", width, width, 3);
      norm(p + ".bn2", width);
      conv(p + ".conv3", out, width, 1);
      norm(p + ".bn3", out);
      if (b == 0) {
        conv(p + ".downsample.0", out, in, 1);
        norm(p + ".downsample.1", out);
      }
      in = out;
    }
  }
  lay.add("fc.weight", {1000, 2048}, layer_kind::dense);
  lay.add("fc.bias", {1000}, layer_kind::bias_or_norm);
  return lay;
}

//! GPT-2 small: token and position embeddings, 12 blocks of (layer norm, fused attention
//! projection, attention output, layer norm, MLP up and down, each with its bias), the
//! final layer norm.
inline gravac::layout gpt2_small_layout() {
  using gravac::layer_kind;
  constexpr std::size_t d = 768, vocab = 50257, context = 1024, blocks = 12;
  gravac::layout lay;
  lay.add("wte", {vocab, d}, layer_kind::dense);
  lay.add("wpe", {context, d}, layer_kind::dense);
  auto norm = [&](const std::string& name) {
    lay.add(name + ".weight", {d}, layer_kind::bias_or_norm);
    lay.add(name + ".bias", {d}, layer_kind::bias_or_norm);
  };
  auto linear = [&](const std::string& name, std::size_t in, std::size_t out) {
    lay.add(name + ".weight", {in, out}, layer_kind::dense);
    lay.add(name + ".bias", {out}, layer_kind::bias_or_norm);
  };
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::string p = "h." + std::to_string(b);
    norm(p + ".ln_1");
    linear(p + ".attn.c_attn", d, 3 * d);
    linear(p + ".attn.c_proj", d, d);
    norm(p + ".ln_2");
    linear(p + ".mlp.c_fc", d, 4 * d);
    linear(p + ".mlp.c_proj", 4 * d, d);
  }
  norm("ln_f");
  return lay;
}

}  // namespace gravac_bench
