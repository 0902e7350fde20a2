// Fuzzes the cast16 packet decoder (fp16 values, packet_kind::quantized).
#include "fuzz_packet.hpp"

GRAVAC_FUZZ_COMPRESSOR(gravac::cast16, gravac::cast16_options{})
