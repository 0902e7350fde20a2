#pragma once
//! \file
//! \brief Deprecated path, kept for one release (0.1.x): the header now lives at
//! `gravac/comm/nccl_communicator.hpp`. Include that path instead; this forwarding header goes away in 0.2.

#include "gravac/cuda/detail/nvcc_flags.hpp"
// (first, and apart from the includes below: a missing compiler option is one readable error)

#include "gravac/comm/nccl_communicator.hpp"
