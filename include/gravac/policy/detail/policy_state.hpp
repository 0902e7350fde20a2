#pragma once
//! \file policy_state.hpp
//! \brief Versioned byte encoding of a policy's state for checkpoints: a header (policy tag,
//! version, fingerprint of the options and layout) followed by plain fields.
//!
//! Values are stored in the host's byte order: a checkpoint is meant to be restored on the
//! same kind of machine. Loading checks everything (tag, version, fingerprint, lengths)
//! and throws gravac::error instead of reading past the end.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"

namespace gravac::detail {

//! Appends trivially copyable values to a byte vector.
class state_writer {
 public:
  //! Appends to \p out (which is not cleared).
  explicit state_writer(std::vector<std::byte>& out) : out_(out) {}

  //! Appends one value.
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(const T& v) {
    const auto at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  //! Appends a length-prefixed array.
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put_vector(const std::vector<T>& v) {
    put<std::uint64_t>(v.size());
    const auto at = out_.size();
    out_.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(out_.data() + at, v.data(), v.size() * sizeof(T));
  }
  //! Appends the standard header: tag, version, fingerprint.
  void header(std::uint32_t tag, std::uint32_t version, std::uint64_t fingerprint) {
    put(tag);
    put(version);
    put(fingerprint);
  }

 private:
  std::vector<std::byte>& out_;
};

//! Reads what state_writer wrote, bounds-checked; every failure names the policy.
class state_reader {
 public:
  //! Reads \p in; \p who names the policy in error messages.
  state_reader(std::span<const std::byte> in, std::string who) : in_(in), who_(std::move(who)) {}

  //! Reads one value.
  template <class T>
  requires std::is_trivially_copyable_v<T> T get() {
    if (in_.size() - at_ < sizeof(T)) fail("the saved state is truncated");
    T v;
    std::memcpy(&v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  //! Reads a length-prefixed array that must hold exactly \p expected elements.
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void get_vector(std::vector<T>& v, std::size_t expected) {
    const auto n = get<std::uint64_t>();
    if (n != expected)
      fail("the saved state holds " + std::to_string(n) + " entries where " + std::to_string(expected) +
           " are expected");
    if ((in_.size() - at_) / sizeof(T) < n) fail("the saved state is truncated");
    v.resize(n);
    if (n) std::memcpy(v.data(), in_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
  }
  //! Reads and checks the standard header.
  void header(std::uint32_t tag, std::uint32_t version, std::uint64_t fingerprint) {
    if (get<std::uint32_t>() != tag) fail("the saved state belongs to another policy");
    const auto v = get<std::uint32_t>();
    if (v != version)
      fail("saved state version " + std::to_string(v) + " is not supported (expected " + std::to_string(version) + ")");
    if (get<std::uint64_t>() != fingerprint) fail("the saved state was made with other options or another layout");
  }
  //! Checks that nothing is left over.
  void finish() {
    if (at_ != in_.size()) fail("the saved state has trailing bytes");
  }
  //! Throws gravac::error naming the policy.
  [[noreturn]] void fail(const std::string& what) const {
    throw error(status::invalid_argument, who_ + "::load: " + what);
  }

 private:
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
  std::string who_;
};

//! Accumulates a fingerprint of options (doubles by their bits) and a layout.
class fingerprint {
 public:
  //! Starts from the layout's hash.
  explicit fingerprint(const layout& lay) : h_(lay.hash()) {}
  //! Mixes in one value.
  fingerprint& add(double v) noexcept {
    h_ = fnv1a_u64(std::bit_cast<std::uint64_t>(v), h_);
    return *this;
  }
  //! Mixes in one integer.
  fingerprint& add(std::uint64_t v) noexcept {
    h_ = fnv1a_u64(v, h_);
    return *this;
  }
  //! The fingerprint.
  [[nodiscard]] std::uint64_t value() const noexcept { return h_; }

 private:
  std::uint64_t h_;
};

}  // namespace gravac::detail
