// process_group_communicator over real Gloo process groups (4 ranks as threads of this
// process, over one HashStore and the loopback device): the communicator conformance suite,
// a trainer step on it, and the C++ DDP hook (ddp_comm_hook) against that trainer.
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "communicator_conformance.hpp"
#include "gravac/adapters/torch_ddp_hook.hpp"
#include "gravac/adapters/torch_process_group.hpp"
#include "gravac/collective/allgather.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/policy/gravac_policy.hpp"
#include "gravac/trainer.hpp"

using namespace gravac;

namespace {

// Runs body(group) on \p n Gloo ranks (threads); rethrows the first rank's failure.
void on_gloo_ranks(int n, const std::function<void(c10::intrusive_ptr<c10d::ProcessGroup>)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::mutex m;
  std::exception_ptr first;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto opt = c10d::ProcessGroupGloo::Options::create();
        opt->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        body(c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, n, opt));
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

struct small_net : torch::nn::Module {
  small_net() {
    fc1 = register_module("fc1", torch::nn::Linear(40, 24));
    fc2 = register_module("fc2", torch::nn::Linear(24, 10));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

}  // namespace

TEST_CASE("process_group_communicator over Gloo passes the communicator conformance suite", "[torch][conformance]") {
  for (int n : {1, 4}) {
    std::vector<test::conformance_log> logs(static_cast<std::size_t>(n));
    on_gloo_ranks(n, [&](c10::intrusive_ptr<c10d::ProcessGroup> group) {
      process_group_communicator comm(group);
      logs[static_cast<std::size_t>(comm.rank())] = test::run_communicator_conformance(comm);
      communicator_ref<host_space> ref(comm);  // how the trainer holds it
      auto via_ref = test::run_communicator_conformance(ref);
      if (via_ref.failures() != 0)
        logs[static_cast<std::size_t>(comm.rank())].record("through communicator_ref", false);
    });
    for (int r = 0; r < n; ++r) {
      const auto& log = logs[static_cast<std::size_t>(r)];
      INFO(n << " Gloo ranks, rank " << r);
      CHECK(log.rank == r);
      CHECK(log.checks.size() == logs[0].checks.size());
      CHECK(log.alltoallv_tested);
      CHECK(log.broadcast_values_tested);
      test::report_conformance(log);
    }
  }
}

TEST_CASE("the C++ DDP hook gives each bucket the trainer's average, at the last bucket", "[torch][ddp]") {
  using trainer_t = trainer<topk, allgather, gravac_policy>;
  constexpr int ranks = 4;
  std::vector<int> mismatches(ranks, -1), early(ranks, -1);
  on_gloo_ranks(ranks, [&](c10::intrusive_ptr<c10d::ProcessGroup> group) {
    const int rank = group->getRank();
    torch::manual_seed(5);
    small_net net;
    process_group_communicator comm(group);
    const auto params = ddp_parameters(net);
    REQUIRE(params.size() == 4);
    trainer_t::options opt;
    opt.seed = 11;
    opt.policy.time.source = time_source::measured;
    trainer_t hooked{comm, ddp_layout(params), opt}, reference{comm, ddp_layout(params), opt};
    ddp_hook_core<trainer_t> core(hooked, params);
    ddp_comm_hook<trainer_t> hook(core);
    const std::size_t n = hooked.get_layout().numel();
    int bad = 0, not_waiting = 0;
    for (int step = 0; step < 6; ++step) {
      torch::manual_seed(100 * step + rank);
      std::vector<torch::Tensor> grads;
      for (const auto& p : params) grads.push_back(torch::randn(p.tensor.sizes()));
      // DDP's buckets: the last two parameters, then the first two (reverse order, as DDP).
      const std::vector<std::vector<std::size_t>> buckets{{2, 3}, {0, 1}};
      std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
      std::vector<torch::Tensor> buffers;
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        std::vector<torch::Tensor> flat, ps;
        std::vector<std::size_t> offsets, lengths;
        std::vector<c10::IntArrayRef> sizes;
        std::size_t at = 0;
        for (auto i : buckets[b]) {
          flat.push_back(grads[i].reshape({-1}));
          ps.push_back(params[i].tensor);
          offsets.push_back(at);
          lengths.push_back(static_cast<std::size_t>(grads[i].numel()));
          sizes.push_back(params[i].tensor.sizes());
          at += lengths.back();
        }
        auto buffer = torch::cat(flat);
        c10d::GradBucket bucket(b, buckets.size(), buffer, offsets, lengths, sizes, ps);
        futures.push_back(hook.runHook(bucket));
        buffers.push_back(buffer);
        if (b + 1 < buckets.size() && futures.back()->completed()) ++not_waiting;
      }
      // The reference: the same gradients, in layout order, through trainer::step.
      std::vector<float> flat(n);
      std::size_t at = 0;
      for (const auto& g : grads) {
        std::memcpy(flat.data() + at, g.contiguous().data_ptr<float>(), g.numel() * sizeof(float));
        at += static_cast<std::size_t>(g.numel());
      }
      reference.step(flat);
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        auto result = hook.parseHookResult(futures[b]->value());
        std::size_t off = 0;
        for (auto i : buckets[b]) {
          const auto& l = hooked.get_layout()[i];
          if (std::memcmp(result.data_ptr<float>() + off, flat.data() + l.offset, l.numel * sizeof(float)) != 0) ++bad;
          off += l.numel;
        }
      }
    }
    mismatches[static_cast<std::size_t>(rank)] = bad;
    early[static_cast<std::size_t>(rank)] = not_waiting;
  });
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(mismatches[static_cast<std::size_t>(r)] == 0);  // bit for bit the trainer's
    CHECK(early[static_cast<std::size_t>(r)] == 0);       // no bucket completed before the last
  }
}

TEST_CASE("the DDP hook refuses a parameter it does not know, and the next step starts afresh", "[torch][ddp]") {
  using trainer_t = trainer<topk, allgather, gravac_policy>;
  on_gloo_ranks(1, [&](c10::intrusive_ptr<c10d::ProcessGroup> group) {
    small_net net;
    process_group_communicator comm(group);
    const auto params = ddp_parameters(net);
    trainer_t t{comm, ddp_layout(params)};
    ddp_hook_core<trainer_t> core(t, params);
    auto stranger = torch::zeros({3}, torch::requires_grad());
    auto g = torch::ones({3});
    CHECK_THROWS_WITH(core.on_bucket(0, g, {stranger}, {g}, false),
                      Catch::Contains("a parameter the hook was not built with"));
    CHECK_FALSE(core.in_step());
    std::vector<torch::Tensor> ps, gs;
    for (const auto& p : params) {
      ps.push_back(p.tensor);
      gs.push_back(torch::ones(p.tensor.sizes()));
    }
    auto buffer = torch::ones({static_cast<std::int64_t>(t.get_layout().numel())});
    std::vector<torch::Tensor> views;
    std::int64_t at = 0;
    for (const auto& p : params) {
      views.push_back(buffer.narrow(0, at, p.tensor.numel()).view(p.tensor.sizes()));
      at += p.tensor.numel();
    }
    CHECK(core.on_bucket(0, buffer, ps, views, true));
    CHECK(core.last_report().step == 0);
    CHECK_THROWS_WITH(ddp_layout({}), Catch::Contains("no trainable parameters"));
  });
}
