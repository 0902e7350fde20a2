"""gravac inside PyTorch: a DDP communication hook and a trainer over torch.distributed.

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

Names and options are those of the C++ library and of the Fashion-MNIST
example's command line: compressors identity, topk, randomk, threshold,
adacomp, qsgd, terngrad, sign, cast16, powersgd; collectives dense_allreduce,
allgather, allreduce_compatible, flexible, low_rank_allreduce,
compressed_allreduce; policies fixed, gravac, accordion, adacomp, moo; options
such as kept_fraction=0.01 or powersgd_rank=2 (``option_names()`` lists them).
A bad name or option raises ValueError before anything is sent.
"""

import torch
import torch.distributed as dist

from . import _torch as _ext  # after torch: the extension links the same libtorch

__all__ = ["ddp_hook", "HookState", "Trainer", "option_names"]


def option_names():
    """The keyword options ddp_hook and Trainer accept."""
    return list(_ext.option_names())


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


def _process_group(group):
    if not dist.is_initialized():
        raise RuntimeError("gravac.torch: torch.distributed is not initialized (call init_process_group first)")
    if group is None or group is dist.group.WORLD:
        return dist.distributed_c10d._get_default_group()
    return group


def _arguments(model, process_group, compressor, collective, policy, seed, bucket_mb, options):
    for what, value in (("compressor", compressor), ("collective", collective), ("policy", policy)):
        if not isinstance(value, str):
            raise ValueError(f"gravac.torch: {what} must be a name (str), got {value!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"gravac.torch: seed must be a non-negative int, got {seed!r}")
    if not isinstance(bucket_mb, (int, float)) or isinstance(bucket_mb, bool) or not bucket_mb >= 0:
        raise ValueError(f"gravac.torch: bucket_mb must be a non-negative number, got {bucket_mb!r}")
    names, types, tensors = _parameters(model)
    # What every rank must agree on (checked across ranks at construction).
    signature = "|".join(
        [compressor, collective, policy, str(seed), repr(float(bucket_mb))]
        + [f"{k}={options[k]!r}" for k in sorted(options)]
    )
    return dict(process_group=_process_group(process_group), names=names, module_types=types, tensors=tensors,
                compressor=compressor, collective=collective, policy=policy, seed=seed,
                bucket_mb=float(bucket_mb), options=dict(options), signature=signature)


class _Checkpointed:
    """state_dict() / load_state_dict() of an object whose C++ engine is self._engine."""

    def state_dict(self):
        """This rank's residuals, policy, compressor and collective state, and step counter
        (a gravac checkpoint; rank-local: every rank saves its own)."""
        return {"format": "gravac-checkpoint", "state": self._engine.save()}

    def load_state_dict(self, state_dict):
        """Restores what state_dict() returned on the same rank, for the same model and method."""
        if not isinstance(state_dict, dict) or state_dict.get("format") != "gravac-checkpoint":
            raise ValueError("gravac.torch: not a gravac state_dict")
        self._engine.load(state_dict["state"])


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
                 seed=0, bucket_mb=25.0, overlap=True, **options):
        if not isinstance(overlap, bool):
            raise ValueError(f"gravac.torch: overlap must be a bool, got {overlap!r}")
        self._engine = _ext.HookState(**_arguments(model, process_group, compressor, collective, policy, seed,
                                                   bucket_mb, options), overlap=overlap)
        self._pending = []  # (future, buffer) of the buckets of the step in progress

    def last_report(self):
        """The last step's report: bytes_sent, dense_bytes, wire_bytes_sent, collective, kept_fraction, ..."""
        return self._engine.last_report()

    def policy_state(self):
        """A short description of the policy's state (GraVAC's phase and ratio, ...)."""
        return self._engine.policy_state()


def _hook(state, bucket):
    """The DDP communication hook: gives DDP's bucket to the gravac trainer."""
    future = torch.futures.Future()
    buffer = bucket.buffer()
    state._pending.append((future, buffer))
    try:
        done = state._engine.on_bucket(bucket.index(), buffer, bucket.parameters(), bucket.gradients(),
                                     bucket.is_last())
    except Exception as e:
        for f, _ in state._pending:
            f.set_exception(e)
        state._pending = []
        raise
    if done:
        # Every bucket of the step now holds its average.
        for f, b in state._pending:
            f.set_result(b)
        state._pending = []
    return future


def ddp_hook(model, process_group=None, compressor="topk", collective="allgather", policy="gravac", seed=0,
             bucket_mb=25.0, overlap=True, **options):
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
    Other keywords: the method's options (option_names()).
    """
    state = HookState(model, process_group, compressor, collective, policy, seed, bucket_mb, overlap, **options)
    return state, _hook


class Trainer(_Checkpointed):
    """gravac's C++ trainer over a process group, for a training loop without DDP.

    ``step()`` after backward replaces every parameter's gradient with the
    (compressed) average over the ranks and returns the step's report. The same
    names and options as ddp_hook.
    """

    def __init__(self, model, process_group=None, compressor="topk", collective="allgather", policy="gravac",
                 seed=0, bucket_mb=25.0, **options):
        args = _arguments(model, process_group, compressor, collective, policy, seed, bucket_mb, options)
        self._params = args["tensors"]
        self._engine = _ext.Trainer(**args)
        self._flat = torch.zeros(self._engine.numel(), dtype=torch.float32)
        # Each parameter's slice of the flat buffer, in layout order: made once, reused every step.
        offsets = [0]
        for p in self._params:
            offsets.append(offsets[-1] + p.numel())
        self._views = [self._flat[a:b].view_as(p) for p, a, b in zip(self._params, offsets, offsets[1:])]

    def step(self):
        """Averages the gradients over the ranks, through gravac. Returns the step's report."""
        for p, view in zip(self._params, self._views):
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)
        report = self._engine.step(self._flat)
        for p, view in zip(self._params, self._views):
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)
        return report

    def policy_state(self):
        """A short description of the policy's state."""
        return self._engine.policy_state()

