// The example's models against central finite differences on tiny networks: the
// gradient written into the flat buffer must be the derivative of the mean loss with
// respect to the flat parameters, tensor by tensor (so gravac sees the right layers).
// Also: the gradient's bits do not depend on where the gradient buffer lies, so a short
// top-k training on 4 thread ranks repeats bit for bit after other runs in the process.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <gravac/collective/allgather.hpp>
#include <gravac/collective/dense_allreduce.hpp>
#include <gravac/comm/thread_communicator.hpp>
#include <gravac/compress/identity.hpp>
#include <gravac/compress/topk.hpp>
#include <gravac/policy/fixed_policy.hpp>
#include <gravac/trainer.hpp>
#include <random>
#include <span>
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

// True when a and b hold the same bits.
bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The gradient of model m on batch b written into a buffer that starts `shift` floats into
// its allocation (how far a std::vector's data lies from a vector boundary depends on what
// the allocator hands back, e.g. memory an earlier run freed).
std::vector<float> gradient_at(fmnist::model& m, const std::vector<float>& p, const tiny_batch& b, std::size_t shift) {
  std::vector<float> buf(m.num_params() + shift, 123.0f);
  const std::span<float> g(buf.data() + shift, m.num_params());
  m.forward_backward(p, b.x.data(), b.y.data(), b.n, g);
  return {g.begin(), g.end()};
}

// What one short data-parallel run left on each rank.
struct run_bits {
  std::vector<std::vector<float>> params, residuals;
};

// A short data-parallel run on 4 thread ranks: an MLP, top-k (kept fraction 0.01) over
// Allgather with error feedback, SGD with momentum, each rank on its own batches. Rank r's
// gradient buffer starts shift[r] floats into its allocation. Catch2 is not thread-safe:
// the ranks only record, the caller checks.
run_bits short_topk_run(const std::array<std::size_t, 4>& shift, int steps) {
  using trainer_t = gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy>;
  run_bits out{std::vector<std::vector<float>>(4), std::vector<std::vector<float>>(4)};
  gravac::run_ranks(4, [&](gravac::thread_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    fmnist::mlp net(64, {48, 32}, 10);
    std::vector<float> p(net.num_params());
    net.init(p, 7);
    std::vector<float> gbuf(net.num_params() + shift[r]);
    const std::span<float> g(gbuf.data() + shift[r], net.num_params());
    trainer_t::options opt;
    opt.policy.kept_fraction = 0.01;
    trainer_t t(comm, net.get_layout(), opt);
    fmnist::sgd_momentum sgd(p.size(), 0.9, 1e-4);
    for (int s = 0; s < steps; ++s) {
      const auto b = make_batch(16, 64, 10, static_cast<unsigned>(100 * s + comm.rank() + 1));
      net.forward_backward(p, b.x.data(), b.y.data(), b.n, g);
      t.step(g);
      sgd.step(p, g, 0.05);
    }
    out.params[r] = p;
    out.residuals[r].assign(t.residual().begin(), t.residual().end());
  });
  return out;
}

// A different run in between: dense SGD on a different-size model (its buffers freed
// before the next run allocates).
void other_dense_run() {
  using trainer_t = gravac::trainer<gravac::identity, gravac::dense_allreduce, gravac::fixed_policy>;
  gravac::run_ranks(4, [&](gravac::thread_communicator& comm) {
    fmnist::mlp net(64, {24}, 10);
    std::vector<float> p(net.num_params()), g(net.num_params());
    net.init(p, 3);
    trainer_t t(comm, net.get_layout());
    fmnist::sgd_momentum sgd(p.size(), 0.9, 1e-4);
    for (int s = 0; s < 5; ++s) {
      const auto b = make_batch(16, 64, 10, static_cast<unsigned>(s + 1));
      net.forward_backward(p, b.x.data(), b.y.data(), b.n, g);
      t.step(g);
      sgd.step(p, g, 0.05);
    }
  });
}

}  // namespace

// A training run that followed other runs in the same process diverged in the last bits
// from the same run alone: the bias gradients (Eigen's colwise().sum() into a map of the
// flat gradient buffer) were summed in an order that depended on the buffer's address
// modulo the vector width, which depends on what the allocator hands back.
TEST_CASE("models: the gradient's bits do not depend on where the gradient buffer lies (MLP and CNN)") {
  for (int kind = 0; kind < 2; ++kind) {
    auto m = kind == 0 ? fmnist::make_model(fmnist::model_kind::mlp, {48, 40})
                       : fmnist::make_model(fmnist::model_kind::cnn, {40});
    const auto b = make_batch(16, 784, 10, 31);
    std::vector<float> p(m->num_params());
    m->init(p, 9);
    std::mt19937 rng(10);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    for (auto& v : p) v += nd(rng);  // generic biases
    const auto ref = gradient_at(*m, p, b, 0);
    for (std::size_t shift = 1; shift <= 16; ++shift) {
      const auto g = gradient_at(*m, p, b, shift);
      for (const auto& l : m->get_layout().layers()) {
        INFO(m->name() << ", gradient buffer " << shift << " floats further, layer " << l.name);
        CHECK(same_bits(std::span<const float>(g).subspan(l.offset, l.numel),
                        std::span<const float>(ref).subspan(l.offset, l.numel)));
      }
    }
  }
}

TEST_CASE("training on 4 thread ranks: the same run gives the same bits after another run, wherever its buffers lie") {
  constexpr int steps = 12;
  const auto first = short_topk_run({0, 0, 0, 0}, steps);
  other_dense_run();
  const auto again = short_topk_run({0, 0, 0, 0}, steps);
  other_dense_run();
  const auto shifted = short_topk_run({1, 6, 11, 13}, steps);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(same_bits(again.params[r], first.params[r]));
    CHECK(same_bits(again.residuals[r], first.residuals[r]));
    CHECK(same_bits(shifted.params[r], first.params[r]));
    CHECK(same_bits(shifted.residuals[r], first.residuals[r]));
    CHECK(same_bits(first.params[r], first.params[0]));  // every rank applies the same update
  }
}

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
