// SPDX-License-Identifier: MIT
// The C ABI (include/gravac_c.h) over the runtime composition (gravac::runtime): every entry
// point catches everything, maps gravac::error's status to gravac_status and leaves the
// message in a thread-local string for gravac_last_error().

#include "gravac_c.h"

#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gravac/comm/callback_communicator.hpp"
#include "gravac/comm/thread_communicator.hpp"
#include "gravac/core/detail/fnv1a.hpp"
#include "gravac/runtime/make_local_steps.hpp"
#include "gravac/runtime/make_trainer.hpp"
#include "gravac/runtime/option_table.hpp"
#include "gravac/runtime/presets.hpp"

#if defined(GRAVAC_C_WITH_CUDA)
#include "device_path.hpp"  // the CUDA half (gravac_c_cuda.cu)
#endif

#ifndef GRAVAC_C_VERSION_STRING
#define GRAVAC_C_VERSION_STRING "0.0.0"
#endif

namespace rt = gravac::runtime;

namespace {

// A callback table without alltoallv: hides callback_communicator's, so that the engine is
// seen as one without it (communicator_ref::has_alltoallv() is false, and flexible never
// picks the compressed allreduce).
class callback_communicator_without_alltoallv {
 public:
  using communicator_tag = void;
  using memory_space = gravac::host_space;
  using byte_buffer = std::vector<std::byte>;
  explicit callback_communicator_without_alltoallv(const gravac_comm_callbacks& cb) : c_(cb) {}
  [[nodiscard]] int rank() const noexcept { return c_.rank(); }
  [[nodiscard]] int size() const noexcept { return c_.size(); }
  void allreduce_sum(std::span<float> d) { c_.allreduce_sum(d); }
  void allreduce_sum(std::span<double> d) { c_.allreduce_sum(d); }
  void allreduce_max(std::span<double> d) { c_.allreduce_max(d); }
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    c_.allgatherv(in, out, sizes);
  }
  void broadcast(std::span<std::byte> d, int root) { c_.broadcast(d, root); }
  void barrier() { c_.barrier(); }

 private:
  gravac::callback_communicator c_;
};
static_assert(gravac::Communicator<callback_communicator_without_alltoallv>);
static_assert(!gravac::AlltoallCommunicator<callback_communicator_without_alltoallv>);

thread_local std::string last_error;

gravac_status status_of(gravac::status s) noexcept {
  switch (s) {
    case gravac::status::ok:
      return GRAVAC_OK;
    case gravac::status::invalid_argument:
      return GRAVAC_INVALID_ARGUMENT;
    case gravac::status::malformed_packet:
      return GRAVAC_MALFORMED_PACKET;
    case gravac::status::layout_mismatch:
      return GRAVAC_LAYOUT_MISMATCH;
    case gravac::status::non_finite:
      return GRAVAC_NON_FINITE;
    case gravac::status::backend_failure:
      return GRAVAC_BACKEND_FAILURE;
    case gravac::status::timeout:
      return GRAVAC_TIMEOUT;
    case gravac::status::aborted:
      return GRAVAC_ABORTED;
    case gravac::status::io_failure:
      return GRAVAC_IO_FAILURE;
    case gravac::status::diverged:
      return GRAVAC_DIVERGED;
  }
  return GRAVAC_INTERNAL;
}

// A failure of the C boundary itself (a NULL pointer, a bad struct_size, CUDA memory).
struct c_failure {
  gravac_status code;
  std::string what;
};

[[noreturn]] void fail(gravac_status code, std::string what) { throw c_failure{code, std::move(what)}; }

#if defined(GRAVAC_C_WITH_CUDA)
// A compressor without a device form is a capability this build lacks (GRAVAC_UNSUPPORTED:
// a caller may stage through host memory instead); the rest is the library's verdict.
void require_device_accepted(const gravac::runtime::method_config& m) {
  if (!gravac::c_device::has_device_form(m))
    fail(GRAVAC_UNSUPPORTED, "compressor '" + std::string(gravac::runtime::name_of(gravac::runtime::compressor_names,
                                                                                   m.compressor)) +
                                 "' has no device form: on CUDA memory gravac compresses with " +
                                 gravac::c_device::device_forms());
  gravac::c_device::require_accepted(m);
}
#endif

void need(bool ok, const char* what) {
  if (!ok) fail(GRAVAC_INVALID_ARGUMENT, what);
}

// Runs \p f, turning every exception into a status and a message.
template <class F>
gravac_status guarded(const char* fn, F&& f) noexcept {
  try {
    f();
    last_error.clear();
    return GRAVAC_OK;
  } catch (const c_failure& e) {
    try {
      last_error = std::string(fn) + ": " + e.what;
    } catch (...) {
    }
    return e.code;
  } catch (const gravac::error& e) {
    try {
      last_error = std::string(fn) + ": " + e.what();
    } catch (...) {
    }
    return status_of(e.code());
  } catch (const std::bad_alloc&) {
    try {
      last_error = std::string(fn) + ": out of memory";
    } catch (...) {
    }
    return GRAVAC_INTERNAL;
  } catch (const std::exception& e) {
    try {
      last_error = std::string(fn) + ": " + e.what();
    } catch (...) {
    }
    return GRAVAC_INTERNAL;
  } catch (...) {
    try {
      last_error = std::string(fn) + ": unknown exception";
    } catch (...) {
    }
    return GRAVAC_INTERNAL;
  }
}

// The size of gravac_method before the CUDA fields (device, stream): callers built against
// it still pass.
constexpr std::size_t method_size_v1 = offsetof(gravac_method, device);

rt::method_config method_of(const gravac_method* m) {
  need(m != nullptr, "method is NULL");
  need(m->struct_size >= method_size_v1, "method->struct_size is smaller than sizeof(gravac_method)");
  rt::method_config c = m->preset ? rt::preset(m->preset) : rt::method_config{};
  if (m->compressor) c.compressor = rt::value_of(rt::compressor_names, m->compressor, "compressor");
  if (m->collective) c.collective = rt::value_of(rt::collective_names, m->collective, "collective");
  if (m->policy) c.policy = rt::value_of(rt::policy_names, m->policy, "policy");
  c.seed = m->seed;
  if (m->bucket_mb >= 0) c.bucket_bytes = rt::bucket_bytes_of(m->bucket_mb);
  need(m->bucket_mb == m->bucket_mb, "method->bucket_mb is NaN");
  // A live program: the policies time what they measure on this machine, not a model.
  c.gravac.time.source = gravac::time_source::measured;
  c.flexible.source = c.moo.source = gravac::network_source::measured;
  need(m->option_count == 0 || (m->option_names && m->option_values),
       "method->option_names or option_values is NULL with option_count > 0");
  for (std::size_t i = 0; i < m->option_count; ++i) {
    need(m->option_names[i] && m->option_values[i], "an option name or value is NULL");
    rt::set_option(c, m->option_names[i], m->option_values[i]);
  }
  return c;
}

// The method's whole configuration as text: what every rank must agree on.
std::string signature_of(const rt::method_config& c) {
  std::string s = rt::method_name(c) + "|seed=" + std::to_string(c.seed) +
                  "|bucket_bytes=" + std::to_string(c.bucket_bytes) +
                  "|non_finite=" + std::to_string(static_cast<int>(c.on_non_finite));
  for (const auto& o : rt::option_table()) s += "|" + std::string(o.name) + "=" + o.get(c);
  return s;
}

gravac::layout layout_of(const gravac_layer* layers, std::size_t count) {
  need(count == 0 || layers != nullptr, "layers is NULL with layer_count > 0");
  gravac::layout lay;
  for (std::size_t i = 0; i < count; ++i) {
    const auto& l = layers[i];
    need(l.name != nullptr, "a layer's name is NULL");
    need(l.ndim == 0 || l.shape != nullptr, "a layer's shape is NULL with ndim > 0");
    need(l.kind >= GRAVAC_LAYER_CONV && l.kind <= GRAVAC_LAYER_BIAS_OR_NORM, "a layer's kind is out of range");
    std::vector<std::size_t> shape = l.ndim == 0 ? std::vector<std::size_t>{1}
                                                 : std::vector<std::size_t>(l.shape, l.shape + l.ndim);
    lay.add(l.name, std::move(shape), static_cast<gravac::layer_kind>(l.kind));
  }
  return lay;
}

void fill_report(const gravac::step_report& r, gravac_step_report* out) {
  if (out == nullptr) return;
  need(out->struct_size >= sizeof(gravac_step_report),
       "report->struct_size is smaller than sizeof(gravac_step_report)");
  const auto size = out->struct_size;
  std::memset(out, 0, sizeof(gravac_step_report));
  out->struct_size = size;
  out->step = r.step;
  out->bytes_sent = r.bytes_sent;
  out->dense_bytes = r.dense_bytes;
  out->wire_bytes_sent = r.wire_bytes_sent;
  out->wire_bytes_received = r.wire_bytes_received;
  out->gain = r.gain;
  out->mean_kept_fraction =
      r.kept_fraction.empty()
          ? 0.0
          : std::accumulate(r.kept_fraction.begin(), r.kept_fraction.end(), 0.0) / double(r.kept_fraction.size());
  out->collective = gravac::to_string(r.collective).data();  // literals: NUL-terminated, static
  out->fallback = gravac::to_string(r.fallback).data();
  out->compress_s = r.compress_s;
  out->communicate_s = r.communicate_s;
  out->decompress_s = r.decompress_s;
  out->exposed_communicate_s = r.exposed_communicate_s;
  out->buckets = r.buckets;
  out->skipped = r.skipped ? 1 : 0;
}

#if defined(GRAVAC_C_WITH_CUDA)
constexpr bool with_cuda = true;
#else
constexpr bool with_cuda = false;
#endif

[[noreturn]] void no_cuda_path() {
  fail(GRAVAC_UNSUPPORTED,
       "CUDA memory: this build of libgravac_c steps host memory only (it was built without the CUDA path: no "
       "CUDA compiler, or GRAVAC_C_CUDA off); pass GRAVAC_DEVICE_HOST buffers");
}

// Where \p m's trainer steps, and on which stream (fields past the v1 struct read as host).
struct placement {
  gravac_device device = GRAVAC_DEVICE_HOST;
  void* stream = nullptr;
};
placement placement_of(const gravac_method* m) {
  placement p;
  if (m == nullptr || m->struct_size < offsetof(gravac_method, stream) + sizeof(void*)) return p;
  need(m->device == GRAVAC_DEVICE_HOST || m->device == GRAVAC_DEVICE_CUDA, "method->device is not a gravac_device");
  p.device = m->device;
  p.stream = m->stream;
  if (p.device == GRAVAC_DEVICE_HOST) need(p.stream == nullptr, "method->stream must be NULL with host memory");
  if (p.device == GRAVAC_DEVICE_CUDA && !with_cuda) no_cuda_path();
  return p;
}

// \p text and its NUL, as bytes to copy out.
std::vector<std::byte> with_nul(const std::string& text) {
  const auto* p = reinterpret_cast<const std::byte*>(text.c_str());
  return {p, p + text.size() + 1};
}

// The two-phase copy-out of the C ABI: \p produce's bytes into \p out when \p capacity
// holds them, their size (less \p terminator, a text's NUL) into \p *size; out NULL: the
// size only; too small: GRAVAC_BUFFER_TOO_SMALL with the size needed.
template <class F>
gravac_status copied_out(const char* fn, void* out, std::size_t capacity, std::size_t* size, std::size_t terminator,
                         F&& produce) noexcept {
  bool too_small = false;
  const auto s = guarded(fn, [&] {
    const std::vector<std::byte> bytes = produce();
    *size = bytes.size() - terminator;
    if (out == nullptr) return;
    if (capacity < bytes.size()) {
      too_small = true;
      return;
    }
    if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
  });
  if (s != GRAVAC_OK || !too_small) return s;
  try {
    last_error = std::string(fn) + ": capacity " + std::to_string(capacity) + " is below the " +
                 std::to_string(*size + terminator) + " bytes needed";
  } catch (...) {
  }
  return GRAVAC_BUFFER_TOO_SMALL;
}

}  // namespace

struct gravac_thread_world {
  explicit gravac_thread_world(int size) : team(size) {}
  gravac::thread_team team;
};

struct gravac_comm {
  using host_engine =
      std::variant<gravac::thread_communicator, gravac::callback_communicator, callback_communicator_without_alltoallv>;
  std::optional<host_engine> engine;  // empty: a device communicator
#if defined(GRAVAC_C_WITH_CUDA)
  gravac::c_device::comm_ptr device{};  // set: a device communicator (gravac_comm_from_device_callbacks)
#endif
  [[nodiscard]] bool is_device() const { return !engine.has_value(); }
  [[nodiscard]] rt::host_comm ref() {
    return std::visit([](auto& e) { return rt::host_comm(e); }, *engine);
  }
  [[nodiscard]] bool has_alltoallv() const { return engine && engine->index() != 2; }
};

namespace {
// Every rank's signature of what it builds (0: it failed): throws on every rank, naming
// the culprits, when one failed or differs; rethrows this rank's own failure first.
void agree(gravac_comm* comm, std::uint64_t mine, const std::exception_ptr& local_failure, const char* what) {
  std::vector<std::uint64_t> all;
  int rank = 0;
  if (!comm->is_device()) {
    auto ref = comm->ref();
    std::vector<std::byte> bytes;
    std::vector<std::size_t> sizes;
    ref.allgatherv(std::as_bytes(std::span(&mine, 1)), bytes, sizes);
    rank = ref.rank();
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      std::uint64_t theirs = 0;
      gravac::require(sizes[r] == sizeof theirs, "a rank sent a malformed method signature");
      std::memcpy(&theirs, bytes.data() + r * sizeof theirs, sizeof theirs);
      all.push_back(theirs);
    }
  } else {
#if defined(GRAVAC_C_WITH_CUDA)
    all = gravac::c_device::gather(*comm->device, mine);
    rank = gravac::c_device::rank_of(*comm->device);
#endif
  }
  if (local_failure) std::rethrow_exception(local_failure);
  std::string differ, failed;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const std::uint64_t theirs = all[r];
    if (theirs == 0)
      failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    else if (theirs != mine)
      differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!failed.empty())
    throw gravac::error(gravac::status::layout_mismatch,
                        "rank(s) " + failed + " could not build their " + std::string(what) + " (invalid method, layers or parameters)",
                        rank);
  if (!differ.empty())
    throw gravac::error(gravac::status::layout_mismatch,
                        "this rank was given another compressor, collective, policy, options, layers or parameters "
                        "than rank(s) " +
                            differ + "; every rank must create its " + std::string(what) +
                            " with the same method and layers (and parameters)",
                        rank);
}

}  // namespace

struct gravac_trainer {
  std::unique_ptr<rt::any_trainer> t;
  gravac_device device = GRAVAC_DEVICE_HOST;  // where its gradients live
  void* stream = nullptr;                     // GRAVAC_DEVICE_CUDA: the stream its compressors run on
  gravac_comm* comm = nullptr;                // the communicator it was built on
  void* step_stream = nullptr;                // the stream of the overlapped step in progress
  bool in_step = false;  // between begin_step and finish
};

struct gravac_local_steps {
  std::unique_ptr<rt::any_local_steps> l;
};

extern "C" {

int gravac_abi_version(void) { return GRAVAC_C_ABI_VERSION; }

const char* gravac_version(void) { return GRAVAC_C_VERSION_STRING; }

const char* gravac_last_error(void) { return last_error.c_str(); }

const char* gravac_status_name(gravac_status s) {
  switch (s) {
    case GRAVAC_OK:
      return "ok";
    case GRAVAC_INVALID_ARGUMENT:
      return "invalid argument";
    case GRAVAC_MALFORMED_PACKET:
      return "malformed packet";
    case GRAVAC_LAYOUT_MISMATCH:
      return "layout mismatch";
    case GRAVAC_NON_FINITE:
      return "non-finite";
    case GRAVAC_BACKEND_FAILURE:
      return "backend failure";
    case GRAVAC_TIMEOUT:
      return "timeout";
    case GRAVAC_ABORTED:
      return "aborted";
    case GRAVAC_IO_FAILURE:
      return "I/O failure";
    case GRAVAC_DIVERGED:
      return "diverged";
    case GRAVAC_BUFFER_TOO_SMALL:
      return "buffer too small";
    case GRAVAC_UNSUPPORTED:
      return "unsupported";
    case GRAVAC_INTERNAL:
      return "internal error";
  }
  return "unknown status";
}

gravac_status gravac_name_at(gravac_name_list list, size_t index, const char** name) {
  return guarded("gravac_name_at", [&] {
    need(name != nullptr, "name is NULL");
    const auto pick = [&](const auto& table, const char* what) {
      if (index >= std::size(table))
        fail(GRAVAC_INVALID_ARGUMENT, "index " + std::to_string(index) + " is past the end of the " + what +
                                          " (" + std::to_string(std::size(table)) + " entries)");
      return table[index];
    };
    switch (list) {
      case GRAVAC_COMPRESSORS:
        *name = pick(rt::compressor_names, "compressors").name.data();
        return;
      case GRAVAC_COLLECTIVES:
        *name = pick(rt::collective_names, "collectives").name.data();
        return;
      case GRAVAC_POLICIES:
        *name = pick(rt::policy_names, "policies").name.data();
        return;
      case GRAVAC_PRESETS:
        *name = pick(rt::preset_names, "presets").data();
        return;
    }
    fail(GRAVAC_INVALID_ARGUMENT, "list is not a gravac_name_list");
  });
}

size_t gravac_option_count(void) { return rt::option_table().size(); }

gravac_status gravac_option_at(size_t index, gravac_option_info* info) {
  return guarded("gravac_option_at", [&] {
    need(info != nullptr, "info is NULL");
    const auto table = rt::option_table();
    if (index >= table.size())
      fail(GRAVAC_INVALID_ARGUMENT, "index " + std::to_string(index) + " is past the end of the option table (" +
                                        std::to_string(table.size()) + " entries)");
    // Defaults as text, made once (thread-safe static initialisation).
    static const std::vector<std::string> defaults = [] {
      std::vector<std::string> d;
      const rt::method_config m{};
      for (const auto& o : rt::option_table()) d.push_back(o.get(m));
      return d;
    }();
    // The choices as NUL-terminated strings (string_views of literals, but one place to be sure).
    static const std::vector<std::string> choices = [] {
      std::vector<std::string> c;
      for (const auto& o : rt::option_table()) c.emplace_back(o.choices);
      return c;
    }();
    static const std::vector<std::string> docs = [] {
      std::vector<std::string> c;
      for (const auto& o : rt::option_table()) c.emplace_back(o.doc);
      return c;
    }();
    static const std::vector<std::string> names = [] {
      std::vector<std::string> c;
      for (const auto& o : rt::option_table()) c.emplace_back(o.name);
      return c;
    }();
    const auto& o = table[index];
    info->name = names[index].c_str();
    info->type = static_cast<gravac_option_type>(o.type);
    info->min = o.min;
    info->max = o.max;
    info->choices = choices[index].c_str();
    info->default_value = defaults[index].c_str();
    info->doc = docs[index].c_str();
  });
}

gravac_status gravac_method_check(const gravac_method* method) {
  return guarded("gravac_method_check", [&] {
    const auto m = method_of(method);
    if (placement_of(method).device == GRAVAC_DEVICE_HOST) {
      rt::require_accepted(m);
      return;
    }
#if defined(GRAVAC_C_WITH_CUDA)
    require_device_accepted(m);
#endif
  });
}

gravac_status gravac_comm_from_callbacks(const gravac_comm_callbacks* callbacks, gravac_comm** comm) {
  return guarded("gravac_comm_from_callbacks", [&] {
    need(comm != nullptr, "comm is NULL");
    *comm = nullptr;
    need(callbacks != nullptr, "callbacks is NULL");
    need(callbacks->struct_size >= sizeof(gravac_comm_callbacks),
         "callbacks->struct_size is smaller than sizeof(gravac_comm_callbacks)");
    auto c = callbacks->alltoallv
                 ? std::make_unique<gravac_comm>(gravac_comm{gravac::callback_communicator(*callbacks)})
                 : std::make_unique<gravac_comm>(gravac_comm{callback_communicator_without_alltoallv(*callbacks)});
    *comm = c.release();
  });
}

gravac_status gravac_comm_from_device_callbacks(const gravac_device_comm_callbacks* callbacks, gravac_comm** comm) {
  return guarded("gravac_comm_from_device_callbacks", [&] {
    need(comm != nullptr, "comm is NULL");
    *comm = nullptr;
    need(callbacks != nullptr, "callbacks is NULL");
    need(callbacks->struct_size >= sizeof(gravac_device_comm_callbacks),
         "callbacks->struct_size is smaller than sizeof(gravac_device_comm_callbacks)");
#if defined(GRAVAC_C_WITH_CUDA)
    auto c = std::make_unique<gravac_comm>();
    c->device = gravac::c_device::make_comm(*callbacks);
    *comm = c.release();
#else
    no_cuda_path();
#endif
  });
}

gravac_status gravac_thread_world_create(int size, gravac_thread_world** world) {
  return guarded("gravac_thread_world_create", [&] {
    need(world != nullptr, "world is NULL");
    *world = nullptr;
    need(size > 0, "size must be positive");
    *world = new gravac_thread_world(size);
  });
}

gravac_status gravac_comm_from_thread_world(gravac_thread_world* world, int rank, gravac_comm** comm) {
  return guarded("gravac_comm_from_thread_world", [&] {
    need(comm != nullptr, "comm is NULL");
    *comm = nullptr;
    need(world != nullptr, "world is NULL");
    need(rank >= 0 && rank < world->team.size(), "rank is out of range");
    *comm = new gravac_comm{gravac::thread_communicator(world->team, rank)};
  });
}

void gravac_thread_world_destroy(gravac_thread_world* world) { delete world; }

void gravac_comm_destroy(gravac_comm* comm) { delete comm; }

gravac_status gravac_trainer_create(const gravac_method* method, const gravac_layer* layers, size_t layer_count,
                                    gravac_comm* comm, gravac_trainer** trainer) {
  return guarded("gravac_trainer_create", [&] {
    need(trainer != nullptr, "trainer is NULL");
    *trainer = nullptr;
    need(comm != nullptr, "comm is NULL");
    // Everything local first, but a rank whose method or layers are invalid still takes part
    // in the agreement below, so that the other ranks fail too instead of waiting for it.
    rt::method_config m;
    gravac::layout lay;
    placement where;
    std::exception_ptr local_failure;
    std::uint64_t mine = 0;
    try {
      m = method_of(method);
      where = placement_of(method);
      if (where.device == GRAVAC_DEVICE_CUDA) {
        if (!comm->is_device())
          fail(GRAVAC_INVALID_ARGUMENT,
               "a GRAVAC_DEVICE_CUDA method needs a device communicator (gravac_comm_from_device_callbacks)");
#if defined(GRAVAC_C_WITH_CUDA)
        require_device_accepted(m);
#endif
      } else {
        if (comm->is_device())
          fail(GRAVAC_INVALID_ARGUMENT,
               "a device communicator (gravac_comm_from_device_callbacks) needs a GRAVAC_DEVICE_CUDA method");
        rt::require_accepted(m);
      }
      lay = layout_of(layers, layer_count);
      if (m.collective == rt::collective_id::compressed_allreduce && !comm->has_alltoallv())
        fail(GRAVAC_INVALID_ARGUMENT,
             "the compressed_allreduce collective needs an alltoallv callback (it is NULL in the table)");
      const auto sig = signature_of(m) + (where.device == GRAVAC_DEVICE_CUDA ? "|device=cuda" : "");
      mine = gravac::detail::fnv1a(sig.data(), sig.size(), lay.hash());
      if (mine == 0) mine = 1;  // 0 marks a rank that failed
    } catch (...) {
      local_failure = std::current_exception();
    }
    agree(comm, mine, local_failure, "trainer");
    auto t = std::make_unique<gravac_trainer>();
    t->device = where.device;
    t->stream = where.stream;
    t->comm = comm;
    if (where.device == GRAVAC_DEVICE_HOST) {
      t->t = rt::make_trainer(m, comm->ref(), lay);
    } else {
#if defined(GRAVAC_C_WITH_CUDA)
      t->t = gravac::c_device::make_trainer(m, *comm->device, lay, where.stream);
#endif
    }
    *trainer = t.release();
  });
}

void gravac_trainer_destroy(gravac_trainer* trainer) {
  if (trainer == nullptr) return;
  try {
    if (trainer->in_step) trainer->t->finish();  // the communication thread must not outlive its buffer
  } catch (...) {
  }
  delete trainer;
}

gravac_status gravac_trainer_numel(const gravac_trainer* trainer, size_t* numel) {
  return guarded("gravac_trainer_numel", [&] {
    need(trainer != nullptr && numel != nullptr, "trainer or numel is NULL");
    *numel = trainer->t->get_layout().numel();
  });
}

namespace {
std::span<float> grads_of(gravac_trainer* trainer, float* grads, size_t numel) {
  need(trainer != nullptr, "trainer is NULL");
  const auto n = trainer->t->get_layout().numel();
  if (numel != n)
    fail(GRAVAC_INVALID_ARGUMENT,
         "numel is " + std::to_string(numel) + " but the trainer's layout has " + std::to_string(n) + " elements");
  need(grads != nullptr || n == 0, "grads is NULL");
  return {grads, numel};
}

// The buffer's memory must be the trainer's.
void placed(gravac_trainer* trainer, gravac_device device, void* stream) {
  need(device == GRAVAC_DEVICE_HOST || device == GRAVAC_DEVICE_CUDA, "device is not a gravac_device");
  if (device == GRAVAC_DEVICE_CUDA && !with_cuda) no_cuda_path();
  need(trainer != nullptr, "trainer is NULL");
  if (device == GRAVAC_DEVICE_CUDA && trainer->device == GRAVAC_DEVICE_HOST)
    fail(GRAVAC_UNSUPPORTED,
         "CUDA memory: this trainer steps host memory only (it was created for GRAVAC_DEVICE_HOST; create it with "
         "method->device = GRAVAC_DEVICE_CUDA and a device communicator to step CUDA memory)");
  if (device == GRAVAC_DEVICE_HOST && trainer->device == GRAVAC_DEVICE_CUDA)
    fail(GRAVAC_INVALID_ARGUMENT, "host memory: this trainer was created for GRAVAC_DEVICE_CUDA memory");
  if (device == GRAVAC_DEVICE_HOST) need(stream == nullptr, "stream must be NULL with host memory");
}

// A device step on \p stream: the trainer's stream (its compressors') waits for the work the
// caller queued on \p stream so far, and the communicator orders its collectives after the
// trainer's stream. Nothing for host trainers.
void enter([[maybe_unused]] gravac_trainer* trainer, [[maybe_unused]] void* stream) {
#if defined(GRAVAC_C_WITH_CUDA)
  if (trainer->device != GRAVAC_DEVICE_CUDA) return;
  gravac::c_device::order(trainer->stream, stream);
  gravac::c_device::order_after(*trainer->comm->device, trainer->stream);
#endif
}
// After a device step: later work on \p stream waits for the trainer's stream.
void leave([[maybe_unused]] gravac_trainer* trainer, [[maybe_unused]] void* stream) {
#if defined(GRAVAC_C_WITH_CUDA)
  if (trainer->device != GRAVAC_DEVICE_CUDA) return;
  gravac::c_device::order(stream, trainer->stream);
#endif
}
}  // namespace

gravac_status gravac_trainer_step(gravac_trainer* trainer, float* grads, size_t numel, gravac_device device,
                                  void* stream, gravac_step_report* report) {
  return guarded("gravac_trainer_step", [&] {
    placed(trainer, device, stream);
    const auto g = grads_of(trainer, grads, numel);
    need(!trainer->in_step, "an overlapped step is in progress (call gravac_trainer_finish first)");
    need(report == nullptr || report->struct_size >= sizeof(gravac_step_report),
         "report->struct_size is smaller than sizeof(gravac_step_report)");
    enter(trainer, stream);
    const auto& r = trainer->t->step(g);
    leave(trainer, stream);
    fill_report(r, report);
  });
}

gravac_status gravac_trainer_begin_step(gravac_trainer* trainer, float* grads, size_t numel, gravac_device device,
                                        void* stream) {
  return guarded("gravac_trainer_begin_step", [&] {
    placed(trainer, device, stream);
    const auto g = grads_of(trainer, grads, numel);
    need(!trainer->in_step, "an overlapped step is already in progress");
    enter(trainer, stream);
    trainer->t->begin_step(g);
    trainer->in_step = true;
    trainer->step_stream = stream;
  });
}

gravac_status gravac_trainer_ready(gravac_trainer* trainer, size_t layer) {
  return guarded("gravac_trainer_ready", [&] {
    need(trainer != nullptr, "trainer is NULL");
    need(trainer->in_step, "no overlapped step is in progress (call gravac_trainer_begin_step first)");
    need(layer < trainer->t->get_layout().size(), "layer is out of range");
#if defined(GRAVAC_C_WITH_CUDA)
    // The trainer records the layer's event on this thread's per-thread default stream: make
    // that stream wait for what the caller queued on the step's stream (its backward) first.
    if (trainer->device == GRAVAC_DEVICE_CUDA) gravac::c_device::per_thread_default_after(trainer->step_stream);
#endif
    trainer->t->ready(layer);
  });
}

gravac_status gravac_trainer_finish(gravac_trainer* trainer, gravac_step_report* report) {
  return guarded("gravac_trainer_finish", [&] {
    need(trainer != nullptr, "trainer is NULL");
    need(trainer->in_step, "no overlapped step is in progress (call gravac_trainer_begin_step first)");
    need(report == nullptr || report->struct_size >= sizeof(gravac_step_report),
         "report->struct_size is smaller than sizeof(gravac_step_report)");
    trainer->in_step = false;
    const auto& r = trainer->t->finish();
    leave(trainer, trainer->step_stream);
    fill_report(r, report);
  });
}

gravac_status gravac_trainer_kept_fractions(const gravac_trainer* trainer, double* out, size_t count) {
  return guarded("gravac_trainer_kept_fractions", [&] {
    need(trainer != nullptr && out != nullptr, "trainer or out is NULL");
    const auto layers = trainer->t->get_layout().size();
    if (count != layers)
      fail(GRAVAC_INVALID_ARGUMENT,
           "count is " + std::to_string(count) + " but the trainer has " + std::to_string(layers) + " layers");
    const auto& kept = trainer->t->last_report().kept_fraction;  // empty before the first step
    for (std::size_t i = 0; i < layers; ++i) out[i] = i < kept.size() ? kept[i] : 0.0;
  });
}

gravac_status gravac_trainer_end_interval(gravac_trainer* trainer, uint64_t epoch, double learning_rate,
                                          double samples) {
  return guarded("gravac_trainer_end_interval", [&] {
    need(trainer != nullptr, "trainer is NULL");
    need(!trainer->in_step, "an overlapped step is in progress");
    trainer->t->end_interval({trainer->t->steps(), epoch, learning_rate, samples});
  });
}

gravac_status gravac_trainer_policy_state(const gravac_trainer* trainer, char* out, size_t capacity,
                                          size_t* length) {
  return copied_out("gravac_trainer_policy_state", out, capacity, length, 1, [&] {
    need(trainer != nullptr && length != nullptr, "trainer or length is NULL");
    return with_nul(trainer->t->policy_state());
  });
}

gravac_status gravac_trainer_save(const gravac_trainer* trainer, void* out, size_t capacity, size_t* size) {
  return copied_out("gravac_trainer_save", out, capacity, size, 0, [&] {
    need(trainer != nullptr && size != nullptr, "trainer or size is NULL");
    need(!trainer->in_step, "an overlapped step is in progress");
    return trainer->t->save_state();
  });
}

gravac_status gravac_trainer_load(gravac_trainer* trainer, const void* data, size_t size) {
  return guarded("gravac_trainer_load", [&] {
    need(trainer != nullptr, "trainer is NULL");
    need(data != nullptr || size == 0, "data is NULL");
    need(!trainer->in_step, "an overlapped step is in progress");
    trainer->t->load_state(std::span(static_cast<const std::byte*>(data), size));
  });
}

gravac_status gravac_local_steps_create(const gravac_method* method, const gravac_layer* layers, size_t layer_count,
                                        gravac_comm* comm, const float* params, size_t numel,
                                        gravac_local_steps** local) {
  return guarded("gravac_local_steps_create", [&] {
    need(local != nullptr, "local is NULL");
    *local = nullptr;
    need(comm != nullptr, "comm is NULL");
    need(!comm->is_device(), "local steps run on host memory: give a host communicator");
    rt::method_config m;
    gravac::layout lay;
    std::exception_ptr local_failure;
    std::uint64_t mine = 0;
    try {
      m = method_of(method);
      if (placement_of(method).device != GRAVAC_DEVICE_HOST)
        fail(GRAVAC_UNSUPPORTED, "local steps step host memory only: pass GRAVAC_DEVICE_HOST parameters");
      rt::require_local_accepted(m);
      lay = layout_of(layers, layer_count);
      need(params != nullptr || numel == 0, "params is NULL");
      need(numel == lay.numel(), "numel differs from the layers' element count");
      // The parameters are part of the agreement: every rank must start from the same point.
      const auto sig = signature_of(m) + "|local";
      mine = gravac::detail::fnv1a(params, numel * sizeof(float), gravac::detail::fnv1a(sig.data(), sig.size(),
                                                                                      lay.hash()));
      if (mine == 0) mine = 1;
    } catch (...) {
      local_failure = std::current_exception();
    }
    agree(comm, mine, local_failure, "local steps");
    auto l = std::make_unique<gravac_local_steps>();
    l->l = rt::make_local_steps(m, comm->ref(), lay, std::span<const float>(params, numel));
    *local = l.release();
  });
}

void gravac_local_steps_destroy(gravac_local_steps* local) { delete local; }

namespace {
std::span<float> floats_of(gravac_local_steps* local, float* data, size_t numel, const char* what) {
  need(local != nullptr, "local is NULL");
  need(data != nullptr || numel == 0, "the buffer is NULL");
  const std::size_t n = local->l->get_layout().numel();
  if (numel != n)
    fail(GRAVAC_INVALID_ARGUMENT, std::string(what) + ": " + std::to_string(numel) + " floats for a layout of " +
                                      std::to_string(n));
  return {data, numel};
}
void set_flag(int* flag, const gravac::step_report* r, gravac_step_report* report) {
  if (flag != nullptr) *flag = r != nullptr ? 1 : 0;
  if (r != nullptr) fill_report(*r, report);
}
}  // namespace

gravac_status gravac_local_steps_before(gravac_local_steps* local, float* grads, size_t numel, int* averaged,
                                        gravac_step_report* report) {
  return guarded("gravac_local_steps_before", [&] {
    const auto g = floats_of(local, grads, numel, "grads");
    set_flag(averaged, local->l->before_inner_step(g), report);
  });
}

gravac_status gravac_local_steps_after(gravac_local_steps* local, float* params, size_t numel, int* exchanged,
                                       gravac_step_report* report) {
  return guarded("gravac_local_steps_after", [&] {
    const auto p = floats_of(local, params, numel, "params");
    set_flag(exchanged, local->l->after_inner_step(p), report);
  });
}

gravac_status gravac_local_steps_finish_round(gravac_local_steps* local, float* params, size_t numel, int* exchanged,
                                              gravac_step_report* report) {
  return guarded("gravac_local_steps_finish_round", [&] {
    const auto p = floats_of(local, params, numel, "params");
    set_flag(exchanged, local->l->finish_round(p), report);
  });
}

gravac_status gravac_local_steps_complete_exchange(gravac_local_steps* local) {
  return guarded("gravac_local_steps_complete_exchange", [&] {
    need(local != nullptr, "local is NULL");
    local->l->complete_exchange();
  });
}

gravac_status gravac_local_steps_inner_state_must_agree(const gravac_local_steps* local, int* must_agree) {
  return guarded("gravac_local_steps_inner_state_must_agree", [&] {
    need(local != nullptr && must_agree != nullptr, "local or must_agree is NULL");
    *must_agree = local->l->inner_state_must_agree() ? 1 : 0;
  });
}

gravac_status gravac_local_steps_average_inner_state(gravac_local_steps* local, float* state, size_t n) {
  return guarded("gravac_local_steps_average_inner_state", [&] {
    need(local != nullptr, "local is NULL");
    need(state != nullptr || n == 0, "state is NULL");
    local->l->average_inner_state(std::span<float>(state, n));
  });
}

gravac_status gravac_local_steps_get_info(const gravac_local_steps* local, gravac_local_steps_info* info) {
  return guarded("gravac_local_steps_get_info", [&] {
    need(local != nullptr && info != nullptr, "local or info is NULL");
    need(info->struct_size >= sizeof(gravac_local_steps_info),
         "info->struct_size is smaller than sizeof(gravac_local_steps_info)");
    info->period = local->l->period();
    info->round_step = local->l->round_step();
    info->inner_steps = local->l->inner_steps();
    info->exchanges = local->l->exchanges();
    info->exchange_in_flight = local->l->exchange_in_flight() ? 1 : 0;
  });
}

gravac_status gravac_local_steps_global_params(const gravac_local_steps* local, float* out, size_t numel) {
  return guarded("gravac_local_steps_global_params", [&] {
    need(local != nullptr && (out != nullptr || numel == 0), "local or out is NULL");
    const auto g = local->l->global_params();
    need(numel == g.size(), "numel differs from the layers' element count");
    std::copy(g.begin(), g.end(), out);
  });
}

gravac_status gravac_local_steps_end_interval(gravac_local_steps* local, uint64_t epoch, double learning_rate,
                                              double samples) {
  return guarded("gravac_local_steps_end_interval", [&] {
    need(local != nullptr, "local is NULL");
    local->l->end_interval({local->l->inner_steps(), epoch, learning_rate, samples});
  });
}

gravac_status gravac_local_steps_policy_state(const gravac_local_steps* local, char* out, size_t capacity,
                                              size_t* length) {
  return copied_out("gravac_local_steps_policy_state", out, capacity, length, 1, [&] {
    need(local != nullptr && length != nullptr, "local or length is NULL");
    return with_nul(local->l->policy_state());
  });
}

gravac_status gravac_local_steps_save(gravac_local_steps* local, void* out, size_t capacity, size_t* size) {
  return copied_out("gravac_local_steps_save", out, capacity, size, 0, [&] {
    need(local != nullptr && size != nullptr, "local or size is NULL");
    return local->l->save_state();
  });
}

gravac_status gravac_local_steps_load(gravac_local_steps* local, const void* data, size_t size) {
  return guarded("gravac_local_steps_load", [&] {
    need(local != nullptr, "local is NULL");
    need(data != nullptr || size == 0, "data is NULL");
    local->l->load_state(std::span(static_cast<const std::byte*>(data), size));
  });
}

}  // extern "C"
