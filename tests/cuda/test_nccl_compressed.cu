// The NCCL path of the collectives that scale with the number of ranks (run under mpiexec,
// one rank per GPU): nccl_communicator::alltoallv against the blocks every rank must
// receive, and compressed_allreduce's 16-bit path (cast16_cuda, its codes summed by an
// NCCL Allreduce in fp16 or bf16) against a host reference built from the host cast16's
// packets of every rank, an fp16 sum that overflows, and return_sent; the two stages on
// device memory (sign_cuda, qsgd_cuda, terngrad_cuda, mxfp8_cuda, mxfp4_cuda, nvfp4_cuda)
// bit for bit against a serial host reference of the same ranks' inputs, a malformed piece
// refused with nothing changed, the server residual's checkpoint, and the trainer
// compositions over NCCL. Skipped (exit 77) without a GPU.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_test_util.hpp"
#include "gravac/checkpoint.hpp"
#include "gravac/collective/compressed_allreduce.hpp"
#include "gravac/compress/detail/half.hpp"
#include "gravac/cuda/block_scaled_cuda.hpp"
#include "gravac/cuda/cast16_cuda.hpp"
#include "gravac/cuda/nccl_communicator.hpp"
#include "gravac/cuda/qsgd_cuda.hpp"
#include "gravac/cuda/sign_cuda.hpp"
#include "gravac/cuda/terngrad_cuda.hpp"
#include "gravac/gravac.hpp"
#include "gravac_test_util.hpp"
#include "nccl_world.hpp"
#include "two_stage_reference.hpp"

namespace {

using gravac::test::to_device;
using gravac::test::to_host;
using gravac::test::world;

static_assert(gravac::AlltoallCommunicator<gravac::nccl_communicator>);
static_assert(gravac::PieceSumCommunicator<gravac::nccl_communicator, gravac::cast16_cuda>);
static_assert(gravac::CollectiveAccepts<gravac::compressed_allreduce, gravac::cast16_cuda>);
// The host engines have no piece sums: host cast16 keeps the two stages with fp32 sums.
static_assert(!gravac::PieceSumCommunicator<gravac::mpi_communicator, gravac::cast16_cuda>);
// The trainer's reference forwards the piece sums (it is what a trainer calls).
static_assert(gravac::PieceSumCommunicator<gravac::communicator_ref<gravac::cuda_space>, gravac::cast16_cuda>);
// The device quantizers run on shards, but cast16_cuda, whose path is the 16-bit sum.
static_assert(gravac::DeviceShardableCompressor<gravac::qsgd_cuda>);
static_assert(gravac::DeviceShardableCompressor<gravac::terngrad_cuda>);
static_assert(gravac::DeviceShardableCompressor<gravac::sign_cuda>);
static_assert(!gravac::DeviceShardableCompressor<gravac::cast16_cuda>);
static_assert(gravac::CollectiveAccepts<gravac::compressed_allreduce, gravac::qsgd_cuda>);
static_assert(gravac::CollectiveAccepts<gravac::compressed_allreduce, gravac::terngrad_cuda>);
static_assert(gravac::CollectiveAccepts<gravac::compressed_allreduce, gravac::sign_cuda>);
static_assert(gravac::DeviceShardableCompressor<gravac::mxfp8_cuda>);
static_assert(gravac::DeviceShardableCompressor<gravac::mxfp4_cuda>);
static_assert(gravac::DeviceShardableCompressor<gravac::nvfp4_cuda>);
static_assert(gravac::CollectiveAccepts<gravac::compressed_allreduce, gravac::nvfp4_cuda>);

// Bytes rank q sends rank j: uneven, and empty for every pair with (q + j) % 3 == 0 (so
// every rank has empty blocks both ways once there are 3 ranks, and the self block of
// rank 0 is empty).
std::size_t block_size(int q, int j) {
  return (q + j) % 3 == 0 ? 0 : static_cast<std::size_t>(1 + (q * 37 + j * 11) % 97);
}
std::byte block_byte(int q, int j, std::size_t i) {
  return static_cast<std::byte>(q * 53 + j * 17 + static_cast<int>(i));
}

}  // namespace

TEST_CASE("nccl_communicator::alltoallv: uneven and empty blocks, device and host input") {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank(), n = comm.size();
  std::vector<std::size_t> send_sizes(static_cast<std::size_t>(n));
  std::vector<std::byte> send;
  for (int j = 0; j < n; ++j) {
    send_sizes[static_cast<std::size_t>(j)] = block_size(r, j);
    for (std::size_t i = 0; i < block_size(r, j); ++i) send.push_back(block_byte(r, j, i));
  }
  for (bool from_host : {false, true}) {
    INFO("host input " << from_host);
    auto sd = to_device(send);
    gravac::device_byte_buffer out;
    std::vector<std::size_t> recv_sizes;
    comm.alltoallv(from_host ? std::span<const std::byte>(send) : std::span<const std::byte>(sd.data(), send.size()),
                   send_sizes, out, recv_sizes);
    REQUIRE(recv_sizes.size() == static_cast<std::size_t>(n));
    std::size_t total = 0;
    for (int q = 0; q < n; ++q) {
      REQUIRE(recv_sizes[static_cast<std::size_t>(q)] == block_size(q, r));
      total += block_size(q, r);
    }
    REQUIRE(out.size() == total);  // exact: no padding
    const auto got = to_host(out.data(), out.size());
    std::size_t at = 0;
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < block_size(q, r); ++i, ++at) REQUIRE(got[at] == block_byte(q, r, i));
  }
  // Every block empty: nothing moves, the sizes still come back.
  std::vector<std::size_t> none(static_cast<std::size_t>(n), 0), recv_sizes;
  gravac::device_byte_buffer out;
  comm.alltoallv({}, none, out, recv_sizes);
  REQUIRE(out.size() == 0);
  for (const std::size_t s : recv_sizes) REQUIRE(s == 0);
  // Sizes that do not add up are refused before anything is sent (on every rank alike).
  std::vector<std::size_t> wrong(static_cast<std::size_t>(n), 1);
  REQUIRE_THROWS_AS(comm.alltoallv({}, wrong, out, recv_sizes), gravac::error);
}

namespace {

// One value of a piece of a host packet, as float (exact: 16-bit values widen exactly).
float piece_value(const std::vector<std::byte>& packet, const gravac::sum_piece& pc, std::size_t i) {
  if (pc.type == gravac::sum_type::f32) {
    float v;
    std::memcpy(&v, packet.data() + pc.offset + 4 * i, 4);
    return v;
  }
  std::uint16_t h;
  std::memcpy(&h, packet.data() + pc.offset + 2 * i, 2);
  return pc.type == gravac::sum_type::f16 ? gravac::detail::fp16_to_float(h) : gravac::detail::bf16_to_float(h);
}

// Steps compressed_allreduce<cast16_cuda> over NCCL and the host cast16 of every rank on
// the same inputs, and compares:
// - the residual: bit for bit with this rank's host cast16 residual (u minus the 16-bit
//   value sent, the error-feedback invariant);
// - the gradient with the host reference of the 16-bit sum: for every summed value, the
//   exact sum S of the ranks' values (in double, from the host packets, which equal the
//   device's bit for bit), decoded as cast16 decodes, 0 + (1/N) * (float(S) * N) for the
//   codes and 0 + (1/N) * float(S) for raw layers. When \p exact, every partial sum is
//   representable in the 16-bit format, so NCCL's sum is S whatever its order and the
//   gradient must equal the reference bit for bit. Otherwise NCCL rounds each of its N - 1
//   additions to 16 bits (or to fp32 for raw layers) in an order of its own; the gradient
//   must then be within (N - 1) * u * sum_r |value_r| (+ a half subnormal spacing per
//   addition) of the reference, u the format's unit roundoff (fp16 2^-11, bf16 2^-8,
//   fp32 2^-24), plus 2^-22 relative for the decoding's two float products;
// - the report: the collective, and wire bytes of one Allreduce of the pieces' bytes.
void check_cast16_path(gravac::cast16_format f, bool exact) {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank(), n = comm.size();
  if (exact && n > 16) return;  // the exact data's sums fit the 16-bit formats up to 16 ranks
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {70001}, gravac::layer_kind::dense);
  const std::size_t raw_layer = 2;  // sent dense: its floats are summed in fp32
  gravac::cast16_cuda c(lay, {.format = f});
  gravac::compressed_allreduce ca(lay);
  ca.prepare(c);
  std::vector<gravac::cast16> hosts;
  hosts.reserve(static_cast<std::size_t>(n));
  std::vector<std::vector<float>> host_e(static_cast<std::size_t>(n), std::vector<float>(lay.numel(), 0.0f));
  for (int q = 0; q < n; ++q) hosts.emplace_back(lay, gravac::cast16_options{.format = f});
  auto e = to_device(std::vector<float>(lay.numel(), 0.0f));
  const auto grad = [&](std::uint64_t step, int q) {
    std::vector<float> g(lay.numel());
    if (exact) {
      // N * k / 8 with |k| <= 16: u / N rounds to k / 8 in both formats, the residual is 0,
      // and every partial sum over up to 16 ranks is a multiple of 1/8 below 2 * 16.
      for (std::size_t i = 0; i < g.size(); ++i)
        g[i] = static_cast<float>(n) *
               static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(q) * 13 + step) % 33) - 16) / 8.0f;
    } else {
      g = gravac::test::make_data(lay.numel(), 900 + 10 * step + static_cast<std::uint64_t>(q));
    }
    return g;
  };
  const float inv = 1.0f / static_cast<float>(n), mult = static_cast<float>(n);
  const double u16 = f == gravac::cast16_format::fp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  for (std::uint64_t step = 0; step < 2; ++step) {
    INFO("step " << step);
    auto p = gravac::test::params_for(lay, 0.5, step);
    p.ranks = n;
    p.kept_fraction[raw_layer] = 1.0;
    // The host packets of every rank.
    std::vector<std::vector<std::byte>> packets(static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) {
      auto& hp = packets[static_cast<std::size_t>(q)];
      hp.resize(hosts[static_cast<std::size_t>(q)].max_packet_bytes());
      auto gq = grad(step, q);
      gravac::compress_stats hs;
      hp.resize(hosts[static_cast<std::size_t>(q)].compress(
          gravac::host_view(gq.data(), gq.size()),
          gravac::host_view(host_e[static_cast<std::size_t>(q)].data(), lay.numel()), p, hp, hs));
    }
    auto g = to_device(grad(step, r));
    gravac::step_buffers<gravac::cuda_space> buf{gravac::device_view(g), gravac::device_view(e)};
    gravac::compress_stats st;
    gravac::step_report rep;
    ca.aggregate(c, comm, buf, p, st, rep);
    REQUIRE(rep.collective == gravac::collective_kind::compressed_allreduce);
    const auto span = c.summed_pieces();
    const std::vector<gravac::sum_piece> pieces(span.begin(), span.end());
    const auto got = to_host(g.data(), g.size());
    const auto res = to_host(e.data(), e.size());
    REQUIRE(
        gravac::test::same_words(res.data(), host_e[static_cast<std::size_t>(r)].data(), res.size() * sizeof(float)));
    // The pieces are the non-empty layers in order: the raw one in fp32, the others in 16 bits.
    std::vector<std::size_t> layers;
    for (std::size_t i = 0; i < lay.size(); ++i)
      if (lay[i].numel > 0) layers.push_back(i);
    REQUIRE(pieces.size() == layers.size());
    double piece_bytes = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const auto& pc = pieces[k];
      const auto& l = lay[layers[k]];
      INFO("layer " << l.name);
      REQUIRE(pc.count == l.numel);
      const bool raw = layers[k] == raw_layer;
      REQUIRE((pc.type == gravac::sum_type::f32) == raw);
      piece_bytes += static_cast<double>(pc.count * gravac::sum_type_bytes(pc.type));
      const double u = raw ? std::ldexp(1.0, -24) : u16;
      const double sub = raw || f == gravac::cast16_format::bf16 ? 0.0 : std::ldexp(1.0, -25);
      for (std::size_t i = 0; i < pc.count; ++i) {
        double s = 0, mag = 0;
        for (int q = 0; q < n; ++q) {
          const double v = piece_value(packets[static_cast<std::size_t>(q)], pc, i);
          s += v;
          mag += std::fabs(v);
        }
        const float want = raw ? 0.0f + inv * static_cast<float>(s) : 0.0f + inv * (static_cast<float>(s) * mult);
        const float have = got[l.offset + i];
        if (exact) {
          REQUIRE(std::memcmp(&have, &want, sizeof(float)) == 0);
        } else {
          const double bound =
              (n - 1) * (u * mag + sub) + std::ldexp(std::fabs(static_cast<double>(want)), -22) + 1e-30;
          REQUIRE(std::fabs(static_cast<double>(have) - static_cast<double>(want)) <= bound);
        }
      }
    }
    const auto w = gravac::wire_bytes::allreduce(n, piece_bytes);
    REQUIRE(rep.wire_bytes_sent == w.sent);
    REQUIRE(rep.wire_bytes_received == w.received);
    REQUIRE(rep.bytes_sent == static_cast<std::size_t>(piece_bytes));
  }
}

}  // namespace

TEST_CASE("compressed_allreduce<cast16_cuda> over NCCL: the 16-bit sum equals the host reference") {
  for (const auto f : {gravac::cast16_format::fp16, gravac::cast16_format::bf16}) {
    INFO("format " << static_cast<int>(f));
    check_cast16_path(f, true);   // sums exact in 16 bits: bit for bit
    check_cast16_path(f, false);  // gaussian data: within the 16-bit sum's rounding
  }
}

TEST_CASE("compressed_allreduce<cast16_cuda> over NCCL: an fp16 sum that overflows is rejected, u kept") {
  gravac::nccl_communicator comm(world());
  const int n = comm.size();
  const auto lay = gravac::layout::flat(4099);
  gravac::cast16_cuda c(lay, {.format = gravac::cast16_format::fp16});
  gravac::cast16 host(lay, {.format = gravac::cast16_format::fp16});
  gravac::compressed_allreduce ca(lay);
  ca.prepare(c);
  auto p = gravac::test::params_for(lay, 0.5);
  p.ranks = n;
  // u / N = 60000 on every rank: one code is finite, the fp16 sum of two or more is not.
  std::vector<float> g0(lay.numel(), 60000.0f * static_cast<float>(n));
  g0[7] = -1.5f * static_cast<float>(n);  // one ordinary value beside them
  auto g = to_device(g0);
  auto e = to_device(std::vector<float>(lay.numel(), 0.0f));
  gravac::step_buffers<gravac::cuda_space> buf{gravac::device_view(g), gravac::device_view(e)};
  gravac::compress_stats st;
  gravac::step_report rep;
  std::vector<float> host_e(lay.numel(), 0.0f), hg = g0;
  std::vector<std::byte> packet(host.max_packet_bytes());
  gravac::compress_stats hs;
  packet.resize(host.compress(gravac::host_view(hg.data(), hg.size()), gravac::host_view(host_e.data(), host_e.size()),
                              p, packet, hs));
  // What the host residual holds after the packet is given back: u again, as the host
  // decoder adds the same packet.
  std::vector<float> host_back = host_e;
  host.decompress_add(packet, gravac::host_view(host_back.data(), host_back.size()), 1.0f);
  if (n >= 2) {
    // Every rank refuses the same sum, and first gives its packet back: the residual holds
    // u, the gradient is intact, and a later return_sent changes nothing more.
    REQUIRE_THROWS_AS(ca.aggregate(c, comm, buf, p, st, rep), gravac::error);
    const auto kept = to_host(g.data(), g.size());
    REQUIRE(std::memcmp(kept.data(), g0.data(), g0.size() * sizeof(float)) == 0);  // the gradient intact
    auto res = to_host(e.data(), e.size());
    REQUIRE(gravac::test::same_words(res.data(), host_back.data(), res.size() * sizeof(float)));
    ca.return_sent(c, buf);
    res = to_host(e.data(), e.size());
    REQUIRE(gravac::test::same_words(res.data(), host_back.data(), res.size() * sizeof(float)));
  } else {
    // One rank: the "sum" is the code itself and the step goes through. The residual is u
    // minus the 16-bit value sent; return_sent adds the packet back to it.
    ca.aggregate(c, comm, buf, p, st, rep);
    auto res = to_host(e.data(), e.size());
    REQUIRE(gravac::test::same_words(res.data(), host_e.data(), res.size() * sizeof(float)));
    ca.return_sent(c, buf);
    res = to_host(e.data(), e.size());
    REQUIRE(gravac::test::same_words(res.data(), host_back.data(), res.size() * sizeof(float)));
  }
}

namespace {

// mixed_layout plus a layer larger than a qsgd bucket and one smaller than the rank count
// (empty shards).
gravac::layout device_shard_layout() {
  auto lay = gravac::test::mixed_layout();
  lay.add("big", {70001}, gravac::layer_kind::dense);
  lay.add("tiny", {3}, gravac::layer_kind::bias_or_norm);
  return lay;
}

using gravac::test::two_stage_reference;

// The floats at the end of a server-residual blob (compressed_allreduce::save).
std::vector<float> blob_values(const std::vector<std::byte>& blob, std::size_t count) {
  std::vector<float> v(count);
  REQUIRE(blob.size() >= count * sizeof(float));
  if (count) std::memcpy(v.data(), blob.data() + blob.size() - count * sizeof(float), count * sizeof(float));
  return v;
}

// Rank q's gradient of step s (every rank computes every rank's, for the reference).
std::vector<float> shard_grad(const gravac::layout& lay, std::uint64_t s, int q) {
  return gravac::test::make_data(lay.numel(), 500 + 10 * s + static_cast<std::uint64_t>(q),
                                 s % 2 ? gravac::test::distribution::laplace : gravac::test::distribution::gaussian);
}

// compressed_allreduce<D> over NCCL against the serial host reference of H with the same
// options, over two steps: the gradient, the client residual and the server residual
// (through save(), whose blob a host compressed_allreduce loads and saves back unchanged)
// bit for bit; then return_sent restores both residuals. On \p lay (default:
// device_shard_layout()), layer \p raw_layer sent raw in both stages (none: past the last).
template <class D, class H>
void check_device_two_stages(const typename D::options& dopt, const typename H::options& hopt,
                             const gravac::layout& lay = device_shard_layout(), std::size_t raw_layer = 2) {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank(), n = comm.size();
  const auto me = static_cast<std::size_t>(r);
  const gravac::detail::shard_plan plan(lay, static_cast<std::size_t>(n));
  D c(lay, dopt);
  gravac::compressed_allreduce ca(lay);
  ca.prepare(c);
  std::vector<std::vector<float>> e(static_cast<std::size_t>(n), std::vector<float>(lay.numel(), 0.0f)), server;
  auto ed = to_device(std::vector<float>(lay.numel(), 0.0f));
  std::vector<std::byte> blob;
  for (std::uint64_t s = 0; s < 2; ++s) {
    INFO("step " << s);
    auto p = gravac::test::params_for(lay, 0.01, s);
    p.ranks = n;
    if (raw_layer < lay.size()) p.kept_fraction[raw_layer] = 1.0;  // one layer raw in both stages
    std::vector<std::vector<float>> g;
    for (int q = 0; q < n; ++q) g.push_back(shard_grad(lay, s, q));
    const auto server_before = server;
    std::vector<std::vector<std::byte>> sent;
    const auto want = two_stage_reference<H>(lay, hopt, p, g, e, server, &sent, me);
    auto gd = to_device(g[me]);
    gravac::step_buffers<gravac::cuda_space> buf{gravac::device_view(gd), gravac::device_view(ed)};
    gravac::compress_stats st;
    gravac::step_report rep;
    ca.aggregate(c, comm, buf, p, st, rep);
    REQUIRE(rep.collective == gravac::collective_kind::compressed_allreduce);
    const auto got = to_host(gd.data(), gd.size());
    REQUIRE(gravac::test::same_words(got.data(), want.data(), want.size() * sizeof(float)));
    const auto res = to_host(ed.data(), ed.size());
    REQUIRE(gravac::test::same_words(res.data(), e[me].data(), res.size() * sizeof(float)));
    std::vector<std::byte> blob;
    ca.save(blob);
    const auto sv = blob_values(blob, plan.numel(me));
    REQUIRE(gravac::test::same_words(sv.data(), server[me].data(), sv.size() * sizeof(float)));
    // The host's format: a host compressed_allreduce accepts the blob and writes it back.
    {
      gravac::compressed_allreduce host(lay);
      H hc(lay, hopt);
      host.prepare(hc);
      host.load(blob);
      std::vector<std::byte> again;
      host.save(again);
      REQUIRE(again == blob);
    }
    if (s == 1) {
      // return_sent: this rank's shard packets go back into e (as the host decoders add
      // them), and the server residual is the one before the step.
      ca.return_sent(c, buf);
      for (std::size_t j = 0; j < plan.size(); ++j) {
        H dec(plan.shard_layout(j), hopt);
        std::vector<float> piece(plan.numel(j));
        plan.gather(j, e[me].data(), piece.data());
        dec.decompress_add(sent[j], gravac::grad_view<gravac::host_space>(piece.data(), piece.size()), 1.0f);
        plan.scatter(j, piece.data(), e[me].data());
      }
      const auto back = to_host(ed.data(), ed.size());
      REQUIRE(gravac::test::same_words(back.data(), e[me].data(), back.size() * sizeof(float)));
      ca.save(blob);
      const auto sb = blob_values(blob, plan.numel(me));
      REQUIRE(gravac::test::same_words(sb.data(), server_before[me].data(), sb.size() * sizeof(float)));
    }
  }
}

}  // namespace

TEST_CASE(
    "compressed_allreduce<sign_cuda|qsgd_cuda|terngrad_cuda> over NCCL equals the host's two stages bit for bit") {
  SECTION("sign") { check_device_two_stages<gravac::sign_cuda, gravac::sign>({}, {}); }
  SECTION("qsgd, 127 levels, buckets of 512") { check_device_two_stages<gravac::qsgd_cuda, gravac::qsgd>({}, {}); }
  SECTION("qsgd, 7 levels, whole layers") {
    check_device_two_stages<gravac::qsgd_cuda, gravac::qsgd>({.levels = 7, .bucket = 0}, {.levels = 7, .bucket = 0});
  }
  SECTION("terngrad") { check_device_two_stages<gravac::terngrad_cuda, gravac::terngrad>({}, {}); }
  // The block-scaled formats (their own scales per block and per shard layer).
  SECTION("mxfp8 e5m2, stochastic") {
    constexpr auto e5m2 = gravac::mxfp8_element::e5m2;
    constexpr auto st = gravac::block_rounding::stochastic;
    check_device_two_stages<gravac::mxfp8_cuda, gravac::mxfp8>({.element = e5m2, .rounding = st},
                                                               {.element = e5m2, .rounding = st});
  }
  SECTION("mxfp4") { check_device_two_stages<gravac::mxfp4_cuda, gravac::mxfp4>({}, {}); }
  SECTION("nvfp4, stochastic") {
    constexpr auto st = gravac::block_rounding::stochastic;
    check_device_two_stages<gravac::nvfp4_cuda, gravac::nvfp4>({.rounding = st}, {.rounding = st});
  }
}

TEST_CASE(
    "compressed_allreduce<sign_cuda|qsgd_cuda|terngrad_cuda> over NCCL: more shards than layers and empty shards") {
  // One layer of one element: every shard but the first is empty (each rank compresses,
  // sends, receives and recompresses header-only shard packets). Two layers of 3 and 1
  // elements, the first raw: fewer layers than shards from 3 ranks on, the last shard
  // empty from 4 ranks on.
  const int n = world().size();
  gravac::layout one;
  one.add("one", {1}, gravac::layer_kind::dense);
  gravac::layout two;
  two.add("three", {3}, gravac::layer_kind::dense);
  two.add("single", {1}, gravac::layer_kind::bias_or_norm);
  {
    const gravac::detail::shard_plan plan(one, static_cast<std::size_t>(n));
    REQUIRE(plan.numel(0) == 1);
    for (std::size_t j = 1; j < plan.size(); ++j) REQUIRE(plan.numel(j) == 0);
  }
  for (const auto* lay : {&one, &two}) {
    const std::size_t raw = lay == &two ? 0 : std::size_t(-1);  // -1: none raw
    INFO("layout of " << lay->size() << " layers, " << lay->numel() << " values, on " << n << " ranks");
    check_device_two_stages<gravac::sign_cuda, gravac::sign>({}, {}, *lay, raw);
    check_device_two_stages<gravac::qsgd_cuda, gravac::qsgd>({}, {}, *lay, raw);
    check_device_two_stages<gravac::qsgd_cuda, gravac::qsgd>({.levels = 7, .bucket = 0}, {.levels = 7, .bucket = 0},
                                                             *lay, raw);
    check_device_two_stages<gravac::terngrad_cuda, gravac::terngrad>({}, {}, *lay, raw);
    check_device_two_stages<gravac::mxfp8_cuda, gravac::mxfp8>({}, {}, *lay, raw);
    check_device_two_stages<gravac::nvfp4_cuda, gravac::nvfp4>({}, {}, *lay, raw);
  }
}

namespace gravac_nccl_test {

// Every rank damages the block it received from the last rank (its packet header), so
// every rank refuses it in the same place and none waits in a later collective. Outside
// the anonymous namespace: the members the concept needs but the test does not call would
// each be an unused-function warning there.
class damaging_nccl {
 public:
  using communicator_tag = void;
  using memory_space = gravac::cuda_space;
  using byte_buffer = gravac::device_byte_buffer;
  explicit damaging_nccl(gravac::nccl_communicator& c) : c_(c) {}
  [[nodiscard]] int rank() const { return c_.rank(); }
  [[nodiscard]] int size() const { return c_.size(); }
  void allreduce_sum(std::span<float> d) { c_.allreduce_sum(d); }
  void allreduce_sum(std::span<double> d) { c_.allreduce_sum(d); }
  void allreduce_max(std::span<double> d) { c_.allreduce_max(d); }
  void allgatherv(std::span<const std::byte> in, byte_buffer& out, std::vector<std::size_t>& sizes) {
    c_.allgatherv(in, out, sizes);
  }
  void alltoallv(std::span<const std::byte> in, std::span<const std::size_t> send_sizes, byte_buffer& out,
                 std::vector<std::size_t>& recv_sizes) {
    c_.alltoallv(in, send_sizes, out, recv_sizes);
    std::size_t at = 0;
    for (std::size_t q = 0; q + 1 < recv_sizes.size(); ++q) at += recv_sizes[q];
    if (recv_sizes.back()) GRAVAC_TRY_CUDA(cudaMemset(out.data() + at, 0xff, 1));  // the packet's magic
  }
  void broadcast(std::span<std::byte> d, int root) { c_.broadcast(d, root); }
  void barrier() { c_.barrier(); }

 private:
  gravac::nccl_communicator& c_;
};
static_assert(gravac::AlltoallCommunicator<damaging_nccl>);

}  // namespace gravac_nccl_test

TEST_CASE("compressed_allreduce<qsgd_cuda> over NCCL refuses a malformed piece, naming its sender, nothing changed") {
  gravac::nccl_communicator nccl(world());
  gravac_nccl_test::damaging_nccl comm(nccl);
  const int n = comm.size();
  const auto lay = device_shard_layout();
  gravac::qsgd_cuda c(lay);
  gravac::compressed_allreduce ca(lay);
  ca.prepare(c);
  auto p = gravac::test::params_for(lay, 0.01);
  p.ranks = n;
  const auto g0 = shard_grad(lay, 0, comm.rank());
  auto gd = to_device(g0);
  auto ed = to_device(std::vector<float>(lay.numel(), 0.0f));
  gravac::step_buffers<gravac::cuda_space> buf{gravac::device_view(gd), gravac::device_view(ed)};
  gravac::compress_stats st;
  gravac::step_report rep;
  std::string what;
  bool malformed = false;
  try {
    ca.aggregate(c, comm, buf, p, st, rep);
  } catch (const gravac::error& x) {
    what = x.what();
    malformed = x.code() == gravac::status::malformed_packet;
  }
  INFO(what);
  // The last rank's block to every rank is damaged (a shard whose layer pieces are all
  // empty still travels as a header-only packet), so every rank refuses it.
  REQUIRE(malformed);
  REQUIRE(what.find("from rank " + std::to_string(n - 1)) != std::string::npos);
  const auto kept = to_host(gd.data(), gd.size());
  REQUIRE(std::memcmp(kept.data(), g0.data(), g0.size() * sizeof(float)) == 0);  // the gradient intact
  std::vector<std::byte> blob;
  ca.save(blob);
  const gravac::detail::shard_plan plan(lay, static_cast<std::size_t>(n));
  for (const float v : blob_values(blob, plan.numel(static_cast<std::size_t>(comm.rank())))) REQUIRE(v == 0.0f);
}

TEST_CASE("compressed_allreduce<sign_cuda> over NCCL: the server residual round-trips through save and load") {
  gravac::nccl_communicator comm(world());
  const int r = comm.rank(), n = comm.size();
  const auto lay = device_shard_layout();
  gravac::sign_cuda c(lay);
  gravac::compressed_allreduce ca(lay);
  ca.prepare(c);
  auto ed = to_device(std::vector<float>(lay.numel(), 0.0f));
  for (std::uint64_t s = 0; s < 2; ++s) {
    auto p = gravac::test::params_for(lay, 0.01, s);
    p.ranks = n;
    auto gd = to_device(shard_grad(lay, s, r));
    gravac::step_buffers<gravac::cuda_space> buf{gravac::device_view(gd), gravac::device_view(ed)};
    gravac::compress_stats st;
    gravac::step_report rep;
    ca.aggregate(c, comm, buf, p, st, rep);
  }
  std::vector<std::byte> blob;
  ca.save(blob);
  REQUIRE(!blob.empty());
  // Loaded into a fresh device collective: saved back unchanged before a step (the loaded
  // values wait on the host), then uploaded by the next step, which both collectives take
  // on the same input and residual, bit for bit alike.
  gravac::sign_cuda c2(lay);
  gravac::compressed_allreduce other(lay);
  other.prepare(c2);
  other.load(blob);
  std::vector<std::byte> again;
  other.save(again);
  REQUIRE(again == blob);
  auto e2 = to_device(to_host(ed.data(), ed.size()));
  auto p = gravac::test::params_for(lay, 0.01, 2);
  p.ranks = n;
  const auto g2 = shard_grad(lay, 2, r);
  auto ga = to_device(g2), gb = to_device(g2);
  gravac::step_buffers<gravac::cuda_space> ba{gravac::device_view(ga), gravac::device_view(ed)};
  gravac::step_buffers<gravac::cuda_space> bb{gravac::device_view(gb), gravac::device_view(e2)};
  gravac::compress_stats st;
  gravac::step_report rep;
  ca.aggregate(c, comm, ba, p, st, rep);
  other.aggregate(c2, comm, bb, p, st, rep);
  const auto xa = to_host(ga.data(), ga.size()), xb = to_host(gb.data(), gb.size());
  REQUIRE(std::memcmp(xa.data(), xb.data(), xa.size() * sizeof(float)) == 0);
  std::vector<std::byte> sa, sb;
  ca.save(sa);
  other.save(sb);
  REQUIRE(sa == sb);
  // A blob of another layout is refused.
  const auto flat = gravac::layout::flat(lay.numel());
  gravac::compressed_allreduce wrong(flat);
  gravac::sign_cuda c3(flat);
  wrong.prepare(c3);
  REQUIRE_THROWS_AS(wrong.load(blob), gravac::error);
}

namespace {

// Two steps of trainer<D, compressed_allreduce, fixed_policy> over NCCL: the composition
// compiles, and its step runs the device two stages (or cast16_cuda's 16-bit path). Then
// the trainer's checkpoint (its device residual and the collective's server residual,
// through the host) goes into a new trainer, and both take a third step bit for bit alike.
template <class D>
void trainer_steps(const typename D::options& copt) {
  gravac::nccl_communicator comm(world());
  const auto lay = device_shard_layout();
  using T = gravac::trainer<D, gravac::compressed_allreduce, gravac::fixed_policy>;
  typename T::options opt;
  opt.compressor = copt;
  opt.policy.kept_fraction = 0.01;
  T t(comm, lay, opt);
  for (std::uint64_t s = 0; s < 2; ++s) {
    auto g = to_device(shard_grad(lay, s, comm.rank()));
    const auto& rep = t.step(gravac::device_view(g));
    REQUIRE(rep.collective == gravac::collective_kind::compressed_allreduce);
  }
  const auto state = gravac::save_checkpoint_bytes(t);
  T resumed(comm, lay, opt);
  const auto report = gravac::restore_checkpoint_bytes(resumed, state);
  REQUIRE(report.policy_restored);
  REQUIRE(report.steps == 2);
  REQUIRE(gravac::save_checkpoint_bytes(resumed) == state);
  const auto g3 = shard_grad(lay, 2, comm.rank());
  auto ga = to_device(g3), gb = to_device(g3);
  t.step(gravac::device_view(ga));
  resumed.step(gravac::device_view(gb));
  const auto xa = to_host(ga.data(), ga.size()), xb = to_host(gb.data(), gb.size());
  REQUIRE(std::memcmp(xa.data(), xb.data(), xa.size() * sizeof(float)) == 0);
  REQUIRE(gravac::save_checkpoint_bytes(t) == gravac::save_checkpoint_bytes(resumed));
}

}  // namespace

TEST_CASE("trainer<qsgd_cuda|sign_cuda|cast16_cuda, compressed_allreduce, fixed_policy> over NCCL") {
  trainer_steps<gravac::qsgd_cuda>({});
  trainer_steps<gravac::sign_cuda>({});
  trainer_steps<gravac::cast16_cuda>({});
}
