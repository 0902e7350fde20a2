// Fuzzes the seeded packet decoder (values at indices redrawn from a seed,
// packet_kind::seeded) through random-k.
#include "fuzz_packet.hpp"

GRAVAC_FUZZ_COMPRESSOR(gravac::randomk, gravac::randomk_options{})
