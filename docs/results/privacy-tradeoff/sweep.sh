#!/usr/bin/env bash
# The order the committed sweep ran in (run.sh skips the runs already attacked, so this resumes): the five key
# rows at seeds 0-4 first, then every other variant at seeds 0-4 in two processes side by side (each seed-major).
# Usage: docs/results/privacy-tradeoff/sweep.sh RUNS_DIR
set -euo pipefail
out=${1:?RUNS_DIR}
here=$(dirname "$0")
KEY=(u-none u-hidden u-max-norm u-marvell-1 u-iso-1)
A=(u-nopeek-100 u-noise-0.03 u-hidden+max-norm u-max-norm+noise-0.03 u-marvell-4)
B=(prefix prefix-hidden u-iso-1-perturbed u-marvell-1-perturbed u-marvell-0.25)
SEEDS="0 1 2 3 4" "$here/run.sh" "$out" "${KEY[@]}"
SEEDS="0 1 2 3 4" "$here/run.sh" "$out" "${A[@]}" &
SEEDS="0 1 2 3 4" "$here/run.sh" "$out" "${B[@]}"
wait
