// The host test double of the CUDA runtime: streams as deferred queues, events as
// (stream, position), the legacy default stream's implicit synchronization, the per-thread
// default stream of each OS thread, device memory with guard pages and stream order
// enforced by page protection, pinned memory, sticky errors.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_runtime.h"

// ---------------------------------------------------------------------------------------
// Streams and events.

struct CUstream_st {
  std::uint64_t id = 0;
  bool nonblocking = false;  // created with cudaStreamNonBlocking: no implicit legacy sync
  bool legacy = false;       // the legacy default stream
  bool per_thread = false;   // some OS thread's cudaStreamPerThread
  bool destroyed = false;
  bool driving = false;  // on the current drive stack (no re-entry: a cycle cannot progress)
  std::deque<std::unique_ptr<cuda_double::stream_op>> queue;
  std::uint64_t enqueued = 0;   // operations ever queued
  std::uint64_t completed = 0;  // operations completed (a prefix of the queued ones)
  std::string name;
};

struct CUevent_st {
  CUstream_st* stream = nullptr;  // where it was last recorded (null: never recorded)
  std::uint64_t position = 0;     // complete once stream->completed >= position
  bool timing = true;
  bool destroyed = false;
  std::shared_ptr<std::chrono::steady_clock::time_point> when;  // set when the record runs
};

namespace cuda_double {
namespace {

std::recursive_mutex& device_lock() {
  static std::recursive_mutex m;
  return m;
}

struct state {
  CUstream_st legacy;
  std::vector<CUstream_st*> streams;  // every stream ever made (never freed: handles stay checkable)
  std::uint64_t next_id = 1;
  cudaError_t sticky = cudaSuccess;
  std::string sticky_why;
  std::atomic<std::size_t> implicit_syncs{0};
  std::atomic<std::size_t> host_waits{0};
  std::mutex sync_log_lock;
  std::map<std::string, std::size_t> sync_log;  // implicit_syncs by call
  state() {
    legacy.legacy = true;
    legacy.name = "the legacy default stream";
    streams.push_back(&legacy);
  }
};

state& st() {
  static state* s = new state;  // never destroyed: threads may still wait at exit
  return *s;
}

// A call that CUDA documents as synchronizing the device (implicitly, or device-wide): a
// step that must never stall the device checks that none happened (implicit_device_syncs).
void count_device_sync(const char* call) {
  ++st().implicit_syncs;
  std::lock_guard lk(st().sync_log_lock);
  ++st().sync_log[call];
}

thread_local cudaError_t last_error = cudaSuccess;
thread_local CUstream_st* per_thread_stream = nullptr;
thread_local int current_device = 0;

double hang_seconds() {
  static const double s = [] {
    const char* v = std::getenv("GRAVAC_CUDA_DOUBLE_HANG_S");
    return v ? std::atof(v) : 120.0;
  }();
  return s;
}

CUstream_st* make_stream(bool nonblocking, bool per_thread, std::string name) {
  auto* s = new CUstream_st;
  s->nonblocking = nonblocking;
  s->per_thread = per_thread;
  std::lock_guard lk(device_lock());
  s->id = st().next_id++;
  s->name = std::move(name);
  st().streams.push_back(s);
  return s;
}

CUstream_st* resolve_stream(cudaStream_t h) {
  if (h == nullptr || h == cudaStreamLegacy) return &st().legacy;
  if (h == cudaStreamPerThread) {
    if (!per_thread_stream) {
      static std::atomic<int> n{0};
      per_thread_stream =
          make_stream(false, true, "the per-thread default stream of OS thread #" + std::to_string(n++));
    }
    return per_thread_stream;
  }
  auto* s = reinterpret_cast<CUstream_st*>(h);
  if (s->destroyed) fail("a stream used after cudaStreamDestroy (" + s->name + ")");
  return s;
}

bool blocking(const CUstream_st* s) { return !s->nonblocking && !s->legacy; }

// An operation that completes when `target` has completed `position` operations; when run,
// it first tries to run the target itself (the stream it waits on is driven on demand).
bool drive(CUstream_st* s, std::uint64_t until);

struct wait_op final : stream_op {
  CUstream_st* target;
  std::uint64_t position;
  std::string why;
  wait_op(CUstream_st* t, std::uint64_t p, std::string w) : target(t), position(p), why(std::move(w)) {}
  bool poll() override {
    if (target->completed >= position) return true;
    drive(target, position);
    return target->completed >= position;
  }
  std::string what() const override {
    return why + " (waits for operation " + std::to_string(position) + " of " + target->name + ", which has done " +
           std::to_string(target->completed) + ")";
  }
};

struct record_op final : stream_op {
  std::shared_ptr<std::chrono::steady_clock::time_point> when;
  bool poll() override {
    if (when) *when = std::chrono::steady_clock::now();
    return true;
  }
  std::string what() const override { return "cudaEventRecord"; }
};

void push(CUstream_st* s, std::unique_ptr<stream_op> op) {
  s->queue.push_back(std::move(op));
  ++s->enqueued;
}

// Queues with the legacy stream's implicit synchronization: an operation on the legacy
// stream waits for all work queued so far on every blocking stream, and an operation on a
// blocking stream waits for the legacy stream's work queued so far.
void enqueue_locked(CUstream_st* s, std::unique_ptr<stream_op> op) {
  auto& g = st();
  if (s->legacy) {
    for (CUstream_st* t : g.streams)
      if (t != s && blocking(t) && t->completed < t->enqueued)
        push(s, std::make_unique<wait_op>(t, t->enqueued, "implicit synchronization of the legacy default stream"));
  } else if (blocking(s) && g.legacy.completed < g.legacy.enqueued) {
    push(s, std::make_unique<wait_op>(&g.legacy, g.legacy.enqueued,
                                      "implicit synchronization with the legacy default stream"));
  }
  push(s, std::move(op));
}

// Runs s's operations until it has completed `until` of them, or its front operation
// cannot progress now. Returns true when it progressed. Device lock held.
bool drive(CUstream_st* s, std::uint64_t until) {
  if (s->driving) return false;  // on the stack already: a wait cycle makes no progress
  s->driving = true;
  bool progressed = false;
  while (s->completed < until && !s->queue.empty()) {
    std::unique_ptr<stream_op>& front = s->queue.front();
    if (!front->poll()) break;
    s->queue.pop_front();
    ++s->completed;
    progressed = true;
  }
  s->driving = false;
  return progressed;
}

std::string front_of(const CUstream_st* s) {
  if (s->queue.empty()) return s->name + " is empty";
  return s->name + " is stuck at: " + s->queue.front()->what();
}

// Blocks until s has completed `until` operations, polling; reports a wait that does not
// finish within the hang limit (no host wait can be interrupted by a timeout otherwise).
cudaError_t wait_until(CUstream_st* s, std::uint64_t until, const char* why) {
  ++st().host_waits;
  const auto t0 = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    {
      std::lock_guard lk(device_lock());
      drive(s, until);
      if (st().sticky != cudaSuccess) return st().sticky;
      if (s->completed >= until) return cudaSuccess;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > hang_seconds())
        fail(std::string(why) + " has waited " + std::to_string(hang_seconds()) +
             " s (GRAVAC_CUDA_DOUBLE_HANG_S) and cannot return: " + front_of(s) +
             ". A blocking host wait cannot be interrupted by any timeout.");
    }
    if (spins < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

cudaError_t checked(cudaError_t e) {
  if (st().sticky != cudaSuccess) return st().sticky;
  if (e != cudaSuccess) last_error = e;
  return e;
}

// ---------------------------------------------------------------------------------------
// Memory: every device allocation is its own mapping with a guard page after it, so an
// overrun faults; stream-ordered allocations stay inaccessible until their stream reaches
// the allocation and become inaccessible again when it reaches the free.

enum class mem_kind { device, pinned };
enum class mem_state { pending, live, freed };

struct allocation {
  std::uintptr_t base = 0;  // what the caller got
  std::size_t bytes = 0;
  void* map = nullptr;  // the mapping (device) or malloc block (pinned)
  std::size_t map_bytes = 0;
  mem_kind kind = mem_kind::device;
  mem_state state = mem_state::live;
  std::string origin;  // "cudaMallocAsync on <stream>"
  std::string ended;   // "cudaFreeAsync on <stream>"
};

std::mutex& mem_lock() {
  static std::mutex m;
  return m;
}
std::map<std::uintptr_t, allocation>& allocations() {
  static auto* m = new std::map<std::uintptr_t, allocation>;
  return *m;
}
std::deque<std::uintptr_t>& quarantine() {
  static auto* q = new std::deque<std::uintptr_t>;
  return *q;
}
constexpr std::size_t page = 4096;
constexpr std::size_t quarantine_entries = 512;
constexpr unsigned char poison = 0xFF;  // NaN floats, all-ones integers

// The allocation holding address a (also freed ones still in quarantine), or null. mem_lock held.
allocation* find_locked(std::uintptr_t a) {
  auto& m = allocations();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  allocation& al = it->second;
  const auto lo = reinterpret_cast<std::uintptr_t>(al.map);
  if (a >= lo && a < lo + al.map_bytes) return &al;
  return nullptr;
}

std::string describe(const allocation& al, std::uintptr_t a) {
  std::string s = std::to_string(al.bytes) + "-byte " + (al.kind == mem_kind::pinned ? "pinned" : "device") +
                  " allocation (" + al.origin + ")";
  if (a >= al.base + al.bytes)
    s = std::to_string(a - al.base - al.bytes) + " bytes past the end of a " + s;
  else if (a < al.base)
    s = std::to_string(al.base - a) + " bytes before a " + s;
  else
    s = "byte " + std::to_string(a - al.base) + " of a " + s;
  if (al.state == mem_state::pending)
    s += " that its stream has not reached yet: stream-ordered memory used on another stream without an event";
  if (al.state == mem_state::freed) s += ", after " + al.ended + " freed it";
  return s;
}

struct sigaction previous_segv;

void on_segv(int sig, siginfo_t* info, void* ctx) {
  const auto a = reinterpret_cast<std::uintptr_t>(info->si_addr);
  allocation* al = find_locked(a);  // no lock: the process is ending; a torn read only garbles the report
  if (al) {
    const std::string m = "gravac CUDA double: memory fault at an access to " + describe(*al, a) + "\n";
    (void)!write(2, m.data(), m.size());
    std::_Exit(134);
  }
  if (previous_segv.sa_flags & SA_SIGINFO) {
    if (previous_segv.sa_sigaction) return previous_segv.sa_sigaction(sig, info, ctx);
  } else if (previous_segv.sa_handler != SIG_DFL && previous_segv.sa_handler != SIG_IGN) {
    return previous_segv.sa_handler(sig);
  }
  signal(SIGSEGV, SIG_DFL);  // re-raised by returning to the faulting access
}

void install_segv_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
  });
}

void* map_device(std::size_t bytes, bool accessible, std::string origin) {
  install_segv_handler();
  const std::size_t data = (bytes + 255) / 256 * 256;
  const std::size_t pages = (data + page - 1) / page;
  const std::size_t map_bytes = (pages + 1) * page;  // one guard page after the data
  void* m = mmap(nullptr, map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(m) + pages * page - data;  // ends at the guard page
  allocation al;
  al.base = base;
  al.bytes = bytes;
  al.map = m;
  al.map_bytes = map_bytes;
  al.state = accessible ? mem_state::live : mem_state::pending;
  al.origin = std::move(origin);
  if (accessible) {
    mprotect(m, pages * page, PROT_READ | PROT_WRITE);
    std::memset(reinterpret_cast<void*>(base), poison, bytes);
  }
  std::lock_guard lk(mem_lock());
  allocations()[base] = std::move(al);
  return reinterpret_cast<void*>(base);
}

void make_live(std::uintptr_t base) {
  std::lock_guard lk(mem_lock());
  auto it = allocations().find(base);
  if (it == allocations().end()) return;
  allocation& al = it->second;
  mprotect(al.map, al.map_bytes - page, PROT_READ | PROT_WRITE);
  std::memset(reinterpret_cast<void*>(base), poison, al.bytes);
  al.state = mem_state::live;
}

// Ends a device allocation: inaccessible at once, the address range kept reserved for a
// while so that a late access faults instead of landing in a newer allocation.
void retire(std::uintptr_t base, std::string how) {
  std::lock_guard lk(mem_lock());
  auto it = allocations().find(base);
  if (it == allocations().end()) return;
  allocation& al = it->second;
  mprotect(al.map, al.map_bytes, PROT_NONE);
  al.state = mem_state::freed;
  al.ended = std::move(how);
  auto& q = quarantine();
  q.push_back(base);
  while (q.size() > quarantine_entries) {
    auto old = allocations().find(q.front());
    q.pop_front();
    if (old == allocations().end()) continue;
    munmap(old->second.map, old->second.map_bytes);
    allocations().erase(old);
  }
}

// The live device or pinned allocation that begins at p (for frees), or an error.
cudaError_t check_free(void* p, mem_kind kind, const char* who) {
  std::lock_guard lk(mem_lock());
  allocation* al = find_locked(reinterpret_cast<std::uintptr_t>(p));
  if (!al || al->base != reinterpret_cast<std::uintptr_t>(p) || al->kind != kind) return cudaErrorInvalidValue;
  if (al->state == mem_state::freed) fail(std::string(who) + " of memory already freed: " + describe(*al, al->base));
  return cudaSuccess;
}

struct alloc_op final : stream_op {
  std::uintptr_t base;
  explicit alloc_op(std::uintptr_t b) : base(b) {}
  bool poll() override {
    make_live(base);
    return true;
  }
  std::string what() const override { return "cudaMallocAsync"; }
};

struct free_op final : stream_op {
  std::uintptr_t base;
  std::string how;
  free_op(std::uintptr_t b, std::string h) : base(b), how(std::move(h)) {}
  bool poll() override {
    retire(base, how);
    return true;
  }
  std::string what() const override { return how; }
};

// Where a pointer points, for copies: device (live or not), pinned host, or pageable host.
enum class where { device, pinned, pageable };
where classify(const void* p) {
  std::lock_guard lk(mem_lock());
  allocation* al = find_locked(reinterpret_cast<std::uintptr_t>(p));
  if (!al) return where::pageable;
  return al->kind == mem_kind::device ? where::device : where::pinned;
}

struct copy_op final : stream_op {
  void* dst;
  const void* src;
  std::size_t bytes;
  std::vector<unsigned char> staged;  // a pageable source, copied at the call
  bool dst_device, src_device;
  copy_op(void* d, const void* s, std::size_t n, bool dd, bool sd)
      : dst(d), src(s), bytes(n), dst_device(dd), src_device(sd) {}
  bool poll() override {
    if (dst_device) check_device_range(dst, bytes, "cudaMemcpyAsync's destination");
    if (src_device) check_device_range(src, bytes, "cudaMemcpyAsync's source");
    std::memmove(dst, staged.empty() ? src : staged.data(), bytes);
    return true;
  }
  std::string what() const override { return "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes"; }
};

struct memset_op final : stream_op {
  void* dst;
  int value;
  std::size_t bytes;
  memset_op(void* d, int v, std::size_t n) : dst(d), value(v), bytes(n) {}
  bool poll() override {
    check_device_range(dst, bytes, "cudaMemsetAsync");
    std::memset(dst, value, bytes);
    return true;
  }
  std::string what() const override { return "cudaMemsetAsync of " + std::to_string(bytes) + " bytes"; }
};

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost:
      return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
      return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
      return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "cudaMemcpyDeviceToDevice";
    default:
      return "cudaMemcpyDefault";
  }
}

// cudaMemcpyAsync's rules: the kind must match the pointers (CUDA leaves a mismatch
// undefined; the double refuses it); a copy into pageable memory returns only when it has
// run (so it waits for the stream's earlier work); a copy from pageable memory takes the
// source at the call; pinned memory is read and written when the copy runs.
cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k, cudaStream_t h,
                         bool synchronous) {
  if (st().sticky != cudaSuccess) return st().sticky;
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src) return checked(cudaErrorInvalidValue);
  const where d = classify(dst), s = classify(src);
  const bool dd = d == where::device, sd = s == where::device;
  if (k != cudaMemcpyDefault) {
    const bool want_sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    const bool want_dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    if (want_sd != sd || want_dd != dd) {
      std::fprintf(stderr, "gravac CUDA double: %s with a %s source and a %s destination\n", kind_name(k),
                   sd ? "device" : "host", dd ? "device" : "host");
      return checked(cudaErrorInvalidMemcpyDirection);
    }
  }
  auto op = std::make_unique<copy_op>(dst, src, bytes, dd, sd);
  if (s == where::pageable) {
    const auto* b = static_cast<const unsigned char*>(src);
    op->staged.assign(b, b + bytes);
  }
  std::uint64_t position = 0;
  CUstream_st* target = nullptr;
  {
    std::lock_guard lk(device_lock());
    target = resolve_stream(h);
    enqueue_locked(target, std::move(op));
    position = target->enqueued;
  }
  if (synchronous || d == where::pageable)
    return wait_until(
        target, position,
        synchronous ? "cudaMemcpy" : "cudaMemcpyAsync into pageable host memory (it returns only when done)");
  return cudaSuccess;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The interface of core.hpp.

cudaError_t enqueue(cudaStream_t s, std::unique_ptr<stream_op> op) {
  std::lock_guard lk(device_lock());
  if (st().sticky != cudaSuccess) return st().sticky;
  enqueue_locked(resolve_stream(s), std::move(op));
  return cudaSuccess;
}

cudaStream_t resolve(cudaStream_t s) {
  std::lock_guard lk(device_lock());
  return reinterpret_cast<cudaStream_t>(resolve_stream(s));
}

cudaError_t drain_all() {
  // The non-empty streams run in a seeded random interleaving, one operation at a time.
  std::mt19937_64 rng(next_seed());
  const auto t0 = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    {
      std::lock_guard lk(device_lock());
      if (st().sticky != cudaSuccess) return st().sticky;
      std::vector<CUstream_st*> busy;
      for (CUstream_st* s : st().streams)
        if (!s->queue.empty()) busy.push_back(s);
      if (busy.empty()) return cudaSuccess;
      std::shuffle(busy.begin(), busy.end(), rng);
      bool progressed = false;
      for (CUstream_st* s : busy) progressed = drive(s, s->completed + 1) || progressed;
      if (progressed) {
        spins = 0;
        continue;
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > hang_seconds())
        fail("cudaDeviceSynchronize has waited " + std::to_string(hang_seconds()) +
             " s (GRAVAC_CUDA_DOUBLE_HANG_S) and cannot return: " + front_of(busy.front()));
    }
    if (spins < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

cudaError_t synchronize_stream(cudaStream_t h, const char* why) {
  CUstream_st* s = nullptr;
  std::uint64_t position = 0;
  {
    std::lock_guard lk(device_lock());
    if (st().sticky != cudaSuccess) return st().sticky;
    s = resolve_stream(h);
    position = s->enqueued;
  }
  return wait_until(s, position, why);
}

void set_sticky(cudaError_t e, const std::string& why) {
  std::lock_guard lk(device_lock());
  if (st().sticky != cudaSuccess) return;
  st().sticky = e;
  st().sticky_why = why;
  std::fprintf(stderr, "gravac CUDA double: sticky error %d: %s\n", static_cast<int>(e), why.c_str());
}

void set_last_error(cudaError_t e) {
  if (st().sticky == cudaSuccess) last_error = e;
}

cudaError_t sticky_error() { return st().sticky; }

void fail(const std::string& msg) {
  std::fprintf(stderr, "gravac CUDA double: %s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

std::uint64_t seed() {
  static const std::uint64_t s = [] {
    const char* v = std::getenv("GRAVAC_CUDA_DOUBLE_SEED");
    return v ? std::strtoull(v, nullptr, 0) : 1ull;
  }();
  return s;
}

std::uint64_t next_seed() {
  static std::atomic<std::uint64_t> counter{0};
  std::uint64_t z = seed() * 0x9E3779B97F4A7C15ull + (++counter) * 0xBF58476D1CE4E5B9ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::size_t implicit_device_syncs() { return st().implicit_syncs.load(); }

std::string device_sync_calls() {
  std::lock_guard lk(st().sync_log_lock);
  std::string out;
  for (const auto& [call, n] : st().sync_log) {
    if (!out.empty()) out += ", ";
    out += call + " x" + std::to_string(n);
  }
  return out.empty() ? "none" : out;
}

std::size_t host_waits() { return st().host_waits.load(); }

std::size_t device_syncs_of(const std::string& call) {
  std::lock_guard lk(st().sync_log_lock);
  const auto it = st().sync_log.find(call);
  return it == st().sync_log.end() ? 0 : it->second;
}

cudaMemoryType memory_type(const void* p) {
  std::lock_guard lk(mem_lock());
  allocation* al = find_locked(reinterpret_cast<std::uintptr_t>(p));
  if (!al || al->state == mem_state::freed) return cudaMemoryTypeUnregistered;
  return al->kind == mem_kind::device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
}

void check_device_range(const void* p, std::size_t bytes, const char* who) {
  if (bytes == 0) return;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lk(mem_lock());
  allocation* al = find_locked(a);
  if (!al || al->kind != mem_kind::device)
    fail(std::string(who) + ": " + std::to_string(bytes) + " bytes at a host address, not device memory");
  if (al->state != mem_state::live || a < al->base || a + bytes > al->base + al->bytes)
    fail(std::string(who) + ": " + std::to_string(bytes) + " bytes from " +
         describe(*al, al->state != mem_state::live ? a : (a < al->base ? a : al->base + al->bytes)));
}

}  // namespace cuda_double

// ---------------------------------------------------------------------------------------
// The runtime API.

using namespace cuda_double;

cudaError_t cudaGetLastError() {
  if (st().sticky != cudaSuccess) return st().sticky;
  return std::exchange(last_error, cudaSuccess);
}
cudaError_t cudaPeekAtLastError() { return st().sticky != cudaSuccess ? st().sticky : last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    default:
      return "an error of the CUDA host double";
  }
}

namespace {
int device_count() {
  static const int n = [] {
    const char* v = std::getenv("GRAVAC_CUDA_DOUBLE_DEVICES");
    return v ? std::atoi(v) : 8;
  }();
  return n;
}
}  // namespace

cudaError_t cudaGetDeviceCount(int* n) {
  if (!n) return checked(cudaErrorInvalidValue);
  *n = device_count();
  return device_count() > 0 ? cudaSuccess : checked(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= device_count()) return checked(cudaErrorInvalidDevice);
  current_device = d;
  return checked(cudaSuccess);
}
cudaError_t cudaGetDevice(int* d) {
  if (!d) return checked(cudaErrorInvalidValue);
  *d = current_device;
  return checked(cudaSuccess);
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  if (!v || d < 0 || d >= device_count()) return checked(cudaErrorInvalidValue);
  static const int sms = [] {
    const char* e = std::getenv("GRAVAC_CUDA_DOUBLE_SMS");
    return e ? std::atoi(e) : 4;
  }();
  switch (a) {
    case cudaDevAttrMultiProcessorCount:
      *v = sms;
      return checked(cudaSuccess);
    case cudaDevAttrMaxThreadsPerBlock:
      *v = 1024;
      return checked(cudaSuccess);
  }
  return checked(cudaErrorInvalidValue);
}
cudaError_t cudaDeviceSynchronize() {
  count_device_sync("cudaDeviceSynchronize");
  return checked(drain_all());
}

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  if (!p) return checked(cudaErrorInvalidValue);
  if (st().sticky != cudaSuccess) return st().sticky;
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  count_device_sync("cudaMalloc");  // CUDA: a device memory allocation synchronizes implicitly
  *p = map_device(bytes, true, "cudaMalloc");
  return *p ? cudaSuccess : checked(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  if (!p) return checked(cudaSuccess);
  if (st().sticky != cudaSuccess) return st().sticky;
  if (const cudaError_t e = check_free(p, mem_kind::device, "cudaFree"); e != cudaSuccess) return checked(e);
  count_device_sync("cudaFree");
  if (const cudaError_t e = drain_all(); e != cudaSuccess) return e;  // CUDA: cudaFree waits for the device
  retire(reinterpret_cast<std::uintptr_t>(p), "cudaFree");
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t h) {
  if (!p) return checked(cudaErrorInvalidValue);
  if (st().sticky != cudaSuccess) return st().sticky;
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  std::lock_guard lk(device_lock());
  CUstream_st* s = resolve_stream(h);
  *p = map_device(bytes, false, "cudaMallocAsync on " + s->name);
  if (!*p) return checked(cudaErrorMemoryAllocation);
  enqueue_locked(s, std::make_unique<alloc_op>(reinterpret_cast<std::uintptr_t>(*p)));
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t h) {
  if (!p) return checked(cudaSuccess);
  if (st().sticky != cudaSuccess) return st().sticky;
  if (const cudaError_t e = check_free(p, mem_kind::device, "cudaFreeAsync"); e != cudaSuccess) return checked(e);
  std::lock_guard lk(device_lock());
  CUstream_st* s = resolve_stream(h);
  enqueue_locked(s, std::make_unique<free_op>(reinterpret_cast<std::uintptr_t>(p), "cudaFreeAsync on " + s->name));
  return cudaSuccess;
}
namespace {
cudaError_t pinned_alloc(void** p, std::size_t bytes, const char* call) {
  if (!p) return checked(cudaErrorInvalidValue);
  if (st().sticky != cudaSuccess) return st().sticky;
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  count_device_sync(call);  // CUDA: a page-locked host allocation synchronizes implicitly
  void* m = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!m) return checked(cudaErrorMemoryAllocation);
  std::memset(m, poison, bytes);
  allocation al;
  al.base = reinterpret_cast<std::uintptr_t>(m);
  al.bytes = bytes;
  al.map = m;
  al.map_bytes = bytes;
  al.kind = mem_kind::pinned;
  al.origin = call;
  std::lock_guard lk(mem_lock());
  allocations()[al.base] = std::move(al);
  *p = m;
  return cudaSuccess;
}
}  // namespace
cudaError_t cudaMallocHost(void** p, std::size_t bytes) { return pinned_alloc(p, bytes, "cudaMallocHost"); }
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned) { return pinned_alloc(p, bytes, "cudaHostAlloc"); }
cudaError_t cudaFreeHost(void* p) {
  if (!p) return checked(cudaSuccess);
  if (st().sticky != cudaSuccess) return st().sticky;
  if (const cudaError_t e = check_free(p, mem_kind::pinned, "cudaFreeHost"); e != cudaSuccess) return checked(e);
  count_device_sync("cudaFreeHost");
  if (const cudaError_t e = drain_all(); e != cudaSuccess) return e;  // CUDA: cudaFreeHost waits for the device
  std::lock_guard lk(mem_lock());
  allocations().erase(reinterpret_cast<std::uintptr_t>(p));
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (!a) return checked(cudaErrorInvalidValue);
  if (st().sticky != cudaSuccess) return st().sticky;
  *a = {};
  a->type = memory_type(p);
  a->device = current_device;
  if (a->type == cudaMemoryTypeDevice) a->devicePointer = const_cast<void*>(p);
  if (a->type == cudaMemoryTypeHost) a->hostPointer = a->devicePointer = const_cast<void*>(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k) {
  // CUDA: a synchronous copy is a command to the legacy default stream, which waits for
  // every blocking stream, and the host waits for it.
  if (bytes != 0 && st().sticky == cudaSuccess) count_device_sync("cudaMemcpy");
  return memcpy_async(dst, src, bytes, k, cudaStreamLegacy, true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind k, cudaStream_t s) {
  return memcpy_async(dst, src, bytes, k, s, false);
}
cudaError_t cudaMemsetAsync(void* p, int v, std::size_t bytes, cudaStream_t h) {
  if (st().sticky != cudaSuccess) return st().sticky;
  if (bytes == 0) return cudaSuccess;
  if (memory_type(p) != cudaMemoryTypeDevice) return checked(cudaErrorInvalidValue);
  return enqueue(h, std::make_unique<memset_op>(p, v, bytes));
}
cudaError_t cudaMemset(void* p, int v, std::size_t bytes) {
  if (bytes != 0 && st().sticky == cudaSuccess) count_device_sync("cudaMemset");  // CUDA: a device memory set
  if (const cudaError_t e = cudaMemsetAsync(p, v, bytes, cudaStreamLegacy); e != cudaSuccess) return e;
  return synchronize_stream(cudaStreamLegacy, "cudaMemset");
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (!s) return checked(cudaErrorInvalidValue);
  if (st().sticky != cudaSuccess) return st().sticky;
  static std::atomic<int> n{0};
  const bool nb = (flags & cudaStreamNonBlocking) != 0;
  *s = reinterpret_cast<cudaStream_t>(
      make_stream(nb, false, std::string(nb ? "non-blocking" : "blocking") + " stream #" + std::to_string(n++)));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t h) {
  if (h == nullptr || h == cudaStreamLegacy || h == cudaStreamPerThread) return checked(cudaErrorInvalidResourceHandle);
  std::lock_guard lk(device_lock());
  CUstream_st* s = resolve_stream(h);
  // CUDA: queued work still completes. It runs here, now, so no operation outlives its stream.
  drive(s, s->enqueued);
  if (!s->queue.empty()) fail("cudaStreamDestroy of " + s->name + " whose queued work cannot complete: " + front_of(s));
  s->destroyed = true;
  return checked(cudaSuccess);
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return checked(synchronize_stream(s, "cudaStreamSynchronize")); }
cudaError_t cudaStreamQuery(cudaStream_t h) {
  std::lock_guard lk(device_lock());
  if (st().sticky != cudaSuccess) return st().sticky;
  CUstream_st* s = resolve_stream(h);
  drive(s, s->enqueued);
  if (st().sticky != cudaSuccess) return st().sticky;
  return s->queue.empty() ? cudaSuccess : checked(cudaErrorNotReady);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t e, unsigned) {
  if (!e || e->destroyed) return checked(cudaErrorInvalidResourceHandle);
  std::lock_guard lk(device_lock());
  if (st().sticky != cudaSuccess) return st().sticky;
  CUstream_st* s = resolve_stream(h);
  if (!e->stream) return cudaSuccess;  // never recorded: nothing to wait for, as CUDA
  enqueue_locked(s, std::make_unique<wait_op>(e->stream, e->position, "cudaStreamWaitEvent"));
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (!e) return checked(cudaErrorInvalidValue);
  if (st().sticky != cudaSuccess) return st().sticky;
  *e = new CUevent_st;
  (*e)->timing = (flags & cudaEventDisableTiming) == 0;
  // Never freed (a stale handle stays detectable), but reachable: not a leak to LSan.
  static auto* every_event = new std::vector<CUevent_st*>;
  std::lock_guard lk(device_lock());
  every_event->push_back(*e);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e || e->destroyed) return checked(cudaErrorInvalidResourceHandle);
  e->destroyed = true;  // kept: a stale handle stays detectable
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t h) {
  if (!e || e->destroyed) return checked(cudaErrorInvalidResourceHandle);
  std::lock_guard lk(device_lock());
  if (st().sticky != cudaSuccess) return st().sticky;
  CUstream_st* s = resolve_stream(h);
  auto op = std::make_unique<record_op>();
  e->when = e->timing ? std::make_shared<std::chrono::steady_clock::time_point>() : nullptr;
  op->when = e->when;
  enqueue_locked(s, std::move(op));  // on the legacy stream this also waits for the blocking streams
  e->stream = s;
  e->position = s->enqueued;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e || e->destroyed) return checked(cudaErrorInvalidResourceHandle);
  std::lock_guard lk(device_lock());
  if (st().sticky != cudaSuccess) return st().sticky;
  if (!e->stream) return cudaSuccess;
  drive(e->stream, e->position);
  return e->stream->completed >= e->position ? cudaSuccess : checked(cudaErrorNotReady);
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e || e->destroyed) return checked(cudaErrorInvalidResourceHandle);
  if (!e->stream) return cudaSuccess;
  return checked(wait_until(e->stream, e->position, "cudaEventSynchronize"));
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms || !a || !b || a->destroyed || b->destroyed) return checked(cudaErrorInvalidResourceHandle);
  if (!a->timing || !b->timing || !a->when || !b->when) return checked(cudaErrorInvalidResourceHandle);
  if (cudaEventQuery(a) != cudaSuccess || cudaEventQuery(b) != cudaSuccess) return checked(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(*b->when - *a->when).count();
  return cudaSuccess;
}
