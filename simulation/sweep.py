"""Sweeps: every combination of a grid of run-config keys, collected into one table.

A sweep file is TOML::

    [meta]                     # optional
    description = "GAS Table 1, Fashion-MNIST columns (scaled budget)"
    target-accuracy = 0.8      # for the time-to-accuracy columns
    [meta.paper]               # optional: the paper's numbers, shown by `sflower report`
    gas = 90.66
    # optional [meta] lists: pairs = [["gas", "gas-nogen"]] (orders a paper states in words),
    # compare = [["gas", "gas-int8"]] (compared, no order claimed); show-bytes = true (MB columns);
    # attack = "epochs=8" (sflower attack on every run, with these keys: inversion columns)

    [base]                     # run-config keys shared by all runs (+ engine)
    dataset = "fashion-mnist"
    [variants]                 # optional: named groups of keys, chosen by grid key "variant"
    gas = {strategy = "gas"}
    gas-nogen = {strategy = "gas", generate = false}
    [grid]                     # run-config keys (or "variant") mapped to lists
    variant = ["gas", "gas-nogen"]
    seed = [0, 1, 2]

Each run goes to ``DIR/<key>=<value>,...`` (grid keys only). A run whose
``summary.json`` says ``completed`` or ``diverged`` is skipped, so an
interrupted sweep resumes where it stopped (a diverged run is a result: the
same seed diverges again). A run that diverges or fails is reported in one
line and the sweep goes on. The table of all runs is written to
``DIR/results.csv``.

Several ``sflower sweep`` processes may share one ``DIR`` (one per core,
say): each run is claimed with a lock (``DIR/.locks/``, released when its
process ends, a crash included), and a run another process holds is
skipped. The last process to finish writes the complete table. Give each
process one thread (``OMP_NUM_THREADS=1``): processes whose torch threads
outnumber the cores slow each other down many times over.

With ``tracker=...`` in ``[base]`` (or the grid), every run is tracked
under its directory's name (``variant=gas,seed=0``) with its grid keys, its
variant and its seed as tags, in one store for the sweep: ``DIR/mlflow.db``
(experiment: the sweep's name), ``DIR/wandb`` (project and group: the
sweep's name), and each run's ``tensorboard/`` (``tensorboard --logdir DIR``
shows them side by side); see :func:`tracking_context`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from fl_app.run.config import RunConfig, given_or_default, read_toml
from fl_app.run.errors import ConfigError
from fl_app.run.untrusted import read_json_table
from simulation.outputs.results import collect, expand, run_name

if TYPE_CHECKING:
    from simulation.outputs.trackers import TrackingContext


def load_sweep(path: str | Path) -> dict[str, Any]:
    """Parse and check a sweep file.

    Raises:
        ConfigError: unreadable TOML, no ``[grid]``, a grid value that is not a
            non-empty list, or an unknown run-config key.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file '{path}' does not exist")
    spec = read_toml(path, f"sweep file '{path}'")
    tables = [k for k in ("meta", "base", "variants", "grid") if not isinstance(spec.get(k, {}), dict)]
    if tables or not all(isinstance(v, dict) for v in dict(spec.get("variants", {})).values()):
        raise ConfigError(f"sweep file '{path}': {', '.join(tables) or 'variants'} must be tables")
    base = dict(spec.get("base", {}))
    grid = dict(spec.get("grid", {}))
    if not grid:
        raise ConfigError(f"sweep file '{path}' has no [grid] table")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid key '{key}' must map to a non-empty list")
    variants = {str(k): dict(v) for k, v in spec.get("variants", {}).items()}
    for name in grid.get("variant", []):
        if name not in variants:
            raise ConfigError(f"grid variant '{name}' is not defined in [variants]")
    spec = {"meta": dict(spec.get("meta", {})), "base": base, "variants": variants, "grid": grid}
    for run in expand(spec):
        RunConfig.from_mapping(run_config(run))
    return spec


def run_config(run: Mapping[str, Any]) -> dict[str, Any]:
    """The run-config keys of a run (without ``engine`` and ``variant``)."""
    return {k: v for k, v in run.items() if k not in ("engine", "variant")}






def is_complete(run_dir: Path) -> bool:
    """Whether a run directory holds a finished run (completed, or diverged: a result too)."""
    summary = run_dir / "summary.json"
    if not summary.exists():
        return False
    try:
        status = str(read_json_table(summary).get("status"))
        return status == "completed" or status.startswith("diverged")
    except ConfigError:  # unreadable: not a finished run (the sweep runs it again)
        return False


@contextlib.contextmanager
def claim(out: Path, name: str):
    """Hold the lock of run ``name`` of the sweep in ``out`` for the block; yields False if another process has it.

    The lock is an advisory ``flock`` on ``out/.locks/NAME.lock``: the kernel
    releases it when the holding process ends, however it ends.
    """
    locks = out / ".locks"
    locks.mkdir(exist_ok=True)
    with open(locks / f"{name}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def tracking_context(out: Path, run: Mapping[str, Any], grid_keys: list[str]) -> TrackingContext:
    """The trackers' names for one run of a sweep in ``out``: the sweep's store, the run's grid keys as tags."""
    from simulation.outputs.trackers import TrackingContext

    tags = {k: str(run[k]) for k in grid_keys}
    tags.setdefault("seed", str(given_or_default(run, "seed")))
    tags.update(strategy=str(given_or_default(run, "strategy")), sweep=out.name)
    return TrackingContext(store_dir=out, run_name=run_name(run, grid_keys), experiment=out.name, group=out.name,
                           tags=tags)


def run_sweep(path: str | Path, out_dir: str | Path | None = None, *, progress: bool = True) -> pd.DataFrame:
    """Run every missing run of a sweep (in-process unless ``engine`` says otherwise), then collect.

    Returns:
        the results table (also written to ``out_dir/results.csv``).
    """
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess
    from fl_app.run.plugins import strategy_class
    from simulation.ray_engine import run_ray
    from simulation.vertical import check_vertical, is_vertical, run_vertical
    from strategies.core.base import DivergedError, RunFailedError

    spec = load_sweep(path)
    out = Path(out_dir) if out_dir else Path("runs") / Path(path).stem
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(spec, indent=2))
    grid_keys = list(spec["grid"])
    runs = expand(spec)
    attack = str(spec["meta"]["attack"]) if "attack" in spec["meta"] else None
    for i, run in enumerate(runs, 1):
        run_dir = out / run_name(run, grid_keys)
        with claim(out, run_dir.name) as mine:
            if not mine:
                print(f"[{i}/{len(runs)}] {run_dir.name}: running in another process, skipped")
                continue
            if is_complete(run_dir):
                print(f"[{i}/{len(runs)}] {run_dir.name}: done, skipped")
                if attack is not None:
                    attack_run(run_dir, attack, str(given_or_default(run_config(run), "data-dir")))
                continue
            print(f"[{i}/{len(runs)}] {run_dir.name}")
            cfg = RunConfig.from_mapping({**run_config(run), "output-dir": str(run_dir)})
            engine, tracking = run.get("engine", "inprocess"), tracking_context(out, run, grid_keys)
            vertical = is_vertical(strategy_class(cfg.strategy))  # vertical-sl: its own runner
            if vertical:
                check_vertical(cfg)
            else:
                plan = plan_run(cfg)
                plan.tracking = tracking
            try:
                if vertical:
                    run_vertical(cfg, strategy_class(cfg.strategy), engine=engine, tracking=tracking)
                else:
                    (run_ray if engine == "ray" else run_inprocess)(plan, progress=progress)
            except (DivergedError, RunFailedError) as err:
                outcome = "diverged" if isinstance(err, DivergedError) else "failed"
                print(f"[{i}/{len(runs)}] {run_dir.name}: {outcome}: {err}")
            if attack is not None:
                attack_run(run_dir, attack, str(given_or_default(run_config(run), "data-dir")))
    table = collect(out, target=float(given_or_default(spec["meta"], "target-accuracy")))
    return table


def attack_run(run_dir: Path, options: str, data_dir: str = "") -> None:
    """``[meta] attack = "KEY=VALUE ..."``: ``sflower attack`` (:func:`simulation.privacy.attack.run_attack`,
    with those keys) on a run the sweep holds, right after it completed (or when a resumed sweep finds it
    completed without ``privacy/inversion.json``); a run that diverged or failed is not attacked. ``data_dir``:
    the run's ``data-dir`` as the sweep file gives it (the user's key; the run directory's is not read), unless
    ``options`` names one."""
    from fl_app.run.config import parse_key_values
    from simulation.privacy.attack import RESULT_JSON, run_attack

    if not (run_dir / "summary.json").is_file() or (run_dir / "privacy" / RESULT_JSON).is_file():
        return
    if read_json_table(run_dir / "summary.json").get("status") != "completed":
        return
    opts = {k.replace("_", "-"): v for k, v in parse_key_values(options.split()).items()}
    if data_dir:
        opts.setdefault("data-dir", data_dir)
    res = run_attack(run_dir, **opts)
    labels = (f", label AUC norm {res['labels']['norm_auc']:.3f}, direction {res['labels']['direction_auc']:.3f}"
              if "labels" in res else "")
    print(f"{run_dir.name}: inversion PSNR {res['psnr']:.2f} dB, SSIM {res['ssim']:.3f}{labels}")




