#!/usr/bin/env bash
# The main job in-process (clock=wall) and deployed (20 SuperNodes, TLS and authentication on), in the order of
# ORDER (default ABBA), each a fresh command; prints each run's first-to-last metric row seconds.
# Usage (from the checkout, sflower installed): docs/results/main-job-deployed-flwr142/warm-up-2026-11-29/pair.sh OUT
set -euo pipefail
OUT=${1:?usage: pair.sh OUT}; mkdir -p "$OUT"
for e in ${ORDER:-inproc deploy deploy inproc}; do
  n=$(ls -d "$OUT/$e"-*/ 2>/dev/null | wc -l); d=$OUT/$e-$((n + 1))
  if [ "$e" = inproc ]; then sflower run -q clock=wall output-dir="$d" > "$d.log" 2>&1; m=$d/metrics.csv
  else sflower deploy -q nodes=20 run-dir="$d" > "$d.log" 2>&1; m=$d/out/metrics.csv; fi
  python3 - "$d" "$m" <<'PY'
import csv, sys
d, m = sys.argv[1:]
rows = list(csv.DictReader(open(m)))
w = [float(r["wall_time_s"]) for r in rows]
print(d, "first-to-last", round(w[-1] - w[0], 1), "first", w[0], "iterations",
      [round(b - a, 1) for a, b in zip(w, w[1:])], "accuracy", rows[-1]["test_accuracy"])
PY
done
