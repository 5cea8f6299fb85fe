#!/usr/bin/env bash
# The multi-seed trade-off of docs/results/privacy-tradeoff/: each variant at each seed, made and attacked with
# every attack of `sflower attack`, one process and one thread at a time, in portable numerics.
# Usage: [SEEDS="0 1 2 3 4"] [ATTACK="epochs=2"] docs/results/privacy-tradeoff/run.sh RUNS_DIR [variant ...]
#   (default: every variant). Runs land in RUNS_DIR/seed-S/VARIANT; the loop is seed-major (every variant at
#   seed 0, then at seed 1, ...), so a sweep stopped early leaves every variant with the same number of seeds,
#   give or take one. A run whose privacy/attacks.json exists is skipped, so the script resumes.
# SFLOWER: the command that runs sflower (default `sflower`; `python -m simulation.cli` runs a checkout's).
set -euo pipefail
out=${1:?RUNS_DIR}; shift
export OMP_NUM_THREADS=1
SFLOWER=${SFLOWER:-sflower}
COMMON="dataset=mnist-5k model=lenet5 num-clients=4 concurrency=4 partition=iid global-iterations=4 local-iterations=5 batch-size=16 lr=0.05 eval-samples=1000 aux-holdout=1000 privacy-record=true numerics=portable"
U="strategy=splitfed-v1 cut-layers=1,9"
declare -A V=(
  [prefix]="strategy=splitfed-v1 cut-layer=1"
  [prefix-hidden]="strategy=splitfed-v1 cut-layer=1 hide-client-models=true"
  [u-none]="$U"
  [u-hidden]="$U hide-client-models=true"
  [u-max-norm]="$U label-defence=max-norm"
  [u-marvell-0.25]="$U label-defence=marvell label-power=0.25"
  [u-marvell-1]="$U label-defence=marvell label-power=1"
  [u-marvell-4]="$U label-defence=marvell label-power=4"
  [u-marvell-1-perturbed]="$U label-defence=marvell label-power=1 label-defence-tail=perturbed"
  [u-iso-1]="$U label-defence=iso label-noise=1"
  [u-iso-1-perturbed]="$U label-defence=iso label-noise=1 label-defence-tail=perturbed"
  [u-nopeek-100]="$U nopeek-alpha=100"
  [u-noise-0.03]="$U act-clip=50 act-noise=0.03"
  [u-hidden+max-norm]="$U hide-client-models=true label-defence=max-norm"
  [u-max-norm+noise-0.03]="$U label-defence=max-norm act-clip=50 act-noise=0.03"
)
ORDER=(u-none u-hidden u-max-norm u-marvell-1 u-iso-1 u-nopeek-100 u-noise-0.03 u-hidden+max-norm u-max-norm+noise-0.03 prefix prefix-hidden
       u-marvell-0.25 u-marvell-4 u-marvell-1-perturbed u-iso-1-perturbed)
names=("$@"); [ ${#names[@]} -gt 0 ] || names=("${ORDER[@]}")
for seed in ${SEEDS:-0 1 2 3 4}; do
  for name in "${names[@]}"; do
    dir="$out/seed-$seed/$name"
    [ -f "$dir/privacy/attacks.json" ] && continue
    rm -rf "$dir"
    echo "$(date -u +%FT%TZ) seed $seed $name" >&2
    $SFLOWER run -q $COMMON ${V[$name]} seed=$seed output-dir="$dir"
    $SFLOWER attack "$dir" ${ATTACK:-epochs=2}
  done
done
