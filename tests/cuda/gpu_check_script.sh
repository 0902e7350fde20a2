#!/usr/bin/env bash
# scripts/gpu-check against a fake kit whose binaries are shell stubs (label scripts, a few
# seconds, no GPU and no build needed):
#   1. no GPU, a tiny budget: a summary with one row per planned step (the machine step,
#      the GPU query saying "no GPU", every later step "skipped: no GPU"), exit 3, within
#      the budget;
#   2. a budget too small for any step: still a row per step, each "not run", exit 1;
#   3. stubs that report a GPU: every step runs in the planned order, and a benchmark's
#      JSON cut short still gives its complete rows in the summary's tables.
#   gpu_check_script.sh GPU_CHECK WORK_DIR
set -euo pipefail
check=$1 work=$2
fail() { echo "FAILED: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"

# The kit's layout (scripts/gpu-kit). Each binary does what the real one does when
# cudaGetDeviceCount finds no device (tests/cuda/cuda_test_main.cpp, nccl_test_main.cpp,
# bench/cuda/bench_cuda_util.hpp): print why and exit 77. With FAKE_GPU=1 it passes instead,
# logs its command line, and a benchmark writes a JSON file cut off after its first entry.
kit=$work/kit
mkdir -p "$kit/bin"
printf 'gravac GPU kit\nbuilt: fake kit of gpu_check_script.sh\n' > "$kit/manifest.txt"
cat > "$work/stub" << 'EOF'
#!/usr/bin/env bash
if [ "${FAKE_GPU:-0}" != 1 ]; then
  echo "SKIPPED: no CUDA device visible (no CUDA-capable device is detected)"
  exit 77
fi
echo "${0##*/} $*" >> "$FAKE_CALLS"
for a in "$@"; do
  case $a in
    --benchmark_out=*)
      printf '{\n "context": {},\n "benchmarks": [\n  {"name": "%s", "run_name": "BM_stub_%s/1/manual_time", "aggregate_name": "median", "real_time": 12.5},\n  {"name": "BM_' \
        "${0##*/}" "${0##*/}" > "${a#*=}" ;;
  esac
done
exit 0
EOF
for b in test_cuda_kernels test_cuda_adacomp test_cuda_quantizers test_nccl test_nccl_compressed \
         bench_cuda_topk bench_cuda_quantizers bench_cuda_steps; do
  install -m 755 "$work/stub" "$kit/bin/$b"
done
# compute-sanitizer --tool T --error-exitcode N BINARY ARGS: logs the tool, runs BINARY ARGS
# (--version and the like do nothing).
cat > "$work/fake-sanitizer" << 'EOF'
#!/bin/sh
[ "$1" = --tool ] || exit 0
echo "compute-sanitizer $2" >> "$FAKE_CALLS"
shift 4
exec "$@"
EOF
chmod +x "$work/fake-sanitizer"
# PyTorch that does not import, so torch_topk's step is skipped at once wherever this runs.
mkdir -p "$work/notorch/torch"
echo 'raise ImportError("not this one (gpu_check_script.sh)")' > "$work/notorch/torch/__init__.py"
export GRAVAC_COMPUTE_SANITIZER=$work/fake-sanitizer PYTHONPATH=$work/notorch FAKE_CALLS=$work/calls.txt

# run NAME BUDGET [ENV...]: runs gpu-check into WORK/NAME; sets rc, took and summary.
run() {
  local name=$1 t0
  export GRAVAC_CHECK_BUDGET=$2
  shift 2
  t0=$(date +%s)
  rc=0
  env "$@" "$check" --kit "$kit" "$work/$name" > "$work/$name.log" 2>&1 || rc=$?
  took=$(( $(date +%s) - t0 ))
  summary=$work/$name/summary.md
  echo "== $name: rc $rc, $took s of a $GRAVAC_CHECK_BUDGET s budget"
  cat "$work/$name.log"
  [ -f "$summary" ] || fail "$name: no summary.md"
  [ -f "$work/$name/logs.tar.gz" ] || fail "$name: no logs.tar.gz"
  [ "$took" -le "$GRAVAC_CHECK_BUDGET" ] || fail "$name: took $took s, over the $GRAVAC_CHECK_BUDGET s budget"
}
# The planned steps, in order, from the plan gpu-check prints first.
planned() { sed -n '/^plan /,/^$/s/^  \([^:]*\): .*/\1/p' "$work/$1.log"; }
# The status cell of step $2's row in run $1's summary; fails unless there is exactly one row.
status_of() {
  local rows
  rows=$(awk -F' [|] ' -v s="$2" '$1 == "| " s {print $3}' "$work/$1/summary.md")
  [ "$(grep -c . <<< "$rows")" -eq 1 ] || fail "$1: step $2 has $(grep -c . <<< "$rows") rows in the summary, not one"
  echo "$rows"
}
# Every row of the summary's step table belongs to a planned step.
rows_are_planned() {
  local rows
  rows=$(sed -n '/^| step |/,/^$/p' "$work/$1/summary.md" | awk -F' [|] ' 'NR > 2 && NF > 1 {sub(/^[|] /, "", $1); print $1}')
  [ "$rows" = "$(planned "$1")" ] || fail "$1: the summary's rows are not the planned steps in order"
}

# 1. No GPU, a tiny budget.
run nogpu 20
steps=$(planned nogpu)
[ "$(grep -c . <<< "$steps")" -ge 20 ] || fail "nogpu: the plan lists $(grep -c . <<< "$steps") steps"
[ "$(head -3 <<< "$steps" | tr '\n' ' ')" = "machine detect smoke " ] || fail "nogpu: the plan does not start machine, detect, smoke"
[ "$(tail -1 <<< "$steps")" = sanitize_racecheck_test_nccl ] || fail "nogpu: the sanitizer is not last"
[ "$rc" -eq 3 ] || fail "nogpu: rc $rc, expected 3"
grep -q "no NVIDIA GPU" "$summary" || fail "nogpu: the summary does not say 'no NVIDIA GPU'"
rows_are_planned nogpu
[[ $(status_of nogpu machine) =~ ^(passed|\*\*failed) ]] || fail "nogpu: machine: $(status_of nogpu machine)"
[[ $(status_of nogpu detect) == "no GPU (rc 77): no CUDA device visible"* ]] || fail "nogpu: detect: $(status_of nogpu detect)"
for s in $(tail -n +3 <<< "$steps"); do
  [ "$(status_of nogpu "$s")" = "skipped: no GPU" ] || fail "nogpu: $s: $(status_of nogpu "$s")"
done
# The listing is taken whole first: `tar | grep -q` under pipefail fails whenever grep stops
# reading before tar has written its last line (SIGPIPE), which depends on timing.
listing=$(tar -tzf "$work/nogpu/logs.tar.gz")
grep -q 'machine.log' <<< "$listing" || fail "nogpu: logs.tar.gz has no machine.log"
[ ! -e "$FAKE_CALLS" ] || fail "nogpu: a binary ran past the GPU query"

# 2. A budget that no step fits in (NCCL named, so the search does not spend it).
run nobudget 3 GRAVAC_NCCL_LIB="$work/no-nccl"
[ "$rc" -eq 1 ] || fail "nobudget: rc $rc, expected 1"
rows_are_planned nobudget
for s in $(planned nobudget); do
  [[ $(status_of nobudget "$s") == "**not run**"* || $(status_of nobudget "$s") == "not run"* ]] ||
    fail "nobudget: $s: $(status_of nobudget "$s")"
done

# 3. A GPU (stubs that pass): the steps run in the planned order; the JSON cut short gives its row.
run gpu 60 FAKE_GPU=1
rows_are_planned gpu
for s in $(planned gpu); do
  case $s in
    torch_topk) [[ $(status_of gpu "$s") == "skipped: PyTorch does not import"* ]] || fail "gpu: torch_topk: $(status_of gpu "$s")" ;;
    *) [ "$(status_of gpu "$s")" = passed ] || fail "gpu: $s: $(status_of gpu "$s")" ;;
  esac
done
[ "$rc" -eq 0 ] || fail "gpu: rc $rc, expected 0"
# Each call as its step: the query, the smoke test (or a sanitized run) on the [sanitize]
# cases, a suite, a benchmark, a sanitizer's tool.
ran=$(awk '$1 == "compute-sanitizer" {print $2; next} $2 == "--libidentify" {print "detect"; next}
           $2 == "[sanitize]" {print $1 "[sanitize]"; next} {print $1}' "$FAKE_CALLS" | tr '\n' ' ')
expected="detect test_cuda_kernels[sanitize] test_cuda_kernels test_cuda_adacomp test_cuda_quantizers test_nccl"
expected+=" test_nccl_compressed bench_cuda_topk bench_cuda_quantizers bench_cuda_steps bench_cuda_topk bench_cuda_quantizers"
for tool in memcheck racecheck; do
  for t in test_cuda_kernels test_cuda_adacomp test_cuda_quantizers test_nccl; do expected+=" $tool ${t}[sanitize]"; done
done
if grep -q 'ranks$' <<< "$(planned gpu)"; then
  echo "(order not checked: nvidia-smi here lists GPUs, so the plan has several-rank steps)"
else
  [ "$ran" = "$expected " ] || fail "gpu: the binaries ran in this order: $ran"
fi
for f in bench_cuda_topk.target bench_cuda_quantizers.target bench_cuda_steps.all bench_cuda_topk.rest bench_cuda_quantizers.rest; do
  [ -f "$work/gpu/$f.json" ] || fail "gpu: no $f.json"
done
if command -v python3 > /dev/null; then  # the tables come from bench/cuda/bench_summary.py
  grep -q '^| BM_stub_bench_cuda_topk/1 | 12.5 |' "$summary" || fail "gpu: the cut-short JSON's complete row is not in the summary"
  grep -q 'bench_cuda_topk.target.json: cut short' "$summary" || fail "gpu: the summary does not say the JSON was cut short"
fi
echo "gpu_check_script: passed"
