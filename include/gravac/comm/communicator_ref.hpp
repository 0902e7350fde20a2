#pragma once
//! \file communicator_ref.hpp
//! \brief A non-owning, type-erased reference to any Communicator of one memory space,
//! so trainer<C, K, P> does not need the engine as a fourth template parameter.

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "gravac/comm/sum_piece.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/error.hpp"
#include "gravac/network/cost_model.hpp"

namespace gravac {

//! Refers to a Communicator of memory space \p Space without owning it. Models Communicator.
template <class Space>
class communicator_ref {
 public:
  //! Opt-in tag for the Communicator concept.
  using communicator_tag = void;
  //! The memory space of the referenced engine.
  using memory_space = Space;
  //! allgatherv's output buffer.
  using byte_buffer = typename default_byte_buffer<Space>::type;

  //! Refers to \p m, which must outlive this reference.
  template <Communicator M>
  requires(!std::same_as<M, communicator_ref>) communicator_ref(M& m)
  noexcept : self_(&m), vt_(&table<M>) {  // NOLINT: implicit by design
    static_assert(std::same_as<typename M::memory_space, Space>,
                  "communicator_ref: the communicator's memory space differs from the compressor's "
                  "(a device-memory compressor needs a communicator that accepts device memory)");
    static_assert(std::same_as<typename M::byte_buffer, byte_buffer>);
  }

  //! This rank.
  [[nodiscard]] int rank() const { return vt_->rank(self_); }
  //! Number of ranks.
  [[nodiscard]] int size() const { return vt_->size(self_); }
  //! Sums over ranks in place.
  void allreduce_sum(std::span<float> d) { vt_->sum_f(self_, d); }
  //! Sums over ranks in place.
  void allreduce_sum(std::span<double> d) { vt_->sum_d(self_, d); }
  //! Maximum over ranks in place.
  void allreduce_max(std::span<double> d) { vt_->max_d(self_, d); }
  //! Variable-length allgather.
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    vt_->gather(self_, in, out, sizes);
  }
  //! Whether the referenced engine has alltoallv (models AlltoallCommunicator).
  [[nodiscard]] bool has_alltoallv() const noexcept { return vt_->alltoall != nullptr; }
  //! Personalised all-to-all (AlltoallCommunicator); throws gravac::error (invalid_argument)
  //! when the referenced engine has none (has_alltoallv() is false).
  void alltoallv(std::span<const std::byte> in, std::span<const std::size_t> send_sizes, byte_buffer& out,
                 std::vector<std::size_t>& recv_sizes) {
    if (!vt_->alltoall)
      throw error(status::invalid_argument,
                  "alltoallv: this communicator has none (the compressed allreduce needs an AlltoallCommunicator: "
                  "mpi_communicator, thread_communicator or a decorator of one)");
    vt_->alltoall(self_, in, send_sizes, out, recv_sizes);
  }
  //! Whether the referenced engine sums a packet's pieces in their own type
  //! (allreduce_sum_pieces: nccl_communicator).
  [[nodiscard]] bool has_allreduce_sum_pieces() const noexcept { return vt_->sum_pieces != nullptr; }
  //! Copies \p in to \p out and sums every piece of \p out over the ranks in its own type
  //! (compressed_allreduce's 16-bit path); throws gravac::error (invalid_argument) when the
  //! referenced engine has none (has_allreduce_sum_pieces() is false). Forwarded so that a
  //! trainer, which holds its engine through this reference, reaches the engine's own sum.
  void allreduce_sum_pieces(std::span<const std::byte> in, std::span<std::byte> out,
                            std::span<const sum_piece> pieces) {
    if (!vt_->sum_pieces)
      throw error(status::invalid_argument,
                  "allreduce_sum_pieces: this communicator has none (the 16-bit path of the compressed allreduce "
                  "needs nccl_communicator)");
    vt_->sum_pieces(self_, in, out, pieces);
  }
  //! Broadcast from \p root.
  void broadcast(std::span<std::byte> d, int root) { vt_->bcast(self_, d, root); }
  //! Broadcast of typed values from \p root.
  template <class T>
  void broadcast_values(std::span<T> d, int root) {
    broadcast(std::as_writable_bytes(d), root);
  }
  //! Barrier.
  void barrier() { vt_->barrier(self_); }
  //! Seconds a network model has charged so far (a simulated network's virtual clock);
  //! 0 for engines without a model, which provide no `modeled_seconds()`.
  [[nodiscard]] double modeled_seconds() const { return vt_->modeled(self_); }
  //! The algorithm the engine's last Allreduce was charged as (a simulated network's
  //! last_allreduce()); ring for engines without a model, which provide none.
  [[nodiscard]] allreduce_algorithm last_allreduce() const { return vt_->last_allreduce(self_); }
  //! Whether the engine may be called from a thread other than the one that made it, one
  //! call at a time (what an asynchronous step's communication thread does). True for
  //! engines without `accepts_calls_from_other_threads()` (the thread engine; NCCL, which
  //! allows a communicator to be used from any thread but by one at a time, and whose
  //! calls the trainer serializes); an MPI engine says so only when MPI was initialised
  //! with MPI_THREAD_SERIALIZED or more.
  [[nodiscard]] bool accepts_calls_from_other_threads() const { return vt_->other_threads(self_); }
  //! Lets the engine stage reductions of up to \p doubles host doubles before any step
  //! (a device engine's `reserve_host_staging(doubles)`: nccl_communicator,
  //! callback_device_communicator); does nothing for engines without it. Call between steps.
  void reserve_host_staging(std::size_t doubles) { vt_->reserve_host(self_, doubles); }
  //! This rank gives up a step whose collectives the other ranks may already be in: an
  //! engine with `abandon(why)` makes them fail instead of waiting forever (a thread team
  //! is aborted; an MPI job ends). Returns false for engines without it (nothing done).
  bool abandon(const std::string& why) noexcept { return vt_->abandon(self_, why); }

 private:
  struct vtable {
    int (*rank)(const void*);
    int (*size)(const void*);
    void (*sum_f)(void*, std::span<float>);
    void (*sum_d)(void*, std::span<double>);
    void (*max_d)(void*, std::span<double>);
    void (*gather)(void*, std::span<const std::byte>, byte_buffer&, std::vector<std::size_t>&);
    void (*alltoall)(void*, std::span<const std::byte>, std::span<const std::size_t>, byte_buffer&,
                     std::vector<std::size_t>&);  // null when the engine has no alltoallv
    void (*sum_pieces)(void*, std::span<const std::byte>, std::span<std::byte>,
                       std::span<const sum_piece>);  // null when the engine has no allreduce_sum_pieces
    void (*bcast)(void*, std::span<std::byte>, int);
    void (*barrier)(void*);
    double (*modeled)(const void*);
    allreduce_algorithm (*last_allreduce)(const void*);
    bool (*other_threads)(const void*);
    bool (*abandon)(void*, const std::string&) noexcept;
    void (*reserve_host)(void*, std::size_t);
  };
  template <class M>
  static constexpr auto alltoall_entry() noexcept {
    using fn = void (*)(void*, std::span<const std::byte>, std::span<const std::size_t>, byte_buffer&,
                        std::vector<std::size_t>&);
    if constexpr (AlltoallCommunicator<M>)
      return static_cast<fn>([](void* s, std::span<const std::byte> in, std::span<const std::size_t> ss,
                                byte_buffer& out,
                                std::vector<std::size_t>& rs) { static_cast<M*>(s)->alltoallv(in, ss, out, rs); });
    else
      return static_cast<fn>(nullptr);
  }

  template <class M>
  static constexpr auto sum_pieces_entry() noexcept {
    using fn = void (*)(void*, std::span<const std::byte>, std::span<std::byte>, std::span<const sum_piece>);
    if constexpr (requires(M & m, std::span<const std::byte> in, std::span<std::byte> out,
                           std::span<const sum_piece> pc) { m.allreduce_sum_pieces(in, out, pc); })
      return static_cast<fn>(
          [](void* s, std::span<const std::byte> in, std::span<std::byte> out, std::span<const sum_piece> pc) {
            static_cast<M*>(s)->allreduce_sum_pieces(in, out, pc);
          });
    else
      return static_cast<fn>(nullptr);
  }

  template <class M>
  static constexpr vtable table{
      [](const void* s) { return static_cast<const M*>(s)->rank(); },
      [](const void* s) { return static_cast<const M*>(s)->size(); },
      [](void* s, std::span<float> d) { static_cast<M*>(s)->allreduce_sum(d); },
      [](void* s, std::span<double> d) { static_cast<M*>(s)->allreduce_sum(d); },
      [](void* s, std::span<double> d) { static_cast<M*>(s)->allreduce_max(d); },
      [](void* s, std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sz) {
        static_cast<M*>(s)->allgatherv(in, out, sz);
      },
      alltoall_entry<M>(),
      sum_pieces_entry<M>(),
      [](void* s, std::span<std::byte> d, int root) { static_cast<M*>(s)->broadcast(d, root); },
      [](void* s) { static_cast<M*>(s)->barrier(); },
      [](const void* s) -> double {
        if constexpr (requires(const M& m) { m.modeled_seconds(); })
          return static_cast<const M*>(s)->modeled_seconds();
        else
          return 0.0;
      },
      [](const void* s) -> allreduce_algorithm {
        if constexpr (requires(const M& m) { m.last_allreduce(); })
          return static_cast<const M*>(s)->last_allreduce();
        else
          return allreduce_algorithm::ring;
      },
      [](const void* s) -> bool {
        if constexpr (requires(const M& m) { m.accepts_calls_from_other_threads(); })
          return static_cast<const M*>(s)->accepts_calls_from_other_threads();
        else
          return true;
      },
      [](void* s, const std::string& why) noexcept -> bool {
        if constexpr (requires(M & m) { m.abandon(why); }) {
          static_cast<M*>(s)->abandon(why);
          return true;
        } else {
          return false;
        }
      },
      [](void* s, std::size_t doubles) {
        if constexpr (requires(M & m) { m.reserve_host_staging(doubles); })
          static_cast<M*>(s)->reserve_host_staging(doubles);
      },
  };

  void* self_;
  const vtable* vt_;
};
static_assert(Communicator<communicator_ref<host_space>>);

}  // namespace gravac
