// Fuzzes the PowerSGD packet decoder (the P and Q factors of each matrix-shaped layer,
// packet_kind::low_rank). Needs Eigen (target gravac::powersgd).
#include "fuzz_packet.hpp"
#include "gravac/compress/powersgd.hpp"

GRAVAC_FUZZ_COMPRESSOR(gravac::powersgd, gravac::powersgd_options{})
