#pragma once
//! \file checkpoint.hpp
//! \brief Checkpoint and restore of a trainer's state: error-feedback residuals (keyed by
//! the layers' stable ids), the policy's state, the step counter and the shared seed, in
//! a versioned file with a checksum, written atomically.
//!
//! Save and restore are collective by default, so a rank that fails makes every rank throw
//! instead of a hang; the file's layout: docs/guarantees.md, "The checkpoint file".

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gravac/core/atomic_file.hpp"
#include "gravac/core/detail/bucket_states.hpp"
#include "gravac/core/error.hpp"
#include "gravac/core/layout.hpp"
#include "gravac/packet/format.hpp"
#include "gravac/trainer/detail/checkpoint_agreement.hpp"
#include "gravac/trainer/detail/checkpoint_file.hpp"

namespace gravac {

//! Magic bytes at the start of a checkpoint file.
inline constexpr char checkpoint_magic[8] = {'G', 'R', 'V', 'C', 'K', 'P', 'T', '\0'};
//! Current checkpoint format version.
inline constexpr std::uint32_t checkpoint_version = 3;
//! The oldest format version read (2: without the trainer's step state).
inline constexpr std::uint32_t checkpoint_oldest_version = 2;

//! Options of save_checkpoint / restore_checkpoint.
struct checkpoint_options {
  //! Restore into a trainer whose layout differs from the checkpoint's. Residuals are then
  //! matched by the layers' stable ids: a layer found with the same shape gets its
  //! residual back (wherever it now lies in the buffer); a layer whose shape changed, or
  //! that the checkpoint lacks, starts from a zero residual; checkpoint layers the trainer
  //! lacks are dropped. The policy, compressor and collective states are indexed by layer
  //! position, so they are restored only when the layouts are identical and otherwise
  //! start fresh. Off by default: a different layout is rejected.
  bool remap_layers = false;
  //! Agree across the trainer's ranks (every rank must call): a failure on any rank is
  //! reported on every rank, and ranks must be at the same step. Off only for a single
  //! rank working alone (e.g. a tool that inspects one rank's file).
  bool collective = true;
};

//! What a restore did.
struct restore_report {
  std::size_t layers_restored = 0;  //!< layers whose residual came from the checkpoint
  std::size_t layers_reset = 0;     //!< non-empty layers that start from a zero residual (remap only)
  bool policy_restored = false;     //!< the policy (and compressor/collective) state was loaded
  std::uint64_t steps = 0;          //!< the step counter restored
};

//! One layer's record in a checkpoint.
struct checkpoint_layer {
  std::uint64_t id = 0;              //!< layer::id
  std::uint64_t numel = 0;           //!< elements
  std::vector<std::uint64_t> shape;  //!< tensor shape
  std::size_t residual_offset = 0;   //!< where its residual starts in checkpoint_state::residual
};

//! The decoded content of a checkpoint file.
struct checkpoint_state {
  std::uint64_t layout_hash = 0;         //!< layout::hash() of the writer
  std::uint64_t steps = 0;               //!< steps completed
  std::uint64_t seed = 0;                //!< the trainer's shared seed
  std::int64_t rank = 0;                 //!< rank that wrote it
  std::int64_t ranks = 1;                //!< ranks of the run that wrote it
  std::vector<checkpoint_layer> layers;  //!< layers in the writer's layout order
  std::vector<float> residual;           //!< residuals of all layers, back to back
  std::vector<std::byte> policy;         //!< Policy::save output
  std::vector<std::byte> compressor;     //!< Compressor::save output (empty when it has none)
  std::vector<std::byte> collective;     //!< Collective::save output (empty when it has none)
  std::vector<std::byte> policy_local;   //!< Policy::save_local output: rank-local state (empty when it has none)
  std::vector<std::byte> trainer;        //!< trainer::save_step_state output (empty in a version 2 file)
};

//! Serializes \p s into the checkpoint file format (header, payload, checksum).
inline std::vector<std::byte> encode_checkpoint(const checkpoint_state& s) {
  std::size_t payload = 8 * 6;
  for (const auto& l : s.layers) payload += 8 * 3 + 8 * l.shape.size();
  payload += pad8(s.residual.size() * sizeof(float));
  payload += detail::blob_bytes(s.policy.size()) + detail::blob_bytes(s.compressor.size()) +
             detail::blob_bytes(s.collective.size()) + detail::blob_bytes(s.policy_local.size()) +
             detail::blob_bytes(s.trainer.size());
  std::vector<std::byte> out(sizeof(detail::checkpoint_header) + payload);
  byte_writer w(std::span<std::byte>(out).subspan(sizeof(detail::checkpoint_header)));
  w.put(s.layout_hash);
  w.put(s.steps);
  w.put(s.seed);
  w.put(s.rank);
  w.put(s.ranks);
  w.put<std::uint64_t>(s.layers.size());
  for (const auto& l : s.layers) {
    w.put(l.id);
    w.put(l.numel);
    w.put<std::uint64_t>(l.shape.size());
    w.put_array<std::uint64_t>(l.shape);
  }
  w.put_array<float>(s.residual);
  detail::put_blob(w, s.policy);
  detail::put_blob(w, s.compressor);
  detail::put_blob(w, s.collective);
  detail::put_blob(w, s.policy_local);
  detail::put_blob(w, s.trainer);
  detail::checkpoint_header h;
  std::memcpy(h.magic, checkpoint_magic, sizeof h.magic);
  h.version = checkpoint_version;
  h.header_bytes = sizeof h;
  h.payload_bytes = w.size();
  h.checksum = detail::fnv1a(out.data() + sizeof h, w.size());
  std::memcpy(out.data(), &h, sizeof h);
  out.resize(sizeof h + w.size());
  return out;
}

//! Decodes checkpoint bytes. Throws gravac::error(io_failure) naming \p what (the file)
//! when they are truncated, corrupted (checksum), of another format or version, or
//! internally inconsistent. Never reads outside \p bytes.
inline checkpoint_state decode_checkpoint(std::span<const std::byte> bytes, const std::string& what = "checkpoint") {
  const auto fail = [&](const std::string& why) {
    return error(status::io_failure, "'" + what + "' rejected: " + why, -1, backend::io);
  };
  detail::checkpoint_header h;
  if (bytes.size() < sizeof h)
    throw fail("truncated (" + std::to_string(bytes.size()) + " bytes, the header alone has " +
               std::to_string(sizeof h) + ")");
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, checkpoint_magic, sizeof h.magic) != 0) throw fail("not a gravac checkpoint (wrong magic)");
  if (h.version < checkpoint_oldest_version || h.version > checkpoint_version)
    throw fail("unsupported checkpoint version " + std::to_string(h.version) + " (this gravac reads versions " +
               std::to_string(checkpoint_oldest_version) + " to " + std::to_string(checkpoint_version) + ")");
  if (h.header_bytes != sizeof h) throw fail("header size " + std::to_string(h.header_bytes) + " is wrong");
  const std::size_t have = bytes.size() - sizeof h;
  if (h.payload_bytes != have)
    throw fail(h.payload_bytes > have ? "truncated (payload has " + std::to_string(have) + " of " +
                                            std::to_string(h.payload_bytes) + " bytes)"
                                      : "trailing bytes after the payload");
  const auto payload = bytes.subspan(sizeof h);
  if (detail::fnv1a(payload.data(), payload.size()) != h.checksum) throw fail("corrupted (checksum mismatch)");

  // The checksum matched, but the content is still checked field by field: a file
  // written by a buggy or hostile writer must not make us read out of bounds.
  checkpoint_state s;
  byte_reader r(payload);
  std::uint64_t n_layers = 0;
  if (!r.get(s.layout_hash) || !r.get(s.steps) || !r.get(s.seed) || !r.get(s.rank) || !r.get(s.ranks) ||
      !r.get(n_layers))
    throw fail("payload too short for its fields");
  if (s.ranks < 1 || s.rank < 0 || s.rank >= s.ranks) throw fail("rank fields out of range");
  if (n_layers > r.remaining() / 24) throw fail("layer count beyond the file");
  s.layers.resize(static_cast<std::size_t>(n_layers));
  std::uint64_t total = 0;
  for (auto& l : s.layers) {
    std::uint64_t dims = 0;
    if (!r.get(l.id) || !r.get(l.numel) || !r.get(dims)) throw fail("layer records truncated");
    if (dims > detail::checkpoint_max_rank || dims * 8 > r.remaining()) throw fail("layer shape beyond the file");
    l.shape.resize(static_cast<std::size_t>(dims));
    std::uint64_t prod = 1;
    bool overflow = false;
    for (auto& d : l.shape) {
      if (!r.get(d)) throw fail("layer shape truncated");
      if (d != 0 && prod > ~std::uint64_t{0} / d) overflow = true;
      prod *= d;
    }
    if (overflow || (dims > 0 && prod != l.numel)) throw fail("layer shape does not match its element count");
    if (l.numel > r.remaining() / sizeof(float) || total + l.numel > r.remaining() / sizeof(float))
      throw fail("residuals beyond the file");
    l.residual_offset = static_cast<std::size_t>(total);
    total += l.numel;
  }
  std::span<const std::byte> res;
  if (!r.take(static_cast<std::size_t>(total * sizeof(float)), res)) throw fail("residuals truncated");
  s.residual.resize(static_cast<std::size_t>(total));
  if (total) std::memcpy(s.residual.data(), res.data(), res.size());
  if (!detail::get_blob(r, s.policy) || !detail::get_blob(r, s.compressor) || !detail::get_blob(r, s.collective) ||
      !detail::get_blob(r, s.policy_local) || (h.version >= 3 && !detail::get_blob(r, s.trainer)))
    throw fail("state blobs truncated");
  if (r.remaining() != 0) throw fail("trailing bytes inside the payload");
  for (float x : s.residual)
    if (!std::isfinite(x)) throw fail("a residual is not finite");
  return s;
}

//! Reads and decodes the checkpoint file at \p path (see decode_checkpoint).
inline checkpoint_state read_checkpoint(const std::string& path) {
  return decode_checkpoint(detail::read_file(path), path);
}

//! Writes \p s to \p path atomically (temporary file, flush, rename).
inline void write_checkpoint(const std::string& path, const checkpoint_state& s) {
  write_file_atomically(path, encode_checkpoint(s));
}

//! Trainer \p t's state (this rank's residual, the policy, compressor and collective
//! state, the step counter, the seed, the layout hash), between steps. Rank-local. A
//! device trainer's residual (and a device collective's) is copied to the host, after the
//! work queued on its compressor's stream.
template <class Trainer>
checkpoint_state capture_checkpoint(const Trainer& t) {
  detail::require_between_steps(t, "save_checkpoint");
  const layout& lay = t.get_layout();

  checkpoint_state s;
  s.layout_hash = lay.hash();
  s.steps = t.steps();
  s.seed = t.get_options().seed;
  s.rank = t.communicator().rank();
  s.ranks = t.communicator().size();
  t.residual_to_host(s.residual);
  s.layers.reserve(lay.size());
  for (const auto& l : lay.layers())
    s.layers.push_back({l.id, l.numel, std::vector<std::uint64_t>(l.shape.begin(), l.shape.end()), l.offset});
  t.policy().save(s.policy);
  if constexpr (detail::has_state<typename Trainer::compressor_type>)
    detail::save_bucket_states(t.bucket_count(), s.compressor,
                               [&](std::size_t b, std::vector<std::byte>& out) { t.compressor(b).save(out); });
  if constexpr (detail::has_state<typename Trainer::collective_type>)
    detail::save_bucket_states(t.bucket_count(), s.collective,
                               [&](std::size_t b, std::vector<std::byte>& out) { t.collective(b).save(out); });
  if constexpr (detail::has_local_state<typename Trainer::policy_type>) t.policy().save_local(s.policy_local);
  if constexpr (requires(std::vector<std::byte> & out) { t.save_step_state(out); }) t.save_step_state(s.trainer);
  return s;
}

//! Trainer \p t's state as checkpoint bytes (capture_checkpoint, encoded): what
//! save_checkpoint writes, for a caller that keeps it elsewhere (a framework's
//! state_dict). Rank-local.
template <class Trainer>
std::vector<std::byte> save_checkpoint_bytes(const Trainer& t) {
  return encode_checkpoint(capture_checkpoint(t));
}

//! Saves trainer \p t's state (this rank's residual, the policy state, the step counter,
//! the seed, the layout hash) to \p path, atomically. With opt.collective (the default)
//! every rank of the trainer must call it, each with its own path; a failure on any rank
//! then throws on every rank.
template <class Trainer>
void save_checkpoint(Trainer& t, const std::string& path, const checkpoint_options& opt = {}) {
  std::string failure;
  status failed = status::ok;
  std::uint64_t state_hash = 0;
  detail::record_failure(opt.collective, failed, failure, [&] {
    const checkpoint_state s = capture_checkpoint(std::as_const(t));
    state_hash = detail::fnv1a(s.policy.data(), s.policy.size(), s.seed);
    write_checkpoint(path, s);
  });
  if (opt.collective)
    detail::agree_on_checkpoint(t.communicator(), "save_checkpoint", failed, failure, t.steps(), state_hash);
}

namespace detail {
// restore_checkpoint's body: \p read yields the state, \p what names it in errors.
template <class Trainer, class Read>
restore_report restore_from(Trainer& t, Read read, const std::string& what, const checkpoint_options& opt) {
  detail::require_between_steps(t, "restore_checkpoint");
  const layout& lay = t.get_layout();
  const int rank = t.communicator().rank();
  std::string failure;
  status failed = status::ok;
  checkpoint_state s;
  detail::record_failure(opt.collective, failed, failure, [&] {
    s = read();
    if (s.rank != rank || s.ranks != t.communicator().size())
      throw error(status::layout_mismatch, what + " was written by rank " + std::to_string(s.rank) + " of " +
                                               std::to_string(s.ranks) + ", this is rank " + std::to_string(rank) +
                                               " of " + std::to_string(t.communicator().size()));
    if (s.layout_hash != lay.hash() && !opt.remap_layers)
      throw error(status::layout_mismatch, what +
                                               " was written for another layout (set checkpoint_options::"
                                               "remap_layers to restore residuals by layer id)");
  });
  if (opt.collective)
    detail::agree_on_checkpoint(t.communicator(), "restore_checkpoint", failed, failure, s.steps,
                                detail::fnv1a(s.policy.data(), s.policy.size(), s.seed));

  // Everything is checked: apply. Only the state loaders below can still throw (a policy
  // rejecting its own blob), and they run before the residual and counters change.
  restore_report rep;
  const bool same_layout = s.layout_hash == lay.hash();
  if (same_layout) {
    t.policy().load(s.policy);
    if constexpr (detail::has_state<typename Trainer::compressor_type>)
      detail::load_bucket_states(t.bucket_count(), s.compressor, "compressor",
                                 [&](std::size_t b, std::span<const std::byte> in) { t.compressor(b).load(in); });
    if constexpr (detail::has_state<typename Trainer::collective_type>)
      detail::load_bucket_states(t.bucket_count(), s.collective, "collective",
                                 [&](std::size_t b, std::span<const std::byte> in) { t.collective(b).load(in); });
    if constexpr (detail::has_local_state<typename Trainer::policy_type>) t.policy().load_local(s.policy_local);
    if constexpr (requires(std::span<const std::byte> in) { t.load_step_state(in); })
      t.load_step_state(std::span<const std::byte>(s.trainer));
    rep.policy_restored = true;
  }
  // The residual is assembled on the host (layers not restored are zero), then replaces
  // the trainer's in one copy, whatever its memory space.
  std::vector<float> res(lay.numel(), 0.0f);
  for (const auto& l : lay.layers()) {
    const auto it =
        std::find_if(s.layers.begin(), s.layers.end(), [&](const checkpoint_layer& c) { return c.id == l.id; });
    const bool match = it != s.layers.end() && it->numel == l.numel &&
                       std::equal(it->shape.begin(), it->shape.end(), l.shape.begin(), l.shape.end());
    if (match) {
      std::copy_n(s.residual.begin() + static_cast<std::ptrdiff_t>(it->residual_offset), l.numel,
                  res.begin() + static_cast<std::ptrdiff_t>(l.offset));
      ++rep.layers_restored;
    } else if (l.numel > 0) {
      ++rep.layers_reset;
    }
  }
  t.residual_from_host(res);
  t.set_steps(s.steps);
  t.set_seed(s.seed);
  rep.steps = s.steps;
  return rep;
}
}  // namespace detail

//! Restores trainer \p t from \p path (written by save_checkpoint on the same rank).
//! Rejects, before changing anything: a missing, truncated or corrupted file; a file of
//! another format version; a file written by another rank or for another rank count; and
//! (unless opt.remap_layers) a file written for another layout. With opt.collective
//! (the default) every rank must call it; when any rank fails, or the ranks' checkpoints
//! are at different steps, every rank throws and no trainer is modified.
template <class Trainer>
restore_report restore_checkpoint(Trainer& t, const std::string& path, const checkpoint_options& opt = {}) {
  return detail::restore_from(
      t, [&] { return read_checkpoint(path); }, "'" + path + "'", opt);
}

//! Restores trainer \p t from \p bytes (save_checkpoint_bytes on the same rank), with the
//! checks of restore_checkpoint; rank-local unless \p opt.collective.
template <class Trainer>
restore_report restore_checkpoint_bytes(Trainer& t, std::span<const std::byte> bytes,
                                        const checkpoint_options& opt = {.collective = false}) {
  return detail::restore_from(
      t, [&] { return decode_checkpoint(bytes, "state"); }, "the state", opt);
}

}  // namespace gravac
