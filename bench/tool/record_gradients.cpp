// Records the gradients of the Fashion-MNIST example's models (MLP or CNN) over the first
// steps of plain SGD training, as a float32 .npy of shape (steps, parameters): the
// "recorded" data kind of bench_dynamic and gravac-bench (--data FILE). bench/record_gradients
// builds and runs it; see bench/README.md.
//
//   record_gradients --model mlp|cnn --steps S --out FILE [--batch B] [--lr L] [--seed X]
//                    [--every M] [--data-dir DIR]
//
// --every M keeps every M-th parameter (a small sample across all layers: the checked-in
// test sample is --model mlp --steps 16 --every 29).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "../gradient_data.hpp"
#include "fmnist/dataset.hpp"
#include "fmnist/models.hpp"

int main(int argc, char** argv) {
  std::string model = "mlp", out, data_dir = "/usr/share/datasets/fashion-mnist";
  std::size_t steps = 300, batch = 64, every = 1;
  double lr = 0.05;
  std::uint64_t seed = 1;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--model")
        model = value();
      else if (a == "--steps")
        steps = std::stoul(value());
      else if (a == "--batch")
        batch = std::stoul(value());
      else if (a == "--every")
        every = std::stoul(value());
      else if (a == "--lr")
        lr = std::stod(value());
      else if (a == "--seed")
        seed = std::stoull(value());
      else if (a == "--out")
        out = value();
      else if (a == "--data-dir")
        data_dir = value();
      else
        throw std::invalid_argument("unknown option " + a + " (see the comment at the top of record_gradients.cpp)");
    }
    if (out.empty()) throw std::invalid_argument("--out FILE is required");
    if (model != "mlp" && model != "cnn") throw std::invalid_argument("--model is mlp or cnn");
    if (steps == 0 || batch == 0 || every == 0)
      throw std::invalid_argument("--steps, --batch and --every must be positive");
    const auto train = fmnist::load_fashion_mnist(data_dir, fmnist::split::train);
    auto net = fmnist::make_model(model == "cnn" ? fmnist::model_kind::cnn : fmnist::model_kind::mlp);
    const std::size_t m = net->num_params();
    std::vector<float> params(m), grads(m), x(batch * train.pixels_per_image());
    std::vector<int> y(batch);
    net->init(params, seed);
    const std::size_t kept = (m + every - 1) / every;
    std::vector<float> rows;
    rows.reserve(steps * kept);
    std::mt19937_64 rng(seed);
    for (std::size_t t = 0; t < steps; ++t) {
      for (std::size_t b = 0; b < batch; ++b) {
        const std::size_t i = static_cast<std::size_t>(rng() % train.n);
        std::copy_n(train.image(i), train.pixels_per_image(), x.data() + b * train.pixels_per_image());
        y[b] = train.labels[i];
      }
      const auto r = net->forward_backward(params, x.data(), y.data(), batch, grads);
      for (std::size_t j = 0; j < m; j += every) rows.push_back(grads[j]);
      for (std::size_t j = 0; j < m; ++j) params[j] -= static_cast<float>(lr) * grads[j];
      if (t % 50 == 0 || t + 1 == steps)
        std::fprintf(stderr, "step %zu loss %.4f\n", t, r.loss_sum / static_cast<double>(r.samples));
    }
    gravac_bench::save_npy(out, rows, steps, kept);
    std::printf("%s: %s, %zu steps x %zu floats (of %zu parameters)\n", out.c_str(), net->name().c_str(), steps, kept,
                m);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "record_gradients: %s\n", ex.what());
    return 1;
  }
  return 0;
}
