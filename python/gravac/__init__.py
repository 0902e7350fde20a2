"""gravac: adaptive gradient compression for data-parallel training.

The C++ library is header-only; its runtime composition is reached through a stable C ABI
(``libgravac_c.so.1``, include/gravac_c.h), which this pure-Python package loads with
ctypes: it links neither Python nor torch, so one build serves every CPython >= 3.9 and
every torch >= 1.13. ``gravac.torch`` gives PyTorch's DistributedDataParallel a
communication hook backed by gravac's compressors, collectives and policies, a trainer
over a torch.distributed process group, and local-step training (``LocalSteps``: local
SGD, DiLoCo) in place of DDP.

``gravac.options()`` describes every option (name, type, range, default, doc) from the
library's option table; ``presets()``, ``compressors()``, ``collectives()`` and
``policies()`` list the names it accepts.
"""

__version__ = "0.2.0"

__all__ = ["options", "presets", "compressors", "collectives", "policies", "library_version", "library_path"]


def options():
    """The option table: a list of dicts with the keys name, type ("bool", "int", "real",
    "choice"), range ((min, max), inclusive, for int and real; else None), choices (the
    values of a choice; else None), default (as text) and doc (one line)."""
    from . import _capi
    return _capi.option_table()


def presets():
    """The presets' names ("recommended", ...)."""
    from . import _capi
    return _capi.names(_capi.PRESETS)


def compressors():
    """The compressors' names."""
    from . import _capi
    return _capi.names(_capi.COMPRESSORS)


def collectives():
    """The collectives' names."""
    from . import _capi
    return _capi.names(_capi.COLLECTIVES)


def policies():
    """The policies' names."""
    from . import _capi
    return _capi.names(_capi.POLICIES)


def library_version():
    """The loaded C library's version ("major.minor.patch")."""
    from . import _capi
    return _capi.lib().gravac_version().decode()


def library_path():
    """The path the C library is (or will be) loaded from."""
    from . import _capi
    return _capi.library_path()
