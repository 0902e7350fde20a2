// Proof that the CUDA host double can fail: each hazard plants one defect in a tiny kernel
// or call sequence, runs it in a child process and asserts that it is caught (a wrong result
// the case's own check sees, or a report of the double), and runs the same sequence done
// right, which must pass without a report.
//   cuda_double_hazards <hazard>     (one CTest test per hazard; no argument lists them)
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int ok = 0;     // the result is right
constexpr int wrong = 3;  // the case's own check saw a wrong result

#define HZ_CHECK(call)                                                                 \
  do {                                                                                 \
    if ((call) != 0) {                                                                 \
      std::fprintf(stderr, "hazard: %s failed at %s:%d\n", #call, __FILE__, __LINE__); \
      std::_Exit(2);                                                                   \
    }                                                                                  \
  } while (0)

// ---- kernels ------------------------------------------------------------------------

__global__ void broadcast_shared(int* out, bool sync) {
  __shared__ int value;
  if (threadIdx.x == 0) value = 42;
  if (sync) __syncthreads();
  out[threadIdx.x] = value;
}

// Block b extends block b-1's result: right only if the blocks run in order.
__global__ void chain_blocks(int* out) {
  if (threadIdx.x != 0) return;
  const unsigned b = blockIdx.x;
  out[b] = b == 0 ? 1 : out[b - 1] + 1;
}

// The same step as one block of its own launch.
__global__ void chain_block(int* out, unsigned b) {
  if (threadIdx.x == 0) out[b] = b == 0 ? 1 : out[b - 1] + 1;
}

__global__ void fill(int* out, int v, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = v;
}

// Counts its 256 inputs into 16 bins in shared memory; \p zero_first: the bins are
// cleared first, as they must be (CUDA's shared memory is undefined when a block starts).
__global__ void shared_histogram(const int* in, unsigned* out, bool zero_first) {
  __shared__ unsigned bins[16];
  if (zero_first) {
    if (threadIdx.x < 16) bins[threadIdx.x] = 0;
    __syncthreads();
  }
  atomicAdd(&bins[in[threadIdx.x] % 16], 1u);
  __syncthreads();
  if (threadIdx.x < 16) out[threadIdx.x] = bins[threadIdx.x];
}

// Every thread of every block adds 1 to one global counter \p reps times: by atomicAdd, or
// by a plain read-modify-write with a little work between the read and the write (a race
// between blocks: updates are lost when blocks run at the same time).
__global__ void count_into(unsigned* counter, int reps, bool atomic) {
  for (int r = 0; r < reps; ++r) {
    if (atomic) {
      atomicAdd(counter, 1u);
    } else {
      volatile unsigned* c = counter;
      const unsigned v = *c;
      for (int k = 0; k < 16; ++k) __asm__ volatile("" ::: "memory");
      *c = v + 1;
    }
  }
}

// Counts 256 inputs into 16 shared bins, each thread adding 1 to its input's bin: by
// atomicAdd, or by a plain += (a lost update when two threads of the block add to one bin
// at once; here the fibers run to the barrier without interruption, so the counts come out
// right and only the race detector sees it).
__global__ void shared_bins_add(const int* in, unsigned* out, bool atomic) {
  __shared__ unsigned bins[16];
  if (threadIdx.x < 16) bins[threadIdx.x] = 0;
  __syncthreads();
  unsigned& bin = bins[in[blockIdx.x * blockDim.x + threadIdx.x] % 16];
  if (atomic)
    atomicAdd(&bin, 1u);
  else
    bin += 1u;
  __syncthreads();
  if (threadIdx.x < 16) out[blockIdx.x * 16 + threadIdx.x] = bins[threadIdx.x];
}

// Every block counts its 64 inputs into shared bins, then merges them into the grid's 16
// global bins: by atomicAdd, or by a plain += (a lost update between blocks).
__global__ void merge_block_bins(const int* in, unsigned* out, bool atomic) {
  __shared__ unsigned bins[16];
  if (threadIdx.x < 16) bins[threadIdx.x] = 0;
  __syncthreads();
  atomicAdd(&bins[in[blockIdx.x * blockDim.x + threadIdx.x] % 16], 1u);
  __syncthreads();
  if (threadIdx.x < 16) {
    if (atomic)
      atomicAdd(&out[threadIdx.x], bins[threadIdx.x]);
    else
      out[threadIdx.x] += bins[threadIdx.x];
  }
}

// Every block writes its sum to its own global slot, then takes a ticket; the block with the
// last ticket adds the slots: after a __threadfence() before the ticket, as CUDA requires
// for the slots to be visible to the last block, or without one (planted: the last block
// may read a slot before the write that filled it is visible; only the race detector, which
// gives the blocks no ordering but the fences', sees it on the host's stronger ordering).
__global__ void sum_by_last_block(const int* in, unsigned* slots, unsigned* done, unsigned* total, bool fence) {
  __shared__ unsigned sum;
  __shared__ bool is_last;
  if (threadIdx.x == 0) sum = 0;
  __syncthreads();
  atomicAdd(&sum, static_cast<unsigned>(in[blockIdx.x * blockDim.x + threadIdx.x]));
  __syncthreads();
  if (threadIdx.x == 0) {
    slots[blockIdx.x] = sum;
    if (fence) __threadfence();
    is_last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  if (threadIdx.x == 0) {
    unsigned t = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) t += slots[b];
    *total = t;
  }
}

int* device_ints(int n) {
  void* p = nullptr;
  HZ_CHECK(cudaMalloc(&p, sizeof(int) * static_cast<std::size_t>(n)));
  return static_cast<int*>(p);
}

int* pinned_ints(int n) {
  void* p = nullptr;
  HZ_CHECK(cudaMallocHost(&p, sizeof(int) * static_cast<std::size_t>(n)));
  return static_cast<int*>(p);
}

template <class... P, class... A>
void launch(void (*k)(P...), dim3 g, dim3 b, cudaStream_t s, A... a) {
  cuda_double::launch(k, g, b, 0, s, a...);
  HZ_CHECK(cudaGetLastError());
}

// ---- device hazards -------------------------------------------------------------------

// One block in a fresh process: a double whose shared memory starts as the thread's
// zero-initialized storage would give the right counts to the kernel that never clears.
// Runs histogram kernel k (inputs i * stride for i < blocks * threads, 16 bins, output
// cleared first) and checks that every bin counts \p expected.
int histogram_case(void (*k)(const int*, unsigned*, bool), int stride, unsigned blocks, unsigned threads, bool flag,
                   unsigned expected) {
  const int n = static_cast<int>(blocks * threads);
  std::vector<int> in(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = i * stride;
  int* d_in = device_ints(n);
  auto* d_out = reinterpret_cast<unsigned*>(device_ints(16));
  HZ_CHECK(cudaMemcpy(d_in, in.data(), sizeof(int) * static_cast<std::size_t>(n), cudaMemcpyHostToDevice));
  HZ_CHECK(cudaMemset(d_out, 0, sizeof(unsigned) * 16));
  launch(k, blocks, threads, nullptr, d_in, d_out, flag);
  std::vector<unsigned> h(16);
  HZ_CHECK(cudaMemcpy(h.data(), d_out, sizeof(unsigned) * 16, cudaMemcpyDeviceToHost));
  for (unsigned v : h)
    if (v != expected) return wrong;
  return ok;
}

int uninitialised_shared(bool fixed) { return histogram_case(shared_histogram, 7, 1, 256, fixed, 16); }

// A counter every block adds to, under the strict mode of concurrent blocks (the blocks of a
// grid on 4 OS threads at once): planted, a plain read-modify-write, which loses updates
// (which blocks overlap is up to the OS: grids are run until one is wrong, for up to 3 s,
// which on one CPU takes the scheduler's preemptions); done right, atomicAdd, exact in 20
// grids. Run one block after another, as by default, the planted kernel would pass.
int race_between_blocks(bool fixed) {
  const cuda_double::concurrent_blocks strict(4);
  auto* d = reinterpret_cast<unsigned*>(device_ints(1));
  constexpr unsigned expected = 8u * 64u * 200u;
  const auto t0 = std::chrono::steady_clock::now();
  for (int grid = 0; fixed ? grid < 20 : std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3); ++grid) {
    HZ_CHECK(cudaMemset(d, 0, sizeof(unsigned)));
    launch(count_into, 8, 64, nullptr, d, 200, fixed);
    unsigned h = 0;
    HZ_CHECK(cudaMemcpy(&h, d, sizeof(unsigned), cudaMemcpyDeviceToHost));
    if (h != expected) return wrong;
  }
  return ok;
}

// A "step" on a non-blocking stream that must never synchronize the device: planted, it
// allocates its pinned staging in the middle (cudaMallocHost synchronizes implicitly);
// done right, the staging is allocated before the step.
int device_sync_in_step(bool fixed) {
  cudaStream_t s = nullptr;
  HZ_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* d = device_ints(1024);
  int* staging = fixed ? pinned_ints(1024) : nullptr;
  const std::size_t syncs0 = cuda_double::implicit_device_syncs();
  launch(fill, 4, 256, s, d, 7, 1024);
  if (!fixed) staging = pinned_ints(1024);
  HZ_CHECK(cudaMemcpyAsync(staging, d, sizeof(int) * 1024, cudaMemcpyDeviceToHost, s));
  HZ_CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < 1024; ++i)
    if (staging[i] != 7) return wrong;
  if (cuda_double::implicit_device_syncs() != syncs0) {
    std::fprintf(stderr, "hazard: the step synchronized the device: %s\n", cuda_double::device_sync_calls().c_str());
    return wrong;
  }
  return ok;
}

// Pinned staging reused while a copy from it is still queued on its non-blocking stream:
// the copy reads the staging when it runs, so the second step's values overwrite the
// first's. Done right, the host waits for the first copy (an event) before refilling.
int staging_reused_while_queued(bool fixed) {
  cudaStream_t s = nullptr;
  HZ_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* staging = pinned_ints(256);
  int* first = device_ints(256);
  int* second = device_ints(256);
  cudaEvent_t copied = nullptr;
  HZ_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  for (int i = 0; i < 256; ++i) staging[i] = 1;
  HZ_CHECK(cudaMemcpyAsync(first, staging, sizeof(int) * 256, cudaMemcpyHostToDevice, s));
  HZ_CHECK(cudaEventRecord(copied, s));
  if (fixed) HZ_CHECK(cudaEventSynchronize(copied));
  for (int i = 0; i < 256; ++i) staging[i] = 2;
  HZ_CHECK(cudaMemcpyAsync(second, staging, sizeof(int) * 256, cudaMemcpyHostToDevice, s));
  HZ_CHECK(cudaStreamSynchronize(s));
  std::vector<int> h(512);
  HZ_CHECK(cudaMemcpy(h.data(), first, sizeof(int) * 256, cudaMemcpyDeviceToHost));
  HZ_CHECK(cudaMemcpy(h.data() + 256, second, sizeof(int) * 256, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 512; ++i)
    if (h[static_cast<std::size_t>(i)] != (i < 256 ? 1 : 2)) return wrong;
  return ok;
}

int missing_syncthreads(bool fixed) {
  int* d = device_ints(256);
  launch(broadcast_shared, 1, 256, nullptr, d, fixed);
  std::vector<int> h(256);
  HZ_CHECK(cudaMemcpy(h.data(), d, sizeof(int) * 256, cudaMemcpyDeviceToHost));
  for (int v : h)
    if (v != 42) return wrong;
  return ok;
}

// One block of 256 threads, 16 to a bin: planted, the bins are counted into by +=.
int lost_update_shared(bool fixed) { return histogram_case(shared_bins_add, 1, 1, 256, fixed, 16); }

// 8 blocks of 64 merge their bins into global ones, under concurrent blocks: planted, by +=.
int lost_update_global(bool fixed) {
  const cuda_double::concurrent_blocks strict(4);
  return histogram_case(merge_block_bins, 1, 8, 64, fixed, 32);
}

// 8 blocks of 64 sum into slots that the last block adds, under concurrent blocks: planted,
// without the fence before the ticket.
int missing_threadfence(bool fixed) {
  const cuda_double::concurrent_blocks strict(4);
  constexpr unsigned blocks = 8, threads = 64;
  std::vector<int> in(blocks * threads);
  unsigned expected = 0;
  for (std::size_t i = 0; i < in.size(); ++i) expected += static_cast<unsigned>(in[i] = static_cast<int>(i % 5));
  int* d_in = device_ints(static_cast<int>(in.size()));
  auto* d = reinterpret_cast<unsigned*>(device_ints(static_cast<int>(blocks) + 2));
  HZ_CHECK(cudaMemcpy(d_in, in.data(), sizeof(int) * in.size(), cudaMemcpyHostToDevice));
  for (int grid = 0; grid < 4; ++grid) {
    HZ_CHECK(cudaMemset(d, 0, sizeof(unsigned) * (blocks + 2)));
    launch(sum_by_last_block, blocks, threads, nullptr, d_in, d, d + blocks, d + blocks + 1, fixed);
    unsigned h = 0;
    HZ_CHECK(cudaMemcpy(&h, d + blocks + 1, sizeof(unsigned), cudaMemcpyDeviceToHost));
    if (h != expected) return wrong;
  }
  return ok;
}

int block_order(bool fixed) {
  int* d = device_ints(16);
  if (fixed) {
    for (unsigned b = 0; b < 16; ++b) launch(chain_block, 1, 32, nullptr, d, b);  // the stream orders them
  } else {
    launch(chain_blocks, 16, 32, nullptr, d);
  }
  std::vector<int> h(16);
  HZ_CHECK(cudaMemcpy(h.data(), d, sizeof(int) * 16, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 16; ++i)
    if (h[static_cast<std::size_t>(i)] != i + 1) return wrong;
  return ok;
}

int missing_event_wait(bool fixed) {
  cudaStream_t a = nullptr, b = nullptr;
  HZ_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  HZ_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  int* d = device_ints(1024);
  int* h = pinned_ints(1024);
  launch(fill, 4, 256, a, d, 7, 1024);
  if (fixed) {
    cudaEvent_t e = nullptr;
    HZ_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    HZ_CHECK(cudaEventRecord(e, a));
    HZ_CHECK(cudaStreamWaitEvent(b, e, 0));
  }
  HZ_CHECK(cudaMemcpyAsync(h, d, sizeof(int) * 1024, cudaMemcpyDeviceToHost, b));
  HZ_CHECK(cudaStreamSynchronize(b));
  for (int i = 0; i < 1024; ++i)
    if (h[i] != 7) return wrong;
  return ok;
}

int alloc_on_other_stream(bool fixed) {
  cudaStream_t a = nullptr, b = nullptr;
  HZ_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  HZ_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  void* p = nullptr;
  HZ_CHECK(cudaMallocAsync(&p, 4096, a));
  if (fixed) {
    cudaEvent_t e = nullptr;
    HZ_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    HZ_CHECK(cudaEventRecord(e, a));
    HZ_CHECK(cudaStreamWaitEvent(b, e, 0));
  }
  launch(fill, 4, 256, b, static_cast<int*>(p), 5, 1024);
  HZ_CHECK(cudaStreamSynchronize(b));
  return ok;
}

int free_then_use(bool fixed) {
  cudaStream_t a = nullptr, b = nullptr;
  HZ_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  HZ_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  void* p = nullptr;
  HZ_CHECK(cudaMallocAsync(&p, 4096, a));
  HZ_CHECK(cudaStreamSynchronize(a));
  launch(fill, 4, 256, b, static_cast<int*>(p), 5, 1024);  // queued on b, not yet run
  if (fixed) {                                             // the free waits for b's use
    cudaEvent_t e = nullptr;
    HZ_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    HZ_CHECK(cudaEventRecord(e, b));
    HZ_CHECK(cudaStreamWaitEvent(a, e, 0));
  }
  HZ_CHECK(cudaFreeAsync(p, a));
  HZ_CHECK(cudaStreamSynchronize(a));  // runs the free (and, when fixed, b's kernel first)
  HZ_CHECK(cudaStreamSynchronize(b));
  return ok;
}

// ---- NCCL hazards: two ranks, forked, over the double's NCCL ------------------------

// Runs body(rank, id) on 2 forked ranks and returns rank 0's code (the worst of both).
int two_ranks(const std::function<int(int, const ncclUniqueId&)>& body) {
  ncclUniqueId id;
  HZ_CHECK(ncclGetUniqueId(&id));
  const pid_t peer = fork();
  if (peer == 0) std::_Exit(body(1, id));
  const int mine = body(0, id);
  int status = 0;
  waitpid(peer, &status, 0);
  const int theirs = WIFEXITED(status) ? WEXITSTATUS(status) : 2;
  return mine > theirs ? mine : theirs;
}

ncclComm_t join(const ncclUniqueId& id, int rank, bool blocking) {
  ncclComm_t c = nullptr;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking ? 1 : 0;
  const ncclResult_t r = ncclCommInitRankConfig(&c, 2, id, rank, &cfg);
  HZ_CHECK(r != ncclSuccess && r != ncclInProgress);
  ncclResult_t s = ncclInProgress;
  while (s == ncclInProgress) HZ_CHECK(ncclCommGetAsyncError(c, &s));
  HZ_CHECK(s != ncclSuccess);
  return c;
}

// Waits as nccl_communicator does: the communicator, then the stream, until a deadline.
// Returns false at the deadline.
bool wait_with_deadline(ncclComm_t c, cudaStream_t s, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    ncclResult_t a = ncclSuccess;
    HZ_CHECK(ncclCommGetAsyncError(c, &a));
    if (a != ncclSuccess && a != ncclInProgress) return false;
    if (a == ncclSuccess) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) return true;
      (void)cudaGetLastError();
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
    std::this_thread::yield();
  }
}

int missing_group_end(bool fixed) {
  return two_ranks([&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = join(id, rank, false);
    cudaStream_t s = nullptr;
    HZ_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float* d = nullptr;
    HZ_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), 64 * sizeof(float)));
    launch(fill, 1, 64, s, reinterpret_cast<int*>(d), 0, 64);  // zero bits: 0.0f
    HZ_CHECK(cudaStreamSynchronize(s));
    std::vector<float> one(64, 1.0f);
    HZ_CHECK(cudaMemcpy(d, one.data(), sizeof(float) * 64, cudaMemcpyHostToDevice));
    ncclGroupStart();
    ncclAllReduce(d, d, 64, ncclFloat, ncclSum, c, s);
    if (fixed) ncclGroupEnd();
    if (!wait_with_deadline(c, s, 5.0)) return wrong;
    std::vector<float> h(64);
    HZ_CHECK(cudaMemcpy(h.data(), d, sizeof(float) * 64, cudaMemcpyDeviceToHost));
    for (float v : h)
      if (v != 2.0f) return wrong;
    return ok;
  });
}

int per_thread_stream_to_nonblocking_comm(bool fixed) {
  return two_ranks([&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = join(id, rank, false);
    cudaStream_t own = nullptr;
    HZ_CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
    cudaStream_t s = fixed ? own : cudaStreamPerThread;
    float* d = nullptr;
    HZ_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), 64 * sizeof(float)));
    std::vector<float> one(64, 1.0f);
    HZ_CHECK(cudaMemcpy(d, one.data(), sizeof(float) * 64, cudaMemcpyHostToDevice));
    float* h = nullptr;
    HZ_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h), 64 * sizeof(float)));
    const ncclResult_t r = ncclAllReduce(d, d, 64, ncclFloat, ncclSum, c, s);
    HZ_CHECK(r != ncclSuccess && r != ncclInProgress);
    if (!wait_with_deadline(c, s, 5.0)) return wrong;  // the communicator, then this thread's s
    HZ_CHECK(cudaMemcpyAsync(h, d, sizeof(float) * 64, cudaMemcpyDeviceToHost, s));
    HZ_CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < 64; ++i)
      if (h[i] != 2.0f) return wrong;
    return ok;
  });
}

int pageable_copy_blocks_timeout(bool fixed) {
  return two_ranks([&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = join(id, rank, false);
    if (rank == 1) {  // a hung peer: joins, then never calls the collective
      std::this_thread::sleep_for(std::chrono::seconds(5));
      ncclCommAbort(c);
      return ok;
    }
    cudaStream_t s = nullptr;
    HZ_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    double* d = nullptr;
    HZ_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), 4 * sizeof(double)));
    std::vector<double> pageable(4, 1.0);
    HZ_CHECK(cudaMemcpy(d, pageable.data(), sizeof(double) * 4, cudaMemcpyHostToDevice));
    ncclAllReduce(d, d, 4, ncclDouble, ncclSum, c, s);
    ncclResult_t a = ncclInProgress;
    while (a == ncclInProgress) HZ_CHECK(ncclCommGetAsyncError(c, &a));
    if (fixed) {  // pinned staging and a polling wait: the 1 s timeout fires
      double* pinned = nullptr;
      HZ_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned), 4 * sizeof(double)));
      HZ_CHECK(cudaMemcpyAsync(pinned, d, sizeof(double) * 4, cudaMemcpyDeviceToHost, s));
      const bool done = wait_with_deadline(c, s, 1.0);
      ncclCommAbort(c);
      return done ? wrong : ok;  // right: the wait timed out and the rank is in control
    }
    HZ_CHECK(cudaMemcpyAsync(pageable.data(), d, sizeof(double) * 4, cudaMemcpyDeviceToHost, s));
    return wrong;  // not reached: the copy blocks until the double reports the hang
  });
}

struct hazard {
  std::function<int(bool)> run;
  const char* what;
};

const std::map<std::string, hazard>& hazards() {
  static const std::map<std::string, hazard> h = {
      {"missing_syncthreads", {missing_syncthreads, "a shared value read without __syncthreads"}},
      {"uninitialised_shared", {uninitialised_shared, "a shared histogram counted into without clearing it first"}},
      {"device_sync_in_step",
       {device_sync_in_step, "pinned staging allocated in the middle of a step (cudaMallocHost synchronizes)"}},
      {"staging_reused_while_queued",
       {staging_reused_while_queued, "pinned staging refilled while a copy from it is still queued on its stream"}},
      {"block_order", {block_order, "a kernel whose blocks depend on running in order"}},
      {"race_between_blocks",
       {race_between_blocks, "a global counter every block adds to by a plain read-modify-write"}},
      {"missing_event_wait", {missing_event_wait, "a copy on stream B of what stream A writes, without an event"}},
      {"alloc_on_other_stream",
       {alloc_on_other_stream, "cudaMallocAsync on stream A, used on stream B without an event"}},
      {"free_then_use", {free_then_use, "cudaFreeAsync on stream A while stream B still uses the memory"}},
      {"missing_group_end", {missing_group_end, "ncclGroupStart without ncclGroupEnd"}},
      {"lost_update_shared", {lost_update_shared, "a shared histogram's bins added to by += (no atomicAdd)"}},
      {"lost_update_global", {lost_update_global, "per-block histograms merged into global bins by += (no atomicAdd)"}},
      {"missing_threadfence",
       {missing_threadfence, "per-block sums added by the last block, whose ticket no __threadfence precedes"}},
      {"per_thread_stream_to_nonblocking_comm",
       {per_thread_stream_to_nonblocking_comm, "cudaStreamPerThread named to a non-blocking NCCL communicator"}},
      {"pageable_copy_blocks_timeout",
       {pageable_copy_blocks_timeout, "a copy into pageable memory behind a collective a peer never joins"}},
  };
  return h;
}

struct outcome {
  int code = 0;
  std::string err;
};

// Runs one variant in a child, capturing its stderr.
outcome run_child(const hazard& h, bool fixed) {
  int fd[2];
  if (pipe(fd) != 0) std::exit(2);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    dup2(fd[1], 2);
    std::_Exit(h.run(fixed));
  }
  close(fd[1]);
  outcome o;
  char buf[4096];
  for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) o.err.append(buf, static_cast<std::size_t>(n));
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

}  // namespace

// A report of the race detector (ThreadSanitizer; the tsan build of scripts/sanitize).
bool race_reported(const std::string& err) { return err.find("ThreadSanitizer: data race") != std::string::npos; }

int main(int argc, char** argv) {
  // --race-detector: the planted defect must be reported by the race detector itself (not
  // only seen as a wrong result), and the right sequence must give it nothing to report.
  const bool detector = argc == 3 && std::strcmp(argv[2], "--race-detector") == 0;
  if ((argc != 2 && !detector) || !hazards().count(argv[1])) {
    std::printf("usage: cuda_double_hazards <hazard> [--race-detector]; hazards:\n");
    for (const auto& [name, h] : hazards()) std::printf("  %-40s %s\n", name.c_str(), h.what);
    return argc == 1 ? 0 : 2;
  }
  const hazard& h = hazards().at(argv[1]);
  const outcome right = run_child(h, true);
  std::printf("done right: exit %d%s%s\n", right.code, right.err.empty() ? "" : ", stderr:\n", right.err.c_str());
  if (right.code != ok || right.err.find("gravac CUDA double") != std::string::npos ||
      right.err.find("ThreadSanitizer") != std::string::npos) {
    std::printf("FAILED: the correct sequence did not pass cleanly\n");
    return 1;
  }
  const outcome planted = run_child(h, false);
  const bool reported = planted.err.find("gravac CUDA double") != std::string::npos;
  const bool race = race_reported(planted.err);
  std::printf("planted defect: exit %d%s%s\n", planted.code, planted.err.empty() ? "" : ", stderr:\n",
              planted.err.c_str());
  if (detector) {
    if (race) {
      std::printf("caught: %s (reported by the race detector)\n", h.what);
      return 0;
    }
    std::printf("NOT CAUGHT by the race detector: %s\n", h.what);
    return 1;
  }
  if (planted.code == wrong || reported || race) {
    std::printf("caught: %s (%s)\n", h.what,
                race       ? "reported by the race detector"
                : reported ? "reported by the double"
                           : "wrong result");
    return 0;
  }
  std::printf("NOT CAUGHT: %s\n", h.what);
  return 1;
}
