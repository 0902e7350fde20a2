// Fuzzes the EF-sign packet decoder (one scale and sign bits per layer, packet_kind::quantized).
#include "fuzz_packet.hpp"

GRAVAC_FUZZ_COMPRESSOR(gravac::sign, gravac::sign_options{})
