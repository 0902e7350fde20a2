// Code shown in the documentation (docs/*.md pull it in with \snippet), compiled and
// tested here so that the guides cannot drift from the library.
#include <catch2/catch.hpp>

#include <sstream>
#include <vector>

#include "gravac/telemetry.hpp"
#include "gravac_test_util.hpp"

//! [custom_compressor]
#include <gravac/packet/raw_segment.hpp>
#include <gravac/concepts.hpp>

// Sends half of the layers each step, alternating (even layers at even steps, odd
// layers at odd steps); a layer that waits keeps its gradient in the residual, so
// nothing is lost (error feedback). Packets are plain raw segments.
struct alternating_layers_options {};

class alternating_layers {
 public:
  using compressor_tag = void;                       // opts in to gravac::Compressor
  using memory_space = gravac::host_space;           // works on host memory
  using options = alternating_layers_options;
  static constexpr bool summable_by_index = false;   // not for allreduce_compatible

  alternating_layers(const gravac::layout& lay, const options& = {}) : layout_(lay) {}

  // Upper bound of a packet: every layer raw (the trainer sizes its buffers once).
  [[nodiscard]] std::size_t max_packet_bytes() const noexcept {
    std::size_t n = sizeof(gravac::packet_header);
    for (const auto& l : layout_.layers()) n += gravac::raw_segment_bytes(l.numel);
    return n;
  }

  std::size_t compress(gravac::host_view g, gravac::host_view e, const gravac::step_params& p,
                       std::span<std::byte> out, gravac::compress_stats& st) {
    gravac::byte_writer w(out);
    std::byte* header = gravac::begin_packet(w);
    std::uint32_t segments = 0;
    for (std::uint32_t i = 0; i < layout_.size(); ++i) {
      auto gi = g.slice(layout_[i]), ei = e.slice(layout_[i]);
      if (gi.size() > 0 && (i + p.step) % 2 == 0) {
        gravac::write_raw_segment(w, i, gi.span(), ei.span(), st.layers[i]);  // u = g + e sent, e = 0
        ++segments;
      } else {
        double gsq = 0, usq = 0;
        for (std::size_t j = 0; j < gi.size(); ++j) {
          gsq += double(gi.span()[j]) * gi.span()[j];
          ei.span()[j] += gi.span()[j];  // not sent: e = u
          usq += double(ei.span()[j]) * ei.span()[j];
        }
        st.layers[i] = {.kept = 0, .grad_sq = gsq, .input_sq = usq, .kept_sq = 0};
      }
    }
    gravac::finish_packet(w, header, gravac::packet_kind::dense, segments, layout_.hash());
    return w.size();
  }

  // Packets come from peers: check everything before decompress_add touches memory.
  [[nodiscard]] gravac::validation validate(std::span<const std::byte> packet) const {
    return gravac::validate_packet(packet, layout_, gravac::packet_kind::dense, gravac::validate_raw_segment);
  }

  void decompress_add(std::span<const std::byte> packet, gravac::host_view out, float scale) const {
    gravac::for_each_segment(packet, [&](const gravac::segment_header& sh, std::span<const std::byte> payload) {
      gravac::add_raw_segment(payload, out.slice(layout_[sh.layer]).span(), scale);
    });
  }

 private:
  gravac::layout layout_;
};
static_assert(gravac::Compressor<alternating_layers>);
//! [custom_compressor]

using namespace gravac;

namespace {
// The getting-started guide's "backward pass": the gradient of 0.5 * |params - target_r|^2.
void compute_gradients(const std::vector<float>& params, std::vector<float>& grads, int rank) {
  for (std::size_t i = 0; i < params.size(); ++i) grads[i] = params[i] - static_cast<float>(rank + i % 3);
}
}  // namespace

TEST_CASE("docs: the custom compressor of the concepts guide works in a trainer", "[docs]") {
  const auto lay = test::mixed_layout();
  constexpr int ranks = 2;
  std::vector<std::vector<float>> g0(ranks), g1(ranks), out0(ranks), out1(ranks), res(ranks);
  for (int r = 0; r < ranks; ++r) {
    g0[r] = test::make_data(lay.numel(), 10 + r);
    g1[r] = test::make_data(lay.numel(), 20 + r);
  }
  run_ranks(ranks, [&](thread_communicator& comm) {
    trainer<alternating_layers, allgather, fixed_policy> t(comm, lay);
    const int r = comm.rank();
    out0[r] = g0[r];
    t.step(out0[r]);
    out1[r] = g1[r];
    t.step(out1[r]);
    res[r].assign(t.residual().begin(), t.residual().end());
  });
  for (std::size_t i = 0; i < lay.size(); ++i) {
    const auto& l = lay[i];
    for (std::size_t j = l.offset; j < l.offset + l.numel; ++j) {
      const float avg0 = 0.5f * g0[0][j] + 0.5f * g0[1][j];
      const float avg01 = 0.5f * (g1[0][j] + g0[0][j]) + 0.5f * (g1[1][j] + g0[1][j]);
      if (i % 2 == 0) {  // sent at step 0, waited at step 1: g1 waits in the residual
        CHECK(out0[0][j] == Approx(avg0));
        CHECK(out1[0][j] == 0.0f);
        for (int r = 0; r < ranks; ++r) CHECK(res[r][j] == g1[r][j]);
      } else {  // waited at step 0, sent with the accumulated gradient at step 1
        CHECK(out0[0][j] == 0.0f);
        CHECK(out1[0][j] == Approx(avg01));
        for (int r = 0; r < ranks; ++r) CHECK(res[r][j] == 0.0f);
      }
      CHECK(out0[1][j] == out0[0][j]);
      CHECK(out1[1][j] == out1[0][j]);
    }
  }
}

TEST_CASE("docs: the custom compressor rejects a damaged packet", "[docs]") {
  const auto lay = test::mixed_layout();
  alternating_layers c(lay);
  std::vector<std::byte> packet(c.max_packet_bytes());
  auto g = test::make_data(lay.numel(), 3);
  std::vector<float> e(lay.numel(), 0.0f);
  compress_stats st;
  st.reset(lay.size(), 0);
  const auto n = c.compress(host_view(g), host_view(e), test::params_for(lay, 1.0), packet, st);
  CHECK(c.validate(std::span<const std::byte>(packet.data(), n)));
  CHECK_FALSE(c.validate(std::span<const std::byte>(packet.data(), n - 8)));
  packet[0] = std::byte{0};
  CHECK_FALSE(c.validate(std::span<const std::byte>(packet.data(), n)));
}

TEST_CASE("docs: the getting-started loop", "[docs]") {
  //! [getting_started]
  // 1. Describe the model's tensors inside one flat buffer.
  gravac::layout lay;
  lay.add("fc.weight", {10, 64}, gravac::layer_kind::dense);
  lay.add("fc.bias", {10}, gravac::layer_kind::bias_or_norm);

  // 2. Pick a compressor, a collective and a policy at compile time.
  using trainer_t = gravac::trainer<gravac::topk, gravac::allgather, gravac::fixed_policy>;
  trainer_t::options opt;
  opt.policy.kept_fraction = 0.1;  // keep 10% of each layer
  opt.policy.one_dim_dense = true; // biases travel whole

  // 3. Run the ranks (threads here; an mpi_communicator works the same way).
  std::ostringstream log;  // e.g. a std::ofstream("steps.csv")
  gravac::run_ranks(2, [&](gravac::thread_communicator& comm) {
    trainer_t t(comm, lay, opt);
    gravac::csv_sink sink(log, lay, /*header=*/comm.rank() == 0);
    std::vector<float> params(lay.numel(), 0.0f), grads(lay.numel());
    for (int step = 0; step < 20; ++step) {
      compute_gradients(params, grads, comm.rank());   // your backward pass
      const auto& report = t.step(grads);              // grads := average over ranks
      if (comm.rank() == 0) sink.write(report);
      for (std::size_t i = 0; i < params.size(); ++i)  // your optimizer
        params[i] -= 0.1f * grads[i];
    }
  });
  //! [getting_started]
  std::istringstream in(log.str());
  int rows = 0;
  for (std::string line; std::getline(in, line);) ++rows;
  CHECK(rows == 21);  // header + 20 steps
}
