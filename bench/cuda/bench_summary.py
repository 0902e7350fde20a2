#!/usr/bin/env python3
"""The device benchmarks' figures as Markdown, for scripts/gpu-check's summary: the medians
of bench_cuda_topk, bench_cuda_quantizers and bench_cuda_steps (time, copy_fraction and the
ratios to the peers that each binary measured in its own run), torch.topk's run beside
them, and the issue's targets, each stated as met or missed with its figure (the whole
steps have no target: their ratios are shown as measured).

  python3 bench/cuda/bench_summary.py DIR   (DIR holds bench_cuda_*.json, torch_topk.json)

Each binary's results may be split into one file per benchmark filter, BINARY.FILTER.json
(gpu-check runs the target rows first: BINARY.target.json), read in that order after
BINARY.json. A file cut short (a run stopped mid-way) gives its complete entries; a missing
or unreadable one is named, not fatal: the summary shows whatever ran.
"""
import glob
import json
import os
import sys

COUNTERS = ("copy_fraction", "speedup_vs_unfused", "speedup_vs_sort", "k_error", "warmup_steps", "steady")
# bench_cuda_steps: AR-Topk against the dense step, the asynchronous step against the synchronous one.
STEP_COUNTERS = ("step_s", "ratio_to_dense", "copy_fraction", "ratio_to_sync", "hidden_fraction", "backward_s",
                 "buckets", "warmup_steps", "steady")


def read_entries(path):
    """(the "benchmarks" entries of a Google Benchmark JSON file, a note or None). The
    reporter writes entries as runs end, so a file cut short keeps the complete ones."""
    with open(path, errors="replace") as f:
        text = f.read()
    try:
        return json.loads(text).get("benchmarks", []), None
    except ValueError:
        pass
    start = text.find('"benchmarks"')
    start = text.find("[", start) if start >= 0 else -1
    if start < 0:
        return [], "no complete result (cut short, or not JSON)"
    decoder, entries, i = json.JSONDecoder(), [], start + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            entry, i = decoder.raw_decode(text, i)
        except ValueError:
            break
        if isinstance(entry, dict):
            entries.append(entry)
    return entries, f"cut short: {len(entries)} complete entries read"


def result_files(d, binary):
    """DIR/BINARY.json, then DIR/BINARY.target.json, then the other filters' files by name."""
    files = glob.glob(os.path.join(d, glob.escape(binary) + ".*.json"))
    files.sort(key=lambda f: (not f.endswith(".target.json"), f))
    plain = os.path.join(d, binary + ".json")
    return ([plain] if os.path.exists(plain) else []) + files


def medians(d, binary, notes):
    """{benchmark name without the aggregate suffix: its median row} over every result file
    of BINARY (the first file that has a name wins: each ratio is to peers of its own run)."""
    files = result_files(d, binary)
    if not files:
        notes.append(f"- {binary}: no results (not run, or stopped before writing)")
    rows = {}
    for path in files:
        try:
            entries, note = read_entries(path)
        except OSError as e:
            entries, note = [], f"unreadable ({e})"
        if note:
            notes.append(f"- {os.path.basename(path)}: {note}")
        for b in entries:
            if b.get("aggregate_name") == "median" and "run_name" in b:
                rows.setdefault(b["run_name"].replace("/manual_time", ""), b)
    return rows


def table(rows, counters=COUNTERS):
    out = ["| benchmark | median µs | " + " | ".join(counters) + " |", "|---|---:|" + "---:|" * len(counters)]
    for name, b in rows.items():
        cells = [f"{b[c]:.3g}" if c in b else "" for c in counters]
        out.append(f"| {name} | {b.get('real_time', 0):.1f} | " + " | ".join(cells) + " |")
    return out


def verdict(ok, text):
    return f"- {'met' if ok else '**missed**'}: {text}"


def main():
    d = sys.argv[1]
    notes = []
    topk = medians(d, "bench_cuda_topk", notes)
    quant = medians(d, "bench_cuda_quantizers", notes)
    steps = medians(d, "bench_cuda_steps", notes)
    lines = ["## Device benchmarks (medians of 3; ratios to peers measured in the same run)", ""]
    lines += table(topk) + [""] + table(quant) + [""]
    if steps:
        lines += ["Whole steps on one rank (bench_cuda_steps: ratio_to_dense = AR-Topk / dense step, "
                  "ratio_to_sync = asynchronous / synchronous step, hidden_fraction = (sync - async) / "
                  "(sync - backward)):", ""]
        lines += table(steps, STEP_COUNTERS) + [""]
    torch_path = os.path.join(d, "torch_topk.json")
    torch_rows = {}
    t = None
    if os.path.exists(torch_path):
        try:
            with open(torch_path) as f:
                t = json.load(f)
        except ValueError:  # written once at the end: cut short only if stopped while writing
            notes.append("- torch_topk.json: unreadable (cut short)")
    if t is not None:
        lines += [f"torch.topk ({t.get('torch')}, {t.get('device')}), a separate process right after:", "",
                  "| N | fraction | ms | copy ms | copy_fraction | warm-up steps | steady |", "|---:|---:|---:|---:|---:|---:|---|"]
        for r in t.get("results", []):
            torch_rows[(r["n"], r["fraction"])] = r
            lines.append(f"| {r['n']} | {r['fraction']} | {r['seconds'] * 1e3:.3f} | {r['copy_seconds'] * 1e3:.3f} | "
                         f"{r['copy_fraction']:.3f} | {r['warmup_steps']} | {r['steady']} |")
        lines.append("")
    if notes:
        lines += ["Result files:", ""] + notes + [""]
    lines += ["## Targets (H200)", ""]
    fused = topk.get(f"BM_topk_cuda/{1 << 26}/100/1")
    if fused:
        cf = fused.get("copy_fraction", 0)
        lines.append(verdict(cf >= 0.5, f"fused EF top-k, 2^26, 1%, whole buffer: copy_fraction {cf:.3f} (target >= 0.5)"))
        if "speedup_vs_unfused" in fused:
            s = fused["speedup_vs_unfused"]
            lines.append(verdict(s >= 2, f"speedup over add + cub::DeviceTopK + gather + zero: {s:.2f}x (target >= 2)"))
        else:
            lines.append("- not measured: the unfused path (bench_cuda_topk built without cub::DeviceTopK)")
        tr = torch_rows.get((1 << 26, 0.01))
        if tr:
            # Across two processes: each time is also shown against its own run's copy.
            s = tr["seconds"] / (fused["real_time"] * 1e-6)
            lines.append(verdict(s > 1, f"faster than torch.topk: torch {tr['seconds'] * 1e3:.3f} ms / fused "
                                        f"{fused['real_time'] / 1e3:.3f} ms = {s:.2f}x (copy_fraction {tr['copy_fraction']:.3f} "
                                        f"against {cf:.3f})"))
        else:
            lines.append("- not measured: torch.topk (no result: see its row in the steps)")
    else:
        lines.append("- not measured: BM_topk_cuda/2^26/1%/whole buffer")
    for name, b in quant.items():
        if name.startswith("BM_copy"):
            continue
        cf = b.get("copy_fraction", 0)
        lines.append(verdict(cf >= 0.6, f"{name}: copy_fraction {cf:.3f} (target >= 0.6)"))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
