#!/usr/bin/env bash
# The once-flaky Ray resume test, N times (default 20), each in a fresh pytest process, with the load average
# beside each run. Usage (from the repository root, venv active): docs/results/flaky-ray-resume/loop.sh [N] > runs.log
N=${1:-20}
for i in $(seq 1 "$N"); do
  start=$(date +%s)
  python -m pytest "tests/test_resume_engines.py::test_ray_run_sigkilled_after_a_checkpoint_resumes_identically[gas]" \
    -m e2e -n 0 -q -p no:cacheprovider > /dev/null 2>&1
  echo "run $i rc=$? seconds=$(( $(date +%s) - start )) load=$(cut -d' ' -f1-3 /proc/loadavg)"
done
