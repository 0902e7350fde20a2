#pragma once
//! \file simulated_communicator.hpp
//! \brief simulated_communicator<Inner>: a communicator decorator that performs every
//! collective through the real engine and charges the time the cost model gives for
//! that call, under the profile's current network, to a virtual clock. This is how one
//! machine reproduces slow and changing networks: the data are real, the time is modeled.
//!
//! It also counts this rank's wire bytes (wire_bytes_sent(), wire_bytes_received()), since a
//! packet's size understates what an Allgather moves. What each call is charged and counted:
//! docs/algorithms.md, "The cost model" and "Wire bytes".

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gravac/comm/communicator_ref.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/network/cost_model.hpp"
#include "gravac/network/network_profile.hpp"
#include "gravac/network/wire_bytes.hpp"

namespace gravac {

//! Options of the simulated network.
struct simulated_network_options {
  allreduce_algorithm allreduce = allreduce_algorithm::ring;  //!< how Allreduce is charged (with rule `fixed`)
  //! Who picks each Allreduce's algorithm: `fixed` charges `allreduce` always (the default,
  //! as before this option existed); `open_mpi_4_1` and `nccl` charge, call by call, what
  //! that engine would run for the call's rank count and size (cost_model::choose_allreduce).
  allreduce_rule rule = allreduce_rule::fixed;
};

//! The running totals of a simulated_communicator: what a training checkpoint saves so that
//! a resumed run continues the modeled clock and the wire-byte counts bit for bit (they are
//! sums in call order, which a fresh communicator cannot rebuild).
struct simulated_counters {
  double clock = 0;         //!< modeled_seconds()
  double sent = 0;          //!< wire_bytes_sent()
  double received = 0;      //!< wire_bytes_received()
  std::uint64_t calls = 0;  //!< calls()
};

//! Decorates Communicator \p Inner with a modeled clock. Models Communicator.
template <Communicator Inner>
class simulated_communicator {
 public:
  //! Opt-in tag for the Communicator concept.
  using communicator_tag = void;
  //! The inner engine's memory space.
  using memory_space = typename Inner::memory_space;
  //! The inner engine's gather buffer.
  using byte_buffer = typename Inner::byte_buffer;
  //! Options (see simulated_network_options).
  using options = simulated_network_options;

  //! Wraps \p inner (which must outlive this) under network \p profile.
  simulated_communicator(Inner& inner, network_profile profile, const options& opt = {})
      : inner_(&inner), profile_(std::move(profile)), options_(opt) {}

  //! This rank.
  [[nodiscard]] int rank() const { return inner_->rank(); }
  //! Number of ranks.
  [[nodiscard]] int size() const { return inner_->size(); }

  //! Sums over ranks (real), charged as an Allreduce of the span's bytes.
  void allreduce_sum(std::span<float> d) {
    charged_allreduce(d, [&] { inner_->allreduce_sum(d); });
  }
  //! Sums over ranks (real), charged as an Allreduce.
  void allreduce_sum(std::span<double> d) {
    charged_allreduce(d, [&] { inner_->allreduce_sum(d); });
  }
  //! Maximum over ranks (real), charged as an Allreduce.
  void allreduce_max(std::span<double> d) {
    charged_allreduce(d, [&] { inner_->allreduce_max(d); });
  }
  // clang-format off
  //! The inner engine's reserve_host_staging (a device engine's pinned staging), uncharged.
  void reserve_host_staging(std::size_t doubles)
    requires requires(Inner& i, std::size_t n) { i.reserve_host_staging(n); }
  {
    inner_->reserve_host_staging(doubles);
  }
  // clang-format on
  //! Variable-length allgather (real), charged on the total bytes gathered.
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    const network_params net = current();
    const double own = static_cast<double>(in.size());
    inner_->allgatherv(in, out, sizes);
    std::size_t total = 0;
    for (auto s : sizes) total += s;
    charge(cost_model::allgather(size(), static_cast<double>(total)), net);
    count(wire_bytes::allgather(size(), static_cast<double>(total), own));
  }
  // clang-format off
  //! Personalised all-to-all (real), charged as a pairwise exchange over the busiest
  //! rank's bytes (docs/algorithms.md, "Wire bytes"). Present when the inner engine has alltoallv.
  void alltoallv(std::span<const std::byte> in, std::span<const std::size_t> send_sizes, byte_buffer& out,
                 std::vector<std::size_t>& recv_sizes)
    requires AlltoallCommunicator<Inner>
  {
    const network_params net = current();
    inner_->alltoallv(in, send_sizes, out, recv_sizes);
    const auto me = static_cast<std::size_t>(rank());
    double sent = 0, received = 0;
    for (std::size_t r = 0; r < send_sizes.size(); ++r)
      if (r != me) sent += static_cast<double>(send_sizes[r]);
    for (std::size_t r = 0; r < recv_sizes.size(); ++r)
      if (r != me) received += static_cast<double>(recv_sizes[r]);
    busiest_[0] = sent;
    busiest_[1] = received;
    if (size() > 1) inner_->allreduce_max(std::span<double>(busiest_));
    charge(cost_model::alltoall(size(), std::max(busiest_[0], busiest_[1])), net);
    count(wire_bytes::alltoall(size(), sent, received));
  }
  // clang-format on
  //! Broadcast from \p root (real), charged as a binomial tree.
  void broadcast(std::span<std::byte> d, int root) {
    const double b = static_cast<double>(d.size());
    charged(cost_model::broadcast(size(), b), [&] { inner_->broadcast(d, root); });
    count(wire_bytes::broadcast(size(), b, rank() == root));
  }
  //! Broadcast of typed values from \p root.
  template <class T>
  void broadcast_values(std::span<T> d, int root) {
    broadcast(std::as_writable_bytes(d), root);
  }
  //! Barrier (real), charged as a dissemination barrier.
  void barrier() {
    charged(cost_model::barrier(size()), [&] { inner_->barrier(); });
  }

  //! Abandons the step in flight through the inner engine (communicator_ref::abandon).
  void abandon(const std::string& why) noexcept { communicator_ref<memory_space>(*inner_).abandon(why); }
  //! Whether the inner engine may be called from another thread (communicator_ref).
  [[nodiscard]] bool accepts_calls_from_other_threads() const {
    return communicator_ref<memory_space>(*inner_).accepts_calls_from_other_threads();
  }
  //! Seconds charged so far: the virtual clock (identical on every rank).
  [[nodiscard]] double modeled_seconds() const noexcept { return clock_; }
  //! Advances the clock by \p seconds of modeled computation (time-indexed profiles see it).
  void add_compute_seconds(double seconds) noexcept { clock_ += seconds > 0 ? seconds : 0.0; }
  //! Sets the training step that step-indexed profiles read.
  void set_step(std::uint64_t step) noexcept { step_ = step; }
  //! The network now (at the current step and virtual time).
  [[nodiscard]] const network_params& current() const noexcept { return profile_.at(step_, clock_); }
  //! The profile.
  [[nodiscard]] const network_profile& profile() const noexcept { return profile_; }
  //! The cost terms of the last call and the seconds it was charged.
  [[nodiscard]] std::pair<cost_terms, double> last_charge() const noexcept { return {last_terms_, last_seconds_}; }
  //! The algorithm the last Allreduce was charged as (ring before any): the options' own,
  //! or the engine rule's choice for that call.
  [[nodiscard]] allreduce_algorithm last_allreduce() const noexcept { return last_allreduce_; }
  //! Calls charged so far.
  [[nodiscard]] std::uint64_t calls() const noexcept { return calls_; }
  //! The cost terms of every call charged since construction, summed: under a constant
  //! network \p net, `charged_terms().seconds(net)` is the time those calls take there, so one
  //! run prices the same calls on several networks (the counters of a checkpoint leave it out).
  [[nodiscard]] const cost_terms& charged_terms() const noexcept { return total_terms_; }
  //! Bytes this rank has sent on the wire so far (cumulative, like modeled_seconds()), by
  //! the algorithm each call is charged as (docs/algorithms.md, "Wire bytes"). Fractional where the
  //! count is a per-rank average (Allreduce, broadcast).
  [[nodiscard]] double wire_bytes_sent() const noexcept { return sent_; }
  //! Bytes this rank has received on the wire so far (cumulative), by the algorithm each
  //! call is charged as: for an Allgather the other ranks' blocks, for a broadcast the
  //! payload on every rank but the root.
  [[nodiscard]] double wire_bytes_received() const noexcept { return received_; }
  //! The running totals (clock, wire bytes, calls), for a checkpoint.
  [[nodiscard]] simulated_counters counters() const noexcept { return {clock_, sent_, received_, calls_}; }
  //! Puts back totals saved by counters(): a resumed run, or a step's worth of calls that
  //! must not count (a checkpoint's own agreement between ranks).
  void set_counters(const simulated_counters& c) noexcept {
    clock_ = c.clock;
    sent_ = c.sent;
    received_ = c.received;
    calls_ = c.calls;
  }
  //! The wrapped engine.
  [[nodiscard]] Inner& inner() noexcept { return *inner_; }
  // clang-format off
  //! Forwards abort to the inner engine when it has one.
  void abort(const std::string& why) noexcept
    requires requires(Inner& i) { i.abort(why); }
  { inner_->abort(why); }

 private:
  template <class T>
  static double bytes(std::span<T> d) noexcept {
    return static_cast<double>(d.size_bytes());
  }
  // clang-format on
  // The network is read when the call starts, so a phase change mid-call does not split it.
  template <class Fn>
  void charged(const cost_terms& t, Fn&& fn) {
    const network_params net = current();
    fn();
    charge(t, net);
  }
  // An Allreduce: the algorithm is chosen under the network at the call's start, charged,
  // and its wire bytes counted by the same algorithm.
  template <class T, class Fn>
  void charged_allreduce(std::span<T> d, Fn&& fn) {
    const network_params net = current();
    const double b = bytes(d);
    const allreduce_algorithm a =
        cost_model::choose_allreduce(options_.rule, options_.allreduce, size(), b, net, sizeof(T));
    fn();
    charge(cost_model::allreduce(size(), b, a), net);
    last_allreduce_ = a;
    count(wire_bytes::allreduce(size(), b, a));
  }
  void charge(const cost_terms& t, const network_params& net) noexcept {
    last_terms_ = t;
    total_terms_ += t;
    last_seconds_ = t.seconds(net);
    clock_ += last_seconds_;
    ++calls_;
  }

  void count(const wire_bytes& w) noexcept { count(w.sent, w.received); }
  void count(double sent, double received) noexcept {
    sent_ += sent;
    received_ += received;
  }

  Inner* inner_;
  network_profile profile_;
  options options_;
  double clock_ = 0;
  std::uint64_t step_ = 0;
  cost_terms last_terms_{};
  cost_terms total_terms_{};
  double last_seconds_ = 0;
  std::uint64_t calls_ = 0;
  allreduce_algorithm last_allreduce_ = allreduce_algorithm::ring;
  double sent_ = 0;
  double received_ = 0;
  double busiest_[2] = {0, 0};
};
static_assert(Communicator<simulated_communicator<communicator_ref<host_space>>>);

}  // namespace gravac
