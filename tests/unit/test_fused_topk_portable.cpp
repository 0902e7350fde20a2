// The fused top-k tests again with the portable fused pass (the one non-x86 builds use),
// selected by GRAVAC_PORTABLE_KERNELS before any gravac header: both versions of the
// kernel must give the reference selection bit for bit.
#define GRAVAC_PORTABLE_KERNELS 1
#include "test_fused_topk.cpp"  // NOLINT(bugprone-suspicious-include): the same cases, recompiled
