#pragma once
//! \file
//! \brief Deprecated path, kept for one release (0.1.x): the header now lives at
//! `gravac/packet/format.hpp`. Include that path instead; this forwarding header goes away in 0.2.

#include "gravac/packet/format.hpp"
