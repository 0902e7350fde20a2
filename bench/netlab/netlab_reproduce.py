#!/usr/bin/env python3
"""The reproduction on the network lab, in wall-clock time (docs/network_lab.md).

scripts/reproduce --netlab runs this. Three parts, each on real MPI ranks, one per lab host,
every byte between them crossing a tbf-shaped link (scripts/netlab):

  probe   what the links carry (netlab_probe bytes) and the online network estimate fitted
          to timed Allreduces and Allgathers at 1 Gbit/s and 100 Mbit/s (netlab_probe fit);
  algos   which Allreduce algorithm Open MPI's default rules run at 2, 4 and 8 hosts: the
          default's time beside each algorithm forced (coll_tuned_allreduce_algorithm);
  train   the Fashion-MNIST MLP on 4 hosts with measured clocks only: dense SGD, top-k at
          CF 10 and 100, the recommended GraVAC, AdaComp, Accordion and flexible + MOO, at
          1 Gbit/s, at 100 Mbit/s and under a changing rate; the time to the target accuracy
          on the clock, and what the simulated network predicts for the same runs.

Writes out/netlab/results.md (the tables) and the runs' CSVs.
"""
import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETLAB = os.path.join(ROOT, "scripts", "netlab")

# The training setting: the reproduction's MLP, shortened so that every method runs on
# every network, three times for the headline rows, within the lab's 30 minutes.
SCHEDULE = {"--epochs": "6", "--train-subset": "9600", "--lr-milestones": "4"}
QUICK_SCHEDULE = {"--epochs": "2", "--train-subset": "2560", "--lr-milestones": "1"}
TRAIN = ["--model", "mlp", "--batch", "128", "--lr", "0.05", "--no-plots", "--no-progress", "--codec-time", "--backend", "mpi",
         "--collective-timeout", "300"]
# A schedule phase's seconds: 1 Gbit/s and 100 Mbit/s alternating, short enough that every
# run sees many phases (a run takes 3 s to 100 s here).
PHASE_S = 2
NETWORKS = {
    # name: (lab options, the simulated network's spelling for the prediction, description)
    "1gbit": (["--rate", "1000"], "1gbps:0.05ms", "1 Gbit/s"),
    "100mbit": (["--rate", "100"], "0.1gbps:0.05ms", "100 Mbit/s"),
    "changing": (["--schedule", f"1000:{PHASE_S},100:{PHASE_S}"], None,
                 f"1 Gbit/s and 100 Mbit/s alternating every {PHASE_S} s"),
}
GRAVAC = ["--compressor", "topk", "--collective", "allgather", "--policy", "gravac", "--gravac-dense",
          "--gravac-period", "0", "--gravac-time", "measured"]
DENSE = ["--compressor", "identity", "--collective", "dense_allreduce", "--policy", "fixed", "--kept-fraction", "1"]
LOCAL_ADAPTIVE = ["--local-steps", "--compressor", "sparseloco", "--collective", "allgather", "--policy", "fixed",
                  "--local-adaptive", "--local-max-period", "8", "--outer", "averaging", "--sparseloco-decay", "1",
                  "--network-source", "measured", "--local-time", "measured"]
# Open MPI's ring Allreduce, forced: on this lab its default for a gradient of about 1 MB at
# 4 hosts (Rabenseifner) runs at half the link rate (see part algos), which a user can avoid.
RING = ["--mpi-args", "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4"]
METHODS = {
    # key: (name, arguments, static choice, headline row[, lab arguments])
    "dense": ("dense SGD", DENSE, True, True),
    "dense_ring": ("dense SGD, ring Allreduce forced", DENSE, True, True, RING),
    "topk_cf10": ("top-k CF 10", ["--compressor", "topk", "--collective", "allgather", "--policy", "fixed",
                                  "--kept-fraction", "0.1"], True, True),
    "topk_cf100": ("top-k CF 100", ["--compressor", "topk", "--collective", "allgather", "--policy", "fixed",
                                    "--kept-fraction", "0.01"], True, True),
    "gravac": ("GraVAC + dense (recommended)", GRAVAC, False, True),
    "adacomp": ("AdaComp", ["--compressor", "adacomp", "--collective", "allgather", "--policy", "adacomp"], False,
                False),
    "accordion": ("Accordion (top-k 10/100)", ["--compressor", "topk", "--collective", "allgather", "--policy",
                                               "accordion"], False, False),
    "flexible_moo": ("flexible + MOO", ["--compressor", "topk", "--collective", "flexible", "--policy", "moo",
                                        "--network-source", "measured"], False, False),
    # Local steps (--local-steps): DiLoCo at a fixed H as published, and the adaptive policy
    # choosing H and the kept fraction of SparseLoCo-style exchanges from measured clocks.
    "diloco_h10": ("DiLoCo H=10", ["--local-steps", "--compressor", "identity", "--collective", "dense_allreduce",
                                   "--policy", "fixed", "--kept-fraction", "1", "--local-period", "10", "--outer",
                                   "nesterov"], True, False),
    "local_adaptive": ("adaptive local steps (H and ratio)", LOCAL_ADAPTIVE, False, True),
}
ALGOS = {0: "default rules", 1: "basic linear", 2: "reduce + broadcast", 3: "recursive doubling", 4: "ring",
         6: "Rabenseifner"}


def command_args():
    """The arguments scripts/reproduce --netlab was given, for the results' command line: the
    paths (the binaries it passes, the output directory) left out."""
    paths = ("--out", "--bin", "--probe")
    args, skip = [], False
    for x in sys.argv[1:]:
        if skip:
            skip = False
        elif x in paths:
            skip = True
        elif not x.startswith(tuple(p + "=" for p in paths)):
            args.append(x)
    return "".join(" " + x for x in args)


def log(msg):
    print(f"netlab: {msg}", flush=True)


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode == 77:
        sys.stderr.write(p.stderr)
        sys.exit(77)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        raise SystemExit(f"netlab: failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout


def csv_rows(text):
    return list(csv.DictReader(line for line in text.splitlines() if line and not line.startswith("#")))


def part_probe(a, md):
    md.append("## What the links carry, and the online estimate\n")
    out = run([NETLAB, "--hosts", "4", "--rate", "1000", "--", a.probe, "bytes", "--mib", "8", "--calls", "3"])
    rows = csv_rows(out)
    md.append("3 Allreduces of 8 MiB on 4 hosts at 1 Gbit/s: bytes that left each host's link over what the "
              "collective sends (2(N-1)/N of the buffer), and received likewise:\n")
    md.append("| host | link tx / collective | link rx / collective |\n|---|---|---|")
    for r in rows:
        md.append(f"| {r['host']} | {float(r['link_tx_ratio']):.3f} | {float(r['link_rx_ratio']):.3f} |")
    md.append("")
    md.append("A pairwise exchange (MPI_Sendrecv of 4 MiB both ways at once, the step of recursive doubling and "
              "Rabenseifner) against the same bytes one way, 2 hosts at 100 Mbit/s, Open MPI's one TCP connection "
              "per pair of ranks (its default) and two (`--mca btl_tcp_links 2`):\n")
    md.append("| TCP connections per pair | one way | exchange, each way |\n|---|---|---|")
    for links in (1, 2):
        out = run([NETLAB, "--hosts", "2", "--rate", "100", "--mpi-args", f"--mca btl_tcp_links {links}", "--",
                   a.probe, "exchange", "--mib", "4"])
        rate = {r["pattern"]: float(r["mbit_per_s_each_way"]) for r in csv_rows(out)}
        md.append(f"| {links} | {rate['one_way']:.0f} Mbit/s | {rate['exchange']:.0f} Mbit/s |")
    md.append("")
    for rate, forced in ((1000, []), (100, []), (100, RING)):
        out = run([NETLAB, "--hosts", "4", "--rate", str(rate), *forced, "--", a.probe, "fit", "--rate-mbps",
                   str(rate), "--reps", "3" if a.quick else "5"])
        rows = csv_rows(out)
        est = [line for line in out.splitlines() if line.startswith("# online estimate")]
        how = "Open MPI's ring Allreduce forced" if forced else "Open MPI's default rules"
        md.append(f"4 hosts at {rate} Mbit/s, {how}: measured median time of gravac's Allreduce and Allgather "
                  f"against the cost model at {rate} Mbit/s and 50 us (the Allreduce as Open MPI 4.1's rules "
                  "choose it, the Allgather by recursive doubling):\n")
        md.append("| collective | bytes | measured | modeled | measured / modeled |\n|---|---|---|---|---|")
        for r in rows:
            md.append(f"| {r['collective']} | {int(float(r['bytes']))} | {float(r['measured_s']) * 1e3:.2f} ms | "
                      f"{float(r['modeled_s']) * 1e3:.2f} ms | {float(r['measured_over_modeled']):.2f} |")
        md.append("")
        if est:
            md.append(f"The {est[0][2:]}.\n")


def part_algos(a, md):
    md.append("## Which Allreduce Open MPI runs\n")
    sizes = [4096, 65536, 1 << 20, 8 << 20] if not a.quick else [4096, 1 << 20]
    hosts = [2, 4, 8] if not a.quick else [4]
    md.append("Median Allreduce time (5 calls, slowest rank) at 1 Gbit/s under Open MPI's default rules and with "
              "each algorithm forced (`--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm "
              "K`); the closest forced time names what the default ran; the last column is what gravac's model of "
              "Open MPI 4.1's rules (`cost_model::open_mpi_4_1_allreduce`) says it runs.\n")
    md.append("| hosts | bytes | " + " | ".join(ALGOS.values()) + " | closest | model's rule |\n|" +
              "---|" * (len(ALGOS) + 4))
    matches = 0
    for n in hosts:
        times, rule = {}, {}
        for k in ALGOS:
            extra = [] if k == 0 else ["--mpi-args",
                                       f"--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm {k}"]
            out = run([NETLAB, "--hosts", str(n), "--rate", "1000", *extra, "--", a.probe, "time", "--sizes",
                       ",".join(map(str, sizes))])
            for r in csv_rows(out):
                times[(k, int(float(r["bytes"])))] = float(r["measured_s"])
                rule[int(float(r["bytes"]))] = r["open_mpi_4_1_rule"]
        for b in sizes:
            d = times[(0, b)]
            closest = min((k for k in ALGOS if k), key=lambda k: abs(math.log(times[(k, b)] / d)))
            cells = " | ".join(f"{times[(k, b)] * 1e3:.2f} ms" for k in ALGOS)
            md.append(f"| {n} | {b} | {cells} | {ALGOS[closest]} | {rule[b]} |")
            matches += ALGOS[closest] == rule[b]
    md.append(f"\nThe model's rule names the closest forced algorithm in {matches} of {len(hosts) * len(sizes)} cases "
              "(two algorithms of equal cost at a size cannot be told apart by time).\n")


def trace_file(path, seconds):
    """The changing rate as the simulated network's trace, by its virtual time."""
    with open(path, "w") as f:
        f.write("time_s,latency_ms,bandwidth_gbps\n")
        for i in range(int(seconds / PHASE_S) + 1):
            f.write(f"{i * PHASE_S},0.05,{1 if i % 2 == 0 else 0.1}\n")


def one_run(a, net, key, seed, work):
    out_dir = os.path.join(a.out, "runs", net, key, f"seed{seed}")
    os.makedirs(out_dir, exist_ok=True)
    lab, model, _ = NETWORKS[net]
    lab = list(lab) + (METHODS[key][4] if len(METHODS[key]) > 4 else [])
    start = os.path.join(work, f"start-{net}-{key}-{seed}")
    if net == "changing":
        trace = os.path.join(work, "changing.csv")
        trace_file(trace, 3600)
        model = "trace:" + trace
        lab += ["--start-file", start, "--schedule-log", os.path.join(out_dir, "schedule.csv")]
    counters = os.path.join(out_dir, "link_bytes.csv")
    args = TRAIN + METHODS[key][1] + ["--seed", str(seed), "--network", model, "--network-allreduce",
                                      "open-mpi-4.1" if len(METHODS[key]) <= 4 else "ring", "--out", out_dir,
                                      "--mark-start", start]
    if a.data_dir:
        args += ["--data-dir", a.data_dir]
    for k, v in (QUICK_SCHEDULE if a.quick else SCHEDULE).items():
        args += [k, v]
    t0 = time.monotonic()
    run([NETLAB, "--hosts", "4", *lab, "--counters", counters, "--", a.bin, *args])
    wall = time.monotonic() - t0
    with open(os.path.join(out_dir, "epochs.csv")) as f:
        epochs = list(csv.DictReader(f))
    with open(os.path.join(out_dir, "steps.csv")) as f:
        steps = list(csv.DictReader(f))
    with open(counters) as f:
        link = list(csv.DictReader(f))
    return {"net": net, "key": key, "seed": seed, "epochs": epochs, "steps": steps, "launch_s": wall,
            "link_tx_mb": statistics.mean(float(r["tx_bytes"]) for r in link) / 1e6}


def time_to(run_, target, field):
    """(measured, modeled) seconds to the first epoch whose test accuracy reaches target."""
    t = 0.0
    for e in run_["epochs"]:
        t += float(e["train_wall_s"])
        if float(e["test_acc"]) >= target:
            return t, float(e[field])
    return None, None


def mean_sd(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def fmt(m, sd, unit="s", digits=1):
    if m is None:
        return "not reached"
    return f"{m:.{digits}f} ± {sd:.{digits}f} {unit}" if sd else f"{m:.{digits}f} {unit}"


def part_train(a, md, summary):
    seeds = 1 if a.quick else a.seeds
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for net in a.networks.split(","):
            for key, spec in METHODS.items():
                if a.methods and key not in a.methods.split(","):
                    continue
                headline = spec[3]
                for seed in range(1, (seeds if headline else 1) + 1):
                    t0 = time.monotonic()
                    r = one_run(a, net, key, seed, work)
                    runs.append(r)
                    log(f"{net} {key} seed {seed}: final accuracy {float(r['epochs'][-1]['test_acc']):.4f}, "
                        f"{sum(float(e['train_wall_s']) for e in r['epochs']):.1f} s of training "
                        f"({time.monotonic() - t0:.0f} s with start and evaluation)")
    with open(os.path.join(a.out, "runs.json"), "w") as f:
        json.dump([{k: v for k, v in r.items() if k not in ("steps",)} for r in runs], f)

    md.append("## Training on the lab: time to accuracy on the clock\n")
    setting = ("2 epochs of 2560 samples" if a.quick else "6 epochs of 9600 samples (75 steps each), "
               "learning rate 0.05 (x0.1 from epoch 5)")
    md.append(f"The Fashion-MNIST MLP (784-256-128-10), 4 MPI ranks, one per lab host, global batch 128, {setting}, "
              f"momentum 0.9; {seeds} seeds for the static choices, the recommended GraVAC and the adaptive local "
              "steps, one for the others. Every decision uses measured clocks: GraVAC the measured step time, flexible + MOO the "
              "network estimated from its measured collectives. The target is dense's mean final accuracy on "
              "that network minus 1 point. **Measured** is the wall time of the training steps (evaluation left "
              "out); **predicted** is what gravac's simulated network, told the lab's rate and 50 us, charged for "
              "the same run's calls, plus the calibrated compute and the measured compression (the modeled "
              "clock of the same run).\n")
    for net, (_, _, desc) in NETWORKS.items():
        mine = [r for r in runs if r["net"] == net]
        if not any(r["key"] == "dense" for r in mine):
            continue  # a network left out (--networks), or one without the dense baseline (--methods)
        dense_final = [float(r["epochs"][-1]["test_acc"]) for r in mine if r["key"] == "dense"]
        target = statistics.mean(dense_final) - 0.01
        md.append(f"### {desc} (target {target * 100:.2f}%)\n")
        md.append("| method | reached | measured time to target | predicted | predicted / measured | final accuracy "
                  "| link MB sent per host | compute / exchange per step (measured) | exchange predicted |")
        md.append("|---|---|---|---|---|---|---|---|---|")
        rows = {}
        for key, spec in METHODS.items():
            name, static = spec[0], spec[2]
            rs = [r for r in mine if r["key"] == key]
            if not rs:
                continue
            tt = [time_to(r, target, "modeled_time_s") for r in rs]
            meas = mean_sd([m for m, _ in tt])
            pred = mean_sd([p for _, p in tt])
            ratios = [p / m for m, p in tt if m]
            reached = sum(1 for m, _ in tt if m is not None)
            steps = [s for r in rs for s in r["steps"]]
            wall = statistics.mean(float(s["wall_s"]) for s in steps)
            exch = statistics.mean(float(s["exchange_wall_s"]) for s in steps)
            comm = statistics.mean(float(s["modeled_comm_s"]) + float(s["codec_s"]) for s in steps)
            rows[key] = {"name": name, "static": static, "reached": reached, "n": len(rs), "meas": meas[0],
                         "pred": pred[0], "ratio": statistics.mean(ratios) if ratios else None}
            md.append(f"| {name} | {reached}/{len(rs)} | {fmt(*meas)} | {fmt(*pred)} | "
                      f"{statistics.mean(ratios):.2f} |" if ratios else f"| {name} | 0/{len(rs)} | not reached | | |")
            md[-1] += (f" {fmt(*mean_sd([float(r['epochs'][-1]['test_acc']) * 100 for r in rs]), unit='%', digits=2)} "
                       f"| {statistics.mean(r['link_tx_mb'] for r in rs):.0f} | {(wall - exch) * 1e3:.1f} / "
                       f"{exch * 1e3:.1f} ms | {comm * 1e3:.1f} ms |")
        static_rows = [(k, v) for k, v in rows.items() if v["static"]]
        best = max(static_rows, key=lambda kv: (kv[1]["reached"], -(kv[1]["meas"] or math.inf)))
        md.append("")
        la = rows.get("local_adaptive")
        if la and la["meas"] and best[1]["meas"]:
            md.append(f"Adaptive local steps: **{la['meas'] / best[1]['meas']:.2f}x** the best static choice's time to "
                      "target.\n")
        g = rows.get("gravac")
        if g and g["meas"] and best[1]["meas"]:
            vs_best = g["meas"] / best[1]["meas"]
            vs_dense = g["meas"] / rows["dense"]["meas"] if rows["dense"]["meas"] else None
            md.append(f"Best static choice: {best[1]['name']}. The recommended GraVAC: **{vs_best:.2f}x** its time to "
                      f"target" + (f", **{vs_dense:.2f}x** dense's." if vs_dense else ".") + "\n")
            summary.append({"network": desc, "gravac_over_best": vs_best, "gravac_over_dense": vs_dense,
                            "best": best[1]["name"]})
        elif g:
            md.append("The recommended GraVAC did not reach the target in every seed.\n")
            summary.append({"network": desc, "gravac_over_best": None, "gravac_over_dense": None,
                            "best": best[1]["name"]})
        model_misses = [(v["name"], v["ratio"]) for v in rows.values() if v["ratio"]]
        worst = max(model_misses, key=lambda x: abs(math.log(x[1])))
        md.append(f"The model's largest miss on this network: {worst[0]}, predicted / measured {worst[1]:.2f}.\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the fashion_mnist example")
    p.add_argument("--probe", required=True, help="netlab_probe")
    p.add_argument("--out", default=os.path.join(ROOT, "out", "netlab"))
    p.add_argument("--data-dir", default="")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--parts", default="probe,algos,train")
    p.add_argument("--quick", action="store_true", help="development: fewer sizes, hosts, epochs and seeds")
    p.add_argument("--networks", default=",".join(NETWORKS), help="train: the networks, comma-separated")
    p.add_argument("--methods", default="", help="train: only these methods (keys of METHODS; dense is needed for "
                   "the target), comma-separated; empty: all")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    start = time.monotonic()
    md = ["# The reproduction on the network lab", "",
          f"Run {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores ({platform_name()}), `scripts/reproduce "
          f"--netlab{command_args()}`. Each lab host is a network namespace whose link to a private "
          "bridge is shaped with tbf in both directions; Open MPI uses TCP only. The hosts share this machine's "
          "cores: 4 ranks on 2 cores compute at about half the speed of one rank alone.", ""]
    summary = []
    parts = a.parts.split(",")
    if "probe" in parts:
        part_probe(a, md)
    if "algos" in parts:
        part_algos(a, md)
    if "train" in parts:
        part_train(a, md, summary)
    md.append(f"The lab run took {time.monotonic() - start:.0f} s.")
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    log(f"results in {os.path.join(a.out, 'results.md')} ({time.monotonic() - start:.0f} s)")


def platform_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
