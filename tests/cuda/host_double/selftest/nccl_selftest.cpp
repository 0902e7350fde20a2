// Self test of the NCCL double (src/nccl.cpp) against a minimal stand-in of the runtime
// double: streams are queues of stream_ops run by polling when the test waits for them
// (sync, query), the per-thread stream is per OS thread. Ranks are processes made with
// fork() after the unique id (as under mpiexec, one process per rank).
//
// Build and run (from tests/cuda/host_double):
//   g++ -std=c++20 -O2 -pthread -Iinclude -I../../../include selftest/nccl_selftest.cpp
//       src/nccl.cpp -lrt -o /tmp/nccl_selftest && /tmp/nccl_selftest [part of a scenario's name]
// Every scenario prints one PASS or FAIL line; the exit status is 0 when all passed.

#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gravac/compress/detail/half.hpp"  // an independent fp16 / bf16 reference

// ---------------------------------------------------------------------------------------
// The stand-in runtime.

struct CUstream_st {
  std::deque<std::unique_ptr<cuda_double::stream_op>> q;
};

namespace {
std::mutex g_device;  // the device lock: held while ops are polled
CUstream_st g_legacy;
thread_local CUstream_st t_per_thread;
std::atomic<std::uint64_t> g_seed_counter{0};

// Polls the head of \p st until one does not complete; true when the stream is empty.
bool run_stream(CUstream_st* st) {
  std::lock_guard<std::mutex> lk(g_device);
  while (!st->q.empty()) {
    if (!st->q.front()->poll()) return false;
    st->q.pop_front();
  }
  return true;
}
}  // namespace

namespace cuda_double {
cudaStream_t resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy) return &g_legacy;
  if (s == cudaStreamPerThread) return &t_per_thread;
  return s;
}
cudaError_t enqueue(cudaStream_t s, std::unique_ptr<stream_op> op) {
  std::lock_guard<std::mutex> lk(g_device);
  resolve(s)->q.push_back(std::move(op));
  return cudaSuccess;
}
cudaError_t synchronize_stream(cudaStream_t s, const char* why) {
  CUstream_st* st = resolve(s);
  const auto t0 = std::chrono::steady_clock::now();
  while (!run_stream(st)) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) {
      std::string what;
      {
        std::lock_guard<std::mutex> lk(g_device);
        what = st->q.front()->what();
      }
      fail(std::string(why) + ": no progress for 30 s, stuck behind " + what);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return cudaSuccess;
}
cudaError_t drain_all() { return cudaSuccess; }
void set_sticky(cudaError_t, const std::string&) {}
[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "gravac CUDA double: %s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}
std::uint64_t seed() { return 1; }
std::uint64_t next_seed() { return ++g_seed_counter; }
void set_last_error(cudaError_t) {}
cudaError_t sticky_error() { return cudaSuccess; }
}  // namespace cuda_double

// The memory queries nccl.cpp makes: everything is device memory here except what the
// test registers as pageable host memory (refused) or pinned host memory (accepted).
namespace {
std::mutex g_host_mu;
std::vector<const void*> g_host_ptrs, g_pinned_ptrs;
bool registered(const std::vector<const void*>& v, const void* p) {
  std::lock_guard<std::mutex> lk(g_host_mu);
  for (const void* h : v)
    if (h == p) return true;
  return false;
}
}  // namespace
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  *a = cudaPointerAttributes{};
  a->type = cuda_double::memory_type(p);
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
namespace cuda_double {
cudaMemoryType memory_type(const void* p) {
  if (registered(g_host_ptrs, p)) return cudaMemoryTypeUnregistered;
  if (registered(g_pinned_ptrs, p)) return cudaMemoryTypeHost;
  return cudaMemoryTypeDevice;
}
void check_device_range(const void* p, std::size_t bytes, const char* who) {
  if (bytes && registered(g_host_ptrs, p)) fail(std::string(who) + ": a host address, not device memory");
}
}  // namespace cuda_double

namespace {

// ---------------------------------------------------------------------------------------
// Test helpers.

struct copy_op final : cuda_double::stream_op {
  void* dst;
  const void* src;
  std::size_t n;
  copy_op(void* d, const void* s, std::size_t b) : dst(d), src(s), n(b) {}
  bool poll() override {
    std::memcpy(dst, src, n);
    return true;
  }
  std::string what() const override { return "copy of " + std::to_string(n) + " bytes"; }
};

void copy_async(void* dst, const void* src, std::size_t n, cudaStream_t s) {
  (void)cuda_double::enqueue(s, std::make_unique<copy_op>(dst, src, n));
}
void sync(cudaStream_t s) { (void)cuda_double::synchronize_stream(s, "the test's sync"); }
bool query(cudaStream_t s) { return run_stream(cuda_double::resolve(s)); }
std::string head_what(cudaStream_t s) {
  std::lock_guard<std::mutex> lk(g_device);
  CUstream_st* st = cuda_double::resolve(s);
  return st->q.empty() ? std::string() : st->q.front()->what();
}
cudaStream_t new_stream() { return new CUstream_st; }

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

#define NCHECK(call)                                                                                      \
  do {                                                                                                    \
    const ncclResult_t r_ = (call);                                                                       \
    if (r_ != ncclSuccess) {                                                                              \
      std::fprintf(stderr, "%s:%d: %s returned %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
      return 1;                                                                                           \
    }                                                                                                     \
  } while (0)

#define EXPECT_RESULT(call, want)                                                                                  \
  do {                                                                                                             \
    const ncclResult_t r_ = (call);                                                                                \
    if (r_ != (want)) {                                                                                            \
      std::fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, int(r_), int(want)); \
      return 1;                                                                                                    \
    }                                                                                                              \
  } while (0)

// Polls ncclCommGetAsyncError until it is not ncclInProgress (10 s at most); returns the state.
ncclResult_t wait_comm(ncclComm_t comm, int* polls = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  ncclResult_t st = ncclInProgress;
  int k = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    ++k;
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) return ncclInternalError;
    if (st != ncclInProgress) break;
    std::this_thread::yield();
  }
  if (polls) *polls = k;
  return st;
}

// Runs \p s until empty, at most \p seconds; true when it emptied.
bool query_until(cudaStream_t s, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(seconds)) {
    if (query(s)) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return false;
}

// nccl_communicator::wait(): poll ncclCommGetAsyncError, then the stream, until the stream
// is done. Returns the error seen, or ncclSuccess when the stream completed first (for a
// failed op that would be a silent wrong result).
ncclResult_t gravac_wait(ncclComm_t comm, cudaStream_t s, double seconds = 10) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(seconds)) {
    ncclResult_t st = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &st);
    if (q != ncclSuccess) st = q;
    if (st != ncclSuccess && st != ncclInProgress) return st;
    if (st == ncclSuccess && query(s)) return ncclSuccess;
    std::this_thread::yield();
  }
  return ncclInProgress;
}

struct child {
  int status = 0;
  std::string err;
  bool ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  bool aborted() const { return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT; }
};

// Forks \p n ranks sharing one unique id; each runs fn(rank, id) with stderr in a file.
std::vector<child> run_ranks(int n, const std::function<int(int, const ncclUniqueId&)>& fn, int timeout_s = 120) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) std::abort();
  std::vector<pid_t> pids;
  std::vector<std::string> files;
  for (int r = 0; r < n; ++r) {
    char name[128];
    std::snprintf(name, sizeof name, "/tmp/nccl_selftest_%d_%d.err", int(getpid()), r);
    files.emplace_back(name);
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = open(name, O_CREAT | O_TRUNC | O_WRONLY, 0600);
      dup2(fd, 2);
      close(fd);
      const int rc = fn(r, id);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  std::vector<child> out(static_cast<std::size_t>(n));
  std::vector<bool> done(std::size_t(n), false);
  const auto t0 = std::chrono::steady_clock::now();
  for (int left = n; left > 0;) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        out[r].status = st;
        done[r] = true;
        --left;
      }
    }
    if (left && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(timeout_s)) {
      for (int r = 0; r < n; ++r)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          int st = 0;
          waitpid(pids[r], &st, 0);
          out[r].status = st;
          out[r].err = "(killed after " + std::to_string(timeout_s) + " s)\n";
          done[r] = true;
        }
      left = 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int r = 0; r < n; ++r) {
    std::ifstream f(files[r]);
    std::stringstream ss;
    ss << f.rdbuf();
    out[r].err += ss.str();
    std::remove(files[r].c_str());
  }
  return out;
}

bool all_ok(const std::vector<child>& cs) {
  for (const auto& c : cs)
    if (!c.ok()) return false;
  return true;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

void show(const std::vector<child>& cs) {
  for (std::size_t r = 0; r < cs.size(); ++r) {
    std::printf("    rank %zu: status %d%s\n", r, cs[r].status, cs[r].ok() ? "" : " (failed)");
    if (!cs[r].err.empty()) {
      std::istringstream in(cs[r].err);
      std::string line;
      int k = 0;
      while (std::getline(in, line) && k++ < 12) std::printf("      | %s\n", line.c_str());
    }
  }
}

// ---------------------------------------------------------------------------------------
// Values and the reference reductions.

const ncclDataType_t kTypes[] = {ncclInt8,   ncclUint8,   ncclInt32,   ncclUint32,  ncclInt64,
                                 ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
const ncclRedOp_t kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

std::size_t tsize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

bool is16(ncclDataType_t t) { return t == ncclFloat16 || t == ncclBfloat16; }
bool isfloat(ncclDataType_t t) { return t == ncclFloat32 || t == ncclFloat64 || is16(t); }

float f16_value(ncclDataType_t t, std::uint16_t h) {
  return t == ncclFloat16 ? gravac::detail::fp16_to_float(h) : gravac::detail::bf16_to_float(h);
}
std::uint16_t to16(ncclDataType_t t, float f) {
  if (std::isnan(f)) return 0x7fff;
  if (std::isinf(f) || std::fabs(f) > (t == ncclFloat16 ? 65519.0f : 3.39e38f))
    return static_cast<std::uint16_t>((std::signbit(f) ? 0x8000 : 0) | (t == ncclFloat16 ? 0x7c00 : 0x7f80));
  return t == ncclFloat16 ? gravac::detail::float_to_fp16(f) : gravac::detail::float_to_bf16(f);
}

// The value rank r contributes at index i (as a double), chosen so that every partial sum
// and product of the 16-bit types is exact in float (the reference rounds floats).
double value(ncclDataType_t t, ncclRedOp_t op, int r, std::size_t i) {
  const long k = long((std::size_t(r) * 131 + i * 17 + (i >> 7) * 5) % 97) - 48;
  if (!isfloat(t)) {
    if (op == ncclProd) return double(1 + (r + long(i)) % 3);
    return double(k);
  }
  if (op == ncclProd) return 1.0 + double(k) / 128.0;  // [0.625, 1.375], multiples of 2^-7
  if (t == ncclBfloat16) return double(k) * 1.3125;    // multiples of 2^-4, |x| <= 63
  return double(k) * 1.328125;                         // multiples of 2^-6, |x| <= 64
}

// Writes value(t, op, r, i) in type t at element i of p.
void put(ncclDataType_t t, std::byte* p, std::size_t i, double v) {
  std::byte* at = p + i * tsize(t);
  auto w = [&](auto x) { std::memcpy(at, &x, sizeof x); };
  switch (t) {
    case ncclInt8:
      return w(std::int8_t(v));
    case ncclUint8:
      return w(std::uint8_t(std::int8_t(v)));
    case ncclInt32:
      return w(std::int32_t(v));
    case ncclUint32:
      return w(std::uint32_t(std::int32_t(v)));
    case ncclInt64:
      return w(std::int64_t(v));
    case ncclUint64:
      return w(std::uint64_t(std::int64_t(v)));
    case ncclFloat32:
      return w(float(v));
    case ncclFloat64:
      return w(double(v));
    default:
      return w(to16(t, float(v)));
  }
}

template <class T>
T get_as(const std::byte* p, std::size_t i) {
  T x;
  std::memcpy(&x, p + i * sizeof(T), sizeof(T));
  return x;
}

template <class T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(U(a) + U(b)));
}
template <class T>
T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(U(a) * U(b)));
}

template <class T>
void int_ref(ncclRedOp_t op, int n, const std::vector<const std::byte*>& in, std::size_t i, std::byte* out) {
  T acc = get_as<T>(in[0], i);
  for (int r = 1; r < n; ++r) {
    const T x = get_as<T>(in[r], i);
    if (op == ncclProd)
      acc = wrap_mul(acc, x);
    else if (op == ncclMax)
      acc = acc < x ? x : acc;
    else if (op == ncclMin)
      acc = x < acc ? x : acc;
    else
      acc = wrap_add(acc, x);
  }
  if (op == ncclAvg) acc = T(acc / T(n));
  std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
}

template <class T>
void float_ref(ncclRedOp_t op, int n, const std::vector<const std::byte*>& in, std::size_t i, std::byte* out) {
  const T s = T(float(1.0 / n));
  T acc = get_as<T>(in[0], i);
  if (op == ncclAvg) acc = acc * (std::is_same_v<T, float> ? T(float(1.0 / n)) : T(1.0 / n));
  for (int r = 1; r < n; ++r) {
    const T x = get_as<T>(in[r], i);
    if (op == ncclProd)
      acc = acc * x;
    else if (op == ncclMax)
      acc = std::fmax(acc, x);
    else if (op == ncclMin)
      acc = std::fmin(acc, x);
    else if (op == ncclAvg)
      acc = acc + x * (std::is_same_v<T, float> ? T(float(1.0 / n)) : T(1.0 / n));
    else
      acc = acc + x;
  }
  (void)s;
  std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
}

void half_ref(ncclDataType_t t, ncclRedOp_t op, int n, const std::vector<const std::byte*>& in, std::size_t i,
              std::byte* out) {
  const std::uint16_t s16 = to16(t, float(1.0 / n));
  const float s = f16_value(t, s16);
  std::uint16_t acc = get_as<std::uint16_t>(in[0], i);
  if (op == ncclAvg) acc = to16(t, f16_value(t, acc) * s);
  for (int r = 1; r < n; ++r) {
    const float a = f16_value(t, acc), x = f16_value(t, get_as<std::uint16_t>(in[r], i));
    float v;
    if (op == ncclProd)
      v = a * x;
    else if (op == ncclMax)
      v = std::fmax(a, x);
    else if (op == ncclMin)
      v = std::fmin(a, x);
    else if (op == ncclAvg)
      v = a + f16_value(t, to16(t, x * s));
    else
      v = a + x;
    acc = to16(t, v);
  }
  std::memcpy(out + i * 2, &acc, 2);
}

void reference(ncclDataType_t t, ncclRedOp_t op, int n, const std::vector<const std::byte*>& in, std::size_t i,
               std::byte* out) {
  switch (t) {
    case ncclInt8:
      return int_ref<std::int8_t>(op, n, in, i, out);
    case ncclUint8:
      return int_ref<std::uint8_t>(op, n, in, i, out);
    case ncclInt32:
      return int_ref<std::int32_t>(op, n, in, i, out);
    case ncclUint32:
      return int_ref<std::uint32_t>(op, n, in, i, out);
    case ncclInt64:
      return int_ref<std::int64_t>(op, n, in, i, out);
    case ncclUint64:
      return int_ref<std::uint64_t>(op, n, in, i, out);
    case ncclFloat32:
      return float_ref<float>(op, n, in, i, out);
    case ncclFloat64:
      return float_ref<double>(op, n, in, i, out);
    default:
      return half_ref(t, op, n, in, i, out);
  }
}

// Every rank's input buffer of \p count elements (value(t, op, r, first + i)).
std::vector<std::vector<std::byte>> inputs(ncclDataType_t t, ncclRedOp_t op, int n, std::size_t count) {
  std::vector<std::vector<std::byte>> v(static_cast<std::size_t>(n), std::vector<std::byte>(count * tsize(t)));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) put(t, v[r].data(), i, value(t, op, r, i));
  return v;
}

std::vector<std::byte> reduced(ncclDataType_t t, ncclRedOp_t op, int n, const std::vector<std::vector<std::byte>>& in,
                               std::size_t first, std::size_t count) {
  std::vector<const std::byte*> p;
  for (const auto& b : in) p.push_back(b.data() + first * tsize(t));
  std::vector<std::byte> out(count * tsize(t));
  for (std::size_t i = 0; i < count; ++i) reference(t, op, n, p, i, out.data());
  return out;
}

std::string first_diff(const std::vector<std::byte>& got, const std::vector<std::byte>& want, std::size_t ts) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "element %zu (byte %zu): got 0x%02x, want 0x%02x", i / ts, i, unsigned(got[i]),
                    unsigned(want[i]));
      return buf;
    }
  return {};
}

// ---------------------------------------------------------------------------------------
// Scenarios: each runs on every rank; returns 0 on success.

// Every collective, type and reduction, in place and out of place, small and multi-chunk,
// on a blocking communicator and a stream of the test's own.
int collectives(int rank, const ncclUniqueId& id, int n) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, n, id, rank));
  int cnt = 0, me = -1;
  NCHECK(ncclCommCount(comm, &cnt));
  NCHECK(ncclCommUserRank(comm, &me));
  CHECK(cnt == n && me == rank);
  cudaStream_t s = new_stream();
  int q = 0;
  auto fail_at = [&](const char* what, ncclDataType_t t, ncclRedOp_t op, std::size_t count, const std::string& d) {
    std::fprintf(stderr, "%s type %d op %d count %zu: %s\n", what, int(t), int(op), count, d.c_str());
    return 1;
  };
  for (const ncclDataType_t t : kTypes) {
    const std::size_t ts = tsize(t);
    for (const std::size_t count : {std::size_t{1}, std::size_t{37}, std::size_t{1000}, std::size_t{270001}}) {
      const bool big = count > 1000;
      for (const ncclRedOp_t op : kOps) {
        if (big && op != ncclSum && !(op == ncclAvg && is16(t))) continue;
        const bool in_place = (++q % 2) == 0;
        // AllReduce
        {
          auto in = inputs(t, op, n, count);
          const auto want = reduced(t, op, n, in, 0, count);
          std::vector<std::byte> out(count * ts, std::byte{0x5a});
          std::byte* dst = in_place ? in[rank].data() : out.data();
          NCHECK(ncclAllReduce(in[rank].data(), dst, count, t, op, comm, s));
          sync(s);
          std::vector<std::byte> got(dst, dst + count * ts);
          if (got != want) return fail_at("ncclAllReduce", t, op, count, first_diff(got, want, ts));
        }
        // Reduce to root q % n (non-roots' output untouched)
        {
          const int root = q % n;
          auto in = inputs(t, op, n, count);
          const auto want = reduced(t, op, n, in, 0, count);
          std::vector<std::byte> out(count * ts, std::byte{0x5a});
          NCHECK(ncclReduce(in[rank].data(), out.data(), count, t, op, root, comm, s));
          sync(s);
          if (rank == root && out != want) return fail_at("ncclReduce", t, op, count, first_diff(out, want, ts));
          if (rank != root && out != std::vector<std::byte>(count * ts, std::byte{0x5a}))
            return fail_at("ncclReduce", t, op, count, "a non-root's output was written");
        }
        // ReduceScatter: block b of every rank's n blocks reduced to rank b
        {
          auto in = inputs(t, op, n, count * std::size_t(n));
          const auto want = reduced(t, op, n, in, std::size_t(rank) * count, count);
          std::vector<std::byte> out(count * ts, std::byte{0x5a});
          std::byte* dst = in_place ? in[rank].data() + std::size_t(rank) * count * ts : out.data();
          NCHECK(ncclReduceScatter(in[rank].data(), dst, count, t, op, comm, s));
          sync(s);
          std::vector<std::byte> got(dst, dst + count * ts);
          if (got != want) return fail_at("ncclReduceScatter", t, op, count, first_diff(got, want, ts));
        }
      }
      // Broadcast from root q % n
      {
        const int root = (q + 1) % n;
        auto in = inputs(t, ncclSum, n, count);
        std::vector<std::byte> out(count * ts, std::byte{0x5a});
        const bool in_place = q % 2 == 0;
        std::byte* dst = in_place ? in[rank].data() : out.data();
        NCHECK(ncclBroadcast(rank == root ? in[rank].data() : nullptr, dst, count, t, root, comm, s));
        sync(s);
        std::vector<std::byte> got(dst, dst + count * ts);
        if (got != in[root]) return fail_at("ncclBroadcast", t, ncclSum, count, first_diff(got, in[root], ts));
      }
      // AllGather
      {
        auto in = inputs(t, ncclSum, n, count);
        std::vector<std::byte> want;
        for (const auto& b : in) want.insert(want.end(), b.begin(), b.end());
        std::vector<std::byte> out(count * ts * std::size_t(n), std::byte{0x5a});
        const bool in_place = q % 2 == 1;
        const std::byte* src = in[rank].data();
        if (in_place) {
          std::memcpy(out.data() + std::size_t(rank) * count * ts, in[rank].data(), count * ts);
          src = out.data() + std::size_t(rank) * count * ts;
        }
        NCHECK(ncclAllGather(src, out.data(), count, t, comm, s));
        sync(s);
        if (out != want) return fail_at("ncclAllGather", t, ncclSum, count, first_diff(out, want, ts));
      }
    }
  }
  // An empty collective is dropped (NCCL does so): nothing is queued.
  NCHECK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, s));
  CHECK(head_what(s).empty());
  // Invalid arguments.
  float x = 1;
  EXPECT_RESULT(ncclAllReduce(&x, &x, 1, ncclDataType_t(42), ncclSum, comm, s), ncclInvalidArgument);
  EXPECT_RESULT(ncclAllReduce(&x, &x, 1, ncclFloat, ncclRedOp_t(9), comm, s), ncclInvalidArgument);
  EXPECT_RESULT(ncclBroadcast(&x, &x, 1, ncclFloat, n, comm, s), ncclInvalidArgument);
  EXPECT_RESULT(ncclSend(&x, 1, ncclFloat, -1, comm, s), ncclInvalidArgument);
  EXPECT_RESULT(ncclGroupEnd(), ncclInvalidUsage);
  // Still usable (a blocking communicator keeps no error for a refused call).
  float y = float(rank + 1);
  NCHECK(ncclAllReduce(&y, &y, 1, ncclFloat, ncclSum, comm, s));
  sync(s);
  CHECK(y == float(n * (n + 1) / 2));
  ncclResult_t st = ncclInternalError;
  NCHECK(ncclCommGetAsyncError(comm, &st));
  CHECK(st == ncclSuccess);
  NCHECK(ncclCommFinalize(comm));
  NCHECK(ncclCommDestroy(comm));
  return 0;
}

// The fp16 and bf16 conversions: every bit pattern plus zero is itself (NaN canonical,
// -0 + 0 = +0), and a few sums at the edges of the formats.
int conversions(int rank, const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, 2, id, rank));
  cudaStream_t s = new_stream();
  for (const ncclDataType_t t : {ncclFloat16, ncclBfloat16}) {
    const std::uint16_t exp_mask = t == ncclFloat16 ? 0x7c00 : 0x7f80;
    std::vector<std::uint16_t> v(65536);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = rank == 0 ? std::uint16_t(i) : 0;
    NCHECK(ncclAllReduce(v.data(), v.data(), v.size(), t, ncclSum, comm, s));
    sync(s);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto h = std::uint16_t(i);
      std::uint16_t want = h;
      if ((h & exp_mask) == exp_mask && (h & ~exp_mask & 0x7fff)) want = 0x7fff;  // NaN
      if (h == 0x8000) want = 0;                                                  // -0 + +0
      if (v[i] != want) {
        std::fprintf(stderr, "type %d: 0x%04x + 0 gave 0x%04x, want 0x%04x\n", int(t), unsigned(h), unsigned(v[i]),
                     unsigned(want));
        return 1;
      }
    }
  }
  // Edge sums: rank 0's value + rank 1's value (hex bits), and the expected bits.
  struct edge {
    ncclDataType_t t;
    std::uint16_t a, b, want;
  };
  const edge edges[] = {
      {ncclFloat16, 0x7bff, 0x4c00, 0x7c00},   // 65504 + 16 = 65520: halfway, ties to even: inf
      {ncclFloat16, 0x7bff, 0x4bff, 0x7bff},   // 65504 + 15.99: below halfway
      {ncclFloat16, 0x3c00, 0x1000, 0x3c00},   // 1 + 2^-11: tie, to even (1)
      {ncclFloat16, 0x3c01, 0x1000, 0x3c02},   // (1 + 2^-10) + 2^-11: tie, to even (up)
      {ncclFloat16, 0x0001, 0x0001, 0x0002},   // subnormals
      {ncclFloat16, 0x03ff, 0x0001, 0x0400},   // largest subnormal + smallest: smallest normal
      {ncclFloat16, 0x7c00, 0xfc00, 0x7fff},   // inf + -inf: NaN
      {ncclFloat16, 0xc000, 0x4000, 0x0000},   // -2 + 2 = +0
      {ncclBfloat16, 0x3f80, 0x3b80, 0x3f80},  // 1 + 2^-8: tie, to even (1)
      {ncclBfloat16, 0x3f81, 0x3b80, 0x3f82},  // (1 + 2^-7) + 2^-8: tie, up
      {ncclBfloat16, 0x7f7f, 0x7b00, 0x7f80},  // max + 2^119 (half an ulp): tie, to even: inf
      {ncclBfloat16, 0x7f7f, 0x7a80, 0x7f7f},  // max + 2^118: stays max
      {ncclBfloat16, 0x0001, 0x0001, 0x0002},  // subnormals
  };
  std::vector<std::uint16_t> a, want;
  for (const ncclDataType_t t : {ncclFloat16, ncclBfloat16}) {
    a.clear();
    want.clear();
    for (const auto& e : edges)
      if (e.t == t) {
        a.push_back(rank == 0 ? e.a : e.b);
        want.push_back(e.want);
      }
    NCHECK(ncclAllReduce(a.data(), a.data(), a.size(), t, ncclSum, comm, s));
    sync(s);
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i] != want[i]) {
        std::fprintf(stderr, "type %d edge %zu: got 0x%04x, want 0x%04x\n", int(t), i, unsigned(a[i]),
                     unsigned(want[i]));
        return 1;
      }
  }
  NCHECK(ncclCommDestroy(comm));
  return 0;
}

// Bytes rank r sends to rank j in the alltoallv exchange (some empty, one multi-chunk).
std::size_t a2a_count(int r, int j, int n) {
  if (r == 0 && j == n - 1) return 100000;  // 400 KB of uint32: several chunks
  if ((r * 5 + j * 3) % 4 == 0) return 0;
  return std::size_t(r) * 1000 + std::size_t(j) * 37 + 1;
}
std::uint32_t a2a_value(int r, int j, std::size_t i) {
  return std::uint32_t(r) * 0x1000000u + std::uint32_t(j) * 0x10000u + std::uint32_t(i);
}

// Sends and receives in groups: an uneven alltoallv with empty blocks (skipped on both
// sides) and zero-count messages (matched), to self included; a ring mixed with a
// collective in one group; nested groups.
int p2p(int rank, const ncclUniqueId& id, int n) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t s = new_stream();
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<std::uint32_t>> send(static_cast<std::size_t>(n)), recv(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) {
      send[j].resize(a2a_count(rank, j, n));
      for (std::size_t i = 0; i < send[j].size(); ++i) send[j][i] = a2a_value(rank, j, i) + std::uint32_t(round);
      recv[j].assign(a2a_count(j, rank, n), 0xdeadbeef);
    }
    NCHECK(ncclGroupStart());
    for (int j = 0; j < n; ++j) {
      if (!send[j].empty()) NCHECK(ncclSend(send[j].data(), send[j].size(), ncclUint32, j, comm, s));
      if (!recv[j].empty()) NCHECK(ncclRecv(recv[j].data(), recv[j].size(), ncclUint32, j, comm, s));
      if (round == 1) {  // zero-count messages are messages too: matched in order
        NCHECK(ncclSend(nullptr, 0, ncclUint32, j, comm, s));
        NCHECK(ncclRecv(nullptr, 0, ncclUint32, j, comm, s));
      }
    }
    NCHECK(ncclGroupEnd());
    sync(s);
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < recv[j].size(); ++i)
        if (recv[j][i] != a2a_value(j, rank, i) + std::uint32_t(round)) {
          std::fprintf(stderr, "round %d: from rank %d element %zu: got %u\n", round, j, i, recv[j][i]);
          return 1;
        }
  }
  // A ring (send right, receive left) and an Allreduce in one group, nested groups.
  std::vector<double> mine(70000), left(70000, -1.0);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = rank * 1e6 + double(i);
  double sum = rank;
  NCHECK(ncclGroupStart());
  NCHECK(ncclGroupStart());
  NCHECK(ncclRecv(left.data(), left.size(), ncclFloat64, (rank + n - 1) % n, comm, s));
  NCHECK(ncclGroupEnd());
  NCHECK(ncclAllReduce(&sum, &sum, 1, ncclFloat64, ncclSum, comm, s));
  NCHECK(ncclSend(mine.data(), mine.size(), ncclFloat64, (rank + 1) % n, comm, s));
  CHECK(head_what(s).empty());  // nothing queued before the outermost ncclGroupEnd
  NCHECK(ncclGroupEnd());
  sync(s);
  CHECK(sum == double(n * (n - 1) / 2));
  const int l = (rank + n - 1) % n;
  for (std::size_t i = 0; i < left.size(); ++i) CHECK(left[i] == l * 1e6 + double(i));
  NCHECK(ncclCommDestroy(comm));
  return 0;
}

// Collectives that differ between ranks: the 3rd collective is a broadcast of 37 bytes with
// root 1 on rank 0 and root 0 on rank 1. Both ranks report ncclInvalidUsage naming both,
// the output untouched.
int mismatch_collective(int rank, const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, 2, id, rank));
  cudaStream_t s = new_stream();
  float f[4] = {1, 2, 3, 4};
  NCHECK(ncclAllReduce(f, f, 4, ncclFloat, ncclSum, comm, s));
  NCHECK(ncclAllReduce(f, f, 4, ncclFloat, ncclMax, comm, s));
  std::vector<char> b(37, char(rank + 1));
  NCHECK(ncclBroadcast(b.data(), b.data(), b.size(), ncclChar, rank == 0 ? 1 : 0, comm, s));
  sync(s);  // completes (with an error): the stream does not stay stuck
  CHECK(f[0] == 2 && f[3] == 8);
  CHECK(b == std::vector<char>(37, char(rank + 1)));
  ncclResult_t st = ncclSuccess;
  NCHECK(ncclCommGetAsyncError(comm, &st));
  CHECK(st == ncclInvalidUsage);
  CHECK(contains(ncclGetLastError(comm), "3rd collective"));
  // Later calls return the error; the communicator is released with ncclCommAbort.
  EXPECT_RESULT(ncclAllReduce(f, f, 4, ncclFloat, ncclSum, comm, s), ncclInvalidUsage);
  EXPECT_RESULT(ncclCommDestroy(comm), ncclInvalidUsage);
  NCHECK(ncclCommAbort(comm));
  return 0;
}

// A send whose receive expects another count: both sides fail, naming both.
int mismatch_p2p(int rank, const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, 2, id, rank));
  cudaStream_t s = new_stream();
  std::vector<std::uint64_t> v(12, 7);
  if (rank == 0)
    NCHECK(ncclSend(v.data(), 10, ncclUint64, 1, comm, s));
  else
    NCHECK(ncclRecv(v.data(), 12, ncclUint64, 0, comm, s));
  sync(s);
  CHECK(v == std::vector<std::uint64_t>(12, 7));
  ncclResult_t st = ncclSuccess;
  NCHECK(ncclCommGetAsyncError(comm, &st));
  CHECK(st == ncclInvalidUsage);
  NCHECK(ncclCommAbort(comm));
  return 0;
}

// A non-blocking communicator as gravac uses it: calls return ncclInProgress; the operation
// is on the stream only once ncclCommGetAsyncError has said ncclSuccess, so a copy queued
// before that runs before the collective and one queued after runs after it.
int nonblocking(int rank, const ncclUniqueId& id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  EXPECT_RESULT(ncclCommInitRankConfig(&comm, 2, id, rank, &config), ncclInProgress);
  CHECK(comm != nullptr);
  CHECK(wait_comm(comm) == ncclSuccess);
  cudaStream_t s = new_stream();
  std::vector<float> a(1000), before(1000, -1), after(1000, -1);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(i + std::size_t(rank));
  EXPECT_RESULT(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat, ncclSum, comm, s), ncclInProgress);
  CHECK(head_what(s).empty());
  copy_async(before.data(), a.data(), a.size() * 4, s);  // queued before the first poll
  int polls = 0;
  CHECK(wait_comm(comm, &polls) == ncclSuccess);
  CHECK(polls == 2);  // the first poll says ncclInProgress
  CHECK(contains(head_what(s), "copy"));
  copy_async(after.data(), a.data(), a.size() * 4, s);
  sync(s);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(before[i] == float(i + std::size_t(rank)));
    CHECK(after[i] == float(2 * i + 1));
  }
  // A group: ncclGroupEnd returns ncclInProgress.
  std::uint64_t mine = 100 + std::uint64_t(rank), theirs = 0;
  NCHECK(ncclGroupStart());
  NCHECK(ncclSend(&mine, 1, ncclUint64, 1 - rank, comm, s));
  NCHECK(ncclRecv(&theirs, 1, ncclUint64, 1 - rank, comm, s));
  EXPECT_RESULT(ncclGroupEnd(), ncclInProgress);
  CHECK(wait_comm(comm) == ncclSuccess);
  sync(s);
  CHECK(theirs == 100 + std::uint64_t(1 - rank));
  // gravac's destructor: finalize, poll, destroy.
  EXPECT_RESULT(ncclCommFinalize(comm), ncclInProgress);
  CHECK(wait_comm(comm) == ncclSuccess);
  NCHECK(ncclCommDestroy(comm));
  return 0;
}

// A call on a non-blocking communicator before the previous one was polled to ncclSuccess
// is refused (ncclInvalidArgument), as NCCL's ncclCommEnsureReady does.
int nonblocking_misuse(int rank, const ncclUniqueId& id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  EXPECT_RESULT(ncclCommInitRankConfig(&comm, 1, id, rank, &config), ncclInProgress);
  EXPECT_RESULT(ncclCommDestroy(comm), ncclInvalidArgument);  // still joining: refused, not sticky
  CHECK(wait_comm(comm) == ncclSuccess);
  cudaStream_t s = new_stream();
  float x = 1;
  EXPECT_RESULT(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, s), ncclInProgress);
  EXPECT_RESULT(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, s), ncclInvalidArgument);
  CHECK(wait_comm(comm) == ncclInvalidArgument);  // sticky, as in NCCL
  NCHECK(ncclCommAbort(comm));
  return 0;
}

// cudaStreamPerThread named to a non-blocking communicator: the communicator's own thread
// queues the op, so it lands on that thread's per-thread stream; the caller's per-thread
// stream does not hold it (NVIDIA/nccl#1976). ncclCommFinalize waits for it (runs it).
// A blocking communicator queues it on the caller's own per-thread stream.
int per_thread_stream(int rank, const ncclUniqueId& id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  EXPECT_RESULT(ncclCommInitRankConfig(&comm, 2, id, rank, &config), ncclInProgress);
  CHECK(wait_comm(comm) == ncclSuccess);
  std::vector<int> a(100, rank + 1);
  EXPECT_RESULT(ncclAllReduce(a.data(), a.data(), a.size(), ncclInt32, ncclSum, comm, cudaStreamPerThread),
                ncclInProgress);
  CHECK(wait_comm(comm) == ncclSuccess);
  CHECK(head_what(cudaStreamPerThread).empty());  // not on this thread's stream
  sync(cudaStreamPerThread);
  CHECK(a[0] == rank + 1);  // so waiting for it does not wait for the collective
  EXPECT_RESULT(ncclCommFinalize(comm), ncclInProgress);
  CHECK(wait_comm(comm) == ncclSuccess);  // finalize ran the internal thread's stream
  CHECK(a[0] == 3 && a[99] == 3);
  NCHECK(ncclCommDestroy(comm));
  return 0;
}

int per_thread_stream_blocking(int rank, const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, 2, id, rank));
  std::vector<int> a(100, rank + 1);
  NCHECK(ncclAllReduce(a.data(), a.data(), a.size(), ncclInt32, ncclSum, comm, cudaStreamPerThread));
  CHECK(contains(head_what(cudaStreamPerThread), "ncclAllReduce"));
  sync(cudaStreamPerThread);
  CHECK(a[0] == 3);
  NCHECK(ncclCommDestroy(comm));
  return 0;
}

// ncclCommAbort on rank 0 while rank 1 waits in an Allreduce: rank 1's op completes with
// ncclRemoteError (output untouched), later calls return it, and it is released with abort.
int abort_peer(int rank, const ncclUniqueId& id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  EXPECT_RESULT(ncclCommInitRankConfig(&comm, 2, id, rank, &config), ncclInProgress);
  CHECK(wait_comm(comm) == ncclSuccess);
  cudaStream_t s = new_stream();
  if (rank == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    NCHECK(ncclCommAbort(comm));
    return 0;
  }
  std::vector<float> a(10, 1.0f);
  EXPECT_RESULT(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat, ncclSum, comm, s), ncclInProgress);
  CHECK(wait_comm(comm) == ncclSuccess);
  CHECK(!query(s));
  CHECK(contains(head_what(s), "waiting for rank 0"));
  CHECK(gravac_wait(comm, s) == ncclRemoteError);  // seen before the stream completes
  CHECK(query(s));                                 // then the op completes
  CHECK(a == std::vector<float>(10, 1.0f));
  ncclResult_t st = ncclSuccess;
  NCHECK(ncclCommGetAsyncError(comm, &st));
  CHECK(st == ncclRemoteError);
  EXPECT_RESULT(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat, ncclSum, comm, s), ncclRemoteError);
  CHECK(head_what(s).empty());
  EXPECT_RESULT(ncclCommDestroy(comm), ncclRemoteError);
  NCHECK(ncclCommAbort(comm));
  return 0;
}

// Rank 0's process exits after joining: rank 1's Allreduce completes with ncclRemoteError.
int dead_peer(int rank, const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, 2, id, rank));
  if (rank == 0) _exit(0);
  cudaStream_t s = new_stream();
  std::vector<float> a(10, 1.0f);
  NCHECK(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat, ncclSum, comm, s));
  CHECK(gravac_wait(comm, s) == ncclRemoteError);
  CHECK(query(s));
  CHECK(a == std::vector<float>(10, 1.0f));
  ncclResult_t st = ncclSuccess;
  NCHECK(ncclCommGetAsyncError(comm, &st));
  CHECK(st == ncclRemoteError);
  CHECK(contains(ncclGetLastError(comm), "has exited"));
  NCHECK(ncclCommAbort(comm));
  return 0;
}

// Rank 1 never calls the Allreduce rank 0 waits in: rank 0's op stays pending, no error,
// until rank 0 gives up and aborts (as gravac does at its timeout); rank 1 then sees it.
int never_arrives(int rank, const ncclUniqueId& id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  EXPECT_RESULT(ncclCommInitRankConfig(&comm, 2, id, rank, &config), ncclInProgress);
  CHECK(wait_comm(comm) == ncclSuccess);
  cudaStream_t s = new_stream();
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ncclResult_t st = ncclSuccess;
    NCHECK(ncclCommGetAsyncError(comm, &st));
    CHECK(st == ncclRemoteError);
    NCHECK(ncclCommAbort(comm));
    return 0;
  }
  std::vector<float> a(10, 1.0f);
  EXPECT_RESULT(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat, ncclSum, comm, s), ncclInProgress);
  CHECK(wait_comm(comm) == ncclSuccess);
  CHECK(!query_until(s, 1.0));  // pending
  ncclResult_t st = ncclInternalError;
  NCHECK(ncclCommGetAsyncError(comm, &st));
  CHECK(st == ncclSuccess);
  CHECK(contains(head_what(s), "waiting for rank 1"));
  NCHECK(ncclCommAbort(comm));
  CHECK(query(s));  // the aborted op completes
  CHECK(a == std::vector<float>(10, 1.0f));
  return 0;
}

// Rank 1 never joins: rank 0's non-blocking init stays in progress until it aborts.
int never_joins(int rank, const ncclUniqueId& id) {
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    return 0;  // exits without joining
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  EXPECT_RESULT(ncclCommInitRankConfig(&comm, 2, id, rank, &config), ncclInProgress);
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500)) {
    ncclResult_t st = ncclSuccess;
    NCHECK(ncclCommGetAsyncError(comm, &st));
    CHECK(st == ncclInProgress);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  NCHECK(ncclCommAbort(comm));
  return 0;
}

// Without ncclGroupEnd nothing is queued: the stream is empty, the output untouched.
int missing_group_end(int rank, const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, 2, id, rank));
  cudaStream_t s = new_stream();
  int x = rank + 1;
  NCHECK(ncclGroupStart());
  NCHECK(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, s));
  sync(s);
  CHECK(x == rank + 1);
  NCHECK(ncclGroupEnd());
  sync(s);
  CHECK(x == 3);
  NCHECK(ncclCommDestroy(comm));
  return 0;
}

// Two host threads on one communicator at once: the double ends the process (fail()).
int two_threads(int rank, const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, 1, id, rank));
  cudaStream_t s = new_stream();
  float x = 1, y = 2;
  NCHECK(ncclGroupStart());
  NCHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, s));
  std::thread t([&] { (void)ncclAllReduce(&y, &y, 1, ncclFloat, ncclSum, comm, s); });
  t.join();
  return 3;  // not reached
}

// Ids, rank counts and groups the double refuses.
int refused(int rank, const ncclUniqueId& id) {
  (void)rank;
  ncclComm_t comm = nullptr;
  ncclUniqueId zero;
  std::memset(&zero, 0, sizeof zero);
  EXPECT_RESULT(ncclCommInitRank(&comm, 1, zero, 0), ncclInvalidArgument);
  EXPECT_RESULT(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t first = nullptr;
  EXPECT_RESULT(ncclCommInitRankConfig(&first, 2, id, 0, &config), ncclInProgress);
  EXPECT_RESULT(ncclCommInitRank(&comm, 3, id, 1), ncclInvalidArgument);              // 3 ranks, not 2
  EXPECT_RESULT(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclInvalidUsage);  // rank 0 again
  NCHECK(ncclCommAbort(first));
  // Two streams for one communicator in a group.
  ncclUniqueId id2;
  NCHECK(ncclGetUniqueId(&id2));
  NCHECK(ncclCommInitRank(&comm, 1, id2, 0));
  cudaStream_t s1 = new_stream(), s2 = new_stream();
  float x = 1, y = 2;
  NCHECK(ncclGroupStart());
  NCHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, s1));
  NCHECK(ncclAllReduce(&y, &y, 1, ncclFloat, ncclSum, comm, s2));
  EXPECT_RESULT(ncclGroupEnd(), ncclInvalidUsage);
  // A one-rank communicator: every reduction is the identity.
  std::int64_t v[5] = {-7, 3, 0, 11, -1};
  for (const ncclRedOp_t op : kOps) {
    NCHECK(ncclAllReduce(v, v, 5, ncclInt64, op, comm, s1));
    sync(s1);
    CHECK(v[0] == -7 && v[3] == 11);
  }
  NCHECK(ncclCommDestroy(comm));
  return 0;
}

// A host pointer (not device memory) is refused at the call, as NCCL_CHECK_POINTERS does;
// pinned host memory is accepted (the GPU reads it).
int host_pointer(int rank, const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, 1, id, rank));
  cudaStream_t s = new_stream();
  float host[4] = {1, 2, 3, 4}, dev[4] = {0, 0, 0, 0};
  {
    std::lock_guard<std::mutex> lk(g_host_mu);
    g_host_ptrs.push_back(host);
  }
  EXPECT_RESULT(ncclAllReduce(host, dev, 4, ncclFloat, ncclSum, comm, s), ncclInvalidArgument);
  EXPECT_RESULT(ncclAllReduce(dev, host, 4, ncclFloat, ncclSum, comm, s), ncclInvalidArgument);
  EXPECT_RESULT(ncclSend(host, 4, ncclFloat, 0, comm, s), ncclInvalidArgument);
  NCHECK(ncclAllReduce(dev, dev, 4, ncclFloat, ncclSum, comm, s));
  float pinned[4] = {1, 2, 3, 4};
  {
    std::lock_guard<std::mutex> lk(g_host_mu);
    g_pinned_ptrs.push_back(pinned);
  }
  NCHECK(ncclAllReduce(pinned, dev, 4, ncclFloat, ncclSum, comm, s));
  sync(s);
  CHECK(dev[3] == 4);
  NCHECK(ncclCommDestroy(comm));
  return 0;
}

// Memory that is not device memory when the operation runs (here: registered as host after
// the call) ends the process, named by the runtime's range check.
int freed_before_run(int rank, const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  NCHECK(ncclCommInitRank(&comm, 1, id, rank));
  cudaStream_t s = new_stream();
  float buf[4] = {1, 2, 3, 4};
  NCHECK(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, comm, s));
  {
    std::lock_guard<std::mutex> lk(g_host_mu);
    g_host_ptrs.push_back(buf);
  }
  sync(s);
  return 3;  // not reached
}

struct scenario {
  const char* name;
  std::function<bool()> run;
};

bool expect_all_ok(const char* name, int n, const std::function<int(int, const ncclUniqueId&)>& fn) {
  const auto cs = run_ranks(n, fn);
  if (!all_ok(cs)) {
    std::printf("  %s: a rank failed\n", name);
    show(cs);
  }
  return all_ok(cs);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<scenario> scenarios = {
      {"collectives, 2 ranks",
       [] {
         return expect_all_ok("collectives", 2, [](int r, const ncclUniqueId& id) { return collectives(r, id, 2); });
       }},
      {"collectives, 4 ranks",
       [] {
         return expect_all_ok("collectives", 4, [](int r, const ncclUniqueId& id) { return collectives(r, id, 4); });
       }},
      {"fp16/bf16 conversions", [] { return expect_all_ok("conversions", 2, conversions); }},
      {"send/recv groups, 2 ranks",
       [] { return expect_all_ok("p2p", 2, [](int r, const ncclUniqueId& id) { return p2p(r, id, 2); }); }},
      {"send/recv groups, 3 ranks",
       [] { return expect_all_ok("p2p", 3, [](int r, const ncclUniqueId& id) { return p2p(r, id, 3); }); }},
      {"send/recv groups, 4 ranks",
       [] { return expect_all_ok("p2p", 4, [](int r, const ncclUniqueId& id) { return p2p(r, id, 4); }); }},
      {"collective mismatch",
       [] {
         const auto cs = run_ranks(2, mismatch_collective);
         bool ok = all_ok(cs);
         for (const auto& c : cs)
           ok = ok && contains(c.err, "rank 0's is ncclBroadcast(37 x ncclInt8 = 37 bytes, root 1)") &&
                contains(c.err, "rank 1's is ncclBroadcast(37 x ncclInt8 = 37 bytes, root 0)");
         if (!ok) show(cs);
         return ok;
       }},
      {"send/recv mismatch",
       [] {
         const auto cs = run_ranks(2, mismatch_p2p);
         bool ok = all_ok(cs);
         for (const auto& c : cs) ok = ok && contains(c.err, "10 x ncclUint64") && contains(c.err, "12 x ncclUint64");
         if (!ok) show(cs);
         return ok;
       }},
      {"non-blocking ordering", [] { return expect_all_ok("nonblocking", 2, nonblocking); }},
      {"non-blocking misuse",
       [] {
         const auto cs = run_ranks(1, nonblocking_misuse);
         const bool ok = all_ok(cs) && contains(cs[0].err, "Attempt to use communicator");
         if (!ok) show(cs);
         return ok;
       }},
      {"per-thread stream on the internal thread",
       [] {
         const auto cs = run_ranks(2, per_thread_stream);
         bool ok = all_ok(cs);
         ok = ok && (contains(cs[0].err, "nccl#1976") || contains(cs[1].err, "nccl#1976"));
         if (!ok) show(cs);
         return ok;
       }},
      {"per-thread stream, blocking",
       [] { return expect_all_ok("per-thread blocking", 2, per_thread_stream_blocking); }},
      {"abort from one rank",
       [] {
         const auto cs = run_ranks(2, abort_peer);
         const bool ok = all_ok(cs) && contains(cs[1].err, "aborted by rank 0");
         if (!ok) show(cs);
         return ok;
       }},
      {"dead peer", [] { return expect_all_ok("dead peer", 2, dead_peer); }},
      {"a rank that never arrives", [] { return expect_all_ok("never arrives", 2, never_arrives); }},
      {"a rank that never joins", [] { return expect_all_ok("never joins", 2, never_joins); }},
      {"missing ncclGroupEnd", [] { return expect_all_ok("missing group end", 2, missing_group_end); }},
      {"two threads on one communicator",
       [] {
         const auto cs = run_ranks(1, two_threads);
         const bool ok = cs[0].aborted() &&
                         contains(cs[0].err, "gravac CUDA double: ncclAllReduce on NCCL rank 0 of 1") &&
                         contains(cs[0].err, "one thread per communicator");
         if (!ok) show(cs);
         return ok;
       }},
      {"host pointers refused",
       [] {
         const auto cs = run_ranks(1, host_pointer);
         const bool ok = all_ok(cs) && contains(cs[0].err, "sendbuff is not device memory");
         if (!ok) show(cs);
         return ok;
       }},
      {"memory checked when the operation runs",
       [] {
         const auto cs = run_ranks(1, freed_before_run);
         const bool ok =
             cs[0].aborted() && contains(cs[0].err, "gravac CUDA double: ncclAllReduce's sendbuff (NCCL rank 0 of 1)");
         if (!ok) show(cs);
         return ok;
       }},
      {"refused ids, ranks and groups", [] { return expect_all_ok("refused", 1, refused); }},
  };
  int failed = 0;
  for (const auto& sc : scenarios) {
    if (argc > 1 && !contains(sc.name, argv[1])) continue;
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = sc.run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %s (%.2f s)\n", ok ? "PASS" : "FAIL", sc.name, s);
    std::fflush(stdout);
    failed += ok ? 0 : 1;
  }
  std::printf("%d scenario(s) failed\n", failed);
  return failed ? 1 : 0;
}
