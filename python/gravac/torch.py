"""gravac inside PyTorch: a DDP communication hook, a trainer over torch.distributed, and
local-step training (LocalSteps: local SGD, DiLoCo) in place of DDP.

    import gravac.torch
    state, hook = gravac.torch.ddp_hook(ddp_model, compressor="topk",
                                        collective="allgather", policy="gravac")
    ddp_model.register_comm_hook(state, hook)

Nothing else in the training loop changes. ``state.last_report()`` describes the
last step (bytes on the wire, the collective used, the kept fractions);
``state.state_dict()`` / ``state.load_state_dict()`` save and restore the error
feedback residuals and the policy's state with the model's checkpoint (each
rank saves its own: the residuals are rank-local, as an optimizer's state under
sharding is).

This module is pure Python over gravac's C ABI (``libgravac_c.so.1``, through ctypes):
it links no torch, so it works with every torch >= 1.13. Tensors cross the boundary as
pointers; gravac's collectives run through ``torch.distributed`` on the hook's process
group (C callbacks written in Python), so Gloo, MPI and NCCL groups all work. The C ABI
of this build steps host memory: CUDA gradients are copied to a pinned host buffer, stepped
by the host kernels, and copied back.

``LocalSteps(model, period=H)`` replaces DDP: every rank takes H optimizer steps alone,
then the ranks exchange how far their parameters moved (compressed, with error feedback)
and an outer optimizer moves the global parameters; ``local.step(opt)`` replaces
``opt.step()``. It steps host memory: CUDA parameters are staged through a pinned buffer.

Names and options are the library's (``gravac.compressors()``, ``gravac.collectives()``,
``gravac.policies()``, ``presets()``, ``option_names()``; ``gravac.options()`` describes
each option). A bad name or option raises ValueError before anything is sent.
"""

import atexit
import ctypes
import time
import traceback
import warnings
import threading
import weakref

import torch
import torch.distributed as dist

from . import _capi

__all__ = ["ddp_hook", "HookState", "Trainer", "LocalSteps", "option_names", "presets"]


def option_names():
    """The keyword options ddp_hook and Trainer accept."""
    return [o["name"] for o in _capi.option_table()]


def presets():
    """The presets' names, for ``preset=`` ("recommended", ...)."""
    return _capi.names(_capi.PRESETS)


# --- the model's parameters ------------------------------------------------------------

def _module_of(model):
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module, set(getattr(model, "parameters_to_ignore", ()) or ())
    if isinstance(model, torch.nn.Module):
        return model, set()
    raise TypeError(f"gravac.torch: expected a torch.nn.Module or DistributedDataParallel, got {type(model).__name__}")


def _parameters(model):
    """The parameters DDP reduces, in DDP's order: (names, module type names, tensors)."""
    module, ignored = _module_of(model)
    names, types, tensors, seen = [], [], [], set()
    for module_name, sub in module.named_modules():
        for param_name, p in sub.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            if not p.requires_grad or name in ignored or id(p) in seen:
                continue
            seen.add(id(p))
            names.append(name)
            types.append(type(sub).__name__)
            tensors.append(p)
    return names, types, tensors


def _layer_kind(module_type, param):
    """gravac::torch_layer_kind: the layer kind from the owning module's type name."""
    if param.dim() <= 1 or "Norm" in module_type:
        return _capi.LAYER_BIAS_OR_NORM
    if "Conv" in module_type:
        return _capi.LAYER_CONV
    if any(s in module_type for s in ("LSTM", "GRU", "RNN")):
        return _capi.LAYER_RECURRENT
    if "Linear" in module_type or "Embedding" in module_type:
        return _capi.LAYER_DENSE
    return _capi.LAYER_CONV if param.dim() >= 3 else _capi.LAYER_DENSE


def _process_group(group):
    if not dist.is_initialized():
        raise RuntimeError("gravac.torch: torch.distributed is not initialized (call init_process_group first)")
    if group is None or group is dist.group.WORLD:
        return dist.distributed_c10d._get_default_group()
    return group


# --- the method: names and options as the C ABI's text -----------------------------------

def _option_text(info, name, value):
    """An option's value as the C ABI's text, after checking its Python type."""
    kind = info["type"]

    def refuse(what):
        raise ValueError(f"gravac.torch: option {name}: {value!r} is not {what}")

    if kind == "bool":
        if not isinstance(value, bool):
            refuse("a bool")
        return "true" if value else "false"
    if kind == "int":
        low = info["range"][0] if info["range"] else None
        non_negative = low is not None and low >= 0
        if not isinstance(value, int) or isinstance(value, bool) or (non_negative and value < 0):
            refuse("a non-negative int" if non_negative else "an int")
        return str(value)
    if kind == "real":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            refuse("a number")
        return repr(float(value))
    if kind == "choice":
        choices = info["choices"] or []
        if not isinstance(value, str):
            refuse("a str")
        if value not in choices:
            raise ValueError(f"gravac.torch: option {name}: '{value}' is not one of {', '.join(choices)}")
        return value
    return str(value)


class _MethodArgs:
    """A gravac_method and the memory it points to (kept alive as long as this object)."""

    def __init__(self, preset, compressor, collective, policy, seed, bucket_mb, options):
        for what, value in (("preset", preset), ("compressor", compressor), ("collective", collective),
                            ("policy", policy)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"gravac.torch: {what} must be a name (str), got {value!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2 ** 64:
            raise ValueError(f"gravac.torch: seed must be a non-negative int, got {seed!r}")
        if bucket_mb is None:
            bucket_mb = -1.0  # the library's default
        elif not isinstance(bucket_mb, (int, float)) or isinstance(bucket_mb, bool) or not bucket_mb >= 0:
            raise ValueError(f"gravac.torch: bucket_mb must be a non-negative number, got {bucket_mb!r}")
        for what, value, known in (("preset", preset, _capi.PRESETS), ("compressor", compressor, _capi.COMPRESSORS),
                                   ("collective", collective, _capi.COLLECTIVES), ("policy", policy, _capi.POLICIES)):
            if value is not None:
                names = _capi.names(known)
                if value not in names:
                    raise ValueError(f"gravac.torch: unknown {what} '{value}' (known: {', '.join(names)})")
        table = {o["name"]: o for o in _capi.option_table()}
        texts = []
        for key in sorted(options):
            if key not in table:
                raise ValueError(f"gravac.torch: unknown option '{key}' (known: {', '.join(table)})")
            texts.append((key, _option_text(table[key], key, options[key])))
        self._strings = [s.encode() if s is not None else None for s in (preset, compressor, collective, policy)]
        n = len(texts)
        self._names = (ctypes.c_char_p * max(n, 1))(*[k.encode() for k, _ in texts])
        self._values = (ctypes.c_char_p * max(n, 1))(*[v.encode() for _, v in texts])
        self.method = _capi.Method(ctypes.sizeof(_capi.Method), *self._strings, seed, float(bucket_mb),
                                   ctypes.cast(self._names, ctypes.POINTER(ctypes.c_char_p)),
                                   ctypes.cast(self._values, ctypes.POINTER(ctypes.c_char_p)), n)

    def check(self):
        """gravac_method_check: ValueError for a composition the library does not offer."""
        _capi.check(_capi.lib().gravac_method_check(ctypes.byref(self.method)))


# --- collectives over torch.distributed, as C callbacks ----------------------------------

def _global_rank(group, rank):
    if group is dist.distributed_c10d._get_default_group():
        return rank
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, rank)
    return dist.distributed_c10d._get_global_rank(group, rank)


class _HeldByTorch:
    """The Python objects gravac's callbacks handed to torch.distributed that torch may still
    hold. torch lets go of a collective's tensors on its own threads (Gloo's workers, NCCL's
    watchdog), a little after the collective has returned; releasing a tensor made in Python
    (its Python object, or the buffer under a frombuffer tensor) takes the GIL there. A thread
    that takes the GIL once the interpreter has begun to finalize is ended inside that C++
    destructor, and the process aborts ("terminate called without an active exception").
    So each such object is watched through a weak reference, and exit waits until torch has
    let go of all of them (wait_released)."""

    def __init__(self):
        self._refs = {}  # id(weak reference) -> weak reference; dict operations hold the GIL

    def track(self, *objects):
        for o in objects:
            r = weakref.ref(o, self._released)
            self._refs[id(r)] = r

    def _released(self, r):
        self._refs.pop(id(r), None)

    def count(self):
        """How many handed objects are still alive."""
        return len(self._refs)

    def wait_released(self, timeout_s):
        """Sleeps (the GIL released, so torch's threads can take it) until torch holds none of
        the objects, for at most timeout_s seconds; True when it holds none."""
        deadline = time.monotonic() + timeout_s
        while self._refs and time.monotonic() < deadline:
            time.sleep(0.001)
        return not self._refs


_held_by_torch = _HeldByTorch()


def _handed(tensor):
    """A tensor about to be handed to torch.distributed: watched until torch lets go."""
    _held_by_torch.track(tensor)
    return tensor


def _handed_chunks(tensor, parts):
    """The views all_gather fills (Gloo and MPI gather into a list), each watched."""
    chunks = list(tensor.chunk(parts))
    _held_by_torch.track(*chunks)
    return chunks


def _host_tensor(address, nbytes, dtype):
    """A CPU tensor over C memory (no copy); nbytes > 0. The tensor and the buffer object its
    storage holds are both watched (_HeldByTorch)."""
    array = (ctypes.c_ubyte * nbytes).from_address(address)
    t = torch.frombuffer(array, dtype=dtype)
    _held_by_torch.track(array, t)
    return t


class _TorchComm:
    """gravac_comm_callbacks over a torch.distributed process group: every collective is
    torch's on tensors made over the C buffers (no copy), staged through a CUDA tensor on the
    current device for a group whose backend is NCCL (device-only collectives)."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group)).lower()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else None
        self.error = None  # the last callback's exception (its text joins the C error)
        self._gather_into_tensor = hasattr(dist, "all_gather_into_tensor")
        # The C function pointers must live as long as the communicator.
        self._fns = (_capi.ALLREDUCE_FN(self._guard(self._allreduce)),
                     _capi.ALLGATHER_FN(self._guard(self._allgather)),
                     _capi.BROADCAST_FN(self._guard(self._broadcast)),
                     _capi.BARRIER_FN(self._guard(self._barrier)),
                     _capi.ALLTOALLV_FN(self._guard(self._alltoallv)))
        callbacks = _capi.CommCallbacks(ctypes.sizeof(_capi.CommCallbacks), None, self.rank, self.size, *self._fns)
        handle = ctypes.c_void_p()
        _capi.check(_capi.lib().gravac_comm_from_callbacks(ctypes.byref(callbacks), ctypes.byref(handle)),
                    "gravac_comm_from_callbacks")
        self.handle = handle

    def close(self):
        if self.handle:
            _capi.lib().gravac_comm_destroy(self.handle)
            self.handle = None

    def _guard(self, fn):
        def call(*args):
            try:
                fn(*args)
                return 0
            except BaseException as e:  # nothing may unwind into C
                # Kept for its text only: its frames would keep the collective's tensors alive.
                traceback.clear_frames(e.__traceback__)
                self.error = e
                return 1
        return call

    def _stage(self, t):
        return _handed(t.to(self.device)) if self.device is not None else t

    def _back(self, host, staged):
        if staged is not host:
            host.copy_(staged)

    def _allreduce(self, user, data, count, dtype, op):
        if count == 0:
            return
        torch_dtype, itemsize = (torch.float32, 4) if dtype == _capi.FLOAT32 else (torch.float64, 8)
        host = _host_tensor(data, count * itemsize, torch_dtype)
        t = self._stage(host)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == _capi.MAX else dist.ReduceOp.SUM, group=self.group)
        self._back(host, t)

    def _allgather(self, user, send, nbytes, recv):
        if nbytes == 0:
            return
        src = self._stage(_host_tensor(send, nbytes, torch.uint8))
        host_out = _host_tensor(recv, nbytes * self.size, torch.uint8)
        out = (_handed(torch.empty(nbytes * self.size, dtype=torch.uint8, device=self.device)) if self.device
               else host_out)
        if self.device is not None and self._gather_into_tensor:
            dist.all_gather_into_tensor(out, src, group=self.group)
        else:
            # Gloo (and MPI) gather into a list: views of the output, so nothing is copied.
            dist.all_gather(_handed_chunks(out, self.size), src, group=self.group)
        self._back(host_out, out)

    def _broadcast(self, user, data, nbytes, root):
        if nbytes == 0:
            return
        host = _host_tensor(data, nbytes, torch.uint8)
        t = self._stage(host)
        dist.broadcast(t, src=_global_rank(self.group, root), group=self.group)
        self._back(host, t)

    def _barrier(self, user):
        dist.barrier(group=self.group)

    def _alltoallv(self, user, send, send_bytes, recv, recv_bytes):
        sends = [int(send_bytes[j]) for j in range(self.size)]
        recvs = [int(recv_bytes[i]) for i in range(self.size)]
        total_send, total_recv = sum(sends), sum(recvs)
        host_in = _host_tensor(send, total_send, torch.uint8) if total_send else _handed(torch.empty(0, dtype=torch.uint8))
        host_out = _host_tensor(recv, total_recv, torch.uint8) if total_recv else _handed(torch.empty(0, dtype=torch.uint8))
        t_in, t_out = self._stage(host_in), self._stage(host_out)
        dist.all_to_all_single(t_out, t_in, output_split_sizes=recvs, input_split_sizes=sends, group=self.group)
        self._back(host_out, t_out)


class _DeviceArray:
    """A bare __cuda_array_interface__ over C device memory, so that torch.as_tensor wraps it
    (no copy) without gravac linking torch."""

    def __init__(self, address, nbytes, typestr, itemsize):
        self.__cuda_array_interface__ = {"shape": (nbytes // itemsize,), "typestr": typestr,
                                         "data": (address, False), "version": 2}


_DEVICE_TYPES = {torch.float32: ("<f4", 4), torch.float64: ("<f8", 8), torch.uint8: ("|u1", 1)}


def _device_tensor(address, nbytes, dtype, device):
    """A CUDA tensor over C device memory (no copy); nbytes > 0."""
    typestr, itemsize = _DEVICE_TYPES[dtype]
    array = _DeviceArray(address, nbytes, typestr, itemsize)
    t = torch.as_tensor(array, device=device)
    _held_by_torch.track(array, t)
    return t


class _TorchDeviceComm(_TorchComm):
    """gravac_device_comm_callbacks over a torch.distributed process group: gravac's device
    collectives run as torch's on CUDA tensors over gravac's device buffers, each on the
    stream gravac names (torch.cuda.ExternalStream), so NCCL orders them after gravac's
    kernels and gravac's later kernels after them."""

    def __init__(self, group, device):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.device = device
        self.error = None
        # NCCL gathers into one tensor; Gloo and MPI into a list of views of it.
        self._gather_into_tensor = (hasattr(dist, "all_gather_into_tensor")
                                    and str(dist.get_backend(group)).lower() == "nccl")
        self._fns = (_capi.DEVICE_ALLREDUCE_FN(self._guard(self._device_allreduce)),
                     _capi.DEVICE_ALLGATHER_FN(self._guard(self._device_allgather)),
                     _capi.DEVICE_BROADCAST_FN(self._guard(self._device_broadcast)),
                     _capi.DEVICE_BARRIER_FN(self._guard(self._device_barrier)))
        callbacks = _capi.DeviceCommCallbacks(ctypes.sizeof(_capi.DeviceCommCallbacks), None, self.rank, self.size,
                                              *self._fns)
        handle = ctypes.c_void_p()
        status = _capi.lib().gravac_comm_from_device_callbacks(ctypes.byref(callbacks), ctypes.byref(handle))
        if status == _capi.UNSUPPORTED:
            raise _NoDevicePath(_capi.last_error())
        _capi.check(status, "gravac_comm_from_device_callbacks")
        self.handle = handle

    def _on(self, stream):
        return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=self.device))

    def _device_allreduce(self, user, data, count, dtype, op, stream):
        if count == 0:
            return
        torch_dtype, itemsize = (torch.float32, 4) if dtype == _capi.FLOAT32 else (torch.float64, 8)
        with self._on(stream):
            t = _device_tensor(data, count * itemsize, torch_dtype, self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX if op == _capi.MAX else dist.ReduceOp.SUM, group=self.group)

    def _device_allgather(self, user, send, nbytes, recv, stream):
        if nbytes == 0:
            return
        with self._on(stream):
            src = _device_tensor(send, nbytes, torch.uint8, self.device)
            out = _device_tensor(recv, nbytes * self.size, torch.uint8, self.device)
            if self._gather_into_tensor:
                dist.all_gather_into_tensor(out, src, group=self.group)
            else:
                dist.all_gather(_handed_chunks(out, self.size), src, group=self.group)

    def _device_broadcast(self, user, data, nbytes, root, stream):
        if nbytes == 0:
            return
        with self._on(stream):
            dist.broadcast(_device_tensor(data, nbytes, torch.uint8, self.device),
                           src=_global_rank(self.group, root), group=self.group)

    def _device_barrier(self, user, stream):
        with self._on(stream):
            dist.barrier(group=self.group)


class _NoDevicePath(Exception):
    """The library cannot compress this method in device memory (no CUDA path in the build,
    or no device form of the compressor)."""


# --- the trainer over the C ABI ------------------------------------------------------------

def _report_dict(r, kept=None):
    """A gravac_step_report as a dict; with each layer's kept fraction (a trainer's report), or
    with the mean over the layers only (kept None: an exchange of local steps)."""
    out = {
        "step": r.step, "bytes_sent": r.bytes_sent, "dense_bytes": r.dense_bytes,
        "wire_bytes_sent": r.wire_bytes_sent, "wire_bytes_received": r.wire_bytes_received, "gain": r.gain,
        "collective": (r.collective or b"").decode(), "fallback": (r.fallback or b"none").decode(),
        "compress_s": r.compress_s, "communicate_s": r.communicate_s, "decompress_s": r.decompress_s,
        "exposed_communicate_s": r.exposed_communicate_s, "buckets": r.buckets, "skipped": bool(r.skipped),
    }
    if kept is None:
        out["mean_kept_fraction"] = r.mean_kept_fraction
    else:
        out["kept_fraction"] = list(kept)
    return out


# Every engine alive, closed at exit before the interpreter finalizes, so that no gravac
# communication thread is left to call into Python once finalization has begun (Python would
# end it mid-call, through C++ frames that cannot unwind). atexit runs while such threads
# can still take the GIL; closing an engine waits for its thread inside the C call, which
# releases the GIL.
_live_engines = weakref.WeakSet()


@atexit.register
def _close_engines_at_exit():
    for engine in list(_live_engines):
        try:
            engine.close()
        except Exception:  # a peer gone at exit: nothing left to report to
            pass
    # torch's threads may still hold the last collectives' tensors (_HeldByTorch): wait for
    # them while they can still take the GIL. Bounded: a peer stuck in a collective must not
    # keep this process from exiting.
    if not _held_by_torch.wait_released(_EXIT_RELEASE_TIMEOUT_S):
        warnings.warn(f"gravac.torch: torch still holds {_held_by_torch.count()} of gravac's collective "
                      f"buffers {_EXIT_RELEASE_TIMEOUT_S:.0f} s after exit began; its threads may abort the process")


_EXIT_RELEASE_TIMEOUT_S = 30.0


class _Layers:
    """A model's trainable parameters as the C ABI's layers, in DDP's order (checked here:
    nothing is sent)."""

    def __init__(self, model):
        names, types, tensors = _parameters(model)
        if not tensors:
            raise ValueError("gravac.torch: the model has no trainable parameters")
        for n, p in zip(names, tensors):
            if p.dtype != torch.float32 or p.device.type not in ("cpu", "cuda"):
                raise ValueError(f"gravac.torch: parameter '{n}' is not a float32 CPU or CUDA tensor")
        self.cuda = any(p.device.type == "cuda" for p in tensors)
        if self.cuda and any(p.device != tensors[0].device for p in tensors):
            raise ValueError("gravac.torch: the parameters are on more than one device")
        self.device = tensors[0].device if self.cuda else torch.device("cpu")
        self.names, self.tensors = names, tensors
        self.numels = [p.numel() for p in tensors]
        self.offsets = [0]
        for n in self.numels:
            self.offsets.append(self.offsets[-1] + n)
        # The C structs point into these: kept as long as the array.
        self._shapes = [(ctypes.c_size_t * max(p.dim(), 1))(*(p.shape if p.dim() else (1,))) for p in tensors]
        self._names = [n.encode() for n in names]
        self.array = (_capi.Layer * len(tensors))(*[
            _capi.Layer(name, ctypes.cast(shape, ctypes.POINTER(ctypes.c_size_t)), max(p.dim(), 1),
                        _layer_kind(t, p))
            for name, shape, p, t in zip(self._names, self._shapes, tensors, types)])


class _Native:
    """One of the library's objects over a _TorchComm, for the parameters of a model: a
    trainer (gravac_trainer_*) or local steps (gravac_local_steps_*), its C functions named
    by _prefix. The object is destroyed before its communicator, and every one alive is closed
    at exit (_live_engines)."""

    _prefix = None

    def __init__(self, model, process_group, method):
        # Everything that can be refused locally is, before anything is sent.
        layers = _Layers(model)
        method.check()
        self._group = _process_group(process_group)
        self._method, self._layers = method, layers
        self.names, self.tensors = layers.names, layers.tensors
        self.numels, self.offsets = layers.numels, layers.offsets
        self.cuda, self.device = layers.cuda, layers.device

    def _fn(self, what):
        return getattr(_capi.lib(), f"{self._prefix}_{what}")

    def _create(self, comm, *params, device_attempt=False):
        """<prefix>_create over \\p comm (collective; \\p params: what comes between the
        communicator and the handle). _NoDevicePath on a device attempt the library refuses
        on every rank alike."""
        self.comm = comm
        handle = ctypes.c_void_p()
        status = self._fn("create")(ctypes.byref(self._method.method), self._layers.array, len(self.tensors),
                                    comm.handle, *params, ctypes.byref(handle))
        if status == _capi.OK:
            self.handle = handle
            _live_engines.add(self)
            return
        e = self._error(status, f"{self._prefix}_create")
        comm.close()
        self.comm = None
        if device_attempt and status == _capi.UNSUPPORTED:
            raise _NoDevicePath(str(e))
        raise e

    def _host_flat(self):
        """A host buffer of every parameter's elements, pinned when they come from a GPU."""
        return torch.zeros(self.offsets[-1], dtype=torch.float32, pin_memory=self.cuda)

    def close(self):
        """Destroys the object, then its communicator (a trainer's destroy ends a step in
        progress and joins the communication thread). Idempotent."""
        handle = getattr(self, "handle", None)
        if handle:
            self.handle = None
            self._fn("destroy")(handle)
        comm = getattr(self, "comm", None)
        if comm is not None:
            self.comm = None
            comm.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing to report to
            pass

    def _error(self, status, what):
        e = _capi.error(status, what)
        if getattr(self, "comm", None) is not None and self.comm.error is not None:
            e = type(e)(f"{e} (in a collective: {type(self.comm.error).__name__}: {self.comm.error})")
            self.comm.error = None
        return e

    def call(self, what, status):
        if status != _capi.OK:
            raise self._error(status, what)

    def run(self, what, *args):
        """<prefix>_<what>(handle, *args), raising on failure."""
        self.call(f"{self._prefix}_{what}", self._fn(what)(self.handle, *args))

    def end_interval(self, epoch, learning_rate, samples):
        self.run("end_interval", int(epoch), float(learning_rate), float(samples))

    def policy_state(self):
        fn, size = self._fn("policy_state"), ctypes.c_size_t()
        buf = ctypes.create_string_buffer(256)
        status = fn(self.handle, buf, len(buf), ctypes.byref(size))
        if status == _capi.BUFFER_TOO_SMALL:
            buf = ctypes.create_string_buffer(size.value + 1)
            status = fn(self.handle, buf, len(buf), ctypes.byref(size))
        self.call(f"{self._prefix}_policy_state", status)
        return buf.value.decode()

    def save(self):
        fn, size = self._fn("save"), ctypes.c_size_t()
        status = fn(self.handle, None, 0, ctypes.byref(size))
        if status not in (_capi.OK, _capi.BUFFER_TOO_SMALL):
            self.call(f"{self._prefix}_save", status)
        buf = ctypes.create_string_buffer(max(size.value, 1))
        self.run("save", buf, size.value, ctypes.byref(size))
        return buf.raw[:size.value]

    def load(self, data):
        if not isinstance(data, (bytes, bytearray)):
            raise ValueError("gravac.torch: a gravac state_dict's state must be bytes")
        buf = ctypes.create_string_buffer(bytes(data), max(len(data), 1))
        self.run("load", buf, len(data))


class _Engine(_Native):
    """One gravac_trainer over a _TorchComm, for the parameters of a model."""

    _prefix = "gravac_trainer"

    def __init__(self, model, process_group, preset, compressor, collective, policy, seed, bucket_mb, options):
        method = _MethodArgs(preset, compressor, collective, policy, seed, bucket_mb, options)
        super().__init__(model, process_group, method)
        # CUDA gradients are compressed on the device where the library can (its CUDA path and
        # the compressor's device form); otherwise they are staged through pinned host memory.
        self.on_device = False
        if self.cuda:
            method.method.device = _capi.DEVICE_CUDA
            method.method.stream = torch.cuda.current_stream(self.device).cuda_stream
            try:
                self._create(_TorchDeviceComm(self._group, self.device), device_attempt=True)
                self.on_device = True
            except _NoDevicePath as why:
                warnings.warn(f"gravac.torch: CUDA gradients are staged through host memory: {why}")
            method.method.device, method.method.stream = _capi.DEVICE_HOST, None
        if not self.on_device:
            self._create(_TorchComm(self._group))
        numel = ctypes.c_size_t()
        self.run("numel", ctypes.byref(numel))
        if numel.value != self.offsets[-1]:
            raise RuntimeError(f"gravac.torch: the trainer has {numel.value} elements, the model {self.offsets[-1]}")
        # The flat buffer the C ABI steps: on the device, or in host memory (pinned when the
        # gradients come from a GPU and are staged).
        if self.on_device:
            self.flat = torch.zeros(self.offsets[-1], dtype=torch.float32, device=self.device)
        else:
            self.flat = self._host_flat()
        self.staged = self.cuda and not self.on_device
        self.views = [self.flat[a:b] for a, b in zip(self.offsets, self.offsets[1:])]
        self._kept = (ctypes.c_double * len(self.tensors))()
        self.report = _report_dict(_capi.StepReport(ctypes.sizeof(_capi.StepReport)), [0.0] * len(self.tensors))

    def _stream(self):
        """The cudaStream_t the caller's work on the buffer is ordered on (device path)."""
        return torch.cuda.current_stream(self.device).cuda_stream if self.on_device else None

    def _where(self):
        return _capi.DEVICE_CUDA if self.on_device else _capi.DEVICE_HOST

    def _finish_report(self, r):
        self.run("kept_fractions", self._kept, len(self.tensors))
        self.report = _report_dict(r, self._kept)
        return self.report

    def step(self):
        r = _capi.StepReport(ctypes.sizeof(_capi.StepReport))
        self.run("step", self.flat.data_ptr(), self.flat.numel(), self._where(), self._stream(), ctypes.byref(r))
        return self._finish_report(r)

    def begin_step(self):
        self.run("begin_step", self.flat.data_ptr(), self.flat.numel(), self._where(), self._stream())

    def ready(self, layer):
        self.run("ready", layer)

    def finish(self):
        r = _capi.StepReport(ctypes.sizeof(_capi.StepReport))
        self.run("finish", ctypes.byref(r))
        return self._finish_report(r)


class _Checkpointed:
    """state_dict() / load_state_dict() of an object whose C object is self._engine, in the
    format _state_format."""

    _state_format = "gravac-checkpoint"

    def _between_steps(self, what):
        pass

    def state_dict(self):
        """This rank's gravac state (a trainer's residuals, policy, compressor and collective
        state and step counter; rank-local: every rank saves its own)."""
        self._between_steps("state_dict")
        return {"format": self._state_format, "state": self._engine.save()}

    def load_state_dict(self, state_dict):
        """Restores what state_dict() returned on the same rank, for the same model and method."""
        if not isinstance(state_dict, dict) or state_dict.get("format") != self._state_format:
            raise ValueError(f"gravac.torch: not a gravac state_dict (of format '{self._state_format}')")
        self._between_steps("load_state_dict")
        self._engine.load(state_dict["state"])

    def policy_state(self):
        """A short description of the policy's state (GraVAC's phase and ratio, ...)."""
        return self._engine.policy_state()


# --- the DDP hook -------------------------------------------------------------------------

class HookState(_Checkpointed):
    """The state of a gravac DDP hook on this rank: one gravac trainer over the model.

    DDP's buckets feed it; the trainer's own buckets (``bucket_mb``, DDP's 25 MB by
    default) are compressed and aggregated on its communication thread while
    backward goes on. Its layout is the model's parameters, not DDP's buckets, so
    the residuals and the policy's state survive DDP's bucket rebuild and resumed
    runs. Build it with ddp_hook(). Collective: every rank builds it with the same
    arguments (checked: a mismatch raises RuntimeError on every rank).
    """

    def __init__(self, model, process_group=None, compressor="topk", collective="allgather", policy="gravac",
                 seed=0, bucket_mb=25.0, overlap=True, preset=None, **options):
        if not isinstance(overlap, bool):
            raise ValueError(f"gravac.torch: overlap must be a bool, got {overlap!r}")
        if preset is not None:
            compressor, collective, policy = _explicit(compressor, collective, policy)
        compressor, collective, policy = _names(preset, compressor, collective, policy)
        self._engine = _Engine(model, process_group, preset, compressor, collective, policy, seed, bucket_mb,
                               options)
        self._overlap = overlap
        # Where each parameter's layer is: by the tensor object, and by its storage address.
        self._layer_of = {id(p): i for i, p in enumerate(self._engine.tensors)}
        self._layer_at = {(p.data_ptr(), p.numel()): i for i, p in enumerate(self._engine.tensors) if p.numel()}
        self._seen = [False] * len(self._engine.tensors)
        self._pending = []  # (future, bucket buffer, [(layer, offset in the bucket)]) of this step
        self._in_step = False
        self._lock = threading.Lock()

    def last_report(self):
        """The last step's report: bytes_sent, dense_bytes, wire_bytes_sent, collective, kept_fraction, ..."""
        return dict(self._engine.report)

    def _between_steps(self, what):
        if self._in_step:
            raise RuntimeError(f"gravac.torch: {what}: a step is in progress (call it between steps)")

    def _layer(self, p):
        layer = self._layer_of.get(id(p))
        if layer is None:
            layer = self._layer_at.get((p.data_ptr(), p.numel()))
        if layer is None:
            raise RuntimeError("gravac.torch: ddp hook: a bucket holds a parameter the hook was not built with")
        return layer

    def _abandon(self):
        """A failure once the step started ends it: with overlap the trainer finishes it (so this
        rank makes the collectives the other ranks are in) and its own error is dropped."""
        if self._in_step and self._overlap:
            try:
                self._engine.finish()
            except Exception:
                pass
        self._in_step = False
        self._pending = []
        self._seen = [False] * len(self._seen)

    def _on_bucket(self, future, bucket):
        """gravac::ddp_hook_core::on_bucket: True when the step ended."""
        e = self._engine
        index, buffer, params, grads = bucket.index(), bucket.buffer(), bucket.parameters(), bucket.gradients()
        if len(params) != len(grads):
            raise RuntimeError("gravac.torch: ddp hook: a bucket's parameters and gradients differ in number")
        if buffer.dtype != torch.float32 or not buffer.is_contiguous():
            raise RuntimeError("gravac.torch: ddp hook: the bucket is not a contiguous float32 tensor")
        for _, _, other, _ in self._pending:
            if other == index:
                raise RuntimeError(f"gravac.torch: ddp hook: bucket {index} came twice in one step "
                                   "(did a backward end without its last bucket?)")
        # The whole bucket is checked before the step starts or a layer is marked ready.
        base, end = buffer.data_ptr(), buffer.data_ptr() + 4 * buffer.numel()
        layers = []
        for p, g in zip(params, grads):
            layer = self._layer(p)
            if self._seen[layer]:
                raise RuntimeError("gravac.torch: ddp hook: a parameter came twice in one step")
            if g.dtype != torch.float32 or not g.is_contiguous() or g.numel() != e.numels[layer]:
                raise RuntimeError("gravac.torch: ddp hook: a gradient is not a contiguous float32 view of its "
                                   "parameter's size")
            at = g.data_ptr()
            if g.numel() and not (base <= at and at + 4 * g.numel() <= end):
                raise RuntimeError("gravac.torch: ddp hook: a gradient does not lie in its bucket's buffer")
            layers.append((layer, (at - base) // 4 if g.numel() else 0))
        if not self._in_step:
            if self._overlap:
                e.begin_step()
            self._in_step = True
        flat_buffer = buffer.view(-1)
        for layer, at in layers:
            # CUDA: ordered on the current stream. On the device path gravac orders its kernels
            # after that stream; staged through the host, the stream is synchronized first.
            e.views[layer].copy_(flat_buffer[at:at + e.numels[layer]], non_blocking=e.cuda)
            self._seen[layer] = True
        if e.staged:
            torch.cuda.current_stream(buffer.device).synchronize()
        if self._overlap:
            for layer, _ in layers:
                e.ready(layer)
        self._pending.append((future, buffer, index, layers))
        if not bucket.is_last():
            return False
        if not all(self._seen):
            raise RuntimeError("gravac.torch: ddp hook: the last bucket came and a parameter had not (is it left "
                               "out of DDP, by parameters_to_ignore?)")
        self._in_step = False
        if self._overlap:
            e.finish()
        else:
            e.step()
        for _, out, _, out_layers in self._pending:
            flat_out = out.view(-1)
            for layer, at in out_layers:
                flat_out[at:at + e.numels[layer]].copy_(e.views[layer])
        return True

    def _run(self, bucket):
        future = torch.futures.Future()
        with self._lock:
            try:
                done = self._on_bucket(future, bucket)
            except Exception as exc:
                pending = [f for f, _, _, _ in self._pending]
                if not any(f is future for f in pending):
                    pending.append(future)
                self._abandon()
                for f in pending:
                    f.set_exception(exc)
                return future
            if done:
                # Every bucket of the step now holds its average.
                pending, self._pending = self._pending, []
                self._seen = [False] * len(self._seen)
                for f, out, _, _ in pending:
                    f.set_result(out)
        return future


def _hook(state, bucket):
    """The DDP communication hook: gives DDP's bucket to the gravac trainer."""
    return state._run(bucket)


def _names(preset, compressor, collective, policy):
    """The three names: without a preset, None means the defaults topk, allgather, gravac;
    with one, None means the preset's."""
    if preset is None:
        return (compressor if compressor is not None else "topk", collective if collective is not None else "allgather",
                policy if policy is not None else "gravac")
    return compressor, collective, policy


def ddp_hook(model, process_group=None, compressor="topk", collective="allgather", policy="gravac", seed=0,
             bucket_mb=25.0, overlap=True, preset=None, **options):
    """A gravac communication hook for ``model`` (the DDP module, or the module it wraps).

    Returns ``(state, hook)`` for ``ddp_model.register_comm_hook(state, hook)``.
    ``process_group``: the group gravac communicates over (default: the world);
    give it one of its own (``torch.distributed.new_group()``) if the program
    runs collectives of its own on the default group during backward.
    ``seed``: the shared seed of random choices (random-k, stochastic rounding).
    ``bucket_mb``: the trainer's bucket size (0: one bucket per parameter).
    ``overlap``: aggregate the trainer's buckets on its communication thread while backward
    goes on (True), or in one synchronous step at DDP's last bucket (False: no thread, no
    overlap; cheaper where backward is short). The results are the same bits either way.
    ``preset``: a named configuration (``presets()``, e.g. "recommended"); with it, the
    compressor, collective and policy are the preset's unless given (pass them as keywords).
    Other keywords: the method's options (option_names(), gravac.options()).
    """
    state = HookState(model, process_group, compressor, collective, policy, seed, bucket_mb, overlap, preset,
                      **options)
    return state, _hook


def _explicit(compressor, collective, policy):
    """With a preset, the signature's default names (topk, allgather, gravac) are not choices:
    the preset's names apply unless another name was given."""
    return (None if compressor == "topk" else compressor, None if collective == "allgather" else collective,
            None if policy == "gravac" else policy)


class Trainer(_Checkpointed):
    """gravac's trainer over a process group, for a training loop without DDP.

    ``step()`` after backward replaces every parameter's gradient with the
    (compressed) average over the ranks and returns the step's report. The same
    names and options as ddp_hook.
    """

    def __init__(self, model, process_group=None, compressor="topk", collective="allgather", policy="gravac",
                 seed=0, bucket_mb=25.0, preset=None, **options):
        if preset is not None:
            compressor, collective, policy = _explicit(compressor, collective, policy)
        compressor, collective, policy = _names(preset, compressor, collective, policy)
        self._engine = _Engine(model, process_group, preset, compressor, collective, policy, seed, bucket_mb,
                               options)
        self._params = self._engine.tensors
        # Each parameter's slice of the flat buffer, made once, reused every step.
        self._views = [v.view_as(p) for v, p in zip(self._engine.views, self._params)]

    def step(self):
        """Averages the gradients over the ranks, through gravac. Returns the step's report."""
        _grads_into(self._params, self._views)
        report = self._engine.step()
        _grads_from(self._views, self._params)
        return dict(report)

    def end_interval(self, epoch, learning_rate, samples):
        """The end of an interval (an epoch) for the policy."""
        self._engine.end_interval(epoch, learning_rate, samples)


def _grads_into(params, views):
    """Every parameter's gradient into its view of a flat buffer (zeros for a parameter
    without one). A copy from a GPU into host memory returns once it is done."""
    for p, view in zip(params, views):
        if p.grad is None:
            view.zero_()
        else:
            view.copy_(p.grad)


def _grads_from(views, params):
    """Every parameter's gradient from its view of a flat buffer."""
    for p, view in zip(params, views):
        if p.grad is None:
            p.grad = view.to(p.device, copy=True)
        else:
            p.grad.copy_(view)


# --- local steps (local SGD, DiLoCo) --------------------------------------------------------

def _params_into(params, views):
    """Every parameter's values into its view of a flat buffer."""
    for p, view in zip(params, views):
        view.copy_(p.detach())


def _params_from(views, params):
    """Every parameter's values from its view of a flat buffer."""
    with torch.no_grad():
        for p, view in zip(params, views):
            p.copy_(view)


class _LocalEngine(_Native):
    """One gravac_local_steps over a _TorchComm. The C ABI steps host memory: the flat buffer
    is on the host (pinned when the parameters are on a GPU), and CUDA tensors are copied
    through it."""

    _prefix = "gravac_local_steps"

    def __init__(self, model, process_group, method):
        super().__init__(model, process_group, method)
        self.flat = self._host_flat()
        # Each parameter's slice of the flat buffer, in its shape.
        self.views = [self.flat[a:b].view_as(p) for a, b, p in zip(self.offsets, self.offsets[1:], self.tensors)]
        _params_into(self.tensors, self.views)  # where every rank starts (the library checks they agree)
        self._create(_TorchComm(self._group), self.flat.data_ptr(), self.flat.numel())
        self.report = None

    def info(self):
        info = _capi.LocalStepsInfo(ctypes.sizeof(_capi.LocalStepsInfo))
        self.run("get_info", ctypes.byref(info))
        return info

    def _exchange(self, what):
        """before or after on the flat buffer: the report of the exchange it ran, or None."""
        flag, r = ctypes.c_int(0), _capi.StepReport(ctypes.sizeof(_capi.StepReport))
        self.run(what, self.flat.data_ptr(), self.flat.numel(), ctypes.byref(flag), ctypes.byref(r))
        if not flag.value:
            return None
        self.report = _report_dict(r)
        return dict(self.report)

    def global_params(self):
        out = torch.empty(self.offsets[-1], dtype=torch.float32)
        self.run("global_params", out.data_ptr(), out.numel())
        return out

    def inner_state_must_agree(self):
        flag = ctypes.c_int(0)
        self.run("inner_state_must_agree", ctypes.byref(flag))
        return bool(flag.value)

    def average_inner_state(self, flat):
        """Replaces \\p flat (a contiguous float32 CPU tensor) with its rank average (collective)."""
        self.run("average_inner_state", flat.data_ptr(), flat.numel())


def _inner_state(optimizer, params):
    """The optimizer's per-parameter floating-point state of \\p params, in a deterministic
    order (the parameters in order, each one's state keys sorted): the tensors shaped as their
    parameter (SGD's momentum_buffer, Adam's exp_avg and exp_avg_sq, ...). Counters and
    scalars (Adam's step) are left out: they are the same on every rank."""
    out = []
    for p in params:
        state = optimizer.state.get(p)
        if not state:
            continue
        for key in sorted(state, key=str):
            v = state[key]
            if torch.is_tensor(v) and v.is_floating_point() and v.shape == p.shape:
                out.append(v)
    return out


class LocalSteps(_Checkpointed):
    """Local-step training (local SGD, DiLoCo and its family) of a model over a process
    group, in place of DDP.

    Every rank takes ``period`` (H) steps of its own optimizer alone; then the ranks exchange
    how far their parameters moved (the pseudo-gradient) through the compressor and
    collective, with error feedback, an outer optimizer (``outer``: "nesterov", DiLoCo's, or
    "averaging", local SGD's) moves the global parameters, and every rank continues from
    them. H = 1 is per-step data-parallel training: the gradients are averaged before the
    optimizer's step, as by Trainer with the fixed policy, bit for bit.

        local = gravac.torch.LocalSteps(model, period=10)
        for x, y in batches:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            local.step(opt)  # before_optimizer_step(), opt.step(), after_optimizer_step()

    ``adaptive``: H and the kept fraction chosen from the network and the compute per step
    (``local_max_period`` bounds H). ``overlap``: each exchange runs on a communication
    thread behind the next round and is applied one round late. At the end of training,
    finish_round() brings every rank to the same global point (with overlap, it completes the
    exchange in flight first). The policy is always "fixed" (its ``kept_fraction`` is each
    exchange's). Other keywords: the option table's (``sparseloco_decay``, ...). The model is
    a plain module (not DDP), with float32 CPU or CUDA parameters; the library steps host
    memory, so CUDA tensors are copied through a pinned host buffer. Collective: every rank
    builds it with the same arguments and the same parameters (checked: a mismatch raises
    RuntimeError on every rank).
    """

    _state_format = "gravac-local-steps"
    _NAMED = {"local_period": "period", "local_adaptive": "adaptive", "local_overlap": "overlap"}

    def __init__(self, model, process_group=None, compressor="sparseloco", collective="allgather", period=10,
                 adaptive=False, outer="nesterov", outer_lr=0.7, outer_momentum=0.9, overlap=False, seed=0,
                 bucket_mb=None, **options):
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise TypeError("gravac.torch: LocalSteps replaces DDP: give it the module, not DistributedDataParallel")
        if "policy" in options or "preset" in options:
            raise ValueError("gravac.torch: LocalSteps takes the fixed policy, and no policy= or preset=: each "
                             "exchange keeps kept_fraction, and adaptive=True chooses H and the fraction")
        for key, name in self._NAMED.items():
            if key in options:
                raise ValueError(f"gravac.torch: LocalSteps: pass {name}=, not {key}=")
        options.update(local_period=period, local_adaptive=adaptive, local_overlap=overlap, outer=outer,
                       outer_lr=outer_lr, outer_momentum=outer_momentum)
        method = _MethodArgs(None, compressor, collective, "fixed", seed, bucket_mb, options)
        self._engine = _LocalEngine(model, process_group, method)
        self._params = self._engine.tensors

    def before_optimizer_step(self):
        """After backward. In a per-step round (H = 1) every parameter's .grad becomes the rank
        average and the exchange's report is returned; in a round of local steps the gradients
        stay this rank's and None is returned."""
        e = self._engine
        # The library reads the gradients only in a per-step round: otherwise nothing is copied.
        per_step = e.info().period == 1
        if per_step:
            _grads_into(self._params, e.views)
        report = e._exchange("before")
        if report is not None:
            _grads_from(e.views, self._params)
        return report

    def after_optimizer_step(self):
        """After the optimizer's step. At the end of a round of local steps, the exchange and
        the outer step run and the parameters become the point every rank continues from;
        returns the report of the exchange that completed, or None."""
        e = self._engine
        info = e.info()
        # The library reads the parameters only at a round's end, and writes them only at the
        # end of a round of local steps (after a per-step round they are the global point).
        ends = info.round_step + 1 >= info.period
        if ends:
            _params_into(self._params, e.views)
        report = e._exchange("after")
        if ends and info.period > 1:
            _params_from(e.views, self._params)
        return report

    def step(self, optimizer):
        """before_optimizer_step(), optimizer.step(), after_optimizer_step(): the report of the
        exchange this step ran, or None. When that step began per-step rounds
        (inner_state_must_agree()), the optimizer's state is averaged over the ranks too
        (average_inner_state(optimizer))."""
        averaged = self.before_optimizer_step()
        optimizer.step()
        exchanged = self.after_optimizer_step()
        if self.inner_state_must_agree():
            self.average_inner_state(optimizer)
        return averaged if averaged is not None else exchanged

    def inner_state_must_agree(self):
        """Whether the call that just ended a round of local steps (after_optimizer_step() or
        finish_round()) began per-step rounds (H = 1, as the adaptive policy can choose). After
        local steps each rank's optimizer state (its momentum) is its own; per-step rounds apply
        every rank's optimizer to the same averaged gradient, so unless that state is made the
        same on every rank first, the ranks' parameters drift apart. True until the next
        before_optimizer_step(); state_dict() keeps it. step(optimizer)
        acts on it itself; a loop that calls before_optimizer_step() and after_optimizer_step()
        calls average_inner_state(optimizer) when it is True."""
        return self._engine.inner_state_must_agree()

    def average_inner_state(self, optimizer):
        """Replaces the optimizer's per-parameter floating-point state (the tensors shaped as
        their parameter: SGD's momentum_buffer, Adam's exp_avg and exp_avg_sq, ...) with its
        average over the ranks, the same bits on every rank, through the exchanges'
        communicator: the tensors, the parameters in the order of parameters() and each one's
        state keys sorted, are copied into one float32 host buffer, averaged in one allreduce
        and copied back. Counters and scalars (Adam's step) are left as they are: they are the
        same on every rank. Collective: every rank calls it at the same step, between steps
        (after after_optimizer_step(), with no overlapped exchange in flight), with the same
        optimizer state; nothing is sent when the optimizer holds no such state (plain SGD)."""
        tensors = _inner_state(optimizer, self._params)
        total = sum(t.numel() for t in tensors)
        if total == 0:
            return
        flat = torch.empty(total, dtype=torch.float32, pin_memory=self._engine.cuda)
        at = 0
        with torch.no_grad():
            for t in tensors:
                flat[at:at + t.numel()].view_as(t).copy_(t)
                at += t.numel()
            self._engine.average_inner_state(flat)
            at = 0
            for t in tensors:
                t.copy_(flat[at:at + t.numel()].view_as(t))
                at += t.numel()

    def finish_round(self, optimizer=None):
        """Ends the round in progress now, before its H steps: the ranks exchange their
        progress, the outer step runs, and every parameter becomes the global point, the same
        on every rank. Call it at the end of training, or before evaluating or saving the
        model (collective: every rank at the same step). Returns the report of the exchange it
        completed, or None when the ranks already agreed. With ``optimizer``, and when per-step
        rounds follow (inner_state_must_agree()), its state is averaged over the ranks too."""
        e = self._engine
        _params_into(self._params, e.views)
        report = e._exchange("finish_round")
        _params_from(e.views, self._params)
        if optimizer is not None and self.inner_state_must_agree():
            self.average_inner_state(optimizer)
        return report

    def complete_exchange(self):
        """Completes an overlapped exchange in flight (collective: every rank at the same step).
        Call it after the last step: close() abandons an exchange in flight."""
        self._engine.run("complete_exchange")

    def info(self):
        """Where the rounds stand: period (H of the round in progress), round_step, inner_steps,
        exchanges, exchange_in_flight."""
        i = self._engine.info()
        return {"period": i.period, "round_step": i.round_step, "inner_steps": i.inner_steps,
                "exchanges": i.exchanges, "exchange_in_flight": bool(i.exchange_in_flight)}

    @property
    def period(self):
        """H of the round in progress."""
        return self._engine.info().period

    def parameters(self):
        """The model's parameters that the local steps manage (those with requires_grad), as a
        new list in DDP's order: the order of global_parameters(), tensor for tensor."""
        return list(self._params)

    def global_parameters(self):
        """The global parameters as of the last exchange, the same on every rank: one tensor per
        parameter (in the order of parameters()), in its shape and on its device."""
        flat = self._engine.global_params()
        return [flat[a:b].view_as(p).to(p.device) for a, b, p in
                zip(self._engine.offsets, self._engine.offsets[1:], self._params)]

    def last_report(self):
        """The report of the last exchange (bytes_sent, mean_kept_fraction, ...), or None."""
        report = self._engine.report
        return dict(report) if report is not None else None

    def state_dict(self):
        """This rank's local-step state between steps: the global point, the round, the outer
        optimizer, both residuals and the exchange's trainer (rank-local). Completes an exchange
        in flight first, so every rank calls it at the same step. Save the model and the
        optimizer beside it."""
        return super().state_dict()

    def end_interval(self, epoch, learning_rate, samples):
        """The end of an interval (an epoch) for the policy."""
        self._engine.end_interval(epoch, learning_rate, samples)

    def close(self):
        """Destroys the local steps and their communicator (also done at exit)."""
        self._engine.close()
