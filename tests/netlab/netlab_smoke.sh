#!/usr/bin/env bash
# The network lab's smoke test (label netlab): on 2 lab hosts at 1 Gbit/s,
#   1. netlab_probe bytes: what left each host's shaped link is the collective's bytes
#      (plus TCP/IP overhead), so the ranks talked through the link and nothing else did;
#   2. a few training steps of the Fashion-MNIST example end, and every step is recorded;
#   3. a rate schedule's phases are applied in turn;
#   4. the lab is gone afterwards, also after SIGTERM to scripts/netlab mid-job.
# Exit 77 (skipped) with scripts/netlab's reason where the lab cannot be made here.
#   netlab_smoke.sh NETLAB PROBE FASHION_MNIST WORK_DIR
set -euo pipefail
netlab=$1 probe=$2 fmnist=$3 work=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "FAILED: $*" >&2; exit 1; }
labs() { ip netns list 2> /dev/null | awk '$1 ~ /^gravaclab/ {print $1}' | sort; }
rm -rf "$work"
mkdir -p "$work"
before=$(labs)

set +e
timeout 60 "$netlab" --hosts 2 --rate 1000 -- "$probe" bytes --mib 4 --calls 3
rc=$?
set -e
[ "$rc" = 77 ] && exit 77
[ "$rc" = 0 ] || fail "netlab_probe bytes exited $rc"
[ "$(labs)" = "$before" ] || fail "the lab's namespaces are still there after the job: $(labs)"

timeout 60 "$netlab" --hosts 2 --rate 1000 --counters "$work/link.csv" -- "$fmnist" --backend mpi --max-steps 4 \
  --train-subset 512 --test-subset 256 --epochs 1 --network 1gbps --no-plots --no-progress --out "$work/run" ||
  fail "the training job in the lab did not end well"
[ "$(wc -l < "$work/run/steps.csv")" -eq 5 ] || fail "steps.csv does not hold the 4 steps"
# Every byte the run's collectives put on the wire left by the shaped link (the simulated
# network counts them: steps.csv's wire_bytes_sent, which leaves out bookkeeping and evaluation).
awk -F, 'NR == FNR { if (FNR == 1) { for (i = 1; i <= NF; ++i) if ($i == "wire_bytes_sent") c = i; next } w += $c; next }
         FNR > 1 { if ($2 < w) { print "host " $1 " sent " $2 " bytes, the collectives " w; bad = 1 } }
         END { printf "wire bytes of the collectives per rank %.0f\n", w; exit bad || !(w > 0) }' \
  "$work/run/steps.csv" "$work/link.csv" || fail "a host's link carried fewer bytes than its collectives sent"
[ "$(labs)" = "$before" ] || fail "the lab's namespaces are still there after the training job: $(labs)"

# A changing rate: the schedule's phases are applied in turn (each row of the log is a
# change tc accepted), 1000 and 100 Mbit/s alternating every 0.3 s.
"$netlab" --hosts 2 --schedule 1000:0.3,100:0.3 --schedule-log "$work/schedule.csv" -- sleep 1.6 ||
  fail "the job under a schedule did not end well"
awk -F, 'NR > 1 { want = (NR % 2 == 0) ? 1000 : 100; if ($2 != want) bad = 1; n++ }
         END { printf "%d rate changes\n", n; exit bad || n < 4 }' "$work/schedule.csv" ||
  { cat "$work/schedule.csv"; fail "the schedule did not alternate 1000 and 100 Mbit/s at least 4 times"; }

# Interrupted: SIGTERM to the lab while its job runs removes everything it made.
"$netlab" --hosts 2 -- sleep 30 &
pid=$!
for _ in $(seq 100); do [ "$(labs)" != "$before" ] && break; sleep 0.1; done
[ "$(labs)" != "$before" ] || fail "the lab did not come up for the interruption test"
sleep 1
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 143 ] || fail "scripts/netlab exited $rc after SIGTERM, not 143"
[ "$(labs)" = "$before" ] || fail "the lab's namespaces are still there after SIGTERM: $(labs)"
echo "netlab smoke test passed"
