// The example's models against central finite differences on tiny networks: the
// gradient written into the flat buffer must be the derivative of the mean loss with
// respect to the flat parameters, tensor by tensor (so gravac sees the right layers).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "fmnist/models.hpp"
#include "fmnist/sgd.hpp"

namespace {

struct tiny_batch {
  std::vector<float> x;
  std::vector<int> y;
  std::size_t n;
};

tiny_batch make_batch(std::size_t n, std::size_t features, int classes, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  tiny_batch b{std::vector<float>(n * features), std::vector<int>(n), n};
  for (auto& v : b.x) v = u(rng);
  for (auto& v : b.y) v = static_cast<int>(rng() % static_cast<unsigned>(classes));
  return b;
}

double mean_loss(fmnist::model& m, const std::vector<float>& p, const tiny_batch& b) {
  return m.evaluate(p, b.x.data(), b.y.data(), b.n).loss_sum / static_cast<double>(b.n);
}

// Checks every parameter's analytic gradient against (L(p + h) - L(p - h)) / 2h, per layer.
void check_gradients(fmnist::model& m, const tiny_batch& b, unsigned seed) {
  std::vector<float> p(m.num_params()), g(m.num_params(), 123.0f);  // 123: stale values must be overwritten
  m.init(p, seed);
  // Biases start at zero; give them values so their gradients are generic too.
  std::mt19937 rng(seed + 1);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  for (auto& v : p) v += nd(rng);
  const auto r = m.forward_backward(p, b.x.data(), b.y.data(), b.n, g);
  REQUIRE(r.samples == b.n);
  CHECK(r.loss_sum / static_cast<double>(b.n) == Approx(mean_loss(m, p, b)).epsilon(1e-5));

  const float h = 2e-3f;  // small enough not to cross ReLU kinks, large enough for float round-off
  for (const auto& l : m.get_layout().layers()) {
    double diff_sq = 0, ref_sq = 0;
    for (std::size_t i = l.offset; i < l.offset + l.numel; ++i) {
      const float keep = p[i];
      p[i] = keep + h;
      const double up = mean_loss(m, p, b);
      p[i] = keep - h;
      const double down = mean_loss(m, p, b);
      p[i] = keep;
      const double fd = (up - down) / (2.0 * h);
      diff_sq += (fd - g[i]) * (fd - g[i]);
      ref_sq += fd * fd;
    }
    INFO("layer " << l.name << ": |fd - analytic| / |fd| = " << std::sqrt(diff_sq / ref_sq));
    CHECK(ref_sq > 0);
    CHECK(std::sqrt(diff_sq / ref_sq) < 2e-2);
  }
}

}  // namespace

TEST_CASE("mlp: gradients match finite differences, tensors registered with their kinds") {
  fmnist::mlp m(10, {7, 5}, 4);
  const auto& lay = m.get_layout();
  REQUIRE(lay.size() == 6);
  CHECK(lay[0].name == "fc1.weight");
  CHECK(lay[0].shape == std::vector<std::size_t>{7, 10});
  CHECK(lay[0].kind == gravac::layer_kind::dense);
  CHECK(lay[1].kind == gravac::layer_kind::bias_or_norm);
  CHECK(m.num_params() == 10 * 7 + 7 + 7 * 5 + 5 + 5 * 4 + 4);
  const auto b = make_batch(6, 10, 4, 11);
  check_gradients(m, b, 3);
}

TEST_CASE("cnn: gradients match finite differences, conv layers registered as conv") {
  fmnist::cnn_shape s;
  s.image = 8;
  s.channels1 = 2;
  s.channels2 = 3;
  s.hidden = 5;
  s.classes = 4;
  fmnist::cnn m(s);
  const auto& lay = m.get_layout();
  REQUIRE(lay.size() == 8);
  CHECK(lay[0].name == "conv1.weight");
  CHECK(lay[0].kind == gravac::layer_kind::conv);
  CHECK(lay[2].shape == std::vector<std::size_t>{3, 2, 3, 3});
  CHECK(lay[2].kind == gravac::layer_kind::conv);
  CHECK(lay[4].shape == std::vector<std::size_t>{5, 3 * 2 * 2});
  CHECK(lay[4].kind == gravac::layer_kind::dense);
  CHECK(lay[7].kind == gravac::layer_kind::bias_or_norm);
  const auto b = make_batch(3, 64, 4, 12);
  check_gradients(m, b, 4);
}

TEST_CASE("models: a few SGD steps on one batch reduce its loss (MLP and CNN)") {
  for (int kind = 0; kind < 2; ++kind) {
    auto m = fmnist::make_model(kind == 0 ? fmnist::model_kind::mlp : fmnist::model_kind::cnn, {32});
    const auto b = make_batch(16, 784, 10, 21);
    std::vector<float> p(m->num_params()), g(m->num_params());
    m->init(p, 5);
    fmnist::sgd_momentum opt(p.size(), 0.9, 0.0);
    const double before = mean_loss(*m, p, b);
    for (int s = 0; s < 20; ++s) {
      m->forward_backward(p, b.x.data(), b.y.data(), b.n, g);
      opt.step(p, g, 0.02);
    }
    INFO(m->name());
    CHECK(mean_loss(*m, p, b) < 0.5 * before);
  }
}

TEST_CASE("sgd: step decay multiplies by gamma at each milestone") {
  fmnist::step_decay lr{0.1, 0.5, {2, 4}};
  CHECK(lr.at(0) == Approx(0.1));
  CHECK(lr.at(1) == Approx(0.1));
  CHECK(lr.at(2) == Approx(0.05));
  CHECK(lr.at(5) == Approx(0.025));
}
