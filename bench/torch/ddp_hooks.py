#!/usr/bin/env python3
"""PyTorch DDP communication hooks against gravac's, on the Fashion-MNIST MLP.

Every method trains the same model (examples/fashion_mnist's MLP 784-256-128-10, ReLU,
He-normal weights, zero biases) with the same seed, the same data order and the same SGD
schedule under torch.nn.parallel.DistributedDataParallel with Gloo on --ranks CPU processes
(torch.multiprocessing spawn, one process group per method). Only the gradient exchange
differs:

  torch_allreduce   DDP's built-in allreduce of the fp32 bucket (no hook)
  torch_fp16        default_hooks.fp16_compress_hook
  torch_powersgd    powerSGD_hook.powerSGD_hook (error feedback, warm start)
  gravac_dense      gravac: identity + dense_allreduce + fixed
  gravac_cast16     gravac: cast16 + compressed_allreduce + fixed
  gravac_powersgd   gravac: powersgd + low_rank_allreduce + fixed (powersgd_rank)
  gravac_topk       gravac: topk + allgather + fixed (kept_fraction 0.01)
  gravac_gravac     gravac: topk + allgather + gravac
  gravac_adacomp    gravac: adacomp + allgather + adacomp
  gravac_mxfp8, gravac_mxfp4, gravac_nvfp4
                    gravac: the block-scaled format + compressed_allreduce + fixed; the
                    _no_ef rows with block_error_feedback=False
  gravac_fp8_rowwise
                    gravac: fp8_rowwise + compressed_allreduce + fixed (torchft's scheme)

The gravac rows need the extension `gravac.torch`; when it cannot be imported they are
skipped with a message. Run with Debian's Python, which has torch (python3-torch):

  /usr/bin/python3 bench/torch/ddp_hooks.py --markdown --out out/torch/ddp_hooks.csv
  /usr/bin/python3 bench/torch/ddp_hooks.py --methods torch_allreduce,torch_fp16,torch_powersgd

See bench/torch/README.md for what each column means.
"""
import argparse
import csv
import gzip
import hashlib
import json
import math
import os
import shutil
import statistics
import struct
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
except ImportError:  # pragma: no cover - the message is the point
    sys.exit(
        "ddp_hooks.py: torch is not importable by %s; run it with Debian's Python, which has "
        "python3-torch: /usr/bin/python3 %s" % (sys.executable, " ".join(sys.argv))
    )

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"

# name -> (family, gravac compressor, collective, policy, options builder)
METHODS = {
    "torch_allreduce": ("torch", None),
    "torch_fp16": ("torch", None),
    "torch_powersgd": ("torch", None),
    "gravac_dense": ("gravac", ("identity", "dense_allreduce", "fixed")),
    "gravac_cast16": ("gravac", ("cast16", "compressed_allreduce", "fixed")),
    "gravac_powersgd": ("gravac", ("powersgd", "low_rank_allreduce", "fixed")),
    "gravac_topk": ("gravac", ("topk", "allgather", "fixed")),
    "gravac_gravac": ("gravac", ("topk", "allgather", "gravac")),
    "gravac_adacomp": ("gravac", ("adacomp", "allgather", "adacomp")),
    # The block-scaled formats over the compressed allreduce, with error feedback and
    # without, and torchft's fp8 row-wise scheme (no error feedback).
    "gravac_mxfp8": ("gravac", ("mxfp8", "compressed_allreduce", "fixed")),
    "gravac_mxfp8_no_ef": ("gravac", ("mxfp8", "compressed_allreduce", "fixed")),
    "gravac_mxfp4": ("gravac", ("mxfp4", "compressed_allreduce", "fixed")),
    "gravac_mxfp4_no_ef": ("gravac", ("mxfp4", "compressed_allreduce", "fixed")),
    "gravac_nvfp4": ("gravac", ("nvfp4", "compressed_allreduce", "fixed")),
    "gravac_nvfp4_no_ef": ("gravac", ("nvfp4", "compressed_allreduce", "fixed")),
    "gravac_fp8_rowwise": ("gravac", ("fp8_rowwise", "compressed_allreduce", "fixed")),
    # The same compositions through gravac's C++ trainer without DDP (gravac.torch.Trainer,
    # one step() after backward): the baseline of the hook's overhead.
    "trainer_powersgd": ("trainer", ("powersgd", "low_rank_allreduce", "fixed")),
    "trainer_topk": ("trainer", ("topk", "allgather", "fixed")),
    "trainer_gravac": ("trainer", ("topk", "allgather", "gravac")),
}

# Collectives whose calls are counted (torch.distributed attributes; the hooks look them
# up on the module at call time, so replacing the attribute sees every call).
COUNTED = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "broadcast")

# ----------------------------------------------------------------------------- data


def read_idx_u8(path, rank):
    """An IDX file of unsigned bytes (gzip) as a numpy array, checked like fmnist/idx.hpp."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError("%s: not an IDX file (bad magic)" % path)
    if raw[2] != 0x08:
        raise ValueError("%s: IDX data type %d is not unsigned byte (0x08)" % (path, raw[2]))
    if raw[3] != rank:
        raise ValueError("%s: IDX file has %d dimensions, expected %d" % (path, raw[3], rank))
    dims = struct.unpack(">" + "I" * rank, raw[4 : 4 + 4 * rank])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank)
    if data.size != math.prod(dims):
        raise ValueError("%s: holds %d values, its header says %d" % (path, data.size, math.prod(dims)))
    return data.reshape(dims)


def load_split(data_dir, stem):
    """(images uint8 [n, 784], labels int64 [n]) of one split, checked as dataset.hpp does."""
    images = os.path.join(data_dir, stem + "-images-idx3-ubyte.gz")
    labels = os.path.join(data_dir, stem + "-labels-idx1-ubyte.gz")
    for p in (images, labels):
        if not os.path.exists(p):
            sys.exit(
                "ddp_hooks.py: %s missing. Install the data with `apt-get install dataset-fashion-mnist` "
                "(or scripts/install-deps), or pass --data-dir" % p
            )
    img = read_idx_u8(images, 3)
    lab = read_idx_u8(labels, 1)
    if img.shape[0] != lab.shape[0]:
        raise ValueError("%s holds %d labels but %s holds %d images" % (labels, lab.shape[0], images, img.shape[0]))
    if img.shape[1:] != (28, 28):
        raise ValueError("%s: images are %dx%d, Fashion-MNIST's are 28x28" % (images, img.shape[1], img.shape[2]))
    if lab.max() > 9:
        raise ValueError("%s: a label is outside 0..9" % labels)
    return img.reshape(img.shape[0], 28 * 28), lab.astype(np.int64)


def to_float(pixels_u8):
    """Pixels scaled to [0, 1] exactly as dataset.hpp does (value * (1.0f / 255.0f)), no mean/std."""
    return torch.from_numpy(pixels_u8.astype(np.float32) * np.float32(1.0 / 255.0))


# ---------------------------------------------------------------------------- model


def make_mlp(hidden, seed):
    """examples/fashion_mnist's MLP: Linear+ReLU per hidden layer, linear logits; weights
    N(0, sqrt(2 / fan_in)) (He normal), biases 0. Same distribution as fmnist::model::init,
    not the same bits (that one draws from std::mt19937_64)."""
    sizes = [28 * 28] + list(hidden) + [10]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net:
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0.0, math.sqrt(2.0 / m.in_features), generator=gen)
                m.bias.zero_()
    return net


def loaded_blas():
    """The BLAS library this process has loaded (Debian's torch calls whichever libblas.so.3
    the alternatives system, or LD_LIBRARY_PATH, provides)."""
    torch.ones(2, 2) @ torch.ones(2, 2)
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.rsplit("/", 1)[-1].lower()}
    except OSError:
        return "unknown"
    return ",".join(sorted(os.path.realpath(p) for p in libs)) or "none"


def is_reference_blas(name):
    """Debian's netlib reference BLAS (package libblas3): correct but some 30x slower than OpenBLAS."""
    return "/blas/libblas.so" in name


# ----------------------------------------------------------------------- counting


class CollectiveCounter:
    """Replaces torch.distributed's collectives (COUNTED) by wrappers that add up the bytes
    this rank hands to each call, then call the original. `originals` keeps the unwrapped
    functions for the benchmark's own bookkeeping (never counted)."""

    def __init__(self, world):
        self.world = world
        self.originals = {}
        self.reset()
        for name in COUNTED:
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self.originals[name] = fn
            setattr(dist, name, self._wrap(name, fn))

    def reset(self):
        self.payload = 0.0
        self.wire = 0.0
        self.calls = 0

    def _wrap(self, name, fn):
        n = self.world

        def counted(*args, **kwargs):
            payload = 0
            if name == "all_reduce" or name == "broadcast":
                t = args[0] if args else kwargs["tensor"]
                payload = t.numel() * t.element_size()
            elif name == "all_gather":
                t = args[1] if len(args) > 1 else kwargs["tensor"]
                payload = t.numel() * t.element_size()
            else:  # all_gather_into_tensor / _all_gather_base(output, input)
                t = args[1] if len(args) > 1 else kwargs.get("input_tensor", kwargs.get("input"))
                payload = t.numel() * t.element_size()
            self.calls += 1
            self.payload += payload
            if name == "all_reduce":
                self.wire += 2.0 * (n - 1) / n * payload  # ring: reduce-scatter + allgather
            elif name == "broadcast":
                self.wire += payload  # a pipelined broadcast: every rank forwards the buffer once
            else:
                self.wire += (n - 1) * payload  # ring allgather: own block forwarded N-1 times
            return fn(*args, **kwargs)

        counted.__wrapped__ = fn
        return counted


# ------------------------------------------------------------------------- worker


def gravac_options(method, args):
    if method == "gravac_powersgd":
        return {"powersgd_rank": args["powersgd_rank"]}
    if method == "gravac_topk":
        return {"kept_fraction": args["kept_fraction"]}
    if method.endswith("_no_ef"):
        return {"block_error_feedback": False}
    return {}


def init_gloo_rank(rank, world, store_path):
    """One DDP process: a single compute thread (ranks share the cores) and a Gloo group on loopback."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)


def worker(rank, method, args, store_path, data_npz, result_path):
    world = args["ranks"]
    init_gloo_rank(rank, world, store_path)
    counter = CollectiveCounter(world)
    orig_all_reduce = counter.originals["all_reduce"]
    orig_all_gather = counter.originals["all_gather"]

    data = np.load(data_npz)
    train_x, train_y = data["train_x"], data["train_y"]
    test_x, test_y = data["test_x"], data["test_y"]

    seed = args["seed"]
    torch.manual_seed(seed)
    net = make_mlp(args["hidden"], seed)
    numel = sum(p.numel() for p in net.parameters())
    family = METHODS[method][0]
    model = net if family == "trainer" else torch.nn.parallel.DistributedDataParallel(
        net, gradient_as_bucket_view=args["bucket_view"])
    gv_trainer = None

    ps_state = None
    gv_state = None
    if method == "torch_fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif method == "torch_powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        ps_state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=args["powersgd_rank"],
            start_powerSGD_iter=args["powersgd_start"],
            min_compression_rate=args["powersgd_min_rate"],
            use_error_feedback=True,
            warm_start=True,
            random_seed=seed,
        )
        model.register_comm_hook(ps_state, powerSGD_hook.powerSGD_hook)
    elif METHODS[method][0] == "gravac":
        import gravac.torch as gt  # lazily: only the gravac rows need the extension

        compressor, collective, policy = METHODS[method][1]
        gv_state, hook = gt.ddp_hook(
            model, compressor=compressor, collective=collective, policy=policy, seed=seed,
            overlap=args["hook_overlap"] == "on",
            **gravac_options(method, args)
        )
        model.register_comm_hook(gv_state, hook)
    elif family == "trainer":
        import gravac.torch as gt

        compressor, collective, policy = METHODS[method][1]
        gv_trainer = gt.Trainer(net, compressor=compressor, collective=collective, policy=policy, seed=seed,
                                **gravac_options(method.replace("trainer_", "gravac_"), args))

    opt = torch.optim.SGD(model.parameters(), lr=args["lr"], momentum=args["momentum"],
                          weight_decay=args["weight_decay"])

    batch = args["batch"]
    local = batch // world
    n_train = train_x.shape[0]
    per_epoch = min(args["train_subset"], n_train) if args["train_subset"] else n_train
    steps_per_epoch = per_epoch // batch
    order_rng = np.random.default_rng(seed)  # the same permutation on every rank and for every method

    step_s, payload, wire, calls, reported = [], [], [], [], []
    last_loss_sum, last_loss_n = 0.0, 0
    step = 0
    max_steps = args["max_steps"]
    stop = False
    for epoch in range(args["epochs"]):
        order = order_rng.permutation(n_train)
        last_loss_sum, last_loss_n = 0.0, 0
        for s in range(steps_per_epoch):
            if max_steps and step >= max_steps:
                stop = True
                break
            idx = order[s * batch + rank * local : s * batch + (rank + 1) * local]
            x = to_float(np.asarray(train_x[idx]))
            y = torch.from_numpy(np.asarray(train_y[idx]))
            counter.reset()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # returns once the hook's future (the exchange) is done
            trainer_report = gv_trainer.step() if gv_trainer is not None else None
            opt.step()
            t1 = time.perf_counter()
            step_s.append(t1 - t0)
            if method == "torch_allreduce":
                # DDP's reducer allreduces the fp32 bucket in C++, past the Python wrappers.
                payload.append(4.0 * numel)
                wire.append(2.0 * (world - 1) / world * 4.0 * numel)
                calls.append(counter.calls)
            elif gv_state is not None or trainer_report is not None:
                rep = trainer_report if trainer_report is not None else gv_state.last_report()
                payload.append(float(rep["bytes_sent"]))
                wire.append(float(rep["wire_bytes_sent"]))
                calls.append(counter.calls)
                reported.append(float(rep["dense_bytes"]))
            else:
                payload.append(counter.payload)
                wire.append(counter.wire)
                calls.append(counter.calls)
            last_loss_sum += float(loss.detach())
            last_loss_n += 1
            step += 1
        if stop:
            break

    # Test accuracy on the full test set, each rank evaluating its shard.
    n_test = test_x.shape[0]
    lo, hi = rank * n_test // world, (rank + 1) * n_test // world
    net.eval()
    with torch.no_grad():
        logits = net(to_float(np.asarray(test_x[lo:hi])))
        y = torch.from_numpy(np.asarray(test_y[lo:hi]))
        correct = float((logits.argmax(1) == y).sum())
        test_loss = float(F.cross_entropy(logits, y, reduction="sum"))
    stats = torch.tensor([correct, test_loss, last_loss_sum, float(last_loss_n)], dtype=torch.float64)
    orig_all_reduce(stats)

    # Step times of every rank: slowest rank per step.
    times = torch.tensor(step_s, dtype=torch.float64)
    gathered = [torch.empty_like(times) for _ in range(world)]
    orig_all_gather(gathered, times)
    slowest = torch.stack(gathered).max(0).values.tolist()

    # Parameters must be identical on every rank; a digest to compare runs.
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    dig = torch.tensor([int(digest[:12], 16)], dtype=torch.float64)
    digs = [torch.empty_like(dig) for _ in range(world)]
    orig_all_gather(digs, dig)
    same_params = all(float(d) == float(dig) for d in digs)

    if rank == 0:
        warm = args["warmup_steps"]
        steady = slice(warm, None) if len(step_s) > warm else slice(0, None)
        res = {
            "method": method,
            "ranks": world,
            "steps": len(step_s),
            "steady_steps": len(step_s[steady]),
            "numel": numel,
            "test_accuracy": float(stats[0]) / n_test,
            "test_loss": float(stats[1]) / n_test,
            "train_loss": float(stats[2]) / max(float(stats[3]), 1.0),
            "payload_bytes_per_step": statistics.fmean(payload[steady]),
            "wire_bytes_per_step": statistics.fmean(wire[steady]),
            "warmup_payload_bytes_per_step": statistics.fmean(payload[:warm]) if warm and payload else 0.0,
            "python_collective_calls_per_step": statistics.fmean(calls[steady]),
            "dense_payload_bytes": 4.0 * numel,
            "dense_wire_bytes": 2.0 * (world - 1) / world * 4.0 * numel,
            "step_ms": 1e3 * statistics.median(slowest[steady]),
            "params_identical_on_ranks": same_params,
            "param_digest": digest,
            "blas": loaded_blas(),
        }
        if reported:
            res["gravac_dense_bytes"] = statistics.fmean(reported)
        if ps_state is not None:
            rate, before, after = ps_state.compression_stats()
            res["powersgd_compress_rate"] = rate
        with open(result_path, "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- main


def gravac_available():
    try:
        import gravac.torch  # noqa: F401
    except Exception as e:  # ImportError, or an extension that fails to load
        return False, "%s: %s" % (type(e).__name__, e)
    return True, ""


def fmt_bytes(b):
    return "%.0f" % b


def markdown(rows, world):
    head = ("| method | test acc | train loss | payload B/step | wire B/step | wire / dense | step ms "
            "| step / torch_allreduce |")
    out = [head, "|" + "---|" * 8]
    for r in rows:
        if "skipped" in r:
            out.append("| %s | skipped: %s |||||||" % (r["method"], r["skipped"]))
            continue
        rel = "%.2f" % r["step_ratio_to_torch_allreduce"] if r.get("step_ratio_to_torch_allreduce") else "-"
        out.append("| %s | %.4f | %.4f | %s | %s | %.4f | %.2f | %s |" % (
            r["method"], r["test_accuracy"], r["train_loss"], fmt_bytes(r["payload_bytes_per_step"]),
            fmt_bytes(r["wire_bytes_per_step"]), r["wire_ratio_to_dense"], r["step_ms"], rel))
    return "\n".join(out)


CSV_FIELDS = [
    "method", "test_accuracy", "train_loss", "test_loss", "payload_bytes_per_step", "wire_bytes_per_step",
    "wire_ratio_to_dense", "step_ms", "step_ratio_to_torch_allreduce", "steps", "steady_steps",
    "warmup_payload_bytes_per_step", "python_collective_calls_per_step", "dense_payload_bytes", "dense_wire_bytes",
    "numel", "ranks", "params_identical_on_ranks", "param_digest", "powersgd_compress_rate", "gravac_dense_bytes",
    "blas", "skipped",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma list of: " + ", ".join(METHODS))
    ap.add_argument("--ranks", type=int, default=4, help="DDP processes (Gloo, CPU)")
    ap.add_argument("--epochs", type=int, default=1, help="epochs (the example's default is 5)")
    ap.add_argument("--train-subset", type=int, default=19200,
                    help="samples per epoch (the first of each epoch's permutation, a fresh subset each epoch; "
                         "the default, 150 steps, keeps the whole table to a few minutes on 2 cores); 0 = all 60000")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0 = all epochs)")
    ap.add_argument("--seed", type=int, default=1, help="initialisation and data order (same for every method)")
    ap.add_argument("--batch", type=int, default=128, help="global batch (all ranks together)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--hidden", default="256,128", help="hidden layers of the MLP")
    ap.add_argument("--powersgd-rank", type=int, default=2, help="rank of both PowerSGDs (gravac's default is 2)")
    ap.add_argument("--powersgd-start", type=int, default=2,
                    help="PyTorch PowerSGD's start_powerSGD_iter (1.13 requires > 1 with error feedback or warm start)")
    ap.add_argument("--powersgd-min-rate", type=float, default=1.0,
                    help="PyTorch PowerSGD's min_compression_rate: 1 compresses every weight whose factors are "
                         "smaller than it (gravac's rule); biases are never compressed")
    ap.add_argument("--gradient-as-bucket-view", action="store_true",
                    help="DDP's gradient_as_bucket_view (the gradients live in the buckets: one copy less)")
    ap.add_argument("--hook-overlap", choices=("on", "off"), default="on",
                    help="gravac hooks: overlap with backward on the trainer's thread, or one synchronous step")
    ap.add_argument("--kept-fraction", type=float, default=0.01, help="gravac_topk's kept_fraction")
    ap.add_argument("--warmup-steps", type=int, default=10,
                    help="steps left out of the steady-state bytes and step time (>= --powersgd-start)")
    ap.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    ap.add_argument("--out", help="CSV file, one row per method")
    ap.add_argument("--json", help="JSON file with every row's fields")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    a = ap.parse_args()

    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            ap.error("unknown method %r (known: %s)" % (m, ", ".join(METHODS)))
    if a.ranks < 1 or a.batch % a.ranks:
        ap.error("--batch (%d) must be a positive multiple of --ranks (%d)" % (a.batch, a.ranks))
    if a.powersgd_start < 2:
        ap.error("--powersgd-start must be >= 2: PyTorch's PowerSGDState refuses start_powerSGD_iter <= 1 "
                 "with error feedback or warm start")
    if a.warmup_steps < a.powersgd_start:
        ap.error("--warmup-steps (%d) must be >= --powersgd-start (%d) so that PowerSGD's vanilla-allreduce "
                 "steps stay out of the steady-state bytes" % (a.warmup_steps, a.powersgd_start))
    hidden = [int(h) for h in a.hidden.split(",") if h]

    t_start = time.perf_counter()
    train_x, train_y = load_split(a.data_dir, "train")
    test_x, test_y = load_split(a.data_dir, "t10k")
    per_epoch = min(a.train_subset, len(train_y)) if a.train_subset else len(train_y)
    if per_epoch // a.batch == 0:
        ap.error("the training subset (%d) holds less than one global batch (%d)" % (per_epoch, a.batch))

    # Which 2-D weights PyTorch's PowerSGD compresses at this rank and rate.
    if "torch_powersgd" in methods:
        sizes = [784] + hidden + [10]
        for i in range(len(sizes) - 1):
            n, m = sizes[i + 1], sizes[i]
            r = min(n, m, a.powersgd_rank)
            if not (n + m) * r * a.powersgd_min_rate < n * m:
                print("note: torch_powersgd leaves fc%d.weight (%dx%d) uncompressed at rank %d and "
                      "min_compression_rate %g" % (i + 1, n, m, a.powersgd_rank, a.powersgd_min_rate))

    have_gravac, why = gravac_available() if any(METHODS[m][0] in ("gravac", "trainer") for m in methods) else (True, "")
    if not have_gravac:
        print("note: gravac.torch is not importable (%s); the gravac rows are skipped" % why)

    args = {
        "ranks": a.ranks, "epochs": a.epochs, "train_subset": a.train_subset, "max_steps": a.max_steps,
        "seed": a.seed, "batch": a.batch, "lr": a.lr, "momentum": a.momentum, "weight_decay": a.weight_decay,
        "hidden": hidden, "powersgd_rank": a.powersgd_rank, "powersgd_start": a.powersgd_start,
        "powersgd_min_rate": a.powersgd_min_rate, "kept_fraction": a.kept_fraction,
        "warmup_steps": a.warmup_steps, "hook_overlap": a.hook_overlap,
        "bucket_view": a.gradient_as_bucket_view,
    }
    steps = per_epoch // a.batch * a.epochs
    if a.max_steps:
        steps = min(steps, a.max_steps)
    print("ddp_hooks: mlp(%s), %d gloo ranks, global batch %d, %d steps (%d epoch(s) of %d samples), seed %d, "
          "lr %g, momentum %g, weight decay %g; steady state = steps after the first %d"
          % ("-".join(map(str, [784] + hidden + [10])), a.ranks, a.batch, steps, a.epochs, per_epoch, a.seed, a.lr,
             a.momentum, a.weight_decay, a.warmup_steps), flush=True)

    # One thread per rank: torch's intra-op pool (set in the worker) and OpenBLAS's own.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp = tempfile.mkdtemp(prefix="gravac-ddp-hooks-")
    rows = []
    try:
        data_npz = os.path.join(tmp, "fmnist.npz")
        np.savez(data_npz, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y)
        for method in methods:
            if METHODS[method][0] in ("gravac", "trainer") and not have_gravac:
                rows.append({"method": method, "skipped": "gravac.torch not importable"})
                continue
            store = os.path.join(tmp, method + ".store")  # a fresh FileStore per method
            result = os.path.join(tmp, method + ".json")
            t0 = time.perf_counter()
            try:
                mp.spawn(worker, args=(method, args, store, data_npz, result), nprocs=a.ranks, join=True)
                with open(result) as f:
                    row = json.load(f)
            except Exception as e:  # a failing method leaves a row that says so; the others still run
                traceback.print_exc()
                rows.append({"method": method, "skipped": "failed: %s" % str(e).strip().splitlines()[-1][:200]})
                continue
            row["wire_ratio_to_dense"] = row["wire_bytes_per_step"] / row["dense_wire_bytes"]
            if not row["params_identical_on_ranks"]:
                print("warning: %s: the ranks' parameters differ after training" % method)
            if "gravac_dense_bytes" in row and abs(row["gravac_dense_bytes"] - row["dense_payload_bytes"]) > 0.5:
                print("note: %s reports dense_bytes %.0f, 4*numel is %.0f"
                      % (method, row["gravac_dense_bytes"], row["dense_payload_bytes"]))
            rows.append(row)
            print("  %-16s acc %.4f  train loss %.4f  payload %9.0f B/step  wire %9.0f B/step  step %6.2f ms  "
                  "(%.1f s)" % (method, row["test_accuracy"], row["train_loss"], row["payload_bytes_per_step"],
                                row["wire_bytes_per_step"], row["step_ms"], time.perf_counter() - t0), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    base = next((r for r in rows if r["method"] == "torch_allreduce" and "skipped" not in r), None)
    for r in rows:
        if "skipped" not in r and base:
            r["step_ratio_to_torch_allreduce"] = r["step_ms"] / base["step_ms"]

    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": args, "rows": rows}, f, indent=1)
    for r in rows:
        if "skipped" in r:
            print("skipped %s: %s" % (r["method"], r["skipped"]))
    blas = next((r["blas"] for r in rows if "blas" in r), None)
    if blas:
        print("BLAS: %s" % blas)
        if is_reference_blas(blas):
            print("note: torch runs its matmuls on the reference BLAS (Debian's libblas3): step times are "
                  "dominated by it. `apt-get install libopenblas0-pthread` makes OpenBLAS the system's libblas.so.3")
    if a.markdown:
        print()
        print(markdown(rows, a.ranks))
    print("\nwall time %.1f s" % (time.perf_counter() - t_start))
    return 0 if all("skipped" not in r or r["skipped"].startswith("gravac.torch") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
