#pragma once
//! \file
//! \brief The communication thread of an asynchronous step: it runs the step's buckets in
//! index order, each as soon as the caller releases it, while the caller goes on with
//! backward.

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>

namespace gravac::detail {

//! Runs `(owner->*run)(b)` for b = 0, 1, ... in order on a thread of its own, bucket b once
//! release(n) has been called with n > b. The first exception stops the step: later buckets
//! are not run and wait() rethrows it. One step at a time: begin(), releases, wait().
template <class Owner>
class bucket_worker {
 public:
  //! The member function of the owner that processes one bucket.
  using run_fn = void (Owner::*)(std::size_t bucket);

  //! A worker that calls \p run on its owner; the thread starts on the first begin().
  explicit bucket_worker(run_fn run) noexcept : run_(run) {}
  bucket_worker(const bucket_worker&) = delete;
  bucket_worker& operator=(const bucket_worker&) = delete;
  //! Waits for the bucket in progress (if any) and ends the thread.
  ~bucket_worker() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  //! Starts a step of \p buckets buckets, none released yet, run on \p owner (it may have
  //! moved since the last step).
  void begin(std::size_t buckets, Owner* owner) {
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    std::lock_guard lock(m_);
    owner_ = owner;
    total_ = buckets;
    released_ = done_ = 0;
    failure_ = nullptr;
  }
  //! Lets buckets [0, \p n) run (n never decreases within a step).
  void release(std::size_t n) {
    {
      std::lock_guard lock(m_);
      if (n <= released_) return;
      released_ = n;
    }
    cv_.notify_all();
  }
  //! Waits until every released bucket ran (or one failed) and rethrows the failure.
  void wait() {
    std::unique_lock lock(m_);
    done_cv_.wait(lock, [&] { return done_ == released_ || failure_; });
    if (failure_) {
      const std::exception_ptr f = failure_;
      failure_ = nullptr;
      done_ = released_ = total_ = 0;
      std::rethrow_exception(f);
    }
  }

 private:
  void loop() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (done_ < released_ && !failure_); });
      if (stop_) return;
      const std::size_t b = done_;
      Owner* const owner = owner_;
      lock.unlock();
      std::exception_ptr failed;
      try {
        (owner->*run_)(b);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed)
        failure_ = failed;
      else
        ++done_;
      done_cv_.notify_all();
    }
  }

  run_fn run_;
  Owner* owner_ = nullptr;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::thread thread_;
  std::size_t total_ = 0, released_ = 0, done_ = 0;
  std::exception_ptr failure_;
  bool stop_ = false;
};

}  // namespace gravac::detail
