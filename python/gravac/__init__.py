"""gravac: adaptive gradient compression for data-parallel training.

The C++ library is header-only; from Python, ``gravac.torch`` gives PyTorch's
DistributedDataParallel a communication hook backed by gravac's compressors,
collectives and policies, and a trainer over a torch.distributed process group.
"""

__version__ = "0.2.0"
