// Fuzzes the QSGD packet decoder (bucket norms and packed level codes, packet_kind::quantized).
#include "fuzz_packet.hpp"

GRAVAC_FUZZ_COMPRESSOR(gravac::qsgd, (gravac::qsgd_options{.levels = 7, .bucket = 64}))
