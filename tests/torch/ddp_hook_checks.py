"""Checks of gravac.torch under real DDP: 4 processes over Gloo (a FileStore), CPU.

gravac.torch is pure Python over gravac's C ABI (libgravac_c.so.1 through ctypes), whose
trainer is gravac's C++ trainer (the runtime composition): the hook under DDP is compared,
bit for bit, with gravac.torch.Trainer stepping the same gradients through the same library
without DDP, and the same with a preset.

    /usr/bin/python3 tests/torch/ddp_hook_checks.py [--ranks 4] [check ...]

Each check runs in every rank and raises on failure; the script exits non-zero when any
rank fails, and 77 (skipped) when torch or gravac.torch cannot be imported.
"""
import argparse
import copy
import os
import sys
import tempfile
import traceback

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP
    import gravac.torch as gt
except ImportError as e:  # pragma: no cover - the skip path
    print(f"ddp_hook_checks: skipped: {e} (Debian: python3-torch, and the build's gravac package on PYTHONPATH)")
    sys.exit(77)

FEATURES, CLASSES, BATCH = 64, 10, 32


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, CLASSES))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    return x, y


def ddp_of(model):
    # Small buckets: several DDP buckets per step, rebuilt after the first step.
    return DDP(model, bucket_cap_mb=0.004)


def gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


COMPOSITIONS = [
    dict(compressor="topk", collective="allgather", policy="gravac", gravac_warmup=2, gravac_period=3),
    dict(compressor="identity", collective="dense_allreduce", policy="fixed"),
    dict(compressor="cast16", collective="compressed_allreduce", policy="fixed"),
    dict(compressor="powersgd", collective="low_rank_allreduce", policy="fixed", powersgd_rank=2),
    dict(compressor="adacomp", collective="allgather", policy="adacomp"),
    dict(compressor="topk", collective="allreduce_compatible", policy="accordion"),
    dict(preset="recommended"),
]

REPORT_KEYS = {"step", "bytes_sent", "dense_bytes", "wire_bytes_sent", "wire_bytes_received", "gain", "collective",
               "fallback", "compress_s", "communicate_s", "decompress_s", "exposed_communicate_s", "buckets",
               "skipped", "kept_fraction"}


def check_hook_equals_trainer(rank, overlap=True, compositions=COMPOSITIONS):
    """The hook's gradients are the C++ trainer's (gravac.torch.Trainer: the C ABI's trainer
    stepping the same gradients without DDP) bit for bit, every step (DDP rebuilds its buckets
    after the first), and the policy decides the same on every rank."""
    for comp in compositions:
        a = make_model(1)
        b = copy.deepcopy(a)
        ddp = ddp_of(a)
        state, hook = gt.ddp_hook(ddp, seed=7, bucket_mb=0.002, overlap=overlap, **comp)
        ddp.register_comm_hook(state, hook)
        trainer = gt.Trainer(b, seed=7, bucket_mb=0.002, **comp)
        opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
        opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
        for step in range(8):
            x, y = batch(step, rank)
            opt_a.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt_b.zero_grad()
            torch.nn.functional.cross_entropy(b(x), y).backward()
            rb = trainer.step()
            ra = state.last_report()
            for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
                if not torch.equal(pa.grad, pb.grad):
                    raise AssertionError(f"{comp}: step {step}: {name}'s gradient differs from the trainer's "
                                         f"(max diff {(pa.grad - pb.grad).abs().max().item()})")
            if ra["bytes_sent"] != rb["bytes_sent"] or ra["kept_fraction"] != rb["kept_fraction"]:
                raise AssertionError(f"{comp}: step {step}: reports differ: {ra} vs {rb}")
            if set(ra) != REPORT_KEYS or set(rb) != REPORT_KEYS or ra["step"] != step:
                raise AssertionError(f"{comp}: step {step}: report keys or step: {sorted(ra)}, {ra['step']}")
            if len(ra["kept_fraction"]) != len(list(a.parameters())):
                raise AssertionError(f"{comp}: kept_fraction is not one per layer: {ra['kept_fraction']}")
            fractions = gather(ra["kept_fraction"])
            if any(f != fractions[0] for f in fractions):
                raise AssertionError(f"{comp}: step {step}: ranks kept different fractions: {fractions}")
            opt_a.step()
            opt_b.step()
        for pa, pb in zip(a.parameters(), b.parameters()):
            if not torch.equal(pa, pb):
                raise AssertionError(f"{comp}: parameters differ after 8 steps")
        if ra["step"] != 7 or ra["dense_bytes"] <= 0:
            raise AssertionError(f"{comp}: unexpected last report {ra}")


def check_sync_hook_equals_trainer(rank):
    """overlap=False: the buckets are copied and the last one runs the trainer's synchronous
    step; the same bits as the trainer."""
    check_hook_equals_trainer(rank, overlap=False, compositions=COMPOSITIONS[:3])


def run_steps(ddp, opt, first, last, rank):
    for step in range(first, last):
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()


def check_resume(rank, workdir):
    """state_dict() saved mid-run and loaded into a fresh model, DDP and hook: the resumed run
    ends with the uninterrupted run's parameters, bit for bit (GraVAC: its phase and residuals)."""
    comp = dict(compressor="topk", collective="allgather", policy="gravac", gravac_warmup=2, gravac_period=2)
    a = make_model(2)
    ddp = ddp_of(a)
    state, hook = gt.ddp_hook(ddp, seed=3, **comp)
    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    run_steps(ddp, opt, 0, 5, rank)
    path = os.path.join(workdir, f"ckpt-{rank}.pt")
    torch.save({"model": a.state_dict(), "opt": opt.state_dict(), "gravac": state.state_dict()}, path)
    run_steps(ddp, opt, 5, 10, rank)
    expected = [p.detach().clone() for p in a.parameters()]
    expected_state = state.policy_state()

    b = make_model(99)  # other initial values: everything must come from the checkpoint
    ckpt = torch.load(path)
    b.load_state_dict(ckpt["model"])
    ddp_b = ddp_of(b)
    state_b, hook_b = gt.ddp_hook(ddp_b, seed=3, **comp)
    state_b.load_state_dict(ckpt["gravac"])
    ddp_b.register_comm_hook(state_b, hook_b)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    opt_b.load_state_dict(ckpt["opt"])
    run_steps(ddp_b, opt_b, 5, 10, rank)
    for e, p in zip(expected, b.parameters()):
        if not torch.equal(e, p):
            raise AssertionError("the resumed run's parameters differ from the uninterrupted run's")
    if state_b.policy_state() != expected_state:
        raise AssertionError(f"policy state {state_b.policy_state()!r} != {expected_state!r}")
    if state_b.last_report()["step"] != 9:
        raise AssertionError("the resumed step counter is wrong")


def expect(exc_type, fragment, fn):
    try:
        fn()
    except exc_type as e:
        if fragment not in str(e):
            raise AssertionError(f"expected {fragment!r} in the message, got {e}")
        return
    raise AssertionError(f"expected {exc_type.__name__} ({fragment})")


def check_bad_input(rank):
    """Bad names and options raise ValueError before anything is sent; ranks that disagree
    raise on every rank; a bad state_dict is refused."""
    model = make_model(3)
    expect(ValueError, "unknown compressor 'topkk'", lambda: gt.ddp_hook(model, compressor="topkk"))
    expect(ValueError, "unknown policy", lambda: gt.ddp_hook(model, policy="best"))
    expect(ValueError, "option kept_fraction: '-0.5' is out of range",
           lambda: gt.ddp_hook(model, compressor="topk", policy="fixed", kept_fraction=-0.5))
    expect(ValueError, "unknown preset 'best'", lambda: gt.ddp_hook(model, preset="best"))
    expect(ValueError, "is not a bool", lambda: gt.ddp_hook(model, gravac_dense="yes"))
    expect(ValueError, "unknown option 'kept_fractoin'", lambda: gt.ddp_hook(model, kept_fractoin=0.1))
    expect(ValueError, "is not a non-negative int", lambda: gt.ddp_hook(model, powersgd_rank=-1))
    expect(ValueError, "is not one of fp16, bf16", lambda: gt.ddp_hook(model, compressor="cast16",
                                                                      policy="fixed", cast16_format="fp8"))
    expect(ValueError, "seed must be", lambda: gt.ddp_hook(model, seed=-1))
    expect(ValueError, "overlap must be a bool", lambda: gt.ddp_hook(model, overlap="yes"))
    expect(ValueError, "does not accept", lambda: gt.ddp_hook(model, compressor="powersgd", collective="allgather",
                                                            policy="fixed"))
    # Ranks that disagree: every rank is told, none hangs.
    other = "randomk" if rank == dist.get_world_size() - 1 else "topk"
    expect(RuntimeError, "every rank must create its trainer with the same method and layers",
           lambda: gt.ddp_hook(model, compressor=other, policy="fixed"))
    state, _ = gt.ddp_hook(model, compressor="topk", policy="fixed")
    expect(ValueError, "not a gravac state_dict", lambda: state.load_state_dict({"x": 1}))
    expect(RuntimeError, "rejected", lambda: state.load_state_dict({"format": "gravac-checkpoint",
                                                                    "state": b"GRVCKPT\0 truncated"}))
    expect(TypeError, "expected a torch.nn.Module", lambda: gt.ddp_hook(42))
    # After all that, a good hook still works on every rank (nothing was left half-sent).
    state.state_dict()


def check_metadata(rank):
    """gravac.options() describes the C option table; option_names() and presets() agree."""
    import gravac
    opts = gravac.options()
    names = [o["name"] for o in opts]
    if names != gt.option_names() or "kept_fraction" not in names or "powersgd_rank" not in names:
        raise AssertionError(f"option names: {names}")
    for o in opts:
        if set(o) != {"name", "type", "range", "choices", "default", "doc"} or not o["doc"]:
            raise AssertionError(f"option entry {o}")
        if o["type"] in ("int", "real") and not o["range"][0] <= o["range"][1]:
            raise AssertionError(f"option range {o}")
        if o["type"] == "choice" and o["default"] not in o["choices"]:
            raise AssertionError(f"option choices {o}")
    kept = next(o for o in opts if o["name"] == "kept_fraction")
    if kept["type"] != "real" or kept["range"][1] != 1.0:
        raise AssertionError(f"kept_fraction: {kept}")
    if "recommended" not in gt.presets() or gt.presets() != gravac.presets():
        raise AssertionError(f"presets: {gt.presets()}")
    for listed in (gravac.compressors(), gravac.collectives(), gravac.policies()):
        if not listed:
            raise AssertionError("an empty name list")
    if "topk" not in gravac.compressors() or "allgather" not in gravac.collectives():
        raise AssertionError("name lists")


def check_close_at_exit(rank):
    """The engines alive at exit are closed by gravac.torch's atexit handler while the
    interpreter is whole (their communication threads joined before finalization): the
    handler closes a live hook's trainer and communicator, and closing twice is harmless."""
    torch.manual_seed(0)
    ddp = ddp_of(make_model(0))
    state, hook = gt.ddp_hook(ddp, overlap=True)
    ddp.register_comm_hook(state, hook)
    run_steps(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), 0, 2, rank)
    engine = state._engine
    if engine not in gt._live_engines or engine.handle is None or engine.comm is None:
        raise AssertionError("a live hook's engine is not registered for closing at exit")
    gt._close_engines_at_exit()
    if engine.handle is not None or engine.comm is not None:
        raise AssertionError("the exit handler left the trainer or its communicator open")
    gt._close_engines_at_exit()
    engine.close()


CHECKS = {
    "hook_equals_trainer": check_hook_equals_trainer,
    "sync_hook_equals_trainer": check_sync_hook_equals_trainer,
    "resume": check_resume,
    "bad_input": check_bad_input,
    "metadata": check_metadata,
    "close_at_exit": check_close_at_exit,
}


def worker(rank, world, store_path, workdir, names, failures):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        for name in names:
            fn = CHECKS[name]
            fn(rank, workdir) if name == "resume" else fn(rank)
            dist.barrier()
            if rank == 0:
                print(f"ddp_hook_checks: {name}: passed on {world} ranks", flush=True)
    except Exception:
        failures.put((rank, traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("checks", nargs="*", default=list(CHECKS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        ctx = mp.get_context("spawn")
        failures = ctx.SimpleQueue()
        procs = [ctx.Process(target=worker, args=(r, args.ranks, os.path.join(workdir, "store"), workdir,
                                                  args.checks, failures)) for r in range(args.ranks)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
        codes = [p.exitcode for p in procs]
        while not failures.empty():
            rank, tb = failures.get()
            print(f"ddp_hook_checks: rank {rank} failed:\n{tb}", file=sys.stderr)
        if any(c != 0 for c in codes):
            print(f"ddp_hook_checks: FAILED (exit codes {codes})", file=sys.stderr)
            return 1
    print("ddp_hook_checks: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
