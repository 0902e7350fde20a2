#pragma once
//! \file
//! \brief Deprecated path, kept for one release (0.1.x): the header now lives at
//! `gravac/packet/sparse_packet.hpp`. Include that path instead; this forwarding header goes away in 0.2.

#include "gravac/packet/sparse_packet.hpp"
