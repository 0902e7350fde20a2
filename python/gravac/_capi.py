"""ctypes declarations of gravac's C ABI (include/gravac_c.h) and the library's loader.

The package links nothing: ``libgravac_c.so.1`` is loaded with ctypes, so one build serves
every CPython >= 3.9 and every torch. The library is looked up, in order, at the path in the
environment variable ``GRAVAC_C_LIBRARY``, next to this file (the wheel and the build tree
put it there), and by the dynamic loader's search (``libgravac_c.so.1``).
"""

import ctypes
import os
import threading

ABI_VERSION = 1  # GRAVAC_C_ABI_VERSION of the header this module declares

# gravac_status
OK, INVALID_ARGUMENT, MALFORMED_PACKET, LAYOUT_MISMATCH, NON_FINITE, BACKEND_FAILURE = 0, 1, 2, 3, 4, 5
TIMEOUT, ABORTED, IO_FAILURE, DIVERGED, BUFFER_TOO_SMALL, UNSUPPORTED, INTERNAL = 6, 7, 8, 9, 10, 11, 12
# gravac_device, gravac_dtype, gravac_reduce_op
DEVICE_HOST, DEVICE_CUDA = 0, 1
FLOAT32, FLOAT64 = 0, 1
SUM, MAX = 0, 1
# gravac_layer_kind
LAYER_CONV, LAYER_DENSE, LAYER_RECURRENT, LAYER_BIAS_OR_NORM = 0, 1, 2, 3
# gravac_name_list
COMPRESSORS, COLLECTIVES, POLICIES, PRESETS = 0, 1, 2, 3
# gravac_option_type
OPTION_BOOL, OPTION_INT, OPTION_REAL, OPTION_CHOICE = 0, 1, 2, 3

_c_size_p = ctypes.POINTER(ctypes.c_size_t)


class OptionInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int), ("min", ctypes.c_double),
                ("max", ctypes.c_double), ("choices", ctypes.c_char_p), ("default_value", ctypes.c_char_p),
                ("doc", ctypes.c_char_p)]


class Method(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("preset", ctypes.c_char_p), ("compressor", ctypes.c_char_p),
                ("collective", ctypes.c_char_p), ("policy", ctypes.c_char_p), ("seed", ctypes.c_uint64),
                ("bucket_mb", ctypes.c_double), ("option_names", ctypes.POINTER(ctypes.c_char_p)),
                ("option_values", ctypes.POINTER(ctypes.c_char_p)), ("option_count", ctypes.c_size_t),
                ("device", ctypes.c_int), ("stream", ctypes.c_void_p)]


ALLREDUCE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                ctypes.c_int)
ALLGATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
BROADCAST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
BARRIER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
ALLTOALLV_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, _c_size_p, ctypes.c_void_p,
                                _c_size_p)


# The device callbacks: the same collectives over CUDA memory, with the cudaStream_t to order on.
DEVICE_ALLREDUCE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_void_p)
DEVICE_ALLGATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_void_p, ctypes.c_void_p)
DEVICE_BROADCAST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_void_p)
DEVICE_BARRIER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class DeviceCommCallbacks(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("user", ctypes.c_void_p), ("rank", ctypes.c_int),
                ("size", ctypes.c_int), ("allreduce", DEVICE_ALLREDUCE_FN), ("allgather", DEVICE_ALLGATHER_FN),
                ("broadcast", DEVICE_BROADCAST_FN), ("barrier", DEVICE_BARRIER_FN)]


class CommCallbacks(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("user", ctypes.c_void_p), ("rank", ctypes.c_int),
                ("size", ctypes.c_int), ("allreduce", ALLREDUCE_FN), ("allgather", ALLGATHER_FN),
                ("broadcast", BROADCAST_FN), ("barrier", BARRIER_FN), ("alltoallv", ALLTOALLV_FN)]


class Layer(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("shape", _c_size_p), ("ndim", ctypes.c_size_t), ("kind", ctypes.c_int)]


class StepReport(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("step", ctypes.c_uint64), ("bytes_sent", ctypes.c_uint64),
                ("dense_bytes", ctypes.c_uint64), ("wire_bytes_sent", ctypes.c_double),
                ("wire_bytes_received", ctypes.c_double), ("gain", ctypes.c_double),
                ("mean_kept_fraction", ctypes.c_double), ("collective", ctypes.c_char_p),
                ("fallback", ctypes.c_char_p), ("compress_s", ctypes.c_double), ("communicate_s", ctypes.c_double),
                ("decompress_s", ctypes.c_double), ("exposed_communicate_s", ctypes.c_double),
                ("buckets", ctypes.c_uint64), ("skipped", ctypes.c_int)]


class LocalStepsInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("period", ctypes.c_uint64), ("round_step", ctypes.c_uint64),
                ("inner_steps", ctypes.c_uint64), ("exchanges", ctypes.c_uint64),
                ("exchange_in_flight", ctypes.c_int)]


_vp, _sz, _st = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_c_int_p = ctypes.POINTER(ctypes.c_int)
_SIGNATURES = {
    "gravac_abi_version": (ctypes.c_int, []),
    "gravac_version": (ctypes.c_char_p, []),
    "gravac_last_error": (ctypes.c_char_p, []),
    "gravac_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "gravac_name_at": (_st, [ctypes.c_int, _sz, ctypes.POINTER(ctypes.c_char_p)]),
    "gravac_option_count": (_sz, []),
    "gravac_option_at": (_st, [_sz, ctypes.POINTER(OptionInfo)]),
    "gravac_method_check": (_st, [ctypes.POINTER(Method)]),
    "gravac_comm_from_callbacks": (_st, [ctypes.POINTER(CommCallbacks), ctypes.POINTER(_vp)]),
    "gravac_comm_from_device_callbacks": (_st, [ctypes.POINTER(DeviceCommCallbacks), ctypes.POINTER(_vp)]),
    "gravac_comm_destroy": (None, [_vp]),
    "gravac_trainer_create": (_st, [ctypes.POINTER(Method), ctypes.POINTER(Layer), _sz, _vp,
                                    ctypes.POINTER(_vp)]),
    "gravac_trainer_destroy": (None, [_vp]),
    "gravac_trainer_numel": (_st, [_vp, _c_size_p]),
    "gravac_trainer_step": (_st, [_vp, _vp, _sz, ctypes.c_int, _vp, ctypes.POINTER(StepReport)]),
    "gravac_trainer_begin_step": (_st, [_vp, _vp, _sz, ctypes.c_int, _vp]),
    "gravac_trainer_ready": (_st, [_vp, _sz]),
    "gravac_trainer_finish": (_st, [_vp, ctypes.POINTER(StepReport)]),
    "gravac_trainer_kept_fractions": (_st, [_vp, ctypes.POINTER(ctypes.c_double), _sz]),
    "gravac_trainer_end_interval": (_st, [_vp, ctypes.c_uint64, ctypes.c_double, ctypes.c_double]),
    "gravac_trainer_policy_state": (_st, [_vp, ctypes.c_char_p, _sz, _c_size_p]),
    "gravac_trainer_save": (_st, [_vp, _vp, _sz, _c_size_p]),
    "gravac_trainer_load": (_st, [_vp, _vp, _sz]),
    "gravac_local_steps_create": (_st, [ctypes.POINTER(Method), ctypes.POINTER(Layer), _sz, _vp, _vp, _sz,
                                        ctypes.POINTER(_vp)]),
    "gravac_local_steps_destroy": (None, [_vp]),
    "gravac_local_steps_before": (_st, [_vp, _vp, _sz, _c_int_p, ctypes.POINTER(StepReport)]),
    "gravac_local_steps_after": (_st, [_vp, _vp, _sz, _c_int_p, ctypes.POINTER(StepReport)]),
    "gravac_local_steps_finish_round": (_st, [_vp, _vp, _sz, _c_int_p, ctypes.POINTER(StepReport)]),
    "gravac_local_steps_complete_exchange": (_st, [_vp]),
    "gravac_local_steps_inner_state_must_agree": (_st, [_vp, _c_int_p]),
    "gravac_local_steps_average_inner_state": (_st, [_vp, _vp, _sz]),
    "gravac_local_steps_get_info": (_st, [_vp, ctypes.POINTER(LocalStepsInfo)]),
    "gravac_local_steps_global_params": (_st, [_vp, _vp, _sz]),
    "gravac_local_steps_end_interval": (_st, [_vp, ctypes.c_uint64, ctypes.c_double, ctypes.c_double]),
    "gravac_local_steps_policy_state": (_st, [_vp, ctypes.c_char_p, _sz, _c_size_p]),
    "gravac_local_steps_save": (_st, [_vp, _vp, _sz, _c_size_p]),
    "gravac_local_steps_load": (_st, [_vp, _vp, _sz]),
}

_lock = threading.Lock()
_lib = None


def library_path():
    """Where the library is loaded from (the first candidate that exists)."""
    env = os.environ.get("GRAVAC_C_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libgravac_c.so.1", "libgravac_c.so"):
        candidate = os.path.join(here, name)
        if os.path.exists(candidate):
            return candidate
    return "libgravac_c.so.1"  # the dynamic loader's search path


def lib():
    """The loaded library (loaded on first use; ImportError when it cannot be)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            try:
                # ctypes.CDLL releases the GIL during every call: a call that blocks in a
                # collective lets the callbacks (which take the GIL) run on another thread.
                handle = ctypes.CDLL(path)
            except OSError as e:
                raise ImportError(f"gravac: cannot load the C library {path!r}: {e} "
                                  "(set GRAVAC_C_LIBRARY to libgravac_c.so.1, or reinstall gravac)") from e
            for name, (restype, argtypes) in _SIGNATURES.items():
                try:
                    fn = getattr(handle, name)
                except AttributeError:
                    raise ImportError(f"gravac: {path} has no {name}: it is older than this package "
                                      "(rebuild libgravac_c, or reinstall gravac)") from None
                fn.restype = restype
                fn.argtypes = argtypes
            version = handle.gravac_abi_version()
            if version != ABI_VERSION:
                raise ImportError(f"gravac: {path} has C ABI version {version}, this package needs {ABI_VERSION}")
            _lib = handle
    return _lib


def last_error():
    message = lib().gravac_last_error()
    return message.decode("utf-8", "replace") if message else ""


def status_name(status):
    name = lib().gravac_status_name(status)
    return name.decode() if name else f"status {status}"


def error(status, what=""):
    """The Python exception of a failed call: ValueError for GRAVAC_INVALID_ARGUMENT, else
    RuntimeError, with gravac_last_error()'s text (read on the calling thread)."""
    message = last_error() or status_name(status)
    text = f"gravac: {what}: {message}" if what else f"gravac: {message}"
    return (ValueError if status == INVALID_ARGUMENT else RuntimeError)(text)


def check(status, what=""):
    if status != OK:
        raise error(status, what)


def names(which):
    """Every entry of a gravac_name_list."""
    out, index, name = [], 0, ctypes.c_char_p()
    while lib().gravac_name_at(which, index, ctypes.byref(name)) == OK:
        out.append(name.value.decode())
        index += 1
    return out


_TYPE_NAMES = {OPTION_BOOL: "bool", OPTION_INT: "int", OPTION_REAL: "real", OPTION_CHOICE: "choice"}


def option_table():
    """The C option table as a list of dicts (name, type, range, choices, default, doc)."""
    out = []
    info = OptionInfo()
    for i in range(lib().gravac_option_count()):
        check(lib().gravac_option_at(i, ctypes.byref(info)), "gravac_option_at")
        kind = _TYPE_NAMES.get(info.type, str(info.type))
        choices = [c for c in (info.choices or b"").decode().split(",") if c]
        out.append({
            "name": info.name.decode(),
            "type": kind,
            "range": (info.min, info.max) if kind in ("int", "real") else None,
            "choices": choices if kind == "choice" else None,
            "default": (info.default_value or b"").decode(),
            "doc": (info.doc or b"").decode(),
        })
    return out
