"""The ServerApp: wires configuration, task, clock, strategy and outputs together.

It lives on the top floor (``fl_app`` < ``strategies`` < ``simulation``): it
is the one place where the task and outputs of ``fl_app``, a strategy and the
virtual time of :mod:`simulation.timing` meet (docs/explanation/design.md §2). The same
:func:`run_server` runs under ``flwr run .`` (Ray simulation or deployment;
``pyproject.toml`` names ``simulation.server_app:app``), under the in-process
engine and under :func:`flwr.simulation.run_simulation`.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fl_app.run.config import RunConfig, given_or_default
from fl_app.run.device import resolve_device
from fl_app.run.errors import ConfigError
from fl_app.cut.link import check_links
from fl_app.run.numerics import establish, machine_record
from fl_app.privacy.activations import check_defences
from fl_app.run.untrusted import run_dir_config
from simulation.outputs.records import RunRecorder, default_output_dir, recorded_config
from simulation.outputs.saved_model import ModelSaver
from fl_app.learning.task import Task, check_batch_size, load_task, write_partition_plot
from simulation.privacy.record import ReceivedActivations, attach, check_record
from simulation.session import check_transport, choose_transport, open_session_grid
from simulation.vertical_server import vertical_main
from simulation.timing.clocks import VirtualClock, WallClock
from simulation.timing.devices import draw_profiles
from simulation.timing.durations import DeviceTiming, ZeroTiming
from simulation.outputs.trackers import TrackingContext, check_trackers, open_trackers
from strategies.core.checkpoint import CHECKPOINT_FILE, RESUMABLE_KEYS, read_meta
from strategies.core.registry import get_strategy
from strategies.core.hidden import check_hidden
from strategies.core.text import check_text
from strategies.core.ushaped import check_cut_layers

log = logging.getLogger("sflower")


@dataclass
class RunPlan:
    """Everything checked before a run starts, so bad input fails before any output.

    Attributes:
        cfg: the resolved configuration.
        task: dataset, partitions, model.
        strategy_cls: the strategy class.
        profiles: the device profiles drawn from the seed.
        out_dir: where the outputs go.
        resume_from: a checkpoint file to continue from (``sflower run
            resume=RUN_DIR``); None for a fresh run.
        tracking: where and under which names the ``tracker`` key's trackers
            log (None: everything in ``out_dir``; sweeps set their own).
    """

    cfg: RunConfig
    task: Task
    strategy_cls: type
    profiles: list[Any]
    out_dir: Path
    resume_from: Path | None = None
    tracking: TrackingContext | None = None


def plan_run(cfg: RunConfig) -> RunPlan:
    """Validate a configuration completely and resolve its pieces.

    Raises:
        ConfigError: unknown strategy, dataset, model or heterogeneity model,
            missing data, impossible partition, cut layer out of range,
            batch size larger than a partition, or a strategy's own check
            (``check_config``, e.g. RingSFL's propagation lengths),
            ``device=cuda`` without a GPU, a tracker whose package is
            missing (naming its ``pip install 'sflower[...]'``),
            ``numerics=portable`` in a process not started for it
            (:func:`fl_app.run.numerics.establish`), ``node-loss=rollback`` without
            ``checkpoint-every``.
    """
    establish(cfg.numerics)
    check_trackers(cfg.tracker)
    strategy_cls = get_strategy(cfg.strategy)
    resolve_device(cfg.device)  # the server side's device exists here
    profiles = draw_profiles(cfg.heterogeneity, cfg.num_clients, cfg.seed, downlink=cfg.downlink)
    task = load_task(cfg)
    check_batch_size(task, cfg.batch_size)
    check_cut_layers(strategy_cls, cfg, task)
    check_hidden(strategy_cls, cfg)
    check_text(strategy_cls.name, cfg)
    strategy_cls.check_config(cfg, task)
    weights_only = strategy_cls.weights_only_links(cfg)
    check_links(strategy_cls.name, weights_only, cfg)
    # no activations up: nothing to defend; no gradient down: the clients never back-propagate one
    check_defences(strategy_cls.name, cfg, sends_activations="up" not in weights_only,
                   zeroth_order="down" in weights_only)
    check_record(cfg)
    check_transport(cfg)
    if cfg.node_loss == "rollback" and not cfg.checkpoint_every:
        raise ConfigError("node-loss=rollback needs checkpoint-every=N: a lost node sends the run back to its last "
                          "checkpoint")
    out = Path(cfg.output_dir) if cfg.output_dir else default_output_dir(cfg.strategy, cfg.dataset, cfg.seed)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output-dir '{out}' exists and is not a directory")
    return RunPlan(cfg, task, strategy_cls, profiles, out)


def resume_pairs(resume: str, pairs: Mapping[str, Any]) -> dict[str, Any]:
    """The run configuration of ``resume=RUN_DIR``: the checkpoint's (``RUN_DIR/checkpoint.sfl``), with
    ``output-dir`` = ``RUN_DIR`` and the keys a resumed run may change (:data:`~strategies.core.checkpoint.RESUMABLE_KEYS`:
    ``checkpoint-every``, the session endpoint's) taken from ``pairs``, the keys given with it.

    The checkpoint's configuration is untrusted input (:func:`fl_app.run.untrusted.run_dir_config`): checked like
    the user's keys, and a ``data-dir`` (or TLS file, plugin strategy, preset path) it names is refused unless
    ``pairs`` names it.

    Raises:
        ConfigError: no run directory or no checkpoint in it, a checkpoint configuration that fails the checks,
            or a key of ``pairs`` that differs from the checkpoint's and may not (one line).
    """
    if not resume:
        raise ConfigError("resume needs a run directory: resume=RUN_DIR")
    run_dir = Path(resume)
    if not run_dir.is_dir():
        raise ConfigError(f"resume={resume}: no such run directory")
    pairs = {k.replace("_", "-"): v for k, v in pairs.items() if k != "resume"}
    source = run_dir / CHECKPOINT_FILE
    saved = run_dir_config(read_meta(source).get("config"), str(source), pairs)  # untrusted: fl_app.run.untrusted
    given = RunConfig.from_mapping({**saved, **pairs}).as_dict()
    for key in pairs:
        if key == "output-dir" and Path(str(given[key])).resolve() == run_dir.resolve():
            continue
        if key not in RESUMABLE_KEYS and given[key] != saved.get(key):
            raise ConfigError(f"resume: {key}={pairs[key]} differs from the checkpoint's {key}={saved.get(key)!r} "
                              f"(give only {', '.join(sorted(RESUMABLE_KEYS - {'output-dir', 'resume'}))}, or nothing)")
    changed = {k: given[k] for k in pairs if k in RESUMABLE_KEYS}
    return {**saved, **changed, "resume": "", "output-dir": str(run_dir)}


def run_server(grid: Grid, plan: RunPlan, *, progress: bool = True) -> dict[str, Any]:
    """Run the planned strategy on ``grid``; write the outputs; return the summary.

    With ``checkpoint-every`` > 0 the strategy writes ``out_dir/checkpoint.sfl``;
    with ``plan.resume_from`` it continues from that checkpoint. The run
    directory also gets ``partition.png`` (the clients' label histograms),
    the trained model (``model.safetensors``, :mod:`simulation.outputs.saved_model`) and
    the ``tracker`` key's logs (:mod:`simulation.outputs.trackers`).

    Raises:
        ConfigError: an unusable checkpoint.
    """
    cfg = plan.cfg
    if cfg.clock == "virtual":
        clock, timing = VirtualClock(), DeviceTiming(plan.profiles, cfg.seed, cfg.straggler_rate,
                                                     cfg.server_speed or math.inf)  # 0: free
    else:
        clock, timing = WallClock(), ZeroTiming()
    extra = {
        "device_profiles": [p.as_dict() for p in plan.profiles],
        "model_blocks": [
            {"name": b.name, "forward_flops": b.forward_flops, "backward_flops": b.backward_flops,
             "param_bytes": b.param_bytes, "output_shape": list(b.output_shape)}
            for b in plan.task.profiles
        ],
        "partition_sizes": [len(p) for p in plan.task.partitions],
        "transport": choose_transport(cfg, grid),
    }
    resume = plan.resume_from is not None
    saver = ModelSaver(plan.out_dir, ModelSaver.describe(cfg, plan.task), save_best=cfg.save_best)
    recorder = RunRecorder(plan.out_dir, recorded_config(cfg), extra, resume=resume,
                           machine=machine_record(cfg.numerics))
    if not (resume and (plan.out_dir / "partition.png").exists()):
        write_partition_plot(plan.task, plan.out_dir / "partition.png")
    recorder.listeners = [saver, *open_trackers(cfg.tracker, plan.out_dir, cfg.as_dict(), plan.tracking, resume)]
    strategy = plan.strategy_cls(cfg, plan.task, clock=clock, timing=timing, recorder=recorder, progress=progress)
    saver.bind(strategy)
    if cfg.checkpoint_every:
        strategy.checkpoint_path = plan.out_dir / CHECKPOINT_FILE
    received = ReceivedActivations(tails=cfg.ushaped) if cfg.get("privacy-record") else None
    if received is not None:
        if not resume:
            received.clear_truth(plan.out_dir)
        attach(strategy, received)
    strategy.resume_from = plan.resume_from
    if extra["transport"] == "session":  # docs/explanation/design.md §4, "The session transport"
        grid = open_session_grid(grid, cfg)
        recorder.late = grid.wire_bytes
        try:
            strategy.start(grid)
        finally:
            grid.close()
    else:
        strategy.start(grid)
    if received is not None:  # privacy-record: what the server received, for sflower attack
        received.write(plan.out_dir)
    return strategy.summary_dict()


app = ServerApp()


def override_config(grid: Grid) -> dict[str, Any]:
    """The keys the user gave ``flwr run`` (Flower's override config; empty where the grid has no run)."""
    try:
        return dict(grid.run.override_config)
    except (AttributeError, TypeError, RuntimeError):  # a grid without a run (tests, other engines)
        return {}


def user_keys(grid: Grid) -> set[str] | None:
    """The keys the user gave ``flwr run`` (Flower's override config), where they name a preset.

    ``context.run_config`` holds every key (``pyproject.toml``'s defaults
    fused with the user's), so a ``preset`` there cannot tell the user's keys
    from defaults; Flower's override config can. ``None`` (every key counts
    as given) when no preset was given there: then ``preset`` is either
    empty or was applied already (``sflower deploy`` and the Ray engine pass
    resolved configurations).
    """
    override = override_config(grid)
    return set(override) if "preset" in override else None


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under ``flwr run``: the run config comes from ``context.run_config``.

    sflower's INFO lines (the strategy's settings, the session endpoint's address, re-admissions) go to
    the ServerApp's log, which ``flwr run --stream`` shows.
    """
    with server_log():
        _main(grid, context)


@contextmanager
def server_log():
    """sflower's INFO lines on the ServerApp's stderr while the ServerApp runs; the logger as it was afterwards.

    A ServerApp run in the caller's process (Flower's in-process simulation, a test) leaves the
    ``sflower`` logger's handlers, level and propagation unchanged, so the caller's own logging (and
    pytest's ``caplog``) sees sflower's records after the run as before it.
    """
    saved = (list(log.handlers), log.level, log.propagate)
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    try:
        yield
    finally:
        log.handlers[:] = saved[0]
        log.setLevel(saved[1])
        log.propagate = saved[2]


def _main(grid: Grid, context: Context) -> None:
    """:func:`main`'s body, with sflower's log set up."""
    try:  # resume=RUN_DIR: the checkpoint's configuration, with the keys the user gave that a resume may change
        resume = str(given_or_default(context.run_config, "resume") or "")
        resumed = resume_pairs(resume, override_config(grid)) if resume else None
    except ConfigError as err:
        log.error("sflower: %s", err)
        raise SystemExit(2) from None
    if vertical_main(grid, context, user_keys(grid), resumed):  # strategy=vertical-sl: simulation.vertical_server
        return
    try:
        if resumed is not None:
            plan = plan_run(RunConfig.from_mapping(resumed))
            plan.resume_from = Path(resume) / CHECKPOINT_FILE
        else:
            plan = plan_run(RunConfig.from_mapping(context.run_config, given=user_keys(grid)))
    except ConfigError as err:
        log.error("sflower: %s", err)
        raise SystemExit(2) from None
    summary = run_server(grid, plan)
    log.info("sflower: %s finished: final accuracy %.4f, outputs in %s",
             summary["strategy"], summary["final_accuracy"], plan.out_dir)

