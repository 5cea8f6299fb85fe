"""``python -m benchmarks.authors gas|ring``: sflower against its papers' authors' code, side by side (P1, P9).

The authors' code is never part of this repository: clone it and pass its directory as ``--authors-dir``.
Both sides run the authors' setting, alternately (theirs first), on the same machine, each run a fresh
process; torchvision, which does not import beside torch's CPU wheel here, comes to their code from a
stand-in (``benchmarks/standin``; :mod:`benchmarks.standin.torchvision`) doing its per-sample work. Their
output is read as it comes and the time of each marker line noted.

* **gas (P1)**: ``eejiarong/GAS`` ``GAS_main.py`` against ``sflower run preset=gas-reference`` on
  Fashion-MNIST, shard = 2, K = 20 clients, C = 10 concurrent, E = 20 local iterations, B = 32, their AlexNet,
  an evaluation on the 10,000 test images after every global iteration. ``GAS_main.py`` has no options
  (every setting is a module constant), so it runs from a temporary copy in which exactly four lines are
  replaced (:data:`AUTHORS_EDITS`: Fashion-MNIST instead of CIFAR-10, the number of global iterations, the
  CPU), and the settings relied on are checked to be there unchanged (:data:`AUTHORS_FIXED`): another
  revision of their file stops the benchmark with one line instead of timing another configuration. The
  figure is the seconds of global iterations 2 to ``--iterations`` (the first also holds each side's
  start-up): for them the time between their ``Global iteration: k`` lines, for sflower the differences of
  ``metrics.csv``'s ``wall_time_s``.
* **ring (P9)**: ``ShenJinglong/StalRingSFL`` ``main.py`` against ``sflower run preset=ringsfl-reference``: one
  RingSFL v2 round on label-sorted MNIST, the authors' LeNet, 5 clients, lengths 8:1:1:1:1, 2 local epochs
  at B = 64, plain SGD at lr 0.02, then an evaluation on the test set; one torch thread on both sides
  (``OMP_NUM_THREADS=1``). Their tree runs from a temporary copy with its ``config-defaults.yaml``
  (:data:`RING_CONFIG`, read by wandb, offline) written there. The figure is one round: for them the time
  from their ``round: 0`` line to their ``acc:`` line, for sflower the wall time between metric rows 0 and 1.

The figure of a side is the median over its runs; the ratio is sflower's over the authors' (below 1:
sflower is faster). Results: ``runs.csv`` (every figure of every run) and ``summary.md`` in ``--out``.

    python -m benchmarks.authors gas --authors-dir ../GAS --pairs 2 --iterations 3 --out DIR
    python -m benchmarks.authors ring --authors-dir ../StalRingSFL --pairs 6 --out DIR
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO_ROOT, fmnist_dir, mnist_dir
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
#: GAS_main.py's line after each global iteration's evaluation.
ITERATION_LINE = re.compile(r"^Global iteration: (\d+)\s*$")
#: sflower's side of ``gas``: ``sflower run`` keys (``simulation/experiments/gas-reference-authors.toml``'s setting).
GAS_KEYS = ("preset=gas-reference", "strategy=gas", "dataset=fashion-mnist", "num-clients=20", "concurrency=10",
            "partition=shard", "shards=2", "local-iterations=20", "batch-size=32", "seed=0")
#: The RingSFL authors' ``config-defaults.yaml`` for P9 (``ShenJinglong/StalRingSFL`` at ad2b2f8; wandb reads it).
RING_CONFIG: dict[str, object] = {
    "alg": "ringsfl_v2", "num_worker": 5, "prop_lens": "8:1:1:1:1", "block_num": 5, "batch_size": 64,
    "dataset_name": "mnist", "dataset_type": "noniid", "model_type": "lenet", "cut_point": 2, "lr": 0.02,
    "global_round": 1, "local_epoch": 2,
}
#: Their log lines (``logging`` with their format ``TIME - LEVEL - MESSAGE``) at the round's start and after its
#: evaluation.
RING_START, RING_END = re.compile(r" - INFO - round: 0\s*$"), re.compile(r" - INFO - acc: ")
#: sflower's side of ``ring`` (docs/performance.md, "RingSFL against the authors' one-process simulation").
RING_KEYS = ("preset=ringsfl-reference", "strategy=ringsfl", "ring-version=2", "partition=label-sorted",
             "dataset=mnist", "heterogeneity=ringsfl-testbed", "ring-lengths=8:1:1:1:1", "global-iterations=1")
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


def timed_lines(argv: Sequence[str], cwd: Path, env: Mapping[str, str], markers: Mapping[str, re.Pattern],
                what: str) -> dict[str, list[float]]:
    """Run ``argv`` (stdout and stderr together); per marker, the monotonic times (s) of the lines it matched.

    Raises:
        RuntimeError: the program exited non-zero (``what`` and its last output line).
    """
    times: dict[str, list[float]] = {name: [] for name in markers}
    tail: list[str] = []
    with subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic()
            for name, pattern in markers.items():
                if pattern.search(line):
                    times[name].append(now)
            tail = (tail + [line.rstrip()])[-5:]
    if proc.returncode != 0:
        raise RuntimeError(f"{what} exited {proc.returncode}: {next((t for t in reversed(tail) if t), '')}")
    return times


def _authors_env(data_var: str, data_dir: str, path: Sequence[Path], threads: int | None) -> dict[str, str]:
    """Their process's environment: the stand-in first on ``PYTHONPATH`` and this repository last (the stand-in
    reads the IDX files with sflower's reader), the data directory in ``data_var``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", data_var: data_dir, "WANDB_MODE": "offline",
           "WANDB_SILENT": "true", "PYTHONPATH": os.pathsep.join(str(p) for p in (STANDIN, *path, REPO_ROOT))}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_authors_gas(authors_dir: Path, iterations: int, data_dir: str, work: Path) -> list[float]:
    """Run the GAS authors' ``GAS_main.py`` for ``iterations`` global iterations; the monotonic times (s) at which
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
    env = _authors_env("TV_FASHIONMNIST_DIR", data_dir, [authors_dir / "utils", authors_dir], None)
    ends = timed_lines([sys.executable, "-u", "GAS_main.py"], work, env, {"end": ITERATION_LINE},
                       "the authors' GAS_main.py")["end"]
    if len(ends) < iterations:
        raise RuntimeError(f"the authors' GAS_main.py printed {len(ends)} of {iterations} global iterations")
    return ends


def run_authors_ring(authors_dir: Path, data_dir: str, work: Path) -> float:
    """One round of the RingSFL authors' ``main.py`` on :data:`RING_CONFIG`, from a copy of their tree in
    ``work``; the seconds from their ``round: 0`` line to their ``acc:`` line.

    Raises:
        ConfigError: no ``main.py`` and ``alg/ringsfl_v2.py`` in ``authors_dir``.
        RuntimeError: their code exited with an error or logged no complete round.
    """
    if not (authors_dir / "main.py").is_file() or not (authors_dir / "alg" / "ringsfl_v2.py").is_file():
        raise ConfigError(f"no main.py and alg/ringsfl_v2.py in {authors_dir} "
                          "(clone https://github.com/ShenJinglong/StalRingSFL there)")
    tree = work / "StalRingSFL"
    shutil.copytree(authors_dir, tree, ignore=shutil.ignore_patterns(".git", "wandb", "datasets"))
    # wandb's config-defaults format, each value a JSON scalar (valid YAML)
    defaults = "".join(f"{key}:\n  value: {json.dumps(value)}\n" for key, value in RING_CONFIG.items())
    (tree / "config-defaults.yaml").write_text(defaults)
    env = _authors_env("TV_MNIST_DIR", data_dir, [tree], 1)
    times = timed_lines([sys.executable, "-u", "main.py"], tree, env, {"start": RING_START, "end": RING_END},
                        "the authors' main.py")
    if not times["start"] or not times["end"]:
        raise RuntimeError("the authors' main.py logged no complete round ('round: 0' ... 'acc:')")
    return round(times["end"][0] - times["start"][0], 3)


def run_sflower(keys: Sequence[str], data_dir: str, out: Path, threads: int | None = None) -> list[float]:
    """``sflower run KEYS data-dir=DATA_DIR output-dir=OUT``; ``metrics.csv``'s ``wall_time_s`` per row (s).

    Raises:
        RuntimeError: the run failed (its last error line).
    """
    argv = [sys.executable, "-c", "from simulation.cli import main; main()", "run", "-q", *keys,
            f"data-dir={data_dir}", f"output-dir={out}"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"sflower run failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    with (out / "metrics.csv").open() as fh:
        return [float(r["wall_time_s"]) for r in csv.DictReader(fh)]


@dataclass(frozen=True)
class System:
    """One side-by-side comparison: how to measure each side.

    Attributes:
        authors: ``(authors_dir, iterations, data_dir, work) -> figures`` (seconds) of one run of their code.
        sflower: ``(iterations, data_dir, work) -> figures`` (seconds) of one run of sflower.
        data_dir: ``--data-dir`` (or None) to the dataset's directory.
        unit: what one figure is, for the table's header.
    """

    authors: Callable[[Path, int, str, Path], list[float]]
    sflower: Callable[[int, str, Path], list[float]]
    data_dir: Callable[[str | None], str]
    unit: str


SYSTEMS: dict[str, System] = {
    "gas": System(
        authors=lambda d, k, data, work: iteration_seconds(run_authors_gas(d, k, data, work)),
        sflower=lambda k, data, work: iteration_seconds(run_sflower([*GAS_KEYS, f"global-iterations={k}"], data,
                                                                    work)[1:k + 1]),
        data_dir=fmnist_dir, unit="s per global iteration"),
    "ring": System(
        authors=lambda d, k, data, work: [run_authors_ring(d, data, work)],
        sflower=lambda k, data, work: iteration_seconds(run_sflower(RING_KEYS, data, work, threads=1)[:2]),
        data_dir=lambda given: given or mnist_dir(None), unit="s per round"),
}


def measure(system: System, authors_dir: Path, pairs: int, iterations: int, data_dir: str, tmp: Path) -> list[dict]:
    """``pairs`` alternating runs of each side (the authors' first); one row per side, run and figure:
    ``pair``, ``side`` (``authors`` or ``sflower``), ``figure`` (1, 2, ...), ``seconds``."""
    rows = []
    for pair in range(1, pairs + 1):
        for side in ("authors", "sflower"):
            print(f"pair {pair}: {side} ...", file=sys.stderr, flush=True)
            work = tmp / f"{side}-{pair}"
            figures = (system.authors(authors_dir, iterations, data_dir, work) if side == "authors"
                       else system.sflower(iterations, data_dir, work))
            rows += [{"pair": pair, "side": side, "figure": i, "seconds": s} for i, s in enumerate(figures, start=1)]
            print(f"pair {pair}: {side} {figures} {system.unit}", file=sys.stderr, flush=True)
    return rows


def summary(rows: Sequence[dict], unit: str = "s per global iteration") -> str:
    """A Markdown table: per pair each side's median seconds and sflower ÷ authors, then the medians over all
    runs' figures."""
    def med(side: str, pair: int | None = None) -> float:
        return statistics.median(r["seconds"] for r in rows if r["side"] == side and pair in (None, r["pair"]))

    lines = [f"| pair | authors' code ({unit}) | sflower (s) | sflower ÷ authors |", "|---|---|---|---|"]
    for pair in sorted({r["pair"] for r in rows}):
        a, s = med("authors", pair), med("sflower", pair)
        lines.append(f"| {pair} | {a:.1f} | {s:.1f} | {s / a:.3f} |")
    a, s = med("authors"), med("sflower")
    lines.append(f"| median | {a:.1f} | {s:.1f} | **{s / a:.3f}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.authors gas|ring``: :func:`measure`, then ``runs.csv`` and ``summary.md`` in ``--out``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.authors", description=__doc__.split("\n")[0])
    ap.add_argument("system", choices=sorted(SYSTEMS), help="gas (P1: GAS_main.py) or ring (P9: StalRingSFL main.py)")
    ap.add_argument("--authors-dir", required=True, help="a clone of the authors' repository")
    ap.add_argument("--pairs", type=int, default=2, help="alternating runs of each side")
    ap.add_argument("--iterations", type=int, default=3, help="gas: global iterations per run (at least 2)")
    ap.add_argument("--data-dir", default=None, help="the dataset's directory (default: ../shared/data/fashion-mnist "
                                                     "for gas, ../shared/data/mnist for ring)")
    ap.add_argument("--out", required=True, help="directory for runs.csv and summary.md")
    args = ap.parse_args(argv)
    if args.iterations < 2 or args.pairs < 1:
        ap.error("--iterations must be at least 2 (the first holds the start-up) and --pairs at least 1")
    system = SYSTEMS[args.system]
    data_dir = str(Path(system.data_dir(args.data_dir)).resolve())
    with tempfile.TemporaryDirectory(prefix="sflower-authors-") as tmp:
        try:
            rows = measure(system, Path(args.authors_dir).resolve(), args.pairs, args.iterations, data_dir, Path(tmp))
        except (RuntimeError, ConfigError) as err:
            print(f"authors: {err}", file=sys.stderr)
            return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "runs.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["pair", "side", "figure", "seconds"])
        writer.writeheader()
        writer.writerows(rows)
    command = "python -m benchmarks.authors " + " ".join(argv if argv is not None else sys.argv[1:])
    table = summary(rows, system.unit)
    (out / "summary.md").write_text(f"`{command}`\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
