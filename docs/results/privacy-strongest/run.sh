#!/usr/bin/env bash
# The strongest-attack measurements of docs/results/privacy-strongest/ (one seed, one thread).
# Usage: [ATTACK="epochs=5"] docs/results/privacy-strongest/run.sh RUNS_DIR [variant ...]   (default: every variant)
# ATTACK: the options of sflower attack (default: its defaults, a 20-epoch decoder).
set -euo pipefail
out=${1:?RUNS_DIR}; shift
export OMP_NUM_THREADS=1
COMMON="dataset=mnist-5k model=lenet5 num-clients=4 concurrency=4 partition=iid global-iterations=4 local-iterations=5 batch-size=16 lr=0.05 seed=0 eval-samples=1000 aux-holdout=1000 privacy-record=true"
declare -A V=(
  [prefix]="strategy=splitfed-v1 cut-layer=1"
  [u-none]="strategy=splitfed-v1 cut-layers=1,9"
  [u-max-norm]="strategy=splitfed-v1 cut-layers=1,9 label-defence=max-norm"
  [u-iso-1]="strategy=splitfed-v1 cut-layers=1,9 label-defence=iso label-noise=1"
  [u-iso-4]="strategy=splitfed-v1 cut-layers=1,9 label-defence=iso label-noise=4"
  [u-nopeek-100]="strategy=splitfed-v1 cut-layers=1,9 nopeek-alpha=100"
  [u-noise-0.03]="strategy=splitfed-v1 cut-layers=1,9 act-clip=50 act-noise=0.03"
  [u-psl]="strategy=psl cut-layers=1,9"
  [u-hidden]="strategy=splitfed-v1 cut-layers=1,9 hide-client-models=true"
  [prefix-hidden]="strategy=splitfed-v1 cut-layer=1 hide-client-models=true"
)
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(prefix u-none u-max-norm u-iso-1 u-iso-4 u-nopeek-100 u-noise-0.03 u-psl)
for name in "${names[@]}"; do
  sflower run -q $COMMON ${V[$name]} output-dir="$out/$name"
  sflower attack "$out/$name" ${ATTACK:-}
done
PYTHONPATH="${PYTHONPATH:-.}" python "$(dirname "$0")/collect.py" "$out" > "$(dirname "$0")/attacks.csv"
