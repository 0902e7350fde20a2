#pragma once
// The device side of the CUDA host double: the CUDA keywords, the built-in variables
// (threadIdx, blockIdx, blockDim, gridDim, warpSize), block barriers, warp operations,
// atomics, the intrinsics gravac's kernels call, and cuda_double::launch, which queues a
// kernel on a stream of the double (core.hpp). src/kernel_engine.cpp runs the kernels.
//
// How a kernel runs (strict where CUDA is lenient):
// - A launch queues a stream_op; when the runtime polls it, the whole grid runs on the
//   polling OS thread, block after block, in a seeded shuffled order (a kernel that relies
//   on the order of its blocks gets a wrong result). In the strict mode of concurrent
//   blocks (set_block_threads) the blocks run on several OS threads at the same time.
// - Every thread of a block is a fiber (Boost.Context) on pooled stacks. A thread runs
//   without switching until it reaches a barrier or a warp operation, or returns. The
//   threads that can run are run in a seeded random order, a new permutation at every
//   barrier epoch, so a missing __syncthreads between a write and a read of another
//   thread shows as a wrong result under most permutations (a permutation never starts
//   with the epoch's lowest thread: thread 0's broadcast without a barrier is always
//   caught). A block of one thread runs the kernel directly, without a fiber.
// - A barrier or warp operation that can never complete (a thread exited while the others
//   wait at __syncthreads, a lane named in a warp operation's mask exited or waits at
//   another operation, different barrier kinds) is reported by cuda_double::fail(), never
//   a hang.
// - __shared__ is `static thread_local`: a block's fibers all run on one OS thread and
//   one block at a time runs on an OS thread (concurrent blocks too), so it is exactly
//   per-block storage. CUDA
//   leaves it undefined at the start of a block; here every byte of it is 0xFF at the
//   start of every block (a NaN as a float or double, the largest value as an unsigned,
//   -1 as a signed integer), so a kernel that reads shared memory it did not write reads
//   garbage, never the previous block's values or zeros. How the engine finds it: each
//   __shared__ declaration also declares a one-byte marker,
//   cuda_double_shared_mark_<n>, a static local of the same function; the engine reads the
//   symbol table once, and every thread-local static of a function that holds a marker is
//   shared memory (a device function has no other static locals). A __shared__ variable at
//   namespace scope is not found (gravac declares none).
// - The seed of all of this is cuda_double::next_seed(), taken once per launch.

#include <math.h>  // NOLINT: ::isfinite, ::fabsf, ... unqualified in device code, as CUDA has them

#if defined(__SANITIZE_THREAD__) || defined(CUDA_DOUBLE_TSAN)  // (the engine is built uninstrumented)
#define CUDA_DOUBLE_RACE_DETECTOR 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CUDA_DOUBLE_RACE_DETECTOR 1
#endif
#endif
#if defined(CUDA_DOUBLE_RACE_DETECTOR)
#include <sanitizer/tsan_interface.h>
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "cuda_double/core.hpp"

// ---------------------------------------------------------------------------------------
// Keywords.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define CUDA_DOUBLE_CAT2(a, b) a##b
#define CUDA_DOUBLE_CAT(a, b) CUDA_DOUBLE_CAT2(a, b)
// The marker is `used` so that the compiler emits it, and its symbol, even unreferenced;
// the variable too, so that the optimizer keeps its declared size (clang's shrinks a
// static written with one constant to a flag, which the poison would turn into the constant).
#define __shared__                                                                       \
  [[maybe_unused]] static thread_local                                                   \
      __attribute__((used)) char CUDA_DOUBLE_CAT(cuda_double_shared_mark_, __COUNTER__); \
  static thread_local __attribute__((used))
#define __constant__
// __noinline__ is deliberately not defined: libstdc++ (bits/shared_ptr_base.h, ...),
// glibc (sys/cdefs.h: __attribute_noinline__) and Boost spell the GCC attribute
// `__attribute__((__noinline__))`, which a macro of that name would break. gravac's
// kernels do not use it; a kernel that does fails to compile here, visibly.

//! The threads of a warp (CUDA's built-in; a variable, not a macro, so that a member named
//! warpSize, as cudaDeviceProp's, stays usable).
inline constexpr int warpSize = 32;

namespace cuda_double {
namespace detail {

//! The built-in variables of the running device thread: thread_idx is rewritten at every
//! fiber switch, the others at every block. Constant-initialized, so read without a guard.
struct kernel_context {
  uint3 thread_idx{0, 0, 0};
  uint3 block_idx{0, 0, 0};
  dim3 block_dim{1, 1, 1};
  dim3 grid_dim{1, 1, 1};
};
inline thread_local kernel_context t_ctx{};

}  // namespace detail

//! The built-in variables of the device thread running on this OS thread (zero outside a
//! kernel).
inline const detail::kernel_context& this_thread() noexcept { return detail::t_ctx; }

//! Concurrent blocks, a strict mode: with \p n of 2 or more, the blocks of every later
//! grid run on \p n OS threads at the same time (the engine's own, which take the blocks in
//! the seeded shuffled order, each block with thread orders seeded by its index), so a race
//! between blocks on global memory (a non-atomic read-modify-write, a flag one block polls
//! and another sets) can lose an update or read a stale value, as on a GPU. 0 or 1: one
//! block after another on the polling OS thread (the default; GRAVAC_CUDA_DOUBLE_BLOCK_THREADS
//! sets it for a process). Which blocks overlap is up to the OS scheduler, so a race shows
//! often, not always; results of race-free kernels stay those of the seed. Returns the
//! previous value.
unsigned set_block_threads(unsigned n);
//! The current number of OS threads a grid's blocks run on (see set_block_threads).
unsigned block_threads();
//! The most blocks that have run at the same time in one grid since the process started.
unsigned most_blocks_at_once();

//! Concurrent blocks for a scope (set_block_threads, then the previous value back).
class concurrent_blocks {
 public:
  explicit concurrent_blocks(unsigned n) : previous_(set_block_threads(n)) {}
  concurrent_blocks(const concurrent_blocks&) = delete;
  concurrent_blocks& operator=(const concurrent_blocks&) = delete;
  ~concurrent_blocks() { set_block_threads(previous_); }

 private:
  unsigned previous_;
};

}  // namespace cuda_double

#define threadIdx (static_cast<const ::uint3&>(::cuda_double::detail::t_ctx.thread_idx))
#define blockIdx (static_cast<const ::uint3&>(::cuda_double::detail::t_ctx.block_idx))
#define blockDim (static_cast<const ::dim3&>(::cuda_double::detail::t_ctx.block_dim))
#define gridDim (static_cast<const ::dim3&>(::cuda_double::detail::t_ctx.grid_dim))

// ---------------------------------------------------------------------------------------
// The engine's entry points (src/kernel_engine.cpp).
namespace cuda_double::detail {

//! The synchronizing operations a device thread parks at.
enum class sync_kind : std::uint8_t {
  syncthreads,
  syncthreads_or,
  syncthreads_and,
  syncthreads_count,
  syncwarp,
  activemask,
  shfl_idx,
  shfl_up,
  shfl_down,
  shfl_xor,
  ballot,
  all,
  any,
  reduce_add_u,
  reduce_min_u,
  reduce_max_u,
  reduce_add_i,
  reduce_min_i,
  reduce_max_i
};

//! A block barrier of kind \p k with this thread's predicate; returns the barrier's result
//! (0 for a plain __syncthreads).
int block_sync(sync_kind k, int pred);

//! A warp operation of kind \p k over the lanes of \p mask: \p value is this lane's operand
//! (its bits, or its predicate), \p arg the source lane, delta or lane mask of a shuffle,
//! \p width a shuffle's width. Returns the bits of the result.
std::uint64_t warp_sync(sync_kind k, unsigned mask, std::uint64_t value, std::int64_t arg, int width);

//! __trap(): sets the sticky error cudaErrorLaunchFailure and ends the kernel.
[[noreturn]] void trap();

//! Reports a misaligned atomic (CUDA: cudaErrorMisalignedAddress) through fail().
[[noreturn]] void misaligned_atomic(const void* p, std::size_t align, const char* what);

//! What the engine needs to know of a launch.
struct launch_desc {
  const void* kernel = nullptr;          //!< the kernel's address (its name is looked up lazily)
  const char* name = nullptr;            //!< a name given at the launch, or null
  const std::type_info* type = nullptr;  //!< the kernel's type, when no name is found
  dim3 grid{1, 1, 1};                    //!< grid of blocks
  dim3 block{1, 1, 1};                   //!< threads of a block
  std::uint64_t seed = 0;                //!< of the block order and the thread orders
};

//! "kernel NAME<<<grid, block>>>" (the name from the launch, the executable's symbol table
//! or the kernel's type).
std::string describe(const launch_desc& d);

//! Checks a launch configuration as CUDA does; on a bad one sets cudaErrorInvalidConfiguration
//! (cuda_double::set_last_error) and returns false. \p shared_bytes other than 0 is a
//! defect reported by fail(): the double does not model dynamic shared memory.
bool check_launch(dim3 grid, dim3 block, std::size_t shared_bytes, const void* kernel, const std::type_info& type,
                  const char* name);

//! Runs every block of the launch \p d; \p body(self) runs the kernel once for the current
//! device thread.
void run_grid(const launch_desc& d, void (*body)(void*), void* self);

//! Copy-initialization of a kernel parameter from a launch argument (as a call converts it).
template <class T>
T kernel_param(std::type_identity_t<T> v) {
  return v;
}

//! A queued kernel launch: the kernel and its parameters, copied at the launch.
template <class... P>
class kernel_op final : public stream_op {
 public:
  template <class... A>
  kernel_op(void (*kernel)(P...), const launch_desc& d, A&&... args)
      : kernel_(kernel), desc_(d), params_(kernel_param<std::decay_t<P>>(std::forward<A>(args))...) {}

  bool poll() override {
    // After a device fault (a sticky error: __trap, ...) CUDA runs no further kernel.
    if (sticky_error() == cudaSuccess) run_grid(desc_, &body, this);
    return true;
  }
  [[nodiscard]] std::string what() const override { return describe(desc_); }

 private:
  // Each device thread calls the kernel with its own copy of the parameters (a kernel may
  // modify its by-value parameters).
  static void body(void* self) {
    auto* op = static_cast<kernel_op*>(self);
    std::apply(op->kernel_, op->params_);
  }

  void (*kernel_)(P...);
  launch_desc desc_;
  std::tuple<std::decay_t<P>...> params_;
};

template <class... P, class... A>
void launch_impl(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shared_bytes,
                 cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "cuda_double::launch: pass every kernel argument");
  if (!check_launch(grid, block, shared_bytes, reinterpret_cast<const void*>(kernel), typeid(kernel), name)) return;
  launch_desc d;
  d.kernel = reinterpret_cast<const void*>(kernel);
  d.name = name;
  d.type = &typeid(kernel);
  d.grid = grid;
  d.block = block;
  d.seed = next_seed();
  // A sticky error drops the launch (enqueue returns it; cudaGetLastError reports it).
  (void)enqueue(stream, std::make_unique<kernel_op<P...>>(kernel, d, std::forward<A>(args)...));
}

template <class T>
inline std::uint64_t to_bits(T v) noexcept {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "a warp shuffle moves a value of at most 8 bytes");
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
inline T from_bits(std::uint64_t b) noexcept {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

__extension__ typedef unsigned __int128 u128;  // (__extension__: quiet under -Wpedantic)
__extension__ typedef __int128 i128;

// The race detector (a ThreadSanitizer build; README.md, "The race detector"). CUDA's
// atomics are relaxed: they order nothing but themselves, so there they are relaxed too
// (sequentially consistent ones would order unrelated memory between blocks, hiding a race,
// as a plain ticket counter's behind the histogram atomics before it). What orders a
// block's writes before another block's reads is a __threadfence before an atomic that the
// other block's atomic on the same address then observes (the last-block ticket). So an
// atomic on address a releases on a, before it, what its thread did if the thread has
// fenced since its block began, and acquires on a after it: an edge from a fenced writer to
// any thread whose atomic on a comes later, and none from a writer that did not fence, or
// through an atomic on another address (ThreadSanitizer does not model
// std::atomic_thread_fence).
#if defined(CUDA_DOUBLE_RACE_DETECTOR)
inline constexpr std::memory_order atomic_order = std::memory_order_relaxed;
//! The running device thread has executed a __threadfence (since its block began).
void mark_fence() noexcept;
[[nodiscard]] bool fenced() noexcept;
//! The race detector's edges of one atomic (see above): release when fenced, then acquire.
class atomic_edges {
 public:
  explicit atomic_edges(void* address) noexcept : at_(address) {
    if (fenced()) __tsan_release(at_);
  }
  ~atomic_edges() { __tsan_acquire(at_); }
  atomic_edges(const atomic_edges&) = delete;
  atomic_edges& operator=(const atomic_edges&) = delete;

 private:
  void* at_;
};
#else
inline constexpr std::memory_order atomic_order = std::memory_order_seq_cst;
inline void mark_fence() noexcept {}
class atomic_edges {
 public:
  explicit atomic_edges(void*) noexcept {}
};
#endif

template <class T>
inline std::atomic_ref<T> atomic_at(T* p, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) % std::atomic_ref<T>::required_alignment != 0)
    misaligned_atomic(p, std::atomic_ref<T>::required_alignment, what);
  return std::atomic_ref<T>(*p);
}

}  // namespace cuda_double::detail

namespace cuda_double {

//! Queues \p kernel on \p stream over \p grid blocks of \p block threads, as the chevron
//! launch `kernel<<<grid, block, shared_bytes, stream>>>(args...)`: the arguments are
//! converted to the kernel's parameters and copied now. A configuration CUDA refuses
//! (a block of more than 1024 threads, blockDim.z > 64, gridDim.y or .z > 65535, gridDim.x
//! > 2^31 - 1, a zero dimension) sets cudaErrorInvalidConfiguration (cudaGetLastError) and
//! queues nothing. \p shared_bytes must be 0 (no dynamic shared memory in the double:
//! anything else is reported by fail()).
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream, A&&... args) {
  detail::launch_impl(nullptr, kernel, grid, block, shared_bytes, stream, std::forward<A>(args)...);
}

//! launch() with the kernel's name for the double's reports (\p name: static storage).
//! Without it the name is looked up in the executable's symbol table.
template <class... P, class... A>
void launch_named(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shared_bytes,
                  cudaStream_t stream, A&&... args) {
  detail::launch_impl(name, kernel, grid, block, shared_bytes, stream, std::forward<A>(args)...);
}

}  // namespace cuda_double

// ---------------------------------------------------------------------------------------
// Block barriers. Every live thread of the block must reach the same kind of barrier;
// otherwise fail() names the threads. The _or/_and forms return 1 or 0.
void __syncthreads();
inline int __syncthreads_or(int pred) {
  return ::cuda_double::detail::block_sync(::cuda_double::detail::sync_kind::syncthreads_or, pred);
}
inline int __syncthreads_and(int pred) {
  return ::cuda_double::detail::block_sync(::cuda_double::detail::sync_kind::syncthreads_and, pred);
}
inline int __syncthreads_count(int pred) {
  return ::cuda_double::detail::block_sync(::cuda_double::detail::sync_kind::syncthreads_count, pred);
}

// ---------------------------------------------------------------------------------------
// Warp operations. Lanes are the block's threads by linear index % 32, warps by linear
// index / 32. Each operation is a rendezvous of the lanes of its mask: every lane of the
// mask must arrive at the same kind of operation with the same mask (a lane of the mask
// that exits or waits elsewhere is reported by fail()); the caller must be in its mask.
// Lanes past the end of a partial last warp are not part of any mask. Shuffles follow
// PTX's shfl.sync (width: a power of two up to 32); a lane whose source lane is outside
// the mask gets its own value (CUDA leaves that value undefined).
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)::cuda_double::detail::warp_sync(::cuda_double::detail::sync_kind::syncwarp, mask, 0, 0, 32);
}
//! The lanes of the warp that are at an __activemask() when no other operation of the
//! block can progress: all live lanes when the warp is converged (CUDA: the lanes
//! executing the instruction together).
inline unsigned __activemask() {
  return static_cast<unsigned>(
      ::cuda_double::detail::warp_sync(::cuda_double::detail::sync_kind::activemask, 0, 0, 0, 32));
}
template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
  using namespace ::cuda_double::detail;
  return from_bits<T>(warp_sync(sync_kind::shfl_idx, mask, to_bits(var), srcLane, width));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  using namespace ::cuda_double::detail;
  return from_bits<T>(warp_sync(sync_kind::shfl_up, mask, to_bits(var), delta, width));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  using namespace ::cuda_double::detail;
  return from_bits<T>(warp_sync(sync_kind::shfl_down, mask, to_bits(var), delta, width));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
  using namespace ::cuda_double::detail;
  return from_bits<T>(warp_sync(sync_kind::shfl_xor, mask, to_bits(var), laneMask, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return static_cast<unsigned>(
      ::cuda_double::detail::warp_sync(::cuda_double::detail::sync_kind::ballot, mask, pred != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int pred) {
  return static_cast<int>(
      ::cuda_double::detail::warp_sync(::cuda_double::detail::sync_kind::all, mask, pred != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int pred) {
  return static_cast<int>(
      ::cuda_double::detail::warp_sync(::cuda_double::detail::sync_kind::any, mask, pred != 0, 0, 32));
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
  return static_cast<unsigned>(
      ::cuda_double::detail::warp_sync(::cuda_double::detail::sync_kind::reduce_add_u, mask, v, 0, 32));
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
  return static_cast<unsigned>(
      ::cuda_double::detail::warp_sync(::cuda_double::detail::sync_kind::reduce_min_u, mask, v, 0, 32));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  return static_cast<unsigned>(
      ::cuda_double::detail::warp_sync(::cuda_double::detail::sync_kind::reduce_max_u, mask, v, 0, 32));
}
inline int __reduce_add_sync(unsigned mask, int v) {
  return static_cast<int>(static_cast<std::uint32_t>(::cuda_double::detail::warp_sync(
      ::cuda_double::detail::sync_kind::reduce_add_i, mask, static_cast<std::uint32_t>(v), 0, 32)));
}
inline int __reduce_min_sync(unsigned mask, int v) {
  return static_cast<int>(static_cast<std::uint32_t>(::cuda_double::detail::warp_sync(
      ::cuda_double::detail::sync_kind::reduce_min_i, mask, static_cast<std::uint32_t>(v), 0, 32)));
}
inline int __reduce_max_sync(unsigned mask, int v) {
  return static_cast<int>(static_cast<std::uint32_t>(::cuda_double::detail::warp_sync(
      ::cuda_double::detail::sync_kind::reduce_max_i, mask, static_cast<std::uint32_t>(v), 0, 32)));
}

// ---------------------------------------------------------------------------------------
// Memory fences (sequentially consistent) and __trap.
inline void __threadfence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ::cuda_double::detail::mark_fence();
}
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ::cuda_double::detail::mark_fence();
}
[[noreturn]] inline void __trap() { ::cuda_double::detail::trap(); }

// ---------------------------------------------------------------------------------------
// Atomics: on any address (global or shared), through std::atomic_ref (kernels of other
// OS threads may run at the same time). Each returns the old value. A misaligned address
// is reported by fail().
#define CUDA_DOUBLE_ATOMIC_RMW(name, T, expr)                  \
  inline T name(T* address, T val) {                           \
    auto r = ::cuda_double::detail::atomic_at(address, #name); \
    const ::cuda_double::detail::atomic_edges edges(address);  \
    return expr;                                               \
  }
CUDA_DOUBLE_ATOMIC_RMW(atomicAdd, int, r.fetch_add(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicAdd, unsigned, r.fetch_add(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicAdd, unsigned long long, r.fetch_add(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicAdd, float, r.fetch_add(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicAdd, double, r.fetch_add(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicSub, int, r.fetch_sub(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicSub, unsigned, r.fetch_sub(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicExch, int, r.exchange(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicExch, unsigned, r.exchange(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicExch, unsigned long long, r.exchange(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicExch, float, r.exchange(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicAnd, int, r.fetch_and(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicAnd, unsigned, r.fetch_and(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicAnd, unsigned long long, r.fetch_and(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicOr, int, r.fetch_or(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicOr, unsigned, r.fetch_or(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicOr, unsigned long long, r.fetch_or(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicXor, int, r.fetch_xor(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicXor, unsigned, r.fetch_xor(val, ::cuda_double::detail::atomic_order))
CUDA_DOUBLE_ATOMIC_RMW(atomicXor, unsigned long long, r.fetch_xor(val, ::cuda_double::detail::atomic_order))
#undef CUDA_DOUBLE_ATOMIC_RMW

namespace cuda_double::detail {
template <class T, bool Max>
inline T atomic_extremum(T* p, T v, const char* what) {
  auto r = atomic_at(p, what);
  const atomic_edges edges(p);
  T old = r.load(atomic_order);
  while ((Max ? old < v : v < old) && !r.compare_exchange_weak(old, v, atomic_order)) {
  }
  return old;
}
template <class T>
inline T atomic_cas(T* p, T compare, T val) {
  auto r = atomic_at(p, "atomicCAS");
  const atomic_edges edges(p);
  r.compare_exchange_strong(compare, val, atomic_order);
  return compare;  // the old value: compare itself on success, the current one otherwise
}
}  // namespace cuda_double::detail

inline int atomicMax(int* p, int v) { return ::cuda_double::detail::atomic_extremum<int, true>(p, v, "atomicMax"); }
inline unsigned atomicMax(unsigned* p, unsigned v) {
  return ::cuda_double::detail::atomic_extremum<unsigned, true>(p, v, "atomicMax");
}
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
  return ::cuda_double::detail::atomic_extremum<unsigned long long, true>(p, v, "atomicMax");
}
inline long long atomicMax(long long* p, long long v) {
  return ::cuda_double::detail::atomic_extremum<long long, true>(p, v, "atomicMax");
}
inline int atomicMin(int* p, int v) { return ::cuda_double::detail::atomic_extremum<int, false>(p, v, "atomicMin"); }
inline unsigned atomicMin(unsigned* p, unsigned v) {
  return ::cuda_double::detail::atomic_extremum<unsigned, false>(p, v, "atomicMin");
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  return ::cuda_double::detail::atomic_extremum<unsigned long long, false>(p, v, "atomicMin");
}
inline long long atomicMin(long long* p, long long v) {
  return ::cuda_double::detail::atomic_extremum<long long, false>(p, v, "atomicMin");
}
inline int atomicCAS(int* p, int compare, int val) { return ::cuda_double::detail::atomic_cas(p, compare, val); }
inline unsigned atomicCAS(unsigned* p, unsigned compare, unsigned val) {
  return ::cuda_double::detail::atomic_cas(p, compare, val);
}
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long compare, unsigned long long val) {
  return ::cuda_double::detail::atomic_cas(p, compare, val);
}
inline unsigned short atomicCAS(unsigned short* p, unsigned short compare, unsigned short val) {
  return ::cuda_double::detail::atomic_cas(p, compare, val);
}
//! ((old >= val) ? 0 : old + 1), as CUDA's.
inline unsigned atomicInc(unsigned* p, unsigned val) {
  auto r = ::cuda_double::detail::atomic_at(p, "atomicInc");
  const ::cuda_double::detail::atomic_edges edges(p);
  unsigned old = r.load(::cuda_double::detail::atomic_order);
  while (!r.compare_exchange_weak(old, old >= val ? 0u : old + 1u, ::cuda_double::detail::atomic_order)) {
  }
  return old;
}
//! (((old == 0) || (old > val)) ? val : old - 1), as CUDA's.
inline unsigned atomicDec(unsigned* p, unsigned val) {
  auto r = ::cuda_double::detail::atomic_at(p, "atomicDec");
  const ::cuda_double::detail::atomic_edges edges(p);
  unsigned old = r.load(::cuda_double::detail::atomic_order);
  while (
      !r.compare_exchange_weak(old, (old == 0u || old > val) ? val : old - 1u, ::cuda_double::detail::atomic_order)) {
  }
  return old;
}

// ---------------------------------------------------------------------------------------
// Arithmetic intrinsics with CUDA's exact results. The double is compiled with
// -ffp-contract=off (no fused multiply-add behind the code's back) and runs in the host's
// default rounding mode, round-to-nearest-even; the directed roundings are derived from
// the round-to-nearest result by an exact comparison and one nextafter step, never by
// changing the rounding mode. Denormals are kept (nvcc's default -ftz=false).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __drcp_rn(double a) { return 1.0 / a; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
//! CUDA's is an approximation; the double gives the correctly rounded quotient.
inline float __fdividef(float a, float b) { return a / b; }
//! Clamps to [+0, 1]; NaN gives +0.
inline float __saturatef(float x) {
  if (!(x > 0.0f)) return 0.0f;
  return x < 1.0f ? x : 1.0f;
}

namespace cuda_double::detail {
enum class rounding { rn, rz, ru, rd };

//! \p r: \p x rounded to nearest into To; corrected to the direction \p m by comparing
//! exactly (in Wide, which holds both values exactly).
template <class Wide, class To, class From>
inline To round_dir(From x, rounding m) {
  To r = static_cast<To>(x);  // round-to-nearest-even (the host's mode)
  if (m == rounding::rn) return r;
  const Wide wx = static_cast<Wide>(x), wr = static_cast<Wide>(r);
  if (wx != wx || wr == wx) return r;  // NaN, or exact
  constexpr To inf = std::numeric_limits<To>::infinity();
  switch (m) {
    case rounding::rz:
      if ((wr < 0 ? -wr : wr) > (wx < 0 ? -wx : wx)) r = std::nextafter(r, To{0});
      break;
    case rounding::ru:
      if (wr < wx) r = std::nextafter(r, inf);
      break;
    case rounding::rd:
      if (wr > wx) r = std::nextafter(r, -inf);
      break;
    case rounding::rn:
      break;
  }
  return r;
}

//! A float or double converted to the integer I as PTX's cvt.rXi: rounded in direction
//! \p m, saturated to I's range, NaN gives 0.
template <class I, class F>
inline I to_int(F x, rounding m) {
  if (x != x) return 0;
  F r;
  switch (m) {
    case rounding::rn:
      r = std::nearbyint(x);
      break;
    case rounding::rz:
      r = std::trunc(x);
      break;
    case rounding::ru:
      r = std::ceil(x);
      break;
    default:
      r = std::floor(x);
      break;
  }
  // I's limits as F: the minimum (0 or -2^(bits-1)) and 2^bits or 2^(bits-1) are exact.
  const F lo = static_cast<F>(std::numeric_limits<I>::min());
  const F hi = std::ldexp(F{1}, std::numeric_limits<I>::digits);  // max + 1
  if (r <= lo) return std::numeric_limits<I>::min();
  if (r >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(r);
}
}  // namespace cuda_double::detail

#define CUDA_DOUBLE_CONVERSIONS(prefix, From, To, Wide)                                        \
  inline To prefix##_rn(From x) {                                                              \
    return ::cuda_double::detail::round_dir<Wide, To>(x, ::cuda_double::detail::rounding::rn); \
  }                                                                                            \
  inline To prefix##_rz(From x) {                                                              \
    return ::cuda_double::detail::round_dir<Wide, To>(x, ::cuda_double::detail::rounding::rz); \
  }                                                                                            \
  inline To prefix##_ru(From x) {                                                              \
    return ::cuda_double::detail::round_dir<Wide, To>(x, ::cuda_double::detail::rounding::ru); \
  }                                                                                            \
  inline To prefix##_rd(From x) {                                                              \
    return ::cuda_double::detail::round_dir<Wide, To>(x, ::cuda_double::detail::rounding::rd); \
  }
CUDA_DOUBLE_CONVERSIONS(__double2float, double, float, double)
CUDA_DOUBLE_CONVERSIONS(__int2float, int, float, double)
CUDA_DOUBLE_CONVERSIONS(__uint2float, unsigned, float, double)
CUDA_DOUBLE_CONVERSIONS(__ll2float, long long, float, long double)
CUDA_DOUBLE_CONVERSIONS(__ull2float, unsigned long long, float, long double)
CUDA_DOUBLE_CONVERSIONS(__ll2double, long long, double, long double)
CUDA_DOUBLE_CONVERSIONS(__ull2double, unsigned long long, double, long double)
#undef CUDA_DOUBLE_CONVERSIONS
static_assert(std::numeric_limits<long double>::digits >= 64,
              "the exact comparisons of 64-bit integers need x87's long double");
inline double __int2double_rn(int x) { return x; }
inline double __uint2double_rn(unsigned x) { return x; }

#define CUDA_DOUBLE_TO_INT(prefix, From, To)                                                                          \
  inline To prefix##_rn(From x) { return ::cuda_double::detail::to_int<To>(x, ::cuda_double::detail::rounding::rn); } \
  inline To prefix##_rz(From x) { return ::cuda_double::detail::to_int<To>(x, ::cuda_double::detail::rounding::rz); } \
  inline To prefix##_ru(From x) { return ::cuda_double::detail::to_int<To>(x, ::cuda_double::detail::rounding::ru); } \
  inline To prefix##_rd(From x) { return ::cuda_double::detail::to_int<To>(x, ::cuda_double::detail::rounding::rd); }
CUDA_DOUBLE_TO_INT(__float2int, float, int)
CUDA_DOUBLE_TO_INT(__float2uint, float, unsigned)
CUDA_DOUBLE_TO_INT(__float2ll, float, long long)
CUDA_DOUBLE_TO_INT(__float2ull, float, unsigned long long)
CUDA_DOUBLE_TO_INT(__double2int, double, int)
CUDA_DOUBLE_TO_INT(__double2uint, double, unsigned)
CUDA_DOUBLE_TO_INT(__double2ll, double, long long)
CUDA_DOUBLE_TO_INT(__double2ull, double, unsigned long long)
#undef CUDA_DOUBLE_TO_INT

// Bits.
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline int __double2hiint(double x) { return static_cast<int>(std::bit_cast<unsigned long long>(x) >> 32); }
inline int __double2loint(double x) { return static_cast<int>(std::bit_cast<unsigned long long>(x) & 0xffffffffu); }
inline double __hiloint2double(int hi, int lo) {
  return std::bit_cast<double>((static_cast<unsigned long long>(static_cast<unsigned>(hi)) << 32) |
                               static_cast<unsigned>(lo));
}
//! The SM's cycle counter: here the steady clock in nanoseconds (monotonic per thread, as
//! CUDA's; a spin on it waits real time, which the double does not need for ordering).
inline long long clock64() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }  // 32 for 0
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1; }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
  return (x >> 16) | (x << 16);
}
inline unsigned long long __brevll(unsigned long long x) {
  return (static_cast<unsigned long long>(__brev(static_cast<unsigned>(x))) << 32) |
         __brev(static_cast<unsigned>(x >> 32));
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<::cuda_double::detail::u128>(a) * b) >> 64);
}
inline long long __mul64hi(long long a, long long b) {
  return static_cast<long long>((static_cast<::cuda_double::detail::i128>(a) * b) >> 64);
}
//! PTX prmt (default mode): byte i of the result is byte (s >> 4i) & 7 of {y, x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned>((v << (shift & 31u)) >> 32);
}
inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned>((v << (shift < 32u ? shift : 32u)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned>(v >> (shift & 31u));
}
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned>(v >> (shift < 32u ? shift : 32u));
}

// Loads and stores with cache hints: plain accesses.
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}
template <class T>
inline T __ldca(const T* p) {
  return *p;
}
template <class T>
inline T __ldcs(const T* p) {
  return *p;
}
template <class T>
inline T __ldlu(const T* p) {
  return *p;
}
template <class T>
inline T __ldcv(const T* p) {
  return *p;
}
template <class T>
inline void __stcg(T* p, T v) {
  *p = v;
}
template <class T>
inline void __stcs(T* p, T v) {
  *p = v;
}
template <class T>
inline void __stwb(T* p, T v) {
  *p = v;
}
template <class T>
inline void __stwt(T* p, T v) {
  *p = v;
}

// min and max as CUDA's math_functions.hpp declares them (global, host and device).
#define CUDA_DOUBLE_MINMAX(R, A, B)                                                                                \
  inline R min(A a, B b) { return static_cast<R>(a) < static_cast<R>(b) ? static_cast<R>(a) : static_cast<R>(b); } \
  inline R max(A a, B b) { return static_cast<R>(a) < static_cast<R>(b) ? static_cast<R>(b) : static_cast<R>(a); }
CUDA_DOUBLE_MINMAX(int, int, int)
CUDA_DOUBLE_MINMAX(unsigned, unsigned, unsigned)
CUDA_DOUBLE_MINMAX(unsigned, int, unsigned)
CUDA_DOUBLE_MINMAX(unsigned, unsigned, int)
CUDA_DOUBLE_MINMAX(long, long, long)
CUDA_DOUBLE_MINMAX(unsigned long, unsigned long, unsigned long)
CUDA_DOUBLE_MINMAX(unsigned long, long, unsigned long)
CUDA_DOUBLE_MINMAX(unsigned long, unsigned long, long)
CUDA_DOUBLE_MINMAX(long long, long long, long long)
CUDA_DOUBLE_MINMAX(unsigned long long, unsigned long long, unsigned long long)
CUDA_DOUBLE_MINMAX(unsigned long long, long long, unsigned long long)
CUDA_DOUBLE_MINMAX(unsigned long long, unsigned long long, long long)
#undef CUDA_DOUBLE_MINMAX
// The floating-point ones are fminf/fmin (a NaN operand gives the other operand).
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline double min(float a, double b) { return std::fmin(static_cast<double>(a), b); }
inline double max(float a, double b) { return std::fmax(static_cast<double>(a), b); }
inline double min(double a, float b) { return std::fmin(a, static_cast<double>(b)); }
inline double max(double a, float b) { return std::fmax(a, static_cast<double>(b)); }
inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned umax(unsigned a, unsigned b) { return a < b ? b : a; }
inline long long llmin(long long a, long long b) { return a < b ? a : b; }
inline long long llmax(long long a, long long b) { return a < b ? b : a; }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return a < b ? b : a; }
