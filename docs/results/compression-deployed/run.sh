#!/usr/bin/env bash
# The deployed compression run and its in-process twin (docs/results/compression.md, "Deployed").
# Run from the repository root: bash docs/results/compression-deployed/run.sh [WORKDIR]
# Writes WORKDIR/{deployed,inprocess,inprocess-float32} (default /tmp/compression-deployed) and copies their
# summary.json and metrics.csv here.
set -euo pipefail
W=${1:-/tmp/compression-deployed}
HERE=docs/results/compression-deployed
KEYS="strategy=gas dataset=fashion-mnist data-dir=../shared/data/fashion-mnist model=lenet5 partition=dirichlet
      alpha=0.5 min-partition-size=32 concurrency=3 global-iterations=16 local-iterations=5 batch-size=32
      eval-every=4 eval-samples=2000 compress-up=int8 clock=virtual seed=0"
# the virtual clock makes the two runs comparable number for number; transport=auto picks the session
# transport on the wall clock only, so it is named
rm -rf "$W"
# one torch thread everywhere: in numerics=fast the thread count changes the server side's rounding, and
# the two runs must round alike to be compared number for number
export OMP_NUM_THREADS=1
# 3 SuperNodes on loopback, TLS and node authentication on (sflower deploy's defaults), the session transport
sflower deploy nodes=3 $KEYS transport=session run-dir="$W/deployed"
# the same run in one process (num-clients = the 3 nodes), over Flower's messages
sflower run num-clients=3 $KEYS output-dir="$W/inprocess"
# and in float32, for the bytes compression saves
sflower run num-clients=3 $KEYS compress-up=none output-dir="$W/inprocess-float32"
for side in deployed inprocess inprocess-float32; do
  src="$W/$side"; [ "$side" = deployed ] && src="$W/deployed/out"
  mkdir -p "$HERE/$side"
  cp "$src/summary.json" "$src/metrics.csv" "$HERE/$side/"
done
