#pragma once
//! \file
//! \brief gravac::error, the single exception type, and the status codes of the low layers.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace gravac {

//! Outcome of a low-layer operation (packet validation, option checks) that does not throw.
enum class status : std::uint8_t {
  ok = 0,            //!< success
  invalid_argument,  //!< an option or argument is out of its domain
  malformed_packet,  //!< a packet from a peer failed validation
  layout_mismatch,   //!< ranks (or a checkpoint) disagree on the layout
  non_finite,        //!< a gradient held NaN or infinity
  backend_failure,   //!< MPI, NCCL, CUDA or the OS reported a failure
  timeout,           //!< a collective did not complete in time
  aborted,           //!< another rank failed and the team was aborted
  io_failure,        //!< a file could not be read or written
  diverged,          //!< ranks took different decisions for the same step (trainer check_consistency)
};

//! Short, stable name of a status code.
constexpr std::string_view to_string(status s) noexcept {
  switch (s) {
    case status::ok:
      return "ok";
    case status::invalid_argument:
      return "invalid argument";
    case status::malformed_packet:
      return "malformed packet";
    case status::layout_mismatch:
      return "layout mismatch";
    case status::non_finite:
      return "non-finite gradient";
    case status::backend_failure:
      return "backend failure";
    case status::timeout:
      return "timeout";
    case status::aborted:
      return "aborted";
    case status::io_failure:
      return "i/o failure";
    case status::diverged:
      return "ranks diverged";
  }
  return "unknown";
}

//! The engine a failure came from.
enum class backend : std::uint8_t { none, mpi, nccl, cuda, threads, io, process_group };

//! Short name of a backend.
constexpr std::string_view to_string(backend b) noexcept {
  switch (b) {
    case backend::none:
      return "gravac";
    case backend::mpi:
      return "MPI";
    case backend::nccl:
      return "NCCL";
    case backend::cuda:
      return "CUDA";
    case backend::threads:
      return "threads";
    case backend::io:
      return "io";
    case backend::process_group:
      return "process group";
  }
  return "unknown";
}

//! The exception gravac throws: what failed, on which rank, and the backend's own code.
class error : public std::runtime_error {
 public:
  //! \param code      gravac's classification of the failure
  //! \param what      a human-readable description of what failed
  //! \param rank      the rank that observed the failure (-1 when unknown)
  //! \param engine    the backend that reported it
  //! \param engine_code the backend's own error code (MPI/NCCL/CUDA), 0 when none
  error(status code, std::string what, int rank = -1, backend engine = backend::none, int engine_code = 0)
      : std::runtime_error(format(code, what, rank, engine, engine_code)),
        code_(code),
        rank_(rank),
        engine_(engine),
        engine_code_(engine_code) {}

  //! gravac's classification of the failure.
  [[nodiscard]] status code() const noexcept { return code_; }
  //! Rank that observed the failure, or -1.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  //! Backend the failure came from.
  [[nodiscard]] backend engine() const noexcept { return engine_; }
  //! The backend's own error code (e.g. an MPI error class), 0 when none.
  [[nodiscard]] int engine_code() const noexcept { return engine_code_; }

 private:
  static std::string format(status code, const std::string& what, int rank, backend engine, int engine_code) {
    std::string msg = "gravac: ";
    msg += to_string(code);
    if (rank >= 0) msg += " on rank " + std::to_string(rank);
    msg += ": ";
    msg += what;
    if (engine != backend::none) {
      msg += " [";
      msg += to_string(engine);
      msg += " code " + std::to_string(engine_code) + "]";
    }
    return msg;
  }

  status code_;
  int rank_;
  backend engine_;
  int engine_code_;
};

//! Throws gravac::error(invalid_argument) with \p what unless \p condition holds.
//! Used by every options validator so that invalid options fail at construction.
inline void require(bool condition, std::string_view what) {
  if (!condition) throw error(status::invalid_argument, std::string(what));
}

namespace detail {
// Appends the parts (text, or integers written in decimal) to one named string: a chain of
// std::string temporaries made GCC 12 report false -Warray-bounds/-Wrestrict at -O2/-O3.
template <class... Parts>
[[noreturn]] void throw_invalid_argument(const Parts&... parts) {
  std::string what;
  const auto append = [&what](const auto& part) {
    if constexpr (std::is_integral_v<std::decay_t<decltype(part)>>) {
      what += std::to_string(part);
    } else {
      what += std::string_view(part);
    }
  };
  (append(parts), ...);
  throw error(status::invalid_argument, std::move(what));
}
}  // namespace detail

//! As require(condition, what), with the message in parts (text and integers), put
//! together only when it throws: nothing is built on the path that passes.
template <class... Parts>
requires(sizeof...(Parts) >= 2) void require(bool condition, const Parts&... parts) {
  if (!condition) detail::throw_invalid_argument(parts...);
}

}  // namespace gravac
