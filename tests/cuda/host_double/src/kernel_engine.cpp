// The kernel engine of the CUDA host double (cuda_double/kernel.hpp): runs a grid block
// after block on the calling OS thread, each thread of a block a fiber of Boost.Context,
// and implements block barriers and warp operations as rendezvous of those fibers.
//
// In the strict mode of concurrent blocks (set_block_threads), a grid's blocks are taken, in
// the same seeded shuffled order, by that many OS threads of a pool of the engine's own, each
// with its own engine, fiber stacks and shared memory (all thread-local), while the polling
// thread waits; each block's thread orders are then seeded by the block's index, not by the
// blocks run before it on the same OS thread.
//
// A block runs in rounds. A round runs the runnable threads, in a fresh seeded random
// order (one that does not start with the lowest thread of the round), each until it parks
// (at a barrier or a warp operation) or returns. Then no thread
// can run, and the round's end resolves, in this order:
//   1. every warp operation whose lanes (its mask) have all arrived, at the same kind of
//      operation with the same mask, completes; its lanes become runnable;
//   2. otherwise, the lanes of each warp waiting at __activemask() are given the mask of
//      those lanes (all the warp's live lanes when it is converged);
//   3. otherwise, when every thread of the block waits at the block barrier (one kind),
//      the barrier completes and every thread becomes runnable (a thread that returned
//      while others wait there is reported by fail());
//   4. otherwise nothing can ever progress: fail() names the threads and where they wait.
// A lane named in the mask of a waiting warp operation that has returned is reported at
// once (it can never arrive).
//
// Costs: a fiber per device thread per block, on a stack from a per-OS-thread pool (no
// system call once the pool has grown); a switch is a Boost.Context jump (no system call);
// per round one Fisher-Yates shuffle of the runnable threads. Under AddressSanitizer or
// ThreadSanitizer the switches are announced to the sanitizer.
//
// The race detector (a ThreadSanitizer build; CMakeLists.txt compiles this file without
// instrumentation and defines CUDA_DOUBLE_TSAN). Each device thread is a ThreadSanitizer
// fiber, and switching between fibers does not synchronize them: the only happens-before
// edges are the ones CUDA gives. A thread starts after the launch (the OS thread that runs
// the block releases to its fiber when it makes it); a block barrier and a warp operation
// order what their threads did before them before what they do after (a release and an
// acquire on the barrier's or the warp's token); a fence orders through an atomic
// (kernel.hpp, atomic_edges); the grid's end orders its blocks before what runs after it.
// Blocks are not ordered among themselves, even one after another on one OS thread: each
// takes fresh fibers and stacks (fiber_ring), its shared memory's recorded accesses are
// forgotten (forget_accesses), and only the thread that waits for the grid acquires what
// its blocks did, at its end (grid_share::tsan_end_token). Two accesses to one address with
// no edge between them, one a plain write, are then a data race ThreadSanitizer reports,
// whatever order the fibers ran in: a lost update in shared memory, a missing barrier, a
// missing fence. Under concurrent blocks the pool's threads take fixed shares of the grid
// (thread i the blocks i, i+n, ... of the seeded order, not the next free one, whose atomic
// counter would be invisible to the detector anyway).

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cuda_double/core.hpp"
#include "cuda_double/kernel.hpp"

// Under AddressSanitizer or ThreadSanitizer every switch between stacks is announced to the
// sanitizer (Boost.Context's fcontext fibers do not do it themselves).
#if defined(__SANITIZE_ADDRESS__)
#define CUDA_DOUBLE_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define CUDA_DOUBLE_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDA_DOUBLE_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define CUDA_DOUBLE_TSAN 1
#endif
#endif
#if defined(CUDA_DOUBLE_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(CUDA_DOUBLE_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace cuda_double::detail {
namespace {

namespace bctx = boost::context;

// ---------------------------------------------------------------------------------------
// Stacks: 64 KiB with a guard page below (an overflow faults instead of corrupting), kept
// in a pool per OS thread, so that a block's 256 fibers cost no system call after the
// first blocks. GRAVAC_CUDA_DOUBLE_STACK_KIB overrides the size.
std::size_t stack_bytes() {
  static const std::size_t bytes = [] {
    std::size_t kib = 64;
    if (const char* s = std::getenv("GRAVAC_CUDA_DOUBLE_STACK_KIB"); s != nullptr && std::atoi(s) >= 16)
      kib = static_cast<std::size_t>(std::atoi(s));
    return kib * 1024;
  }();
  return bytes;
}

struct stack_pool {
  bctx::protected_fixedsize_stack alloc{stack_bytes()};
  std::vector<bctx::stack_context> free;
  std::size_t allocated = 0;
  stack_pool() = default;
  stack_pool(const stack_pool&) = delete;
  stack_pool& operator=(const stack_pool&) = delete;
  ~stack_pool() {
    for (auto& s : free) alloc.deallocate(s);
  }
  // A stack back in the pool: AddressSanitizer's marks of the frames that never returned
  // (Boost's entry frame, unwound ones) are cleared, or they would stain the next fiber on
  // it, or whatever memory is later mapped where it was.
  static void clean([[maybe_unused]] const bctx::stack_context& s) noexcept {
#if defined(CUDA_DOUBLE_ASAN)
    __asan_unpoison_memory_region(static_cast<char*>(s.sp) - s.size, s.size);
#endif
  }
};

// The StackAllocator of every fiber: takes from and returns to this OS thread's pool (a
// fiber is created, run and ended on one OS thread).
struct pooled_stack {
  stack_pool* pool;
  bctx::stack_context* given;  // where the stack is noted (for the sanitizers)
  bool preset = false;         // *given is the stack already (the race detector's fiber_ring)
  bctx::stack_context allocate() {
    if (preset) return *given;
    if (!pool->free.empty()) {
      *given = pool->free.back();
      pool->free.pop_back();
      return *given;
    }
    *given = pool->alloc.allocate();
    ++pool->allocated;
    pool->free.reserve(pool->allocated);  // so that deallocate() never allocates
    return *given;
  }
  void deallocate(bctx::stack_context& s) noexcept {
    if (preset) return;
    stack_pool::clean(s);
    pool->free.push_back(s);
  }
};

// ---------------------------------------------------------------------------------------
// Random numbers: wyrand, small and fast; the bounded draw is Lemire's multiply-shift.
struct rng {
  std::uint64_t state;
  std::uint64_t next() noexcept {
    state += 0xa0761d6478bd642fULL;
    const u128 t = static_cast<u128>(state ^ 0xe7037ed1a0b428dbULL) * state;
    return static_cast<std::uint64_t>(t >> 64) ^ static_cast<std::uint64_t>(t);
  }
  std::uint64_t below(std::uint64_t n) noexcept {
    return static_cast<std::uint64_t>((static_cast<u128>(next()) * n) >> 64);
  }
  template <class T>
  void shuffle(std::vector<T>& v) noexcept {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }
};

// ---------------------------------------------------------------------------------------
// The device threads of the running block.
enum class lane_state : std::uint8_t { runnable, at_block, at_warp, done };

struct lane {
  bctx::fiber fib;          // the suspended fiber (empty while it runs or once done)
  uint3 tid{0, 0, 0};       // threadIdx
  std::uint16_t index = 0;  // linear index in the block
  lane_state state = lane_state::runnable;
  sync_kind kind = sync_kind::syncthreads;
  unsigned mask = 0;            // a warp operation's mask (limited to the warp's lanes)
  int width = 32;               // a shuffle's width
  std::int64_t arg = 0;         // a shuffle's source lane, delta or lane mask
  std::uint64_t value = 0;      // the posted operand (or predicate)
  std::uint64_t result = 0;     // what the operation returns to this lane
  bctx::stack_context stack{};  // the fiber's stack
  bool started = false;         // the fiber has run
  void* asan_fake = nullptr;    // AddressSanitizer's fake stack of the parked fiber
  void* tsan_fiber = nullptr;   // ThreadSanitizer's fiber
  char* tsan_token = nullptr;   // the race detector's object of the operation it waits at
  bool fenced = false;          // a __threadfence since the block began (kernel.hpp, atomic_edges)
};

struct grid_share;

struct engine {
  grid_share* share = nullptr;  // concurrent blocks: the grid this pool thread takes blocks of
  // The launch.
  const launch_desc* desc = nullptr;
  void (*body)(void*) = nullptr;
  void* self = nullptr;
  rng random{0};
  bool running = false;  // inside run_grid on this OS thread
  bool direct = false;   // a block of one thread, run without a fiber
  bool trapped = false;  // __trap() ended the kernel
  // The block.
  unsigned nthreads = 0, nwarps = 0;
  std::vector<lane> lanes;
  std::vector<std::uint16_t> runnable;        // released by the round's end, to run next round
  std::vector<std::uint16_t> order;           // the round being run
  std::array<unsigned, 32> warp_waiting{};    // lanes of each warp at a warp operation (not activemask)
  std::array<unsigned, 32> active_waiting{};  // lanes of each warp at __activemask()
  unsigned at_block = 0, done = 0;
  lane* cur = nullptr;                 // the running device thread
  bctx::fiber sched;                   // the scheduler, while a device thread runs
  const void* sched_bottom = nullptr;  // the scheduler's stack, for the sanitizers
  std::size_t sched_size = 0;
  void* sched_fake = nullptr;
  void* tsan_sched = nullptr;
  // The race detector's synchronization objects (their addresses only): the block barrier
  // and each warp's operations, two each, taken by the parity of their completions so far
  // (the threads released by one completion acquire before any can arrive at the one after
  // next; one object would hand them what the first to resume did after the barrier),
  // forgotten at every block's start (the previous block's threads released into them);
  // and the end of the grid's blocks on this OS thread.
  struct alignas(8) sync_tokens {
    std::array<char, 2> block{};
    std::array<std::array<char, 2>, 32> warp{};
  } tsan_tokens;
  std::uint64_t block_epoch = 0;                // block barriers completed
  std::array<std::uint64_t, 32> warp_epochs{};  // warp operations completed, per warp
  char tsan_end_token = 0;                      // the end of this OS thread's blocks of a grid run here
  char* tsan_end = nullptr;                     // where the blocks' threads release at their end
};

thread_local stack_pool t_pool;
thread_local engine t_eng;

struct trap_unwind {};  // thrown by __trap() to the top of the device thread

// ---------------------------------------------------------------------------------------
// Names and reports.
std::string demangle(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) return mangled;
  std::string s(d);
  std::free(d);
  return s;
}

// "void ns::f<true>(float const*, int)" -> "ns::f<true>".
std::string strip_signature(std::string s) {
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (std::size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  return s;
}

struct object_of {
  const void* addr;
  std::string file;
  std::uintptr_t bias = 0;
  bool found = false;
};

// The symbol table of the object (executable or library) that holds addr, searched for a
// function at exactly addr: static functions (most kernels) are not in the dynamic table.
std::string symtab_name(const void* addr) {
  object_of obj{addr, {}, 0, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) -> int {
        auto* o = static_cast<object_of*>(data);
        const auto a = reinterpret_cast<std::uintptr_t>(o->addr);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (a >= lo && a < lo + ph.p_memsz) {
            o->file = (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') ? info->dlpi_name : "/proc/self/exe";
            o->bias = info->dlpi_addr;
            o->found = true;
            return 1;
          }
        }
        return 0;
      },
      &obj);
  if (!obj.found) return {};
  const int fd = ::open(obj.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  struct stat st {};
  std::string name;
  if (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= sizeof(Elf64_Ehdr)) {
    const auto size = static_cast<std::size_t>(st.st_size);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
      const auto* base = static_cast<const unsigned char*>(map);
      const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
      const bool ok = std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
                      eh->e_shoff != 0 && eh->e_shoff + std::size_t{eh->e_shnum} * sizeof(Elf64_Shdr) <= size;
      if (ok) {
        const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
        const std::uintptr_t want = reinterpret_cast<std::uintptr_t>(addr) - obj.bias;
        for (int pass = 0; pass < 2 && name.empty(); ++pass) {
          const unsigned type = pass == 0 ? SHT_SYMTAB : SHT_DYNSYM;
          for (unsigned i = 0; i < eh->e_shnum && name.empty(); ++i) {
            if (sh[i].sh_type != type || sh[i].sh_link >= eh->e_shnum) continue;
            const Elf64_Shdr& strs = sh[sh[i].sh_link];
            if (sh[i].sh_offset + sh[i].sh_size > size || strs.sh_offset + strs.sh_size > size) continue;
            const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
            const std::size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
            for (std::size_t k = 0; k < n; ++k) {
              if (ELF64_ST_TYPE(syms[k].st_info) != STT_FUNC || syms[k].st_value != want) continue;
              if (syms[k].st_name >= strs.sh_size) continue;
              name = reinterpret_cast<const char*>(base + strs.sh_offset + syms[k].st_name);
              break;
            }
          }
        }
      }
      ::munmap(map, size);
    }
  }
  ::close(fd);
  return name;
}

// ---------------------------------------------------------------------------------------
// Shared memory. Every __shared__ declaration declares a marker beside it (kernel.hpp):
// `_ZZ<function>E<n>cuda_double_shared_mark_<k>` in the symbol table. Every thread-local
// object whose name starts with `_ZZ<function>E` of a function that holds a marker is
// shared memory; its st_value is its offset in its module's TLS block. They are found once
// per process (every object loaded with a TLS segment) and poisoned at the start of every
// block, at their addresses on the OS thread that runs the block.
struct shared_var {
  std::size_t module;  // the dl_phdr_info::dlpi_tls_modid of its object
  std::size_t offset;  // in that object's TLS block
  std::size_t bytes;
};

constexpr unsigned char shared_poison = 0xFF;

#if defined(CUDA_DOUBLE_TSAN)
}  // namespace
}  // namespace cuda_double::detail
// ThreadSanitizer's calls for a managed heap (tsan_interface_java.h, not installed): an
// object freed, an object allocated. Together they clear what the detector recorded of a
// range, and its synchronization objects.
extern "C" void __tsan_java_free(unsigned long ptr, unsigned long size);   // NOLINT
extern "C" void __tsan_java_alloc(unsigned long ptr, unsigned long size);  // NOLINT
namespace cuda_double::detail {
namespace {
// A block's shared memory is new memory: its OS thread's previous block used the same
// addresses, and nothing orders that block's threads before this one's (fiber_ring), so
// their accesses are forgotten, as the previous owner's are when memory is freed.
void forget_accesses(unsigned char* p, std::size_t n) {
  const auto begin = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{7};
  const auto end = (reinterpret_cast<std::uintptr_t>(p) + n + 7) & ~std::uintptr_t{7};
  __tsan_java_free(begin, end - begin);
  __tsan_java_alloc(begin, end - begin);
}
#endif

// The marker symbol's function prefix `_ZZ<function>E`, or empty when \p name is no marker.
std::string marker_prefix(const char* name) {
  static constexpr const char mark[] = "cuda_double_shared_mark_";
  if (std::strncmp(name, "_ZZ", 3) != 0) return {};
  const char* at = std::strstr(name, mark);
  if (at == nullptr) return {};
  const char* digits = at;
  while (digits > name && std::isdigit(static_cast<unsigned char>(digits[-1])) != 0) --digits;
  if (digits == at || digits == name || digits[-1] != 'E') return {};
  return std::string(name, digits);
}

// The shared variables of the object file \p file (TLS module \p module).
void scan_shared(const std::string& file, std::size_t module, std::vector<shared_var>& out) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < sizeof(Elf64_Ehdr)) {
    ::close(fd);
    return;
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return;
  const auto* base = static_cast<const unsigned char*>(map);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  const bool ok = std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
                  eh->e_shoff != 0 && eh->e_shoff + std::size_t{eh->e_shnum} * sizeof(Elf64_Shdr) <= size;
  if (ok) {
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; ++i) {
      if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
      const Elf64_Shdr& strs = sh[sh[i].sh_link];
      if (sh[i].sh_offset + sh[i].sh_size > size || strs.sh_offset + strs.sh_size > size) continue;
      const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
      const std::size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
      const auto* names = reinterpret_cast<const char*>(base + strs.sh_offset);
      // The thread-local function statics, and the functions that declare shared memory.
      std::vector<const Elf64_Sym*> statics;
      std::vector<std::string> prefixes;
      for (std::size_t k = 0; k < n; ++k) {
        if (ELF64_ST_TYPE(syms[k].st_info) != STT_TLS || syms[k].st_name >= strs.sh_size) continue;
        const char* name = names + syms[k].st_name;
        if (std::strncmp(name, "_ZZ", 3) != 0) continue;
        if (std::string p = marker_prefix(name); !p.empty())
          prefixes.push_back(std::move(p));
        else
          statics.push_back(&syms[k]);
      }
      std::sort(prefixes.begin(), prefixes.end());
      prefixes.erase(std::unique(prefixes.begin(), prefixes.end()), prefixes.end());
      for (const Elf64_Sym* sym : statics) {
        const std::string_view name(names + sym->st_name);
        // The greatest prefix not above name is the only candidate (the prefixes, whole
        // function names, are not prefixes of one another).
        auto it = std::upper_bound(prefixes.begin(), prefixes.end(), name,
                                   [](std::string_view a, const std::string& b) { return a < b; });
        const bool shared = it != prefixes.begin() && name.starts_with(*std::prev(it));
        if (shared && sym->st_size > 0) out.push_back({module, sym->st_value, sym->st_size});
      }
    }
  }
  ::munmap(map, size);
}

// Every shared variable of the process, merged into ranges per module (found once).
const std::vector<shared_var>& shared_vars() {
  static const std::vector<shared_var> vars = [] {
    std::vector<std::pair<std::string, std::size_t>> objects;
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
          auto* o = static_cast<std::vector<std::pair<std::string, std::size_t>>*>(data);
          for (int i = 0; i < info->dlpi_phnum; ++i)
            if (info->dlpi_phdr[i].p_type == PT_TLS && info->dlpi_phdr[i].p_memsz > 0) {
              o->emplace_back(
                  info->dlpi_name != nullptr && info->dlpi_name[0] != '\0' ? info->dlpi_name : "/proc/self/exe",
                  info->dlpi_tls_modid);
              break;
            }
          return 0;
        },
        &objects);
    std::vector<shared_var> v;
    for (const auto& [file, module] : objects) scan_shared(file, module, v);
    std::sort(v.begin(), v.end(), [](const shared_var& a, const shared_var& b) {
      return a.module != b.module ? a.module < b.module : a.offset < b.offset;
    });
    std::vector<shared_var> merged;
    for (const shared_var& x : v) {
      if (!merged.empty() && merged.back().module == x.module &&
          x.offset <= merged.back().offset + merged.back().bytes) {
        merged.back().bytes = std::max(merged.back().bytes, x.offset + x.bytes - merged.back().offset);
        continue;
      }
      merged.push_back(x);
    }
    return merged;
  }();
  return vars;
}

// The shared memory of this OS thread: the ranges at their addresses here (resolved once
// per OS thread; a module whose TLS this thread has not allocated yet is resolved again).
struct shared_ranges {
  std::vector<std::pair<unsigned char*, std::size_t>> at;
  bool resolved = false;
};
thread_local shared_ranges t_shared;

void poison_shared() {
  shared_ranges& r = t_shared;
  if (!r.resolved) {
    const std::vector<shared_var>& vars = shared_vars();
    struct ctx {
      const std::vector<shared_var>* vars;
      shared_ranges* r;
      bool complete = true;
    } c{&vars, &r};
    r.at.clear();
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
          auto* c = static_cast<ctx*>(data);
          for (const shared_var& v : *c->vars) {
            if (v.module != info->dlpi_tls_modid) continue;
            if (info->dlpi_tls_data == nullptr) {
              c->complete = false;
              continue;
            }
            c->r->at.emplace_back(static_cast<unsigned char*>(info->dlpi_tls_data) + v.offset, v.bytes);
          }
          return 0;
        },
        &c);
    r.resolved = c.complete;
  }
  for (const auto& [p, n] : r.at) {
#if defined(CUDA_DOUBLE_TSAN)
    forget_accesses(p, n);
#endif
    std::memset(p, shared_poison, n);
  }
}

std::string kernel_name(const launch_desc& d) {
  if (d.name != nullptr) return d.name;
  static std::mutex m;
  static std::map<const void*, std::string> cache;
  const std::lock_guard<std::mutex> lock(m);
  auto it = cache.find(d.kernel);
  if (it != cache.end()) return it->second;
  std::string name;
  Dl_info info{};
  if (dladdr(d.kernel, &info) != 0 && info.dli_sname != nullptr && info.dli_saddr == d.kernel)
    name = strip_signature(demangle(info.dli_sname));
  if (name.empty()) {
    const std::string s = symtab_name(d.kernel);
    if (!s.empty()) name = strip_signature(demangle(s.c_str()));
  }
  if (name.empty()) {
    std::ostringstream o;
    o << "<kernel at " << d.kernel << " of type " << (d.type != nullptr ? demangle(d.type->name()) : "?") << ">";
    name = o.str();
  }
  cache.emplace(d.kernel, name);
  return name;
}

std::string dims(dim3 v) {
  if (v.y == 1 && v.z == 1) return std::to_string(v.x);
  return "(" + std::to_string(v.x) + ", " + std::to_string(v.y) + ", " + std::to_string(v.z) + ")";
}

const char* op_name(sync_kind k) {
  switch (k) {
    case sync_kind::syncthreads:
      return "__syncthreads";
    case sync_kind::syncthreads_or:
      return "__syncthreads_or";
    case sync_kind::syncthreads_and:
      return "__syncthreads_and";
    case sync_kind::syncthreads_count:
      return "__syncthreads_count";
    case sync_kind::syncwarp:
      return "__syncwarp";
    case sync_kind::activemask:
      return "__activemask";
    case sync_kind::shfl_idx:
      return "__shfl_sync";
    case sync_kind::shfl_up:
      return "__shfl_up_sync";
    case sync_kind::shfl_down:
      return "__shfl_down_sync";
    case sync_kind::shfl_xor:
      return "__shfl_xor_sync";
    case sync_kind::ballot:
      return "__ballot_sync";
    case sync_kind::all:
      return "__all_sync";
    case sync_kind::any:
      return "__any_sync";
    case sync_kind::reduce_add_u:
    case sync_kind::reduce_add_i:
      return "__reduce_add_sync";
    case sync_kind::reduce_min_u:
    case sync_kind::reduce_min_i:
      return "__reduce_min_sync";
    case sync_kind::reduce_max_u:
    case sync_kind::reduce_max_i:
      return "__reduce_max_sync";
  }
  return "?";
}

std::string hex(unsigned m) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", m);
  return b;
}

// Where a parked thread waits: "__shfl_sync(mask 0xffffffff)", "__syncthreads".
std::string where(const lane& l) {
  if (l.state == lane_state::at_block) return op_name(l.kind);
  if (l.kind == sync_kind::activemask) return op_name(l.kind);
  return std::string(op_name(l.kind)) + "(mask " + hex(l.mask) + ")";
}

// "thread 5", or "thread (1, 2, 0)" in a block of more than one dimension.
std::string thread_name(const engine& e, const lane& l) {
  const dim3 b = e.desc->block;
  if (b.y == 1 && b.z == 1) return "thread " + std::to_string(l.tid.x);
  return "thread (" + std::to_string(l.tid.x) + ", " + std::to_string(l.tid.y) + ", " + std::to_string(l.tid.z) + ")";
}

// Linear indices as ranges: "0-31, 40, 64-127 (97 threads)".
std::string list(const std::vector<unsigned>& ids) {
  std::string s;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(ids[i]);
    if (j > i) s += "-" + std::to_string(ids[j]);
    i = j + 1;
  }
  return s + " (" + std::to_string(ids.size()) + (ids.size() == 1 ? " thread)" : " threads)");
}

std::string block_prefix(const engine& e) {
  const uint3 b = t_ctx.block_idx;
  return describe(*e.desc) + ", block (" + std::to_string(b.x) + ", " + std::to_string(b.y) + ", " +
         std::to_string(b.z) + "): ";
}

// Every thread's state, grouped: "threads 0-31 (32 threads) wait at __syncthreads; ...".
std::string states(const engine& e) {
  std::vector<std::pair<std::string, std::vector<unsigned>>> groups;
  for (const lane& l : e.lanes) {
    if (l.state == lane_state::runnable) continue;
    const std::string w = l.state == lane_state::done ? "returned" : "wait at " + where(l);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == w; });
    if (it == groups.end()) {
      groups.emplace_back(w, std::vector<unsigned>{});
      it = std::prev(groups.end());
    }
    it->second.push_back(l.index);
  }
  std::string s;
  for (const auto& g : groups) s += (s.empty() ? "" : "; ") + std::string("threads ") + list(g.second) + " " + g.first;
  return s.empty() ? s : s + " (linear thread indices)";
}

[[noreturn]] void fail_in_block(const engine& e, const std::string& what) {
  const std::string s = states(e);
  fail(block_prefix(e) + what + (s.empty() ? "" : " [" + s + "]"));
}

// ---------------------------------------------------------------------------------------
// Warp operations.
unsigned warp_lanes(const engine& e, unsigned w) {
  const unsigned n = e.nthreads - w * 32;
  return n >= 32 ? 32 : n;
}
unsigned existing_mask(const engine& e, unsigned w) {
  const unsigned n = warp_lanes(e, w);
  return n == 32 ? 0xffffffffu : (1u << n) - 1u;
}

// The lane a shuffle of lane \p i reads, as PTX's shfl.sync (b: the source lane, delta or
// lane mask, of which only the low 5 bits count; c = ((32 - width) << 8) | clamp, the
// clamp 0 for up and 31 otherwise). A source outside the segment is the lane itself.
unsigned shuffle_source(sync_kind k, unsigned i, std::int64_t b, int width) {
  const unsigned seg = static_cast<unsigned>(32 - width) & 0x1fu;  // the bits above a segment
  const unsigned bv = static_cast<unsigned>(b) & 0x1fu;
  const int min_lane = static_cast<int>(i & seg);
  const int max_lane = k == sync_kind::shfl_up ? min_lane : static_cast<int>((i & seg) | (0x1fu & ~seg));
  int j = static_cast<int>(i);
  bool ok = true;
  switch (k) {
    case sync_kind::shfl_idx:
      j = min_lane | static_cast<int>(bv & ~seg);
      break;
    case sync_kind::shfl_up:
      j = static_cast<int>(i) - static_cast<int>(bv);
      ok = j >= max_lane;
      break;
    case sync_kind::shfl_down:
      j = static_cast<int>(i + bv);
      ok = j <= max_lane;
      break;
    default:  // shfl_xor
      j = static_cast<int>(i ^ bv);
      ok = j <= max_lane;
      break;
  }
  return ok ? static_cast<unsigned>(j) : i;
}

// Completes the warp operation of lanes \p m of warp \p w (every one arrived, consistent).
void complete_warp_op(engine& e, unsigned w, unsigned m) {
  lane* const base = e.lanes.data() + std::size_t{w} * 32;
  const sync_kind k = base[std::countr_zero(m)].kind;
  std::uint64_t r = 0;
  switch (k) {
    case sync_kind::syncwarp:
      break;
    case sync_kind::activemask:
      r = m;
      break;
    case sync_kind::ballot:
    case sync_kind::all:
    case sync_kind::any: {
      unsigned bits = 0;
      for (unsigned mm = m; mm != 0; mm &= mm - 1) {
        const unsigned j = std::countr_zero(mm);
        if (base[j].value != 0) bits |= 1u << j;
      }
      r = k == sync_kind::ballot ? bits : k == sync_kind::all ? (bits == m) : (bits != 0);
      break;
    }
    case sync_kind::reduce_add_u:
    case sync_kind::reduce_add_i:
    case sync_kind::reduce_min_u:
    case sync_kind::reduce_max_u:
    case sync_kind::reduce_min_i:
    case sync_kind::reduce_max_i: {
      bool first = true;
      std::uint32_t acc = 0;
      for (unsigned mm = m; mm != 0; mm &= mm - 1) {
        const auto v = static_cast<std::uint32_t>(base[std::countr_zero(mm)].value);
        if (first) {
          acc = v;
          first = false;
          continue;
        }
        switch (k) {
          case sync_kind::reduce_add_u:
          case sync_kind::reduce_add_i:
            acc += v;
            break;
          case sync_kind::reduce_min_u:
            acc = v < acc ? v : acc;
            break;
          case sync_kind::reduce_max_u:
            acc = v > acc ? v : acc;
            break;
          case sync_kind::reduce_min_i:
            acc = static_cast<std::int32_t>(v) < static_cast<std::int32_t>(acc) ? v : acc;
            break;
          default:
            acc = static_cast<std::int32_t>(v) > static_cast<std::int32_t>(acc) ? v : acc;
            break;
        }
      }
      r = acc;
      break;
    }
    default: {  // shuffles: each lane its own source
      for (unsigned mm = m; mm != 0; mm &= mm - 1) {
        const unsigned i = std::countr_zero(mm);
        const unsigned j = shuffle_source(k, i, base[i].arg, base[i].width);
        // A source outside the mask (or past a partial warp) is undefined in CUDA: the
        // double gives the lane its own value.
        base[i].result = (j < 32 && ((m >> j) & 1u)) ? base[j].value : base[i].value;
      }
      for (unsigned mm = m; mm != 0; mm &= mm - 1) {
        lane& l = base[std::countr_zero(mm)];
        l.state = lane_state::runnable;
        e.runnable.push_back(l.index);
      }
      ++e.warp_epochs[w];
      return;
    }
  }
  for (unsigned mm = m; mm != 0; mm &= mm - 1) {
    lane& l = base[std::countr_zero(mm)];
    l.result = r;
    l.state = lane_state::runnable;
    e.runnable.push_back(l.index);
  }
  if (k != sync_kind::activemask) ++e.warp_epochs[w];
}

// Step 1: completes every warp operation whose lanes have all arrived; fails at once on a
// mask that names a lane that returned.
bool resolve_warp_ops(engine& e) {
  bool any = false;
  for (unsigned w = 0; w < e.nwarps; ++w) {
    if (e.warp_waiting[w] == 0) continue;
    lane* const base = e.lanes.data() + std::size_t{w} * 32;
    const unsigned n = warp_lanes(e, w);
    for (unsigned i = 0; i < n; ++i) {
      const lane& x = base[i];
      if (x.state != lane_state::at_warp || x.kind == sync_kind::activemask) continue;
      bool complete = true;
      for (unsigned mm = x.mask; mm != 0; mm &= mm - 1) {
        const lane& y = base[std::countr_zero(mm)];
        if (y.state == lane_state::done)
          fail_in_block(e, thread_name(e, y) + " (lane " + std::to_string(y.index % 32) + " of warp " +
                               std::to_string(w) + ") returned while " + thread_name(e, x) +
                               " and the other lanes of " + hex(x.mask) + " wait for it at " + where(x));
        if (y.state != lane_state::at_warp || y.kind != x.kind || y.mask != x.mask) {
          complete = false;
          break;
        }
      }
      if (!complete) continue;
      e.warp_waiting[w] -= static_cast<unsigned>(std::popcount(x.mask));
      complete_warp_op(e, w, x.mask);
      any = true;
    }
  }
  return any;
}

// Step 2: __activemask(): the lanes of each warp parked there.
bool resolve_activemask(engine& e) {
  bool any = false;
  for (unsigned w = 0; w < e.nwarps; ++w) {
    if (e.active_waiting[w] == 0) continue;
    const lane* const base = e.lanes.data() + std::size_t{w} * 32;
    unsigned m = 0;
    for (unsigned i = 0, n = warp_lanes(e, w); i < n; ++i)
      if (base[i].state == lane_state::at_warp && base[i].kind == sync_kind::activemask) m |= 1u << i;
    e.active_waiting[w] = 0;
    complete_warp_op(e, w, m);
    any = true;
  }
  return any;
}

// Step 3: the block barrier, when every thread is there.
bool resolve_block(engine& e) {
  if (e.at_block == 0) return false;
  if (e.done > 0) {
    std::vector<unsigned> gone, waiting;
    const lane* first_gone = nullptr;
    for (const lane& l : e.lanes) {
      if (l.state == lane_state::done) {
        gone.push_back(l.index);
        if (first_gone == nullptr) first_gone = &l;
      } else if (l.state == lane_state::at_block) {
        waiting.push_back(l.index);
      }
    }
    fail_in_block(e, thread_name(e, *first_gone) + " exited while threads " + list(waiting) + " wait at " +
                         op_name(e.lanes[waiting.front()].kind) +
                         " (every thread of a block must reach each barrier; returned: " + list(gone) + ")");
  }
  if (e.at_block != e.nthreads) return false;
  const sync_kind k = e.lanes[0].kind;
  int r = 0;
  for (const lane& l : e.lanes) {
    if (l.kind != k)
      fail_in_block(e, thread_name(e, l) + " waits at " + op_name(l.kind) + " while thread 0 waits at " + op_name(k) +
                           " (one barrier, different kinds)");
    if (l.value != 0) ++r;
  }
  if (k == sync_kind::syncthreads_or) r = r != 0;
  if (k == sync_kind::syncthreads_and) r = r == static_cast<int>(e.nthreads);
  if (k == sync_kind::syncthreads) r = 0;
  for (lane& l : e.lanes) {
    l.result = static_cast<std::uint64_t>(r);
    l.state = lane_state::runnable;
    e.runnable.push_back(l.index);
  }
  e.at_block = 0;
  ++e.block_epoch;
  return true;
}

// Step 4: a deadlock; names the most telling culprit.
[[noreturn]] void report_deadlock(engine& e) {
  for (unsigned w = 0; w < e.nwarps; ++w) {
    const lane* const base = e.lanes.data() + std::size_t{w} * 32;
    for (unsigned i = 0, n = warp_lanes(e, w); i < n; ++i) {
      const lane& x = base[i];
      if (x.state != lane_state::at_warp || x.kind == sync_kind::activemask) continue;
      for (unsigned mm = x.mask; mm != 0; mm &= mm - 1) {
        const lane& y = base[std::countr_zero(mm)];
        if (y.state == lane_state::at_warp && y.kind == x.kind && y.mask == x.mask) continue;
        fail_in_block(e, thread_name(e, x) + " waits at " + where(x) + " for lane " + std::to_string(y.index % 32) +
                             " of warp " + std::to_string(w) + " (" + thread_name(e, y) + "), which " +
                             (y.state == lane_state::done ? std::string("returned") : "waits at " + where(y)) +
                             ": every lane of a warp operation's mask must reach the same operation");
      }
    }
  }
  fail_in_block(e, "no thread can progress");
}

// ---------------------------------------------------------------------------------------
// Running a block.
void run_body(engine& e) {
  try {
    e.body(e.self);
  } catch (const trap_unwind&) {
    e.trapped = true;
  } catch (const std::exception& x) {
    fail(block_prefix(e) + "a device thread threw " + demangle(typeid(x).name()) + ": " + x.what());
  }
}

// The race detector's happens-before edges (nothing without it).
inline void tsan_release([[maybe_unused]] void* token) {
#if defined(CUDA_DOUBLE_TSAN)
  __tsan_release(token);
#endif
}
inline void tsan_acquire([[maybe_unused]] void* token) {
#if defined(CUDA_DOUBLE_TSAN)
  __tsan_acquire(token);
#endif
}

// The sanitizers' view of the switches (nothing without a sanitizer).
// The scheduler is about to switch to lane l.
inline void leaving_scheduler([[maybe_unused]] engine& e, [[maybe_unused]] lane& l) {
#if defined(CUDA_DOUBLE_ASAN)
  __sanitizer_start_switch_fiber(&e.sched_fake, static_cast<char*>(l.stack.sp) - l.stack.size, l.stack.size);
#endif
#if defined(CUDA_DOUBLE_TSAN)
  __tsan_switch_to_fiber(l.tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
}
// The scheduler runs again.
inline void back_in_scheduler([[maybe_unused]] engine& e) {
#if defined(CUDA_DOUBLE_ASAN)
  __sanitizer_finish_switch_fiber(e.sched_fake, nullptr, nullptr);
#endif
}
// Lane l is about to switch to the scheduler (for good when \p ending).
inline void leaving_lane([[maybe_unused]] engine& e, [[maybe_unused]] lane& l, [[maybe_unused]] bool ending) {
#if defined(CUDA_DOUBLE_ASAN)
  __sanitizer_start_switch_fiber(ending ? nullptr : &l.asan_fake, e.sched_bottom, e.sched_size);
#endif
#if defined(CUDA_DOUBLE_TSAN)
  __tsan_switch_to_fiber(e.tsan_sched, __tsan_switch_to_fiber_no_sync);
#endif
}
// Lane l runs again (for the first time when \p first: it learns the scheduler's stack).
inline void back_in_lane([[maybe_unused]] engine& e, [[maybe_unused]] lane& l, [[maybe_unused]] bool first) {
#if defined(CUDA_DOUBLE_ASAN)
  if (first)
    __sanitizer_finish_switch_fiber(nullptr, &e.sched_bottom, &e.sched_size);
  else
    __sanitizer_finish_switch_fiber(l.asan_fake, nullptr, nullptr);
#endif
}

#if defined(CUDA_DOUBLE_TSAN)
// The race detector's fibers, shared by every OS thread: a block takes one per device thread,
// with its stack, from the front of a queue of free ones and gives them back at its end. A
// fiber is a ThreadSanitizer thread, and all it did is ordered before all it does later: a
// fiber reused by the next block of its OS thread would order that block after the one
// before, and through that block's fences after others, which hid a missing fence before a
// last-block ticket. So the queue holds about ring_fibers, and a fiber comes back only
// after the blocks of that many other device threads have started: blocks close in a grid
// never share one. Fibers are never destroyed (ThreadSanitizer gives a destroyed fiber's
// thread slot to a new one, whose accesses then count as the old one's, which hid a race
// between blocks, lost_update_global). The queue's lock is invisible to the detector (this
// file is not instrumented), and the queue never allocates once made (memory the pool
// threads allocated and freed under that lock would look like a race).
class fiber_ring {
 public:
  static constexpr std::size_t ring_fibers = 7680;  // 30 blocks of 256 threads
  //! Gives each of \p lanes a fiber of its own, with its stack.
  void take(std::vector<lane>& lanes) {
    lock();
    // The whole ring first (a fiber reused early would order its blocks), then more only
    // when more device threads run at once than it holds beside them.
    while (count_ < lanes.size() || created_ < ring_fibers) {
      if (created_ == capacity) fail("the race detector ran out of fibers (more device threads at once than it holds)");
      push({__tsan_create_fiber(0), stacks_.allocate()});
      ++created_;
    }
    for (lane& l : lanes) {
      const entry& f = queue_[first_];
      l.tsan_fiber = f.fiber;
      l.stack = f.stack;
      first_ = (first_ + 1) % capacity;
      --count_;
    }
    unlock();
  }
  //! Takes \p lanes' fibers and stacks back (to the end of the queue).
  void give(std::vector<lane>& lanes) {
    lock();
    for (lane& l : lanes) {
      push({l.tsan_fiber, l.stack});
      l.tsan_fiber = nullptr;
    }
    unlock();
  }

 private:
  // A fiber keeps its stack: a stack another fiber used holds that fiber's accesses, which
  // nothing orders before the new one's.
  struct entry {
    void* fiber;
    bctx::stack_context stack;
  };
  // ThreadSanitizer (LLVM 14) ends the process past 8128 threads, fibers included.
  static constexpr std::size_t capacity = 8128;
  void push(const entry& f) {
    queue_[(first_ + count_) % capacity] = f;
    ++count_;
  }
  void lock() {
    while (busy_.test_and_set(std::memory_order_acquire)) busy_.wait(true, std::memory_order_relaxed);
  }
  void unlock() {
    busy_.clear(std::memory_order_release);
    busy_.notify_one();
  }
  std::atomic_flag busy_;
  bctx::protected_fixedsize_stack stacks_{stack_bytes()};
  std::unique_ptr<entry[]> queue_ = std::make_unique<entry[]>(capacity);
  std::size_t first_ = 0, count_ = 0, created_ = 0;
};
fiber_ring& fibers() {
  static fiber_ring* ring = new fiber_ring;  // never freed: pool threads outlive main
  return *ring;
}
#endif

bctx::fiber make_fiber(engine& e, lane& l) {
  l.started = false;
#if defined(CUDA_DOUBLE_TSAN)
  constexpr bool ring_stack = true;  // fiber_ring's, with the lane's fiber
#else
  constexpr bool ring_stack = false;
#endif
  bctx::fiber f(std::allocator_arg, pooled_stack{&t_pool, &l.stack, ring_stack}, [&e, &l](bctx::fiber&& sched) {
    back_in_lane(e, l, true);
    l.started = true;
    e.sched = std::move(sched);
    run_body(e);
    tsan_release(e.tsan_end);
    l.state = lane_state::done;
    ++e.done;
    leaving_lane(e, l, true);
    return std::move(e.sched);
  });
#if defined(CUDA_DOUBLE_TSAN)
  // The lane starts after what the scheduler saw: the launch and the block's poisoned shared
  // memory. The way back does not synchronize: the scheduler must not learn what a block
  // does before the grid ends (it would hand that to the next block's threads).
  __tsan_switch_to_fiber(l.tsan_fiber, 0);
  __tsan_switch_to_fiber(e.tsan_sched, __tsan_switch_to_fiber_no_sync);
#endif
  return f;
}

// Parks the running device thread until the scheduler resumes it.
void park(engine& e) {
#if defined(CUDA_DOUBLE_ASAN) || defined(CUDA_DOUBLE_TSAN)
  lane& l = *e.cur;
  leaving_lane(e, l, false);
  try {
    e.sched = std::move(e.sched).resume();
  } catch (const bctx::detail::forced_unwind&) {  // the block is abandoned (__trap)
    // The unwinding of this stack goes on, then Boost switches to the scheduler: announced
    // to AddressSanitizer now, not "for good" (that would free its fake stack under the
    // frames still to unwind). ThreadSanitizer stays on this lane's fiber until the
    // scheduler is back (discard_lane).
    back_in_lane(e, l, false);
    tsan_release(e.tsan_end);
#if defined(CUDA_DOUBLE_ASAN)
    __sanitizer_start_switch_fiber(&l.asan_fake, e.sched_bottom, e.sched_size);
#endif
    throw;
  }
  back_in_lane(e, l, false);
#else
  e.sched = std::move(e.sched).resume();
#endif
}

void run_lane(engine& e, lane& l) {
  t_ctx.thread_idx = l.tid;
  e.cur = &l;
  leaving_scheduler(e, l);
  l.fib = std::move(l.fib).resume();
  back_in_scheduler(e);
}

// Ends lane l's fiber: unwinds the stack of a parked one (after a __trap). One that never
// ran unwinds inside Boost's entry frame only (without the lane's AddressSanitizer
// handshake, which its code would have made).
void discard_lane(engine& e, lane& l) {
  if (l.fib) {
    if (l.started) {
      leaving_scheduler(e, l);
      l.fib = bctx::fiber{};
      back_in_scheduler(e);
#if defined(CUDA_DOUBLE_TSAN)
      __tsan_switch_to_fiber(e.tsan_sched, __tsan_switch_to_fiber_no_sync);
#endif
    } else {
#if defined(CUDA_DOUBLE_TSAN)
      __tsan_switch_to_fiber(l.tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
      l.fib = bctx::fiber{};
#if defined(CUDA_DOUBLE_TSAN)
      __tsan_switch_to_fiber(e.tsan_sched, __tsan_switch_to_fiber_no_sync);
#endif
    }
  }
}

void run_block(engine& e) {
  poison_shared();  // CUDA's shared memory is undefined when a block starts
  if (e.direct) {
    t_ctx.thread_idx = uint3{0, 0, 0};
    lane& l = e.lanes[0];
    e.cur = &l;
    l.state = lane_state::runnable;
    l.fenced = false;
    run_body(e);
    return;
  }
  e.runnable.clear();
  e.at_block = e.done = 0;
  e.warp_waiting.fill(0);
  e.active_waiting.fill(0);
#if defined(CUDA_DOUBLE_TSAN)
  fibers().take(e.lanes);
  forget_accesses(reinterpret_cast<unsigned char*>(&e.tsan_tokens), sizeof e.tsan_tokens);
#endif
  for (lane& l : e.lanes) {
    l.state = lane_state::runnable;
    l.fenced = false;
    l.fib = make_fiber(e, l);
    e.runnable.push_back(l.index);
  }
  std::vector<std::uint16_t>& order = e.order;
  while (!e.runnable.empty()) {
    order.swap(e.runnable);
    e.runnable.clear();
    e.random.shuffle(order);
    // The round never starts with its lowest thread: the usual broadcast is thread 0's
    // write read by the others, and a missing barrier there shows only when some reader
    // runs before the writer (else 1 - 1/n of the time).
    if (order.size() > 1) {
      const auto lowest = std::min_element(order.begin(), order.end());
      if (lowest == order.begin()) std::swap(order[0], order[1 + e.random.below(order.size() - 1)]);
    }
    for (const std::uint16_t i : order) {
      run_lane(e, e.lanes[i]);
      if (e.trapped) break;
    }
    if (e.trapped) break;
    if (e.done == e.nthreads) break;
    if (resolve_warp_ops(e) || resolve_activemask(e) || resolve_block(e)) continue;
    report_deadlock(e);
  }
  for (lane& l : e.lanes) discard_lane(e, l);
#if defined(CUDA_DOUBLE_TSAN)
  fibers().give(e.lanes);
#endif
}

// A bijection of [0, 2^bits) keyed by k (odd multipliers and xorshifts), for the order of
// grids too large to shuffle in memory; cycle-walked into [0, n).
std::uint64_t scramble(std::uint64_t x, std::uint64_t n, unsigned bits, const std::array<std::uint64_t, 4>& k) {
  const std::uint64_t mask = bits >= 64 ? ~0ULL : (1ULL << bits) - 1;
  const unsigned s = bits / 2 + 1;
  do {
    x = (x * (k[0] | 1) + k[1]) & mask;
    x ^= x >> s;
    x = (x * (k[2] | 1) + k[3]) & mask;
    x ^= x >> s;
  } while (x >= n);
  return x;
}

// The engine of this OS thread set up for the launch \p d (its random state is not touched).
void begin_grid(engine& e, const launch_desc& d, void (*body)(void*), void* self) {
  e.desc = &d;
  e.body = body;
  e.self = self;
  e.trapped = false;
  e.running = true;
  e.nthreads = d.block.x * d.block.y * d.block.z;
  e.nwarps = (e.nthreads + 31) / 32;
#if defined(CUDA_DOUBLE_TSAN)
  e.direct = false;  // a block of one thread runs on a fiber of its own too (fiber_ring)
#else
  e.direct = e.nthreads == 1;
#endif
  e.tsan_end = &e.tsan_end_token;
#if defined(CUDA_DOUBLE_TSAN)
  e.tsan_sched = __tsan_get_current_fiber();
#endif
  e.lanes.resize(e.nthreads);
  for (unsigned i = 0; i < e.nthreads; ++i) {
    lane& l = e.lanes[i];
    l.index = static_cast<std::uint16_t>(i);
    l.tid = uint3{i % d.block.x, (i / d.block.x) % d.block.y, i / (d.block.x * d.block.y)};
  }
  t_ctx.block_dim = d.block;
  t_ctx.grid_dim = d.grid;
}

// The blocks of a grid in their seeded order: a uniform shuffle for the grids of practice,
// a keyed bijection beyond. Seeds \p random with the launch's seed and draws the order.
struct grid_blocks {
  static constexpr std::uint64_t shuffled_limit = 1u << 20;
  dim3 grid;
  std::uint64_t count = 0;
  std::vector<std::uint32_t> order;
  std::array<std::uint64_t, 4> keys{};
  unsigned bits = 1;

  grid_blocks(const launch_desc& d, rng& random) : grid(d.grid) {
    random.state = d.seed;
    count = std::uint64_t{d.grid.x} * d.grid.y * d.grid.z;
    if (count <= shuffled_limit) {
      order.resize(count);
      for (std::uint32_t b = 0; b < count; ++b) order[b] = b;
      random.shuffle(order);
    } else {
      for (auto& k : keys) k = random.next();
      bits = static_cast<unsigned>(std::bit_width(count - 1));
    }
  }
  // The linear index of the n-th block to run.
  [[nodiscard]] std::uint64_t at(std::uint64_t n) const {
    return count <= shuffled_limit ? order[n] : scramble(n, count, bits, keys);
  }
  // blockIdx of linear block b.
  [[nodiscard]] uint3 index(std::uint64_t b) const {
    const std::uint64_t gxy = std::uint64_t{grid.x} * grid.y;
    return uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                 static_cast<unsigned>(b / gxy)};
  }
};

// ---------------------------------------------------------------------------------------
// Concurrent blocks (set_block_threads): one grid's blocks among the pool's OS threads.
std::atomic<unsigned>& block_threads_setting() {
  static std::atomic<unsigned> n = [] {
    const char* v = std::getenv("GRAVAC_CUDA_DOUBLE_BLOCK_THREADS");
    return v != nullptr ? static_cast<unsigned>(std::strtoul(v, nullptr, 10)) : 0u;
  }();
  return n;
}
std::atomic<unsigned>& peak_blocks() {
  static std::atomic<unsigned> n{0};
  return n;
}

struct grid_share {
  grid_share(const launch_desc& d, void (*b)(void*), void* s, const grid_blocks& g)
      : desc(d), body(b), self(s), blocks(g) {}
  const launch_desc& desc;
  void (*body)(void*);
  void* self;
  const grid_blocks& blocks;
  std::atomic<std::uint64_t> next{0};  // the next block to take, in the seeded order
  std::vector<std::uint64_t> taken;    // race detector: blocks each share has taken
  std::uint64_t next_of_share(unsigned share, unsigned shares) {
    return share + std::uint64_t{shares} * taken[share]++;
  }
  std::atomic<bool> trapped{false};  // a block called __trap(): no further block starts
  // The race detector: every thread of the grid releases here at its end, and the polling
  // thread acquires once the grid is done. The pool threads themselves never learn what a
  // block did: they synchronize with one another (their lock) between grids, and one that
  // had would hand an earlier block's work to its next blocks' threads.
  alignas(8) char tsan_end_token[8] = {};  // (8 bytes: the detector's granule, forgotten whole)
  std::atomic<unsigned> in_flight{0};      // blocks running now
  std::mutex m;
  std::string trap_why;  // the first __trap(), for the polling thread
};

void note_trap(grid_share& g, const std::string& why) {
  const std::lock_guard<std::mutex> lk(g.m);
  if (g.trap_why.empty()) g.trap_why = why;
  g.trapped = true;
}

// A block's own seed for its thread orders: the launch's, mixed with its linear index.
std::uint64_t block_seed(std::uint64_t seed, std::uint64_t b) {
  std::uint64_t z = seed + (b + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A pool thread's share of grid g: blocks taken one at a time until none is left; under
// the race detector, the blocks share, share + shares, ... of the seeded order.
void run_blocks_of(grid_share& g, [[maybe_unused]] unsigned share, [[maybe_unused]] unsigned shares) {
  engine& e = t_eng;
  const kernel_context saved = t_ctx;
  begin_grid(e, g.desc, g.body, g.self);
  e.share = &g;
  e.tsan_end = g.tsan_end_token;
  for (;;) {
    if (g.trapped.load()) break;
#if defined(CUDA_DOUBLE_TSAN)
    const std::uint64_t n = g.next_of_share(share, shares);
#else
    const std::uint64_t n = g.next.fetch_add(1);
#endif
    if (n >= g.blocks.count) break;
    const std::uint64_t b = g.blocks.at(n);
    e.random.state = block_seed(g.desc.seed, b);
    t_ctx.block_idx = g.blocks.index(b);
    // Relaxed: the count is bookkeeping. Under the race detector an acquire-release RMW on
    // it would order every block after every block that ended before it started, on any
    // pool thread, and hide a race between blocks that the OS happened not to overlap.
    const unsigned now = g.in_flight.fetch_add(1, std::memory_order_relaxed) + 1;
    for (unsigned p = peak_blocks().load(std::memory_order_relaxed);
         now > p && !peak_blocks().compare_exchange_weak(p, now, std::memory_order_relaxed);) {
    }
    run_block(e);
    g.in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (e.trapped) g.trapped = true;
  }
  e.share = nullptr;
  t_ctx = saved;
  e.cur = nullptr;
  e.running = false;
}

// The OS threads that run concurrent blocks: started on first use and kept (idle ones wait
// on a condition variable), one grid at a time. A forked child starts a pool of its own
// (the parent's threads do not exist there).
class block_pool {
 public:
  static block_pool& get() {
    static std::mutex m;
    static block_pool* pool = nullptr;
    const std::lock_guard<std::mutex> lk(m);
    if (pool == nullptr || pool->pid_ != ::getpid()) pool = new block_pool;  // never freed: threads wait in it
    return *pool;
  }
  // Runs grid g on n of the pool's threads; returns when they are done.
  void run(grid_share& g, unsigned n) {
    const std::lock_guard<std::mutex> one_grid(grid_lock_);
    std::unique_lock<std::mutex> lk(m_);
    while (threads_.size() < n) {
      const std::size_t i = threads_.size();
      threads_.emplace_back([this, i] { work(i); });
      threads_.back().detach();
    }
    g.taken.assign(n, 0);
    job_ = &g;
    wanted_ = n;
    arrived_ = finished_ = 0;
    ++generation_;
    start_.notify_all();
    done_.wait(lk, [&] { return finished_ == wanted_; });
    job_ = nullptr;
  }

 private:
  block_pool() : pid_(::getpid()) {}
  void work(std::size_t i) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      start_.wait(lk, [&] { return generation_ != seen && i < wanted_; });
      seen = generation_;
      // The grid's threads start together, so that its first blocks overlap.
      if (++arrived_ == wanted_) start_.notify_all();
      start_.wait(lk, [&] { return arrived_ == wanted_; });
      grid_share* g = job_;
      lk.unlock();
      run_blocks_of(*g, static_cast<unsigned>(i), wanted_);
      lk.lock();
      if (++finished_ == wanted_) done_.notify_all();
    }
  }
  pid_t pid_;
  std::mutex grid_lock_;
  std::mutex m_;
  std::condition_variable start_, done_;
  std::vector<std::thread> threads_;
  grid_share* job_ = nullptr;
  unsigned wanted_ = 0, arrived_ = 0, finished_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// The entry points.
std::string describe(const launch_desc& d) {
  return "kernel " + kernel_name(d) + "<<<" + dims(d.grid) + ", " + dims(d.block) + ">>>";
}

namespace {
std::atomic<std::uint64_t> g_launches{0};     // launches accepted (launches())
std::atomic<long long> g_fail_launch_in{-1};  // launches until the injected failure (-1: none)
}  // namespace

bool check_launch(dim3 grid, dim3 block, std::size_t shared_bytes, const void* kernel, const std::type_info& type,
                  const char* name) {
  if (shared_bytes != 0) {
    launch_desc d;
    d.kernel = kernel;
    d.type = &type;
    d.name = name;
    d.grid = grid;
    d.block = block;
    fail(describe(d) + " launched with " + std::to_string(shared_bytes) +
         " bytes of dynamic shared memory: the double supports only 0 (gravac declares its shared memory statically)");
  }
  const unsigned long long threads = static_cast<unsigned long long>(block.x) * block.y * block.z;
  const bool ok = block.x >= 1 && block.y >= 1 && block.z >= 1 && block.x <= 1024 && block.y <= 1024 && block.z <= 64 &&
                  threads <= 1024 && grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.x <= 0x7fffffffu &&
                  grid.y <= 65535 && grid.z <= 65535;
  if (!ok) {
    set_last_error(cudaErrorInvalidConfiguration);
    return false;
  }
  // An injected failure: the countdown reaches zero at this launch.
  long long left = g_fail_launch_in.load();
  while (left >= 0 && !g_fail_launch_in.compare_exchange_weak(left, left - 1)) {
  }
  if (left == 0) {
    set_last_error(cudaErrorLaunchOutOfResources);
    return false;
  }
  g_launches.fetch_add(1);
  return true;
}

void run_grid(const launch_desc& d, void (*body)(void*), void* self) {
  engine& e = t_eng;
  if (e.running)
    fail(describe(d) + " started while " + describe(*e.desc) +
         " runs on the same OS thread (a device thread called into the runtime)");
  const kernel_context saved = t_ctx;
  const grid_blocks blocks(d, e.random);  // e.random is seeded with d.seed here
  const unsigned threads = block_threads();
  if (threads >= 2 && blocks.count >= 2) {
    // Concurrent blocks: the pool's threads run them; this thread waits (and stays marked
    // running, so that a kernel launched from device code is still reported).
    e.desc = &d;
    e.running = true;
    grid_share g{d, body, self, blocks};
#if defined(CUDA_DOUBLE_TSAN)
    forget_accesses(reinterpret_cast<unsigned char*>(g.tsan_end_token), sizeof g.tsan_end_token);  // an earlier grid's
#endif
    const unsigned n = static_cast<unsigned>(std::min<std::uint64_t>(threads, blocks.count));
    block_pool::get().run(g, n);
    tsan_acquire(g.tsan_end_token);
    e.running = false;
    if (!g.trap_why.empty()) set_sticky(cudaErrorLaunchFailure, g.trap_why);
    return;
  }
  begin_grid(e, d, body, self);
  for (std::uint64_t n = 0; n < blocks.count && !e.trapped; ++n) {
    t_ctx.block_idx = blocks.index(blocks.at(n));
    run_block(e);
  }
  // What runs after the grid sees what its threads did (not before its end: blocks are not
  // ordered among themselves).
  tsan_acquire(&e.tsan_end_token);
  t_ctx = saved;
  e.cur = nullptr;
  e.running = false;
}

int block_sync(sync_kind k, int pred) {
  engine& e = t_eng;
  if (!e.running) fail(std::string(op_name(k)) + " called outside a kernel");
  lane& l = *e.cur;
  l.kind = k;
  l.value = pred != 0;
  if (e.direct) {
    return k == sync_kind::syncthreads ? 0 : static_cast<int>(l.value);
  }
  l.state = lane_state::at_block;
  ++e.at_block;
  l.tsan_token = &e.tsan_tokens.block[e.block_epoch % 2];
  tsan_release(l.tsan_token);
  park(e);
  tsan_acquire(l.tsan_token);
  return static_cast<int>(l.result);
}

std::uint64_t warp_sync(sync_kind k, unsigned mask, std::uint64_t value, std::int64_t arg, int width) {
  engine& e = t_eng;
  if (!e.running) fail(std::string(op_name(k)) + " called outside a kernel");
  lane& l = *e.cur;
  const unsigned lane_id = l.index % 32u, w = l.index / 32u;
  if (k != sync_kind::activemask && ((mask >> lane_id) & 1u) == 0)
    fail_in_block(e, thread_name(e, l) + " calls " + op_name(k) + " with mask " + hex(mask) +
                         ", which does not name its own lane " + std::to_string(lane_id));
  if (width < 1 || width > 32 || !std::has_single_bit(static_cast<unsigned>(width)))
    fail_in_block(e, thread_name(e, l) + " calls " + op_name(k) + " with width " + std::to_string(width) +
                         " (a power of two from 1 to 32)");
  l.kind = k;
  l.mask = mask & existing_mask(e, w);
  l.value = value;
  l.arg = arg;
  l.width = width;
  if (e.direct) {
    complete_warp_op(e, 0, 1u);
    e.runnable.clear();
    return l.result;
  }
  l.state = lane_state::at_warp;
  if (k == sync_kind::activemask) {
    ++e.active_waiting[w];
    park(e);
    return l.result;
  }
  ++e.warp_waiting[w];
  // The lanes of one warp operation are ordered. The warp's objects serve all its operations:
  // divergent groups of a warp share them, an edge too many, which can hide a race, never
  // invent one.
  l.tsan_token = &e.tsan_tokens.warp[w][e.warp_epochs[w] % 2];
  tsan_release(l.tsan_token);
  park(e);
  tsan_acquire(l.tsan_token);
  return l.result;
}

void trap() {
  engine& e = t_eng;
  if (!e.running) fail("__trap() called outside a kernel");
  const std::string why = block_prefix(e) + thread_name(e, *e.cur) + " called __trap()";
  if (e.share != nullptr)
    note_trap(*e.share, why);  // the polling thread sets it: it holds the runtime's lock
  else
    set_sticky(cudaErrorLaunchFailure, why);
  throw trap_unwind{};
}

#if defined(CUDA_DOUBLE_TSAN)  // the race detector's fences (kernel.hpp, atomic_edges)
void mark_fence() noexcept {
  if (t_eng.running && t_eng.cur != nullptr) t_eng.cur->fenced = true;
}
bool fenced() noexcept { return t_eng.running && t_eng.cur != nullptr && t_eng.cur->fenced; }
#endif

void misaligned_atomic(const void* p, std::size_t align, const char* what) {
  std::ostringstream o;
  o << what << " on the misaligned address " << p << " (needs " << align << "-byte alignment)";
  if (t_eng.running) fail_in_block(t_eng, o.str());
  fail(o.str());
}

}  // namespace cuda_double::detail

void __syncthreads() { (void)::cuda_double::detail::block_sync(::cuda_double::detail::sync_kind::syncthreads, 0); }

unsigned cuda_double::set_block_threads(unsigned n) { return detail::block_threads_setting().exchange(n); }
unsigned cuda_double::block_threads() { return detail::block_threads_setting().load(); }
unsigned cuda_double::most_blocks_at_once() { return detail::peak_blocks().load(); }
std::uint64_t cuda_double::launches() { return detail::g_launches.load(); }
void cuda_double::fail_launch_in(long long n) { detail::g_fail_launch_in.store(n < 0 ? -1 : n); }
