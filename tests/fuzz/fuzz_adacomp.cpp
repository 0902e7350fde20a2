// Fuzzes the AdaComp packet decoder (indices, packed signs and one scale per layer,
// packet_kind::adacomp); the fuzz layout's layer sizes are not multiples of the bin lengths.
#include "fuzz_packet.hpp"

GRAVAC_FUZZ_COMPRESSOR(gravac::adacomp, gravac::adacomp_options{})
