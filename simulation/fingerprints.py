"""Cross-machine fingerprints: short portable-numerics runs whose metric rows are committed.

One short run per strategy family (zeroth-order, GAS, a synchronous split,
RingSFL) in ``numerics=portable`` (:mod:`fl_app.run.numerics`). Its fingerprint
is its ``metrics.csv`` without the ``wall_time_s`` column: every accuracy,
loss, virtual time, byte count and counter, as written. The files live in
``tests/fingerprints/NAME.csv``; ``tests/test_fingerprints.py`` reruns the
runs and compares them exactly. CI runs on whatever machine a session gets,
so over time the test checks that portable runs reproduce across machines.
A fingerprint changes only on purpose (a change of numbers that an issue
asks for), rewritten with ``python -m simulation.fingerprints write`` and
the reason given in the commit.

Usage::

    python -m simulation.fingerprints check   # exit 1, one line per differing run
    python -m simulation.fingerprints write   # rewrite tests/fingerprints/*.csv
"""

from __future__ import annotations

import csv
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Where the committed fingerprints live.
FINGERPRINT_DIR = Path(__file__).resolve().parents[1] / "tests" / "fingerprints"

#: What every fingerprint run shares: the embedded mnist-5k data, LeNet-5 cut after its first block
#: (conv, ReLU, pool), 6 clients, 3 at a time, 2 global iterations of 3 local iterations.
BASE: dict[str, Any] = {
    "dataset": "mnist-5k", "model": "lenet5", "cut-layer": 3, "num-clients": 6, "concurrency": 3,
    "global-iterations": 2, "local-iterations": 3, "seed": 5, "eval-samples": 500, "numerics": "portable",
}

#: One run per strategy family.
FINGERPRINTS: dict[str, dict[str, Any]] = {
    "zo": {"strategy": "mu-splitfed", "server-steps": 2, "perturbations": 2, "momentum": 0.0, "weight-decay": 0.0},
    "gas": {"strategy": "gas"},
    "sync-split": {"strategy": "splitfed-v1"},
    "ringsfl": {"strategy": "ringsfl", "momentum": 0.0, "lr": 0.02},
}

#: The column a fingerprint leaves out: it measures the machine, not the run.
WALL = "wall_time_s"


def fingerprint(metrics_csv: str | Path) -> str:
    """A run's fingerprint: its metrics.csv text without the :data:`WALL` column."""
    rows = list(csv.reader(io.StringIO(Path(metrics_csv).read_text())))
    drop = rows[0].index(WALL) if rows and WALL in rows[0] else None
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        writer.writerow([v for i, v in enumerate(row) if i != drop])
    return out.getvalue()


def run(name: str, out_dir: Path) -> str:
    """Run fingerprint ``name`` in this process (which must have portable numerics); return its fingerprint."""
    from fl_app.run.config import RunConfig
    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run

    cfg = RunConfig.from_mapping({**BASE, **FINGERPRINTS[name], "output-dir": str(out_dir / name)})
    run_inprocess(plan_run(cfg), progress=False)
    return fingerprint(out_dir / name / "metrics.csv")


def differences(names: list[str] | None = None) -> list[str]:
    """Rerun the fingerprints and compare them with the committed files; one line per difference."""
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or list(FINGERPRINTS):
            path = FINGERPRINT_DIR / f"{name}.csv"
            if not path.is_file():
                lines.append(f"{name}: no committed fingerprint {path}")
                continue
            got, want = run(name, Path(tmp)).splitlines(), path.read_text().splitlines()
            bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
            if len(got) != len(want) or bad:
                at = bad[0] if bad else min(len(got), len(want))
                lines.append(f"{name}: row {at} differs: got {got[at] if at < len(got) else '(none)'!r}, "
                             f"committed {want[at] if at < len(want) else '(none)'!r}")
    return lines


def write() -> None:
    """Rewrite every committed fingerprint from this machine's runs."""
    FINGERPRINT_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in FINGERPRINTS:
            (FINGERPRINT_DIR / f"{name}.csv").write_text(run(name, Path(tmp)))


def main(argv: list[str] | None = None) -> int:
    """``python -m simulation.fingerprints check|write`` (restarts itself with portable numerics)."""
    from fl_app.run.numerics import establish, restart

    args = list(sys.argv[1:] if argv is None else argv)
    if args not in (["check"], ["write"]):
        print("usage: python -m simulation.fingerprints check|write", file=sys.stderr)
        return 2
    restart("portable", "simulation.fingerprints", args)
    establish("portable")
    if args == ["write"]:
        write()
        return 0
    diffs = differences()
    for line in diffs:
        print(line)
    print(f"{len(FINGERPRINTS) - len(diffs)} of {len(FINGERPRINTS)} fingerprints identical")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
