#!/usr/bin/env bash
# The example's --overlap on under mpiexec with 4 ranks (MPI_THREAD_SERIALIZED: the
# trainer's communication thread calls MPI while backward runs): with the same buckets
# (one per layer), the same fixed --compute-s and --no-codec-time, the final parameters
# equal the synchronous run's bit for bit and so do the CSV rows, times aside (the
# modeled clock and the exposed communication differ by design: that is what overlap
# hides). The exposed communication is at most the total in every step, and less in all.
#   fmnist_overlap_mpi.sh <fashion_mnist> <mpiexec> <work-dir>
set -euo pipefail
exe=$1 mpiexec=$2 work=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$work"
mkdir -p "$work"

fail() {
  echo "fmnist_overlap_mpi: FAILED: $*" >&2
  exit 1
}

# 2 epochs of 20 steps (64 samples a step, 16 per rank), a small MLP, GraVAC + top-k.
args=(--backend mpi --hidden 32 --batch 64 --train-subset 1280 --test-subset 500 --epochs 2 --seed 7
      --compute-s 0.001 --no-codec-time --policy gravac --compressor topk --collective allgather
      --gravac-period 10 --gravac-warmup 5 --no-plots --no-progress --bucket-mb 0)
run() {  # run <name> <args...>: 4 ranks, at most 90 s
  local name=$1
  shift
  timeout -k 5 90 "$mpiexec" -n 4 --oversubscribe "$exe" "${args[@]}" --out "$work/$name" \
    --save-params "$work/$name.params" "$@" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; fail "the run '$name' failed"; }
}
t0=$SECONDS
run off --overlap off
run on --overlap on
grep -q "overlapped with backward, 4 buckets" "$work/on.log" || { cat "$work/on.log"; fail "the run did not overlap"; }
cmp "$work/off.params" "$work/on.params" || fail "the overlapped run's final parameters differ from the synchronous run's"

# The CSV rows without the measured and modeled times (every column ending in _s).
strip() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i ~ /_s$/) drop[i] = 1 }
           { q = index($0, ",\""); tail = ""; line = $0
             if (q) { tail = substr($0, q); line = substr($0, 1, q - 1) }  # the quoted last field
             n = split(line, f, ","); out = ""
             for (i = 1; i <= n; ++i) if (!(i in drop)) out = out f[i] ","
             print out tail }' "$1"
}
for csv in steps.csv epochs.csv; do
  diff <(strip "$work/off/$csv") <(strip "$work/on/$csv") >"$work/$csv.diff" ||
    { cat "$work/$csv.diff"; fail "$csv of the overlapped run differs from the synchronous run's"; }
done
# Exposed <= total in every step; strictly less over the run with overlap, equal without.
check_exposed() {  # check_exposed <steps.csv> <less|equal>
  awk -F, -v want="$2" 'NR == 1 { for (i = 1; i <= NF; ++i) { if ($i == "modeled_comm_s") c = i; if ($i == "modeled_exposed_s") x = i } next }
       { if ($x > $c * (1 + 1e-9) || $x < 0) { print "step " $1 ": exposed " $x " of " $c; bad = 1 } tc += $c; tx += $x }
       END { printf "exposed %.6f s of %.6f s (%.1f%%)\n", tx, tc, 100 * tx / tc
             if (bad || !(c && x)) exit 1
             if (want == "less" && !(tx < tc)) exit 1
             if (want == "equal" && (tx < tc * (1 - 1e-9) || tx > tc * (1 + 1e-9))) exit 1 }' "$1"
}
check_exposed "$work/off/steps.csv" equal || fail "the synchronous run's exposed communication is not all of it"
check_exposed "$work/on/steps.csv" less || fail "the overlapped run hid no communication, or exposed more than the total"
echo "fmnist_overlap_mpi: passed in $(( SECONDS - t0 ))s (parameters and records of --overlap on equal --overlap off's)"
