// Fuzzes the threshold (DGC-style) compressor's sparse packets (packet_kind::sparse).
#include "fuzz_packet.hpp"

GRAVAC_FUZZ_COMPRESSOR(gravac::threshold, gravac::threshold_options{})
