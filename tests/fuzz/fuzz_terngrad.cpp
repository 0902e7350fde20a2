// Fuzzes the TernGrad packet decoder (bucket scales and 2-bit codes, packet_kind::quantized).
#include "fuzz_packet.hpp"

GRAVAC_FUZZ_COMPRESSOR(gravac::terngrad, (gravac::terngrad_options{.bucket = 64}))
