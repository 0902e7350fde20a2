#!/usr/bin/env bash
# The overlap run on MPI: the example's CNN on 4 MPI processes under a modeled
# 1 Gbit/s network, gravac's buckets (BUCKET_MB MiB, default 0.1: the CNN's fc layers in
# one bucket, its convolutions in another; 0 for one per layer) aggregated after backward
# (--overlap off) and overlapped with it (--overlap on, MPI_THREAD_SERIALIZED), from the
# same seed. Prints, per method, the modeled communication of the synchronous run, the
# exposed part with overlap and their ratio (the target: at most 30%), and checks that
# both runs end with the same parameters. Each run calibrates its own modeled compute and
# layer ready times (median of 7 backward passes, the slowest rank), as the example does.
# On demand, not in CTest: about 2-4 minutes on 2 cores.
#   bench/reproduce/overlap_mpi.sh [<fashion_mnist>] [<out-dir>] [<more example options>...]
set -euo pipefail
exe=${1:-build/examples/fashion_mnist/fashion_mnist}
out=${2:-out/overlap_mpi}
shift $(( $# < 2 ? $# : 2 ))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$out"
common=(--backend mpi --model cnn --network 1gbps --epochs 2 --train-subset 19200 --test-subset 2000 --batch 128
        --seed 1 --bucket-mb "${BUCKET_MB:-0.1}" --no-plots --no-progress "$@")
sum() {  # sum <epochs.csv> <column>
  awk -F, -v col="$2" 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == col) c = i; next } { s += $c } END { printf "%.6f", s }' "$1"
}
echo "CNN, 4 MPI ranks, 1 Gbit/s, --bucket-mb ${BUCKET_MB:-0.1}"
printf "%-8s %22s %22s %18s %16s\n" method "sync comm. (s)" "exposed, overlap (s)" "exposed / total" "params equal"
for method in dense gravac; do
  case $method in
    dense) m=(--compressor identity --collective dense_allreduce --policy fixed --kept-fraction 1) ;;
    gravac) m=(--compressor topk --collective allgather --policy gravac) ;;
  esac
  for ov in off on; do
    mpiexec -n 4 --oversubscribe "$exe" "${common[@]}" "${m[@]}" --overlap $ov --out "$out/$method-$ov" \
      --save-params "$out/$method-$ov.params" >"$out/$method-$ov.log" 2>&1 ||
      { cat "$out/$method-$ov.log"; echo "overlap_mpi: the run $method --overlap $ov failed" >&2; exit 1; }
  done
  total=$(sum "$out/$method-off/epochs.csv" modeled_comm_s)
  total_on=$(sum "$out/$method-on/epochs.csv" modeled_comm_s)
  exposed=$(sum "$out/$method-on/epochs.csv" modeled_exposed_s)
  same=no
  cmp -s "$out/$method-off.params" "$out/$method-on.params" && same=yes
  ratio=$(awk -v x="$exposed" -v t="$total_on" 'BEGIN { printf "%.1f%%", 100 * x / t }')
  printf "%-8s %22s %22s %18s %16s\n" "$method" "$total" "$exposed" "$ratio" "$same"
done
echo "(exposed / total: of the overlapped run's own modeled communication; logs and CSVs in $out)"
