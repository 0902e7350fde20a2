#!/usr/bin/env python3
"""torch.topk as a user of PyTorch would write error-feedback top-k, on the data of
bench_cuda_topk (bench_cuda_util.hpp's counter-based Gaussian generator, the same seeds),
under the same dynamics: a fresh gradient every step, the residual carried
(e += g; idx = topk(|e|, k); values = e[idx]; e[idx] = 0), timed with CUDA events once the
residual's norm has settled (1% per step over 8 steps, at most GRAVAC_BENCH_MAX_WARMUP
steps, default 64). Beside it, in the same run, the device's copy of the same N floats:
copy_fraction is the rate of the bytes top-k must move (read g and e, write e and a packet
of k indices and values) over the copy's rate, as in bench_cuda_topk.

  python3 bench/cuda/bench_torch_topk.py [--json FILE] [--reps 5]
"""
import argparse
import json
import math
import os
import sys

import torch

MASK64 = (1 << 64) - 1


def signed(c):
    """A 64-bit constant as torch's int64 holds it."""
    return c - (1 << 64) if c >= 1 << 63 else c


def srl(z, k):
    """Logical right shift of int64 tensors (torch's >> is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def mix64(z):
    """SplitMix64's finaliser on int64 tensors (multiplication wraps as on uint64)."""
    z = (z ^ srl(z, 30)) * signed(0xBF58476D1CE4E5B9)
    z = (z ^ srl(z, 27)) * signed(0x94D049BB133111EB)
    return z ^ srl(z, 31)


def mix64_int(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def fill_gaussian(x, seed, scale):
    """bench_cuda_util.hpp's gaussian_kernel: element i from the counter (seed, i)."""
    n = x.numel()
    key = mix64_int(((seed * 0x9E3779B97F4A7C15) + 1) & MASK64)
    i = torch.arange(n, device=x.device, dtype=torch.int64)
    r = mix64(torch.bitwise_xor(i * signed(0xD1B54A32D192ED03), signed(key)))
    u1 = (srl(r, 40).to(torch.float32) + 1.0) * (1.0 / 16777216.0)
    u2 = (srl(r, 8) & 0xFFFFFF).to(torch.float32) * (1.0 / 16777216.0)
    x.copy_(scale * torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2))


def timed(fn, reps):
    """Median seconds of fn over reps runs, each between two CUDA events."""
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    times.sort()
    return times[len(times) // 2]


def run(n, frac, reps, cap):
    dev = torch.device("cuda")
    k = max(1, min(n, math.floor(frac * n + 0.5)))  # gravac::kept_count
    g = torch.empty(n, device=dev)
    e = torch.empty(n, device=dev)
    fill_gaussian(e, 4, 0.1)
    src, dst = torch.empty(n, device=dev), torch.empty(n, device=dev)
    fill_gaussian(src, 1, 1.0)
    step = [0]

    def fresh():
        fill_gaussian(g, 1000 + step[0], 1.0)
        step[0] += 1

    def ef_topk():
        e.add_(g)
        idx = torch.topk(e.abs(), k, sorted=False).indices
        values = e[idx]
        e[idx] = 0.0
        return values

    norms, steady = [], False
    while len(norms) < cap:
        fresh()
        ef_topk()
        norms.append(torch.linalg.vector_norm(e).item())
        if len(norms) > 8:
            w = norms[-9:]
            change = sum(abs(w[j + 1] - w[j]) / w[j] if w[j] > 0 else 1.0 for j in range(8)) / 8
            if change < 0.01:
                steady = True
                break
    times = []
    for _ in range(reps):
        fresh()
        times.append(timed(ef_topk, 1))
    times.sort()
    t = times[len(times) // 2]
    copy_t = timed(lambda: dst.copy_(src), reps)
    moved = 3.0 * n * 4 + k * 8
    copy_rate = 2.0 * n * 4 / copy_t
    return {"n": n, "fraction": frac, "k": k, "seconds": t, "copy_seconds": copy_t,
            "copy_fraction": (moved / t) / copy_rate, "warmup_steps": len(norms), "steady": steady}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: torch sees no CUDA device")
        return 77
    cap = int(os.environ.get("GRAVAC_BENCH_MAX_WARMUP", "64"))
    results = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'N':>12} {'fraction':>9} {'ms':>9} {'copy ms':>9} {'copy_fraction':>14} {'warm-up':>8}")
    for n in (1 << 24, 1 << 26, 1 << 28):
        for frac in (0.01, 0.001):
            r = run(n, frac, args.reps, cap)
            results.append(r)
            print(f"{n:>12} {frac:>9} {r['seconds'] * 1e3:>9.3f} {r['copy_seconds'] * 1e3:>9.3f} "
                  f"{r['copy_fraction']:>14.3f} {r['warmup_steps']:>7}{'' if r['steady'] else '*'}")
            del r
            torch.cuda.empty_cache()
    print("(* the residual had not settled within the warm-up cap)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
