#pragma once
//! \file
//! \brief How the ranks agree on a checkpoint: a failure on any rank, or ranks at different steps or policy states,
//! ends the save or restore on every rank.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/packet/format.hpp"

namespace gravac::detail {

//! Throws gravac::error when trainer \p t is inside an asynchronous step: a checkpoint is
//! taken between steps (after finish()), when every bucket's residual is settled.
template <class Trainer>
void require_between_steps(const Trainer& t, const char* what) {
  if constexpr (requires { t.step_in_progress(); }) {
    if (t.step_in_progress())
      throw error(status::invalid_argument, std::string("gravac::") + what +
                                                ": a step is in progress; checkpoints are taken between steps "
                                                "(after finish())");
  }
}

template <class T>
concept has_state = requires(T& t, const T& ct, std::vector<std::byte>& out, std::span<const std::byte> in) {
  ct.save(out);
  t.load(in);
};

template <class T>
concept has_local_state = requires(T& t, const T& ct, std::vector<std::byte>& out, std::span<const std::byte> in) {
  ct.save_local(out);
  t.load_local(in);
};

// Every rank posts (status, steps, state hash, message); every rank then sees the same
// table and throws the same error (with the first failing rank's status) when any rank
// failed or the ranks disagree. One allgatherv: cheap, and it can never leave some ranks
// waiting for others.
template <class Comm>
void agree_on_checkpoint(Comm& comm, const std::string& action, status local_status, const std::string& local_failure,
                         std::uint64_t steps, std::uint64_t state_hash) {
  std::vector<std::byte> mine(24 + local_failure.size());
  const std::uint64_t code = static_cast<std::uint64_t>(local_status);
  std::memcpy(mine.data(), &code, 8);
  std::memcpy(mine.data() + 8, &steps, 8);
  std::memcpy(mine.data() + 16, &state_hash, 8);
  if (!local_failure.empty()) std::memcpy(mine.data() + 24, local_failure.data(), local_failure.size());
  typename Comm::byte_buffer all;
  std::vector<std::size_t> sizes;
  comm.allgatherv(std::span<const std::byte>(mine), all, sizes);
  std::string failures, differ;
  status first = status::ok;
  std::size_t at = 0;
  std::uint64_t steps0 = 0, hash0 = 0;
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    std::uint64_t coder = static_cast<std::uint64_t>(status::io_failure), stepsr = 0, hashr = 0;
    if (sizes[r] >= 24) {
      std::memcpy(&coder, all.data() + at, 8);
      std::memcpy(&stepsr, all.data() + at + 8, 8);
      std::memcpy(&hashr, all.data() + at + 16, 8);
    }
    if (coder != static_cast<std::uint64_t>(status::ok)) {
      if (first == status::ok) first = coder <= 0xff ? static_cast<status>(coder) : status::io_failure;
      const auto* msg = reinterpret_cast<const char*>(all.data() + at + 24);
      failures += "\n  rank " + std::to_string(r) + ": " + std::string(msg, sizes[r] >= 24 ? sizes[r] - 24 : 0);
    } else if (r == 0) {
      steps0 = stepsr;
      hash0 = hashr;
    } else if (stepsr != steps0 || hashr != hash0) {
      differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    }
    at += sizes[r];
  }
  if (!failures.empty()) throw error(first, action + " failed on some ranks:" + failures, comm.rank());
  if (!differ.empty())
    throw error(status::diverged,
                action + ": ranks " + differ + " hold a different step counter or policy state than rank 0",
                comm.rank());
}

//! Runs \p fn. With \p collective, a failure is recorded in \p failed and \p failure
//! instead of thrown, so that the agreement that follows tells every rank about it; without,
//! it propagates as it is.
template <class Fn>
void record_failure(bool collective, status& failed, std::string& failure, Fn&& fn) {
  try {
    fn();
  } catch (const error& e) {
    if (!collective) throw;
    failed = e.code();
    failure = e.what();
  } catch (const std::exception& e) {
    if (!collective) throw;
    failed = status::io_failure;
    failure = e.what();
  }
}

}  // namespace gravac::detail
