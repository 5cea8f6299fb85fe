"""PSI's time and bytes at n against n IDs (issue 45), written to a CSV (``docs/results/vertical-psi/``).

``python -m benchmarks.vertical_psi --sizes 10000,100000 --overlap 0.8 --out docs/results/vertical-psi``
runs :func:`fl_app.vertical.psi.run_psi` once per backend that imports and per size, with two parties of ``n``
IDs each sharing ``overlap·n`` of them, checks the result against the true intersection, and writes
``psi.csv`` (backend, n, overlap, intersection, CPU seconds of each party, bytes of each message) and
``machine.txt``. CPU seconds are ``time.process_time`` of the party's own steps (one thread).
"""

from __future__ import annotations

import argparse
import csv
import platform
import sys
from pathlib import Path

from fl_app.vertical.psi import BACKENDS, openmined_available, run_psi


def party_ids(n: int, overlap: float, seed: int = 0) -> tuple[list[str], list[str], set[str]]:
    """Two shuffled ID lists of ``n`` each sharing ``round(overlap·n)`` IDs, and the true intersection."""
    import numpy as np

    rng = np.random.default_rng(seed)
    shared = round(overlap * n)
    pool = [f"u{v:09d}" for v in rng.choice(10**9, size=2 * n - shared, replace=False)]
    a, b = pool[:n], pool[n - shared:]
    truth = set(a) & set(b)
    return [a[i] for i in rng.permutation(n)], [b[i] for i in rng.permutation(n)], truth


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0, or 1 when a result differs from the true intersection."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.vertical_psi")
    p.add_argument("--sizes", default="10000")
    p.add_argument("--overlap", type=float, default=0.8)
    p.add_argument("--out", default="docs/results/vertical-psi")
    p.add_argument("--table-only", action="store_true", help="only render table.md from the CSV already written")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.table_only:
        write_table(out, "psi.csv")
        return 0
    rows = []
    backends = [b for b in BACKENDS if b != "openmined" or openmined_available()]
    for n in (int(s) for s in args.sizes.split(",")):
        a, b, truth = party_ids(n, args.overlap)
        for backend in backends:
            pos, st = run_psi(a, b, backend)
            if {a[i] for i in pos} != truth:
                print(f"{backend}: wrong intersection at n={n}", file=sys.stderr)
                return 1
            rows.append({"backend": backend, "n": n, "overlap": args.overlap, "intersection": len(truth),
                         "receiver_cpu_s": round(st.seconds["receiver"], 3),
                         "sender_cpu_s": round(st.seconds["sender"], 3),
                         "total_cpu_s": round(st.total_seconds, 3),
                         "request_bytes": st.bytes["request"], "response_bytes": st.bytes["response"],
                         "total_bytes": st.total_bytes})
            print(rows[-1], flush=True)
    with open(out / "psi.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "machine.txt").write_text(f"{platform.processor() or platform.machine()} {platform.python_version()}\n"
                                     f"command: python -m benchmarks.vertical_psi --sizes {args.sizes} "
                                     f"--overlap {args.overlap} --out {args.out}\n")
    write_table(out, "psi.csv")
    return 0


def write_table(out: Path, csv_name: str) -> None:
    """``out/table.md``: the CSV ``out/csv_name`` as a markdown table (what the docs page includes)."""
    with open(out / csv_name, newline="") as f:
        rows = list(csv.reader(f))
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(_cell(v) for v in r) + " |" for r in rows[1:]]
    (out / "table.md").write_text("\n".join(lines) + "\n")


def _cell(value: str) -> str:
    try:
        x = float(value)
    except ValueError:
        return value
    return value if x == int(x) and "." not in value else f"{x:.4g}"


if __name__ == "__main__":
    raise SystemExit(main())
