"""Checks of gravac.torch's CUDA path, for a machine with a GPU and a CUDA build of torch.

    python3 tests/torch/cuda_hook_checks.py [--ranks 2] [--backend gloo|nccl]

Two processes on the GPU(s) (one GPU each where there are enough, else all on cuda:0, which
Gloo allows and NCCL does not). Every rank checks, and raises on failure:

- device: a top-k trainer over CUDA parameters compresses on the device (the library's CUDA
  path), not through the host;
- device_equals_host: its averaged gradients equal, bit for bit, those of the same method on
  a CPU copy of the model given the same gradients (gravac's device compressors send the
  packets of the host ones), for top-k, threshold and QSGD;
- hook_equals_trainer: the DDP hook on the CUDA model equals gravac.torch.Trainer on the
  same CUDA gradients, bit for bit, over a few steps;
- staged: a compressor without a device form (PowerSGD) warns and is staged through the
  host, with the same bits as on the CPU.

Exits 77 (skipped) without torch, gravac.torch or a CUDA device; non-zero when a rank fails.
"""
import argparse
import copy
import os
import sys
import tempfile
import traceback
import warnings

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP
    import gravac
    import gravac.torch as gt
except ImportError as e:  # pragma: no cover - the skip path
    print(f"cuda_hook_checks: skipped: {e}")
    sys.exit(77)

FEATURES, CLASSES, BATCH, STEPS = 64, 10, 32, 4
METHODS = [dict(compressor="topk", collective="allgather", policy="fixed", kept_fraction=0.1),
           dict(compressor="threshold", collective="allgather", policy="fixed", kept_fraction=0.1),
           dict(compressor="qsgd", collective="allgather", policy="fixed")]


def make_model(seed, device):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 48), torch.nn.ReLU(), torch.nn.Linear(48, CLASSES)).to(device)


def batch(step, rank, device):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, FEATURES, generator=g).to(device), torch.randint(0, CLASSES, (BATCH,), generator=g).to(device)


def backward(model, step, rank, device):
    model.zero_grad()
    x, y = batch(step, rank, device)
    torch.nn.functional.cross_entropy(model(x), y).backward()


def require(cond, what):
    if not cond:
        raise AssertionError(what)


def check_device(rank, device):
    t = gt.Trainer(make_model(1, device), compressor="topk", collective="allgather", policy="fixed", kept_fraction=0.1)
    require(t._engine.on_device, "a top-k trainer over CUDA parameters does not compress on the device")


def check_device_equals_host(rank, device):
    for method in METHODS:
        gpu = make_model(1, device)
        cpu = copy.deepcopy(gpu).cpu()
        tg, tc = gt.Trainer(gpu, **method), gt.Trainer(cpu, **method)
        for step in range(STEPS):
            backward(gpu, step, rank, device)
            for pg, pc in zip(gpu.parameters(), cpu.parameters()):
                pc.grad = pg.grad.detach().cpu().clone()
            tg.step()
            tc.step()
            for pg, pc in zip(gpu.parameters(), cpu.parameters()):
                require(torch.equal(pg.grad.cpu(), pc.grad), f"{method['compressor']}: step {step}: the device's "
                        "average differs from the host's")


def check_hook_equals_trainer(rank, device):
    method = METHODS[0]
    model = make_model(2, device)
    plain = copy.deepcopy(model)
    ddp = DDP(model, device_ids=[device.index], bucket_cap_mb=0.004)
    state, hook = gt.ddp_hook(ddp, overlap=False, **method)
    ddp.register_comm_hook(state, hook)
    trainer = gt.Trainer(plain, **method)
    for step in range(STEPS):
        backward(ddp, step, rank, device)
        backward(plain, step, rank, device)
        trainer.step()
        for a, b in zip(model.parameters(), plain.parameters()):
            require(torch.equal(a.grad, b.grad), f"step {step}: the hook's average differs from the trainer's")


def check_staged(rank, device):
    method = dict(compressor="powersgd", collective="low_rank_allreduce", policy="fixed")
    gpu = make_model(3, device)
    cpu = copy.deepcopy(gpu).cpu()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tg = gt.Trainer(gpu, **method)
    require(not tg._engine.on_device and any("staged" in str(w.message) for w in seen),
            "PowerSGD on CUDA parameters was not staged through the host with a warning")
    tc = gt.Trainer(cpu, **method)
    backward(gpu, 0, rank, device)
    for pg, pc in zip(gpu.parameters(), cpu.parameters()):
        pc.grad = pg.grad.detach().cpu().clone()
    tg.step()
    tc.step()
    for pg, pc in zip(gpu.parameters(), cpu.parameters()):
        require(torch.equal(pg.grad.cpu(), pc.grad), "the staged average differs from the host's")


def check_device_resume(rank, device):
    """A device trainer's state_dict() mid-run, loaded into a new trainer, ends bit for bit."""
    method = dict(compressor="topk", collective="allgather", policy="gravac", gravac_warmup=1)
    straight, resumed = make_model(4, device), make_model(4, device)
    ts, tr = gt.Trainer(straight, **method), gt.Trainer(resumed, **method)
    for step in range(STEPS):
        if step == STEPS // 2:
            saved = tr.state_dict()
            tr = gt.Trainer(resumed, **method)
            tr.load_state_dict(saved)
        for model, trainer in ((straight, ts), (resumed, tr)):
            backward(model, step, rank, device)
            trainer.step()
        for a, b in zip(straight.parameters(), resumed.parameters()):
            require(torch.equal(a.grad, b.grad), f"step {step}: the resumed device trainer's average differs")
    require(tr._engine.on_device, "the resumed trainer does not compress on the device")


CHECKS = {"device": check_device, "device_equals_host": check_device_equals_host,
          "hook_equals_trainer": check_hook_equals_trainer, "staged": check_staged,
          "device_resume": check_device_resume}


def worker(rank, world, backend, store, names):
    try:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group(backend, store=dist.FileStore(store, world), rank=rank, world_size=world)
        for name in names:
            CHECKS[name](rank, device)
            dist.barrier()
            if rank == 0:
                print(f"cuda_hook_checks: {name}: passed on {world} ranks", flush=True)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                    help="default: nccl with a GPU per rank, else gloo")
    ap.add_argument("checks", nargs="*", default=list(CHECKS))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_hook_checks: skipped: no CUDA device (or a torch without CUDA)")
        return 77
    backend = a.backend or ("nccl" if torch.cuda.device_count() >= a.ranks else "gloo")
    print(f"cuda_hook_checks: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {a.ranks} ranks over "
          f"{backend}, gravac {gravac.library_version()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        # A failing rank exits non-zero, and mp.spawn raises.
        mp.spawn(worker, args=(a.ranks, backend, os.path.join(tmp, "store"), a.checks), nprocs=a.ranks, join=True)
    print("cuda_hook_checks: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
