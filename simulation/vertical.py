"""Running ``strategy=vertical-sl``: its nodes, its grid and its run directory.

``sflower run strategy=vertical-sl dataset=vertical-breast ...`` comes here instead of
:func:`simulation.server_app.plan_run` (a vertical run has no image task). The in-process engine's
:class:`~simulation.engine.InProcessGrid` runs the parties' ClientApp (:mod:`fl_app.vertical_party`),
node ``k`` with ``node_config`` ``vertical-party=k``; with ``label-party=server`` there is no node 0.
The run directory gets the same ``config.json``, ``metrics.csv``, ``summary.json`` and
``accuracy.png`` as every run (:class:`~simulation.outputs.records.RunRecorder`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fl_app.config import RunConfig
from fl_app.data.vertical import FMNIST, VERTICAL_DATASETS
from fl_app.errors import ConfigError
from fl_app.vertical_party import PARTY
from fl_app.vertical_party import app as party_app
from simulation.engine import InProcessGrid, _task_identity
from simulation.outputs.records import RunRecorder, default_output_dir
from simulation.server_app import recorded_config


def is_vertical(strategy_cls: type) -> bool:
    """Whether a strategy class runs here (``vertical = True``) instead of on the event loop."""
    return bool(getattr(strategy_cls, "vertical", False))


#: The core keys a vertical run reads (its own keys aside): any other core key set to a value other than its
#: default is refused (:func:`check_unread`), so that no input is accepted and ignored.
VERTICAL_READS = frozenset({
    "strategy", "strategy-options", "dataset", "data-dir", "label-defence", "label-noise", "label-power",
    "global-iterations", "eval-every", "batch-size", "lr", "seed", "output-dir", "preset", "preset-any-strategy",
    "node-timeout", "transport", "session-address", "session-certificate", "session-key", "session-ca",
    "session-tls", "session-timeout"})
#: Why a vertical run refuses a key it does not read, where there is more to say than "not read".
_WHY = {
    "resume": "a vertical run writes no checkpoint, so it cannot resume (run it again: it is deterministic)",
    "checkpoint-every": "a vertical run writes no checkpoint (its parties' models stay on their nodes)",
    "tracker": "a vertical run logs to metrics.csv only, no experiment tracker",
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
    from fl_app.options import CORE_OPTIONS

    values = cfg.as_dict()
    for opt in CORE_OPTIONS:
        if opt.key in VERTICAL_READS or opt.key not in values or values[opt.key] == opt.default:
            continue
        why = _WHY.get(opt.key, "strategy=vertical-sl does not read it")
        raise ConfigError(f"{opt.key}={values[opt.key]}: {why}; remove it")


def check_vertical(cfg: RunConfig) -> None:
    """Refuse, in one line, a configuration a vertical run cannot take.

    Raises:
        ConfigError: a dataset that is not vertical, ``vertical-parties`` other than 2 on a CSV pair, a
            ``label-defence`` without its strength (or a strength without it), a core key it does not read
            (:func:`check_unread`).
    """
    check_unread(cfg)
    names = [*VERTICAL_DATASETS, FMNIST]
    if cfg.dataset not in names:
        raise ConfigError(f"strategy=vertical-sl needs a vertical dataset ({', '.join(names)}), not {cfg.dataset}")
    if cfg.dataset != FMNIST and cfg.vertical_parties != 2:
        raise ConfigError(f"vertical-parties={cfg.vertical_parties}: {cfg.dataset} has 2 parties (its CSV pair)")
    if (cfg.label_defence == "iso") != (cfg.label_noise > 0) or (cfg.label_defence == "marvell") != (cfg.label_power > 0):
        raise ConfigError("label-defence=iso goes with label-noise > 0 and label-defence=marvell with label-power > 0 "
                          f"(got label-defence={cfg.label_defence}, label-noise={cfg.label_noise:g}, "
                          f"label-power={cfg.label_power:g})")


def run_vertical(cfg: RunConfig, strategy_cls: type, *, engine: str = "inprocess",
                 grid: Any = None) -> dict[str, Any]:
    """Run a vertical configuration; returns the summary (also in ``summary.json``).

    ``grid``: the ServerApp's grid under ``flwr run`` (Flower's simulation or a deployment; ``engine`` is then
    ignored): node ``i`` is the party of its ``vertical-party`` or ``partition-id``. In a deployment the messages
    take the session transport where the other strategies' do (:func:`serve_grid`).

    Raises:
        ConfigError: see :func:`check_vertical`; an engine other than ``inprocess`` or ``ray``.
    """
    check_vertical(cfg)
    if grid is None and engine not in ("inprocess", "ray"):
        raise ConfigError(f"engine={engine}: vertical-sl runs on the in-process or the Ray engine")
    parties = cfg.vertical_parties if cfg.dataset == FMNIST else 2
    first = 1 if cfg.label_party == "server" else 0
    configs = [{PARTY: k} for k in range(first, parties)]
    out = Path(cfg.output_dir) if cfg.output_dir else default_output_dir(cfg.strategy, cfg.dataset, cfg.seed)
    recorder = RunRecorder(out, recorded_config(cfg), {"parties": parties, "label_party": cfg.label_party,
                                                       "engine": "flwr-run" if grid is not None else engine})
    if grid is not None:
        summary = serve_grid(cfg, strategy_cls, recorder, grid)
    elif engine == "ray":
        summary = _run_ray(cfg, strategy_cls, recorder, len(configs))
    else:
        grid = InProcessGrid(party_app, len(configs), cfg.seed, configs)
        with _task_identity(grid.run.run_id):
            summary = strategy_cls(cfg, grid, recorder.append).run()
    summary["output_dir"] = str(out)
    return recorder.finish(summary)


def serve_grid(cfg: RunConfig, strategy_cls: type, recorder: RunRecorder, grid: Any) -> dict[str, Any]:
    """The run on a ServerApp's ``grid``: through a session per node (:mod:`simulation.session`) when
    :func:`~simulation.session.choose_transport` picks it in a deployment (TLS files given, as ``sflower deploy``
    gives them), else through Flower's messages. The wire bytes of the sessions go to the summary.

    The transport is chosen as on the wall clock (a vertical run keeps its own virtual clock: ``clock`` does not
    apply to it). Raises what the strategy raises (ConfigError, RunFailedError).
    """
    from simulation.session import check_transport, choose_transport, open_session_grid

    check_transport(cfg)
    if choose_transport(cfg.replace(clock="wall"), grid) != "session":
        return strategy_cls(cfg, grid, recorder.append).run()
    session = open_session_grid(grid, cfg)
    recorder.late = session.wire_bytes
    try:
        return strategy_cls(cfg, session, recorder.append).run()
    finally:
        session.close()


def _run_ray(cfg: RunConfig, strategy_cls: type, recorder: RunRecorder, nodes: int) -> dict[str, Any]:
    """The run on Flower's Ray simulation engine: ``nodes`` virtual SuperNodes, node ``i`` the party of its
    ``partition-id`` (:func:`fl_app.vertical_party.party_index`), one CPU each.

    Raises:
        RuntimeError: the simulation ended without a summary (it failed inside Flower; its log says why).
    """
    import os

    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    result: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Any) -> None:
        result["summary"] = strategy_cls(cfg, grid, recorder.append).run()

    run_simulation(server_app=server_app, client_app=party_app, num_supernodes=nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": max(2, nodes), "include_dashboard": False,
                                                 "log_to_driver": False}})
    if "summary" not in result:
        raise RuntimeError("the Ray simulation ended without a summary; see the log above")
    return result["summary"]
