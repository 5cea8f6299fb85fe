"""sflower's side of P1 alone, three ways: as measured (default), evaluating only at the end (noeval: eval-every=0),
and with one torch thread (omp1: OMP_NUM_THREADS=1). Three global iterations each, one fresh process per variant.

Usage (from the checkout): PYTHONPATH=. python docs/results/gas-p1-authors/bounds/variants.py DATA_DIR default noeval omp1
Prints, per variant, the seconds between consecutive metrics.csv rows (wall_time_s) and the process's seconds.
"""

import sys
import tempfile
import time
from pathlib import Path

from benchmarks.authors import GAS_KEYS, run_sflower

VARIANTS = {"default": ([], None), "noeval": (["eval-every=0"], None), "omp1": ([], 1)}


def main(data_dir: str, names: list[str]) -> None:
    """Run each named variant once and print its row gaps (s)."""
    for name in names:
        extra, threads = VARIANTS[name]
        with tempfile.TemporaryDirectory() as tmp:
            t = time.time()
            walls = run_sflower([*GAS_KEYS, "global-iterations=3", *extra], data_dir, Path(tmp) / "out", threads)
            print(name, [round(b - a, 2) for a, b in zip(walls, walls[1:])], "rows", len(walls),
                  "process", round(time.time() - t, 1), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3 or any(n not in VARIANTS for n in sys.argv[2:]):
        sys.exit(f"usage: variants.py DATA_DIR {{{'|'.join(VARIANTS)}}} ...")
    main(sys.argv[1], sys.argv[2:])
