#pragma once
//! \file
//! \brief Internal forwarding header: the layered skeleton is public now, in
//! gravac/compress/layered.hpp. The names below keep the remaining internal callers
//! compiling while they move to the public names; nothing outside the library uses them.

#include "gravac/compress/layered.hpp"

namespace gravac::detail {
using ::gravac::compress_layers;
using ::gravac::decompress_layers;
using ::gravac::gain_source;
using ::gravac::layered_scratch;
using ::gravac::raw_packet_bytes;
using ::gravac::validate_layers;
}  // namespace gravac::detail
