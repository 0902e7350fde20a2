// The C ABI (libgravac_c) against the C++ library: c_abi_two_ranks (a C program whose
// collectives are C callbacks) must give the bits of gravac::trainer over
// thread_communicator; and the ABI's error model, argument checks and rank agreement.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "gravac/checkpoint.hpp"
#include "gravac/collective/allgather.hpp"
#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/comm/thread_communicator.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/policy/fixed_policy.hpp"
#include "gravac/trainer.hpp"
#include "gravac_c.h"

namespace {

constexpr int steps = 4;

// The same function as c_abi_two_ranks.c's grad_at.
float grad_at(std::size_t i, unsigned step, int rank) {
  std::uint64_t h =
      (std::uint64_t)i * 0x9E3779B97F4A7C15ull ^ ((std::uint64_t)step << 32) ^ ((std::uint64_t)rank << 48);
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return (float)((std::int32_t)(h >> 40) - (1 << 23)) / (float)(1 << 23);
}

// The C program's model.
gravac::layout model_layout() {
  gravac::layout l;
  l.add("conv1.weight", {8, 3, 3, 3}, gravac::layer_kind::conv);
  l.add("conv1.bias", {8}, gravac::layer_kind::bias_or_norm);
  l.add("fc.weight", {10, 32}, gravac::layer_kind::dense);
  l.add("fc.bias", {10}, gravac::layer_kind::bias_or_norm);
  l.add("scale", {1}, gravac::layer_kind::bias_or_norm);
  return l;
}

template <class T>
std::vector<T> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE(f.good());
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() % sizeof(T) == 0);
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// gravac::trainer<C, K, P> over thread_communicator on the C program's gradients; requires
// the C program's files to hold the same bits.
template <class C, class K, class P>
void require_same_as_c(const std::filesystem::path& dir, const std::string& tag,
                       const typename gravac::trainer<C, K, P>::options& opt) {
  std::vector<std::vector<float>> outs(2);
  std::vector<std::vector<std::byte>> states(2);
  gravac::run_ranks(2, [&](gravac::thread_communicator& comm) {
    gravac::trainer<C, K, P> t(comm, model_layout(), opt);
    const auto n = t.get_layout().numel();
    auto& out = outs[static_cast<std::size_t>(comm.rank())];
    std::vector<float> g(n);
    for (unsigned s = 0; s < steps; ++s) {
      for (std::size_t i = 0; i < n; ++i) g[i] = grad_at(i, s, comm.rank());
      t.step(std::span<float>(g));
      out.insert(out.end(), g.begin(), g.end());
    }
    states[static_cast<std::size_t>(comm.rank())] = gravac::save_checkpoint_bytes(t);
  });
  for (int r = 0; r < 2; ++r) {
    INFO(tag << " rank " << r);
    const auto c_grads = read_file<float>(dir / (tag + "_rank" + std::to_string(r) + ".grads"));
    const auto c_state = read_file<std::byte>(dir / (tag + "_rank" + std::to_string(r) + ".state"));
    const auto& ref = outs[static_cast<std::size_t>(r)];
    REQUIRE(c_grads.size() == ref.size());
    CHECK(std::memcmp(c_grads.data(), ref.data(), ref.size() * sizeof(float)) == 0);
    REQUIRE(c_state.size() == states[static_cast<std::size_t>(r)].size());
    CHECK(std::memcmp(c_state.data(), states[static_cast<std::size_t>(r)].data(), c_state.size()) == 0);
  }
  // The ranks agree, and a step changed something (the comparison is not of zeros).
  CHECK(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)) == 0);
  CHECK(outs[0][0] != grad_at(0, 0, 0));
}

gravac_method method(const char* compressor, const char* collective, const char* policy) {
  gravac_method m{};
  m.struct_size = sizeof m;
  m.compressor = compressor;
  m.collective = collective;
  m.policy = policy;
  m.seed = 7;
  m.bucket_mb = -1;
  return m;
}

std::string last() { return gravac_last_error(); }

const gravac_layer one_layer[] = {{"w", nullptr, 0, GRAVAC_LAYER_DENSE}};
const std::size_t wide_shape[] = {64};
const gravac_layer wide_layer[] = {{"w", wide_shape, 1, GRAVAC_LAYER_DENSE}};

// A one-rank callback table; allreduce returns *rc (user points to rc).
gravac_comm_callbacks one_rank_callbacks(int* rc) {
  gravac_comm_callbacks cb{};
  cb.struct_size = sizeof cb;
  cb.user = rc;
  cb.rank = 0;
  cb.size = 1;
  cb.allreduce = [](void* user, void*, std::size_t, gravac_dtype, gravac_reduce_op) {
    return *static_cast<int*>(user);
  };
  cb.allgather = [](void*, const void* send, std::size_t bytes, void* recv) {
    if (bytes) std::memcpy(recv, send, bytes);
    return 0;
  };
  cb.broadcast = [](void*, void*, std::size_t, int) { return 0; };
  cb.barrier = [](void*) { return 0; };
  return cb;
}

// A trainer of \p m on one rank of the thread engine (world, comm and trainer: the caller destroys).
struct one_rank {
  gravac_thread_world* world = nullptr;
  gravac_comm* comm = nullptr;
  gravac_trainer* trainer = nullptr;
  explicit one_rank(const gravac_method& m, const gravac_layer* layers = wide_layer, std::size_t count = 1) {
    REQUIRE(gravac_thread_world_create(1, &world) == GRAVAC_OK);
    REQUIRE(gravac_comm_from_thread_world(world, 0, &comm) == GRAVAC_OK);
    REQUIRE(gravac_trainer_create(&m, layers, count, comm, &trainer) == GRAVAC_OK);
  }
  ~one_rank() {
    gravac_trainer_destroy(trainer);
    gravac_comm_destroy(comm);
    gravac_thread_world_destroy(world);
  }
};

}  // namespace

TEST_CASE("a C program stepping 2 ranks over callback collectives equals gravac::trainer bit for bit", "[c_api]") {
  const std::filesystem::path dir = GRAVAC_C_OUT_DIR;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string cmd = std::string("\"") + GRAVAC_C_TWO_RANKS + "\" \"" + dir.string() + "\"";
  REQUIRE(std::system(cmd.c_str()) == 0);

  gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy>::options topk_opt;
  topk_opt.policy.kept_fraction = 0.1;
  topk_opt.seed = 42;
  require_same_as_c<gravac::topk, gravac::allgather, gravac::fixed_policy>(dir, "topk", topk_opt);

  gravac::trainer<gravac::identity, gravac::dense_allreduce, gravac::fixed_policy>::options dense_opt;
  dense_opt.seed = 42;
  require_same_as_c<gravac::identity, gravac::dense_allreduce, gravac::fixed_policy>(dir, "dense", dense_opt);
}

TEST_CASE("C ABI: versions, names and the option table", "[c_api]") {
  CHECK(gravac_abi_version() == GRAVAC_C_ABI_VERSION);
  CHECK(std::string(gravac_version()) == GRAVAC_PROJECT_VERSION);
  CHECK(std::string(gravac_status_name(GRAVAC_LAYOUT_MISMATCH)) == "layout mismatch");
  const char* name = nullptr;
  REQUIRE(gravac_name_at(GRAVAC_COMPRESSORS, 1, &name) == GRAVAC_OK);
  CHECK(std::string(name) == "topk");
  REQUIRE(gravac_name_at(GRAVAC_PRESETS, 0, &name) == GRAVAC_OK);
  CHECK(std::string(name) == "recommended");
  CHECK(gravac_name_at(GRAVAC_POLICIES, 100, &name) == GRAVAC_INVALID_ARGUMENT);
  CHECK(last().find("past the end") != std::string::npos);
  CHECK(gravac_name_at(GRAVAC_POLICIES, 0, nullptr) == GRAVAC_INVALID_ARGUMENT);
  REQUIRE(gravac_option_count() > 0);
  gravac_option_info info{};
  REQUIRE(gravac_option_at(0, &info) == GRAVAC_OK);
  CHECK(std::string(info.name) == "kept_fraction");
  CHECK(info.type == GRAVAC_OPTION_REAL);
  CHECK(std::stod(info.default_value) == 0.01);
  CHECK(gravac_option_at(gravac_option_count(), &info) == GRAVAC_INVALID_ARGUMENT);
  // A successful call clears the message.
  REQUIRE(gravac_option_at(0, &info) == GRAVAC_OK);
  CHECK(last().empty());
}

TEST_CASE("C ABI: invalid methods name what is wrong", "[c_api]") {
  auto m = method("nope", "allgather", "fixed");
  CHECK(gravac_method_check(&m) == GRAVAC_INVALID_ARGUMENT);
  CHECK(last().find("compressor 'nope'") != std::string::npos);

  m = method("topk", "allgather", "fixed");
  const char* names[] = {"no_such_option"};
  const char* values[] = {"1"};
  m.option_names = names;
  m.option_values = values;
  m.option_count = 1;
  CHECK(gravac_method_check(&m) == GRAVAC_INVALID_ARGUMENT);
  CHECK(last().find("no_such_option") != std::string::npos);

  names[0] = "kept_fraction";
  values[0] = "2";
  CHECK(gravac_method_check(&m) == GRAVAC_INVALID_ARGUMENT);
  CHECK(last().find("kept_fraction") != std::string::npos);
  CHECK(last().find("out of range") != std::string::npos);
  values[0] = "0.5";
  CHECK(gravac_method_check(&m) == GRAVAC_OK);

  // A composition the library refuses.
  m = method("qsgd", "allreduce_compatible", "fixed");
  CHECK(gravac_method_check(&m) == GRAVAC_INVALID_ARGUMENT);
  CHECK(!last().empty());

  gravac_method preset{};
  preset.struct_size = sizeof preset;
  preset.preset = "nope";
  CHECK(gravac_method_check(&preset) == GRAVAC_INVALID_ARGUMENT);
  CHECK(last().find("preset 'nope'") != std::string::npos);
  preset.preset = "recommended";
  CHECK(gravac_method_check(&preset) == GRAVAC_OK);
}

TEST_CASE("C ABI: NULL pointers and bad struct sizes are invalid arguments", "[c_api]") {
  CHECK(gravac_method_check(nullptr) == GRAVAC_INVALID_ARGUMENT);
  auto m = method("topk", "allgather", "fixed");
  m.struct_size = 4;
  CHECK(gravac_method_check(&m) == GRAVAC_INVALID_ARGUMENT);
  CHECK(last().find("struct_size") != std::string::npos);
  m.struct_size = sizeof m;
  m.option_count = 1;  // names and values NULL
  CHECK(gravac_method_check(&m) == GRAVAC_INVALID_ARGUMENT);

  gravac_comm* comm = nullptr;
  CHECK(gravac_comm_from_callbacks(nullptr, &comm) == GRAVAC_INVALID_ARGUMENT);
  int ok_rc = 0;
  auto cb = one_rank_callbacks(&ok_rc);
  cb.struct_size = 0;
  CHECK(gravac_comm_from_callbacks(&cb, &comm) == GRAVAC_INVALID_ARGUMENT);
  cb = one_rank_callbacks(&ok_rc);
  cb.allreduce = nullptr;
  CHECK(gravac_comm_from_callbacks(&cb, &comm) == GRAVAC_INVALID_ARGUMENT);
  CHECK(last().find("allreduce") != std::string::npos);
  CHECK(comm == nullptr);
  gravac_thread_world* world = nullptr;
  CHECK(gravac_thread_world_create(0, &world) == GRAVAC_INVALID_ARGUMENT);
  CHECK(gravac_thread_world_create(1, nullptr) == GRAVAC_INVALID_ARGUMENT);

  gravac_trainer* t = nullptr;
  m = method("topk", "allgather", "fixed");
  CHECK(gravac_trainer_create(&m, one_layer, 1, nullptr, &t) == GRAVAC_INVALID_ARGUMENT);
  float g[1] = {1};
  CHECK(gravac_trainer_step(nullptr, g, 1, GRAVAC_DEVICE_HOST, nullptr, nullptr) == GRAVAC_INVALID_ARGUMENT);
  std::size_t n = 0;
  CHECK(gravac_trainer_numel(nullptr, &n) == GRAVAC_INVALID_ARGUMENT);
  CHECK(gravac_trainer_save(nullptr, nullptr, 0, &n) == GRAVAC_INVALID_ARGUMENT);
  CHECK(gravac_trainer_load(nullptr, g, 4) == GRAVAC_INVALID_ARGUMENT);
  gravac_trainer_destroy(nullptr);
  gravac_comm_destroy(nullptr);
  gravac_thread_world_destroy(nullptr);

  one_rank r(method("topk", "allgather", "fixed"));
  std::vector<float> grads(64, 1.0f);
  CHECK(gravac_trainer_step(r.trainer, nullptr, 64, GRAVAC_DEVICE_HOST, nullptr, nullptr) == GRAVAC_INVALID_ARGUMENT);
  CHECK(gravac_trainer_step(r.trainer, grads.data(), 63, GRAVAC_DEVICE_HOST, nullptr, nullptr) ==
        GRAVAC_INVALID_ARGUMENT);
  CHECK(last().find("63") != std::string::npos);
  gravac_step_report report{};
  report.struct_size = 8;
  CHECK(gravac_trainer_step(r.trainer, grads.data(), 64, GRAVAC_DEVICE_HOST, nullptr, &report) ==
        GRAVAC_INVALID_ARGUMENT);
}

TEST_CASE("C ABI: CUDA memory is unsupported in this build", "[c_api]") {
  one_rank r(method("topk", "allgather", "fixed"));
  std::vector<float> grads(64, 1.0f);
  CHECK(gravac_trainer_step(r.trainer, grads.data(), 64, GRAVAC_DEVICE_CUDA, nullptr, nullptr) == GRAVAC_UNSUPPORTED);
  CHECK(last().find("host memory only") != std::string::npos);
  CHECK(gravac_trainer_begin_step(r.trainer, grads.data(), 64, GRAVAC_DEVICE_CUDA, nullptr) == GRAVAC_UNSUPPORTED);
  // The trainer still works on host memory.
  CHECK(gravac_trainer_step(r.trainer, grads.data(), 64, GRAVAC_DEVICE_HOST, nullptr, nullptr) == GRAVAC_OK);
}

TEST_CASE("C ABI: ranks built with different methods or layers fail with layout mismatch on every rank", "[c_api]") {
  const auto run = [](const gravac_method& m0, const gravac_method& m1, const gravac_layer* l1) {
    gravac_thread_world* world = nullptr;
    REQUIRE(gravac_thread_world_create(2, &world) == GRAVAC_OK);
    gravac_status st[2] = {GRAVAC_OK, GRAVAC_OK};
    std::string msg[2];
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        gravac_comm* comm = nullptr;
        if (gravac_comm_from_thread_world(world, r, &comm) != GRAVAC_OK) return;
        gravac_trainer* t = nullptr;
        st[r] = gravac_trainer_create(r == 0 ? &m0 : &m1, r == 0 ? wide_layer : l1, 1, comm, &t);
        msg[r] = gravac_last_error();
        gravac_trainer_destroy(t);
        gravac_comm_destroy(comm);
      });
    for (auto& t : threads) t.join();
    gravac_thread_world_destroy(world);
    return std::pair{std::vector<gravac_status>{st[0], st[1]}, std::vector<std::string>{msg[0], msg[1]}};
  };
  const auto a = method("topk", "allgather", "fixed");
  auto b = method("topk", "allgather", "fixed");
  const char* names[] = {"kept_fraction"};
  const char* values[] = {"0.5"};
  b.option_names = names;
  b.option_values = values;
  b.option_count = 1;
  auto [st, msg] = run(a, b, wide_layer);
  CHECK(st[0] == GRAVAC_LAYOUT_MISMATCH);
  CHECK(st[1] == GRAVAC_LAYOUT_MISMATCH);
  CHECK(msg[0].find("rank(s) 1") != std::string::npos);
  CHECK(msg[1].find("rank(s) 0") != std::string::npos);

  std::tie(st, msg) = run(a, a, one_layer);  // other layers
  CHECK(st[0] == GRAVAC_LAYOUT_MISMATCH);
  CHECK(st[1] == GRAVAC_LAYOUT_MISMATCH);

  // A rank whose method is invalid fails with its own error; the other one does not hang.
  const auto bad = method("nope", "allgather", "fixed");
  std::tie(st, msg) = run(a, bad, wide_layer);
  CHECK(st[0] == GRAVAC_LAYOUT_MISMATCH);
  CHECK(st[1] == GRAVAC_INVALID_ARGUMENT);

  std::tie(st, msg) = run(a, a, wide_layer);
  CHECK(st[0] == GRAVAC_OK);
  CHECK(st[1] == GRAVAC_OK);
}

TEST_CASE("C ABI: a callback that fails is a backend failure", "[c_api]") {
  int rc = 0;
  const auto cb = one_rank_callbacks(&rc);
  gravac_comm* comm = nullptr;
  REQUIRE(gravac_comm_from_callbacks(&cb, &comm) == GRAVAC_OK);
  const auto m = method("identity", "dense_allreduce", "fixed");
  gravac_trainer* t = nullptr;
  rc = 7;  // the trainer's construction reduces too
  CHECK(gravac_trainer_create(&m, wide_layer, 1, comm, &t) == GRAVAC_BACKEND_FAILURE);
  CHECK(last().find("allreduce returned 7") != std::string::npos);
  CHECK(t == nullptr);
  rc = 0;
  REQUIRE(gravac_trainer_create(&m, wide_layer, 1, comm, &t) == GRAVAC_OK);
  std::vector<float> grads(64, 1.0f);
  REQUIRE(gravac_trainer_step(t, grads.data(), 64, GRAVAC_DEVICE_HOST, nullptr, nullptr) == GRAVAC_OK);
  rc = 7;
  CHECK(gravac_trainer_step(t, grads.data(), 64, GRAVAC_DEVICE_HOST, nullptr, nullptr) == GRAVAC_BACKEND_FAILURE);
  CHECK(last().find("allreduce returned 7") != std::string::npos);
  gravac_trainer_destroy(t);

  // Without alltoallv, the compressed allreduce is refused when the trainer is made.
  const auto ca = method("qsgd", "compressed_allreduce", "fixed");
  if (gravac_method_check(&ca) == GRAVAC_OK) {
    CHECK(gravac_trainer_create(&ca, wide_layer, 1, comm, &t) == GRAVAC_INVALID_ARGUMENT);
    CHECK(last().find("alltoallv") != std::string::npos);
  }
  gravac_comm_destroy(comm);
}

TEST_CASE("C ABI: state round trip, corrupt state, reports and two-phase outputs", "[c_api]") {
  auto m = method("topk", "allgather", "fixed");
  one_rank r(m);
  std::vector<float> grads(64);
  for (std::size_t i = 0; i < 64; ++i) grads[i] = grad_at(i, 0, 0);
  gravac_step_report report{};
  report.struct_size = sizeof report;
  REQUIRE(gravac_trainer_step(r.trainer, grads.data(), 64, GRAVAC_DEVICE_HOST, nullptr, &report) == GRAVAC_OK);
  CHECK(report.step == 0);
  CHECK(report.dense_bytes == 64 * sizeof(float));
  CHECK(std::string(report.fallback) == "none");
  double kept = 0;
  REQUIRE(gravac_trainer_kept_fractions(r.trainer, &kept, 1) == GRAVAC_OK);
  CHECK(kept > 0);
  CHECK(gravac_trainer_kept_fractions(r.trainer, &kept, 2) == GRAVAC_INVALID_ARGUMENT);

  std::size_t size = 0;
  REQUIRE(gravac_trainer_save(r.trainer, nullptr, 0, &size) == GRAVAC_OK);
  REQUIRE(size > 16);
  std::vector<unsigned char> state(size);
  CHECK(gravac_trainer_save(r.trainer, state.data(), size - 1, &size) == GRAVAC_BUFFER_TOO_SMALL);
  CHECK(size == state.size());
  REQUIRE(gravac_trainer_save(r.trainer, state.data(), size, &size) == GRAVAC_OK);

  // Corrupt bytes: an error, and the trainer unchanged.
  for (const std::size_t at : {std::size_t{0}, size / 2, size - 1}) {
    auto bad = state;
    bad[at] ^= 0x5a;
    CHECK(gravac_trainer_load(r.trainer, bad.data(), bad.size()) != GRAVAC_OK);
    CHECK(!last().empty());
  }
  CHECK(gravac_trainer_load(r.trainer, state.data(), size / 2) != GRAVAC_OK);
  std::vector<unsigned char> after(size);
  REQUIRE(gravac_trainer_save(r.trainer, after.data(), after.size(), &size) == GRAVAC_OK);
  CHECK(after == state);

  // Round trip: the next step after load equals the next step without it.
  for (std::size_t i = 0; i < 64; ++i) grads[i] = grad_at(i, 1, 0);
  auto again = grads;
  REQUIRE(gravac_trainer_step(r.trainer, grads.data(), 64, GRAVAC_DEVICE_HOST, nullptr, nullptr) == GRAVAC_OK);
  REQUIRE(gravac_trainer_load(r.trainer, state.data(), state.size()) == GRAVAC_OK);
  REQUIRE(gravac_trainer_step(r.trainer, again.data(), 64, GRAVAC_DEVICE_HOST, nullptr, &report) == GRAVAC_OK);
  CHECK(report.step == 1);
  CHECK(std::memcmp(grads.data(), again.data(), 64 * sizeof(float)) == 0);

  // An overlapped step gives the bits of a synchronous one.
  one_rank s(m), o(m);
  std::vector<float> sync(64), over(64);
  for (std::size_t i = 0; i < 64; ++i) sync[i] = over[i] = grad_at(i, 3, 0);
  REQUIRE(gravac_trainer_step(s.trainer, sync.data(), 64, GRAVAC_DEVICE_HOST, nullptr, nullptr) == GRAVAC_OK);
  REQUIRE(gravac_trainer_begin_step(o.trainer, over.data(), 64, GRAVAC_DEVICE_HOST, nullptr) == GRAVAC_OK);
  CHECK(gravac_trainer_step(o.trainer, over.data(), 64, GRAVAC_DEVICE_HOST, nullptr, nullptr) ==
        GRAVAC_INVALID_ARGUMENT);
  REQUIRE(gravac_trainer_ready(o.trainer, 0) == GRAVAC_OK);
  REQUIRE(gravac_trainer_finish(o.trainer, &report) == GRAVAC_OK);
  CHECK(std::memcmp(sync.data(), over.data(), 64 * sizeof(float)) == 0);
  CHECK(gravac_trainer_finish(o.trainer, nullptr) == GRAVAC_INVALID_ARGUMENT);

  // Policy state, two-phase.
  one_rank g(method("topk", "allgather", "gravac"));
  std::size_t length = 0;
  REQUIRE(gravac_trainer_policy_state(g.trainer, nullptr, 0, &length) == GRAVAC_OK);
  REQUIRE(length > 0);
  std::string text(length + 1, '\0');
  CHECK(gravac_trainer_policy_state(g.trainer, text.data(), length, &length) == GRAVAC_BUFFER_TOO_SMALL);
  REQUIRE(gravac_trainer_policy_state(g.trainer, text.data(), text.size(), &length) == GRAVAC_OK);
  CHECK(std::strlen(text.c_str()) == length);
  CHECK(gravac_trainer_end_interval(g.trainer, 1, 0.1, 1000) == GRAVAC_OK);
}
