"""``python -m benchmarks.authors``: GAS per global iteration, sflower against its authors' code, side by side.

The GAS authors' code (``eejiarong/GAS``, ``GAS_main.py``; never part of this repository: clone it and pass
its directory as ``--authors-dir``) and ``sflower run preset=gas-reference`` run the authors' setting,
alternately, on the same machine: Fashion-MNIST, shard = 2, K = 20 clients, C = 10 concurrent, E = 20 local
iterations, B = 32, their AlexNet, each global iteration followed by an evaluation on the 10,000 test
images.

* **Their side.** ``GAS_main.py`` has no options: every setting is a module constant. It runs from a
  temporary copy in which exactly four lines are replaced (:data:`AUTHORS_EDITS`: Fashion-MNIST instead
  of CIFAR-10, the number of global iterations, the CPU), and the settings this benchmark relies on are
  checked to be there unchanged (:data:`AUTHORS_FIXED`), so that another revision of their file stops the
  benchmark with one line instead of timing another configuration. torchvision comes from
  ``benchmarks/standin`` (:mod:`benchmarks.standin.torchvision`). Their code prints
  ``Global iteration: k`` after each global iteration's evaluation; the benchmark reads their output as it
  comes and notes the time of each such line.
* **sflower's side.** ``sflower run preset=gas-reference`` with the same setting; ``metrics.csv``'s
  ``wall_time_s`` of row ``k`` is the time after global iteration ``k``'s evaluation.

Per run, the seconds of global iterations 2 to ``--iterations`` (the differences of those times; the first
iteration also holds each side's start-up) and their median. The figure is sflower's median over the
authors' median (below 1: sflower is faster). Results: ``runs.csv`` (every iteration of every run) and
``summary.md`` in ``--out``.

    python -m benchmarks.authors --authors-dir ../GAS --pairs 2 --iterations 3 --out DIR
"""

from __future__ import annotations

import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import REPO_ROOT, fmnist_dir
from fl_app.run.errors import ConfigError

#: The lines of ``GAS_main.py`` (eejiarong/GAS at 9f6e9b2) replaced in the temporary copy: ``old -> new``;
#: ``{iterations}`` is ``--iterations``. Each must occur exactly once.
AUTHORS_EDITS: dict[str, str] = {
    "cifar = True": "cifar = False",
    "fmnist = False": "fmnist = True",
    "epochs = 2000": "epochs = {iterations}",
    'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")': 'device = torch.device("cpu")',
}
#: Settings of ``GAS_main.py`` that must be there, once and unchanged (a comment after them is allowed):
#: shard = 2 non-IID, K = 20, C = 10, E = 20, B = 32, lr = 0.01, generation on, an evaluation per iteration.
AUTHORS_FIXED: tuple[str, ...] = (
    "iid = False", "dirichlet = False", "shard = 2", "localEpoch = 20", "user_num = 20", "user_parti_num = 10",
    "batchSize = 32", "lr = 0.01", "mnist = False", "Generate = True", "V_Test = False",
    "Accu_Test_Frequency = 1",
)
#: The authors' line after each global iteration's evaluation.
ITERATION_LINE = re.compile(r"^Global iteration: (\d+)\s*$")
#: sflower's side: ``sflower run`` keys (the setting of ``simulation/experiments/gas-reference-authors.toml``).
SFLOWER_KEYS = ("preset=gas-reference", "strategy=gas", "dataset=fashion-mnist", "num-clients=20", "concurrency=10",
                "partition=shard", "shards=2", "local-iterations=20", "batch-size=32", "seed=0")
STANDIN = REPO_ROOT / "benchmarks" / "standin"


def authors_source(text: str, iterations: int) -> str:
    """``GAS_main.py``'s source ``text`` with :data:`AUTHORS_EDITS` applied, after checking :data:`AUTHORS_FIXED`.

    Raises:
        ConfigError: a line to replace or to keep does not occur exactly once (another revision of their file).
    """
    lines = text.split("\n")
    for fixed in AUTHORS_FIXED:
        if sum(1 for line in lines if line.split("#")[0].strip() == fixed) != 1:
            raise ConfigError(f"GAS_main.py has no single line '{fixed}': another revision than 9f6e9b2?")
    for old, new in AUTHORS_EDITS.items():
        where = [i for i, line in enumerate(lines) if line == old]
        if len(where) != 1:
            raise ConfigError(f"GAS_main.py has no single line '{old}': another revision than 9f6e9b2?")
        lines[where[0]] = new.format(iterations=iterations)
    return "\n".join(lines)


def iteration_seconds(ends: Sequence[float]) -> list[float]:
    """Seconds of global iterations 2, 3, ... from the times ``ends[k-1]`` at which iteration ``k`` ended."""
    return [round(b - a, 3) for a, b in zip(ends, ends[1:])]


def run_authors(authors_dir: Path, iterations: int, data_dir: str, work: Path) -> list[float]:
    """Run the authors' ``GAS_main.py`` for ``iterations`` global iterations; the monotonic times (s) at which
    each ``Global iteration: k`` line arrived.

    Raises:
        ConfigError: no ``GAS_main.py`` in ``authors_dir``, or another revision of it (:func:`authors_source`).
        RuntimeError: their code exited with an error or printed fewer iterations (its last output line).
    """
    main = authors_dir / "GAS_main.py"
    if not main.is_file():
        raise ConfigError(f"no GAS_main.py in {authors_dir} (clone https://github.com/eejiarong/GAS there)")
    work.mkdir(parents=True, exist_ok=True)
    (work / "GAS_main.py").write_text(authors_source(main.read_text(), iterations))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TV_FASHIONMNIST_DIR": data_dir,
           "PYTHONPATH": os.pathsep.join([str(STANDIN), str(authors_dir / "utils"), str(authors_dir)])}
    ends: list[float] = []
    tail: list[str] = []
    with subprocess.Popen([sys.executable, "-u", "GAS_main.py"], cwd=work, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if ITERATION_LINE.match(line):
                ends.append(time.monotonic())
            tail = (tail + [line.rstrip()])[-5:]
    if proc.returncode != 0 or len(ends) < iterations:
        raise RuntimeError(f"the authors' GAS_main.py exited {proc.returncode} after {len(ends)} global iterations: "
                           f"{next((t for t in reversed(tail) if t), '')}")
    return ends


def run_sflower(iterations: int, data_dir: str, out: Path) -> list[float]:
    """``sflower run`` on the authors' setting for ``iterations`` global iterations; ``wall_time_s`` of metric
    rows 1..``iterations`` (s).

    Raises:
        RuntimeError: the run failed (its last error line).
    """
    argv = [sys.executable, "-c", "from simulation.cli import main; main()", "run", "-q", *SFLOWER_KEYS,
            f"data-dir={data_dir}", f"global-iterations={iterations}", f"output-dir={out}"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"sflower run failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    with (out / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    return [float(r["wall_time_s"]) for r in rows[1:iterations + 1]]


def measure(authors_dir: Path, pairs: int, iterations: int, data_dir: str, tmp: Path) -> list[dict]:
    """``pairs`` alternating runs of each side (the authors' first); one row per side, run and global iteration
    (2..``iterations``): ``pair``, ``side`` (``authors`` or ``sflower``), ``global_iteration``, ``seconds``."""
    rows = []
    for pair in range(1, pairs + 1):
        for side in ("authors", "sflower"):
            print(f"pair {pair}: {side} ...", file=sys.stderr, flush=True)
            work = tmp / f"{side}-{pair}"
            ends = (run_authors(authors_dir, iterations, data_dir, work) if side == "authors"
                    else run_sflower(iterations, data_dir, work))
            for k, seconds in enumerate(iteration_seconds(ends), start=2):
                rows.append({"pair": pair, "side": side, "global_iteration": k, "seconds": seconds})
            print(f"pair {pair}: {side} {iteration_seconds(ends)} s per global iteration", file=sys.stderr, flush=True)
    return rows


def summary(rows: Sequence[dict]) -> str:
    """A Markdown table: per pair each side's median seconds per global iteration and sflower ÷ authors, then the
    medians over all runs' iterations."""
    def med(side: str, pair: int | None = None) -> float:
        return statistics.median(r["seconds"] for r in rows if r["side"] == side and pair in (None, r["pair"]))

    lines = ["| pair | authors' code (s per global iteration) | sflower (s) | sflower ÷ authors |", "|---|---|---|---|"]
    for pair in sorted({r["pair"] for r in rows}):
        a, s = med("authors", pair), med("sflower", pair)
        lines.append(f"| {pair} | {a:.1f} | {s:.1f} | {s / a:.3f} |")
    a, s = med("authors"), med("sflower")
    lines.append(f"| median | {a:.1f} | {s:.1f} | **{s / a:.3f}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.authors``: :func:`measure`, then ``runs.csv`` and ``summary.md`` in ``--out``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.authors", description=__doc__.split("\n")[0])
    ap.add_argument("--authors-dir", required=True, help="a clone of github.com/eejiarong/GAS (holds GAS_main.py)")
    ap.add_argument("--pairs", type=int, default=2, help="alternating runs of each side")
    ap.add_argument("--iterations", type=int, default=3, help="global iterations per run (at least 2)")
    ap.add_argument("--data-dir", default=None, help="Fashion-MNIST's directory (default ../shared/data/fashion-mnist)")
    ap.add_argument("--out", required=True, help="directory for runs.csv and summary.md")
    args = ap.parse_args(argv)
    if args.iterations < 2 or args.pairs < 1:
        ap.error("--iterations must be at least 2 (the first holds the start-up) and --pairs at least 1")
    data_dir = str(Path(fmnist_dir(args.data_dir)).resolve())
    with tempfile.TemporaryDirectory(prefix="sflower-authors-") as tmp:
        try:
            rows = measure(Path(args.authors_dir).resolve(), args.pairs, args.iterations, data_dir, Path(tmp))
        except (RuntimeError, ConfigError) as err:
            print(f"authors: {err}", file=sys.stderr)
            return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "runs.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["pair", "side", "global_iteration", "seconds"])
        writer.writeheader()
        writer.writerows(rows)
    command = "python -m benchmarks.authors " + " ".join(argv if argv is not None else sys.argv[1:])
    table = summary(rows)
    (out / "summary.md").write_text(f"`{command}`\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
