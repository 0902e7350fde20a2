// Selftest of the CUDA host double's kernel engine (cuda_double/kernel.hpp,
// src/kernel_engine.cpp), standalone: it stands in for the runtime functions the engine
// calls (enqueue runs nothing until run_queue(), fail() prints and aborts, next_seed, ...).
// Build (from the repository root), one compile:
//   g++ -std=c++20 -O1 -ffp-contract=off -pthread -I tests/cuda/host_double/include
//       -include tests/cuda/host_double/selftest/prelude.hpp
//       tests/cuda/host_double/selftest/kernel_selftest.cpp
//       tests/cuda/host_double/src/kernel_engine.cpp -lboost_context -o kernel_selftest
// Exits 0 when every check holds; prints the first failed check otherwise.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

// ---------------------------------------------------------------------------------------
// Stand-ins for the runtime (src/runtime.cpp) the engine calls.
namespace {
thread_local std::vector<std::unique_ptr<cuda_double::stream_op>> queue;  // per OS thread
cudaError_t last_error = cudaSuccess;
cudaError_t sticky = cudaSuccess;
std::string sticky_why;
std::uint64_t seed_base = 1;
std::atomic<std::uint64_t> seed_counter{0};

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

namespace cuda_double {
cudaError_t enqueue(cudaStream_t, std::unique_ptr<stream_op> op) {
  if (sticky != cudaSuccess) return sticky;
  queue.push_back(std::move(op));
  return cudaSuccess;
}
void set_last_error(cudaError_t e) {
  if (sticky == cudaSuccess) last_error = e;
}
void set_sticky(cudaError_t e, const std::string& why) {
  sticky = e;
  sticky_why = why;
}
void fail(const std::string& msg) {
  std::fprintf(stderr, "gravac CUDA double: %s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}
cudaError_t sticky_error() { return sticky; }
std::uint64_t next_seed() { return splitmix(seed_base * 0x100000001b3ULL + seed_counter++); }
}  // namespace cuda_double

namespace {

void run_queue() {
  for (auto& op : queue)
    while (!op->poll()) {
    }
  queue.clear();
}

// Wall and CPU time of this thread since construction (the CPU time is what to compare
// on a loaded machine).
struct stopwatch {
  static double cpu() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  std::chrono::steady_clock::time_point w0 = std::chrono::steady_clock::now();
  double c0 = cpu();
  [[nodiscard]] double wall() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  }
  [[nodiscard]] double used() const { return cpu() - c0; }
};

cudaError_t take_last_error() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

// Runs fn in a forked child; returns {exit status as waitpid gives it, the child's stderr}.
std::pair<int, std::string> in_child(const std::function<void()>& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  int fds[2];
  CHECK(pipe(fds) == 0);
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    fn();
    std::fflush(stderr);
    _exit(0);
  }
  close(fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {status, err};
}

// A child that must die in fail() with a message that holds every one of \p parts.
void expect_failure(const char* what, const std::function<void()>& fn, std::initializer_list<const char*> parts) {
  const auto [status, err] = in_child(fn);
  bool ok = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && err.find("gravac CUDA double: ") != std::string::npos;
  for (const char* p : parts) ok = ok && err.find(p) != std::string::npos;
  if (!ok) {
    std::fprintf(stderr, "expected failure '%s' not seen; status %d, stderr:\n%s\n", what, status, err.c_str());
    std::exit(1);
  }
  std::printf("  fails as expected: %s\n    %.240s%s\n", what, err.c_str(), err.size() > 240 ? "..." : "");
}

// ---------------------------------------------------------------------------------------
// Kernels.

static __global__ void __launch_bounds__(256) block_sum(const int* in, int n, long long* out) {
  __shared__ long long sh[256];
  long long s = 0;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<int>(blockDim.x * gridDim.x))
    s += in[i];
  sh[threadIdx.x] = s;
  __syncthreads();
  for (unsigned off = blockDim.x / 2; off > 0; off /= 2) {
    if (threadIdx.x < off) sh[threadIdx.x] += sh[threadIdx.x + off];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = sh[0];
}

static __global__ void sync_forms(int* out) {
  const unsigned t = threadIdx.x;
  out[t * 6 + 0] = __syncthreads_or(t == 77);
  out[t * 6 + 1] = __syncthreads_or(0);
  out[t * 6 + 2] = __syncthreads_and(t != 300);
  out[t * 6 + 3] = __syncthreads_and(t != 5);
  out[t * 6 + 4] = __syncthreads_count(t % 3 == 0);
  out[t * 6 + 5] = __syncthreads_count(0);
}

constexpr int warp_results = 64;  // results per thread of warp_ops

// Every warp operation, its results in out[thread * warp_results + k].
static __global__ void warp_ops(unsigned* out) {
  const unsigned t = threadIdx.x, lane = t % 32, w = t / 32;
  unsigned* o = out + t * warp_results;
  const int v = static_cast<int>(lane * 10 + w * 1000 + 7);
  const unsigned full = 0xffffffffu;
  int k = 0;
  for (int width = 32; width >= 1; width /= 2) {
    o[k++] = static_cast<unsigned>(__shfl_sync(full, v, static_cast<int>((lane * 7 + 3) & 63), width));
    o[k++] = static_cast<unsigned>(__shfl_sync(full, v, -1, width));
    o[k++] = static_cast<unsigned>(__shfl_up_sync(full, v, 3, width));
    o[k++] = static_cast<unsigned>(__shfl_down_sync(full, v, 5, width));
    o[k++] = static_cast<unsigned>(__shfl_xor_sync(full, v, 5, width));
    o[k++] = static_cast<unsigned>(__shfl_xor_sync(full, v, 16, width));
  }
  // 36 so far. Other types.
  const double d = 0.5 + lane;
  o[k++] = static_cast<unsigned>(__shfl_xor_sync(full, d, 1) * 2);
  const float f = 0.25f * static_cast<float>(lane);
  o[k++] = __float_as_uint(__shfl_down_sync(full, f, 1));
  const unsigned long long big = (1ULL << 40) + lane;
  o[k++] = static_cast<unsigned>(__shfl_sync(full, big, 31) - (1ULL << 40));
  // Votes and reductions.
  o[k++] = __ballot_sync(full, lane % 3 == 0);
  o[k++] = static_cast<unsigned>(__all_sync(full, lane < 40));
  o[k++] = static_cast<unsigned>(__all_sync(full, lane != 9));
  o[k++] = static_cast<unsigned>(__any_sync(full, lane == 9));
  o[k++] = static_cast<unsigned>(__any_sync(full, 0));
  o[k++] = __reduce_add_sync(full, lane + 1u);
  o[k++] = __reduce_min_sync(full, 100u - lane);
  o[k++] = __reduce_max_sync(full, (lane * 37u) % 101u);
  o[k++] = static_cast<unsigned>(__reduce_add_sync(full, static_cast<int>(lane) - 20));
  o[k++] = static_cast<unsigned>(__reduce_min_sync(full, static_cast<int>(lane) - 20));
  o[k++] = static_cast<unsigned>(__reduce_max_sync(full, -static_cast<int>(lane)));
  // Divergent masks: even and odd lanes apart.
  if (lane % 2 == 0) {
    o[k++] = __ballot_sync(0x55555555u, lane % 4 == 0);
    o[k++] = static_cast<unsigned>(__shfl_sync(0x55555555u, v, static_cast<int>(lane + 1)));  // outside: own
    o[k++] = static_cast<unsigned>(__shfl_sync(0x55555555u, v, static_cast<int>(lane + 2) % 32));
  } else {
    o[k++] = __ballot_sync(0xaaaaaaaau, lane > 16);
    o[k++] = __reduce_add_sync(0xaaaaaaaau, 1u);
    __syncwarp(0xaaaaaaaau);
    o[k++] = static_cast<unsigned>(__any_sync(0xaaaaaaaau, lane == 31));
  }
  // __activemask: converged, then in a branch (the other lanes go on to __syncwarp).
  o[k++] = __activemask();
  unsigned m = 0;
  if (lane < 10) m = __activemask();
  __syncwarp();
  o[k++] = m;
  // A lane-by-lane chain in a divergent loop (each lane at its own mask).
  unsigned acc = 0;
  for (unsigned j = 0; j < 4; ++j)
    if (lane >= j * 8) acc += __ballot_sync(0xffffffffu << (j * 8) & (lane < 32 ? 0xffffffffu : 0), 1) >> 24;
  o[k++] = acc;
  // A block barrier between warp operations.
  __syncthreads();
  o[k++] = __ballot_sync(full, 1);
  // PTX takes the low 5 bits of a delta or lane mask: 33 acts as 1.
  o[k++] = static_cast<unsigned>(__shfl_down_sync(full, v, 33));
  o[k++] = static_cast<unsigned>(__shfl_xor_sync(full, v, 33));
}

// The expected warp_ops results of lane `lane` of warp `w` (`n`: lanes in the warp).
std::vector<unsigned> warp_expected(unsigned lane, unsigned w, unsigned n) {
  std::vector<unsigned> r;
  auto val = [&](unsigned l) { return l * 10 + w * 1000 + 7; };
  const unsigned own = val(lane);
  auto get = [&](long j) { return (j >= 0 && j < static_cast<long>(n)) ? val(static_cast<unsigned>(j)) : own; };
  for (unsigned width = 32; width >= 1; width /= 2) {
    const unsigned seg = (lane / width) * width;
    r.push_back(get(seg + ((lane * 7 + 3) & 63) % width));
    r.push_back(get(seg + (width - 1)));
    r.push_back(lane % width >= 3 ? get(lane - 3) : own);
    r.push_back(lane % width + 5 < width ? get(lane + 5) : own);
    // xor: reads from the own or an earlier segment, never a later one.
    const unsigned x5 = lane ^ 5u, x16 = lane ^ 16u;
    r.push_back(x5 < seg + width ? get(x5) : own);
    r.push_back(x16 < seg + width ? get(x16) : own);
  }
  const unsigned exist = n == 32 ? 0xffffffffu : (1u << n) - 1u;
  r.push_back(static_cast<unsigned>((0.5 + ((lane ^ 1u) < n ? (lane ^ 1u) : lane)) * 2));
  r.push_back(__float_as_uint(0.25f * static_cast<float>(lane + 1 < n ? lane + 1 : lane)));
  r.push_back(n == 32 ? 31u : lane);  // lane 31 is not in a partial warp: own value
  unsigned ballot = 0, sum = 0, mn = ~0u, mx = 0;
  int isum = 0, imn = INT_MAX, imx = INT_MIN;
  for (unsigned l = 0; l < n; ++l) {
    if (l % 3 == 0) ballot |= 1u << l;
    sum += l + 1;
    mn = std::min(mn, 100u - l);
    mx = std::max(mx, (l * 37u) % 101u);
    isum += static_cast<int>(l) - 20;
    imn = std::min(imn, static_cast<int>(l) - 20);
    imx = std::max(imx, -static_cast<int>(l));
  }
  r.push_back(ballot);
  r.push_back(1);
  r.push_back(n <= 9 ? 1u : 0u);
  r.push_back(n > 9 ? 1u : 0u);
  r.push_back(0);
  r.push_back(sum);
  r.push_back(mn);
  r.push_back(mx);
  r.push_back(static_cast<unsigned>(isum));
  r.push_back(static_cast<unsigned>(imn));
  r.push_back(static_cast<unsigned>(imx));
  if (lane % 2 == 0) {
    r.push_back(0x11111111u & exist);
    r.push_back(own);
    r.push_back(get((lane + 2) % 32));  // an even lane: in the mask when it exists
  } else {
    r.push_back(0xaaaa0000u & exist);
    r.push_back(static_cast<unsigned>(std::popcount(0xaaaaaaaau & exist)));
    r.push_back(n == 32 ? 1u : 0u);
  }
  r.push_back(exist);
  r.push_back(lane < 10 ? (0x3ffu & exist) : 0u);
  unsigned acc = 0;
  for (unsigned j = 0; j < 4; ++j)
    if (lane >= j * 8) acc += ((0xffffffffu << (j * 8)) & exist) >> 24;
  r.push_back(acc);
  r.push_back(exist);
  r.push_back(lane + 1 < 32 ? get(lane + 1) : own);
  r.push_back(get(lane ^ 1u));
  return r;
}

void check_warp_ops(unsigned threads) {
  std::vector<unsigned> out(std::size_t{threads} * warp_results, 0xdeadbeefu);
  cuda_double::launch(&warp_ops, dim3(2), dim3(threads), 0, nullptr, out.data());
  run_queue();
  for (unsigned t = 0; t < threads; ++t) {
    const unsigned w = t / 32, n = std::min(32u, threads - w * 32);
    const std::vector<unsigned> want = warp_expected(t % 32, w, n);
    for (std::size_t k = 0; k < want.size(); ++k) {
      if (out[t * warp_results + k] != want[k]) {
        std::fprintf(stderr, "warp_ops (%u threads): thread %u result %zu: got %u (0x%x), want %u (0x%x)\n", threads, t,
                     k, out[t * warp_results + k], out[t * warp_results + k], want[k], want[k]);
        std::exit(1);
      }
    }
  }
}

struct atomic_cells {
  int i_add, i_sub, i_max, i_min, i_or, i_and, i_xor, i_exch, i_cas;
  unsigned u_add, u_sub, u_max, u_min, u_or, u_and, u_xor, u_exch, u_cas, u_inc, u_dec;
  unsigned long long ull_add, ull_max, ull_min, ull_or, ull_cas, ull_exch;
  long long ll_max, ll_min;
  float f_add, f_exch;
  double d_add;
  unsigned short us_cas;
  unsigned short pad;
  unsigned hist[16];
};

static __global__ void __launch_bounds__(256) atomics(atomic_cells* c) {
  __shared__ unsigned sh_hist[16];
  const unsigned t = threadIdx.x;
  const unsigned gid = blockIdx.x * blockDim.x + t;
  if (t < 16) sh_hist[t] = 0;
  __syncthreads();
  atomicAdd(&sh_hist[gid % 16], 1u);
  atomicAdd(&c->i_add, 2);
  atomicSub(&c->i_sub, 3);
  atomicMax(&c->i_max, static_cast<int>(gid) - 5000);
  atomicMin(&c->i_min, static_cast<int>(gid) - 5000);
  atomicOr(&c->i_or, 1 << (gid % 31));
  atomicAnd(&c->i_and, ~(1 << (gid % 7)));
  atomicXor(&c->i_xor, 1 << (gid % 3));
  atomicExch(&c->i_exch, 1);
  // CAS loops start from a guess: a plain read of a word other threads update atomically
  // would be a race (the race detector reports it).
  for (int old = 0;;) {  // a CAS loop: +1
    const int seen = atomicCAS(&c->i_cas, old, old + 1);
    if (seen == old) break;
    old = seen;
  }
  atomicAdd(&c->u_add, 1u);
  atomicSub(&c->u_sub, 1u);
  atomicMax(&c->u_max, gid);
  atomicMin(&c->u_min, gid + 7);
  atomicOr(&c->u_or, 1u << (gid % 32));
  atomicAnd(&c->u_and, ~(1u << (gid % 5)));
  atomicXor(&c->u_xor, gid);
  atomicExch(&c->u_exch, 42u);
  for (unsigned old = 0;;) {
    const unsigned seen = atomicCAS(&c->u_cas, old, old + 3);
    if (seen == old) break;
    old = seen;
  }
  atomicInc(&c->u_inc, 9u);
  atomicDec(&c->u_dec, 9u);
  atomicAdd(&c->ull_add, 1ULL << 33);
  atomicMax(&c->ull_max, static_cast<unsigned long long>(gid) << 34);
  atomicMin(&c->ull_min, (static_cast<unsigned long long>(gid) + 1) << 34);
  atomicOr(&c->ull_or, 1ULL << (gid % 64));
  for (unsigned long long old = c->ull_cas;;) {
    const unsigned long long seen = atomicCAS(&c->ull_cas, old, old + (1ULL << 32));
    if (seen == old) break;
    old = seen;
  }
  atomicExch(&c->ull_exch, 5ULL);
  atomicMax(&c->ll_max, -static_cast<long long>(gid) * 1000000000LL);
  atomicMin(&c->ll_min, -static_cast<long long>(gid) * 1000000000LL);
  atomicAdd(&c->f_add, 0.5f);
  atomicExch(&c->f_exch, 1.5f);
  atomicAdd(&c->d_add, 0.25);
  for (unsigned short old = c->us_cas;;) {
    const unsigned short seen = atomicCAS(&c->us_cas, old, static_cast<unsigned short>(old + 1));
    if (seen == old) break;
    old = seen;
  }
  __syncthreads();
  if (t < 16) atomicAdd(&c->hist[t], sh_hist[t]);
}

void check_atomics() {
  constexpr unsigned blocks = 64, threads = 256, n = blocks * threads;
  atomic_cells c{};
  c.i_max = INT_MIN;
  c.i_min = INT_MAX;
  c.i_and = -1;
  c.u_min = ~0u;
  c.u_and = ~0u;
  c.ull_min = ~0ULL;
  c.ll_max = LLONG_MIN;
  c.ll_min = LLONG_MAX;
  cuda_double::launch(&atomics, dim3(blocks), dim3(threads), 0, nullptr, &c);
  run_queue();
  CHECK(c.i_add == 2 * static_cast<int>(n));
  CHECK(c.i_sub == -3 * static_cast<int>(n));
  CHECK(c.i_max == static_cast<int>(n - 1) - 5000);
  CHECK(c.i_min == -5000);
  CHECK(c.i_or == 0x7fffffff);
  CHECK(c.i_and == ~0x7f);
  {
    int want = 0;
    for (unsigned g = 0; g < n; ++g) want ^= 1 << (g % 3);
    CHECK(c.i_xor == want);
  }
  CHECK(c.i_exch == 1);
  CHECK(c.i_cas == static_cast<int>(n));
  CHECK(c.u_add == n);
  CHECK(c.u_sub == 0u - n);
  CHECK(c.u_max == n - 1);
  CHECK(c.u_min == 7);
  CHECK(c.u_or == ~0u);
  CHECK(c.u_and == ~0x1fu);
  unsigned x = 0;
  for (unsigned g = 0; g < n; ++g) x ^= g;
  CHECK(c.u_xor == x);
  CHECK(c.u_exch == 42u);
  CHECK(c.u_cas == 3 * n);
  CHECK(c.u_inc == n % 10);  // counts 0..9 then wraps to 0
  {
    unsigned d = 0;
    for (unsigned g = 0; g < n; ++g) d = (d == 0 || d > 9) ? 9 : d - 1;
    CHECK(c.u_dec == d);
  }
  CHECK(c.ull_add == static_cast<unsigned long long>(n) << 33);
  CHECK(c.ull_max == static_cast<unsigned long long>(n - 1) << 34);
  CHECK(c.ull_min == 1ULL << 34);
  CHECK(c.ull_or == ~0ULL);
  CHECK(c.ull_cas == static_cast<unsigned long long>(n) << 32);
  CHECK(c.ull_exch == 5);
  CHECK(c.ll_max == 0);
  CHECK(c.ll_min == -static_cast<long long>(n - 1) * 1000000000LL);
  CHECK(c.f_add == 0.5f * n);
  CHECK(c.f_exch == 1.5f);
  CHECK(c.d_add == 0.25 * n);
  CHECK(c.us_cas == static_cast<unsigned short>(n));
  for (unsigned b = 0; b < 16; ++b) CHECK(c.hist[b] == n / 16);
}

// Kernels of other OS threads at the same time, on the same counters.
static __global__ void __launch_bounds__(128) add_many(unsigned long long* sum, double* dsum) {
  __shared__ unsigned long long part;
  if (threadIdx.x == 0) part = 0;
  __syncthreads();
  atomicAdd(&part, static_cast<unsigned long long>(blockIdx.x * blockDim.x + threadIdx.x));
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(sum, part);
    atomicAdd(dsum, 1.0);
  }
}

void check_concurrent_threads() {
  unsigned long long sum = 0;
  double dsum = 0;
  std::vector<std::thread> ts;
  for (int k = 0; k < 4; ++k)
    ts.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) {
        cuda_double::launch(&add_many, dim3(16), dim3(128), 0, nullptr, &sum, &dsum);
        run_queue();
      }
    });
  for (auto& t : ts) t.join();
  const unsigned long long per = 2048ULL * 2047ULL / 2;
  CHECK(sum == per * 80);
  CHECK(dsum == 16.0 * 80);
}

static __global__ void block_ticket(unsigned* ticket, unsigned* order) {
  if (threadIdx.x == 0) order[blockIdx.x + blockIdx.y * gridDim.x] = atomicAdd(ticket, 1u);
}

std::vector<unsigned> block_order(unsigned blocks_x, unsigned blocks_y = 1) {
  unsigned ticket = 0;
  std::vector<unsigned> order(std::size_t{blocks_x} * blocks_y, ~0u);
  cuda_double::launch(&block_ticket, dim3(blocks_x, blocks_y), dim3(32), 0, nullptr, &ticket, order.data());
  run_queue();
  std::vector<unsigned> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (unsigned i = 0; i < sorted.size(); ++i) CHECK(sorted[i] == i);  // each block once
  return order;
}

static __global__ void broadcast(int v, int* out, bool sync_first) {
  __shared__ int sh;
  if (threadIdx.x == 0) sh = v + static_cast<int>(blockIdx.x);
  if (sync_first) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = sh;
}

// broadcast over 8 blocks of 256 threads: {wrong reads, blocks without a wrong read}.
std::pair<int, int> broadcast_wrong(bool sync_first, int v) {
  constexpr unsigned blocks = 8, threads = 256;
  std::vector<int> out(blocks * threads, 0);
  cuda_double::launch(&broadcast, dim3(blocks), dim3(threads), 0, nullptr, v, out.data(), sync_first);
  run_queue();
  int wrong = 0, clean = 0;
  for (unsigned b = 0; b < blocks; ++b) {
    int w = 0;
    for (unsigned t = 0; t < threads; ++t) w += out[b * threads + t] != v + static_cast<int>(b);
    wrong += w;
    clean += w == 0;
  }
  return {wrong, clean};
}

static __global__ void indices(unsigned* hits, unsigned* dims_ok) {
  const unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  atomicAdd(&hits[b * threads + tx], 1u);
  const bool ok = blockDim.x == 8 && blockDim.y == 4 && blockDim.z == 2 && gridDim.x == 3 && gridDim.y == 2 &&
                  gridDim.z == 2 && threadIdx.x < 8 && threadIdx.y < 4 && threadIdx.z < 2;
  // Lanes by linear index: a warp is 32 consecutive linear indices (here one z-plane).
  const unsigned warp_of_z = __ballot_sync(0xffffffffu, 1);
  if (!ok || warp_of_z != 0xffffffffu) atomicAdd(dims_ok, 1u);
}

struct big_param {
  int a[8];
};
static __global__ void params(big_param p, int x, int* out) {
  x += static_cast<int>(threadIdx.x);  // each thread its own copy
  __syncthreads();
  out[threadIdx.x] = x + p.a[0] * 1000 + p.a[7];
}

static __global__ void one_thread(int* out) {
  __syncthreads();
  out[0] = __syncthreads_count(1);
  out[1] = static_cast<int>(__ballot_sync(1u, 1));
  out[2] = __shfl_sync(1u, 99, 5);
  out[3] = static_cast<int>(__activemask());
  out[4] = static_cast<int>(__reduce_add_sync(1u, 7u));
  out[5] = __syncthreads_or(0);
  __syncwarp(1u);
  out[6] = static_cast<int>(blockIdx.x) + 1;
}

static __global__ void __launch_bounds__(256) stride2(const float* in, float* out, int n) {
  __shared__ float sh[256];
  for (int base = static_cast<int>(blockIdx.x * 256); base < n; base += static_cast<int>(gridDim.x * 256)) {
    sh[threadIdx.x] = in[base + static_cast<int>(threadIdx.x)];
    __syncthreads();
    out[base + static_cast<int>(threadIdx.x)] = sh[255 - threadIdx.x] * 2.0f;
    __syncthreads();
  }
}

static __global__ void __launch_bounds__(256) warp_sums(const float* in, float* out, int n) {
  for (int i = static_cast<int>(blockIdx.x * 256 + threadIdx.x); i < n; i += static_cast<int>(gridDim.x * 256)) {
    float v = in[i];
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (threadIdx.x % 32 == 0) out[i / 32] = v;
  }
}

static __global__ void __launch_bounds__(256) tiny(unsigned* count) {
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(count, 1u);
}

static __global__ void per_block(unsigned* hits) { hits[blockIdx.x] += 1; }

// Reads its shared memory before writing it (what CUDA leaves undefined), then writes it:
// every block must see the poison, never the previous block's values or zeros. Both the
// kernel's own __shared__ and a device function's.
static __device__ unsigned long long* helper_shared() {
  __shared__ unsigned long long wide[3];
  return wide;
}
static __global__ void __launch_bounds__(64) read_before_write(unsigned* seen, unsigned* seen_one) {
  __shared__ unsigned sh[64];
  __shared__ float f, g;
  unsigned long long* w = helper_shared();
  const unsigned t = threadIdx.x;
  const bool poisoned = sh[t] == 0xFFFFFFFFu && std::isnan(f) && std::isnan(g) && w[t % 3] == ~0ULL;
  __syncthreads();
  sh[t] = blockIdx.x + 1;
  f = 1.0f;
  g = 2.0f;
  w[t % 3] = 0;
  if (poisoned) atomicAdd(&seen[blockIdx.x], 1u);
  if (t == 0) seen_one[blockIdx.x] = sh[0];
}
static __global__ void one_thread_reads_shared(unsigned* out) {
  __shared__ unsigned x;
  out[blockIdx.x] = x;
  x = 5;
}

// Planted hazards (each run in a child).
static __global__ void exit_early(int* out) {
  if (threadIdx.x == 7) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
static __global__ void lane_exit_before_shfl(int* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x), 0);
}
static __global__ void barrier_in_branch(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncwarp();
  }
  out[threadIdx.x] = 1;
}
static __global__ void mismatched_warp_ops(int* out) {
  if (threadIdx.x % 32 < 16)
    out[threadIdx.x] = static_cast<int>(__ballot_sync(0xffffffffu, 1));
  else
    out[threadIdx.x] = __any_sync(0xffffffffu, 1);
}
static __global__ void mask_without_self(int* out) {
  out[threadIdx.x] = static_cast<int>(__ballot_sync(0xfffffffeu, 1));
}
static __global__ void mixed_barriers(int* out) {
  if (threadIdx.x == 40)
    out[0] = __syncthreads_or(1);
  else
    __syncthreads();
}
static __global__ void trapping(unsigned* finished, unsigned victim) {
  if (blockIdx.x == victim && threadIdx.x == 5) __trap();
  __syncthreads();
  atomicAdd(finished, 1u);
}
// Every thread of every block adds 1 to one global counter `reps` times: with atomicAdd,
// or with a plain read-modify-write with a little work between the read and the write (as
// a kernel that computes the new value has), which loses updates when blocks run at the
// same time (the planted race between blocks).
static __global__ void __launch_bounds__(64) count_all(unsigned* counter, int reps, bool atomic) {
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
static __global__ void misaligned(unsigned* p) {
  atomicAdd(reinterpret_cast<unsigned*>(reinterpret_cast<char*>(p) + 2), 1u);
}

// count_all over 8 blocks of 64 threads, 200 times each: the counter at the end.
unsigned count_all_once(bool atomic) {
  unsigned counter = 0;
  cuda_double::launch(&count_all, dim3(8), dim3(64), 0, nullptr, &counter, 200, atomic);
  run_queue();
  return counter;
}
constexpr unsigned count_all_expected = 8u * 64u * 200u;

// Concurrent blocks (the strict mode): the race is exercised, everything race-free still
// holds; the block reduction, the poison and the block order with it.
void check_concurrent_blocks() {
  // One block at a time (the default): the race never shows.
  if (cuda_double::block_threads() < 2) CHECK(count_all_once(false) == count_all_expected);
  const cuda_double::concurrent_blocks strict(4);
  for (int rep = 0; rep < 3; ++rep) CHECK(count_all_once(true) == count_all_expected);
  // The planted race: a lost update within a few grids (which blocks overlap is up to the
  // OS: grids run until one loses an update, for up to 3 s, which on one CPU takes the
  // scheduler's preemptions; none in that time would be a defect of the mode).
  if (std::thread::hardware_concurrency() >= 2) {
    int grids = 0;
    unsigned got = count_all_expected;
    const auto t0 = std::chrono::steady_clock::now();
    while (got == count_all_expected && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
      got = count_all_once(false);
      CHECK(got <= count_all_expected);
      ++grids;
    }
    CHECK(got < count_all_expected);
    CHECK(cuda_double::most_blocks_at_once() >= 2);
    std::printf("  concurrent blocks: the racy counter lost %u of %u updates (grid %d); atomicAdd exact\n",
                count_all_expected - got, count_all_expected, grids);
  } else {
    std::printf("  concurrent blocks: atomicAdd exact; the race not checked (one CPU)\n");
  }
  // Race-free kernels give the same results as one block at a time.
  {
    constexpr int n = 8 * 256 * 3 + 17;
    std::vector<int> in(n);
    for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = (i * 37) % 101 - 50;
    std::vector<long long> out(8, -1);
    cuda_double::launch(&block_sum, dim3(8), dim3(256), 0, nullptr, in.data(), n, out.data());
    run_queue();
    CHECK(std::accumulate(out.begin(), out.end(), 0LL) == std::accumulate(in.begin(), in.end(), 0LL));
  }
  {
    std::vector<unsigned> seen(16, 0), seen_one(16, 0);
    cuda_double::launch(&read_before_write, dim3(16), dim3(64), 0, nullptr, seen.data(), seen_one.data());
    run_queue();
    for (unsigned b = 0; b < 16; ++b) CHECK(seen[b] == 64 && seen_one[b] == b + 1);
  }
  CHECK(block_order(64).size() == 64);  // every block once
  check_atomics();
}

void check_intrinsics() {
  const double one_plus = 1.0 + std::ldexp(1.0, -30);
  const float up1 = std::nextafter(1.0f, 2.0f);
  CHECK(__double2float_rn(one_plus) == 1.0f);
  CHECK(__double2float_rz(one_plus) == 1.0f);
  CHECK(__double2float_rd(one_plus) == 1.0f);
  CHECK(__double2float_ru(one_plus) == up1);
  CHECK(__double2float_rz(-one_plus) == -1.0f);
  CHECK(__double2float_rd(-one_plus) == -up1);
  CHECK(__double2float_ru(-one_plus) == -1.0f);
  CHECK(__double2float_rn(1e300) == INFINITY);
  CHECK(__double2float_rz(1e300) == FLT_MAX);
  CHECK(__double2float_rd(1e300) == FLT_MAX);
  CHECK(__double2float_ru(-1e300) == -FLT_MAX);
  CHECK(__double2float_ru(1e-50) == std::numeric_limits<float>::denorm_min());
  CHECK(__double2float_rn(1e-50) == 0.0f);
  CHECK(std::signbit(__double2float_ru(-1e-50)) && __double2float_ru(-1e-50) == 0.0f);
  CHECK(std::isnan(__double2float_rz(NAN)));
  CHECK(__double2float_rn(0.1) == 0.1f);
  CHECK(__int2float_rn(16777217) == 16777216.0f);  // tie to even
  CHECK(__int2float_rn(16777219) == 16777220.0f);
  CHECK(__int2float_rz(16777217) == 16777216.0f);
  CHECK(__int2float_ru(16777217) == 16777218.0f);
  CHECK(__int2float_rd(-16777217) == -16777218.0f);
  CHECK(__int2float_rz(INT_MAX) == 2147483520.0f);
  CHECK(__int2float_rn(INT_MAX) == 2147483648.0f);
  CHECK(__uint2float_rn(0xffffffffu) == 4294967296.0f);
  CHECK(__uint2float_rz(0xffffffffu) == 4294967040.0f);
  CHECK(__ull2double_rn((1ULL << 53) + 1) == 9007199254740992.0);
  CHECK(__ull2double_ru((1ULL << 53) + 1) == 9007199254740994.0);
  CHECK(__ull2double_rn(~0ULL) == 18446744073709551616.0);
  CHECK(__ull2double_rz(~0ULL) == 18446744073709549568.0);
  CHECK(__ll2double_rn(-(1LL << 53) - 1) == -9007199254740992.0);
  CHECK(__ll2double_rd(-(1LL << 53) - 1) == -9007199254740994.0);
  CHECK(__ll2float_rz((1LL << 40) + 1) == 1099511627776.0f);
  CHECK(__float2int_rz(-2.7f) == -2);
  CHECK(__float2int_rn(2.5f) == 2);
  CHECK(__float2int_rn(3.5f) == 4);
  CHECK(__float2int_rn(-2.5f) == -2);
  CHECK(__float2int_rd(-2.5f) == -3);
  CHECK(__float2int_ru(-2.5f) == -2);
  CHECK(__float2int_ru(2.1f) == 3);
  CHECK(__float2int_rz(3e9f) == INT_MAX);
  CHECK(__float2int_rz(-3e9f) == INT_MIN);
  CHECK(__float2int_rz(NAN) == 0);
  CHECK(__float2int_rz(2147483648.0f) == INT_MAX);
  CHECK(__float2int_rz(-2147483648.0f) == INT_MIN);
  CHECK(__float2uint_rz(-1.0f) == 0u);
  CHECK(__float2uint_rz(5e9f) == 0xffffffffu);
  CHECK(__float2uint_rz(4294967040.0f) == 4294967040u);
  CHECK(__double2ll_rz(-1e30) == LLONG_MIN);
  CHECK(__double2ull_rz(1e30) == ~0ULL);
  CHECK(__fadd_rn(1.0f, std::ldexp(1.0f, -24)) == 1.0f);
  CHECK(__fadd_rn(1.0f, 3 * std::ldexp(1.0f, -25)) == up1);
  CHECK(__fsub_rn(1.0f, 1.0f) == 0.0f && !std::signbit(__fsub_rn(1.0f, 1.0f)));
  {
    const float a = 1.0f + std::ldexp(1.0f, -13);
    const float c = -(1.0f + std::ldexp(1.0f, -12));
    CHECK(__fmaf_rn(a, a, c) == std::ldexp(1.0f, -26));  // fused: the exact tail
    CHECK(__fadd_rn(__fmul_rn(a, a), c) == 0.0f);        // rounded product first
  }
  CHECK(__fdiv_rn(1.0f, 3.0f) == 1.0f / 3.0f);
  CHECK(__fsqrt_rn(2.0f) == std::sqrt(2.0f));
  CHECK(__dsqrt_rn(2.0) == std::sqrt(2.0));
  CHECK(__dmul_rn(0.1, 3.0) == 0.30000000000000004);
  CHECK(__dadd_rn(0.1, 0.2) == 0.30000000000000004);
  CHECK(__ddiv_rn(1.0, 3.0) == 1.0 / 3.0);
  CHECK(__dsub_rn(1.0, 0.9) == 1.0 - 0.9);
  CHECK(__saturatef(-0.5f) == 0.0f && !std::signbit(__saturatef(-0.0f)));
  CHECK(__saturatef(2.0f) == 1.0f && __saturatef(0.25f) == 0.25f && __saturatef(NAN) == 0.0f);
  CHECK(__float_as_uint(1.0f) == 0x3f800000u);
  CHECK(__uint_as_float(0x40490fdbu) == 3.14159274f);
  CHECK(__float_as_int(-0.0f) == INT_MIN);
  CHECK(__int_as_float(0x3f800000) == 1.0f);
  CHECK(__double_as_longlong(1.0) == 0x3ff0000000000000LL);
  CHECK(__longlong_as_double(0x4000000000000000LL) == 2.0);
  CHECK(__popc(0xffu) == 8 && __popc(0) == 0 && __popc(0xffffffffu) == 32);
  CHECK(__popcll(0xff00ff00ff00ff00ULL) == 32);
  CHECK(__clz(0) == 32 && __clz(1) == 31 && __clz(-1) == 0 && __clz(0x8000) == 16);
  CHECK(__clzll(0) == 64 && __clzll(1) == 63);
  CHECK(__ffs(0) == 0 && __ffs(1) == 1 && __ffs(8) == 4 && __ffs(INT_MIN) == 32);
  CHECK(__ffsll(0) == 0 && __ffsll(1LL << 40) == 41);
  CHECK(__brev(1u) == 0x80000000u && __brev(0x12345678u) == 0x1e6a2c48u);
  CHECK(__brevll(1ULL) == (1ULL << 63) && __brevll(0x12345678ULL) == 0x1e6a2c4800000000ULL);
  CHECK(__umulhi(0xffffffffu, 0xffffffffu) == 0xfffffffeu);
  CHECK(__umul64hi(~0ULL, 2) == 1);
  CHECK(__byte_perm(0x33221100u, 0x77665544u, 0x5140u) == 0x55114400u);
  int v[4] = {1, 2, 3, 4};
  CHECK(__ldg(v + 1) == 2 && __ldcg(v + 2) == 3 && __ldca(v) == 1 && __ldcs(v + 3) == 4);
  CHECK(min(3, 5) == 3 && max(3u, 5u) == 5u && min(-1, 2u) == 2u && max(2.0f, NAN) == 2.0f);
  CHECK(min(1LL << 40, 5LL) == 5 && max(1.5, 2.5f) == 2.5);
  CHECK(isfinite(1.0f) && !isfinite(INFINITY) && fabsf(-2.0f) == 2.0f);
}

}  // namespace

int main() {
  std::printf("kernel engine selftest\n");

  // Block reduction over shared memory, several launches (different thread orders).
  {
    constexpr int n = 100003;
    std::vector<int> in(n);
    for (int i = 0; i < n; ++i) in[i] = (i * 7919) % 1000 - 300;
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<long long> out(8, -1);
      cuda_double::launch(&block_sum, dim3(8), dim3(256), 0, nullptr, in.data(), n, out.data());
      CHECK(queue.back()->what().find("block_sum<<<8, 256>>>") != std::string::npos);
      run_queue();
      for (int b = 0; b < 8; ++b) {
        long long want = 0;
        for (int i = b * 256; i < n; i += 8 * 256)
          for (int t = 0; t < 256 && i + t < n; ++t) want += in[i + t];
        CHECK(out[b] == want);
      }
    }
    std::printf("  block reduction ok\n");
  }

  // __syncthreads_or/_and/_count.
  {
    std::vector<int> out(256 * 6, -1);
    cuda_double::launch(&sync_forms, dim3(1), dim3(256), 0, nullptr, out.data());
    run_queue();
    for (int t = 0; t < 256; ++t) {
      CHECK(out[t * 6 + 0] == 1);
      CHECK(out[t * 6 + 1] == 0);
      CHECK(out[t * 6 + 2] == 1);
      CHECK(out[t * 6 + 3] == 0);
      CHECK(out[t * 6 + 4] == 86);
      CHECK(out[t * 6 + 5] == 0);
    }
    std::printf("  __syncthreads_or/_and/_count ok\n");
  }

  // Warp operations: full warps, and a partial last warp.
  check_warp_ops(64);
  check_warp_ops(48);
  check_warp_ops(96);
  std::printf("  warp operations ok (shuffles of every width, votes, reductions, divergent masks, activemask)\n");

  check_atomics();
  check_concurrent_threads();
  std::printf("  atomics ok (64 blocks x 256 threads; 4 OS threads at once)\n");

  check_intrinsics();
  std::printf("  intrinsics ok\n");

  // 3-D configurations: every (block, thread) once, built-ins right.
  {
    std::vector<unsigned> hits(12 * 64, 0);
    unsigned bad = 0;
    cuda_double::launch(&indices, dim3(3, 2, 2), dim3(8, 4, 2), 0, nullptr, hits.data(), &bad);
    run_queue();
    CHECK(bad == 0);
    for (unsigned h : hits) CHECK(h == 1);
    std::printf("  3-D grid and block ok\n");
  }

  // Parameters are copied at the launch, and per device thread.
  {
    big_param p{};
    p.a[0] = 3;
    p.a[7] = 9;
    int x = 100;
    std::vector<int> out(64, 0);
    cuda_double::launch(&params, dim3(1), dim3(64), 0, nullptr, p, x, out.data());
    p.a[0] = 77;  // after the launch: not seen
    x = -1;
    run_queue();
    for (int t = 0; t < 64; ++t) CHECK(out[t] == 100 + t + 3009);
    std::printf("  parameters copied at the launch ok\n");
  }

  // Shared memory is poisoned (0xFF bytes) at the start of every block.
  {
    std::vector<unsigned> seen(16, 0), seen_one(16, 0), one(4, 0);
    cuda_double::launch(&read_before_write, dim3(16), dim3(64), 0, nullptr, seen.data(), seen_one.data());
    cuda_double::launch(&one_thread_reads_shared, dim3(4), dim3(1), 0, nullptr, one.data());
    run_queue();
    for (int b = 0; b < 16; ++b) CHECK(seen[b] == 64 && seen_one[b] == static_cast<unsigned>(b) + 1);
    for (unsigned v : one) CHECK(v == 0xFFFFFFFFu);
    std::printf("  shared memory poisoned at every block ok\n");
  }

  // A block of one thread runs without a fiber.
  {
    std::vector<int> out(7, 0);
    cuda_double::launch(&one_thread, dim3(3), dim3(1), 0, nullptr, out.data());
    run_queue();
    CHECK(out[0] == 1 && out[1] == 1 && out[2] == 99 && out[3] == 1 && out[4] == 7 && out[5] == 0);
    CHECK(out[6] >= 1 && out[6] <= 3);
    std::printf("  one-thread blocks ok\n");
  }

  // Bad configurations: an error, nothing queued.
  {
    int dummy = 0;
    const dim3 bad_blocks[] = {dim3(1025), dim3(32, 33), dim3(1, 1, 65), dim3(0), dim3(16, 0, 1)};
    for (const dim3& b : bad_blocks) {
      cuda_double::launch(&exit_early, dim3(1), b, 0, nullptr, &dummy);
      CHECK(queue.empty());
      CHECK(take_last_error() == cudaErrorInvalidConfiguration);
    }
    const dim3 bad_grids[] = {dim3(0), dim3(1, 65536), dim3(1, 1, 65536), dim3(0x80000000u)};
    for (const dim3& g : bad_grids) {
      cuda_double::launch(&exit_early, g, dim3(32), 0, nullptr, &dummy);
      CHECK(queue.empty());
      CHECK(take_last_error() == cudaErrorInvalidConfiguration);
    }
    cuda_double::launch(&exit_early, dim3(2147483647u, 65535, 65535), dim3(1024), 0, nullptr, &dummy);
    CHECK(queue.size() == 1 && take_last_error() == cudaSuccess);
    queue.clear();  // (not run)
    cuda_double::launch(&exit_early, dim3(1), dim3(32, 32, 1), 0, nullptr, &dummy);
    CHECK(queue.size() == 1 && take_last_error() == cudaSuccess);
    queue.clear();
    std::printf("  launch configuration limits ok\n");
  }

  // Block order: shuffled, different at each launch, a function of the seed.
  {
    const std::vector<unsigned> a = block_order(64), b = block_order(64);
    std::vector<unsigned> id(64);
    std::iota(id.begin(), id.end(), 0u);
    CHECK(a != b);
    CHECK(a != id && b != id);
    seed_counter = 0;
    const std::vector<unsigned> a2 = block_order(64);
    seed_counter = 0;
    CHECK(block_order(64) == a2);
    block_order(5, 7);
    std::printf("  block order shuffled by the seed ok\n");
  }

  // The planted hazard: a missing __syncthreads shows as a wrong result, in every block
  // (thread 0 never runs first in a round).
  {
    int total_wrong = 0;
    for (int rep = 0; rep < 50; ++rep) {
      CHECK(broadcast_wrong(true, 1000 * rep).first == 0);
      const auto [wrong, clean] = broadcast_wrong(false, 1000 * rep + 500);
      CHECK(clean == 0);
      total_wrong += wrong;
    }
    std::printf("  missing __syncthreads caught in 400 of 400 blocks (%d of %d reads wrong)\n", total_wrong,
                50 * 8 * 256);
  }

  // Speed: 2^20 elements, grid-stride, two __syncthreads per iteration.
  {
    constexpr int n = 1 << 20;
    std::vector<float> in(n), out(n, 0.0f);
    for (int i = 0; i < n; ++i) in[i] = static_cast<float>(i % 1000);
    for (int rep = 0; rep < 2; ++rep) {
      const stopwatch sw;
      cuda_double::launch(&stride2, dim3(32), dim3(256), 0, nullptr, in.data(), out.data(), n);
      run_queue();
      const double s = sw.wall(), c = sw.used();
      for (int i = 0; i < n; i += 997) CHECK(out[i] == 2.0f * in[(i & ~255) + 255 - (i & 255)]);
      std::printf("  2^20 elements, 32 x 256 threads, 2 __syncthreads per iteration: %.3f s (cpu %.3f s)%s\n", s, c,
                  rep == 0 ? " (first run, stacks allocated)" : "");
    }
  }

  // Speed: 2^20 elements, a warp sum of 5 shuffles each.
  {
    constexpr int n = 1 << 20;
    std::vector<float> in(n), out(n / 32, 0.0f);
    for (int i = 0; i < n; ++i) in[i] = static_cast<float>(i % 7);
    const stopwatch sw;
    cuda_double::launch(&warp_sums, dim3(32), dim3(256), 0, nullptr, in.data(), out.data(), n);
    run_queue();
    const double s = sw.wall(), c = sw.used();
    for (int w = 0; w < n / 32; w += 101) {
      float want = 0;
      for (int l = 0; l < 32; ++l) want += in[w * 32 + l];
      CHECK(out[w] == want);
    }
    std::printf("  2^20 elements, 32 x 256 threads, 5 __shfl_xor_sync each: %.3f s (cpu %.3f s)\n", s, c);
  }

  // Launch overhead: small kernels, one block of 256 threads.
  {
    unsigned count = 0;
    const stopwatch sw;
    for (int rep = 0; rep < 2000; ++rep) {
      cuda_double::launch(&tiny, dim3(1), dim3(256), 0, nullptr, &count);
      run_queue();
    }
    const double s = sw.wall(), c = sw.used();
    CHECK(count == 2000);
    std::printf("  2000 launches of one 256-thread block with a __syncthreads: %.3f s (cpu %.3f s, %.1f us each)\n", s,
                c, c / 2000 * 1e6);
  }

  // A grid past the in-memory shuffle (2^20 blocks): every block once, in a scrambled order.
  {
    const unsigned blocks = (1u << 20) + 12345;
    std::vector<unsigned> hits(blocks, 0);
    const stopwatch sw;
    cuda_double::launch(&per_block, dim3(blocks), dim3(1), 0, nullptr, hits.data());
    run_queue();
    const double s = sw.wall(), c = sw.used();
    for (unsigned h : hits) CHECK(h == 1);
    std::printf("  %u one-thread blocks: %.3f s (cpu %.3f s)\n", blocks, s, c);
  }

  // Failures, each in a child process.
  std::printf("  planted defects:\n");
  expect_failure(
      "a thread returns before a __syncthreads",
      [] {
        std::vector<int> out(64);
        cuda_double::launch(&exit_early, dim3(2), dim3(64), 0, nullptr, out.data());
        run_queue();
      },
      {"exit_early<<<2, 64>>>, block (", "thread 7 exited while threads 0-6, 8-63 (63 threads) wait at __syncthreads"});
  expect_failure("a lane of the mask returns before a __shfl_sync",
                 [] {
                   std::vector<int> out(64);
                   cuda_double::launch(&lane_exit_before_shfl, dim3(1), dim3(64), 0, nullptr, out.data());
                   run_queue();
                 },
                 {"thread 3 (lane 3 of warp 0) returned while", "__shfl_sync(mask 0xffffffff)"});
  expect_failure(
      "__syncthreads in a branch",
      [] {
        std::vector<int> out(64);
        cuda_double::launch(&barrier_in_branch, dim3(1), dim3(32), 0, nullptr, out.data());
        run_queue();
      },
      {"barrier_in_branch<<<1, 32>>>", "wait at __syncwarp(mask 0xffffffff)", "which waits at __syncthreads"});
  expect_failure("different warp operations under one mask",
                 [] {
                   std::vector<int> out(32);
                   cuda_double::launch(&mismatched_warp_ops, dim3(1), dim3(32), 0, nullptr, out.data());
                   run_queue();
                 },
                 {"waits at __ballot_sync(mask 0xffffffff)", "which waits at __any_sync(mask 0xffffffff)"});
  expect_failure("a mask without the caller's lane",
                 [] {
                   std::vector<int> out(32);
                   cuda_double::launch(&mask_without_self, dim3(1), dim3(32), 0, nullptr, out.data());
                   run_queue();
                 },
                 {"thread 0 calls __ballot_sync with mask 0xfffffffe, which does not name its own lane 0"});
  expect_failure("__syncthreads_or against __syncthreads",
                 [] {
                   std::vector<int> out(1);
                   cuda_double::launch(&mixed_barriers, dim3(1), dim3(64), 0, nullptr, out.data());
                   run_queue();
                 },
                 {"different kinds"});
  expect_failure("dynamic shared memory",
                 [] {
                   std::vector<int> out(1);
                   cuda_double::launch(&exit_early, dim3(1), dim3(64), 128, nullptr, out.data());
                 },
                 {"128 bytes of dynamic shared memory"});
  expect_failure("a misaligned atomic",
                 [] {
                   unsigned cells[4] = {};
                   cuda_double::launch(&misaligned, dim3(1), dim3(1), 0, nullptr, cells);
                   run_queue();
                 },
                 {"atomicAdd on the misaligned address"});
  {
    const auto [status, err] = in_child([] {
      unsigned finished = 0, queued_after = 0;
      cuda_double::launch(&trapping, dim3(8), dim3(64), 0, nullptr, &finished, 3u);
      cuda_double::launch(&trapping, dim3(8), dim3(64), 0, nullptr, &queued_after, 100u);  // queued: not run
      unsigned after = 0;
      run_queue();
      if (queued_after != 0) std::_Exit(5);
      // The trapping block did not finish; the error is sticky; later launches are dropped.
      if (sticky != cudaErrorLaunchFailure || finished % 64 != 0 || finished >= 8 * 64) std::_Exit(3);
      cuda_double::launch(&trapping, dim3(8), dim3(64), 0, nullptr, &after, 100u);
      run_queue();
      if (after != 0 || sticky_why.find("thread 5 called __trap()") == std::string::npos) std::_Exit(4);
      std::_Exit(0);
    });
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "__trap check failed: status %d\n%s\n", status, err.c_str());
      return 1;
    }
    std::printf("  __trap ends the kernel with the sticky cudaErrorLaunchFailure ok\n");
  }
  {
    // The same with concurrent blocks: the trap is reported from the pool's thread, the
    // blocks not started are not run.
    const auto [status, err] = in_child([] {
      const cuda_double::concurrent_blocks strict(4);
      unsigned finished = 0;
      cuda_double::launch(&trapping, dim3(64), dim3(64), 0, nullptr, &finished, 3u);
      run_queue();
      if (sticky != cudaErrorLaunchFailure || finished % 64 != 0 || finished >= 64 * 64) std::_Exit(3);
      if (sticky_why.find("thread 5 called __trap()") == std::string::npos) std::_Exit(4);
      std::_Exit(0);
    });
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "__trap check with concurrent blocks failed: status %d\n%s\n", status, err.c_str());
      return 1;
    }
    std::printf("  __trap with concurrent blocks ok\n");
  }
  check_concurrent_blocks();
  std::printf("  concurrent blocks ok\n");
  std::printf("kernel engine selftest passed\n");
  return 0;
}
