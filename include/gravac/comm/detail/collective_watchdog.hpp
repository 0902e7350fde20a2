#pragma once
//! \file
//! \brief detail::collective_watchdog: ends this process when one collective has taken
//! longer than a timeout (mpi_options::collective_timeout), so that a rank waiting for a
//! hung peer does not wait forever.
//!
//! The collective itself stays the blocking MPI call, with its speed and its bits: the
//! non-blocking forms polled with MPI_Test were 4 to 5x slower for a 4 MiB float
//! MPI_Allreduce on one node with Open MPI 4.1, and could sum in another order. A thread
//! of its own watches instead. It cannot end the job through MPI: another thread is inside
//! a collective, and an MPI call from a second thread at the same time needs
//! MPI_THREAD_MULTIPLE. So it writes its message with write(2) and leaves with _exit;
//! mpiexec sees a rank end without MPI_Finalize and ends every other rank of the job.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace gravac::detail {

//! Watches the collectives of one communicator; see the file comment. enter() and leave()
//! bracket each collective, from whichever thread makes it.
class collective_watchdog {
 public:
  //! Starts the watching thread: a collective not left \p timeout after it was entered ends
  //! the process with \p exit_code, after one line naming rank \p rank of \p size.
  collective_watchdog(std::chrono::duration<double> timeout, int rank, int size, int exit_code)
      : timeout_(std::chrono::duration_cast<clock::duration>(timeout)),
        rank_(rank),
        size_(size),
        exit_code_(exit_code),
        thread_([this] { watch(); }) {}
  collective_watchdog(const collective_watchdog&) = delete;
  collective_watchdog& operator=(const collective_watchdog&) = delete;
  //! Stops and joins the watching thread.
  ~collective_watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  //! This thread enters the collective \p what (a string literal: it is read when the time is up).
  void enter(const char* what) noexcept {
    what_.store(what, std::memory_order_relaxed);
    entered_.store(clock::now().time_since_epoch().count(), std::memory_order_release);
  }
  //! The collective entered last has completed.
  void leave() noexcept { entered_.store(idle, std::memory_order_release); }

 private:
  using clock = std::chrono::steady_clock;
  static constexpr clock::rep idle = 0;

  // Checks 20 times per timeout, at most every 100 ms: a hung collective ends the job
  // within about 5% of the timeout (or 100 ms) past it, and a long timeout costs ten
  // wake-ups a second.
  void watch() {
    const auto period =
        std::clamp<clock::duration>(timeout_ / 20, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
      const clock::rep since = entered_.load(std::memory_order_acquire);
      if (since != idle && clock::now().time_since_epoch().count() - since >= timeout_.count()) time_out();
    }
  }

  [[noreturn]] void time_out() const noexcept {
    char line[640];
    const int n = std::snprintf(line, sizeof line,
                                "gravac: rank %d of %d failed: %s did not complete within %g s (collective_timeout); a "
                                "peer rank is likely hung (deadlocked, stopped or blocked in I/O) and never entered it "
                                "(ending this process; mpiexec ends the job)\n",
                                rank_, size_, what_.load(std::memory_order_relaxed),
                                std::chrono::duration<double>(timeout_).count());
    if (n > 0)
      (void)!::write(2, line,
                     static_cast<std::size_t>(n) < sizeof line ? static_cast<std::size_t>(n) : sizeof line - 1);
    ::_exit(exit_code_);
  }

  clock::duration timeout_;
  int rank_, size_, exit_code_;
  std::atomic<clock::rep> entered_{idle};
  std::atomic<const char*> what_{""};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once every other member is ready
};

}  // namespace gravac::detail
