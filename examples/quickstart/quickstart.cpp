// quickstart: the smallest complete data-parallel training loop with gravac.
//
// Every MPI rank holds its own shard of a synthetic 10-class problem and trains the
// same softmax-regression model. After each backward pass, gravac's trainer compresses
// the gradient with top-k (error feedback keeps what was not sent), allgathers the
// packets and leaves the averaged gradient in place for the optimizer.
//
//   mpiexec -n 4 ./quickstart [kept_fraction] [steps]
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gravac/comm/mpi_communicator.hpp"
#include "gravac/gravac.hpp"

namespace {
constexpr int features = 64, classes = 10, batch = 64;

struct data_shard {
  std::vector<float> x;  // batch-major, features per row
  std::vector<int> y;
};

// Class c has its mean at a fixed random point; each rank draws its own samples.
data_shard make_shard(int rank, int n) {
  std::mt19937 means_rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> means(classes * features);
  for (auto& m : means) m = nd(means_rng);
  std::mt19937 rng(1000 + rank);
  data_shard d;
  d.x.resize(static_cast<std::size_t>(n) * features);
  d.y.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int c = static_cast<int>(rng() % classes);
    d.y[i] = c;
    for (int f = 0; f < features; ++f) d.x[i * features + f] = means[c * features + f] + 1.5f * nd(rng);
  }
  return d;
}

// Softmax cross-entropy over rows [first, first + batch): writes the gradient of the
// weights (classes x features) and biases into grad, returns the mean loss.
float forward_backward(const data_shard& d, int first, const std::vector<float>& params, std::vector<float>& grad) {
  std::fill(grad.begin(), grad.end(), 0.0f);
  const float* w = params.data();
  const float* b = params.data() + classes * features;
  float* gw = grad.data();
  float* gb = grad.data() + classes * features;
  float loss = 0;
  for (int i = first; i < first + batch; ++i) {
    const float* xi = &d.x[static_cast<std::size_t>(i) * features];
    float logits[classes], mx = -1e30f;
    for (int c = 0; c < classes; ++c) {
      float s = b[c];
      for (int f = 0; f < features; ++f) s += w[c * features + f] * xi[f];
      logits[c] = s;
      mx = std::max(mx, s);
    }
    float z = 0;
    for (float& l : logits) z += (l = std::exp(l - mx));
    loss -= std::log(logits[d.y[i]] / z);
    for (int c = 0; c < classes; ++c) {
      const float p = logits[c] / z - (c == d.y[i] ? 1.0f : 0.0f);
      gb[c] += p / batch;
      for (int f = 0; f < features; ++f) gw[c * features + f] += p * xi[f] / batch;
    }
  }
  return loss / batch;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    gravac::mpi_communicator comm;
    const double fraction = argc > 1 ? std::atof(argv[1]) : 0.05;
    const int steps = argc > 2 ? std::atoi(argv[2]) : 300;

    // 1. Describe the model's tensors inside one flat buffer.
    gravac::layout lay;
    lay.add("fc.weight", {classes, features}, gravac::layer_kind::dense);
    lay.add("fc.bias", {classes}, gravac::layer_kind::bias_or_norm);

    // 2. Compose compressor, collective and policy at compile time.
    using trainer_t = gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy>;
    trainer_t::options opt;
    opt.policy.kept_fraction = fraction;
    trainer_t t(comm, lay, opt);

    std::vector<float> params(lay.numel(), 0.0f), grad(lay.numel());
    const auto shard = make_shard(comm.rank(), 64 * batch);
    std::size_t sent = 0, dense = 0;
    for (int s = 0; s < steps; ++s) {
      const float loss = forward_backward(shard, (s % 64) * batch, params, grad);
      // 3. One call per step: grad becomes the average over ranks of the compressed gradients.
      const auto& report = t.step(grad);
      sent += report.bytes_sent;
      dense += report.dense_bytes;
      for (std::size_t i = 0; i < params.size(); ++i) params[i] -= 0.5f * grad[i];
      if (comm.rank() == 0 && (s % 50 == 0 || s == steps - 1))
        std::printf("step %4d  loss %.4f  bytes sent %9zu  dense would send %9zu  (%.1fx less)\n", s, loss, sent, dense,
                    sent ? double(dense) / double(sent) : 0.0);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
