// The host test double of NCCL (see include/nccl.h).
//
// Transport: one POSIX shared-memory segment per communicator, named in the unique id.
// Every rank (a process) maps it; it is unlinked once every rank has joined. It holds
//   - a header: the rank count, how many ranks have joined, who aborted, and per rank its
//     pid, the start time of that process (to tell a reused pid) and its state;
//   - a slot per rank for collectives: a rank posts chunk c of its collective number q into
//     its slot with a descriptor (operation, type, count, root, reduction) and the tag
//     (q, c); every rank reads chunk c of every rank, then acknowledges it; a slot is written
//     again only once every rank has acknowledged it. Collectives run in lockstep rounds
//     (round c: every rank's chunk c), so reductions run in rank order 0..n-1 on every rank;
//   - a channel per ordered pair (src, dst) for ncclSend/ncclRecv: one chunk in flight; the
//     sender posts (seq, chunk) with (count, type), the receiver checks them against its
//     ncclRecv, copies, and empties the channel. A send is complete once the receiver has
//     taken its last chunk (a rendezvous: unmatched sends outside a group deadlock here as
//     they may in NCCL).
// Only lock-free 64-bit atomics live in the segment (no process-shared mutex), so a dead
// peer never wedges a survivor; ops waiting on a peer check that its process still exists.
//
// Every NCCL call is a cuda_double::stream_op on the stream the caller named; poll() does
// what it can without blocking. Outputs are written when a call's task completes (an
// aborted or failed operation leaves its outputs untouched); buffers are checked with the
// runtime (cuda_double::check_device_range) when the operation runs.
//
// Calls are recorded per host thread and queued at the outermost ncclGroupEnd, one
// operation per communicator (outside a group, a call is a group of one). In an operation,
// collectives progress in issue order, sends and receives all together. Collectives of one
// rank complete in issue order across operations and streams; so do the messages of each
// (sender, receiver) pair. Empty collectives are dropped, as NCCL drops them; zero-count
// sends and receives are messages and must match.
//
// A blocking communicator queues in the call. A non-blocking one returns ncclInProgress and
// leaves the enqueue to its own thread, which does it when the caller polls
// ncclCommGetAsyncError the second time (the first poll says ncclInProgress): so the stream
// is resolved on that thread (cudaStreamPerThread is its per-thread stream there), and work
// the caller queues on the stream before that poll runs before the operation. Any other call
// on the communicator before then is refused with ncclInvalidArgument (sticky), as NCCL's
// ncclCommEnsureReady does. The join (ncclCommInitRankConfig) and ncclCommFinalize run on
// that thread too.
//
// Errors: a mismatch (collective descriptors, send/receive count or type) is
// ncclInvalidUsage on every rank that sees it; ncclCommAbort on any rank, or a peer whose
// process is gone or that destroyed its communicator while this rank waits for it, is
// ncclRemoteError. An operation that fails records the error first and completes on its
// next poll, so a caller that polls ncclCommGetAsyncError and the stream sees the error
// before the stream completes. Operations waiting for a peer that is alive and simply does
// not call stay pending (the caller's timeout decides). Two host threads in calls on one
// communicator at once, or a call on a destroyed one, end the process (cuda_double::fail).

#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

using u64 = std::uint64_t;
using u32 = std::uint32_t;
using u16 = std::uint16_t;
using clock_type = std::chrono::steady_clock;

static_assert(std::atomic_ref<u64>::is_always_lock_free, "the segment needs lock-free 64-bit atomics");

// ---------------------------------------------------------------------------------------
// Layout of the segment (fixed size: a sparse file, pages exist only once touched).

constexpr int kMaxRanks = 64;
constexpr std::size_t kPage = 4096;
constexpr std::size_t kSlotBytes = std::size_t{256} << 10;  // one chunk of a collective
constexpr std::size_t kChanBytes = std::size_t{128} << 10;  // one chunk of a send
constexpr u64 kChunkBits = 24;                              // tag = q << 24 | chunk
constexpr u64 kMaxChunks = u64{1} << kChunkBits;
constexpr u64 kSegMagic = 0x67726176616e6363ull;
constexpr char kIdMagic[] = "gravac-nccl-double/1 ";

enum rank_state : u64 { rank_absent = 0, rank_joined = 1, rank_destroyed = 2, rank_aborted = 3 };

struct alignas(64) rank_rec {
  u64 pid;
  u64 start;  // the process's start time (/proc/<pid>/stat field 22)
  u64 state;
};

struct seg_header {
  u64 magic;
  u64 nranks;
  u64 joined;
  u64 aborted_by;  // 0, or the aborting rank + 1
  rank_rec ranks[kMaxRanks];
};

struct alignas(64) slot_header {
  u64 tag;  // (q << 24) | chunk of what the slot holds; 0 before the first
  u64 q;
  u64 count;
  u32 kind;
  u32 dtype;
  u32 op;
  std::int32_t root;
  u64 ack[kMaxRanks];  // ack[j]: the last tag rank j has read from this slot
};

struct alignas(64) chan_header {
  u64 posted;   // tag of the chunk in the channel
  u64 taken;    // tag of the last chunk the receiver took; posted == taken: empty
  u64 refused;  // 1 once the receiver refused a send (count or type mismatch)
  u64 seq;      // the sender's message number on this channel
  u64 count;
  u64 dtype;
  u64 rseq;  // the receiver's message, written when it refuses
  u64 rcount;
  u64 rdtype;
};

constexpr std::size_t round_up(std::size_t a, std::size_t b) { return (a + b - 1) / b * b; }
constexpr std::size_t kHeaderRegion = round_up(sizeof(seg_header), kPage);
constexpr std::size_t kSlotStride = kPage + kSlotBytes;
constexpr std::size_t kChanStride = kPage + kChanBytes;
constexpr std::size_t kSegBytes =
    kHeaderRegion + kMaxRanks * kSlotStride + std::size_t{kMaxRanks} * kMaxRanks * kChanStride;
static_assert(sizeof(slot_header) <= kPage && sizeof(chan_header) <= kPage);

template <class T>
std::atomic_ref<T> at(T& x) {
  return std::atomic_ref<T>(x);
}
constexpr u64 make_tag(u64 q, u64 chunk) { return (q << kChunkBits) | chunk; }

class segment {
 public:
  segment(void* base, std::string name) : base_(static_cast<std::byte*>(base)), name_(std::move(name)) {}
  segment(const segment&) = delete;
  segment& operator=(const segment&) = delete;
  ~segment() { munmap(base_, kSegBytes); }

  seg_header& hdr() { return *reinterpret_cast<seg_header*>(base_); }
  slot_header& slot(int r) { return *reinterpret_cast<slot_header*>(base_ + kHeaderRegion + r * kSlotStride); }
  std::byte* slot_data(int r) { return base_ + kHeaderRegion + r * kSlotStride + kPage; }
  chan_header& chan(int src, int dst) { return *reinterpret_cast<chan_header*>(chan_base(src, dst)); }
  std::byte* chan_data(int src, int dst) { return chan_base(src, dst) + kPage; }
  const std::string& name() const { return name_; }
  void unlink() const { (void)shm_unlink(name_.c_str()); }  // ENOENT: another rank did

 private:
  std::byte* chan_base(int src, int dst) {
    return base_ + kHeaderRegion + kMaxRanks * kSlotStride + (std::size_t(src) * kMaxRanks + dst) * kChanStride;
  }
  std::byte* base_;
  std::string name_;
};

// ---------------------------------------------------------------------------------------
// Messages.

std::mutex g_msg_mu;
std::string g_last_error;

void warn(const std::string& msg) {
  {
    std::lock_guard<std::mutex> lk(g_msg_mu);
    g_last_error = msg;
  }
  std::fprintf(stderr, "gravac NCCL double: %s\n", msg.c_str());
  std::fflush(stderr);
}

std::string ordinal(u64 k) {
  const char* suf = "th";
  if (k % 100 < 11 || k % 100 > 13) {
    if (k % 10 == 1) suf = "st";
    if (k % 10 == 2) suf = "nd";
    if (k % 10 == 3) suf = "rd";
  }
  return std::to_string(k) + suf;
}

bool valid_type(int t) { return t >= 0 && t < ncclNumTypes; }
bool valid_op(int o) { return o >= 0 && o < ncclNumOps; }

std::size_t type_size(int t) {
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

std::string type_name(int t) {
  static const char* const names[] = {"ncclInt8",   "ncclUint8",   "ncclInt32",   "ncclUint32",  "ncclInt64",
                                      "ncclUint64", "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16"};
  return valid_type(t) ? names[t] : "datatype " + std::to_string(t);
}

std::string op_name(int o) {
  static const char* const names[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
  return valid_op(o) ? names[o] : "op " + std::to_string(o);
}

const char* result_name(int r) {
  static const char* const names[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                      "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                      "ncclRemoteError",   "ncclInProgress"};
  return r >= 0 && r < 8 ? names[r] : "unknown ncclResult_t";
}

// ---------------------------------------------------------------------------------------
// 16-bit floating point, rounded to nearest even (fp16: 5-bit exponent, 10-bit mantissa;
// bf16: 8-bit exponent, 7-bit mantissa). Every fp16 and bf16 value, every sum and every
// product of two of them, is exact in double (bf16 sums are not always, but the rounding
// in double cannot move a value across a bf16 rounding boundary), so rounding the double
// result once gives the correctly rounded 16-bit result.

template <int M, int E>
struct fmt16 {
  static constexpr int bias = (1 << (E - 1)) - 1;
  static constexpr int emin = 1 - bias;
  static constexpr u16 exp_mask = static_cast<u16>(((1 << E) - 1) << M);

  static double to_double(u16 h) {
    const int e = (h >> M) & ((1 << E) - 1);
    const int m = h & ((1 << M) - 1);
    double v;
    if (e == (1 << E) - 1)
      v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else if (e == 0)
      v = std::ldexp(static_cast<double>(m), emin - M);
    else
      v = std::ldexp(static_cast<double>(m + (1 << M)), e - bias - M);
    return (h & 0x8000u) ? -v : v;
  }

  static u16 from_double(double x) {
    if (std::isnan(x)) return 0x7fff;  // CUDA's canonical NaN
    const u16 sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    // The largest finite value is (2 - 2^-M) 2^bias; from halfway to the next binade on,
    // the value rounds to infinity.
    if (a >= std::ldexp(2.0 - std::ldexp(1.0, -(M + 1)), bias)) return sign | exp_mask;
    if (a == 0) return sign;
    int e = 0;
    (void)std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1): the binade's exponent is e - 1
    int ex = std::max(e - 1, emin);
    u64 r = static_cast<u64>(std::nearbyint(std::ldexp(a, M - ex)));         // significand in ulps, RNE
    if (ex == emin && r < (u64{1} << M)) return static_cast<u16>(sign | r);  // subnormal or zero
    if (r == (u64{1} << (M + 1))) {                                          // rounded up a binade
      r >>= 1;
      ++ex;
    }
    return static_cast<u16>(sign | ((ex + bias) << M) | (r - (u64{1} << M)));
  }
};
using fp16 = fmt16<10, 5>;
using bf16 = fmt16<7, 8>;

// ---------------------------------------------------------------------------------------
// Reductions, element by element in rank order: acc = x0; acc = op(acc, x1); ... Each
// partial result is rounded to the type (16-bit floats included). ncclAvg is NCCL's: a sum
// of inputs premultiplied by 1/n (rounded to the type) for floating types, a sum divided
// by n at the end for integers.

enum class rop { sum, prod, max, min, premul_sum, sum_postdiv };

rop device_op(int op, int dtype) {
  switch (op) {
    case ncclProd:
      return rop::prod;
    case ncclMax:
      return rop::max;
    case ncclMin:
      return rop::min;
    case ncclAvg:
      return (dtype == ncclFloat16 || dtype == ncclBfloat16 || dtype == ncclFloat32 || dtype == ncclFloat64)
                 ? rop::premul_sum
                 : rop::sum_postdiv;
    default:
      return rop::sum;
  }
}

template <class T>
T load(const std::byte* p, std::size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void store(std::byte* p, std::size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

template <class T>
struct int_arith {
  using U = std::make_unsigned_t<T>;
  static T add(T a, T b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b))); }
  static T mul(T a, T b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b))); }
  static T max(T a, T b) { return a < b ? b : a; }
  static T min(T a, T b) { return b < a ? b : a; }
};

template <class T>
struct float_arith {
  static T add(T a, T b) { return a + b; }
  static T mul(T a, T b) { return a * b; }
  static T max(T a, T b) { return std::fmax(a, b); }
  static T min(T a, T b) { return std::fmin(a, b); }
};

template <class F>
struct half_arith {
  static u16 add(u16 a, u16 b) { return F::from_double(F::to_double(a) + F::to_double(b)); }
  static u16 mul(u16 a, u16 b) { return F::from_double(F::to_double(a) * F::to_double(b)); }
  static u16 max(u16 a, u16 b) { return F::from_double(std::fmax(F::to_double(a), F::to_double(b))); }
  static u16 min(u16 a, u16 b) { return F::from_double(std::fmin(F::to_double(a), F::to_double(b))); }
};

template <class T, class Ar>
void reduce_loop(rop op, T scalar, std::byte* dst, const std::vector<const std::byte*>& src, std::size_t nelem) {
  const std::size_t n = src.size();
  for (std::size_t i = 0; i < nelem; ++i) {
    T acc = load<T>(src[0], i);
    if (op == rop::premul_sum) acc = Ar::mul(acc, scalar);
    for (std::size_t r = 1; r < n; ++r) {
      const T x = load<T>(src[r], i);
      switch (op) {
        case rop::prod:
          acc = Ar::mul(acc, x);
          break;
        case rop::max:
          acc = Ar::max(acc, x);
          break;
        case rop::min:
          acc = Ar::min(acc, x);
          break;
        case rop::premul_sum:
          acc = Ar::add(acc, Ar::mul(x, scalar));
          break;
        default:
          acc = Ar::add(acc, x);
          break;
      }
    }
    store<T>(dst, i, acc);
  }
}

template <class T>
void int_reduce(rop op, std::byte* dst, const std::vector<const std::byte*>& src, std::size_t nelem) {
  reduce_loop<T, int_arith<T>>(op, T{1}, dst, src, nelem);
}

void reduce_chunk(int dtype, rop op, int nranks, std::byte* dst, const std::vector<const std::byte*>& src,
                  std::size_t nelem) {
  const double inv = 1.0 / nranks;
  switch (dtype) {
    case ncclInt8:
      return int_reduce<std::int8_t>(op, dst, src, nelem);
    case ncclUint8:
      return int_reduce<std::uint8_t>(op, dst, src, nelem);
    case ncclInt32:
      return int_reduce<std::int32_t>(op, dst, src, nelem);
    case ncclUint32:
      return int_reduce<std::uint32_t>(op, dst, src, nelem);
    case ncclInt64:
      return int_reduce<std::int64_t>(op, dst, src, nelem);
    case ncclUint64:
      return int_reduce<std::uint64_t>(op, dst, src, nelem);
    case ncclFloat32:
      return reduce_loop<float, float_arith<float>>(op, static_cast<float>(inv), dst, src, nelem);
    case ncclFloat64:
      return reduce_loop<double, float_arith<double>>(op, inv, dst, src, nelem);
    case ncclFloat16:  // NCCL: __float2half(float(1.0 / nranks))
      return reduce_loop<u16, half_arith<fp16>>(op, fp16::from_double(static_cast<float>(inv)), dst, src, nelem);
    case ncclBfloat16:
      return reduce_loop<u16, half_arith<bf16>>(op, bf16::from_double(static_cast<float>(inv)), dst, src, nelem);
    default:
      return;
  }
}

template <class T>
void divide_loop(std::byte* p, std::size_t nelem, int n) {
  for (std::size_t i = 0; i < nelem; ++i) store<T>(p, i, static_cast<T>(load<T>(p, i) / static_cast<T>(n)));
}

// ncclAvg on integers: the sum divided by n (truncated toward zero).
void post_divide(int dtype, std::byte* p, std::size_t nelem, int n) {
  switch (dtype) {
    case ncclInt8:
      return divide_loop<std::int8_t>(p, nelem, n);
    case ncclUint8:
      return divide_loop<std::uint8_t>(p, nelem, n);
    case ncclInt32:
      return divide_loop<std::int32_t>(p, nelem, n);
    case ncclUint32:
      return divide_loop<std::uint32_t>(p, nelem, n);
    case ncclInt64:
      return divide_loop<std::int64_t>(p, nelem, n);
    case ncclUint64:
      return divide_loop<std::uint64_t>(p, nelem, n);
    default:
      return;
  }
}

// ---------------------------------------------------------------------------------------
// Processes.

// The start time of process \p pid (0 when unreadable) and its state letter.
u64 process_start(pid_t pid, char* state = nullptr) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  char buf[1024];
  const std::size_t got = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[got] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (!p) return 0;
  ++p;
  // Fields after the name: 3 state, 4 ppid, ... 22 starttime.
  int field = 2;
  const char* tok = p;
  u64 start = 0;
  while (*tok) {
    while (*tok == ' ') ++tok;
    if (!*tok) break;
    ++field;
    if (field == 3 && state) *state = *tok;
    if (field == 22) {
      start = std::strtoull(tok, nullptr, 10);
      break;
    }
    while (*tok && *tok != ' ') ++tok;
  }
  return start;
}

// True when the process that joined as \p pid (started at \p start) no longer runs: gone,
// a zombie, or its pid reused by another process.
bool process_gone(u64 pid, u64 start) {
  if (pid == 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH) return true;
  char state = '?';
  const u64 now = process_start(static_cast<pid_t>(pid), &state);
  if (now == 0) return kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH;
  return state == 'Z' || state == 'X' || (start != 0 && now != start);
}

// ---------------------------------------------------------------------------------------
// Communicator state shared by the handle and the operations it queued (operations may
// outlive the handle: they keep the mapping).

enum class kind : u32 { none = 0, allreduce = 1, broadcast, reduce, allgather, reducescatter, send, recv };

const char* kind_name(u32 k) {
  switch (static_cast<kind>(k)) {
    case kind::allreduce:
      return "ncclAllReduce";
    case kind::broadcast:
      return "ncclBroadcast";
    case kind::reduce:
      return "ncclReduce";
    case kind::allgather:
      return "ncclAllGather";
    case kind::reducescatter:
      return "ncclReduceScatter";
    case kind::send:
      return "ncclSend";
    case kind::recv:
      return "ncclRecv";
    default:
      return "(nothing)";
  }
}

bool is_collective(kind k) { return k != kind::send && k != kind::recv; }
bool has_root(u32 k) { return k == u32(kind::broadcast) || k == u32(kind::reduce); }
bool has_op(u32 k) { return k == u32(kind::allreduce) || k == u32(kind::reduce) || k == u32(kind::reducescatter); }

// What a collective is, for messages: "ncclBroadcast(37 x ncclInt8 = 37 bytes, root 1)".
std::string describe(u32 k, u64 count, u32 dtype, u32 op, int root) {
  std::string s = std::string(kind_name(k)) + "(" + std::to_string(count) + " x " + type_name(int(dtype));
  if (valid_type(int(dtype))) s += " = " + std::to_string(count * type_size(int(dtype))) + " bytes";
  if (k == u32(kind::allgather) || k == u32(kind::reducescatter)) s += " per rank";
  if (has_op(k)) s += ", " + op_name(int(op));
  if (has_root(k)) s += ", root " + std::to_string(root);
  return s + ")";
}

struct comm_state {
  std::unique_ptr<segment> seg;
  int rank = 0;
  int n = 1;
  bool blocking = true;

  std::mutex mu;      // guards the counters and pending
  u64 next_q = 0;     // collectives issued (numbered from 1)
  u64 coll_done = 0;  // collectives complete, in order
  std::vector<u64> next_send, next_recv, send_done, recv_done;
  std::map<cudaStream_t, int> pending;  // operations queued and not complete, per stream

  std::atomic<int> error{ncclSuccess};
  std::atomic<bool> local_abort{false};
  std::mutex msg_mu;
  std::string last_error;

  seg_header& hdr() { return seg->hdr(); }
  std::string who() const { return "rank " + std::to_string(rank) + " of " + std::to_string(n); }

  // Records the communicator's first asynchronous error (later ones are not reported).
  void set_error(ncclResult_t e, const std::string& msg) {
    int expected = ncclSuccess;
    if (!error.compare_exchange_strong(expected, e)) return;
    const std::string m = who() + ": " + msg + " [" + result_name(e) + "]";
    {
      std::lock_guard<std::mutex> lk(msg_mu);
      last_error = m;
    }
    warn(m);
  }

  // Sets the error of a peer's ncclCommAbort; true when the communicator was aborted.
  bool check_remote_abort() {
    const u64 by = at(hdr().aborted_by).load(std::memory_order_acquire);
    if (by == 0) return false;
    if (static_cast<int>(by) - 1 != rank)
      set_error(ncclRemoteError, "the communicator was aborted by rank " + std::to_string(by - 1) + " (ncclCommAbort)");
    return true;
  }

  // Why rank \p r can no longer take part ("" when it can, as far as this rank can tell).
  std::string peer_gone(int r) {
    rank_rec& rr = hdr().ranks[r];
    const u64 st = at(rr.state).load(std::memory_order_acquire);
    if (st == rank_destroyed) return "rank " + std::to_string(r) + " has destroyed its communicator";
    if (st == rank_aborted) return "rank " + std::to_string(r) + " has aborted its communicator";
    const u64 pid = at(rr.pid).load(std::memory_order_acquire);
    if (pid && process_gone(pid, at(rr.start).load(std::memory_order_acquire)))
      return "rank " + std::to_string(r) + "'s process (pid " + std::to_string(pid) + ") has exited";
    return {};
  }
};

// ---------------------------------------------------------------------------------------
// One recorded NCCL call and the stream_op that runs the calls of one group on one
// communicator.

struct call_rec {
  kind k = kind::none;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  int dtype = 0;
  int op = 0;
  int root = 0;  // the root, or the peer of a send or receive
  cudaStream_t stream = nullptr;
  ncclComm* comm = nullptr;
};

struct coll_task {
  call_rec c;
  u64 q = 0;
  bool started = false;
  bool posted = false;  // this round's chunk of this rank is in its slot
  bool done = false;
  u64 round = 0;
  u64 rounds = 0;
  std::vector<u64> bytes_of;   // what each rank posts
  std::vector<u64> chunks_of;  // in how many chunks
  std::vector<std::byte> temp;
};

struct p2p_task {
  call_rec c;
  u64 seq = 0;
  bool started = false;
  bool done = false;
  u64 bytes = 0;
  u64 chunks = 0;
  u64 k = 0;  // chunks posted (send) or taken (receive)
  std::vector<std::byte> temp;
};

// Checks, when an operation runs, that [p, p + bytes) is memory the GPU can reach: live
// device memory in stream order (the runtime fail()s otherwise, naming the allocation), or
// pinned host memory.
void check_range(const void* p, u64 bytes, const call_rec& c, const char* which, const comm_state& s) {
  if (bytes == 0 || cuda_double::memory_type(p) == cudaMemoryTypeHost) return;
  const std::string who = std::string(kind_name(u32(c.k))) + "'s " + which + " (NCCL " + s.who() + ")";
  cuda_double::check_device_range(p, std::size_t(bytes), who.c_str());
}

u64 chunks_for(u64 bytes, std::size_t chunk) { return std::max<u64>(1, (bytes + chunk - 1) / chunk); }

class nccl_op final : public cuda_double::stream_op {
 public:
  explicit nccl_op(std::shared_ptr<comm_state> s) : s_(std::move(s)) {}
  ~nccl_op() override { detach(); }

  void add(const call_rec& c, u64 number) {
    if (is_collective(c.k)) {
      coll_task t;
      t.c = c;
      t.q = number;
      colls_.push_back(std::move(t));
    } else {
      p2p_task t;
      t.c = c;
      t.seq = number;
      p2ps_.push_back(std::move(t));
    }
  }

  // Counts this operation as pending on \p resolved (what finalize waits for).
  void attach(cudaStream_t resolved) {
    std::lock_guard<std::mutex> lk(s_->mu);
    stream_ = resolved;
    ++s_->pending[resolved];
    attached_ = true;
  }

  // Completes with an error in two polls: the poll that finds the error records it (so
  // ncclCommGetAsyncError reports it while the stream is still busy, as NCCL's kernels stay
  // until the communicator is aborted), the next one completes the op, output untouched.
  bool poll() override {
    if (finished_) return true;
    comm_state& c = *s_;
    if (failed_now()) return finish();
    int r = advance();
    if (r != 0) return r > 0 ? finish() : false;
    // Stuck. A peer's abort ends it (checked after progress, so that what this rank can
    // still finish or detect, a mismatch included, comes first); so does a peer that is
    // gone (checked at most every 20 ms).
    if (c.check_remote_abort()) return false;
    const u64 peers = waiting_on_.load(std::memory_order_relaxed);
    if (peers && clock_type::now() - last_check_ > std::chrono::milliseconds(20)) {
      last_check_ = clock_type::now();
      for (int p = 0; p < c.n; ++p) {
        if (!(peers >> p & 1)) continue;
        const std::string gone = c.peer_gone(p);
        if (gone.empty()) continue;
        // What the peer wrote before it left is visible now: one more pass first.
        r = advance();
        if (r != 0) return r > 0 ? finish() : false;
        if (!(waiting_on_.load(std::memory_order_relaxed) >> p & 1)) continue;
        // A peer that aborted and then exited between the abort check above and this one:
        // its abort, marked before it exited, is the reason to report.
        if (c.check_remote_abort()) return false;
        c.set_error(ncclRemoteError, gone + " while " + what() + " waits for it");
        return false;
      }
    }
    return false;
  }

  std::string what() const override {
    std::string s;
    const std::size_t total = colls_.size() + p2ps_.size();
    if (total > 1) s = "NCCL group of " + std::to_string(total) + " calls: ";
    std::size_t listed = 0;
    for (const auto& t : colls_) {
      if (listed++ == 4) break;
      if (listed > 1) s += ", ";
      s += describe(u32(t.c.k), t.c.count, u32(t.c.dtype), u32(t.c.op), t.c.root) + " #" + std::to_string(t.q);
    }
    for (const auto& t : p2ps_) {
      if (listed++ >= 4) break;
      if (listed > 1) s += ", ";
      s += std::string(kind_name(u32(t.c.k))) + "(" + std::to_string(t.c.count) + " x " + type_name(t.c.dtype) +
           (t.c.k == kind::send ? ", to rank " : ", from rank ") + std::to_string(t.c.root) + ")";
    }
    if (listed > 4) s += ", ...";
    s += " on NCCL " + s_->who();
    const u64 peers = waiting_on_.load(std::memory_order_relaxed);
    for (int p = 0, k = 0; p < kMaxRanks; ++p)
      if (peers >> p & 1) s += (k++ ? ", " : ", waiting for rank ") + std::to_string(p);
    if (waiting_local_.load(std::memory_order_relaxed))
      s += ", waiting for an earlier NCCL operation of this rank (queued on another stream) to complete";
    return s;
  }

 private:
  // Progresses every task as far as it goes: 1 when all are complete, 0 when stuck, -1 on
  // an error (recorded in the communicator).
  int advance() {
    for (bool progress = true; progress;) {
      progress = false;
      waiting_on_.store(0, std::memory_order_relaxed);  // what the last, stuck pass waits for
      waiting_local_.store(false, std::memory_order_relaxed);
      if (next_coll_ < colls_.size()) {
        const int r = step(colls_[next_coll_]);
        if (r < 0) return -1;
        if (colls_[next_coll_].done) ++next_coll_;
        progress = progress || r > 0;
      }
      for (auto& t : p2ps_) {
        if (t.done) continue;
        const int r = t.c.k == kind::send ? step_send(t) : step_recv(t);
        if (r < 0) return -1;
        progress = progress || r > 0;
      }
    }
    bool all = next_coll_ == colls_.size();
    for (const auto& t : p2ps_) all = all && t.done;
    return all ? 1 : 0;
  }

  void wait_for(int peer) { waiting_on_.fetch_or(u64{1} << peer, std::memory_order_relaxed); }

  bool failed_now() {
    comm_state& c = *s_;
    return c.local_abort.load(std::memory_order_acquire) || c.error.load(std::memory_order_acquire) != ncclSuccess;
  }

  bool finish() {
    finished_ = true;
    detach();
    return true;
  }

  void detach() {
    if (!attached_) return;
    attached_ = false;
    std::lock_guard<std::mutex> lk(s_->mu);
    auto it = s_->pending.find(stream_);
    if (it != s_->pending.end() && --it->second <= 0) s_->pending.erase(it);
  }

  // ---- collectives: 1 progress, 0 none, -1 failed (the error is set)

  int step(coll_task& t) {
    comm_state& c = *s_;
    segment& seg = *c.seg;
    const int n = c.n, me = c.rank;
    const std::size_t ts = type_size(t.c.dtype);
    if (!t.started) {
      {
        std::lock_guard<std::mutex> lk(c.mu);
        if (c.coll_done != t.q - 1) {
          waiting_local_.store(true, std::memory_order_relaxed);
          return 0;
        }
      }
      t.started = true;
      t.bytes_of.assign(std::size_t(n), 0);
      t.chunks_of.assign(std::size_t(n), 0);
      const u64 b = u64(t.c.count) * ts;
      for (int r = 0; r < n; ++r) {
        u64 mine = b;
        if (t.c.k == kind::broadcast && r != t.c.root) mine = 0;
        if (t.c.k == kind::reducescatter) mine = b * u64(n);
        t.bytes_of[r] = mine;
        t.chunks_of[r] = chunks_for(mine, kSlotBytes);
        t.rounds = std::max(t.rounds, t.chunks_of[r]);
      }
      std::size_t out = 0;
      switch (t.c.k) {
        case kind::allreduce:
        case kind::reducescatter:
          out = b;
          break;
        case kind::reduce:
          out = me == t.c.root ? b : 0;
          break;
        case kind::broadcast:
          out = me == t.c.root ? 0 : b;
          break;
        case kind::allgather:
          out = b * u64(n);
          break;
        default:
          break;
      }
      t.temp.assign(out, std::byte{0});
      check_range(t.c.send, t.bytes_of[me], t.c, "sendbuff", c);
      check_range(t.c.recv, recv_bytes(t), t.c, "recvbuff", c);
    }
    int progress = 0;
    while (t.round < t.rounds) {
      const u64 rc = t.round, tag = make_tag(t.q, rc);
      if (!t.posted) {
        if (rc < t.chunks_of[me]) {
          slot_header& sh = seg.slot(me);
          const u64 cur = at(sh.tag).load(std::memory_order_acquire);
          for (int j = 0; j < n; ++j)
            if (at(sh.ack[j]).load(std::memory_order_acquire) < cur) {
              wait_for(j);
              return progress;
            }
          sh.q = t.q;
          sh.count = t.c.count;
          sh.kind = u32(t.c.k);
          sh.dtype = u32(t.c.dtype);
          sh.op = u32(t.c.op);
          sh.root = t.c.root;
          const u64 off = rc * kSlotBytes;
          const u64 len = std::min<u64>(kSlotBytes, t.bytes_of[me] - off);
          const std::byte* from = static_cast<const std::byte*>(t.c.send) + off;
          if (rc) check_range(from, len, t.c, "sendbuff", c);  // still there (round 0: checked at the start)
          if (len) std::memcpy(seg.slot_data(me), from, len);
          at(sh.tag).store(tag, std::memory_order_release);
          progress = 1;
        }
        t.posted = true;
      }
      for (int r = 0; r < n; ++r)
        if (rc < t.chunks_of[r] && at(seg.slot(r).tag).load(std::memory_order_acquire) != tag) {
          wait_for(r);
          return progress;
        }
      if (rc == 0 && !descriptors_agree(t)) return -1;
      process_round(t, rc);
      for (int r = 0; r < n; ++r)
        if (rc < t.chunks_of[r]) at(seg.slot(r).ack[me]).store(tag, std::memory_order_release);
      ++t.round;
      t.posted = false;
      progress = 1;
    }
    commit(t);
    {
      std::lock_guard<std::mutex> lk(c.mu);
      c.coll_done = t.q;
    }
    t.done = true;
    t.temp.clear();
    t.temp.shrink_to_fit();
    return 1;
  }

  bool descriptors_agree(const coll_task& t) {
    comm_state& c = *s_;
    segment& seg = *c.seg;
    const u32 k = u32(t.c.k);
    bool agree = true;
    for (int r = 0; r < c.n && agree; ++r) {
      const slot_header& sh = seg.slot(r);
      agree = sh.q == t.q && sh.kind == k && sh.dtype == u32(t.c.dtype) && sh.count == t.c.count &&
              (!has_root(k) || sh.root == t.c.root) && (!has_op(k) || sh.op == u32(t.c.op));
    }
    if (agree) return true;
    std::string msg = "the " + ordinal(t.q) + " collective on this communicator does not match across ranks: ";
    for (int r = 0; r < c.n; ++r) {
      if (r == 8 && c.n > 9) {
        msg += ", ...";
        break;
      }
      const slot_header& sh = seg.slot(r);
      if (r) msg += ", ";
      msg += "rank " + std::to_string(r) + "'s is " + describe(sh.kind, sh.count, sh.dtype, sh.op, sh.root);
    }
    c.set_error(ncclInvalidUsage, msg);
    return false;
  }

  void process_round(coll_task& t, u64 rc) {
    comm_state& c = *s_;
    segment& seg = *c.seg;
    const int n = c.n, me = c.rank;
    const std::size_t ts = type_size(t.c.dtype);
    const u64 off = rc * kSlotBytes;
    std::vector<const std::byte*> src(std::size_t(n), nullptr);
    for (int r = 0; r < n; ++r) src[r] = seg.slot_data(r);
    switch (t.c.k) {
      case kind::allreduce:
      case kind::reduce: {
        if (t.c.k == kind::reduce && me != t.c.root) return;
        const u64 len = std::min<u64>(kSlotBytes, t.bytes_of[me] - off);
        reduce_chunk(t.c.dtype, device_op(t.c.op, t.c.dtype), n, t.temp.data() + off, src, len / ts);
        return;
      }
      case kind::broadcast: {
        if (me == t.c.root) return;
        const u64 len = std::min<u64>(kSlotBytes, t.bytes_of[t.c.root] - off);
        if (len) std::memcpy(t.temp.data() + off, src[t.c.root], len);
        return;
      }
      case kind::allgather: {
        const u64 b = t.bytes_of[0];
        const u64 len = std::min<u64>(kSlotBytes, b - off);
        for (int r = 0; r < n; ++r)
          if (len) std::memcpy(t.temp.data() + u64(r) * b + off, src[r], len);
        return;
      }
      case kind::reducescatter: {
        // This chunk covers [off, off + len) of every rank's n blocks; this rank reduces
        // the part of its own block inside it.
        const u64 blk = u64(t.c.count) * ts;
        const u64 len = std::min<u64>(kSlotBytes, t.bytes_of[me] - off);
        const u64 lo = std::max(off, u64(me) * blk), hi = std::min(off + len, u64(me + 1) * blk);
        if (lo >= hi) return;
        for (auto& p : src) p += lo - off;
        reduce_chunk(t.c.dtype, device_op(t.c.op, t.c.dtype), n, t.temp.data() + (lo - u64(me) * blk), src,
                     (hi - lo) / ts);
        return;
      }
      default:
        return;
    }
  }

  // What the collective writes on this rank.
  u64 recv_bytes(const coll_task& t) const {
    const comm_state& c = *s_;
    const u64 b = u64(t.c.count) * type_size(t.c.dtype);
    switch (t.c.k) {
      case kind::reduce:
        return c.rank == t.c.root ? b : 0;
      case kind::allgather:
        return b * u64(c.n);
      default:
        return b;
    }
  }

  void commit(coll_task& t) {
    comm_state& c = *s_;
    const int me = c.rank;
    const std::size_t ts = type_size(t.c.dtype);
    const u64 b = u64(t.c.count) * ts;
    check_range(t.c.recv, recv_bytes(t), t.c, "recvbuff", c);
    if (t.c.k == kind::broadcast && me == t.c.root) {
      if (b && t.c.recv != t.c.send) std::memmove(t.c.recv, t.c.send, b);
      return;
    }
    if (t.temp.empty()) return;  // a non-root of ncclReduce
    if (device_op(t.c.op, t.c.dtype) == rop::sum_postdiv && has_op(u32(t.c.k)))
      post_divide(t.c.dtype, t.temp.data(), t.temp.size() / ts, c.n);
    std::memcpy(t.c.recv, t.temp.data(), t.temp.size());
  }

  // ---- point to point

  int step_send(p2p_task& t) {
    comm_state& c = *s_;
    const int peer = t.c.root;
    if (!t.started) {
      {
        std::lock_guard<std::mutex> lk(c.mu);
        if (c.send_done[peer] != t.seq - 1) {
          waiting_local_.store(true, std::memory_order_relaxed);
          return 0;
        }
      }
      t.started = true;
      t.bytes = u64(t.c.count) * type_size(t.c.dtype);
      t.chunks = chunks_for(t.bytes, kChanBytes);
      check_range(t.c.send, t.bytes, t.c, "sendbuff", c);
    }
    chan_header& ch = c.seg->chan(c.rank, peer);
    int progress = 0;
    while (t.k < t.chunks) {
      if (at(ch.refused).load(std::memory_order_acquire)) return refused(t, ch);
      if (at(ch.posted).load(std::memory_order_acquire) != at(ch.taken).load(std::memory_order_acquire)) {
        wait_for(peer);
        return progress;
      }
      ch.seq = t.seq;
      ch.count = t.c.count;
      ch.dtype = u64(t.c.dtype);
      const u64 off = t.k * kChanBytes, len = std::min<u64>(kChanBytes, t.bytes - off);
      const std::byte* from = static_cast<const std::byte*>(t.c.send) + off;
      if (t.k) check_range(from, len, t.c, "sendbuff", c);
      if (len) std::memcpy(c.seg->chan_data(c.rank, peer), from, len);
      at(ch.posted).store(make_tag(t.seq, t.k), std::memory_order_release);
      ++t.k;
      progress = 1;
    }
    // Complete once the receiver has taken the last chunk (or refused the message).
    if (at(ch.refused).load(std::memory_order_acquire)) return refused(t, ch);
    if (at(ch.taken).load(std::memory_order_acquire) != make_tag(t.seq, t.chunks - 1)) {
      wait_for(peer);
      return progress;
    }
    {
      std::lock_guard<std::mutex> lk(c.mu);
      c.send_done[peer] = t.seq;
    }
    t.done = true;
    return 1;
  }

  int refused(const p2p_task& t, chan_header& ch) {
    comm_state& c = *s_;
    const int peer = t.c.root;
    c.set_error(ncclInvalidUsage, "the " + ordinal(t.seq) + " ncclSend from rank " + std::to_string(c.rank) +
                                      " to rank " + std::to_string(peer) + " (" + std::to_string(t.c.count) + " x " +
                                      type_name(t.c.dtype) + ") does not match rank " + std::to_string(peer) + "'s " +
                                      ordinal(at(ch.rseq).load(std::memory_order_acquire)) + " ncclRecv from rank " +
                                      std::to_string(c.rank) + " (" + std::to_string(ch.rcount) + " x " +
                                      type_name(int(ch.rdtype)) + ")");
    return -1;
  }

  int step_recv(p2p_task& t) {
    comm_state& c = *s_;
    const int peer = t.c.root;
    if (!t.started) {
      {
        std::lock_guard<std::mutex> lk(c.mu);
        if (c.recv_done[peer] != t.seq - 1) {
          waiting_local_.store(true, std::memory_order_relaxed);
          return 0;
        }
      }
      t.started = true;
      t.bytes = u64(t.c.count) * type_size(t.c.dtype);
      t.chunks = chunks_for(t.bytes, kChanBytes);
      t.temp.assign(t.bytes, std::byte{0});
      check_range(t.c.recv, t.bytes, t.c, "recvbuff", c);
    }
    chan_header& ch = c.seg->chan(peer, c.rank);
    int progress = 0;
    while (t.k < t.chunks) {
      const u64 tag = make_tag(t.seq, t.k);
      if (at(ch.posted).load(std::memory_order_acquire) != tag) {
        wait_for(peer);
        return progress;
      }
      if (t.k == 0 && (ch.seq != t.seq || ch.count != t.c.count || ch.dtype != u64(t.c.dtype))) {
        ch.rcount = t.c.count;
        ch.rdtype = u64(t.c.dtype);
        at(ch.rseq).store(t.seq, std::memory_order_relaxed);
        at(ch.refused).store(1, std::memory_order_release);
        c.set_error(ncclInvalidUsage, "the " + ordinal(t.seq) + " ncclRecv of rank " + std::to_string(c.rank) +
                                          " from rank " + std::to_string(peer) + " (" + std::to_string(t.c.count) +
                                          " x " + type_name(t.c.dtype) + ") does not match rank " +
                                          std::to_string(peer) + "'s " + ordinal(ch.seq) + " ncclSend to rank " +
                                          std::to_string(c.rank) + " (" + std::to_string(ch.count) + " x " +
                                          type_name(int(ch.dtype)) + ")");
        return -1;
      }
      const u64 off = t.k * kChanBytes, len = std::min<u64>(kChanBytes, t.bytes - off);
      if (len) std::memcpy(t.temp.data() + off, c.seg->chan_data(peer, c.rank), len);
      at(ch.taken).store(tag, std::memory_order_release);
      ++t.k;
      progress = 1;
    }
    check_range(t.c.recv, t.bytes, t.c, "recvbuff", c);
    if (t.bytes) std::memcpy(t.c.recv, t.temp.data(), t.bytes);
    t.temp.clear();
    t.temp.shrink_to_fit();
    {
      std::lock_guard<std::mutex> lk(c.mu);
      c.recv_done[peer] = t.seq;
    }
    t.done = true;
    return 1;
  }

  std::shared_ptr<comm_state> s_;
  std::vector<coll_task> colls_;
  std::vector<p2p_task> p2ps_;
  std::size_t next_coll_ = 0;
  bool finished_ = false;
  bool attached_ = false;
  cudaStream_t stream_ = nullptr;
  std::atomic<u64> waiting_on_{0};  // the ranks it waits for (a bit each)
  std::atomic<bool> waiting_local_{false};
  clock_type::time_point last_check_{};
};

// ---------------------------------------------------------------------------------------
// The communicator's own thread (non-blocking communicators): it finishes the join and
// finalize, and queues the operations of non-blocking calls, as NCCL does on its thread.

class worker {
 public:
  worker() = default;
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;
  ~worker() { shutdown(); }

  void start() {
    thread_ = std::thread([this] { run(); });
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  // Runs \p job on the worker and waits for it.
  void run_sync(std::function<void()> job) {
    std::promise<void> done;
    auto f = done.get_future();
    post([&] {
      job();
      done.set_value();
    });
    f.wait();
  }
  void shutdown() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, nothing left (queued jobs still run)
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
};

enum class phase { joining, ready, deferred, enqueuing, finalizing, finalized };

std::atomic<u64> g_thread_tokens{0};
u64 thread_token() {
  thread_local const u64 token = ++g_thread_tokens;
  return token;
}

}  // namespace

// The communicator handle.
struct ncclComm {
  std::shared_ptr<comm_state> s;
  std::atomic<u64> owner{0};  // the thread inside a call (or an open group) on it
  std::atomic<const char*> owner_what{""};
  std::mutex mu;  // ph, deferred, deferred_polls, finalize_called
  phase ph = phase::ready;
  std::vector<std::pair<cudaStream_t, std::unique_ptr<nccl_op>>> deferred;
  int deferred_polls = 0;
  bool finalize_called = false;
  std::atomic<bool> job_done{false};
  std::atomic<int> job_result{ncclSuccess};
  worker w;
};

namespace {

std::mutex g_comms_mu;
std::unordered_set<ncclComm*> g_comms;

void check_handle(ncclComm* h, const char* fn) {
  std::lock_guard<std::mutex> lk(g_comms_mu);
  if (!g_comms.count(h))
    cuda_double::fail(std::string(fn) + " on a communicator that was destroyed, aborted or never created");
}

// One host thread at a time per communicator (NCCL's rule): the caller takes ownership for
// the call, or until the outermost ncclGroupEnd when inside a group.
void acquire(ncclComm* h, const char* fn) {
  const u64 me = thread_token();
  u64 cur = 0;
  if (h->owner.compare_exchange_strong(cur, me)) {
    h->owner_what.store(fn);
    return;
  }
  if (cur == me) return;
  cuda_double::fail(std::string(fn) + " on NCCL " + h->s->who() +
                    " while another host thread is inside a call on it (" + h->owner_what.load() +
                    ", or a group it has not ended yet): NCCL allows one thread per communicator at a time");
}
void release(ncclComm* h) { h->owner.store(0); }

// Waits until every rank has joined (on the caller's thread for a blocking communicator,
// on the communicator's thread otherwise).
ncclResult_t join_wait(comm_state& c) {
  seg_header& hd = c.hdr();
  auto last = clock_type::now();
  for (;;) {
    if (c.local_abort.load()) return ncclInvalidUsage;
    if (at(hd.aborted_by).load(std::memory_order_acquire)) {
      c.check_remote_abort();
      return ncclRemoteError;
    }
    if (at(hd.joined).load(std::memory_order_acquire) >= u64(c.n)) {
      c.seg->unlink();
      return ncclSuccess;
    }
    if (clock_type::now() - last > std::chrono::milliseconds(50)) {
      last = clock_type::now();
      for (int r = 0; r < c.n; ++r) {
        if (r == c.rank) continue;
        const std::string gone = c.peer_gone(r);
        if (!gone.empty()) {
          if (!c.check_remote_abort())  // an abort marked before the peer left is the reason
            c.set_error(ncclRemoteError, gone + " while this rank joins the communicator (ncclCommInitRank)");
          return ncclRemoteError;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Waits for every operation this rank queued on the communicator, running their streams
// (NCCL's finalize waits for its kernels; here a host wait is what runs them).
ncclResult_t drain_pending(comm_state& c, const char* why) {
  for (;;) {
    if (c.local_abort.load()) return ncclSuccess;
    std::vector<cudaStream_t> streams;
    {
      std::lock_guard<std::mutex> lk(c.mu);
      for (const auto& [st, k] : c.pending) streams.push_back(st);
    }
    if (streams.empty()) return ncclSuccess;
    for (cudaStream_t st : streams) {
      const cudaError_t e = cuda_double::synchronize_stream(st, why);
      if (e != cudaSuccess) {
        c.set_error(ncclUnhandledCudaError, std::string(why) +
                                                ": waiting for this rank's NCCL operations failed with CUDA error " +
                                                std::to_string(int(e)));
        return ncclUnhandledCudaError;
      }
    }
  }
}

// Queues \p op on \p stream as resolved on the calling thread.
ncclResult_t queue_op(comm_state& c, cudaStream_t stream, std::unique_ptr<nccl_op> op) {
  const std::string what = op->what();
  op->attach(cuda_double::resolve(stream));
  const cudaError_t e = cuda_double::enqueue(stream, std::move(op));
  if (e == cudaSuccess) return ncclSuccess;
  c.set_error(ncclUnhandledCudaError,
              "queueing " + what + " failed with CUDA error " + std::to_string(int(e)) + " (a sticky error?)");
  return ncclUnhandledCudaError;
}

std::atomic<bool> g_per_thread_note{false};

// The enqueue a non-blocking call leaves to the communicator's thread: a per-thread stream
// named by the caller is that thread's own per-thread stream there (NVIDIA/nccl#1976).
void queue_deferred(ncclComm* h, std::vector<std::pair<cudaStream_t, std::unique_ptr<nccl_op>>> list) {
  comm_state& c = *h->s;
  h->w.run_sync([&] {
    for (auto& [st, op] : list) {
      if (st == cudaStreamPerThread && !g_per_thread_note.exchange(true))
        warn("note: " + op->what() +
             " names cudaStreamPerThread on a non-blocking communicator: NCCL queues it from its own thread, so it "
             "goes to that thread's per-thread stream, not the caller's (NVIDIA/nccl#1976)");
      if (c.error.load() != ncclSuccess || c.local_abort.load()) continue;
      (void)queue_op(c, st, std::move(op));
    }
  });
}

// NCCL's ncclCommEnsureReady: a call on a communicator that has failed returns its error;
// one whose last non-blocking call is still in progress is refused.
ncclResult_t ensure_ready(ncclComm* h, const char* fn, bool sticky, bool finalized_ok = false) {
  comm_state& c = *h->s;
  c.check_remote_abort();
  if (const int e = c.error.load(); e != ncclSuccess) return ncclResult_t(e);
  std::lock_guard<std::mutex> lk(h->mu);
  if (h->ph == phase::ready || (finalized_ok && h->ph == phase::finalized)) return ncclSuccess;
  if (h->ph == phase::finalized) {
    warn(c.who() + ": " + fn + " on a communicator that was finalized (ncclCommFinalize)");
    return ncclInvalidUsage;
  }
  const std::string msg = std::string(fn) +
                          ": Attempt to use communicator before the previous operation returned ncclSuccess "
                          "(poll ncclCommGetAsyncError until it is no longer ncclInProgress)";
  if (sticky && !c.blocking)
    c.set_error(ncclInvalidArgument, msg);
  else
    warn(c.who() + ": " + msg);
  return ncclInvalidArgument;
}

// ---------------------------------------------------------------------------------------
// Groups (per host thread, as in NCCL).

struct group_state {
  int depth = 0;
  ncclResult_t error = ncclSuccess;
  std::vector<call_rec> calls;
  std::vector<ncclComm*> comms;  // owned by this thread until the group ends
};
thread_local group_state g_group;

ncclResult_t group_end() {
  group_state g = std::move(g_group);
  g_group = group_state{};
  if (g.error != ncclSuccess) {
    for (ncclComm* h : g.comms) release(h);
    return g.error;
  }
  ncclResult_t ret = ncclSuccess;
  bool in_progress = false;
  for (ncclComm* h : g.comms) {
    comm_state& c = *h->s;
    std::vector<const call_rec*> mine;
    for (const auto& rec : g.calls)
      if (rec.comm == h) mine.push_back(&rec);
    if (mine.empty()) {
      release(h);
      continue;
    }
    const cudaStream_t stream = mine.front()->stream;
    bool one_stream = true;
    for (const call_rec* rec : mine) one_stream = one_stream && rec->stream == stream;
    if (!one_stream) {
      const std::string msg =
          "ncclGroupEnd: the group names several streams for one communicator; NCCL would join them, the double "
          "does not model that: use one stream per communicator in a group";
      if (!c.blocking)
        c.set_error(ncclInvalidUsage, msg);
      else
        warn(c.who() + ": " + msg);
      ret = ncclInvalidUsage;
      release(h);
      continue;
    }
    auto op = std::make_unique<nccl_op>(h->s);
    {
      std::lock_guard<std::mutex> lk(c.mu);
      for (const call_rec* rec : mine) {
        u64 number = 0;
        if (is_collective(rec->k))
          number = ++c.next_q;
        else if (rec->k == kind::send)
          number = ++c.next_send[rec->root];
        else
          number = ++c.next_recv[rec->root];
        op->add(*rec, number);
      }
    }
    if (c.blocking) {
      const ncclResult_t e = queue_op(c, stream, std::move(op));
      if (e != ncclSuccess && ret == ncclSuccess) ret = e;
    } else {
      std::lock_guard<std::mutex> lk(h->mu);
      h->deferred.emplace_back(stream, std::move(op));
      h->ph = phase::deferred;
      h->deferred_polls = 0;
      in_progress = true;
    }
    release(h);
  }
  if (ret != ncclSuccess) return ret;
  return in_progress ? ncclInProgress : ncclSuccess;
}

ncclResult_t arg_error(ncclComm* h, const std::string& msg) {
  comm_state& c = *h->s;
  if (!c.blocking)
    c.set_error(ncclInvalidArgument, msg);
  else
    warn(c.who() + ": " + msg);
  return ncclInvalidArgument;
}

ncclResult_t check_args(const call_rec& rec, const char* fn) {
  comm_state& c = *rec.comm->s;
  if (!valid_type(rec.dtype))
    return arg_error(rec.comm, std::string(fn) + ": invalid type " + std::to_string(rec.dtype));
  if (has_op(u32(rec.k)) && !valid_op(rec.op))
    return arg_error(rec.comm, std::string(fn) + ": invalid reduction operation " + std::to_string(rec.op));
  if (rec.root < 0 || rec.root >= c.n)
    return arg_error(rec.comm, std::string(fn) + ": invalid " + (is_collective(rec.k) ? "root " : "peer ") +
                                   std::to_string(rec.root) + " (should be in 0.." + std::to_string(c.n - 1) + ")");
  const u64 bytes = u64(rec.count) * type_size(rec.dtype) * (rec.k == kind::reducescatter ? u64(c.n) : 1);
  if (rec.count > (u64{1} << 56) || chunks_for(bytes, is_collective(rec.k) ? kSlotBytes : kChanBytes) >= kMaxChunks)
    return arg_error(rec.comm,
                     std::string(fn) + ": count " + std::to_string(rec.count) + " is too large for the double");
  if (rec.count == 0) return ncclSuccess;
  const bool needs_send =
      rec.k == kind::send || (is_collective(rec.k) && (rec.k != kind::broadcast || c.rank == rec.root));
  const bool needs_recv =
      rec.k == kind::recv || (is_collective(rec.k) && (rec.k != kind::reduce || c.rank == rec.root));
  if (needs_send && !rec.send) return arg_error(rec.comm, std::string(fn) + ": sendbuff is NULL");
  if (needs_recv && !rec.recv) return arg_error(rec.comm, std::string(fn) + ": recvbuff is NULL");
  // NCCL's pointer check (NCCL_CHECK_POINTERS): device, managed or pinned host memory only.
  // (When the operation runs, the ranges are checked again: see check_range.)
  auto device_visible = [](const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged || a.type == cudaMemoryTypeHost;
  };
  if (needs_send && !device_visible(rec.send))
    return arg_error(rec.comm, std::string(fn) + ": sendbuff is not device memory (NCCL reads it on the GPU)");
  if (needs_recv && !device_visible(rec.recv))
    return arg_error(rec.comm, std::string(fn) + ": recvbuff is not device memory (NCCL writes it on the GPU)");
  return ncclSuccess;
}

// Every collective and point-to-point call: recorded in the thread's group (an implicit
// one outside ncclGroupStart/End), queued at the outermost ncclGroupEnd.
ncclResult_t record(call_rec rec, const char* fn) {
  if (!rec.comm) {
    warn(std::string(fn) + ": comm argument is NULL");
    return ncclInvalidArgument;
  }
  check_handle(rec.comm, fn);
  group_state& g = g_group;
  const bool implicit = g.depth == 0;
  if (implicit) g.depth = 1;
  acquire(rec.comm, fn);
  if (std::find(g.comms.begin(), g.comms.end(), rec.comm) == g.comms.end()) g.comms.push_back(rec.comm);
  ncclResult_t r = ensure_ready(rec.comm, fn, true);
  if (r == ncclSuccess) r = check_args(rec, fn);
  if (r != ncclSuccess) {
    if (g.error == ncclSuccess) g.error = r;
  } else if (rec.count > 0 || !is_collective(rec.k)) {  // NCCL drops empty collectives
    g.calls.push_back(rec);
  }
  if (implicit) return group_end();
  return r;
}

std::string id_name(const ncclUniqueId& id) {
  const std::size_t m = sizeof kIdMagic - 1;
  if (std::memcmp(id.internal, kIdMagic, m) != 0) return {};
  const char* name = id.internal + m;
  const std::size_t len = strnlen(name, sizeof id.internal - m);
  if (len == 0 || len == sizeof id.internal - m) return {};
  return std::string(name, len);
}

ncclResult_t init(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config,
                  const char* fn) {
  if (!out) {
    warn(std::string(fn) + ": comm argument is NULL");
    return ncclInvalidArgument;
  }
  *out = nullptr;
  if (g_group.depth > 0) {
    warn(std::string(fn) + " inside ncclGroupStart/ncclGroupEnd: the double creates communicators outside groups only");
    return ncclInvalidUsage;
  }
  if (nranks < 1 || nranks > kMaxRanks) {
    warn(std::string(fn) + ": invalid rank count " + std::to_string(nranks) + " (the double supports 1.." +
         std::to_string(kMaxRanks) + ")");
    return ncclInvalidArgument;
  }
  if (rank < 0 || rank >= nranks) {
    warn(std::string(fn) + ": rank " + std::to_string(rank) + " is out of range 0.." + std::to_string(nranks - 1));
    return ncclInvalidArgument;
  }
  bool blocking = true;
  if (config) {
    if (config->magic != NCCL_API_MAGIC || config->size < sizeof(ncclConfig_t)) {
      warn(std::string(fn) + ": the config was not initialised with NCCL_CONFIG_INITIALIZER");
      return ncclInvalidArgument;
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
      if (config->blocking != 0 && config->blocking != 1) {
        warn(std::string(fn) + ": config.blocking must be 0 or 1, not " + std::to_string(config->blocking));
        return ncclInvalidArgument;
      }
      blocking = config->blocking == 1;
    }
  }
  const std::string name = id_name(id);
  if (name.empty()) {
    warn(std::string(fn) + ": the ncclUniqueId was not made by ncclGetUniqueId (was it sent to rank " +
         std::to_string(rank) + "?)");
    return ncclInvalidArgument;
  }
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) {
    warn(std::string(fn) + ": shm_open(" + name + ") failed: " + std::strerror(errno));
    return ncclSystemError;
  }
  struct stat st {};
  // Every rank sizes the segment alike (kSegBytes, fixed), so a late ftruncate never shrinks it.
  if (fstat(fd, &st) != 0 || (st.st_size < off_t(kSegBytes) && ftruncate(fd, off_t(kSegBytes)) != 0)) {
    warn(std::string(fn) + ": sizing the segment " + name + " failed: " + std::strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  void* base = mmap(nullptr, kSegBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    warn(std::string(fn) + ": mmap of " + name + " failed: " + std::strerror(errno));
    return ncclSystemError;
  }
  auto s = std::make_shared<comm_state>();
  s->seg = std::make_unique<segment>(base, name);
  s->rank = rank;
  s->n = nranks;
  s->blocking = blocking;
  s->next_send.assign(std::size_t(nranks), 0);
  s->next_recv.assign(std::size_t(nranks), 0);
  s->send_done.assign(std::size_t(nranks), 0);
  s->recv_done.assign(std::size_t(nranks), 0);
  seg_header& hd = s->hdr();
  u64 expect = 0;
  if (!at(hd.nranks).compare_exchange_strong(expect, u64(nranks)) && expect != u64(nranks)) {
    warn(s->who() + ": " + fn + " with " + std::to_string(nranks) + " ranks, but the ranks that joined first said " +
         std::to_string(expect));
    return ncclInvalidArgument;
  }
  at(hd.magic).store(kSegMagic);
  rank_rec& me = hd.ranks[rank];
  expect = 0;
  const u64 pid = u64(getpid());
  if (!at(me.pid).compare_exchange_strong(expect, pid)) {
    warn(s->who() + ": " + fn + ": rank " + std::to_string(rank) + " of this communicator has already joined (pid " +
         std::to_string(expect) + ")");
    return ncclInvalidUsage;
  }
  at(me.start).store(process_start(getpid()));
  at(me.state).store(rank_joined, std::memory_order_release);
  at(hd.joined).fetch_add(1, std::memory_order_acq_rel);
  auto* h = new ncclComm;
  h->s = s;
  {
    std::lock_guard<std::mutex> lk(g_comms_mu);
    g_comms.insert(h);
  }
  if (blocking) {
    const ncclResult_t r = join_wait(*s);
    if (r != ncclSuccess) {
      at(me.state).store(rank_aborted, std::memory_order_release);
      {
        std::lock_guard<std::mutex> lk(g_comms_mu);
        g_comms.erase(h);
      }
      delete h;
      return r;
    }
    *out = h;
    return ncclSuccess;
  }
  h->ph = phase::joining;
  *out = h;
  h->w.start();
  h->w.post([h] {
    const ncclResult_t r = join_wait(*h->s);
    h->job_result.store(r);
    h->job_done.store(true);
  });
  return ncclInProgress;
}

void forget(ncclComm* h) {
  std::lock_guard<std::mutex> lk(g_comms_mu);
  g_comms.erase(h);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The API.

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) {
    warn("ncclGetUniqueId: uniqueId argument is NULL");
    return ncclInvalidArgument;
  }
  static std::atomic<u64> counter{0};
  std::memset(id->internal, 0, sizeof id->internal);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count();
  std::snprintf(id->internal, sizeof id->internal, "%s/gravac_nccl_%d_%llu_%llx", kIdMagic, int(getpid()),
                static_cast<unsigned long long>(++counter), static_cast<unsigned long long>(ns));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  return init(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!comm || !asyncError) {
    warn("ncclCommGetAsyncError: a NULL argument");
    return ncclInvalidArgument;
  }
  check_handle(comm, "ncclCommGetAsyncError");
  comm_state& c = *comm->s;
  c.check_remote_abort();
  if (const int e = c.error.load(); e != ncclSuccess) {
    *asyncError = ncclResult_t(e);
    return ncclSuccess;
  }
  std::unique_lock<std::mutex> lk(comm->mu);
  switch (comm->ph) {
    case phase::joining:
    case phase::finalizing:
      if (!comm->job_done.load()) {
        *asyncError = ncclInProgress;
        break;
      }
      comm->ph = comm->ph == phase::joining ? phase::ready : phase::finalized;
      *asyncError = ncclResult_t(comm->job_result.load());
      if (*asyncError != ncclSuccess && c.error.load() == ncclSuccess)
        c.set_error(*asyncError,
                    comm->ph == phase::ready ? "joining the communicator failed" : "ncclCommFinalize failed");
      break;
    case phase::deferred: {
      // The first poll after a non-blocking call reports it in progress; the next one has
      // the communicator's thread queue it (so anything the caller queued on the stream
      // before that poll runs first).
      if (comm->deferred_polls++ == 0) {
        *asyncError = ncclInProgress;
        break;
      }
      auto list = std::move(comm->deferred);
      comm->deferred.clear();
      comm->ph = phase::enqueuing;
      lk.unlock();
      queue_deferred(comm, std::move(list));
      lk.lock();
      comm->ph = phase::ready;
      *asyncError = ncclResult_t(c.error.load());
      break;
    }
    case phase::enqueuing:
      *asyncError = ncclInProgress;
      break;
    default:
      *asyncError = ncclSuccess;
      break;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  check_handle(comm, "ncclCommFinalize");
  acquire(comm, "ncclCommFinalize");
  ncclResult_t r = ensure_ready(comm, "ncclCommFinalize", true);
  if (r != ncclSuccess) {
    release(comm);
    return r;
  }
  {
    std::lock_guard<std::mutex> lk(comm->mu);
    if (comm->finalize_called) {
      release(comm);
      warn(comm->s->who() + ": ncclCommFinalize called twice");
      return ncclInvalidArgument;
    }
    comm->finalize_called = true;
  }
  comm_state& c = *comm->s;
  if (c.blocking) {
    r = drain_pending(c, "ncclCommFinalize");
    std::lock_guard<std::mutex> lk(comm->mu);
    comm->ph = phase::finalized;
    release(comm);
    return r;
  }
  {
    std::lock_guard<std::mutex> lk(comm->mu);
    comm->ph = phase::finalizing;
    comm->job_done.store(false);
  }
  comm->w.post([comm] {
    const ncclResult_t e = drain_pending(*comm->s, "ncclCommFinalize");
    comm->job_result.store(e);
    comm->job_done.store(true);
  });
  release(comm);
  return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  check_handle(comm, "ncclCommDestroy");
  acquire(comm, "ncclCommDestroy");
  const ncclResult_t r = ensure_ready(comm, "ncclCommDestroy", false, true);
  if (r != ncclSuccess) {
    release(comm);
    return r;  // as NCCL: a failed communicator is released with ncclCommAbort
  }
  comm_state& c = *comm->s;
  bool finalized = false;
  {
    std::lock_guard<std::mutex> lk(comm->mu);
    finalized = comm->ph == phase::finalized;
  }
  if (!finalized) (void)drain_pending(c, "ncclCommDestroy");
  at(c.hdr().ranks[c.rank].state).store(rank_destroyed, std::memory_order_release);
  comm->w.shutdown();
  c.seg->unlink();
  forget(comm);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  check_handle(comm, "ncclCommAbort");
  comm_state& c = *comm->s;
  c.local_abort.store(true);
  // Out of this thread's open group, if it is in one (its calls on it are dropped).
  std::erase(g_group.comms, comm);
  std::erase_if(g_group.calls, [comm](const call_rec& r) { return r.comm == comm; });
  u64 expect = 0;
  at(c.hdr().aborted_by).compare_exchange_strong(expect, u64(c.rank) + 1);
  at(c.hdr().ranks[c.rank].state).store(rank_aborted, std::memory_order_release);
  comm->w.shutdown();  // its jobs see local_abort and end
  {
    std::lock_guard<std::mutex> lk(comm->mu);
    comm->deferred.clear();
  }
  c.seg->unlink();
  forget(comm);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) {
    warn("ncclCommCount: a NULL argument");
    return ncclInvalidArgument;
  }
  check_handle(comm, "ncclCommCount");
  if (const ncclResult_t r = ensure_ready(comm, "ncclCommCount", false, true); r != ncclSuccess) return r;
  *count = comm->s->n;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) {
    warn("ncclCommUserRank: a NULL argument");
    return ncclInvalidArgument;
  }
  check_handle(comm, "ncclCommUserRank");
  if (const ncclResult_t r = ensure_ready(comm, "ncclCommUserRank", false, true); r != ncclSuccess) return r;
  *rank = comm->s->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string copy;
  copy.clear();
  if (comm) {
    std::lock_guard<std::mutex> lk(g_comms_mu);
    if (g_comms.count(comm)) {
      std::lock_guard<std::mutex> lk2(comm->s->msg_mu);
      copy = comm->s->last_error;
    }
  }
  if (copy.empty()) {
    std::lock_guard<std::mutex> lk(g_msg_mu);
    copy = g_last_error;
  }
  return copy.c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return record({kind::allreduce, sendbuff, recvbuff, count, datatype, op, 0, stream, comm}, "ncclAllReduce");
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return record({kind::broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, stream, comm}, "ncclBroadcast");
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return record({kind::reduce, sendbuff, recvbuff, count, datatype, op, root, stream, comm}, "ncclReduce");
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return record({kind::allgather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, stream, comm}, "ncclAllGather");
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return record({kind::reducescatter, sendbuff, recvbuff, recvcount, datatype, op, 0, stream, comm},
                "ncclReduceScatter");
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return record({kind::send, sendbuff, nullptr, count, datatype, ncclSum, peer, stream, comm}, "ncclSend");
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return record({kind::recv, nullptr, recvbuff, count, datatype, ncclSum, peer, stream, comm}, "ncclRecv");
}

ncclResult_t ncclGroupStart(void) {
  ++g_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (g_group.depth == 0) {
    warn("ncclGroupEnd: not in a group call (no matching ncclGroupStart)");
    return ncclInvalidUsage;
  }
  if (--g_group.depth > 0) return ncclSuccess;
  return group_end();
}

}  // extern "C"
