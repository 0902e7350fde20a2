// Fuzzes the dense packet decoder (raw segments only, packet_kind::dense) through identity.
#include "fuzz_packet.hpp"

GRAVAC_FUZZ_COMPRESSOR(gravac::identity, gravac::identity_options{})
