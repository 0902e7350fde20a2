#pragma once
//! \file gravac.hpp
//! \brief Everything of the host core in one include (no MPI, CUDA or NCCL headers:
//! include gravac/comm/mpi_communicator.hpp and the cuda/ headers for those).

#include "gravac/collective/allgather.hpp"
#include "gravac/collective/dense_allreduce.hpp"
#include "gravac/comm/communicator_ref.hpp"
#include "gravac/comm/thread_communicator.hpp"
#include "gravac/compress/identity.hpp"
#include "gravac/compress/randomk.hpp"
#include "gravac/compress/topk.hpp"
#include "gravac/concepts.hpp"
#include "gravac/error.hpp"
#include "gravac/layout.hpp"
#include "gravac/memory.hpp"
#include "gravac/packet.hpp"
#include "gravac/policy/fixed_policy.hpp"
#include "gravac/step.hpp"
#include "gravac/trainer.hpp"
