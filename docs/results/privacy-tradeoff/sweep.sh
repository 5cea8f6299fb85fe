#!/usr/bin/env bash
# The order the committed sweep ran in (run.sh skips the runs already attacked, so this resumes):
# the five key rows at seeds 0-4 first, then the other variants at seeds 0-2, then at seeds 3-4.
# Usage: docs/results/privacy-tradeoff/sweep.sh RUNS_DIR
set -euo pipefail
out=${1:?RUNS_DIR}
here=$(dirname "$0")
KEY=(u-none u-hidden u-max-norm u-marvell-1 u-iso-1)
OTHER=(u-nopeek-100 u-noise-0.03 u-hidden+max-norm u-max-norm+noise-0.03 prefix prefix-hidden)
SEEDS="0 1 2 3 4" "$here/run.sh" "$out" "${KEY[@]}"
SEEDS="0 1 2" "$here/run.sh" "$out" "${OTHER[@]}"
SEEDS="3 4" "$here/run.sh" "$out" "${OTHER[@]}"
