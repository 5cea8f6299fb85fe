#!/usr/bin/env bash
# The chaos test (docs/how-to/checkpoints.md, "The chaos test"): for each strategy, a deployed run on the virtual
# clock (3 SuperNodes on loopback, TLS and node authentication on, the session transport) in which sflower deploy
# SIGKILLs SuperNodes at random (each restarted) and the ServerApp once (resumed against the same SuperLink and
# SuperNodes), beside the same run in one process without any fault. The two metrics.csv must be equal in every
# column but wall_time_s.
# Run from the repository root: bash docs/results/chaos/run.sh [WORKDIR] [STRATEGY...]
# Writes WORKDIR/<strategy>/{deployed,inprocess} (default /tmp/chaos) and copies each side's metrics.csv and
# summary.json, and deploy.json, to docs/results/chaos/<strategy>/, then writes docs/results/chaos/verdict.csv.
set -euo pipefail
W=${1:-/tmp/chaos}
shift || true
STRATEGIES=${*:-gas splitfed-v1 psl ringsfl}
HERE=docs/results/chaos
KEYS="dataset=mnist-5k model=lenet5 cut-layer=2 concurrency=2 partition=iid local-iterations=2 batch-size=8
      global-iterations=40 eval-samples=200 covariance=diagonal seed=1 clock=virtual"
# one torch thread everywhere: in numerics=fast the thread count changes the server side's rounding
export OMP_NUM_THREADS=1
for s in $STRATEGIES; do
  rm -rf "$W/$s"; mkdir -p "$W/$s"
  sflower deploy nodes=3 strategy="$s" $KEYS transport=session checkpoint-every=1 node-loss=rollback \
    chaos=2 chaos-seed=1 restart-after=2 kill-server-after=8 timeout=1500 run-dir="$W/$s/deployed"
  sflower run -q num-clients=3 strategy="$s" $KEYS output-dir="$W/$s/inprocess"
  mkdir -p "$HERE/$s"
  cp "$W/$s/deployed/out/metrics.csv" "$HERE/$s/deployed-metrics.csv"
  cp "$W/$s/deployed/out/summary.json" "$HERE/$s/deployed-summary.json"
  cp "$W/$s/deployed/deploy.json" "$HERE/$s/deploy.json"
  cp "$W/$s/inprocess/metrics.csv" "$HERE/$s/inprocess-metrics.csv"
done
python - "$HERE" $STRATEGIES <<'PY'
import csv, json, sys
from pathlib import Path
here, strategies = Path(sys.argv[1]), sys.argv[2:]
def cols(p):
    rows = list(csv.reader(open(p)))
    return {n: [r[i] for r in rows[1:]] for i, n in enumerate(rows[0])}
rows = [["strategy", "rows", "node_kills", "serverapp_kills", "columns_that_differ"]]
for s in strategies:
    a, b = cols(here / s / "deployed-metrics.csv"), cols(here / s / "inprocess-metrics.csv")
    differ = [k for k in b if k != "wall_time_s" and a.get(k) != b[k]]
    d = json.loads((here / s / "deploy.json").read_text())
    rows.append([s, len(b["global_iteration"]), d["node_kills"], d["server_kills"], " ".join(differ) or "none"])
with open(here / "verdict.csv", "w", newline="") as fh:
    csv.writer(fh).writerows(rows)
print(open(here / "verdict.csv").read())
PY
