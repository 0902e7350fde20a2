"""Checks of gravac.torch.LocalSteps (local SGD, DiLoCo) on 2 Gloo processes, CPU.

- H = 1 with outer averaging is gravac.torch.Trainer (per-step, the fixed policy, the same
  compressor and kept_fraction), bit for bit, on every parameter after every step;
- identity + dense_allreduce with outer averaging at H = 3: after each exchange the
  parameters are the same on both ranks, bit for bit, and the mean of the two ranks'
  parameters before it (within 1e-6; the reference is torch.distributed.all_reduce);
- sparseloco + allgather with Nesterov at H = 4: a run saved mid-round (after step 6) and
  resumed on a fresh LocalSteps, model and optimizer ends with the uninterrupted run's
  parameters, bit for bit;
- bad input: policy=, a non-float32 parameter and a period out of range are refused before
  anything is sent; parameters that differ between the ranks fail on both, each naming the
  other rank;
- parameters(): the model's trainable parameters in the order of global_parameters();
- average_inner_state: SGD's momentum buffers and Adam's exp_avg / exp_avg_sq, different on
  the two ranks mid-round, become the ranks' mean, the same bits on both (Adam's step is left
  as it is); inner_state_must_agree() is False at a fixed H, and step(opt) averages the
  state when it is True.

    /usr/bin/python3 tests/torch/local_steps_check.py

Exits 1 when a check fails on a rank, 77 (skipped) when torch or gravac.torch cannot be
imported (or the library cannot be loaded).
"""
import copy
import io
import os
import subprocess
import sys
import tempfile
import time
import traceback

FEATURES, CLASSES, BATCH = 24, 5, 16


def make_model(seed):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES))


def batch(step, rank):
    import torch
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def backward(model, opt, step, rank):
    import torch
    x, y = batch(step, rank)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()


def require(cond, what):
    if not cond:
        raise AssertionError(what)


def flat(model):
    import torch
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def gathered(t):
    import torch
    import torch.distributed as dist
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return out


def check_per_step_equals_trainer(rank):
    """H = 1, outer averaging: the gradients are averaged before the optimizer's step, by the
    exchange's trainer, as gravac.torch.Trainer does."""
    import torch
    import gravac.torch as gt
    a = make_model(1)
    b = copy.deepcopy(a)
    local = gt.LocalSteps(a, compressor="topk", collective="allgather", period=1, outer="averaging", seed=7,
                          kept_fraction=0.1)
    trainer = gt.Trainer(b, compressor="topk", collective="allgather", policy="fixed", seed=7, kept_fraction=0.1)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    for step in range(6):
        backward(a, opt_a, step, rank)
        backward(b, opt_b, step, rank)
        ra = local.step(opt_a)
        rb = trainer.step()
        opt_b.step()
        require(ra is not None and ra["step"] == step, f"H = 1: step {step}: no exchange report ({ra})")
        require(ra["bytes_sent"] == rb["bytes_sent"], f"H = 1: step {step}: bytes {ra['bytes_sent']} vs "
                                                      f"the trainer's {rb['bytes_sent']}")
        for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
            require(torch.equal(pa.grad, pb.grad), f"H = 1: step {step}: {name}'s averaged gradient differs")
            require(torch.equal(pa, pb), f"H = 1: step {step}: {name} differs from the trainer's "
                                         f"(max diff {(pa - pb).abs().max().item()})")
    info = local.info()
    require(info["period"] == 1 and info["exchanges"] == 6 and info["inner_steps"] == 6, f"H = 1: info {info}")
    for g, p in zip(local.global_parameters(), a.parameters()):
        require(torch.equal(g, p), "H = 1: the global parameters are not the model's")
    local.close()


def check_averaging_rounds(rank):
    """identity + dense_allreduce, outer averaging, H = 3: each exchange leaves every rank at the
    mean of the ranks' parameters; between exchanges each rank trains alone."""
    import torch
    import torch.distributed as dist
    import gravac.torch as gt
    model = make_model(2)
    local = gt.LocalSteps(model, compressor="identity", collective="dense_allreduce", period=3, outer="averaging")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(9):
        backward(model, opt, step, rank)
        grads = [p.grad.clone() for p in model.parameters()]
        require(local.before_optimizer_step() is None, f"H = 3: step {step}: the gradients were exchanged")
        require(all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters())),
                f"H = 3: step {step}: the gradients changed in a round of local steps")
        opt.step()
        before = flat(model)
        mean = before.clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        report = local.after_optimizer_step()
        after = flat(model)
        if step % 3 != 2:
            require(report is None, f"H = 3: step {step}: an exchange mid-round")
            require(torch.equal(after, before), f"H = 3: step {step}: the parameters moved mid-round")
            continue
        require(report is not None, f"H = 3: step {step}: no exchange at the round's end")
        others = gathered(before)
        require(not torch.equal(others[0], others[1]), "H = 3: the ranks did not diverge in the round (no test)")
        ranks = gathered(after)
        require(all(torch.equal(r, ranks[0]) for r in ranks), f"H = 3: step {step}: the ranks differ after the "
                                                               "exchange")
        diff = (after - mean).abs().max().item()
        require(diff <= 1e-6, f"H = 3: step {step}: {diff} from the mean of the ranks' parameters")
        require(torch.equal(torch.cat([g.reshape(-1) for g in local.global_parameters()]), after),
                f"H = 3: step {step}: the global parameters are not where the ranks continue from")
    info = local.info()
    require(info["exchanges"] == 3 and info["round_step"] == 0 and info["period"] == 3, f"H = 3: info {info}")
    # Two more steps, then the round ends early: every rank at the mean of the ranks' points.
    for step in range(9, 11):
        backward(model, opt, step, rank)
        local.step(opt)
    before = flat(model)
    mean = before.clone()
    dist.all_reduce(mean)
    mean /= dist.get_world_size()
    require(local.finish_round() is not None, "finish_round: no exchange two steps into a round")
    after = flat(model)
    ranks = gathered(after)
    require(all(torch.equal(r, ranks[0]) for r in ranks), "finish_round: the ranks differ afterwards")
    diff = (after - mean).abs().max().item()
    require(diff <= 1e-6, f"finish_round: {diff} from the mean of the ranks' parameters")
    require(local.finish_round() is None and torch.equal(flat(model), after),
            "finish_round right after finish_round: an exchange or a move")
    local.close()


def sparseloco(model):
    import gravac.torch as gt
    return gt.LocalSteps(model, compressor="sparseloco", collective="allgather", period=4, outer="nesterov",
                         kept_fraction=0.1, sparseloco_chunk=64, seed=3)


def inner_optimizer(model):
    import torch
    return torch.optim.AdamW(model.parameters(), lr=0.01)


def check_resume(rank):
    """sparseloco + allgather, Nesterov, H = 4: saved after step 6 (mid-round), restored on a
    fresh LocalSteps, model and optimizer, the run continues as if uninterrupted."""
    import torch
    steps, saved_at = 12, 6
    model = make_model(3)
    local, opt = sparseloco(model), inner_optimizer(model)
    for step in range(steps):
        backward(model, opt, step, rank)
        local.step(opt)
    expected = flat(model)
    require(local.info()["exchanges"] == 3, f"resume: {local.info()}")
    local.close()

    model = make_model(3)
    local, opt = sparseloco(model), inner_optimizer(model)
    for step in range(saved_at):
        backward(model, opt, step, rank)
        local.step(opt)
    info = local.info()
    require(info["round_step"] == 2 and info["exchanges"] == 1, f"resume: not mid-round after step 6: {info}")
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gravac": local.state_dict()}, buf)
    local.close()
    del model, local, opt

    buf.seek(0)
    checkpoint = torch.load(buf)
    require(checkpoint["gravac"]["format"] == "gravac-local-steps", "resume: the state_dict's format")
    model = make_model(3)  # the same start on every rank: LocalSteps is built before the model is restored
    local, opt = sparseloco(model), inner_optimizer(model)
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["opt"])
    local.load_state_dict(checkpoint["gravac"])
    require(local.info() == info, f"resume: restored {local.info()}, saved {info}")
    for step in range(saved_at, steps):
        backward(model, opt, step, rank)
        local.step(opt)
    got = flat(model)
    require(torch.equal(got, expected), f"resume: the resumed run ends {(got - expected).abs().max().item()} from "
                                        "the uninterrupted one")
    local.close()


def check_bad_input(rank):
    import gravac.torch as gt
    model = make_model(4)
    for kwargs, what in ((dict(policy="gravac"), "policy="), (dict(period=0), "period 0"),
                         (dict(local_period=3), "local_period=")):
        try:
            gt.LocalSteps(model, **kwargs)
        except ValueError:
            pass
        else:
            raise AssertionError(f"bad input: {what} was accepted")
    try:
        gt.LocalSteps(make_model(4).double())
    except ValueError as e:
        require("float32" in str(e), f"bad input: a float64 parameter: {e}")
    else:
        raise AssertionError("bad input: a float64 parameter was accepted")
    # Another start on each rank: every rank fails, naming the other.
    other = 1 - rank
    try:
        gt.LocalSteps(make_model(10 + rank))
    except RuntimeError as e:
        require(f"rank(s) {other}" in str(e) and "parameters" in str(e),
                f"bad input: differing parameters: the error does not name rank {other}: {e}")
    else:
        raise AssertionError("bad input: parameters that differ between the ranks were accepted")
    # The group still works, and a good LocalSteps builds after the failures.
    gt.LocalSteps(make_model(4), compressor="identity", collective="dense_allreduce").close()


def check_parameters(rank):
    """parameters(): the model's trainable parameters (a frozen one left out), in the order of
    global_parameters(), as a list of the LocalSteps' own that the caller may change."""
    import gravac.torch as gt
    model = make_model(5)
    model[0].bias.requires_grad_(False)
    local = gt.LocalSteps(model, compressor="identity", collective="dense_allreduce", period=2)
    managed = local.parameters()
    expected = [model[0].weight, model[2].weight, model[2].bias]
    require([id(p) for p in managed] == [id(p) for p in expected],
            f"parameters(): {[tuple(p.shape) for p in managed]}, not the model's trainable parameters in order")
    require([g.shape for g in local.global_parameters()] == [p.shape for p in managed],
            "parameters(): not tensor for tensor with global_parameters()")
    managed.clear()
    require(len(local.parameters()) == 3, "parameters(): clearing the returned list changed the LocalSteps")
    local.close()


def check_inner_state(rank):
    """average_inner_state(optimizer): the optimizer's per-parameter state, each rank's own
    after local steps, becomes the ranks' mean, the same bits on every rank; scalars stay."""
    import torch
    import gravac.torch as gt
    for name in ("sgd", "adam"):
        model = make_model(6)
        local = gt.LocalSteps(model, compressor="identity", collective="dense_allreduce", period=3)
        if name == "sgd":
            opt, keys = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), ["momentum_buffer"]
        else:
            opt, keys = torch.optim.Adam(model.parameters(), lr=0.01), ["exp_avg", "exp_avg_sq"]
        for step in range(2):  # mid-round: each rank's state is its own
            backward(model, opt, step, rank)
            local.step(opt)
            require(not local.inner_state_must_agree(), f"{name}: step {step}: must agree at a fixed H = 3")
        params = local.parameters()
        mine = torch.cat([opt.state[p][k].reshape(-1) for p in params for k in keys])
        ranks = gathered(mine)
        require(not torch.equal(ranks[0], ranks[1]), f"{name}: the ranks' state agrees already (no test)")
        mean = (ranks[0] + ranks[1]) / 2
        require(not torch.equal(mean, mine), f"{name}: the mean is this rank's state (no test)")
        steps = [opt.state[p]["step"].clone() for p in params] if name == "adam" else []
        local.average_inner_state(opt)
        after = torch.cat([opt.state[p][k].reshape(-1) for p in params for k in keys])
        require(torch.equal(after, mean), f"{name}: the state is {(after - mean).abs().max().item()} from the mean")
        both = gathered(after)
        require(torch.equal(both[0], both[1]), f"{name}: the ranks' state differs after average_inner_state")
        require(all(torch.equal(s, opt.state[p]["step"]) for s, p in zip(steps, params)),
                f"{name}: the step counters moved")
        # Training goes on from the averaged state.
        backward(model, opt, 2, rank)
        require(local.step(opt) is not None, f"{name}: no exchange at the round's end")
        # step(opt) averages the state itself when the engine says it must agree (as at a
        # switch to per-step rounds, which a fixed H never makes: the answer is patched here).
        local.inner_state_must_agree = lambda: True
        backward(model, opt, 3, rank)
        local.step(opt)
        both = gathered(torch.cat([opt.state[p][k].reshape(-1) for p in params for k in keys]))
        require(torch.equal(both[0], both[1]), f"{name}: step(opt) left the ranks' state apart when it must agree")
        local.close()


CHECKS = [check_per_step_equals_trainer, check_averaging_rounds, check_resume, check_bad_input, check_parameters,
          check_inner_state]


def rank_main(rank, store_path):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    failed = 0
    for check in CHECKS:
        start = time.monotonic()
        try:
            check(rank)
            dist.barrier()
            if rank == 0:
                print(f"local_steps_check: {check.__name__}: passed ({time.monotonic() - start:.1f} s)", flush=True)
        except Exception:
            print(f"local_steps_check: rank {rank}: {check.__name__} FAILED:\n{traceback.format_exc()}", flush=True)
            failed = 1
            break  # the other rank may be waiting in a collective: exit, and it fails too
    if not failed:
        dist.destroy_process_group()
    return failed


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        return rank_main(int(sys.argv[2]), sys.argv[3])
    try:
        import torch  # noqa: F401
        import gravac.torch  # noqa: F401
        import gravac._capi
        gravac._capi.lib()
    except ImportError as e:
        print(f"local_steps_check: skipped: {e}")
        return 77
    with tempfile.TemporaryDirectory() as work:
        store = os.path.join(work, "store")
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), store]) for r in (0, 1)]
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=240))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
    if codes != [0, 0]:
        print(f"local_steps_check: FAILED (exit codes {codes})")
        return 1
    print("local_steps_check: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
