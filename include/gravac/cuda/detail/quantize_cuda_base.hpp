#pragma once
//! \file quantize_cuda_base.hpp
//! \brief detail::quantize_cuda_base: the body the quantizing compressors on the device
//! share (qsgd_cuda, terngrad_cuda, sign_cuda and cast16_cuda, each in its own header under
//! cuda/, and mxfp8_cuda, mxfp4_cuda and nvfp4_cuda in block_scaled_cuda.hpp, which add
//! their options, their checks and their documentation). Same packets as gravac::qsgd,
//! terngrad, sign, cast16, mxfp8, mxfp4 and nvfp4 on the same input, bit for bit (the same
//! scales, random draws, codes and padding), and the same residual e = u -
//! decompress(packet); see quantize_cuda_kernels.hpp and block_scaled_kernels.hpp for how.
//! Part of target gravac::cuda.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gravac/compress/block_scaled.hpp"
#include "gravac/compress/cast16_format.hpp"
#include "gravac/compress/detail/block_scaled_codec.hpp"
#include "gravac/compress/detail/cast16_limits.hpp"
#include "gravac/concepts/composition.hpp"
#include "gravac/concepts/concepts.hpp"
#include "gravac/core/detail/random.hpp"
#include "gravac/cuda/detail/block_scaled_kernels.hpp"
#include "gravac/cuda/detail/device_compress.hpp"
#include "gravac/cuda/detail/fused_jobs_pass.hpp"
#include "gravac/cuda/detail/launch.hpp"
#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/packet_kernels.hpp"
#include "gravac/cuda/detail/quantize_cuda_kernels.hpp"
#include "gravac/cuda/detail/quantized_packet_kernels.hpp"
#include "gravac/cuda/detail/quantized_residuals.hpp"
#include "gravac/cuda/detail/select_kernels.hpp"
#include "gravac/cuda/detail/shard_staging.hpp"  // compressed_allreduce's two stages on this space
#include "gravac/cuda/detail/space_hooks.hpp"    // the trainer's hooks on this space
#include "gravac/cuda/detail/stream_copies.hpp"
#include "gravac/cuda/detail/stream_members.hpp"
#include "gravac/cuda/device_buffer.hpp"
#include "gravac/packet/packet_bound.hpp"
#include "gravac/packet/quantized_packet.hpp"
#include "gravac/packet/raw_segment.hpp"

namespace gravac::detail {

//! The quantizing compressor \p Q with error feedback over device memory, \p Options being
//! its options (a `stream`, and for cast16 a `format`): the whole of a Compressor but its
//! constructor. The public classes derive from it, check their options and pass their
//! level count and bucket.
//!
//! compress() plans the packet on the host (every segment's size follows from the layout,
//! the options and which layers go raw), uploads the plan, and runs a fixed sequence of
//! launches that each cover every layer: the headers; topk_cuda's fused pass with k = 0 (u
//! = g + e into e, the norms in the host's order, the gain curve when candidates are asked
//! for); raw layers; then per quantizer the chunk sums, the scales and the codes (cast16:
//! the codes; block-scaled: NVFP4's per-layer largest |u|, then one pass that finds each
//! block's scale and writes its codes); last, the residual and the kept energy from the
//! packet (quantized_residuals.hpp). One copy of the statistics comes back and it returns
//! when packet and residual are ready. Every workspace is
//! allocated at construction (no allocation per step). compress_stats::non_finite reports a
//! NaN or infinity in u = g + e (the host trainer checks g itself; device memory it cannot
//! read, so the device compressor reports it, as topk_cuda does).
template <quant_family Q, class Options>
class quantize_cuda_base : public stream_members<quantize_cuda_base<Q, Options>> {
  static constexpr bool leveled = Q == quant_family::qsgd || Q == quant_family::terngrad;
  static constexpr bool block_scaled = is_block_family(Q);

 public:
  //! Opt-in tag for the Compressor concept.
  using compressor_tag = void;
  //! What it acts on (composition.hpp): nothing but "kept fraction 1 = raw"; a quantizer sends every value.
  static constexpr decision acts_on = decision::none;
  //! Works on device memory.
  using memory_space = cuda_space;
  //! Options (qsgd_cuda_options, terngrad_cuda_options, sign_cuda_options, cast16_cuda_options,
  //! mxfp8_cuda_options, mxfp4_cuda_options or nvfp4_cuda_options).
  using options = Options;
  //! Each rank has its own scales, so codes cannot be summed elementwise.
  static constexpr bool summable_by_index = false;
  //! Packet kind written (that of the host quantizers).
  static constexpr packet_kind kind = packet_kind::quantized;
  //! compressed_allreduce may run it on shards (DeviceShardableCompressor): a packet depends
  //! only on the layout (a shard layout has its own names, so its own random streams, as on
  //! the host), the options and the step. Not cast16_cuda: its path there is the 16-bit sum
  //! of one whole packet (PieceSummableCompressor).
  static constexpr bool runs_on_shards = Q != quant_family::cast16;

  //! Upper bound of the packet size, as the host quantizer's.
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    return packet_bytes_bound(
        layout_, [this](std::size_t, const layer& l) { return sizeof(segment_header) + payload_bytes(l.numel); });
  }

  //! Quantizes every layer whose kept fraction is below 1 (the others go raw); e = u -
  //! decompress(packet). \p g, \p e and \p out are device memory. Returns the packet size
  //! once the packet, the residual and the statistics are ready.
  std::size_t compress(grad_view<cuda_space> g, grad_view<cuda_space> e, const step_params& p, std::span<std::byte> out,
                       compress_stats& st) {
    step_plan plan;
    last_jobs_ = 0;  // until this step's packet is complete, there are no pieces to sum
    const std::size_t bytes = detail::compress_on_device(
        {name(), layout_, options_.stream}, g, e, p, out, st, [&] { return plan_step(p, plan); },
        [&](std::byte* packet) { queue_step(g, e, p, packet, plan); }, [&] { repair_step(g, e, out.data(), plan); },
        [&](std::size_t b) { return finish_step(p, st, plan, b); });
    last_jobs_ = plan.jobs;
    return bytes;
  }

  //! Validates an untrusted packet in device memory: the header walk, then every scale,
  //! code and padding bit, on the device; only the verdict is copied back.
  [[nodiscard]] validation validate(std::span<const std::byte> packet) const {
    if (packet.size() < sizeof(packet_header))
      return validation::fail(detail::validation_reason(detail::v_truncated_header));
    if (reinterpret_cast<std::uintptr_t>(packet.data()) % 8 != 0)
      return validation::fail(detail::validation_reason(detail::v_misaligned));
    const cudaStream_t s = options_.stream.get();
    launch_walk(packet);
    detail::launch(&detail::check_quantized_payloads, detail::launch_config::per_layer(layout_.size()),
                   detail::packet_threads, s, packet.data(), table_.data(), walk_.data());
    GRAVAC_TRY_CUDA(
        cudaMemcpyAsync(walk_host_.data(), walk_.data(), sizeof(detail::walk_result), cudaMemcpyDeviceToHost, s));
    options_.stream.synchronize();
    const std::uint32_t v = walk_host_[0].verdict;
    if (v == detail::v_ok) return {};
    if (v == detail::v_layout) return {status::layout_mismatch, detail::quant_validation_reason(v)};
    return validation::fail(detail::quant_validation_reason(v));
  }

  //! Adds scale * decompress(packet) to \p out (device memory), with the host decoder's
  //! arithmetic. The packet must have been validated. Asynchronous on the compressor's stream.
  void decompress_add(std::span<const std::byte> packet, grad_view<cuda_space> out, float scale) const {
    require(out.size() == layout_.numel(),
            std::string(name()) + "::decompress_add: buffer size does not match the layout");
    if (packet.size() < sizeof(packet_header) || reinterpret_cast<std::uintptr_t>(packet.data()) % 8 != 0)
      throw error(status::malformed_packet, "decompress_add: packet was not validated");
    launch_walk(packet);  // rebuilds the segment table on the device (no host round trip)
    detail::launch(&detail::decode_quantized, detail::launch_config::per_layer(layout_.size()), detail::packet_threads,
                   options_.stream.get(), packet.data(), desc(), table_.data(), walk_.data(), out.data(), scale);
  }

  //! The options it was built with.
  [[nodiscard]] const options& get_options() const noexcept { return options_; }

 protected:
  //! A compressor for \p lay with options \p opt, already checked by the public class, and
  //! \p levels and \p bucket (qsgd's; terngrad's bucket with one level; 1 and 0 for sign,
  //! cast16 and the block-scaled formats); allocates the whole workspace.
  quantize_cuda_base(const layout& lay, const options& opt, std::uint32_t levels, std::uint32_t bucket)
      : layout_(lay), options_(opt), levels_(levels), bucket_(bucket) {
    if constexpr (block_scaled) {
      format_ = block_format_of(opt);
      stochastic_ = opt.rounding == block_rounding::stochastic;
      feedback_ = opt.error_feedback;
    }
    const stream_ref s = opt.stream;
    launch_ = detail::launch_config::current_device();
    const std::size_t L = std::max<std::size_t>(lay.size(), 1);
    // Worst case of the per-chunk and per-bucket records: every layer quantized.
    std::size_t chunks = 0, buckets = 0;
    // And the most blocks a pass's grid can have (each layer at its largest, raw or not):
    // what the per-block statistics slots hold (ordered_sums.hpp).
    unsigned long long pass_blocks = static_cast<unsigned long long>(launch_.max_stride_grid());
    unsigned long long job_blocks = 0;
    pinned_buffer<std::uint64_t> info(2 * L);
    for (std::size_t i = 0; i < lay.size(); ++i) {
      const auto sh = shape_of(lay[i].numel);
      chunks += sh.chunks;
      buckets += sh.buckets;
      const auto T = static_cast<unsigned long long>(detail::quant_threads);
      const unsigned long long n = lay[i].numel;
      job_blocks += std::max({detail::blocks_covering(pad8(n * sizeof(float)) / sizeof(float), T),
                              detail::blocks_covering(code_slots(n), T),
                              detail::blocks_covering(sh.chunks, detail::chunks_per_block),
                              detail::blocks_covering(n, T), detail::blocks_covering(sh.buckets, T), 1ull});
      info[i] = lay[i].numel;
      info[L + i] = lay[i].offset;
    }
    slots_ = detail::block_slots_buffer(std::max(pass_blocks, job_blocks), s);
    layer_info_ = device_buffer<std::uint64_t>(2 * L, s);
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(layer_info_.data(), info.data(), 2 * L * sizeof(std::uint64_t),
                                    cudaMemcpyHostToDevice, s.get()));
    jobs_ = device_buffer<detail::quant_job>(L, s);
    sums_ = device_buffer<detail::quant_sums>(L, s);
    if constexpr (block_scaled) amax_ = device_buffer<std::uint32_t>(L, s);
    chunks_ = device_buffer<detail::chunk_sums>(std::max<std::size_t>(chunks, 1), s);
    scales_ = device_buffer<detail::bucket_scale>(std::max<std::size_t>(buckets, 1), s);
    plan_ = device_buffer<detail::segment_desc>(L, s);
    head_ = device_buffer<packet_header>(1, s);
    // The gain pass (fused_jobs_pass: topk_cuda's fused pass with k = 0 over every
    // non-empty layer in one launch, a job each, as the quantizers' own jobs) and its
    // workspace.
    gain_jobs_ = detail::fused_jobs(lay, launch_, false, s);
    states_ = device_buffer<detail::select_state>(L, s);
    norms_ = device_buffer<detail::layer_sums>(L, s);
    gain_out_ = device_buffer<double>(detail::max_gain_candidates, s);
    // Validation and decoding.
    table_ = device_buffer<detail::quant_segment>(L, s);
    walk_ = device_buffer<detail::walk_result>(1, s);
    jobs_host_.resize(L);
    plan_host_.resize(L);
    head_host_.resize(1);
    sums_host_.resize(L);
    norms_host_.resize(L);
    states_host_.resize(L);
    gain_host_.resize(detail::max_gain_candidates);
    walk_host_.resize(1);
    job_layer_.resize(L);
    s.synchronize();  // the pinned staging above is freed when this returns
  }

  //! The segments of the last complete packet, as planned on the host (empty until one is).
  [[nodiscard]] std::span<const segment_desc> last_segments() const noexcept { return {plan_host_.data(), last_jobs_}; }

 private:
  // What plan_step works out on the host for the step's launches.
  struct step_plan {
    std::uint32_t jobs = 0;                                // layers with a segment
    unsigned long long blocks[detail::quant_passes] = {};  // blocks of each pass (pass_raw, ...)
  };

  // The plan of the step on the host, into the pinned staging and \p plan: every segment's
  // size follows from the layout, the options and which layers go raw, so the packet size
  // is exact; returns it.
  [[nodiscard]] std::size_t plan_step(const step_params& p, step_plan& plan) {
    namespace cd = detail;
    std::size_t at = sizeof(packet_header);
    auto& blocks = plan.blocks;
    unsigned long long chunk_at = 0, bucket_at = 0;
    std::uint32_t& jobs = plan.jobs;
    const std::uint8_t encoding = encoding_for();
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& l = layout_[i];
      if (l.numel == 0) continue;
      const bool raw = p.kept_fraction[i] >= dense_fraction;
      cd::segment_desc d;
      d.at = at;
      d.header.layer = static_cast<std::uint32_t>(i);
      d.header.encoding = raw ? raw_encoding : encoding;
      d.header.numel = l.numel;
      d.header.count = l.numel;
      d.header.payload_bytes = raw ? pad8(l.numel * sizeof(float)) : payload_bytes(l.numel);
      plan_host_[jobs] = d;
      cd::quant_job& jb = jobs_host_[jobs];
      jb = cd::quant_job{};
      jb.offset = l.offset;
      jb.numel = l.numel;
      jb.payload = at + sizeof(segment_header);
      jb.index = jobs;
      jb.raw = raw ? 1u : 0u;
      for (int k = 0; k < cd::quant_passes; ++k) jb.block_first[k] = blocks[k];
      const auto T = static_cast<unsigned long long>(cd::quant_threads);
      if (raw) {
        blocks[cd::pass_raw] += cd::blocks_covering(pad8(l.numel * sizeof(float)) / sizeof(float), T);
      } else {
        const auto sh = shape_of(l.numel);
        jb.stream = detail::mix_seed(p.seed, p.step, l.id);
        jb.bucket = sh.bucket;
        jb.buckets = sh.buckets;
        jb.chunks_per_bucket = sh.chunks_per_bucket;
        jb.chunks = sh.chunks;
        jb.chunk_first = chunk_at;
        jb.bucket_first = bucket_at;
        chunk_at += sh.chunks;
        bucket_at += sh.buckets;
        const unsigned long long slots = code_slots(l.numel);
        blocks[cd::pass_codes] += cd::blocks_covering(slots, T);
        if constexpr (block_scaled) {  // NVFP4's per-layer amax, one thread per element
          blocks[cd::pass_scales] += format_ == block_format::nvfp4 ? cd::blocks_covering(l.numel, T) : 0;
        } else if constexpr (Q != quant_family::cast16) {  // the chunk sums the scales are made of
          blocks[cd::pass_accumulate] += cd::blocks_covering(sh.chunks, cd::chunks_per_block);
          blocks[cd::pass_scales] += leveled ? cd::blocks_covering(sh.buckets, T) : cd::one_block;
        }
        // The last pass: the residual and the kept energy, from the segment.
        blocks[cd::pass_kept] += static_cast<unsigned long long>(launch_.grid_stride(l.numel, cd::square_tile));
      }
      job_layer_[jobs] = i;
      ++jobs;
      at += sizeof(segment_header) + d.header.payload_bytes;
    }
    packet_header h;
    h.magic = packet_magic;
    h.version = packet_version;
    h.kind = static_cast<std::uint8_t>(kind);
    h.segment_count = jobs;
    h.layout_hash = layout_.hash();
    h.payload_bytes = at - sizeof(packet_header);
    head_host_[0] = h;
    return at;
  }

  // The plan uploaded, the step's kernels and the copies of its statistics, in order on
  // the stream.
  void queue_step(grad_view<cuda_space> g, grad_view<cuda_space> e, const step_params& p, std::byte* packet,
                  const step_plan& plan) {
    namespace cd = detail;
    const cudaStream_t s = options_.stream.get();
    const auto& blocks = plan.blocks;
    const std::uint32_t jobs = plan.jobs;
    progress_ = {};
    // The staging is rewritten next step; this call synchronizes before it returns.
    GRAVAC_TRY_CUDA(cudaMemcpyAsync(head_.data(), head_host_.data(), sizeof(packet_header), cudaMemcpyHostToDevice, s));
    if (jobs) {
      GRAVAC_TRY_CUDA(
          cudaMemcpyAsync(plan_.data(), plan_host_.data(), jobs * sizeof(cd::segment_desc), cudaMemcpyHostToDevice, s));
      GRAVAC_TRY_CUDA(
          cudaMemcpyAsync(jobs_.data(), jobs_host_.data(), jobs * sizeof(cd::quant_job), cudaMemcpyHostToDevice, s));
      GRAVAC_TRY_CUDA(cudaMemsetAsync(sums_.data(), 0, jobs * sizeof(cd::quant_sums), s));
      if constexpr (block_scaled) GRAVAC_TRY_CUDA(cudaMemsetAsync(amax_.data(), 0, jobs * sizeof(std::uint32_t), s));
    }
    detail::launch(&cd::write_packet_headers, cd::table_blocks(jobs, cd::packet_threads), cd::packet_threads, s, packet,
                   head_.data(), plan_.data(), jobs);

    // topk_cuda's fused pass with k = 0 over every non-empty layer: e = u, so the passes
    // below read u from e; each layer's norms in the host's order (square_sums.hpp), a NaN
    // or infinity in u, and the gain curve when one is asked for.
    const bool gains = !p.gain_candidates.empty();
    cd::clear_async(s, states_, norms_);
    if (gains) cd::clear_async(s, gain_out_);
    gain_jobs_.queue(s, g.data(), e.data(), states_.data(), norms_.data(), p.gain_candidates, gain_out_.data());
    progress_.u_jobs = jobs;
    float* gd = g.data();
    float* ed = e.data();
    const cd::quant_job* jd = jobs_.data();
    cd::quant_sums* sd = sums_.data();
    const auto grid_of = [](unsigned long long b) { return static_cast<unsigned>(b); };
    if (blocks[cd::pass_raw]) {
      detail::launch(&cd::raw_jobs, grid_of(blocks[cd::pass_raw]), cd::quant_threads, s, ed, jd, jobs, packet);
      progress_.raw = true;
    }
    if (blocks[cd::pass_codes]) {
      if constexpr (Q == quant_family::cast16) {
        const float ranks = static_cast<float>(std::max(1, p.ranks));
        const float inv = 1.0f / ranks;  // on the host, as cast16 computes it
        const std::uint32_t lim = detail::cast16_limit_bits(options_.format, ranks);
        const unsigned grid = grid_of(blocks[cd::pass_codes]);
        if (options_.format == cast16_format::bf16)
          detail::launch(&cd::cast16_codes<true>, grid, cd::quant_threads, s, ed, jd, jobs, packet, ranks, inv, lim);
        else
          detail::launch(&cd::cast16_codes<false>, grid, cd::quant_threads, s, ed, jd, jobs, packet, ranks, inv, lim);
      } else {
        const unsigned gs = grid_of(blocks[cd::pass_scales]);
        const unsigned gc = grid_of(blocks[cd::pass_codes]);
        if constexpr (block_scaled) {
          if (gs) detail::launch(&cd::layer_finite_amax, gs, cd::quant_threads, s, ed, jd, jobs, amax_.data());
          launch_block_codes(gc, ed, packet, jobs);
        } else if constexpr (Q == quant_family::sign) {
          detail::launch(&cd::accumulate_chunks, grid_of(blocks[cd::pass_accumulate]), cd::quant_threads, s, gd, ed, jd,
                         jobs, chunks_.data());
          detail::launch(&cd::sign_layer_scale, gs, cd::quant_threads, s, jd, jobs, chunks_.data(), packet, sd);
          detail::launch(&cd::sign_codes, gc, cd::quant_threads, s, ed, jd, jobs, packet);
        } else {
          detail::launch(&cd::accumulate_chunks, grid_of(blocks[cd::pass_accumulate]), cd::quant_threads, s, gd, ed, jd,
                         jobs, chunks_.data());
          detail::launch(&cd::bucket_scales<Q == quant_family::qsgd>, gs, cd::quant_threads, s, jd, jobs,
                         chunks_.data(), scales_.data(), packet, levels_, bucket_);
          launch_codes(gc, ed, packet, jobs);
        }
      }
    }
    // The last pass: e = u - decompress(packet) and the kept energy, from the packet. Until
    // it runs, e holds u (the passes above only read it).
    if (blocks[cd::pass_kept]) {
      cd::quant_segment shape;
      shape.encoding = encoding_for();
      shape.width = static_cast<std::uint8_t>(code_bits());
      shape.levels = levels_;
      if constexpr (block_scaled)
        shape.bucket = static_cast<std::uint32_t>(detail::shape_of(format_).block);
      else
        shape.bucket = bucket_;
      detail::launch(&cd::quantized_residuals, grid_of(blocks[cd::pass_kept]), cd::select_threads, s, ed, jd, jobs,
                     static_cast<const std::byte*>(packet), shape, feedback_, sd, slots_.view());
    }
    progress_.codes = true;  // e = u - decompress(packet) from here
    const std::uint32_t rows = std::max<std::uint32_t>(jobs, 1);
    cd::copy_to_host_async(s, sums_host_, sums_, rows);
    cd::copy_to_host_async(s, norms_host_, norms_, rows);
    cd::copy_to_host_async(s, states_host_, states_, rows);
    if (gains) cd::copy_to_host_async(s, gain_host_, gain_out_);
  }

  // After a queuing failure (the stream idle): every layer's residual back to u = g + e_old.
  // The layers sent raw get u back from their segments; those no pass had written u into
  // get g added. Once the code pass ran, the packet is whole and e = u - decompress(packet):
  // that is not undone (it would not give u back bit for bit); the error says so.
  void repair_step(grad_view<cuda_space> g, grad_view<cuda_space> e, const std::byte* packet, const step_plan& plan) {
    namespace cd = detail;
    const cudaStream_t s = options_.stream.get();
    gain_jobs_.reset(s);  // in case the step was cut short inside the gain pass
    if (progress_.codes)
      throw error(status::backend_failure, std::string(name()) +
                                               ": the step failed after its code pass: the packet is complete and the "
                                               "residual holds u - decompress(packet)");
    if (progress_.raw)
      detail::launch(&cd::restore_raw_jobs, static_cast<unsigned>(plan.blocks[cd::pass_raw]), cd::quant_threads, s,
                     e.data(), jobs_.data(), plan.jobs, packet);
    for (std::uint32_t j = progress_.u_jobs; j < plan.jobs; ++j) {
      if (progress_.raw && jobs_host_[j].raw) continue;
      const auto& l = layout_[job_layer_[j]];
      detail::launch(&cd::fold_gradient, launch_.grid_stride(l.numel, cd::select_threads), cd::select_threads, s,
                     g.data() + l.offset, e.data() + l.offset, l.numel);
    }
    options_.stream.synchronize();
  }

  // After the stream finished: the statistics into st; the packet is \p bytes long, as planned.
  std::size_t finish_step(const step_params& p, compress_stats& st, const step_plan& plan, std::size_t bytes) const {
    const std::uint32_t jobs = plan.jobs;
    const bool gains = !p.gain_candidates.empty();
    for (std::uint32_t j = 0; j < jobs; ++j) {
      const auto& norms = norms_host_[j];
      const double kept = jobs_host_[j].raw ? norms.input_sq : sums_host_[j].kept_sq;
      st.layers[job_layer_[j]] = {static_cast<std::size_t>(jobs_host_[j].numel), norms.grad_sq, norms.input_sq, kept};
      st.non_finite |= states_host_[j].non_finite != 0;
    }
    if (gains)
      for (std::size_t c = 0; c < p.gain_candidates.size(); ++c) st.candidate_kept_sq[c] = gain_host_[c];
    return bytes;
  }

  // The chunks and buckets of a quantized layer of n elements, as the host walks them: the
  // records of the chunk sums and bucket scales that the leveled and EF-sign passes keep
  // (cast16 and the block-scaled formats have none: their scales live in the code pass).
  struct layer_shape {
    unsigned long long bucket = 0, buckets = 0, chunks_per_bucket = 0, chunks = 0;
  };
  [[nodiscard]] layer_shape shape_of(std::size_t n) const noexcept {
    layer_shape sh;
    if (n == 0 || Q == quant_family::cast16 || block_scaled) return sh;
    constexpr unsigned long long C = detail::quant_chunk_elems;
    sh.bucket = leveled && bucket_ ? bucket_ : n;  // EF-sign: one bucket, the layer
    sh.buckets = (n + sh.bucket - 1) / sh.bucket;
    sh.chunks_per_bucket = (sh.bucket + C - 1) / C;
    const unsigned long long last = n - (sh.buckets - 1) * sh.bucket;
    sh.chunks = (sh.buckets - 1) * sh.chunks_per_bucket + (last + C - 1) / C;
    return sh;
  }

  // Threads of the code pass of a layer: one per code slot of the padded code words.
  [[nodiscard]] unsigned long long code_slots(std::size_t n) const noexcept {
    const unsigned w = code_bits();
    return pad8(detail::code_bytes(n, w)) * 8 / w;
  }
  [[nodiscard]] unsigned code_bits() const noexcept {
    if constexpr (leveled)
      return code_width(levels_);
    else if constexpr (block_scaled)
      return detail::shape_of(format_).code_bits;
    else if constexpr (Q == quant_family::sign)
      return 1;
    else
      return 16;
  }

  [[nodiscard]] std::size_t payload_bytes(std::size_t n) const noexcept {
    if constexpr (leveled) {
      return leveled_payload_bytes(n, levels_, bucket_);
    } else if constexpr (block_scaled) {
      const block_shape bs = detail::shape_of(format_);
      return block_scaled_payload_bytes(n, bs.block, bs.code_bits);
    } else if constexpr (Q == quant_family::sign) {
      return sign_payload_bytes(n);
    } else {
      return half_payload_bytes(n);
    }
  }

  [[nodiscard]] std::uint8_t encoding_for() const noexcept {
    quant_encoding enc = quant_encoding::fp16;
    if constexpr (Q == quant_family::qsgd)
      enc = quant_encoding::qsgd;
    else if constexpr (Q == quant_family::terngrad)
      enc = quant_encoding::terngrad;
    else if constexpr (Q == quant_family::sign)
      enc = quant_encoding::sign;
    else if constexpr (Q == quant_family::cast16)
      enc = options_.format == cast16_format::bf16 ? quant_encoding::bf16 : quant_encoding::fp16;
    else if constexpr (block_scaled)
      enc = detail::shape_of(format_).encoding;
    return static_cast<std::uint8_t>(enc);
  }

  // The block-scaled format of the options (checked by the public class).
  static block_format block_format_of(const options& opt) noexcept {
    if constexpr (Q == quant_family::mxfp8)
      return opt.element == mxfp8_element::e5m2 ? block_format::mxfp8_e5m2 : block_format::mxfp8_e4m3;
    else if constexpr (Q == quant_family::mxfp4)
      return block_format::mxfp4;
    else
      return block_format::nvfp4;
  }

  static constexpr const char* name() noexcept {
    switch (Q) {
      case quant_family::qsgd:
        return "qsgd_cuda";
      case quant_family::terngrad:
        return "terngrad_cuda";
      case quant_family::sign:
        return "sign_cuda";
      case quant_family::mxfp8:
        return "mxfp8_cuda";
      case quant_family::mxfp4:
        return "mxfp4_cuda";
      case quant_family::nvfp4:
        return "nvfp4_cuda";
      default:
        return "cast16_cuda";
    }
  }

  // The code pass of QSGD / TernGrad for the compressor's code width.
  void launch_codes(unsigned grid, float* e, std::byte* packet, std::uint32_t count) {
    namespace cd = detail;
    const cudaStream_t s = options_.stream.get();
    const auto lv = static_cast<std::int32_t>(levels_);
    const cd::quant_job* jd = jobs_.data();
    switch (code_width(levels_)) {
      case 2:
        detail::launch(&cd::quantize_codes<2>, grid, cd::quant_threads, s, e, jd, count, scales_.data(), packet, lv);
        break;
      case 4:
        detail::launch(&cd::quantize_codes<4>, grid, cd::quant_threads, s, e, jd, count, scales_.data(), packet, lv);
        break;
      case 8:
        detail::launch(&cd::quantize_codes<8>, grid, cd::quant_threads, s, e, jd, count, scales_.data(), packet, lv);
        break;
      default:
        detail::launch(&cd::quantize_codes<16>, grid, cd::quant_threads, s, e, jd, count, scales_.data(), packet, lv);
        break;
    }
  }

  // The code pass of the block-scaled format chosen at construction (one instantiation per
  // format and rounding, as the host's with_codec).
  void launch_block_codes(unsigned grid, float* e, std::byte* packet, std::uint32_t count) {
    if constexpr (block_scaled) {
      switch (format_) {
        case block_format::mxfp8_e5m2:
          return launch_block_codes_of<block_format::mxfp8_e5m2>(grid, e, packet, count);
        case block_format::mxfp4:
          return launch_block_codes_of<block_format::mxfp4>(grid, e, packet, count);
        case block_format::nvfp4:
          return launch_block_codes_of<block_format::nvfp4>(grid, e, packet, count);
        default:
          return launch_block_codes_of<block_format::mxfp8_e4m3>(grid, e, packet, count);
      }
    }
  }
  template <block_format F>
  void launch_block_codes_of(unsigned grid, float* e, std::byte* packet, std::uint32_t count) {
    namespace cd = detail;
    const cudaStream_t s = options_.stream.get();
    if (stochastic_)
      detail::launch(&cd::block_scaled_codes<F, true>, grid, cd::quant_threads, s, e, jobs_.data(), count, amax_.data(),
                     packet);
    else
      detail::launch(&cd::block_scaled_codes<F, false>, grid, cd::quant_threads, s, e, jobs_.data(), count,
                     amax_.data(), packet);
  }

  void launch_walk(std::span<const std::byte> packet) const {
    detail::launch(&detail::walk_quantized_packet, detail::one_block, detail::one_thread, options_.stream.get(),
                   packet.data(), packet.size(), desc(), Q, encoding_for(), table_.data(), walk_.data());
  }
  [[nodiscard]] detail::layout_desc desc() const noexcept {
    const std::size_t L = std::max<std::size_t>(layout_.size(), 1);
    return {layer_info_.data(), layer_info_.data() + L, static_cast<std::uint32_t>(layout_.size()), layout_.hash()};
  }

  layout layout_;
  friend class stream_members<quantize_cuda_base>;  // stream() reads options_.stream
  options options_;
  std::uint32_t levels_ = 1;
  std::uint32_t bucket_ = 0;
  block_format format_{};         // block-scaled: the format
  bool stochastic_ = false;       // block-scaled: stochastic rounding
  bool feedback_ = true;          // block-scaled: keep the residual
  detail::launch_config launch_;  // the grids of this device
  device_buffer<std::uint64_t> layer_info_;
  detail::block_slots_buffer slots_;  // per-block partial statistics (ordered_sums.hpp)
  device_buffer<detail::quant_job> jobs_;
  device_buffer<detail::quant_sums> sums_;
  device_buffer<std::uint32_t> amax_;  // NVFP4: each job's largest finite |u| (bits)
  device_buffer<detail::chunk_sums> chunks_;
  device_buffer<detail::bucket_scale> scales_;
  device_buffer<detail::segment_desc> plan_;
  device_buffer<packet_header> head_;
  detail::fused_jobs gain_jobs_;                // the gain pass's jobs and workspace
  device_buffer<detail::select_state> states_;  // the fused pass's per job: non_finite is read
  device_buffer<detail::layer_sums> norms_;     // the fused pass's ||g||^2 and ||u||^2 per job
  device_buffer<double> gain_out_;
  mutable device_buffer<detail::quant_segment> table_;
  mutable device_buffer<detail::walk_result> walk_;
  pinned_buffer<detail::quant_job> jobs_host_;
  pinned_buffer<detail::segment_desc> plan_host_;
  pinned_buffer<packet_header> head_host_;
  pinned_buffer<detail::quant_sums> sums_host_;
  pinned_buffer<detail::layer_sums> norms_host_;
  pinned_buffer<detail::select_state> states_host_;
  pinned_buffer<double> gain_host_;
  mutable pinned_buffer<detail::walk_result> walk_host_;
  std::vector<std::size_t> job_layer_;
  // How far the step's queue got (repair_step): jobs [0, u_jobs) hold u in e (or, sent
  // raw after raw_jobs ran, in their segment), raw_jobs ran, the code pass ran.
  struct {
    std::uint32_t u_jobs = 0;
    bool raw = false;
    bool codes = false;
  } progress_;
  std::uint32_t last_jobs_ = 0;  // segments of the last complete packet (last_segments)
};

}  // namespace gravac::detail
