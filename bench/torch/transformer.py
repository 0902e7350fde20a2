#!/usr/bin/env python3
"""A byte-level transformer under DDP: PyTorch's communication hooks against gravac's.

Every method trains the same decoder-only language model (bench/torch/tiny_gpt.py: 4
layers, d_model 192, 4 heads, context 128, learned positions, pre-LayerNorm, GELU MLP,
tied embeddings; 1.85M parameters) on the text of Debian's `fortunes` package, with the
same seed, initial weights, data order and AdamW schedule, under
torch.nn.parallel.DistributedDataParallel with Gloo on --ranks CPU processes. Only the
gradient exchange differs:

  torch_allreduce     DDP's built-in allreduce (no hook)
  torch_fp16          default_hooks.fp16_compress_hook
  torch_powersgd      powerSGD_hook.powerSGD_hook (rank R, start_powerSGD_iter 10, PyTorch's default)
  gravac_dense        gravac identity + dense_allreduce + fixed
  gravac_cast16       gravac cast16 + compressed_allreduce + fixed
  gravac_powersgd     gravac powersgd + low_rank_allreduce + fixed (powersgd_rank R)
  gravac_topk         gravac topk + allgather + fixed (kept_fraction 0.01)
  gravac_recommended  gravac preset="recommended" (or, where ddp_hook has no preset yet, what it
                      is: topk + allgather + gravac, gravac_dense=True, gravac_period=100)
  gravac_adacomp      gravac adacomp + allgather + adacomp
  gravac_accordion    gravac topk + allgather + accordion
  gravac_mxfp8, gravac_mxfp4, gravac_nvfp4
                      gravac: the block-scaled format + compressed_allreduce + fixed; the
                      _no_ef rows with block_error_feedback=False
  gravac_fp8_rowwise  gravac fp8_rowwise + compressed_allreduce + fixed (torchft's scheme)

Local-step rows: no DDP; gravac.torch.LocalSteps on the plain model, the rows' AdamW (and lr
schedule) as the inner optimizer, the same data, seed and initial weights. Every rank takes H
AdamW steps on its own shard alone, then the ranks exchange the pseudo-gradient (x0 - x)
with error feedback and an outer optimizer moves the global point, from which every rank
continues:

  gravac_diloco_h10          identity + dense_allreduce, outer nesterov lr 0.7 momentum 0.9,
                             H = 10 (DiLoCo as published)
  gravac_sparseloco_h10      sparseloco + allgather, kept_fraction 0.02, outer averaging, H = 10
  gravac_local_adaptive_1g   sparseloco + allgather, adaptive=True (local_steps_policy picks H
  gravac_local_adaptive_100m <= local_max_period 16 and the kept fraction among 1, 0.1, 0.01),
                             outer averaging, sparseloco_decay 1; told the network of the modeled
                             time it is reported on (network_source fixed, network_gbps 1 or 0.1,
                             network_latency_ms = --latency-us) and the compute per step
                             (local_time simulated, local_compute_s = the compute measured below)

Their validation loss is that of the global parameters (local.global_parameters(), the same
on every rank) copied into a model for evaluation: where a round is unfinished at an
evaluation (adaptive rows), the inner steps since the last exchange are not in it, nor at the
end (steps_after_last_exchange in summary.csv says how many).

The gravac and local-step rows need `gravac.torch`; when it cannot be imported they are
skipped with a message and the PyTorch rows still run.

Output (--out-dir, default bench/torch/results/transformer): one CSV per method (a row per
step: losses, bytes, measured step time, modeled time at each bandwidth), summary.csv,
summary.md and three PNG plots drawn with gnuplot (validation loss against steps and against
modeled time at 1 Gbit/s and 100 Mbit/s).

Modeled time of a step = compute + codec + communication, where
  compute        forward + backward + AdamW of one rank's shard, measured once per invocation
                 in the parent process on one thread with nothing else of ours running, the
                 fastest of 8 (the same figure for every method);
  codec          gravac rows: the report's compress_s + decompress_s (the fastest steady
                 step, mean over ranks, measured in the run itself); PyTorch's fp16: a measured
                 cast of the gradient to half and back; PyTorch's PowerSGD: a measured replay of
                 its arithmetic on this model's shapes (P = M Q, orthogonalise, Q = M^T P,
                 M = P Q^T per matrix, and its error-feedback adds; the fastest of 9); no hook: 0;
  communication  alpha-beta: messages x latency + wire bytes / bandwidth, the wire bytes of a
                 ring allreduce (2(N-1)/N x payload, 2(N-1) messages) or ring allgather
                 ((N-1) x payload, N-1 messages), counted by wrapping torch.distributed's
                 collectives (bench/torch/ddp_hooks.py), 4 x numel for DDP's own allreduce,
                 and gravac's `last_report()["wire_bytes_sent"]` for the gravac rows.
No overlap of communication with backward is modeled.
Local-step rows are charged the same way, step by step: every step the same compute; a step
without an exchange sends 0 bytes and is charged nothing else; a step that ran an exchange (the
end of a round, or every step of a round of H = 1) is charged the report's wire_bytes_sent and
the messages of its collective (as for the other gravac rows: buckets x calls per bucket x ring
messages), and a codec time: per kind of exchange (collective and kept fraction), each rank's
fastest exchange of that kind (compress_s + decompress_s), mean over the ranks. Not charged:
the outer optimizer's step and the copies of the parameters in and out of the library at a
round's end (an O(numel) pass each, once per round), and the evaluation copies. No overlap of
an exchange with the next round is modeled (the rows run with overlap=False).

Time to a target validation loss (summary.md, summary.csv): the modeled time at the first
evaluation on the curve (every --eval-every steps) at or below the target; the targets are
--target-val-loss, or the reference's (torch_allreduce, else gravac_dense) last evaluation
times (1 + each of --target-margins).

Run with Debian's Python (python3-torch):

  /usr/bin/python3 bench/torch/transformer.py              # all methods (some 30 min on 2 shared cores)
  /usr/bin/python3 bench/torch/transformer.py --quick      # a few steps per method
"""
import argparse
import copy
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    sys.exit("transformer.py: torch is not importable by %s; run it with Debian's Python: /usr/bin/python3 %s"
             % (sys.executable, " ".join(sys.argv)))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_hooks import CollectiveCounter, init_gloo_rank, loaded_blas  # noqa: E402
import tiny_gpt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (family, (compressor, collective, policy) or None)
METHODS = {
    "torch_allreduce": ("torch", None),
    "torch_fp16": ("torch", None),
    "torch_powersgd": ("torch", None),
    "gravac_dense": ("gravac", ("identity", "dense_allreduce", "fixed")),
    "gravac_cast16": ("gravac", ("cast16", "compressed_allreduce", "fixed")),
    "gravac_powersgd": ("gravac", ("powersgd", "low_rank_allreduce", "fixed")),
    "gravac_topk": ("gravac", ("topk", "allgather", "fixed")),
    "gravac_recommended": ("gravac", "recommended"),
    "gravac_adacomp": ("gravac", ("adacomp", "allgather", "adacomp")),
    "gravac_accordion": ("gravac", ("topk", "allgather", "accordion")),
    # The block-scaled formats over the compressed allreduce, with error feedback and without
    # (the _no_ef rows), and torchft's fp8 row-wise scheme (no error feedback).
    "gravac_mxfp8": ("gravac", ("mxfp8", "compressed_allreduce", "fixed")),
    "gravac_mxfp8_no_ef": ("gravac", ("mxfp8", "compressed_allreduce", "fixed")),
    "gravac_mxfp4": ("gravac", ("mxfp4", "compressed_allreduce", "fixed")),
    "gravac_mxfp4_no_ef": ("gravac", ("mxfp4", "compressed_allreduce", "fixed")),
    "gravac_nvfp4": ("gravac", ("nvfp4", "compressed_allreduce", "fixed")),
    "gravac_nvfp4_no_ef": ("gravac", ("nvfp4", "compressed_allreduce", "fixed")),
    "gravac_fp8_rowwise": ("gravac", ("fp8_rowwise", "compressed_allreduce", "fixed")),
    # Local steps (gravac.torch.LocalSteps on the plain model, no DDP): H AdamW steps per rank
    # alone, then an exchange of the pseudo-gradient and an outer step. "network" names the
    # modeled network (BANDWIDTHS) an adaptive row is told about and reported on.
    "gravac_diloco_h10": ("local", dict(compressor="identity", collective="dense_allreduce", period=10,
                                        outer="nesterov", outer_lr=0.7, outer_momentum=0.9)),
    "gravac_sparseloco_h10": ("local", dict(compressor="sparseloco", collective="allgather", period=10,
                                            outer="averaging", kept_fraction=0.02)),
    "gravac_local_adaptive_1g": ("local", dict(compressor="sparseloco", collective="allgather", adaptive=True,
                                               local_max_period=16, outer="averaging", sparseloco_decay=1.0,
                                               network="1g")),
    "gravac_local_adaptive_100m": ("local", dict(compressor="sparseloco", collective="allgather", adaptive=True,
                                                 local_max_period=16, outer="averaging", sparseloco_decay=1.0,
                                                 network="100m")),
}

# Collective calls per bucket of each gravac collective (for the latency term only; an estimate:
# the bandwidth term uses the report's wire bytes). allgather sends the sizes first (Gloo has no
# variable-length allgather); low_rank_allreduce reduces the Ps, then the Qs (the vectors ride along).
GRAVAC_CALLS = {"dense_allreduce": ("allreduce", 1), "compressed_allreduce": ("allreduce", 1),
                "allreduce_compatible": ("allreduce", 1), "low_rank_allreduce": ("allreduce", 2),
                "allgather": ("allgather", 2), "flexible": ("allgather", 2)}

BANDWIDTHS = (("1g", 1e9), ("100m", 1e8))  # bit/s

# ----------------------------------------------------------------------- helpers


def gravac_available():
    """(True, "") when gravac.torch imports and its library loads (option_names() calls into it)."""
    try:
        import gravac.torch as gt

        if hasattr(gt, "option_names"):
            gt.option_names()
    except Exception as e:  # ImportError, a library that fails to load, ...
        return False, "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    return True, ""


class MessageCounter(CollectiveCounter):
    """ddp_hooks.py's counter (payload and wire bytes of every counted collective) that also
    counts the messages each call puts on the wire under the ring model."""

    def reset(self):
        super().reset()
        self.msgs = 0

    def _wrap(self, name, fn):
        inner = super()._wrap(name, fn)

        def counted(*args, **kwargs):
            self.msgs += messages_of("allreduce" if name == "all_reduce" else "allgather", self.world)
            return inner(*args, **kwargs)

        counted.__wrapped__ = fn
        return counted


def messages_of(kind, world):
    """Messages one rank sends in a ring collective."""
    return 2 * (world - 1) if kind == "allreduce" else (world - 1)


def lr_at(step, args):
    """Linear warm-up over warmup_steps, then cosine to min_lr_ratio x lr at the last step."""
    lr, warm, total = args["lr"], args["lr_warmup"], args["steps"]
    if step < warm:
        return lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    floor = args["min_lr_ratio"]
    return lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def make_model(args):
    torch.manual_seed(args["seed"])
    return tiny_gpt.TinyGPT(args["layers"], args["d_model"], args["heads"], args["context"]).init_weights(args["seed"])


def make_opt(model, args):
    return torch.optim.AdamW(tiny_gpt.param_groups(model, args["weight_decay"]), lr=args["lr"], betas=(0.9, 0.95))


def batch_starts(args, n_train):
    """Every step's window starts into the training text: [steps, global batch], drawn from
    numpy.random.default_rng(seed), the same on every rank and for every method."""
    rng = np.random.default_rng(args["seed"])
    return rng.integers(0, n_train - args["context"] - 1, size=(args["steps"], args["batch"]))


def windows(text, starts, context):
    idx = torch.from_numpy(np.stack([text[s : s + context + 1] for s in starts]).astype(np.int64))
    return idx[:, :-1], idx[:, 1:]


def val_starts(n_val, count, context):
    """`count` non-overlapping windows spread evenly over the validation text."""
    last = n_val - context - 1
    return [int(round(i * last / max(1, count - 1))) for i in range(count)]


def evaluate(model, val, starts, context, rank, world, all_reduce):
    """Mean validation loss over `starts`, each rank taking its share (summed by an
    uncounted allreduce)."""
    mine = starts[rank::world]
    total, n = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(mine), 4):
            x, y = windows(val, mine[i : i + 4], context)
            logits = model(x)
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
            n += y.numel()
    model.train()
    t = torch.tensor([total, float(n)], dtype=torch.float64)
    all_reduce(t)
    return float(t[0] / t[1])


# ------------------------------------------------------------------------- worker


def build_gravac_hook(method, model, args):
    import gravac.torch as gt

    spec = METHODS[method][1]
    common = dict(seed=args["seed"], overlap=args["hook_overlap"] == "on")
    if spec == "recommended":
        state, hook = gt.ddp_hook(model, preset="recommended", **common)
        return state, hook, 'preset="recommended"'
    compressor, collective, policy = spec
    opts = {}
    if method == "gravac_powersgd":
        opts["powersgd_rank"] = args["powersgd_rank"]
    if method == "gravac_topk":
        opts["kept_fraction"] = args["kept_fraction"]
    if method.endswith("_no_ef"):
        opts["block_error_feedback"] = False
    state, hook = gt.ddp_hook(model, compressor=compressor, collective=collective, policy=policy, **opts, **common)
    return state, hook, "%s+%s+%s" % (compressor, collective, policy)


def build_local_steps(method, net, args):
    """gravac.torch.LocalSteps over the plain model (no DDP) for a "local" row, and its note.
    The adaptive rows are told the modeled network they are reported on (bandwidth and the
    script's latency per message) and the script's measured compute per step."""
    import gravac.torch as gt

    opts = {k: v for k, v in METHODS[method][1].items() if k != "network"}
    if opts.get("adaptive"):
        bw = dict(BANDWIDTHS)[METHODS[method][1]["network"]]
        opts.update(network_source="fixed", network_gbps=bw / 1e9, network_latency_ms=args["latency_us"] / 1e3,
                    local_time="simulated", local_compute_s=args["compute_s"])
    local = gt.LocalSteps(net, seed=args["seed"], **opts)
    note = " ".join("%s=%s" % (k, ("%.6g" % v) if isinstance(v, float) else v) for k, v in opts.items())
    return local, note


def copy_global(local, eval_net, names):
    """The global parameters of `local` into eval_net (matched by parameter name)."""
    params = dict(eval_net.named_parameters())
    with torch.no_grad():
        for t, g in zip(local.parameters(), local.global_parameters()):
            params[names[id(t)]].copy_(g)


def worker(rank, method, args, store_path, data_npz, result_path):
    world = args["ranks"]
    init_gloo_rank(rank, world, store_path)
    counter = MessageCounter(world)
    raw_all_reduce = counter.originals["all_reduce"]
    raw_all_gather = counter.originals["all_gather"]

    data = np.load(data_npz)
    train, val = data["train"], data["val"]
    starts = batch_starts(args, len(train))
    vstarts = val_starts(len(val), args["val_seqs"], args["context"])
    vstarts_final = val_starts(len(val), args["final_val_seqs"], args["context"])

    net = make_model(args)
    numel = sum(p.numel() for p in net.parameters())
    ps_state, gv_state, local_steps, note = None, None, None, ""
    if METHODS[method][0] == "local":
        # No DDP: LocalSteps on the plain module; the inner optimizer is the rows' AdamW. The
        # global point is evaluated on a copy of the model.
        local_steps, note = build_local_steps(method, net, args)
        eval_net = copy.deepcopy(net)
        names = {id(p): n for n, p in net.named_parameters()}
        opt = make_opt(net, args)
        return local_worker(rank, method, args, net, numel, local_steps, note, opt, eval_net, names, counter,
                            train, val, starts, vstarts, vstarts_final, result_path)
    # One DDP bucket for the whole model (7.4 MB), for every method: PyTorch's PowerSGD hook
    # launches each bucket's Q allreduce from a future's callback, so with two buckets the
    # ranks can issue them in different orders, which Gloo aborts on ("op.preamble.length <=
    # op.nbytes"). DDP's first bucket is capped by dist._DEFAULT_FIRST_BUCKET_BYTES (1 MB).
    dist._DEFAULT_FIRST_BUCKET_BYTES = args["ddp_bucket_mb"] * 2 ** 20
    model = torch.nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=args["bucket_view"],
                                                      bucket_cap_mb=args["ddp_bucket_mb"])
    if method == "torch_fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        note = "fp16_compress_hook"
    elif method == "torch_powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        ps_state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args["powersgd_rank"],
            start_powerSGD_iter=args["powersgd_start"], use_error_feedback=True, warm_start=True,
            random_seed=args["seed"])
        model.register_comm_hook(ps_state, powerSGD_hook.powerSGD_hook)
        note = "powerSGD_hook rank %d, start_powerSGD_iter %d" % (args["powersgd_rank"], args["powersgd_start"])
    elif METHODS[method][0] == "gravac":
        gv_state, hook, note = build_gravac_hook(method, model, args)
        model.register_comm_hook(gv_state, hook)
    else:
        note = "DDP allreduce (no hook)"
    opt = make_opt(model, args)

    local = args["batch"] // world
    rows = []
    codec = []
    evals = {0: evaluate(net, val, vstarts, args["context"], rank, world, raw_all_reduce)}
    for step in range(args["steps"]):
        x, y = windows(train, starts[step, rank * local : (rank + 1) * local], args["context"])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        counter.reset()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        row = {"step": step + 1, "local_loss": float(loss.detach()), "step_s": t1 - t0}
        if method == "torch_allreduce":
            # DDP's reducer allreduces its fp32 buckets in C++, past the Python wrappers.
            row["payload"] = 4.0 * numel
            row["wire"] = 2.0 * (world - 1) / world * 4.0 * numel
            row["messages"] = args["ddp_buckets"] * messages_of("allreduce", world)
        elif gv_state is not None:
            rep = gv_state.last_report()
            row["payload"] = float(rep["bytes_sent"])
            row["wire"] = float(rep["wire_bytes_sent"])
            kind, per_bucket = GRAVAC_CALLS.get(str(rep.get("collective", "")), ("allreduce", 1))
            row["messages"] = max(1, int(rep.get("buckets", 1))) * per_bucket * messages_of(kind, world)
            row["collective"] = str(rep.get("collective", ""))
            kf = rep.get("kept_fraction", float("nan"))  # per layer (a list) or one figure
            row["kept_fraction"] = statistics.fmean(kf) if isinstance(kf, (list, tuple)) and kf else float(
                kf if not isinstance(kf, (list, tuple)) else float("nan"))
            codec.append(float(rep.get("compress_s", 0.0)) + float(rep.get("decompress_s", 0.0)))
        else:
            row["payload"] = counter.payload
            row["wire"] = counter.wire
            row["messages"] = counter.msgs
        rows.append(row)
        if (step + 1) % args["eval_every"] == 0 or step + 1 == args["steps"]:
            evals[step + 1] = evaluate(net, val, vstarts, args["context"], rank, world, raw_all_reduce)
    final_val = evaluate(net, val, vstarts_final, args["context"], rank, world, raw_all_reduce)

    # Every rank's per-step loss and step time; the codec time per rank.
    n = len(rows)
    mine = torch.tensor([[r["local_loss"], r["step_s"]] for r in rows], dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    raw_all_gather(gathered, mine)
    stacked = torch.stack(gathered)  # [world, steps, 2]
    warm = min(args["warmup_steps"], max(0, n - 1))
    # The fastest steady step's codec time: other processes on these cores only add to it.
    codec_med = torch.tensor([min(codec[warm:]) if codec[warm:] else 0.0], dtype=torch.float64)
    codecs = [torch.empty_like(codec_med) for _ in range(world)]
    raw_all_gather(codecs, codec_med)
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    same = torch.tensor([float(flat.double().sum()), float(flat.double().abs().sum())], dtype=torch.float64)
    sames = [torch.empty_like(same) for _ in range(world)]
    raw_all_gather(sames, same)
    if rank == 0:
        for i, r in enumerate(rows):
            r["train_loss"] = float(stacked[:, i, 0].mean())
            r["step_s_slowest"] = float(stacked[:, i, 1].max())
            r["val_loss"] = evals.get(r["step"], "")
        res = {
            "method": method, "config": note, "numel": numel, "ranks": world, "steps": n,
            "initial_val_loss": evals[0], "final_val_loss": final_val,
            "codec_s": float(torch.cat(codecs).mean()) if codec else None,
            "params_identical_on_ranks": all(bool(torch.equal(s, same)) for s in sames),
            "blas": loaded_blas(), "rows": rows,
        }
        if ps_state is not None:
            res["powersgd_compress_rate"] = ps_state.compression_stats()[0]
        with open(result_path, "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def local_worker(rank, method, args, net, numel, local, note, opt, eval_net, names, counter, train, val, starts,
                 vstarts, vstarts_final, result_path):
    """The training loop of a local-steps row: each step's forward, backward and
    local.step(opt) (AdamW, and at a round's end the exchange and the outer step). A step
    without an exchange sends nothing; one with an exchange is charged the bytes, collective
    and codec of its report. Evaluations are of the global parameters."""
    world = args["ranks"]
    raw_all_reduce = counter.originals["all_reduce"]
    raw_all_gather = counter.originals["all_gather"]

    def evaluate_global(starts_):
        copy_global(local, eval_net, names)
        return evaluate(eval_net, val, starts_, args["context"], rank, world, raw_all_reduce)

    n_local = args["batch"] // world
    rows, codec = [], []
    evals = {0: evaluate_global(vstarts)}
    for step in range(args["steps"]):
        x, y = windows(train, starts[step, rank * n_local : (rank + 1) * n_local], args["context"])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        counter.reset()
        period = local.period  # H of the round this step belongs to
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        logits = net(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        rep = local.step(opt)
        t1 = time.perf_counter()
        row = {"step": step + 1, "local_loss": float(loss.detach()), "step_s": t1 - t0, "period": period}
        if rep is None:
            row.update(payload=0.0, wire=0.0, messages=0, exchange=0)
            codec.append(0.0)
        else:
            row["payload"] = float(rep["bytes_sent"])
            row["wire"] = float(rep["wire_bytes_sent"])
            kind, per_bucket = GRAVAC_CALLS.get(str(rep.get("collective", "")), ("allreduce", 1))
            row["messages"] = max(1, int(rep.get("buckets", 1))) * per_bucket * messages_of(kind, world)
            row["collective"] = str(rep.get("collective", ""))
            row["kept_fraction"] = float(rep.get("mean_kept_fraction", float("nan")))
            row["exchange"] = 1
            codec.append(float(rep.get("compress_s", 0.0)) + float(rep.get("decompress_s", 0.0)))
        rows.append(row)
        if (step + 1) % args["eval_every"] == 0 or step + 1 == args["steps"]:
            evals[step + 1] = evaluate_global(vstarts)
    final_val = evaluate_global(vstarts_final)
    info = local.info()
    policy = local.policy_state()

    n = len(rows)
    mine = torch.tensor([[r["local_loss"], r["step_s"], c] for r, c in zip(rows, codec)], dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    raw_all_gather(gathered, mine)
    stacked = torch.stack(gathered)  # [world, steps, 3]
    flat = torch.cat([g.reshape(-1) for g in local.global_parameters()])
    same = torch.tensor([float(flat.double().sum()), float(flat.double().abs().sum())], dtype=torch.float64)
    sames = [torch.empty_like(same) for _ in range(world)]
    raw_all_gather(sames, same)
    if rank == 0:
        # The codec charged to an exchange: per kind of exchange (collective and kept
        # fraction), each rank's fastest such exchange, mean over the ranks (as the other gravac
        # rows take their fastest steady step: other processes on these cores only add to it).
        classes = {}
        for i, r in enumerate(rows):
            if r["exchange"]:
                classes.setdefault((r["collective"], "%.6g" % r["kept_fraction"]), []).append(i)
        charge = {}
        for key, idx in classes.items():
            charge[key] = float(statistics.fmean(float(stacked[k, idx, 2].min()) for k in range(world)))
        for i, r in enumerate(rows):
            r["train_loss"] = float(stacked[:, i, 0].mean())
            r["step_s_slowest"] = float(stacked[:, i, 1].max())
            r["val_loss"] = evals.get(r["step"], "")
            r["codec"] = charge[(r["collective"], "%.6g" % r["kept_fraction"])] if r["exchange"] else 0.0
        res = {
            "method": method, "config": note, "numel": numel, "ranks": world, "steps": n,
            "initial_val_loss": evals[0], "final_val_loss": final_val, "codec_s": None,
            "codec_per_step_s": sum(r["codec"] for r in rows) / max(1, n),
            "params_identical_on_ranks": all(bool(torch.equal(s, same)) for s in sames),
            "blas": loaded_blas(), "rows": rows, "exchanges": info["exchanges"],
            "steps_after_last_exchange": info["round_step"], "policy_state": policy,
        }
        with open(result_path, "w") as f:
            json.dump(res, f)
    dist.barrier()
    local.close()
    dist.destroy_process_group()


# ------------------------------------------------------------- compute measurement


def measure_compute(args, train, repeats):
    """Seconds of one rank's forward + backward + AdamW step on its shard (one thread, the
    parent process alone), and the PyTorch hooks' codec arithmetic on this model's gradients."""
    torch.set_num_threads(1)
    net = make_model(args)
    opt = make_opt(net, args)
    local = args["batch"] // args["ranks"]
    starts = batch_starts(args, len(train))
    times = []
    for i in range(repeats + 2):
        x, y = windows(train, starts[i % len(starts), :local], args["context"])
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        logits = net(x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    compute = min(times[2:])  # the fastest: other processes on these cores only add to it
    grads = [p.grad.detach().clone() for p in net.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])

    def med(fn, k=9):  # the fastest of k, as for the compute
        ts = []
        for _ in range(k):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    fp16 = med(lambda: flat.to(torch.float16).to(torch.float32).div_(args["ranks"]))
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    r = args["powersgd_rank"]
    mats = [g.reshape(g.shape[0], -1) for g in grads if g.dim() >= 2]
    qs = [torch.randn(m.shape[1], min(r, *m.shape)) for m in mats]
    err = flat.clone()

    def psgd():
        flat.add_(err)  # error feedback: add the residual
        ps = [m @ q for m, q in zip(mats, qs)]
        for p in ps:
            powerSGD_hook._orthogonalize(p.unsqueeze(0))
        q2 = [m.t() @ p for m, p in zip(mats, ps)]
        approx = [p @ q.t() for p, q in zip(ps, q2)]
        err.copy_(flat)
        for a in approx:
            a.div_(args["ranks"])

    return compute, {"torch_allreduce": 0.0, "torch_fp16": fp16, "torch_powersgd": med(psgd)}


# -------------------------------------------------------------------- reporting


def modeled(rows, compute_s, alpha, bw_bits):
    t, out = 0.0, []
    for r in rows:
        t += compute_s + r.get("codec", 0.0) + r["messages"] * alpha + 8.0 * r["wire"] / bw_bits
        out.append(t)
    return out


def write_run_csv(path, res, compute_s, alpha):
    times = {k: modeled(res["rows"], compute_s, alpha, bw) for k, bw in BANDWIDTHS}
    fields = ["step", "train_loss", "val_loss", "payload_bytes", "wire_bytes", "cum_wire_bytes", "messages",
              "step_s_slowest", "modeled_s_1g", "modeled_s_100m", "collective", "kept_fraction", "period",
              "codec_s"]
    cum = 0.0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        w.writerow([0, "", "%.5f" % res["initial_val_loss"], 0, 0, 0, 0, "", 0, 0, "", "", "", ""])
        for i, r in enumerate(res["rows"]):
            cum += r["wire"]
            w.writerow([r["step"], "%.5f" % r["train_loss"],
                        "%.5f" % r["val_loss"] if r["val_loss"] != "" else "",
                        "%.0f" % r["payload"], "%.0f" % r["wire"], "%.0f" % cum, r["messages"],
                        "%.4f" % r["step_s_slowest"], "%.4f" % times["1g"][i], "%.4f" % times["100m"][i],
                        r.get("collective", ""), "%.5g" % r["kept_fraction"] if "kept_fraction" in r else "",
                        r.get("period", ""), "%.5f" % r["codec"] if "codec" in r else ""])
    return times


def plot(out_dir, done):
    """Three PNGs with gnuplot (pngcairo) from the per-run CSVs: val loss against step and
    against modeled time at each bandwidth."""
    if not done:
        return []
    if not shutil.which("gnuplot"):
        print("note: gnuplot not found; no plots")
        return []
    made = []
    specs = [("val_loss_vs_step.png", 1, "step", "validation loss against steps"),
             ("val_loss_vs_time_1g.png", 9, "modeled time at 1 Gbit/s (s)", "validation loss against modeled time, 1 Gbit/s"),
             ("val_loss_vs_time_100m.png", 10, "modeled time at 100 Mbit/s (s)",
              "validation loss against modeled time, 100 Mbit/s")]
    for name, xcol, xlabel, title in specs:
        lines = []
        for i, m in enumerate(done):
            dt = "dt 2" if m.startswith("torch_") else "dt 1"
            lines.append("'%s.csv' using %d:($3 == 0 ? NaN : $3) with linespoints %s pt %d ps 0.6 lw 1.5 title '%s'"
                         % (m, xcol, dt, i % 13 + 1, m.replace("_", "\\_")))
        script = "\n".join([
            "set terminal pngcairo size 1000,650 font 'sans,10'",
            "set output '%s'" % name,
            "set datafile separator ','",
            "set datafile missing ''",
            "set key outside right",
            "set grid",
            "set title '%s'" % title,
            "set xlabel '%s'" % xlabel,
            "set ylabel 'validation loss (nats/byte)'",
            "set yrange [*:*]",
            "plot " + ", \\\n  ".join(lines),
        ])
        p = subprocess.run(["gnuplot"], input=script, text=True, cwd=out_dir, capture_output=True)
        if p.returncode != 0:
            print("note: gnuplot failed for %s: %s" % (name, p.stderr.strip()[-300:]))
        else:
            made.append(os.path.join(out_dir, name))
    return made


def rounds_of(rows):
    """The H of each round of a local-steps row, run-length coded: "1 x1, 16 x8" is one round
    of H = 1, then eight of 16; a round unfinished at the end is marked "+ k (unfinished)"."""
    runs, tail = [], 0
    for r in rows:
        tail += 1
        if r.get("exchange"):
            if runs and runs[-1][0] == r["period"]:
                runs[-1][1] += 1
            else:
                runs.append([r["period"], 1])
            tail = 0
    out = ", ".join("%d x%d" % (h, k) for h, k in runs) or "none"
    return out + (" + %d steps (unfinished)" % tail if tail else "")


def reach(s, target):
    """(step, modeled s at 1 Gbit/s, at 100 Mbit/s) of the first evaluation at or below target."""
    if s["initial_val_loss"] <= target:
        return 0, 0.0, 0.0
    for i, v in enumerate(s["_vals"]):
        if v != "" and v <= target:
            return i + 1, s["_times"]["1g"][i], s["_times"]["100m"][i]
    return None, None, None


def at_time(times, rows_val, t):
    """Validation loss of the last evaluation at or before modeled time t."""
    best = None
    for tt, v in zip(times, rows_val):
        if tt <= t and v != "":
            best = v
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma list of: " + ", ".join(METHODS))
    ap.add_argument("--quick", action="store_true", help="a handful of steps per method (development)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=140)
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences (all ranks together)")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=192)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lr-warmup", type=int, default=20, help="steps of linear warm-up, then cosine")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="the cosine ends at this fraction of --lr")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="AdamW's, on matrices only")
    ap.add_argument("--seed", type=int, default=1, help="weights and data order (the same for every method)")
    ap.add_argument("--split-seed", type=int, default=1234, help="which fortunes are the validation text")
    ap.add_argument("--val-fraction", type=float, default=0.05)
    ap.add_argument("--val-seqs", type=int, default=32, help="validation windows at each evaluation")
    ap.add_argument("--final-val-seqs", type=int, default=64, help="validation windows at the end")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--powersgd-rank", type=int, default=4, help="both PowerSGDs' rank")
    ap.add_argument("--powersgd-start", type=int, default=10, help="PyTorch's start_powerSGD_iter (its default)")
    ap.add_argument("--kept-fraction", type=float, default=0.01, help="gravac_topk's")
    ap.add_argument("--hook-overlap", choices=("on", "off"), default="off",
                    help="gravac hooks' overlap (off: cheaper on 2 cores; the modeled time has no overlap)")
    ap.add_argument("--gradient-as-bucket-view", action="store_true")
    ap.add_argument("--ddp-bucket-mb", type=int, default=32,
                    help="DDP's bucket cap, first bucket included (one bucket: see the worker)")
    ap.add_argument("--latency-us", type=float, default=50.0, help="alpha of the alpha-beta model, per message")
    ap.add_argument("--warmup-steps", type=int, default=10, help="steps left out of the steady-state averages")
    ap.add_argument("--target-val-loss", default="",
                    help="comma list of validation losses whose first reaching (on the curve) is timed; default: "
                         "the reference's (torch_allreduce, else gravac_dense) last evaluation x (1 + each "
                         "--target-margins)")
    ap.add_argument("--target-margins", default="0.02,0.10", help="see --target-val-loss")
    ap.add_argument("--fortunes-dir", default=tiny_gpt.FORTUNES_DIR)
    ap.add_argument("--out-dir", help="default bench/torch/results/transformer (--quick: out/torch/transformer-quick)")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.eval_every, a.val_seqs, a.final_val_seqs, a.warmup_steps, a.lr_warmup = 6, 3, 8, 8, 2, 2
    if not a.out_dir:
        a.out_dir = os.path.normpath(os.path.join(HERE, "..", "..", "out", "torch", "transformer-quick") if a.quick
                     else os.path.join(HERE, "results", "transformer"))
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            ap.error("unknown method %r (known: %s)" % (m, ", ".join(METHODS)))
    if a.batch % a.ranks:
        ap.error("--batch must be a multiple of --ranks")

    t_start = time.perf_counter()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    fortunes = tiny_gpt.load_fortunes(a.fortunes_dir)
    train, val = tiny_gpt.split_corpus(fortunes, a.val_fraction, a.split_seed)
    args = {
        "ranks": a.ranks, "steps": a.steps, "batch": a.batch, "context": a.context, "layers": a.layers,
        "d_model": a.d_model, "heads": a.heads, "lr": a.lr, "lr_warmup": a.lr_warmup,
        "min_lr_ratio": a.min_lr_ratio, "weight_decay": a.weight_decay, "seed": a.seed,
        "val_seqs": a.val_seqs, "final_val_seqs": a.final_val_seqs, "eval_every": a.eval_every,
        "powersgd_rank": a.powersgd_rank, "powersgd_start": a.powersgd_start, "kept_fraction": a.kept_fraction,
        "hook_overlap": a.hook_overlap, "bucket_view": a.gradient_as_bucket_view, "warmup_steps": a.warmup_steps,
    }
    numel = sum(p.numel() for p in make_model(args).parameters())
    # DDP's buckets (for the no-hook latency term): one, --ddp-bucket-mb holds the model.
    args["ddp_bucket_mb"] = a.ddp_bucket_mb
    args["ddp_buckets"] = max(1, math.ceil(4 * numel / (a.ddp_bucket_mb * 2 ** 20)))
    print("transformer: %d fortunes, train %d bytes, validation %d bytes; gpt %dL d%d h%d ctx %d, %d parameters; "
          "%d gloo ranks, global batch %d x %d, %d steps, AdamW lr %g (warm-up %d, cosine to %g x), wd %g, seed %d"
          % (len(fortunes), len(train), len(val), a.layers, a.d_model, a.heads, a.context, numel, a.ranks, a.batch,
             a.context, a.steps, a.lr, a.lr_warmup, a.min_lr_ratio, a.weight_decay, a.seed), flush=True)
    compute_s, torch_codec = measure_compute(args, train, 3 if a.quick else 8)
    args["compute_s"] = compute_s  # the adaptive local-steps rows' local_compute_s
    args["latency_us"] = a.latency_us
    print("compute per step (one rank's shard, one thread, alone): %.1f ms; codec: fp16 %.2f ms, PowerSGD %.2f ms"
          % (1e3 * compute_s, 1e3 * torch_codec["torch_fp16"], 1e3 * torch_codec["torch_powersgd"]), flush=True)

    have_gravac, why = gravac_available() if any(METHODS[m][0] != "torch" for m in methods) else (True, "")
    if not have_gravac:
        print("note: gravac.torch is not importable (%s); the gravac rows are skipped" % why, flush=True)

    os.makedirs(a.out_dir, exist_ok=True)
    alpha = a.latency_us * 1e-6
    tmp = tempfile.mkdtemp(prefix="gravac-transformer-")
    summary, done = [], []
    try:
        data_npz = os.path.join(tmp, "text.npz")
        np.savez(data_npz, train=train, val=val)
        for method in methods:
            if METHODS[method][0] != "torch" and not have_gravac:
                summary.append({"method": method, "skipped": "gravac.torch not importable"})
                continue
            result = os.path.join(tmp, method + ".json")
            t0 = time.perf_counter()
            try:
                mp.spawn(worker, args=(method, args, os.path.join(tmp, method + ".store"), data_npz, result),
                         nprocs=a.ranks, join=True)
                with open(result) as f:
                    res = json.load(f)
            except Exception as e:
                traceback.print_exc()
                summary.append({"method": method, "skipped": "failed: %s" % str(e).strip().splitlines()[-1][:200]})
                continue
            wall = time.perf_counter() - t0
            codec = res["codec_s"] if res["codec_s"] is not None else torch_codec.get(method, 0.0)
            step_compute = compute_s + codec  # local-steps rows: 0 here, their codec is per exchange row
            if "codec_per_step_s" in res:
                codec = res["codec_per_step_s"]
            times = write_run_csv(os.path.join(a.out_dir, method + ".csv"), res, step_compute, alpha)
            rows = res["rows"]
            steady = rows[min(a.warmup_steps, len(rows) - 1):]
            s = {
                "method": method, "config": res["config"], "final_val_loss": res["final_val_loss"],
                "last_eval_val_loss": rows[-1]["val_loss"], "final_train_loss": rows[-1]["train_loss"],
                "wire_bytes_per_step": statistics.fmean(r["wire"] for r in rows),
                "steady_wire_bytes_per_step": statistics.fmean(r["wire"] for r in steady),
                "payload_bytes_per_step": statistics.fmean(r["payload"] for r in rows),
                "total_wire_bytes": sum(r["wire"] for r in rows),
                "step_ms_measured": 1e3 * statistics.median(r["step_s_slowest"] for r in steady),
                "compute_ms": 1e3 * compute_s, "codec_ms": 1e3 * codec,
                "modeled_s_1g": times["1g"][-1], "modeled_s_100m": times["100m"][-1],
                "steps": len(rows), "numel": res["numel"], "run_wall_s": wall,
                "params_identical_on_ranks": res["params_identical_on_ranks"],
                "powersgd_compress_rate": res.get("powersgd_compress_rate", ""), "blas": res["blas"],
                "_times": times, "_vals": [r["val_loss"] for r in rows], "initial_val_loss": res["initial_val_loss"],
            }
            if METHODS[method][0] == "local":
                s["exchanges"] = res["exchanges"]
                s["periods"] = rounds_of(rows)
                s["steps_after_last_exchange"] = res["steps_after_last_exchange"]
                s["policy_state"] = res["policy_state"]
                s["network"] = METHODS[method][1].get("network", "")
            summary.append(s)
            done.append(method)
            print("  %-18s final val %.4f  wire %10.0f B/step  step %7.1f ms  modeled %7.1f s @1G %8.1f s @100M  "
                  "(%.0f s) [%s]" % (method, s["final_val_loss"], s["wire_bytes_per_step"], s["step_ms_measured"],
                                      s["modeled_s_1g"], s["modeled_s_100m"], wall, res["config"]), flush=True)
            if "periods" in s:
                print("  %-18s %d exchanges, H by round: %s; %d steps after the last; policy: %s"
                      % ("", s["exchanges"], s["periods"], s["steps_after_last_exchange"], s["policy_state"]),
                      flush=True)
            if not res["params_identical_on_ranks"]:
                print("warning: %s: the ranks' parameters differ after training" % method)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    dense = next((s for s in summary if s["method"] == "gravac_dense" and "skipped" not in s), None) or \
        next((s for s in summary if s["method"] == "torch_allreduce" and "skipped" not in s), None)
    for s in summary:
        if "skipped" not in s and dense:
            s["wire_vs_dense"] = s["total_wire_bytes"] / dense["total_wire_bytes"]
            s["time_100m_vs_dense"] = s["modeled_s_100m"] / dense["modeled_s_100m"]
            s["time_1g_vs_dense"] = s["modeled_s_1g"] / dense["modeled_s_1g"]

    # Time to a target validation loss: the first evaluation on the curve at or below it.
    ref = next((s for s in summary if s["method"] == "torch_allreduce" and "skipped" not in s), None) or \
        next((s for s in summary if s["method"] == "gravac_dense" and "skipped" not in s), None)
    if a.target_val_loss:
        targets = [float(t) for t in a.target_val_loss.split(",") if t.strip()]
        target_why = "given"
    elif ref:
        margins = [float(m) for m in a.target_margins.split(",") if m.strip()]
        targets = [ref["last_eval_val_loss"] * (1 + m) for m in margins]
        target_why = "%s's last evaluation (%.4f) x %s" % (ref["method"], ref["last_eval_val_loss"],
                                                           ", x ".join("%g" % (1 + m) for m in margins))
    else:
        targets, target_why = [], "no reference row"
    for s in summary:
        if "skipped" in s:
            continue
        for j, t in enumerate(targets):
            step, t1, t100 = reach(s, t)
            s["target%d_val_loss" % (j + 1)] = t
            s["target%d_step" % (j + 1)] = step if step is not None else ""
            s["target%d_s_1g" % (j + 1)] = t1 if t1 is not None else ""
            s["target%d_s_100m" % (j + 1)] = t100 if t100 is not None else ""
    fields = ["method", "config", "final_val_loss", "last_eval_val_loss", "final_train_loss", "wire_bytes_per_step",
              "steady_wire_bytes_per_step", "payload_bytes_per_step", "total_wire_bytes", "wire_vs_dense",
              "step_ms_measured", "compute_ms", "codec_ms", "modeled_s_1g", "modeled_s_100m", "time_1g_vs_dense",
              "time_100m_vs_dense", "steps", "numel", "run_wall_s", "params_identical_on_ranks",
              "powersgd_compress_rate", "blas", "exchanges", "periods", "steps_after_last_exchange", "network",
              "policy_state"] + ["target%d_%s" % (j + 1, k) for j in range(len(targets))
                                 for k in ("val_loss", "step", "s_1g", "s_100m")] + ["skipped"]
    with open(os.path.join(a.out_dir, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for s in summary:
            w.writerow(s)

    md = ["| method | final val loss | wire B/step | wire / dense | step ms (measured) | compute+codec ms "
          "| modeled s @1 Gbit/s | modeled s @100 Mbit/s | @100M / dense |", "|" + "---|" * 9]
    for s in summary:
        if "skipped" in s:
            md.append("| %s | skipped: %s |||||||| " % (s["method"], s["skipped"]))
            continue
        md.append("| %s | %.4f | %.0f | %s | %.0f | %.0f | %.1f | %.1f | %s |" % (
            s["method"], s["final_val_loss"], s["wire_bytes_per_step"],
            "%.4f" % s["wire_vs_dense"] if "wire_vs_dense" in s else "-", s["step_ms_measured"],
            s["compute_ms"] + s["codec_ms"], s["modeled_s_1g"], s["modeled_s_100m"],
            "%.3f" % s["time_100m_vs_dense"] if "time_100m_vs_dense" in s else "-"))
    table = "\n".join(md)

    # Time to each target, and the local-steps rows' H. An adaptive row was told one network:
    # its figures at the other are in parentheses (it did not choose for that network).
    def cell(s, key, net):
        v = s.get(key, "")
        if v == "":
            return "not reached"
        txt = "%.1f" % v
        return "(%s)" % txt if s.get("network") and s["network"] != net else txt

    head = "| method | final val loss | total wire MB | exchanges | H by round |"
    for j, t in enumerate(targets):
        head += " step to %.3f | s @1G to %.3f | s @100M to %.3f |" % (t, t, t)
    md2 = [head, "|" + "---|" * (5 + 3 * len(targets))]
    for s in summary:
        if "skipped" in s:
            continue
        line = "| %s | %.4f | %.1f | %s | %s |" % (s["method"], s["final_val_loss"], s["total_wire_bytes"] / 1e6,
                                                   s.get("exchanges", "every step"), s.get("periods", "-"))
        for j in range(len(targets)):
            st = s["target%d_step" % (j + 1)]
            line += " %s | %s | %s |" % (st if st != "" else "not reached", cell(s, "target%d_s_1g" % (j + 1), "1g"),
                                        cell(s, "target%d_s_100m" % (j + 1), "100m"))
        md2.append(line)
    table2 = "\n".join(md2)

    # The targets.
    lines = []
    by = {s["method"]: s for s in summary if "skipped" not in s}
    d = by.get("gravac_dense")
    rec = by.get("gravac_recommended")
    if d and rec:
        loss_ok = rec["final_val_loss"] <= d["final_val_loss"] * 1.01
        bytes_ratio = d["total_wire_bytes"] / rec["total_wire_bytes"]
        time_ratio = rec["modeled_s_100m"] / d["modeled_s_100m"]
        lines.append("recommended vs gravac_dense: final val loss %.4f vs %.4f (%+.2f%%, target within 1%%: %s); "
                     "wire bytes %.2fx fewer (target >= 3x: %s); modeled time at 100 Mbit/s %.3fx dense's "
                     "(target <= 0.5x: %s)" % (
                         rec["final_val_loss"], d["final_val_loss"],
                         100 * (rec["final_val_loss"] / d["final_val_loss"] - 1), "met" if loss_ok else "missed",
                         bytes_ratio, "met" if bytes_ratio >= 3 else "missed", time_ratio,
                         "met" if time_ratio <= 0.5 else "missed"))
    else:
        lines.append("recommended vs dense: not evaluated (a gravac row is missing)")
    gp, tp = by.get("gravac_powersgd"), by.get("torch_powersgd")
    if gp and tp:
        rel = gp["final_val_loss"] / tp["final_val_loss"] - 1
        lines.append("gravac_powersgd vs torch_powersgd: final val loss %.4f vs %.4f (%+.2f%%, target within 1%%: "
                     "%s); wire bytes %.0f vs %.0f per step (ratio %.3f)" % (
                         gp["final_val_loss"], tp["final_val_loss"], 100 * rel, "met" if abs(rel) <= 0.01 else "missed",
                         gp["wire_bytes_per_step"], tp["wire_bytes_per_step"],
                         gp["total_wire_bytes"] / tp["total_wire_bytes"]))
    else:
        lines.append("gravac_powersgd vs torch_powersgd: not evaluated (a row is missing)")

    plots = plot(a.out_dir, done)
    wall = time.perf_counter() - t_start
    with open(os.path.join(a.out_dir, "summary.md"), "w") as f:
        f.write("%d steps, %d ranks, %d parameters, compute %.1f ms/step, latency %g us/message; wall time %.0f s\n\n"
                % (a.steps, a.ranks, numel, 1e3 * compute_s, a.latency_us, wall))
        f.write(table + "\n\n")
        f.write("Targets: %s. Time to a target: modeled time at the first evaluation (every %d steps) at or below "
                "it. Adaptive rows: figures for the network they were not told in parentheses.\n\n"
                % (target_why, a.eval_every))
        f.write(table2 + "\n\n")
        for ln in lines:
            f.write("- " + ln + "\n")
    for s in summary:
        if "skipped" in s:
            print("skipped %s: %s" % (s["method"], s["skipped"]))
    print()
    print(table)
    print()
    print("targets: %s" % target_why)
    print(table2)
    print()
    for ln in lines:
        print(ln)
    print("plots: %s" % ", ".join(plots))
    print("\nwall time %.1f s" % wall)
    return 0 if all("skipped" not in s or s["skipped"].startswith("gravac.torch") for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
