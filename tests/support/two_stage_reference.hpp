#pragma once
// The serial reference of compressed_allreduce's two stages over N ranks, shared by the
// host tests (test_compressed_allreduce) and the GPU tests (test_nccl_compressed), which
// compare the host and the device collectives with it bit for bit.

#include <cstddef>
#include <span>
#include <vector>

#include "gravac/collective/compressed_allreduce.hpp"
#include "gravac/collective/detail/shard_plan.hpp"
#include "gravac/layout.hpp"
#include "gravac/memory.hpp"

namespace gravac::test {

//! One step over N = g.size() ranks: rank q compresses shard j of u_q = g[q] + e[q] with a
//! host compressor C over shard j's layout; shard j's packets are averaged in rank order,
//! the average is compressed again with server residual j (seed server_seed), and the
//! result is every rank's shard j. Updates \p e (per rank) and \p server (per shard) as the
//! ranks would and returns the averaged gradient; \p sent, when given, gets rank \p me's N
//! shard packets.
template <class C>
std::vector<float> two_stage_reference(const layout& lay, const typename C::options& opt, const step_params& p,
                                       const std::vector<std::vector<float>>& g, std::vector<std::vector<float>>& e,
                                       std::vector<std::vector<float>>& server,
                                       std::vector<std::vector<std::byte>>* sent = nullptr, std::size_t me = 0) {
  const std::size_t n = g.size();
  const detail::shard_plan plan(lay, n);
  std::vector<std::vector<std::vector<std::byte>>> packets(n, std::vector<std::vector<std::byte>>(n));
  for (std::size_t q = 0; q < n; ++q)
    for (std::size_t j = 0; j < n; ++j) {
      C c(plan.shard_layout(j), opt);
      std::vector<float> gs(plan.numel(j)), es(plan.numel(j));
      plan.gather(j, g[q].data(), gs.data());
      plan.gather(j, e[q].data(), es.data());
      std::vector<std::byte> packet(c.max_packet_bytes());
      compress_stats st;
      packet.resize(c.compress(grad_view<host_space>(gs.data(), gs.size()), grad_view<host_space>(es.data(), es.size()),
                               p, packet, st));
      packets[q][j] = packet;
      plan.scatter(j, es.data(), e[q].data());
    }
  std::vector<float> out(lay.numel(), 0.0f);
  server.resize(n);
  step_params p2 = p;
  p2.seed = server_seed(p.seed);
  if (sent) *sent = packets[me];
  for (std::size_t j = 0; j < n; ++j) {
    C dec(plan.shard_layout(j), opt);
    std::vector<float> avg(plan.numel(j), 0.0f);
    for (std::size_t q = 0; q < n; ++q)
      dec.decompress_add(packets[q][j], grad_view<host_space>(avg.data(), avg.size()), 1.0f / static_cast<float>(n));
    server[j].resize(plan.numel(j), 0.0f);
    C s(plan.shard_layout(j), opt);
    std::vector<std::byte> packet(s.max_packet_bytes());
    compress_stats st;
    const std::size_t b = s.compress(grad_view<host_space>(avg.data(), avg.size()),
                                     grad_view<host_space>(server[j].data(), server[j].size()), p2, packet, st);
    std::vector<float> shard(plan.numel(j), 0.0f);
    dec.decompress_add(std::span<const std::byte>(packet.data(), b), grad_view<host_space>(shard.data(), shard.size()),
                       1.0f);
    plan.scatter(j, shard.data(), out.data());
  }
  return out;
}

}  // namespace gravac::test
