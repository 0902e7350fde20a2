#!/usr/bin/env bash
# What users of a week-long job fear, on a tiny training: under mpiexec with 4 ranks, one
# rank is killed with SIGKILL in the middle of an epoch. Every rank must end within 30 s
# with a non-zero exit and a message naming the killed rank; the newest checkpoint is then
# damaged on one rank (truncated), and --resume must report it, fall back to the previous
# checkpoint and end with the final parameters of a run that never stopped, bit for bit,
# and the same records (times and wire bytes aside; test_fmnist_resume compares those).
#   fmnist_fault_kill.sh <fashion_mnist> <mpiexec> <work-dir> [<more example options>...]
# The options after the work directory are given to every run (test_fmnist_fault_kill_overlap:
# --overlap on --bucket-mb 0, so that the surviving ranks wait inside an asynchronous step,
# their communication threads in a collective with the dead rank).
# The kill is deterministic: the example's --fault-kill-rank 2 --fault-kill-step 30 makes
# rank 2 send itself SIGKILL just before step 30 (checkpoints every 7 steps: 21 and 28 kept).
set -euo pipefail
exe=$1 mpiexec=$2 work=$3
shift 3
extra=("$@")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$work"
mkdir -p "$work"
ck=$work/checkpoints

fail() {
  echo "fmnist_fault_kill: FAILED: $*" >&2
  exit 1
}

# 3 epochs of 20 steps (64 samples a step, 16 per rank), a small MLP, GraVAC + top-k. The
# modeled clocks charge no measured time (--no-codec-time, fixed --compute-s), so every
# decision depends on the data alone.
args=(--backend mpi --hidden 32 --batch 64 --train-subset 1280 --test-subset 500 --epochs 3 --seed 7
      --compute-s 0.001 --no-codec-time --policy gravac --compressor topk --collective allgather
      --gravac-period 10 --gravac-warmup 5 --no-plots --no-progress "${extra[@]}")
run() {  # run <log> <args...>: 4 ranks, at most 90 s (a backstop: the checks below are tighter)
  local log=$1
  shift
  timeout -k 5 90 "$mpiexec" -n 4 --oversubscribe "$exe" "${args[@]}" "$@" >"$log" 2>&1
}
t0=$SECONDS

# 1. The reference: no checkpoints, never stopped.
run "$work/reference.log" --out "$work/reference" --save-params "$work/reference.params" ||
  { cat "$work/reference.log"; fail "the reference run failed"; }

# 2. Checkpoints every 7 steps; rank 2 dies before step 30. The time is taken from the
# moment rank 2 announces its death (polled in the log) to the end of the job.
run "$work/killed.log" --out "$work/killed" --save-params "$work/killed.params" \
    --checkpoint-dir "$ck" --checkpoint-every 7 --fault-kill-rank 2 --fault-kill-step 30 &
job=$!
killed_at=""
while kill -0 "$job" 2>/dev/null; do
  if [ -z "$killed_at" ] && grep -q "rank 2: --fault-kill-rank: sending SIGKILL" "$work/killed.log"; then
    killed_at=$(date +%s.%N)
  fi
  sleep 0.1
done
set +e
wait "$job"
rc=$?
set -e
ended_at=$(date +%s.%N)
cat "$work/killed.log"
grep -q "rank 2: --fault-kill-rank: sending SIGKILL" "$work/killed.log" || fail "rank 2 did not reach step 30"
[ -n "$killed_at" ] || killed_at=$ended_at  # the job ended within one poll of the kill
elapsed=$(awk -v a="$killed_at" -v b="$ended_at" 'BEGIN { printf "%.1f", b - a }')
echo "fmnist_fault_kill: every rank had ended ${elapsed}s after the kill; exit status $rc"
[ "$rc" -ne 0 ] || fail "the job with a killed rank exited with status 0"
awk -v e="$elapsed" 'BEGIN { exit !(e < 30) }' || fail "the ranks took ${elapsed}s to end after the kill (more than 30 s)"
# The launcher's own report (not the example's line above) must name the rank and the signal.
# Whole outputs, not `a | grep -q`: under pipefail that fails when grep stops reading early.
messages=$(grep -v -- "--fault-kill-rank" "$work/killed.log" || true)
grep -Eq "rank 2.*(signal 9|Killed)" <<< "$messages" ||
  fail "no message names the killed rank 2 and its signal"
# No process of the job may be left: none whose command line names its checkpoint
# directory (read from /proc, so that no procps is needed).
left=()
for p in /proc/[0-9]*; do
  cmdline=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null || true)
  if grep -qF -e "--checkpoint-dir $ck " <<< "$cmdline"; then left+=("${p#/proc/}"); fi
done
[ ${#left[@]} -eq 0 ] || fail "processes of the killed job are still running: ${left[*]}"
[ ! -e "$work/killed.params" ] || fail "the killed job wrote final parameters"
for r in 0 1 2 3; do
  for s in 0000000021 0000000028; do
    for kind in run gravac; do
      [ -s "$ck/step-$s.rank-$r.$kind" ] || fail "checkpoint file step-$s.rank-$r.$kind is missing"
    done
  done
done
[ -z "$(find "$ck" -name 'step-0000000014.*')" ] || fail "checkpoints older than the last two were kept"

# 3. Rank 1's newest run file loses its second half, as if the disk had filled up.
f=$ck/step-0000000028.rank-1.run
truncate -s $(( $(stat -c %s "$f") / 2 )) "$f"

# 4. Resume: the truncated checkpoint is reported, step 21 is used, the run ends as the reference.
run "$work/resumed.log" --out "$work/killed" --save-params "$work/killed.params" \
    --checkpoint-dir "$ck" --checkpoint-every 7 --resume ||
  { cat "$work/resumed.log"; fail "the resumed run failed"; }
cat "$work/resumed.log"
grep -q "rank 1: .*step-0000000028.rank-1.run' is unusable: truncated" "$work/resumed.log" ||
  fail "the truncated checkpoint was not reported"
grep -q "resuming from the checkpoint of step 21" "$work/resumed.log" || fail "the run did not resume from step 21"
cmp "$work/reference.params" "$work/killed.params" ||
  fail "the resumed run's final parameters differ from the uninterrupted run's"

# The CSV rows without the measured and modeled times and the wire bytes (the first step
# after a resume sends no previous-step times in gravac's control block: a few bytes fewer).
strip() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i ~ /(_s|wire_bytes_.*)$/) drop[i] = 1 }
           { q = index($0, ",\""); tail = ""; line = $0
             if (q) { tail = substr($0, q); line = substr($0, 1, q - 1) }  # the quoted last field
             n = split(line, f, ","); out = ""
             for (i = 1; i <= n; ++i) if (!(i in drop)) out = out f[i] ","
             print out tail }' "$1"
}
for csv in steps.csv epochs.csv; do
  diff <(strip "$work/reference/$csv") <(strip "$work/killed/$csv") >"$work/$csv.diff" ||
    { cat "$work/$csv.diff"; fail "$csv of the resumed run differs from the uninterrupted run's"; }
done
[ "$(wc -l <"$work/killed/steps.csv")" -eq 61 ] || fail "steps.csv of the resumed run does not hold 60 steps"
echo "fmnist_fault_kill: passed in $(( SECONDS - t0 ))s (the job ended ${elapsed}s after the kill;" \
     "parameters and records of the resumed run equal the uninterrupted run's)"
