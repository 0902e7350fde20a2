// The LibTorch adapter: LibTorch's backward writes into gravac's flat buffer (the same
// memory, no copies), layer kinds follow the module types, the trainer's averaged
// gradient on two thread ranks equals the serial reference, and a short data-parallel
// training run through gravac lowers the loss. One TU on purpose: LibTorch compiles slowly.
// LibTorch first: glog (through c10) defines CHECK, which Catch2 must own in this file.
#include <torch/torch.h>

#include "gravac/adapters/torch.hpp"
#undef CHECK

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "gravac_test_util.hpp"

using namespace gravac;

namespace {

// Every layer kind: conv, batch norm, LSTM, linear, a bare parameter and a frozen one.
struct mixed_netImpl : torch::nn::Module {
  mixed_netImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(4))),
        lstm(register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(6, 5)))),
        fc(register_module("fc", torch::nn::Linear(4 * 6 * 6 + 5, 3))) {
    scale = register_parameter("scale", torch::ones({1}));
    frozen = register_parameter("frozen", torch::ones({2}), /*requires_grad=*/false);
  }
  // x: (N, 1, 8, 8) images, s: (T, N, 6) sequences.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& s) {
    auto a = torch::relu(bn(conv(x))).flatten(1);
    auto h = std::get<0>(lstm(s)).select(0, -1);
    return fc(torch::cat({a, h}, 1)) * scale;
  }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::LSTM lstm;
  torch::nn::Linear fc;
  torch::Tensor scale, frozen;
};
TORCH_MODULE(mixed_net);

void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto src = from.parameters(), dst = to.parameters();
  REQUIRE(src.size() == dst.size());
  for (std::size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
}

struct batch {
  torch::Tensor x, s, y;
};
batch make_batch(std::uint64_t seed, int n = 8) {
  auto gen = at::detail::createCPUGenerator(seed);
  return {torch::randn({n, 1, 8, 8}, gen), torch::randn({3, n, 6}, gen),
          torch::randint(0, 3, {n}, gen, torch::dtype(torch::kLong))};
}

torch::Tensor loss_of(mixed_net& net, const batch& b) {
  return torch::nn::functional::cross_entropy(net->forward(b.x, b.s), b.y);
}

// The gradients of every trainable parameter, flattened in layout order.
std::vector<float> flat_grads(const std::vector<torch::Tensor>& params) {
  std::vector<float> out;
  for (const auto& p : params) {
    auto g = p.grad().contiguous();
    out.insert(out.end(), g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
  }
  return out;
}

// A reference model (no adapter) with the same parameters: its plain LibTorch gradients.
std::vector<float> reference_grads(mixed_net& like, const batch& b) {
  mixed_net ref;
  copy_parameters(*like, *ref);
  loss_of(ref, b).backward();
  std::vector<torch::Tensor> trainable;
  for (const auto& p : ref->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  return flat_grads(trainable);
}

}  // namespace

TEST_CASE("torch_gradients: layout and layer kinds from the module types", "[torch]") {
  mixed_net net;
  torch_gradients grads(*net);
  const auto& lay = grads.get_layout();
  std::vector<std::string> names;
  for (const auto& l : lay.layers()) names.push_back(l.name);
  // Registration order, depth first; the frozen parameter is left out.
  const std::vector<std::string> expect_names = {"scale",
                                                 "conv.weight",
                                                 "conv.bias",
                                                 "bn.weight",
                                                 "bn.bias",
                                                 "lstm.weight_ih_l0",
                                                 "lstm.weight_hh_l0",
                                                 "lstm.bias_ih_l0",
                                                 "lstm.bias_hh_l0",
                                                 "fc.weight",
                                                 "fc.bias"};
  CHECK(names == expect_names);
  const auto kind = [&](const std::string& n) {
    for (const auto& l : lay.layers())
      if (l.name == n) return l.kind;
    FAIL("no layer " << n);
    return layer_kind::dense;
  };
  CHECK(kind("conv.weight") == layer_kind::conv);
  CHECK(kind("conv.bias") == layer_kind::bias_or_norm);
  CHECK(kind("bn.weight") == layer_kind::bias_or_norm);
  CHECK(kind("lstm.weight_ih_l0") == layer_kind::recurrent);
  CHECK(kind("lstm.bias_hh_l0") == layer_kind::bias_or_norm);
  CHECK(kind("fc.weight") == layer_kind::dense);
  CHECK(kind("scale") == layer_kind::bias_or_norm);
  std::int64_t numel = 0;
  for (const auto& p : net->parameters())
    if (p.requires_grad()) numel += p.numel();
  CHECK(lay.numel() == static_cast<std::size_t>(numel));
  CHECK((lay[1].shape == std::vector<std::size_t>{4, 1, 3, 3}));

  // Modules without bias, inside a Sequential (names are the child indices).
  torch::nn::Sequential seq(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 2, 3).bias(false)), torch::nn::Flatten(),
                            torch::nn::Linear(torch::nn::LinearOptions(8, 2).bias(false)));
  torch_gradients seq_grads(*seq);
  REQUIRE(seq_grads.get_layout().size() == 2);
  CHECK(seq_grads.get_layout()[0].name == "0.weight");
  CHECK(seq_grads.get_layout()[0].kind == layer_kind::conv);
  CHECK(seq_grads.get_layout()[1].name == "2.weight");
  CHECK(seq_grads.get_layout()[1].kind == layer_kind::dense);

  // The classify option overrides the default rule.
  torch_gradients::options opt;
  opt.classify = [](const std::string& name, std::string_view, const torch::Tensor&) -> std::optional<layer_kind> {
    if (name == "fc.weight") return layer_kind::recurrent;
    return std::nullopt;
  };
  mixed_net other;
  torch_gradients custom(*other, opt);
  CHECK(custom.get_layout()[9].kind == layer_kind::recurrent);
  CHECK(custom.get_layout()[1].kind == layer_kind::conv);
}

TEST_CASE("torch_gradients: LibTorch's backward writes into gravac's buffer", "[torch]") {
  torch::set_num_threads(1);
  mixed_net net;
  torch_gradients grads(*net);
  const auto& lay = grads.get_layout();
  const float* base = grads.grads().data();
  REQUIRE(grads.attached());
  for (std::size_t i = 0; i < lay.size(); ++i)
    CHECK(grads.parameters()[i].grad().data_ptr<float>() == base + lay[i].offset);

  torch::optim::SGD sgd(net->parameters(), 0.05);
  for (int it = 0; it < 3; ++it) {
    const auto b = make_batch(10 + it);
    sgd.zero_grad();  // in place: the aliases stay in the buffer
    REQUIRE(grads.attached());
    for (float v : grads.grads()) REQUIRE(v == 0.0f);
    const auto expect = reference_grads(net, b);
    loss_of(net, b).backward();
    REQUIRE(grads.attached());
    CHECK(grads.grads().data() == base);
    // The buffer holds exactly what LibTorch computed, and it is not all zero.
    const auto got = std::vector<float>(grads.grads().begin(), grads.grads().end());
    CHECK(test::max_rel_diff(got, expect) < 1e-6);
    double sq = 0;
    for (float v : got) sq += double(v) * v;
    CHECK(sq > 0);
    // Writing through gravac's span is visible in the module's grads (same memory).
    grads.grads()[lay[9].offset] = 12345.0f;
    CHECK(net->fc->weight.grad().flatten()[0].item<float>() == 12345.0f);
    sgd.step();
  }

  // Module::zero_grad(set_to_none) moves gradients out of the buffer: step() refuses,
  // attach() brings them back (with the values LibTorch wrote meanwhile).
  net->zero_grad(/*set_to_none=*/true);
  loss_of(net, make_batch(99)).backward();
  CHECK_FALSE(grads.attached());
  const auto outside = flat_grads(grads.parameters());
  run_ranks(1, [&](thread_communicator& comm) {
    trainer<identity, dense_allreduce, fixed_policy> t(comm, lay);
    CHECK_THROWS_AS(grads.step(t), gravac::error);
    grads.attach();
    CHECK(grads.attached());
    CHECK(std::vector<float>(grads.grads().begin(), grads.grads().end()) == outside);
    grads.step(t);  // one rank, identity: the gradient is unchanged
    CHECK(std::vector<float>(grads.grads().begin(), grads.grads().end()) == outside);
  });
}

TEST_CASE("torch_gradients: the trainer's average on 2 ranks equals the serial reference", "[torch][threads]") {
  torch::set_num_threads(1);
  constexpr int ranks = 2, steps = 3;
  constexpr double fraction = 0.1;
  std::vector<mixed_net> nets(ranks);
  for (int r = 1; r < ranks; ++r) copy_parameters(*nets[0], *nets[r]);
  // Each rank sees its own data; the parameters stay fixed so that the serial reference
  // can recompute every rank's gradient.
  std::vector<std::vector<batch>> data(ranks);
  for (int r = 0; r < ranks; ++r)
    for (int s = 0; s < steps; ++s) data[r].push_back(make_batch(1000 * s + r));
  std::vector<std::vector<std::vector<float>>> out(steps, std::vector<std::vector<float>>(ranks));
  layout lay;

  using T = trainer<topk, allgather, fixed_policy>;
  T::options opt;
  opt.policy.kept_fraction = fraction;
  opt.seed = 7;
  run_ranks(ranks, [&](thread_communicator& comm) {
    const int r = comm.rank();
    torch_gradients grads(*nets[r]);
    if (r == 0) lay = grads.get_layout();
    T t(comm, grads.get_layout(), opt);
    for (int s = 0; s < steps; ++s) {
      grads.zero_grad();
      loss_of(nets[r], data[r][s]).backward();
      const auto& rep = grads.step(t);
      CHECK(rep.bytes_sent < rep.dense_bytes);
      // The module's own .grad() tensors hold the average: read them through LibTorch.
      out[s][r] = flat_grads(grads.parameters());
    }
  });

  std::vector<std::vector<float>> residuals(ranks, std::vector<float>(lay.numel(), 0.0f));
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> g(ranks);
    for (int r = 0; r < ranks; ++r) g[r] = reference_grads(nets[0], data[r][s]);
    const auto ref = test::serial_reference<topk>(lay, {}, test::params_for(lay, fraction, s, 7), g, residuals);
    for (int r = 0; r < ranks; ++r) {
      INFO("step " << s << " rank " << r);
      CHECK(test::max_rel_diff(out[s][r], ref) < 1e-5);
      CHECK(out[s][r] == out[s][0]);  // identical bits on every rank
    }
  }
}

TEST_CASE("torch_backward_hooks: backward drives the asynchronous step, with the synchronous step's bits",
          "[torch][threads][async]") {
  torch::set_num_threads(1);
  constexpr int ranks = 2, steps = 3;
  std::vector<mixed_net> nets(2 * ranks);  // per rank: one for the hooked run, one for step()
  for (int r = 1; r < 2 * ranks; ++r) copy_parameters(*nets[0], *nets[r]);
  std::vector<std::vector<batch>> data(ranks);
  for (int r = 0; r < ranks; ++r)
    for (int s = 0; s < steps; ++s) data[r].push_back(make_batch(500 * s + r));
  std::vector<std::vector<std::vector<float>>> hooked(steps, std::vector<std::vector<float>>(ranks)), plain = hooked;
  using T = trainer<topk, allgather, fixed_policy>;
  T::options opt;
  opt.policy.kept_fraction = 0.2;
  opt.bucket_bytes = bucket_per_layer;
  run_ranks(ranks, [&](thread_communicator& comm) {
    const int r = comm.rank();
    torch_gradients hg(*nets[r]), pg(*nets[ranks + r]);
    T ht(comm, hg.get_layout(), opt), pt(comm, pg.get_layout(), opt);
    torch_backward_hooks<T> hooks(hg, ht);
    torch::optim::SGD hsgd(nets[r]->parameters(), 0.05), psgd(nets[ranks + r]->parameters(), 0.05);
    for (int s = 0; s < steps; ++s) {
      hsgd.zero_grad();
      hooks.begin_step();
      loss_of(nets[r], data[r][s]).backward();
      // The hooks marked every trainable parameter during backward (layer 0, "scale", too).
      CHECK_THROWS_WITH(ht.ready(0), Catch::Contains("already marked ready"));
      const auto& rep = hooks.finish();
      CHECK(rep.buckets == ht.bucket_count());
      hooked[s][r] = flat_grads(hg.parameters());
      hsgd.step();

      psgd.zero_grad();
      loss_of(nets[ranks + r], data[r][s]).backward();
      pg.step(pt);
      plain[s][r] = flat_grads(pg.parameters());
      psgd.step();
    }
    // Backward outside a step is ignored by the hooks.
    hsgd.zero_grad();
    CHECK_NOTHROW(loss_of(nets[r], data[r][0]).backward());
    CHECK_FALSE(ht.step_in_progress());
  });
  for (int s = 0; s < steps; ++s)
    for (int r = 0; r < ranks; ++r) {
      INFO("step " << s << " rank " << r);
      CHECK(hooked[s][r] == plain[s][r]);
    }
}

TEST_CASE("torch_gradients: a short data-parallel training run lowers the loss", "[torch][threads]") {
  torch::set_num_threads(1);
  torch::manual_seed(1);  // the networks' initial weights: the same run every time
  constexpr int ranks = 2, steps = 200;
  std::vector<mixed_net> nets(ranks);
  for (int r = 1; r < ranks; ++r) copy_parameters(*nets[0], *nets[r]);
  // A learnable task: the label is the sign pattern of two fixed projections.
  const auto labelled = [](std::uint64_t seed) {
    auto b = make_batch(seed, 16);
    auto score = b.x.flatten(1).narrow(1, 0, 8).sum(1) + b.s.select(0, 2).narrow(1, 0, 3).sum(1);
    b.y = (score > 1).to(torch::kLong) + (score > -1).to(torch::kLong);
    return b;
  };
  std::vector<std::vector<double>> losses(ranks);
  using T = trainer<topk, allgather, fixed_policy>;
  T::options opt;
  opt.policy.kept_fraction = 0.2;
  run_ranks(ranks, [&](thread_communicator& comm) {
    const int r = comm.rank();
    torch_gradients grads(*nets[r]);
    T t(comm, grads.get_layout(), opt);
    torch::optim::SGD sgd(nets[r]->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int s = 0; s < steps; ++s) {
      const auto b = labelled(100000 * r + s % 20);
      sgd.zero_grad();
      auto loss = loss_of(nets[r], b);
      loss.backward();
      grads.step(t);
      sgd.step();
      losses[r].push_back(loss.item<double>());
    }
  });
  const auto mean = [](const std::vector<double>& v, std::size_t first, std::size_t n) {
    double s = 0;
    for (std::size_t i = first; i < first + n; ++i) s += v[i];
    return s / static_cast<double>(n);
  };
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r << ": first " << mean(losses[r], 0, 10) << " last " << mean(losses[r], steps - 10, 10));
    CHECK(mean(losses[r], steps - 10, 10) < 0.6 * mean(losses[r], 0, 10));  // falls by 40% or more
  }
  // Same averaged gradients, same optimizer: the replicas stay identical.
  auto p0 = nets[0]->parameters(), p1 = nets[1]->parameters();
  for (std::size_t i = 0; i < p0.size(); ++i) CHECK(torch::equal(p0[i], p1[i]));
}
