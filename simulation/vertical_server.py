"""A vertical run's checks and its side of the ServerApp of ``flwr run .`` (no engine here).

:func:`check_vertical` refuses what a vertical run cannot take, :func:`vertical_main` is what the ServerApp
(:mod:`simulation.server_app`) does with a ``strategy=vertical-sl`` run, on Flower's simulation or in a
deployment, and :func:`serve_grid` runs it on a grid, through the session transport where the other
strategies take it. The in-process and Ray engines are :mod:`simulation.vertical`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fl_app.data.vertical import FMNIST, vertical_names
from fl_app.run.config import RunConfig, given_or_default
from fl_app.run.errors import ConfigError
from simulation.outputs.records import RunRecorder, default_output_dir, recorded_config

log = logging.getLogger("sflower")


def is_vertical(strategy_cls: type) -> bool:
    """Whether a strategy class runs here (``vertical = True``) instead of on the event loop."""
    return bool(getattr(strategy_cls, "vertical", False))


#: The core keys a vertical run reads (its own keys aside): any other core key set to a value other than its
#: default is refused (:func:`check_unread`), so that no input is accepted and ignored.
VERTICAL_READS = frozenset({
    "strategy", "strategy-options", "dataset", "data-dir", "label-defence", "label-noise", "label-power",
    "global-iterations", "eval-every", "batch-size", "lr", "seed", "output-dir", "preset", "preset-any-strategy",
    "node-timeout", "transport", "session-address", "session-certificate", "session-key", "session-ca",
    "session-tls", "session-timeout", "checkpoint-every", "resume", "tracker"})
#: Why a vertical run refuses a key it does not read, where there is more to say than "not read".
_WHY = {
    "clock": "a vertical run keeps its own virtual clock (PSI, transfers and FLOPs; vertical-link-mbps, "
             "vertical-gflops), whatever the engine",
    "num-clients": "a vertical run's nodes are its parties (vertical-parties; 2 for a CSV pair)",
}


def check_unread(cfg: RunConfig) -> None:
    """Refuse a core key that a vertical run does not read (outside :data:`VERTICAL_READS`) at a value other
    than its default: ``resume``, ``checkpoint-every``, ``tracker``, ``num-clients``, ``clock``, ``model``, ...

    Raises:
        ConfigError: one line naming the first such key (in declaration order), its value and why.
    """
    from fl_app.run.options import CORE_OPTIONS

    values = cfg.as_dict()
    for opt in CORE_OPTIONS:
        if opt.key in VERTICAL_READS or opt.key not in values or values[opt.key] == opt.default:
            continue
        why = _WHY.get(opt.key, "strategy=vertical-sl does not read it")
        raise ConfigError(f"{opt.key}={values[opt.key]}: {why}; remove it")


def check_vertical(cfg: RunConfig) -> None:
    """Refuse, in one line, a configuration a vertical run cannot take.

    Raises:
        ConfigError: a dataset that is not vertical, ``vertical-parties`` other than 2 on a CSV pair,
            ``checkpoint-every`` with ``vertical-psi=cardinality`` (nothing to checkpoint), a
            ``label-defence`` without its strength (or a strength without it), a core key it does not read
            (:func:`check_unread`).
    """
    check_unread(cfg)
    names = vertical_names()
    if cfg.dataset not in names:
        raise ConfigError(f"strategy=vertical-sl needs a vertical dataset ({', '.join(names)}), not {cfg.dataset}")
    if cfg.dataset != FMNIST and cfg.vertical_parties != 2:
        raise ConfigError(f"vertical-parties={cfg.vertical_parties}: {cfg.dataset} has 2 parties")
    if cfg.vertical_psi == "cardinality" and cfg.checkpoint_every:
        raise ConfigError(f"checkpoint-every={cfg.checkpoint_every}: vertical-psi=cardinality trains nothing, so it "
                          "writes no checkpoint; remove it")
    if (cfg.label_defence == "iso") != (cfg.label_noise > 0) or (cfg.label_defence == "marvell") != (cfg.label_power > 0):
        raise ConfigError("label-defence=iso goes with label-noise > 0 and label-defence=marvell with label-power > 0 "
                          f"(got label-defence={cfg.label_defence}, label-noise={cfg.label_noise:g}, "
                          f"label-power={cfg.label_power:g})")


def vertical_main(grid: Any, context: Any, given: Iterable[str] | None,
                  resumed: Mapping[str, Any] | None = None) -> bool:
    """Under ``flwr run``: run ``context.run_config`` on ``grid`` if its strategy is vertical, and return True;
    False if it is not (the ServerApp's own run follows). ``given``: the keys the user gave, where a preset needs
    them (:func:`simulation.server_app.user_keys`). ``resumed``: with ``resume=RUN_DIR``, the checkpoint's
    configuration (:func:`simulation.server_app.resume_pairs`: ``output-dir`` is ``RUN_DIR``); the run then
    continues from ``RUN_DIR/checkpoint.sfl``, as ``sflower run resume=RUN_DIR`` does.

    Bad input is one logged line and exit 2, as for the other strategies.

    Raises:
        SystemExit: 2 on a :class:`ConfigError`.
    """
    from fl_app.run.plugins import strategy_class
    from strategies.core.checkpoint import CHECKPOINT_FILE

    pairs = dict(resumed) if resumed is not None else None
    try:
        cls = strategy_class(str(pairs["strategy"] if pairs else given_or_default(context.run_config, "strategy")))
    except ConfigError:
        return False  # the ServerApp's main says why
    if not is_vertical(cls):
        return False
    resume = Path(str(pairs["output-dir"])) / CHECKPOINT_FILE if pairs else None
    try:
        cfg = RunConfig.from_mapping(pairs) if pairs else RunConfig.from_mapping(context.run_config, given=given)
        check_vertical(cfg)
        recorder = start_recorder(cfg, "flwr-run", resume=resume is not None)
        ran = serve_grid(cfg, cls, recorder, grid, resume)
        summary = recorder.finish({**ran, "output_dir": str(recorder_dir(cfg))})
    except ConfigError as err:
        log.error("sflower: %s", err)
        raise SystemExit(2) from None
    log.info("sflower: %s finished: final accuracy %s, outputs in %s", summary["strategy"],
             summary.get("final_accuracy"), summary["output_dir"])
    return True


def parties_of(cfg: RunConfig) -> int:
    """K, the run's parties, the label party included (``vertical-parties`` for vertical-fmnist, else 2)."""
    return cfg.vertical_parties if cfg.dataset == FMNIST else 2


def recorder_dir(cfg: RunConfig) -> Path:
    """The run directory: ``output-dir``, else the default one of the strategy, dataset and seed."""
    return Path(cfg.output_dir) if cfg.output_dir else default_output_dir(cfg.strategy, cfg.dataset, cfg.seed)


def start_recorder(cfg: RunConfig, engine: str, resume: bool = False, tracking: Any = None) -> RunRecorder:
    """The run's :class:`RunRecorder` (``config.json`` now; ``metrics.csv`` row by row) and its ``tracker``s
    (:func:`~simulation.outputs.trackers.open_trackers`, under ``tracking``'s names and store: a sweep's, else the
    run's own); ``resume``: the run continues from a checkpoint (both keep what the run wrote before it).

    Raises:
        ConfigError: a bad ``tracker`` value, or a tracker whose package is missing.
    """
    from simulation.outputs.trackers import open_trackers

    recorder = RunRecorder(recorder_dir(cfg), recorded_config(cfg), {"parties": parties_of(cfg),
                                                                     "label_party": cfg.label_party, "engine": engine},
                           resume=resume)
    recorder.listeners = open_trackers(cfg.tracker, recorder.out_dir, cfg.as_dict(), tracking, resume)
    return recorder


def make_strategy(strategy_cls: type, cfg: RunConfig, grid: Any, recorder: RunRecorder,
                  resume_from: Path | None = None) -> Any:
    """The vertical strategy on ``grid``, writing to ``recorder``: checkpoints to ``RUN_DIR/checkpoint.sfl`` with
    ``checkpoint-every``; continuing from ``resume_from`` (a checkpoint file) when given."""
    from strategies.core.checkpoint import CHECKPOINT_FILE

    strategy = strategy_cls(cfg, grid, recorder.append)
    if cfg.checkpoint_every:
        strategy.checkpoint_path = recorder.out_dir / CHECKPOINT_FILE
    strategy.resume_from = resume_from
    strategy.on_resume = recorder.resume
    return strategy


def serve_grid(cfg: RunConfig, strategy_cls: type, recorder: RunRecorder, grid: Any,
               resume_from: Path | None = None) -> dict[str, Any]:
    """The run on a ServerApp's ``grid``: through a session per node (:mod:`simulation.session`) when
    :func:`~simulation.session.choose_transport` picks it in a deployment (TLS files given, as ``sflower deploy``
    gives them), else through Flower's messages. The wire bytes of the sessions go to the summary.

    The transport is chosen as on the wall clock (a vertical run keeps its own virtual clock: ``clock`` does not
    apply to it). ``resume_from``: the checkpoint the run continues from (:func:`make_strategy`). Raises what the
    strategy raises (ConfigError, RunFailedError).
    """
    from simulation.session import check_transport, choose_transport, open_session_grid

    check_transport(cfg)
    if choose_transport(cfg.replace(clock="wall"), grid) != "session":
        return make_strategy(strategy_cls, cfg, grid, recorder, resume_from).run()
    session = open_session_grid(grid, cfg)
    recorder.late = session.wire_bytes
    try:
        return make_strategy(strategy_cls, cfg, session, recorder, resume_from).run()
    finally:
        session.close()
