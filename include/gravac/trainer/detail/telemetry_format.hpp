#pragma once
//! \file
//! \brief Number formatting and stream checks of the telemetry sinks.

#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/core/step.hpp"

namespace gravac::detail {

//! Appends the shortest round-trip form of \p v; \p nan / \p pos_inf / \p neg_inf stand
//! for non-finite values (CSV writes nan and inf, JSON writes null).
inline void put_number(std::ostream& os, double v, std::string_view nan, std::string_view pos_inf,
                       std::string_view neg_inf) {
  if (std::isnan(v)) {
    os << nan;
    return;
  }
  if (std::isinf(v)) {
    os << (v > 0 ? pos_inf : neg_inf);
    return;
  }
  std::array<char, 32> buf;  // the longest shortest-form double has 24 characters
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  os.write(buf.data(), res.ptr - buf.data());
}

//! Appends the decimal form of \p v.
inline void put_integer(std::ostream& os, std::uint64_t v) {
  std::array<char, 24> buf;
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  os.write(buf.data(), res.ptr - buf.data());
}

//! Throws gravac::error when the stream failed, so that a full disk is not silent.
inline void check_stream(const std::ostream& os, std::string_view who) {
  if (os.fail()) throw error(status::io_failure, std::string(who) + ": writing the step report failed");
}

}  // namespace gravac::detail
