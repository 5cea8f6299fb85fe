#!/usr/bin/env bash
# The main job (`sflower run`, GAS on mnist-5k, 20 clients, 10 concurrent) at 2 global iterations on the
# in-process engine and on Ray (ray-N: N client actors; ray-N-idle: with ray-idle=true; ray-N-idle-passive: that,
# with OMP_WAIT_POLICY=PASSIVE for every process of the run), in alternating order (A B C, then C B A, ...),
# each run a fresh `sflower run` process. ENGINES (default "inprocess ray-1 ray-2") names the engines. Writes OUT/runs.csv: one row per run with the run's wall time
# (summary.json's wall_time_s: handshake, evaluations and training), the server side's compute seconds
# (server_compute_s), the whole command's wall time (Ray's start included), final accuracy and loss.
# Usage: docs/results/ray-main-job/run.sh OUT [PAIRS]   (PAIRS: rounds of the three engines, default 2)
set -euo pipefail
OUT=${1:?usage: run.sh OUT [PAIRS]}
PAIRS=${2:-2}
SFLOWER=${SFLOWER:-sflower}
mkdir -p "$OUT"
echo "round,engine,wall_time_s,server_compute_s,command_s,final_accuracy,final_loss" > "$OUT/runs.csv"
for ((r = 0; r < PAIRS; r++)); do
  engines=${ENGINES:-inprocess ray-1 ray-2}
  if ((r % 2 == 0)); then order=$engines; else order=$(echo "$engines" | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for e in $order; do
    envs=()
    case $e in
      inprocess) args=() ;;
      ray-*-idle-passive) n=${e#ray-}; args=(engine=ray "ray-cpus=${n%-idle-passive}" ray-idle=true)
                          envs=(OMP_WAIT_POLICY=PASSIVE) ;;
      ray-*-idle) n=${e#ray-}; args=(engine=ray "ray-cpus=${n%-idle}" ray-idle=true) ;;
      ray-*) args=(engine=ray "ray-cpus=${e#ray-}") ;;
    esac
    dir="$OUT/round$r-$e"
    rm -rf "$dir"
    t0=$(date +%s.%N)
    env "${envs[@]}" $SFLOWER run -q global-iterations=2 "${args[@]}" output-dir="$dir" > "$dir.log" 2>&1
    t1=$(date +%s.%N)
    python - "$dir" "$r" "$e" "$t0" "$t1" >> "$OUT/runs.csv" <<'PY'
import json, sys
d, r, e, t0, t1 = sys.argv[1:]
s = json.load(open(f"{d}/summary.json"))
print(f"{r},{e},{s['wall_time_s']:.3f},{s['server_compute_s']:.3f},{float(t1) - float(t0):.3f},"
      f"{s['final_accuracy']},{s['final_loss']}")
PY
    tail -1 "$OUT/runs.csv"
  done
done
