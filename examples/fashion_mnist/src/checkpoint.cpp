// The example's run-state files (see fmnist/checkpoint.hpp).
#include "fmnist/checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <gravac/error.hpp>
#include <type_traits>

namespace fmnist {

namespace {

constexpr char run_magic[8] = {'F', 'M', 'N', 'R', 'U', 'N', '\0', '\0'};
// 2: the records' modeled_exposed_s and the run's ready_share (--overlap on).
// 3: the records' measured wall times (wall_s, exchange_wall_s, train_wall_s).
// 4: the local steps' state (--local-steps).
constexpr std::uint32_t run_version = 4;
constexpr std::size_t header_bytes = 32;

gravac::error io_error(const std::string& what) {
  return gravac::error(gravac::status::io_failure, what, -1, gravac::backend::io);
}

// Little-endian, unaligned, append-only (the files are read back on the same kind of machine).
class writer {
 public:
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof v);
  }
  void put(const std::string& s) {
    put<std::uint64_t>(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  template <class T>
  void put_vector(const std::vector<T>& v) {
    put<std::uint64_t>(v.size());
    for (const auto& x : v) put(x);
  }
  std::vector<std::byte>& bytes() { return out_; }

 private:
  std::vector<std::byte> out_;
};

// Every read is bounds-checked; a short or absurd field throws "malformed" with the field's name.
class reader {
 public:
  reader(std::span<const std::byte> in, const std::string& what) : in_(in), what_(what) {}
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void get(T& v, const char* field) {
    need(sizeof v, field);
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
  }
  void get(std::string& s, const char* field) {
    std::uint64_t n = 0;
    get(n, field);
    need(n, field);
    s.assign(reinterpret_cast<const char*>(in_.data() + at_), static_cast<std::size_t>(n));
    at_ += static_cast<std::size_t>(n);
  }
  template <class T>
  void get_vector(std::vector<T>& v, const char* field, std::size_t min_element_bytes) {
    std::uint64_t n = 0;
    get(n, field);
    // Against a corrupted count: every element takes at least min_element_bytes.
    need(n > (in_.size() - at_) / min_element_bytes ? in_.size() + 1 : 0, field);
    v.resize(static_cast<std::size_t>(n));
    for (auto& x : v) get(x, field);
  }
  void get(step_record& r, const char* field);
  void get(epoch_record& r, const char* field);
  void get(gravac::simulated_counters& c, const char* field) {
    get(c.clock, field);
    get(c.sent, field);
    get(c.received, field);
    get(c.calls, field);
  }
  [[nodiscard]] bool done() const { return at_ == in_.size(); }

 private:
  void need(std::uint64_t n, const char* field) const {
    if (n > in_.size() - at_)
      throw io_error("checkpoint '" + what_ + "' is unusable: malformed (field '" + field + "' runs past the end)");
  }
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
  std::string what_;
};

void put_record(writer& w, const step_record& r) {
  w.put(r.step);
  w.put<std::uint64_t>(r.epoch);
  for (double d : {r.lr, r.loss, r.train_acc, r.kept_fraction, r.bytes_sent, r.dense_bytes, r.wire_bytes_sent,
                   r.wire_bytes_received})
    w.put(d);
  w.put(r.collective);
  for (double d : {r.gain, r.compute_s, r.codec_s, r.modeled_comm_s, r.modeled_exposed_s, r.modeled_time_s,
                   r.bandwidth_gbps, r.latency_ms, r.wall_s, r.exchange_wall_s})
    w.put(d);
}

void reader::get(step_record& r, const char* field) {
  std::uint64_t epoch = 0;
  get(r.step, field);
  get(epoch, field);
  r.epoch = static_cast<std::size_t>(epoch);
  for (double* d : {&r.lr, &r.loss, &r.train_acc, &r.kept_fraction, &r.bytes_sent, &r.dense_bytes, &r.wire_bytes_sent,
                    &r.wire_bytes_received})
    get(*d, field);
  get(r.collective, field);
  for (double* d : {&r.gain, &r.compute_s, &r.codec_s, &r.modeled_comm_s, &r.modeled_exposed_s, &r.modeled_time_s,
                    &r.bandwidth_gbps, &r.latency_ms, &r.wall_s, &r.exchange_wall_s})
    get(*d, field);
}

void put_record(writer& w, const epoch_record& r) {
  w.put<std::uint64_t>(r.epoch);
  for (double d : {r.lr, r.train_loss, r.train_acc, r.test_loss, r.test_acc, r.bytes_per_rank, r.dense_bytes_per_rank,
                   r.wire_bytes_sent_per_rank, r.wire_bytes_received_per_rank, r.kept_fraction, r.compute_s, r.codec_s,
                   r.modeled_comm_s, r.modeled_exposed_s, r.modeled_time_s})
    w.put(d);
  w.put_vector(r.shadow_time_s);
  for (double d : {r.wall_s, r.train_wall_s, r.exchange_wall_s}) w.put(d);
  w.put(r.policy_state);
}

void reader::get(epoch_record& r, const char* field) {
  std::uint64_t epoch = 0;
  get(epoch, field);
  r.epoch = static_cast<std::size_t>(epoch);
  for (double* d :
       {&r.lr, &r.train_loss, &r.train_acc, &r.test_loss, &r.test_acc, &r.bytes_per_rank, &r.dense_bytes_per_rank,
        &r.wire_bytes_sent_per_rank, &r.wire_bytes_received_per_rank, &r.kept_fraction, &r.compute_s, &r.codec_s,
        &r.modeled_comm_s, &r.modeled_exposed_s, &r.modeled_time_s})
    get(*d, field);
  get_vector(r.shadow_time_s, field, sizeof(double));
  for (double* d : {&r.wall_s, &r.train_wall_s, &r.exchange_wall_s}) get(*d, field);
  get(r.policy_state, field);
}

}  // namespace

std::uint64_t fnv1a64(std::span<const std::byte> bytes) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::byte b : bytes) {
    h ^= static_cast<std::uint64_t>(b);
    h *= 0x100000001b3ull;
  }
  return h;
}

checkpoint_config checkpoint_config::parse_every(const std::string& spec) {
  checkpoint_config c;
  std::string digits = spec;
  c.every_unit = unit::steps;
  if (!digits.empty() && (digits.back() == 'e' || digits.back() == 's')) {
    c.every_unit = digits.back() == 'e' ? unit::epochs : unit::steps;
    digits.pop_back();
  }
  const bool all_digits = !digits.empty() && digits.size() <= 12 &&
                          std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  c.every = all_digits ? static_cast<std::size_t>(std::stoull(digits)) : 0;
  if (c.every == 0)
    throw gravac::error(gravac::status::invalid_argument,
                        "--checkpoint-every: expected a positive count of steps (\"100\" or \"100s\") or of epochs "
                        "(\"1e\"), got '" +
                            spec + "'");
  return c;
}

std::vector<std::byte> encode_run_state(const run_state& s) {
  writer w;
  for (std::size_t i = 0; i < header_bytes; ++i) w.put(std::byte{0});
  w.put(s.settings);
  w.put(s.rank);
  w.put(s.ranks);
  w.put(s.step);
  w.put(s.epoch);
  w.put(s.step_in_epoch);
  w.put<std::uint8_t>(s.epoch_started ? 1 : 0);
  w.put(s.data_rng);
  w.put_vector(s.order);
  w.put_vector(s.params);
  w.put_vector(s.velocity);
  w.put(s.compute_s);
  w.put_vector(s.ready_share);
  w.put(s.modeled_clock);
  w.put_vector(s.shadow_clock);
  w.put(s.wire_sent_before);
  w.put(s.wire_received_before);
  w.put<std::uint64_t>(s.sims.size());
  for (const auto& c : s.sims) {
    w.put(c.clock);
    w.put(c.sent);
    w.put(c.received);
    w.put(c.calls);
  }
  for (double d : {s.loss_sum, s.correct, s.seen, s.frac_sum, s.epoch_wall_s}) w.put(d);
  put_record(w, s.partial);
  w.put<std::uint64_t>(s.steps.size());
  for (const auto& r : s.steps) put_record(w, r);
  w.put<std::uint64_t>(s.epochs.size());
  for (const auto& r : s.epochs) put_record(w, r);
  w.put_vector(s.local_steps_state);

  auto& out = w.bytes();
  const std::uint64_t payload = out.size() - header_bytes;
  const std::uint64_t sum = fnv1a64(std::span<const std::byte>(out).subspan(header_bytes));
  const std::uint32_t zero = 0;
  std::memcpy(out.data(), run_magic, 8);
  std::memcpy(out.data() + 8, &run_version, 4);
  std::memcpy(out.data() + 12, &zero, 4);
  std::memcpy(out.data() + 16, &payload, 8);
  std::memcpy(out.data() + 24, &sum, 8);
  return std::move(out);
}

run_state decode_run_state(std::span<const std::byte> bytes, const std::string& what) {
  const auto unusable = [&](const std::string& why) {
    return io_error("checkpoint '" + what + "' is unusable: " + why);
  };
  if (bytes.size() < header_bytes)
    throw unusable("truncated (" + std::to_string(bytes.size()) + " bytes, the header alone has 32)");
  if (std::memcmp(bytes.data(), run_magic, 8) != 0) throw unusable("not a run-state file (wrong magic)");
  std::uint32_t version = 0;
  std::uint64_t payload = 0, sum = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&payload, bytes.data() + 16, 8);
  std::memcpy(&sum, bytes.data() + 24, 8);
  if (version != run_version)
    throw unusable("format version " + std::to_string(version) + ", this program reads " + std::to_string(run_version));
  if (payload != bytes.size() - header_bytes)
    throw unusable("truncated or padded (the header announces " + std::to_string(payload) +
                   " payload bytes, the file has " + std::to_string(bytes.size() - header_bytes) + ")");
  const auto body = bytes.subspan(header_bytes);
  if (fnv1a64(body) != sum) throw unusable("checksum mismatch (the file is corrupted)");

  run_state s;
  reader r(body, what);
  std::uint8_t started = 0;
  r.get(s.settings, "settings");
  r.get(s.rank, "rank");
  r.get(s.ranks, "ranks");
  r.get(s.step, "step");
  r.get(s.epoch, "epoch");
  r.get(s.step_in_epoch, "step_in_epoch");
  r.get(started, "epoch_started");
  s.epoch_started = started != 0;
  r.get(s.data_rng, "data_rng");
  r.get_vector(s.order, "order", 4);
  r.get_vector(s.params, "params", 4);
  r.get_vector(s.velocity, "velocity", 4);
  r.get(s.compute_s, "compute_s");
  r.get_vector(s.ready_share, "ready_share", 8);
  r.get(s.modeled_clock, "modeled_clock");
  r.get_vector(s.shadow_clock, "shadow_clock", 8);
  r.get(s.wire_sent_before, "wire_sent_before");
  r.get(s.wire_received_before, "wire_received_before");
  r.get_vector(s.sims, "sims", 32);
  for (double* d : {&s.loss_sum, &s.correct, &s.seen, &s.frac_sum, &s.epoch_wall_s}) r.get(*d, "epoch sums");
  r.get(s.partial, "partial epoch");
  r.get_vector(s.steps, "steps", 8);
  r.get_vector(s.epochs, "epochs", 8);
  r.get_vector(s.local_steps_state, "local steps state", 1);
  if (!r.done()) throw unusable("malformed (bytes after the last field)");
  if (s.velocity.size() != s.params.size()) throw unusable("malformed (velocity and parameters differ in size)");
  return s;
}

std::vector<std::byte> read_whole_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw io_error("checkpoint '" + path + "' is unusable: cannot open it (" + std::strerror(errno) + ")");
  std::vector<std::byte> out;
  std::byte buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw io_error("checkpoint '" + path + "' is unusable: read error");
  return out;
}

std::string checkpoint_file(const std::string& dir, std::uint64_t steps, int rank, const std::string& kind) {
  char name[96];
  std::snprintf(name, sizeof name, "step-%010llu.rank-%d.%s", static_cast<unsigned long long>(steps), rank,
                kind.c_str());
  return (std::filesystem::path(dir) / name).string();
}

std::vector<std::uint64_t> checkpoint_steps(const std::string& dir, int rank) {
  std::vector<std::uint64_t> steps;
  std::error_code ec;
  const std::string suffix_run = ".rank-" + std::to_string(rank) + ".run";
  const std::string suffix_gravac = ".rank-" + std::to_string(rank) + ".gravac";
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto ends = [&](const std::string& suf) {
      return name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
    };
    if (name.rfind("step-", 0) != 0 || !(ends(suffix_run) || ends(suffix_gravac))) continue;
    const std::string digits = name.substr(5, name.find('.') - 5);
    if (digits.size() != 10 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    steps.push_back(std::stoull(digits));
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

void prune_checkpoints(const std::string& dir, int rank, std::uint64_t newest, std::size_t keep) {
  std::size_t kept = 0;
  for (const std::uint64_t s : checkpoint_steps(dir, rank)) {
    if (s > newest) continue;  // from a later run that this one is overwriting: left alone
    if (kept++ < keep) continue;
    std::error_code ec;
    for (const char* kind : {"run", "gravac"}) std::filesystem::remove(checkpoint_file(dir, s, rank, kind), ec);
  }
}

}  // namespace fmnist
