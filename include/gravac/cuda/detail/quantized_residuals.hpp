#pragma once
//! \file
//! \brief The last pass of the device quantizers: the residual e = u - decompress(segment)
//! and the kept energy ||decompress(segment)||^2, both from the packet the code pass wrote.
//! The kept energy is summed in the one order of core/detail/square_sum.hpp, as the host
//! quantizers sum the same decoded values, so the two give the same bits whatever the grid
//! or the order the blocks run in. Until this pass runs, e still holds u: a step that fails
//! at any launch before it loses nothing (quantize_cuda_base's repair).

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include <cstddef>
#include <cstdint>

#include "gravac/cuda/detail/launch_config.hpp"
#include "gravac/cuda/detail/ordered_sums.hpp"
#include "gravac/cuda/detail/quantize_cuda_kernels.hpp"
#include "gravac/cuda/detail/quantized_packet_kernels.hpp"
#include "gravac/cuda/detail/square_sums.hpp"

namespace gravac::detail {

//! The residual pass: each job with blocks in pass_kept reads its segment back from
//! \p packet (the encoding, code width, level count and elements per scale of \p shape;
//! payload and numel the job's), sets e = u - decoded (0 when not \p feedback: the
//! block-scaled formats' option) and, but for EF-sign (whose kept energy is n * scale^2,
//! from its scale pass), adds the squares of the decoded values into sums[job].kept_sq
//! (zero before). A job's share of the grid is square_sums_pass's group.
__global__ void __launch_bounds__(select_threads)
    quantized_residuals(float* __restrict__ e, const quant_job* __restrict__ jobs, std::uint32_t job_count,
                        const std::byte* __restrict__ packet, quant_segment shape, bool feedback,
                        quant_sums* __restrict__ sums, block_slots slots) {
  const quant_job jb = find_job(jobs, job_count, pass_kept, blockIdx.x);
  quant_segment en = shape;
  en.payload = jb.payload;
  en.numel = jb.numel;
  const quantized_values value(packet + jb.payload, en);
  float* const u = e + jb.offset;
  quant_sums* mine = sums + jb.index;
  const pass_grid grid{blockIdx.x - jb.block_first[pass_kept], job_blocks(jobs, job_count, pass_kept, jb),
                       jb.block_first[pass_kept], &mine->blocks_done};
  const bool sign = shape.encoding == static_cast<std::uint8_t>(quant_encoding::sign);
  double* const out[1] = {sign ? nullptr : &mine->kept_sq};
  square_sums_pass<1>(
      jb.numel, grid, slots, out,
      [&](std::size_t pos, bool in, float(&v)[1]) {
        if (!in) return;
        const float d = value(pos);
        u[pos] = feedback ? __fsub_rn(u[pos], d) : 0.0f;
        v[0] = d;
      },
      [&](std::size_t pos, float(&v)[1]) { v[0] = value(pos); });
}

}  // namespace gravac::detail
