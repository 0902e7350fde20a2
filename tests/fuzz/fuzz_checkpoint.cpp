// Fuzzes the checkpoint decoder: a checkpoint file is untrusted input too (a torn write,
// a disk error, a file from another run). decode_checkpoint must reject anything
// malformed with gravac::error and never read outside the bytes. The seeds are valid
// checkpoints; most mutations then fail the checksum, so every input is decoded twice: as
// it is, and with its checksum repaired, which reaches the field-by-field parsing.
#include <cstring>

#include "fuzz_packet.hpp"
#include "gravac/checkpoint.hpp"

namespace {
void decode_bytes(const std::vector<std::byte>& bytes) {
  try {
    const auto s = gravac::decode_checkpoint(bytes, "fuzz input");
    // A decoded state is self-consistent: every layer's residual lies inside the vector.
    for (const auto& l : s.layers)
      if (l.residual_offset + l.numel > s.residual.size()) std::abort();
  } catch (const gravac::error& e) {
    if (e.code() != gravac::status::io_failure) std::abort();
  }
}

int decode(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                               reinterpret_cast<const std::byte*>(data) + size);
  decode_bytes(bytes);
  constexpr std::size_t header = 32;
  if (size >= header) {
    const std::uint64_t sum = gravac::detail::fnv1a(bytes.data() + header, bytes.size() - header);
    std::memcpy(bytes.data() + 24, &sum, sizeof sum);
    decode_bytes(bytes);
  }
  return 0;
}

int make(const std::string& dir) {
  const auto& lay = gravac::fuzz::fuzz_layout();
  int n = 0;
  for (std::uint64_t steps : {0u, 1u, 100u}) {
    gravac::checkpoint_state s;
    s.layout_hash = lay.hash();
    s.steps = steps;
    s.seed = steps * 31 + 7;
    s.rank = static_cast<std::int64_t>(steps % 4);
    s.ranks = 4;
    s.residual = gravac::test::make_data(lay.numel(), steps);
    for (const auto& l : lay.layers())
      s.layers.push_back({l.id, l.numel, std::vector<std::uint64_t>(l.shape.begin(), l.shape.end()), l.offset});
    s.policy.assign(steps % 13, std::byte{0x42});
    auto bytes = gravac::encode_checkpoint(s);
    gravac::fuzz::write_seed(dir, n++, bytes);
  }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
  return 0;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  gravac::fuzz::corpus_mode(argc, argv, make);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) { return decode(data, size); }
