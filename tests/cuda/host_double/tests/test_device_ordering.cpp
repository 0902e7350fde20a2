// Ordering and synchronization defects of the device code that only the host double of
// CUDA can show deterministically (its streams are deferred queues; cuda_double::stream_op
// lets a test hold a stream at a gate; cuda_double::implicit_device_syncs counts every call
// CUDA documents as synchronizing the device). Double-only: label cuda_double.
//
// - layer_events records a layer on the caller's per-thread default stream, not on the
//   legacy default stream, which would wait for the communication thread's buckets.
// - compress_on_device waits for its stream when queuing throws, so no queued kernel
//   outlives the buffers the caller frees on the exception.
// - the synchronous device step orders each bucket's compressor stream after the work the
//   caller queued on its default stream (the gradient's producer).
// - AR-Topk's pinned control staging and the device communicators' host staging
//   (nccl_communicator, callback_device_communicator) never free or allocate pinned memory
//   during a step (cudaFreeHost and cudaMallocHost synchronize the whole device): the
//   trainer reserves them at construction, for its layout, policy and ranks.
// - the double counts each of those calls (and not their asynchronous forms).
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.hpp"
#include "gravac/collective/allreduce_compatible.hpp"
#include "gravac/cuda/callback_device_communicator.hpp"
#include "gravac/cuda/detail/device_compress.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/layer_events_cuda.hpp"
#include "gravac/cuda/nccl_communicator.hpp"
#include "gravac/cuda/topk_cuda.hpp"
#include "gravac/gravac.hpp"
#include "gravac_test_util.hpp"
#include "lone_rank_device_comm.hpp"

namespace {

using gravac::test::lone_rank_device_comm;
using gravac::test::to_device;
using gravac::test::to_host;

// A stream operation that completes only once *open is true: a bucket in flight.
struct gate_op final : cuda_double::stream_op {
  std::atomic<bool>* open;
  explicit gate_op(std::atomic<bool>* o) : open(o) {}
  bool poll() override { return open->load(); }
  std::string what() const override { return "the test's gate (a bucket in flight on the communication thread)"; }
};

// Opens the gate when the test case ends, however it ends (a failed REQUIRE throws), and
// runs every stream empty, so no later case finds the gate queued.
struct gate_opener {
  std::atomic<bool>& open;
  ~gate_opener() {
    open = true;
    if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
  }
};

// A stream operation that records that it ran.
struct flag_op final : cuda_double::stream_op {
  std::atomic<bool>* ran;
  explicit flag_op(std::atomic<bool>* r) : ran(r) {}
  bool poll() override {
    *ran = true;
    return true;
  }
  std::string what() const override { return "the test's flag (a queued kernel)"; }
};

// Stands in for a compressor: layer_events::wait needs its stream().
struct fake_compressor {
  gravac::stream_ref s;
  gravac::stream_ref stream() const { return s; }
};

__global__ void copy_kernel(const float* src, float* dst, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * 1ull * blockDim.x + threadIdx.x; i < n; i += 1ull * gridDim.x * blockDim.x)
    dst[i] = src[i];
}

// A one-rank NCCL communicator (the double's NCCL needs no MPI for one rank).
ncclUniqueId one_rank_id() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  return id;
}

// One rank's device callbacks (callback_device_communicator): a gather copies on the
// stream it is given, the rest have nothing to exchange.
gravac_device_comm_callbacks one_rank_callbacks() {
  gravac_device_comm_callbacks cb{};
  cb.struct_size = sizeof cb;
  cb.rank = 0;
  cb.size = 1;
  cb.allreduce = [](void*, void*, std::size_t, gravac_dtype, gravac_reduce_op, void*) { return 0; };
  cb.allgather = [](void*, const void* send, std::size_t bytes, void* recv, void* stream) {
    const cudaError_t e =
        cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream));
    return e == cudaSuccess ? 0 : 1;
  };
  cb.broadcast = [](void*, void*, std::size_t, int, void*) { return 0; };
  cb.barrier = [](void*, void*) { return 0; };
  return cb;
}

// A layout whose device statistics (2 per layer, the gain and its curve, the previous
// times) are more than a device communicator's initial host staging (256 doubles).
gravac::layout many_layers() {
  gravac::layout lay;
  for (int i = 0; i < 160; ++i) lay.add("l" + std::to_string(i), {std::size_t(37 + i % 5)}, gravac::layer_kind::dense);
  return lay;
}

gravac::moo_policy_options warming_moo() {
  gravac::moo_policy_options pol;
  pol.warmup_steps = 6;
  pol.warmup_start = 0.3;
  pol.warmup_end = 0.02;
  return pol;
}

// Steps `t` `steps` times and requires that no step calls anything that synchronizes the
// device (a pinned allocation among them).
template <class T>
void require_steps_never_synchronize(T& t, std::uint64_t steps, std::uint64_t seed) {
  const auto& lay = t.get_layout();
  for (std::uint64_t s = 0; s < steps; ++s) {
    INFO("step " << s);
    auto g = to_device(gravac::test::make_data(lay.numel(), seed + s));
    const std::size_t syncs0 = cuda_double::implicit_device_syncs();  // the step alone
    const std::string before = cuda_double::device_sync_calls();
    t.step(gravac::device_view(g));
    INFO("device synchronizations before the step: " << before);
    INFO("device synchronizations after it: " << cuda_double::device_sync_calls());
    REQUIRE(cuda_double::implicit_device_syncs() == syncs0);
  }
}

}  // namespace

TEST_CASE("layer_events::record_default does not wait for another thread's per-thread stream") {
  static std::atomic<bool> open;  // outlives the case: the gate may still be queued when it ends
  open = false;
  gate_opener opener{open};
  // The communication thread's bucket in flight: a gate on that thread's per-thread stream.
  cudaError_t queued = cudaErrorUnknown;
  std::thread comm([&] { queued = cuda_double::enqueue(cudaStreamPerThread, std::make_unique<gate_op>(&open)); });
  comm.join();
  REQUIRE(queued == cudaSuccess);

  gravac::cuda_stream bucket_stream;  // a compressor's non-blocking stream
  {
    gravac::detail::layer_events<gravac::cuda_space> ev;
    ev.begin(2);
    ev.record_default(0);  // ready(0) in the caller's thread: backward has queued nothing
    ev.wait(fake_compressor{bucket_stream.ref()}, 0, 1);
    // The bucket may start now: its layer's event must not wait for the bucket in flight.
    const cudaError_t q = cudaStreamQuery(bucket_stream.ref().get());
    (void)cudaGetLastError();
    open = true;
    GRAVAC_TRY_CUDA(cudaStreamSynchronize(bucket_stream.ref().get()));
    REQUIRE(q == cudaSuccess);
  }
}

TEST_CASE(
    "a device_buffer grown while work on its non-blocking stream still uses it frees the old memory after that work") {
  // The staging of a compressed allreduce with overlap grows this way: a kernel queued on the
  // buffer's own stream still reads the old memory when the buffer reallocates. The free
  // must be ordered on that stream; on another one (the legacy stream, say) it runs as soon
  // as that stream is waited for, and the queued kernel then reads freed memory, which the
  // double reports.
  gravac::cuda_stream own;  // non-blocking
  gravac::device_buffer<float> buf(1024, own.ref());
  gravac::device_buffer<float> out(1024, own.ref());
  const std::vector<float> values(1024, 2.5f);
  GRAVAC_TRY_CUDA(cudaMemcpy(buf.data(), values.data(), sizeof(float) * 1024, cudaMemcpyHostToDevice));
  gravac::detail::launch(&copy_kernel, 4, 256, own.ref().get(), static_cast<const float*>(buf.data()), out.data(),
                         1024ull);  // queued on the buffer's stream, not yet run
  buf.resize(1u << 16);             // reallocates: the old memory is freed behind the queued copy
  // Other streams are waited for before the buffer's own: a free queued elsewhere runs here.
  GRAVAC_TRY_CUDA(cudaStreamSynchronize(nullptr));
  GRAVAC_TRY_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
  GRAVAC_TRY_CUDA(cudaStreamSynchronize(own.ref().get()));
  REQUIRE(to_host(out.data(), out.size()) == values);
}

TEST_CASE("compress_on_device waits for its stream when queuing throws") {
  gravac::layout lay;
  lay.add("w", {16}, gravac::layer_kind::dense);
  gravac::cuda_stream s;
  gravac::device_buffer<float> g(16), e(16);
  gravac::device_buffer<std::byte> out(64);
  gravac::compress_stats st;
  const auto p = gravac::test::params_for(lay, 0.5);
  std::atomic<bool> ran{false};
  const gravac::detail::device_step step{"test_compressor", lay, s.ref()};
  bool threw = false;
  try {
    gravac::detail::compress_on_device(
        step, gravac::device_view(g), gravac::device_view(e), p, std::span<std::byte>(out.data(), out.size()), st,
        [] { return std::size_t{64}; },
        [&](std::byte*) {
          // A kernel queued, then a failure before the step's synchronize.
          REQUIRE(cuda_double::enqueue(s.ref().get(), std::make_unique<flag_op>(&ran)) == cudaSuccess);
          throw std::runtime_error("queue failed");
        },
        [] {}, [](std::size_t bound) { return bound; });
  } catch (const std::runtime_error& err) {
    threw = std::string(err.what()) == "queue failed";
    // The caller frees g, e and the packet here: nothing queued may still run on them.
    REQUIRE(ran.load());
  }
  REQUIRE(threw);
}

TEST_CASE("the synchronous device step reads a gradient produced on the caller's default stream") {
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {20011}, gravac::layer_kind::dense);
  gravac::cuda_stream compressor_stream;  // non-blocking: nothing orders it but the trainer
  gravac::nccl_communicator comm(one_rank_id(), 0, 1);
  using T = gravac::trainer<gravac::topk_cuda, gravac::allgather, gravac::fixed_policy>;
  T::options opt;
  opt.policy.kept_fraction = 0.05;
  opt.compressor.stream = compressor_stream.ref();
  for (const std::size_t bb : {gravac::one_bucket, gravac::bucket_per_layer}) {
    INFO("bucket_bytes " << bb);
    opt.bucket_bytes = bb;
    T ref(comm, lay, opt), t(comm, lay, opt);
    for (std::uint64_t step = 0; step < 2; ++step) {
      INFO("step " << step);
      const auto h = gravac::test::make_data(lay.numel(), 40 + step);
      auto g_ref = to_device(h);  // complete before the step
      ref.step(gravac::device_view(g_ref));

      const auto src = to_device(h);
      gravac::device_buffer<float> g(lay.numel());  // zeros, complete
      // The caller's backward writes g on its default stream (deferred on the double).
      gravac::detail::launch(&copy_kernel, 4, 64, cudaStreamPerThread, src.data(), g.data(),
                             static_cast<unsigned long long>(lay.numel()));
      t.step(gravac::device_view(g));

      const auto want = to_host(g_ref.data(), g_ref.size()), got = to_host(g.data(), g.size());
      REQUIRE(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
      const auto e_ref = to_host(ref.residual_view().data(), lay.numel());
      const auto e = to_host(t.residual_view().data(), lay.numel());
      REQUIRE(std::memcmp(e.data(), e_ref.data(), e_ref.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("AR-Topk's device passes never allocate or free pinned memory during a step, whatever control was reserved") {
  const auto lay = gravac::test::mixed_layout();
  gravac::allreduce_compatible k(lay);
  gravac::topk_cuda c(lay);
  k.prepare(c);
  lone_rank_device_comm comm;
  // A control plane beyond what prepare() stages (control_slots()), reserved before any
  // step as the trainer reserves its collectives'.
  k.reserve_control(c, 5000, comm.size());
  gravac::device_buffer<float> e(lay.numel());
  gravac::step_control ctl;
  // flexible's pattern: nothing, then its codec time, then the time and a batch of
  // measured timings; then the whole reserved plane, then less.
  const std::size_t slots[] = {0, 1, 33, 1, 40, 5000, 2};
  for (std::size_t s = 0; s < std::size(slots); ++s) {
    INFO("step " << s << ", " << slots[s] << " control slots");
    auto g = to_device(gravac::test::make_data(lay.numel(), 60 + s));
    ctl.clear();
    if (slots[s]) {
      const std::size_t at = ctl.reserve(slots[s]);
      for (std::size_t i = 0; i < slots[s]; ++i) ctl.local(at + i) = static_cast<float>(i + s);
    }
    gravac::step_buffers<gravac::cuda_space> b{gravac::device_view(g), gravac::device_view(e), s == 0,
                                               slots[s] ? &ctl : nullptr};
    gravac::compress_stats st;
    gravac::step_report r;
    auto p = gravac::test::params_for(lay, 0.1, s);
    // From here: the step alone (the test's own staging above uses synchronous copies).
    const std::size_t syncs0 = cuda_double::implicit_device_syncs();
    k.aggregate(c, comm, b, p, st, r);
    INFO("device synchronizations so far: " << cuda_double::device_sync_calls());
    REQUIRE(cuda_double::implicit_device_syncs() == syncs0);
    if (slots[s]) {  // one rank: the sums are this rank's values
      REQUIRE(ctl.has_sums());
      for (std::size_t i = 0; i < slots[s]; ++i) REQUIRE(ctl.sum(i) == static_cast<float>(i + s));
    }
  }
}

TEST_CASE("a device AR-Topk (VAR) trainer on more ranks than its passes stage for reserves their control plane") {
  // VAR's norms ride as one control slot per rank: 3000 are more than control_slots()
  // stages for this layout, so only the trainer's reservation keeps the first step from
  // growing the staging (cudaMallocHost).
  const auto lay = gravac::test::mixed_layout();
  lone_rank_device_comm comm{3000};
  using T = gravac::trainer<gravac::topk_cuda, gravac::allreduce_compatible, gravac::fixed_policy>;
  T::options opt;
  opt.policy.kept_fraction = 0.1;
  opt.collective.rule = gravac::index_rank_rule::var;
  T t(comm, lay, opt);
  require_steps_never_synchronize(t, 2, 70);
  REQUIRE(t.collective().last_root() == 0);
}

TEST_CASE("a device AR-Topk trainer over NCCL with a statistics policy never synchronizes the device in a step") {
  // 160 layers: the statistics the device trainer reduces over NCCL are more than
  // nccl_communicator's initial host staging; the trainer reserves them at construction.
  const auto lay = many_layers();
  gravac::nccl_communicator comm(one_rank_id(), 0, 1);
  for (const auto rule : {gravac::index_rank_rule::star, gravac::index_rank_rule::var}) {
    INFO("rule " << static_cast<int>(rule));
    using T = gravac::trainer<gravac::topk_cuda, gravac::allreduce_compatible, gravac::moo_policy>;
    T::options opt;
    opt.policy = warming_moo();
    opt.collective.rule = rule;
    T t(comm, lay, opt);
    require_steps_never_synchronize(t, 3, 80);
  }
}

TEST_CASE("a device trainer over C callbacks with a statistics policy never synchronizes the device in a step") {
  // callback_device_communicator's host staging: as nccl_communicator's, reserved by the
  // trainer for the statistics of 160 layers.
  const auto lay = many_layers();
  gravac::cuda_stream producer;
  gravac::callback_device_communicator comm(one_rank_callbacks(), producer.ref());
  using T = gravac::trainer<gravac::topk_cuda, gravac::allreduce_compatible, gravac::moo_policy>;
  T::options opt;
  opt.policy = warming_moo();
  opt.compressor.stream = producer.ref();
  T t(comm, lay, opt);
  require_steps_never_synchronize(t, 2, 90);
}

TEST_CASE("the double counts every call CUDA documents as synchronizing the device, and not the asynchronous forms") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  void* d = nullptr;
  void* h = nullptr;
  void* h2 = nullptr;
  std::vector<char> pageable(64);
  const auto counted = [](const char* what, const auto& call) {
    INFO(what << "; counted so far: " << cuda_double::device_sync_calls());
    const std::size_t before = cuda_double::implicit_device_syncs();
    REQUIRE(call() == cudaSuccess);
    return cuda_double::implicit_device_syncs() - before;
  };
  CHECK(counted("cudaMalloc", [&] { return cudaMalloc(&d, 64); }) == 1);
  CHECK(counted("cudaMallocHost", [&] { return cudaMallocHost(&h, 64); }) == 1);
  CHECK(counted("cudaHostAlloc", [&] { return cudaHostAlloc(&h2, 64, 0); }) == 1);
  CHECK(counted("cudaMemset", [&] { return cudaMemset(d, 0, 64); }) == 1);
  CHECK(counted("cudaMemcpy", [&] { return cudaMemcpy(pageable.data(), d, 64, cudaMemcpyDeviceToHost); }) == 1);
  CHECK(counted("cudaDeviceSynchronize", [&] { return cudaDeviceSynchronize(); }) == 1);
  CHECK(counted("cudaFreeHost", [&] { return cudaFreeHost(h2); }) == 1);
  // Stream-ordered and asynchronous forms, and waits for one stream: not device-wide.
  void* a = nullptr;
  const std::size_t waits0 = cuda_double::host_waits();
  CHECK(counted("cudaMallocAsync", [&] { return cudaMallocAsync(&a, 64, s); }) == 0);
  CHECK(counted("cudaMemsetAsync", [&] { return cudaMemsetAsync(a, 0, 64, s); }) == 0);
  CHECK(counted("cudaMemcpyAsync into pinned", [&] { return cudaMemcpyAsync(h, a, 64, cudaMemcpyDeviceToHost, s); }) ==
        0);
  CHECK(counted("cudaFreeAsync", [&] { return cudaFreeAsync(a, s); }) == 0);
  CHECK(counted("cudaStreamSynchronize", [&] { return cudaStreamSynchronize(s); }) == 0);
  CHECK(cuda_double::host_waits() == waits0 + 1);
  CHECK(counted("cudaFree", [&] { return cudaFree(d); }) == 1);
  CHECK(counted("cudaFreeHost", [&] { return cudaFreeHost(h); }) == 1);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}
