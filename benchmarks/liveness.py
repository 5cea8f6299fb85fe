"""``sflower bench liveness``: how soon the main job shows something, and how long its output then stays still.

Runs the README's main job (``sflower run``: GAS on mnist-5k with the
defaults) with ``global-iterations=1`` in a fresh interpreter, its stdout
and stderr on pipes (not a TTY, as in a log file or under a sweep), and
timestamps every chunk the child writes (a tqdm refresh is one ``\\r``
write, so each chunk is one change of the display). It reports

* ``first_output_s``: seconds from the child's start (just before
  :class:`subprocess.Popen`) to its first chunk on either stream;
* ``longest_gap_s``: the longest time between two consecutive chunks (the
  output standing still); ``longest_gaps``: the four longest, each with
  when it began (``at_s``) and the end of the line written just before it
  (``after``); ``gaps_over_2s``: how many exceed 2 s;
* ``first_bar_s`` and ``longest_gap_after_bar_s``: when the progress bar
  first appears, and the longest gap from then on (start-up excluded);
* ``chunks`` and ``wall_s`` (the whole command).

The wall-clock figures are noisy on a shared machine: compare runs made
side by side. Run it as ``python -m benchmarks.liveness [--tree DIR]
[--repeats N] [KEY=VALUE ...]`` from the repository root (``--tree``: run
another checkout's code, e.g. ``git archive HEAD | tar -x -C DIR``), or as
``sflower bench liveness``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

#: This checkout (the tree whose code runs when no other is given).
ROOT = Path(__file__).resolve().parents[1]
#: The main job's arguments after ``sflower run`` (the README's command, shortened to one global iteration).
MAIN_JOB = ("global-iterations=1",)


def _read_chunks(fd: int, name: str, t0: float, chunks: list[tuple[float, str, bytes]],
                 lock: threading.Lock) -> None:
    """Append ``(seconds since t0, name, bytes)`` for each read of ``fd`` until end of file."""
    while True:
        data = os.read(fd, 65536)
        now = time.perf_counter() - t0
        if not data:
            return
        with lock:
            chunks.append((now, name, data))


def measure(out_dir: Path, args: tuple[str, ...] = MAIN_JOB, tree: Path | None = None) -> dict[str, Any]:
    """Run ``sflower run *args output-dir=OUT_DIR`` with the code of ``tree`` (default: this checkout) and time
    its output chunks; the figures of the module docstring.

    Raises:
        RuntimeError: the run failed (its last output line).
    """
    src = Path(tree or ROOT).resolve()
    env = dict(os.environ, PYTHONPATH=str(src))
    env.pop("PYTHONUNBUFFERED", None)  # the child buffers its output as a plain run does
    cmd = [sys.executable, "-m", "simulation.cli", "run", *args, f"output-dir={out_dir}"]
    chunks: list[tuple[float, str, bytes]] = []
    lock = threading.Lock()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=str(src), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    readers = [threading.Thread(target=_read_chunks, args=(pipe.fileno(), name, t0, chunks, lock), daemon=True)
               for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    for reader in readers:
        reader.start()
    rc = proc.wait()
    for reader in readers:
        reader.join()
    wall = time.perf_counter() - t0
    chunks.sort(key=lambda c: c[0])
    text = b"".join(c[2] for c in chunks).decode(errors="replace")
    if rc != 0 or not chunks:
        tail = (text.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"liveness: the run of {src} failed (status {rc}): {tail}")
    times = [c[0] for c in chunks]
    gaps = sorted(((b - a, i) for i, (a, b) in enumerate(zip(times, times[1:]))), reverse=True) or [(0.0, 0)]
    bar = next((i for i, c in enumerate(chunks) if b"\r" in c[2] or b"|" in c[2]), None)
    after_bar = max((g for g, i in gaps if bar is not None and i >= bar), default=float("nan"))
    return {"first_output_s": round(times[0], 3), "longest_gap_s": round(gaps[0][0], 3),
            "first_bar_s": round(times[bar], 3) if bar is not None else None,
            "longest_gap_after_bar_s": round(after_bar, 3), "gaps_over_2s": sum(g > 2.0 for g, _ in gaps),
            "longest_gaps": [{"gap_s": round(g, 3), "at_s": round(times[i], 3), "after": _last_line(chunks[:i + 1])}
                             for g, i in gaps[:4]],
            "chunks": len(chunks), "wall_s": round(wall, 3)}


def _last_line(chunks: list[tuple[float, str, bytes]]) -> str:
    """The end (100 characters) of the last line of the text that ``chunks`` wrote (a ``\\r`` ends a line)."""
    text = b"".join(c[2] for c in chunks).decode(errors="replace").replace("\r", "\n").rstrip()
    return text.splitlines()[-1][-100:] if text else ""


def bench_liveness(tmp: Path, quick: bool = False, tree: Path | None = None, repeats: int | None = None,
                   args: tuple[str, ...] = MAIN_JOB) -> dict[str, Any]:
    """``repeats`` runs of :func:`measure` (default 1 with ``quick``, else 2), each writing under ``tmp``:
    every run's figures and the worst of each (the largest first output and gaps)."""
    n = repeats if repeats is not None else (1 if quick else 2)
    runs = [measure(tmp / f"liveness-{i}", args, tree) for i in range(n)]
    worst = {k: max(r[k] for r in runs) for k in ("first_output_s", "longest_gap_s", "longest_gap_after_bar_s")}
    return {"command": "sflower run " + " ".join(args), "worst": worst, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.liveness [--tree DIR] [--repeats N] [KEY=VALUE ...]``: print the figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.liveness", description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="run-config keys (default: global-iterations=1)")
    parser.add_argument("--tree", type=Path, default=None, help="run this checkout's code (default: this one)")
    parser.add_argument("--repeats", type=int, default=2)
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sflower-liveness-") as tmp:
        res = bench_liveness(Path(tmp), tree=opts.tree, repeats=opts.repeats,
                             args=tuple(opts.pairs) if opts.pairs else MAIN_JOB)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
