// libtorch_fashion_mnist: a LibTorch CNN trained data-parallel through gravac.
//
// Every rank (a thread here, through gravac::run_ranks) holds its own replica of a small
// CNN and its own shard of a Fashion-MNIST subset. LibTorch's backward writes the
// gradients straight into gravac's flat buffer (gravac::torch_gradients); gravac
// compresses them with top-k and error feedback, allgathers the packets and leaves the
// average in place, where torch::optim::SGD reads it.
//
// By default the aggregation overlaps backward, as PyTorch DDP's does: hooks on the
// parameters' gradient accumulators (gravac::torch_backward_hooks) tell the trainer when
// each gradient is final, and a bucket (--bucket-mb, from the last layer to the first)
// is compressed and allgathered on gravac's communication thread while backward goes on.
// --overlap off runs the synchronous step after backward instead (same bits).
//
//   ./libtorch_fashion_mnist --ranks 2 --steps 300 --fraction 0.05 [--telemetry steps.csv]
//   ./libtorch_fashion_mnist --bucket-mb 0 --overlap on     # one bucket per parameter
//
// The Debian package dataset-fashion-mnist provides the data; the gzip'd IDX files are
// read with zlib (LibTorch's own MNIST reader wants them uncompressed).
#include <torch/torch.h>
#include <zlib.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gravac/adapters/torch.hpp"
#include "gravac/gravac.hpp"
#include "gravac/telemetry.hpp"

namespace {

// Reads an IDX file (gzip'd): big-endian magic, dimension sizes, then uint8 data.
torch::Tensor read_idx_gz(const std::string& path, std::int64_t max_items) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path + " (install dataset-fashion-mnist)");
  const auto read_u32 = [&] {
    unsigned char b[4];
    if (gzread(f, b, 4) != 4) throw std::runtime_error("truncated header in " + path);
    return static_cast<std::int64_t>(b[0]) << 24 | b[1] << 16 | b[2] << 8 | b[3];
  };
  const auto magic = read_u32();
  const int dims = static_cast<int>(magic & 0xff);
  if ((magic >> 8) != 0x08 || dims < 1 || dims > 3) throw std::runtime_error("not a uint8 IDX file: " + path);
  std::vector<std::int64_t> shape;
  for (int d = 0; d < dims; ++d) shape.push_back(read_u32());
  shape[0] = std::min(shape[0], max_items);
  auto t = torch::empty(shape, torch::kUInt8);
  const auto bytes = static_cast<unsigned>(t.numel());
  const int got = gzread(f, t.data_ptr<std::uint8_t>(), bytes);
  gzclose(f);
  if (got < 0 || static_cast<unsigned>(got) != bytes) throw std::runtime_error("truncated data in " + path);
  return t;
}

struct dataset {
  torch::Tensor images;  // (N, 1, 28, 28) float, normalized
  torch::Tensor labels;  // (N) int64
};

dataset load(const std::string& dir, const std::string& prefix, std::int64_t n) {
  auto images = read_idx_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", n);
  auto labels = read_idx_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", n);
  images = images.to(torch::kFloat32).div_(255.0f).sub_(0.2860f).div_(0.3530f).unsqueeze(1);
  return {images, labels.to(torch::kLong)};
}

// Conv(1->8, 5) - pool - Conv(8->16, 5) - pool - Linear(256->64) - Linear(64->10).
struct cnnImpl : torch::nn::Module {
  cnnImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(16 * 4 * 4, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(cnn);

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel LibTorch CNN on Fashion-MNIST through gravac"};
  int ranks = 2, steps = 300, batch = 32, log_every = 50;
  std::int64_t train_n = 6000, test_n = 1000;
  double fraction = 0.05, lr = 0.05;
  std::string data_dir = "/usr/share/datasets/fashion-mnist", telemetry, overlap = "on";
  double bucket_mb = 25;
  app.add_option("--ranks", ranks, "thread ranks")->check(CLI::Range(1, 64));
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "samples per rank and step")->check(CLI::PositiveNumber);
  app.add_option("--train-samples", train_n, "training subset, split over the ranks")->check(CLI::PositiveNumber);
  app.add_option("--test-samples", test_n, "test subset")->check(CLI::PositiveNumber);
  app.add_option("--fraction", fraction, "top-k kept fraction (1 = dense)")->check(CLI::Range(1e-6, 1.0));
  app.add_option("--lr", lr, "SGD learning rate")->check(CLI::PositiveNumber);
  app.add_option("--data-dir", data_dir, "directory of the gzip'd IDX files");
  app.add_option("--telemetry", telemetry, "write rank 0's step reports to this CSV file");
  app.add_option("--log-every", log_every, "print every N steps")->check(CLI::PositiveNumber);
  app.add_option("--overlap", overlap,
                 "on: backward hooks start each bucket's aggregation as its gradients are final; off: one "
                 "synchronous step after backward")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--bucket-mb", bucket_mb, "bucket size in MiB of float gradient (0: one bucket per parameter)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    torch::set_num_threads(1);  // the ranks are the parallelism
    torch::manual_seed(1);
    const auto train = load(data_dir, "train", train_n);
    const auto test = load(data_dir, "t10k", test_n);

    // Identical replicas: every rank starts from rank 0's initial weights.
    std::vector<cnn> models(static_cast<std::size_t>(ranks));
    {
      torch::NoGradGuard no_grad;
      const auto p0 = models[0]->parameters();
      for (int r = 1; r < ranks; ++r) {
        auto pr = models[static_cast<std::size_t>(r)]->parameters();
        for (std::size_t i = 0; i < pr.size(); ++i) pr[i].copy_(p0[i]);
      }
    }

    using trainer_t = gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy>;
    trainer_t::options opt;
    opt.policy.kept_fraction = fraction;
    opt.policy.one_dim_dense = true;  // biases are tiny: send them whole
    const double bucket_bytes = bucket_mb * 1048576.0;
    opt.bucket_bytes = bucket_bytes < 1 ? gravac::bucket_per_layer : static_cast<std::size_t>(bucket_bytes);
    const bool overlapped = overlap == "on";

    gravac::run_ranks(ranks, [&](gravac::thread_communicator& comm) {
      const int r = comm.rank();
      auto& model = models[static_cast<std::size_t>(r)];
      gravac::torch_gradients grads(*model);  // .grad() of every parameter lives in one buffer
      trainer_t t(comm, grads.get_layout(), opt);
      std::optional<gravac::torch_backward_hooks<trainer_t>> hooks;
      if (overlapped) hooks.emplace(grads, t);  // each gradient accumulator calls t.ready()
      if (r == 0)
        std::printf("%s: %zu bucket%s, aggregation %s\n", overlapped ? "overlap on" : "overlap off", t.buckets().size(),
                    t.buckets().size() == 1 ? "" : "s", overlapped ? "during backward" : "after backward");
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));

      std::ofstream csv_file;
      std::unique_ptr<gravac::telemetry_sink> sink;
      if (r == 0 && !telemetry.empty()) {
        csv_file.open(telemetry);
        sink = std::make_unique<gravac::csv_sink>(csv_file, grads.get_layout());
      }
      // Rank r's shard: samples r, r + ranks, r + 2 ranks, ...
      const auto shard = torch::arange(r, train.images.size(0), ranks);
      const auto shard_n = shard.size(0);
      std::size_t sent = 0, dense = 0;
      double loss_sum = 0, exposed_s = 0, communicate_s = 0;
      int loss_n = 0;
      for (int s = 0; s < steps; ++s) {
        const auto first = (static_cast<std::int64_t>(s) * batch) % std::max<std::int64_t>(1, shard_n - batch);
        const auto idx = shard.narrow(0, first, std::min<std::int64_t>(batch, shard_n));
        sgd.zero_grad();
        if (hooks) hooks->begin_step();  // the policy fixes the step's decisions
        auto loss = torch::nn::functional::cross_entropy(model->forward(train.images.index_select(0, idx)),
                                                         train.labels.index_select(0, idx));
        loss.backward();  // LibTorch writes into gravac's buffer; with hooks, buckets start as they fill
        // Compress, allgather, average, in place: after backward, or waiting for the last buckets.
        const auto& report = hooks ? hooks->finish() : grads.step(t);
        sgd.step();  // the optimizer reads the averaged gradient
        exposed_s += report.exposed_communicate_s;
        communicate_s += report.communicate_s;
        if (sink) sink->write(report);
        sent += report.bytes_sent;
        dense += report.dense_bytes;
        loss_sum += loss.item<double>();
        ++loss_n;
        if (r == 0 && ((s + 1) % log_every == 0 || s + 1 == steps)) {
          std::printf("step %5d  loss %.4f  sent %9zu B  dense %9zu B  (%.1fx less)\n", s + 1, loss_sum / loss_n, sent,
                      dense, sent ? double(dense) / double(sent) : 0.0);
          loss_sum = 0;
          loss_n = 0;
        }
      }
      if (r == 0)
        std::printf("rank 0 waited %.3f s for communication after backward (%.3f s in the collectives in all)\n",
                    exposed_s, communicate_s);
      if (r == 0) {
        torch::NoGradGuard no_grad;
        model->eval();
        const auto pred = model->forward(test.images).argmax(1);
        const double acc = pred.eq(test.labels).to(torch::kDouble).mean().item<double>();
        std::printf("test accuracy %.3f on %lld images after %d steps on %d ranks\n", acc,
                    static_cast<long long>(test.images.size(0)), steps, ranks);
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_fashion_mnist: %s\n", e.what());
    return 1;
  }
  return 0;
}
