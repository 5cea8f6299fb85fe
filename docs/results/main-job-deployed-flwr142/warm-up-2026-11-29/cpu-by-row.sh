#!/usr/bin/env bash
# The main job deployed; at every new metrics.csv row, the CPU seconds so far of each kind of Flower process
# (from /proc/PID/stat). Usage (from the checkout): cpu-by-row.sh OUT
set -euo pipefail

OUT=${1:?}; rm -rf $OUT; mkdir -p $OUT
sflower deploy -q nodes=20 run-dir=$OUT/run > $OUT/deploy.log 2>&1 &
DP=$!
M=$OUT/run/out/metrics.csv
last=0
grp() { python3 - <<'PY'
import os, collections
g = collections.Counter()
for p in os.listdir("/proc"):
    if not p.isdigit(): continue
    try:
        st = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        cmd = open(f"/proc/{p}/cmdline").read().replace("\0", " ")
    except OSError: continue
    t = (int(st[11]) + int(st[12])) / 100
    for k in ("flwr-serverapp", "flwr-clientapp", "superexec", "supernode", "superlink"):
        if k in cmd: g[k] += t; break
print(" ".join(f"{k}={v:.1f}" for k, v in sorted(g.items())))
PY
}
while kill -0 $DP 2>/dev/null; do
  n=$( [ -f $M ] && wc -l < $M || echo 0 )
  if [ "$n" != "$last" ]; then echo "$(date +%s.%N) rows=$n $(grp)"; last=$n; fi
  sleep 0.5
done
echo "rc $(wait $DP; echo $?)"
