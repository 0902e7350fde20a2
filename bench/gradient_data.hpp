#pragma once
// Gradients for benchmarks that run a sequence of steps (dynamic_steps.hpp): a fresh
// gradient every step, either generated (Gaussian or Laplace) or recorded from a training
// run (a float32 .npy of shape (steps, parameters), or raw float32).
//
// Generated data: `draws` independent draws of the law are made once; step t uses draw
// t mod draws, rotated by a seeded offset of its own, and scaled by 1 + drift * sin(2 pi t /
// 64). Rotation makes every step's gradient a fresh arrangement of values at each index
// (without it a few cycled draws would add a persistent per-index bias that error feedback
// accumulates), at the cost of a copy instead of a draw per step; the scale drifts by up to
// drift over a cycle, at most drift * 0.1 per step.
//
// Recorded data: step t uses row t mod steps. A buffer longer than a row is tiled, each
// tile from another row (tile j uses row t + 17 j), so the tiles are not copies.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace gravac_bench {

//! Recorded gradients: \p steps rows of \p params floats, row-major.
struct recorded_gradients {
  std::size_t steps = 0;      //!< rows (training steps)
  std::size_t params = 0;     //!< floats per row (the model's parameters)
  std::vector<float> values;  //!< steps * params floats
  std::string source;         //!< the file they came from
};

namespace detail {
[[noreturn]] inline void bad_file(const std::string& path, const std::string& what) {
  throw std::runtime_error("gradient file " + path + ": " + what);
}

// The value of key \p key ('descr', 'fortran_order', 'shape') in a .npy header dict.
inline std::string npy_field(const std::string& header, const std::string& key, const std::string& path) {
  const auto at = header.find("'" + key + "'");
  if (at == std::string::npos) bad_file(path, ".npy header has no '" + key + "'");
  auto v = header.find(':', at);
  if (v == std::string::npos) bad_file(path, ".npy header is malformed at '" + key + "'");
  ++v;
  while (v < header.size() && header[v] == ' ') ++v;
  std::size_t end = v;
  if (v < header.size() && (header[v] == '\'' || header[v] == '(')) {
    const char close = header[v] == '\'' ? '\'' : ')';
    end = header.find(close, v + 1);
    if (end == std::string::npos) bad_file(path, ".npy header is malformed at '" + key + "'");
    return header.substr(v, end - v + 1);
  }
  while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  return header.substr(v, end - v);
}
}  // namespace detail

//! Reads recorded gradients from \p path. A file ending in ".npy" must hold little-endian
//! float32 ('<f4'), C order, of shape (steps, params) or (params,); any other file is raw
//! float32 rows of \p raw_params floats (0: one row of the whole file). Throws
//! std::runtime_error naming the file and what is wrong: unreadable, truncated, a wrong
//! dtype, order or shape, no data, or a non-finite value.
inline recorded_gradients load_gradients(const std::string& path, std::size_t raw_params = 0) {
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::bad_file(path, "cannot be opened");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::size_t>(in.tellg());
  in.seekg(0);
  recorded_gradients r;
  r.source = path;
  std::size_t data_offset = 0;
  const bool npy = path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0;
  if (npy) {
    char magic[8] = {};
    if (size < 10 || !in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
      detail::bad_file(path, "not a .npy file (no \\x93NUMPY magic)");
    const int major = static_cast<unsigned char>(magic[6]);
    if (major < 1 || major > 3) detail::bad_file(path, ".npy version " + std::to_string(major) + " is not supported");
    std::size_t header_len = 0;
    unsigned char len[4] = {};
    const std::size_t len_bytes = major == 1 ? 2 : 4;
    if (!in.read(reinterpret_cast<char*>(len), static_cast<std::streamsize>(len_bytes)))
      detail::bad_file(path, "truncated .npy header");
    for (std::size_t i = len_bytes; i-- > 0;) header_len = header_len * 256 + len[i];
    data_offset = 8 + len_bytes + header_len;
    if (data_offset > size) detail::bad_file(path, "truncated .npy header");
    std::string header(header_len, '\0');
    in.read(header.data(), static_cast<std::streamsize>(header_len));
    const std::string descr = detail::npy_field(header, "descr", path);
    if (descr != "'<f4'" && descr != "'|f4'")
      detail::bad_file(path, "dtype " + descr + ", expected float32 ('<f4'); convert with arr.astype(np.float32)");
    if (detail::npy_field(header, "fortran_order", path) != "False")
      detail::bad_file(path, "Fortran order is not supported; save np.ascontiguousarray(arr)");
    const std::string shape = detail::npy_field(header, "shape", path);
    std::vector<std::size_t> dims;
    for (std::size_t i = 1; i + 1 < shape.size();) {
      while (i + 1 < shape.size() && (shape[i] == ' ' || shape[i] == ',')) ++i;
      if (i + 1 >= shape.size()) break;
      std::size_t j = i, v = 0;
      while (j + 1 < shape.size() && shape[j] >= '0' && shape[j] <= '9')
        v = v * 10 + static_cast<std::size_t>(shape[j++] - '0');
      if (j == i) detail::bad_file(path, "shape " + shape + " is malformed");
      dims.push_back(v);
      i = j;
    }
    if (dims.size() == 1) {
      r.steps = 1;
      r.params = dims[0];
    } else if (dims.size() == 2) {
      r.steps = dims[0];
      r.params = dims[1];
    } else {
      detail::bad_file(path, "shape " + shape + ", expected (steps, params) or (params,)");
    }
    if (r.steps == 0 || r.params == 0) detail::bad_file(path, "shape " + shape + " holds no gradient");
    const std::size_t want = r.steps * r.params * sizeof(float);
    if (size - data_offset < want)
      detail::bad_file(path, "truncated: shape " + shape + " needs " + std::to_string(want) +
                                 " bytes of data, the file has " + std::to_string(size - data_offset));
  } else {
    if (size == 0 || size % sizeof(float) != 0)
      detail::bad_file(path,
                       "raw float32 data must be a non-zero multiple of 4 bytes, the file has " + std::to_string(size));
    const std::size_t floats = size / sizeof(float);
    r.params = raw_params == 0 ? floats : raw_params;
    if (floats % r.params != 0)
      detail::bad_file(
          path, "truncated: " + std::to_string(floats) + " floats are not whole rows of " + std::to_string(r.params));
    r.steps = floats / r.params;
  }
  r.values.resize(r.steps * r.params);
  in.seekg(static_cast<std::streamoff>(data_offset));
  if (!in.read(reinterpret_cast<char*>(r.values.data()), static_cast<std::streamsize>(r.values.size() * sizeof(float))))
    detail::bad_file(path, "read failed");
  for (std::size_t i = 0; i < r.values.size(); ++i)
    if (!std::isfinite(r.values[i]))
      detail::bad_file(path,
                       "value " + std::to_string(i) + " (step " + std::to_string(i / r.params) + ") is not finite");
  return r;
}

//! Writes \p values (\p steps rows of \p params floats) as a float32 .npy file.
inline void save_npy(const std::string& path, std::span<const float> values, std::size_t steps, std::size_t params) {
  if (values.size() != steps * params) throw std::invalid_argument("save_npy: values do not match the shape");
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(steps) + ", " +
                       std::to_string(params) + "), }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error("cannot write " + path);
  out.write("\x93NUMPY\x01\x00", 8);
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                static_cast<unsigned char>(header.size() >> 8)};
  out.write(reinterpret_cast<const char*>(len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size_bytes()));
  if (!out) throw std::runtime_error("write failed: " + path);
}

//! The data kinds of a sequence of steps.
enum class data_kind : int { gaussian = 0, laplace = 1, recorded = 2 };

//! Name of \p k as the benchmarks print it.
inline const char* data_name(data_kind k) {
  return k == data_kind::gaussian ? "gaussian" : k == data_kind::laplace ? "laplace" : "recorded";
}

//! A fresh gradient every step (see the file's description).
class gradient_stream {
 public:
  //! Generated data of \p n floats: \p law (gaussian or laplace), \p draws distinct draws,
  //! scale drifting by up to \p drift, all from \p seed.
  static gradient_stream generated(std::size_t n, data_kind law, std::uint64_t seed, std::size_t draws = 4,
                                   double drift = 0.05) {
    if (n == 0) throw std::invalid_argument("gradient_stream: n must be positive");
    if (law == data_kind::recorded)
      throw std::invalid_argument("gradient_stream: generated data is gaussian or laplace");
    if (draws == 0) throw std::invalid_argument("gradient_stream: draws must be at least 1");
    if (!(drift >= 0.0 && drift < 1.0)) throw std::invalid_argument("gradient_stream: drift must be in [0, 1)");
    gradient_stream s;
    s.kind_ = law;
    s.n_ = n;
    s.drift_ = drift;
    s.seed_ = seed;
    s.rows_ = draws;
    s.row_len_ = n;
    s.values_.resize(draws * n);
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + n + static_cast<std::uint64_t>(law));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::exponential_distribution<float> expo(1.0f);
    for (auto& x : s.values_) x = law == data_kind::gaussian ? normal(rng) : ((rng() & 1) ? 1.0f : -1.0f) * expo(rng);
    return s;
  }

  //! Recorded data \p rec laid over \p n floats (tiled when n is longer than a row).
  static gradient_stream recorded(recorded_gradients rec, std::size_t n) {
    if (n == 0) throw std::invalid_argument("gradient_stream: n must be positive");
    if (rec.steps == 0 || rec.params == 0 || rec.values.size() != rec.steps * rec.params)
      throw std::invalid_argument("gradient_stream: recorded gradients are empty or inconsistent");
    gradient_stream s;
    s.kind_ = data_kind::recorded;
    s.n_ = n;
    s.rows_ = rec.steps;
    s.row_len_ = rec.params;
    s.values_ = std::move(rec.values);
    return s;
  }

  //! Writes the gradient of step \p t into \p g (n floats).
  void fill(std::size_t t, std::span<float> g) const {
    if (g.size() != n_) throw std::invalid_argument("gradient_stream::fill: buffer size differs from n");
    if (kind_ == data_kind::recorded) {
      for (std::size_t at = 0, tile = 0; at < n_; at += row_len_, ++tile) {
        const float* row = values_.data() + ((t + 17 * tile) % rows_) * row_len_;
        std::memcpy(g.data() + at, row, std::min(row_len_, n_ - at) * sizeof(float));
      }
      return;
    }
    const float* d = values_.data() + (t % rows_) * n_;
    std::uint64_t z = (seed_ + t) * 0xbf58476d1ce4e5b9ull;  // splitmix-style offset of step t
    z ^= z >> 31;
    const std::size_t off = (static_cast<std::size_t>(z) % n_) & ~std::size_t{15};
    const float s = scale(t);
    const std::size_t head = n_ - off;
    for (std::size_t i = 0; i < head; ++i) g[i] = s * d[off + i];
    for (std::size_t i = head; i < n_; ++i) g[i] = s * d[i - head];
  }

  //! The scale of step \p t (1 for recorded data).
  [[nodiscard]] float scale(std::size_t t) const noexcept {
    if (kind_ == data_kind::recorded) return 1.0f;
    return static_cast<float>(1.0 + drift_ * std::sin(6.283185307179586 * static_cast<double>(t) / 64.0));
  }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }         //!< floats per gradient
  [[nodiscard]] data_kind kind() const noexcept { return kind_; }        //!< what the data is
  [[nodiscard]] std::size_t distinct() const noexcept { return rows_; }  //!< distinct draws or recorded steps

 private:
  data_kind kind_ = data_kind::gaussian;
  std::size_t n_ = 0, rows_ = 0, row_len_ = 0;
  double drift_ = 0;
  std::uint64_t seed_ = 0;
  std::vector<float> values_;
};

}  // namespace gravac_bench
