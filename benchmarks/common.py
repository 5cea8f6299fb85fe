"""What the benchmarks share: data directories, planning a run, and running code of another git revision.

The ``against`` benchmarks run a git revision's tree (:func:`source_tree`) and
the working tree side by side, each in a fresh interpreter
(:func:`run_in_tree`); their child scripts start with :data:`PLAN_PRELUDE`,
which plans a run in either tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The root of this checkout (the tree the benchmarks call "new").
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Fashion-MNIST's IDX files beside the repository.
FMNIST_DIR = REPO_ROOT.parent / "shared" / "data" / "fashion-mnist"
#: MNIST IDX files beside the repository.
MNIST_DIR = REPO_ROOT.parent / "shared" / "data" / "mnist"

#: The short GAS run of ``bench engine`` (and ``bench summary``) where the engines' fixed costs dominate.
SMALL_ENGINE_RUN: dict[str, Any] = dict(strategy="gas", dataset="mnist-5k", num_clients=4, concurrency=2,
                                        partition="iid", global_iterations=1, local_iterations=10, eval_every=0)


#: Child-script code that defines ``_plan(**overrides)`` (a checked run plan) in the tree it runs in,
#: whether the ServerApp's wiring is in ``simulation`` (since issue 22) or, in older revisions, in ``fl_app``.
#: (A file test, not an ImportError one: an editable install would supply this checkout's module.)
PLAN_PRELUDE = r"""
import pathlib
import simulation
from fl_app.run.config import RunConfig
if (pathlib.Path(simulation.__file__).parent / "server_app.py").exists():
    from simulation.server_app import plan_run
else:  # a revision before issue 22
    from fl_app.server_app import plan_run
def _plan(**overrides):
    return plan_run(RunConfig.from_mapping(overrides))
"""


def make_plan(**overrides: Any):
    """The checked :class:`~simulation.server_app.RunPlan` of the defaults with ``overrides`` (underscored keys).

    Raises:
        ConfigError: as :func:`simulation.server_app.plan_run`.
    """
    from fl_app.run.config import RunConfig
    from simulation.server_app import plan_run

    return plan_run(RunConfig.from_mapping(overrides))


def fmnist_dir(data_dir: str | None) -> str:
    """Fashion-MNIST's IDX directory: ``data_dir``, or :data:`FMNIST_DIR`."""
    d = Path(data_dir) if data_dir else FMNIST_DIR
    return str(d)


def mnist_dir(data_dir: str | None) -> str:
    """MNIST's IDX directory: ``mnist`` beside ``data_dir`` (which names Fashion-MNIST's), or the default."""
    return str(Path(data_dir).parent / "mnist") if data_dir else str(MNIST_DIR)


def source_tree(rev: str, dest: Path) -> Path:
    """The tree of git revision ``rev`` of this checkout, extracted (``git archive``) under ``dest``.

    Leaves the repository itself untouched (no worktree metadata).

    Raises:
        ConfigError: not a git checkout, or ``rev`` is unknown.
    """
    from fl_app.run.errors import ConfigError

    repo = REPO_ROOT
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"bench --against: {rev!r} is not a commit of {repo}")
    sha = proc.stdout.strip()
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", sha], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise ConfigError(f"bench --against: git archive {sha} failed")
    return dest


def run_in_tree(src: Path, args: list[str], what: str) -> dict[str, Any]:
    """Run ``python *args`` in a fresh interpreter with the code under ``src`` first on the path (cwd ``src``).

    Returns:
        the JSON object on the child's last stdout line ({} when it printed none).

    Raises:
        RuntimeError: the child failed; the message names ``what`` and gives its last stderr line.
    """
    env = dict(os.environ, PYTHONPATH=str(src))
    proc = subprocess.run([sys.executable, *args], cwd=str(src), env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{what} of {src} failed: {tail}")
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def side_by_side(against: str, tmp: Path, repeats: int,
                 child: Callable[[Path, Path], dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Run ``child(src, out_dir)`` for git revision ``against`` ("old") and this checkout ("new"), alternately.

    ``repeats`` runs per side, the order swapped every repeat (old, new, new,
    old, ...) so that load drift on a shared machine hits both sides; each
    call gets its own ``out_dir`` under ``tmp``. The revision's tree is
    extracted once (:func:`source_tree`).

    Returns:
        ``{"old": [figures, ...], "new": [figures, ...]}`` in run order.

    Raises:
        ConfigError: ``against`` is not a commit of this checkout.
        RuntimeError: as raised by ``child``.
    """
    old_src = source_tree(against, tmp / "src-old")
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for i in range(repeats):
        order = (("old", old_src), ("new", REPO_ROOT))
        for side, src in order if i % 2 == 0 else order[::-1]:
            runs[side].append(child(src, tmp / f"{side}-{i}"))
    return runs


def current_rss_mb() -> float:
    """Resident memory of this process now (MB, from /proc/self/status)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")
