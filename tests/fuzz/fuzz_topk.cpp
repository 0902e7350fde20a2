// Fuzzes the sparse packet decoder (indices + values, packet_kind::sparse) through top-k,
// with raw segments mixed in.
#include "fuzz_packet.hpp"

GRAVAC_FUZZ_COMPRESSOR(gravac::topk, gravac::topk_options{})
