"""Running ``strategy=vertical-sl``: its nodes, its grid and its run directory.

``sflower run strategy=vertical-sl dataset=vertical-breast ...`` comes here instead of
:func:`simulation.server_app.plan_run` (a vertical run has no image task). The in-process engine's
:class:`~simulation.engine.InProcessGrid` runs the parties' ClientApp (:mod:`fl_app.vertical.party`),
node ``k`` with ``node_config`` ``vertical-party=k``; with ``label-party=server`` there is no node 0.
The run directory gets the same ``config.json``, ``metrics.csv``, ``summary.json`` and
``accuracy.png`` as every run (:class:`~simulation.outputs.records.RunRecorder`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError
from fl_app.vertical.party import PARTY
from fl_app.vertical.party import app as party_app
from simulation.engine import InProcessGrid, _task_identity
from simulation.outputs.records import RunRecorder
from simulation.vertical_server import (  # noqa: F401
    check_unread,
    check_vertical,
    is_vertical,
    make_strategy,
    parties_of,
    recorder_dir,
    serve_grid,
    start_recorder,
)


def run_vertical(cfg: RunConfig, strategy_cls: type, *, engine: str = "inprocess",
                 resume_from: Path | None = None, tracking: Any = None) -> dict[str, Any]:
    """Run a vertical configuration on the in-process or the Ray engine; returns the summary (also in
    ``summary.json``). Under ``flwr run`` the ServerApp runs it instead
    (:func:`simulation.vertical_server.vertical_main`). ``resume_from``: a checkpoint file (``checkpoint.sfl`` of
    ``cfg``'s run directory) to continue from; ``tracking``: the trackers' names and store
    (:class:`~simulation.outputs.trackers.TrackingContext`; a sweep's, else the run's own).

    Raises:
        ConfigError: see :func:`check_vertical`; an engine other than ``inprocess`` or ``ray``.
    """
    check_vertical(cfg)
    if engine not in ("inprocess", "ray"):
        raise ConfigError(f"engine={engine}: vertical-sl runs on the in-process or the Ray engine")
    first = 1 if cfg.label_party == "server" else 0
    configs = [{PARTY: k} for k in range(first, parties_of(cfg))]
    recorder = start_recorder(cfg, engine, resume=resume_from is not None, tracking=tracking)
    if engine == "ray":
        summary = _run_ray(cfg, strategy_cls, recorder, len(configs), resume_from)
    else:
        grid = InProcessGrid(party_app, len(configs), cfg.seed, configs)
        with _task_identity(grid.run.run_id):
            summary = make_strategy(strategy_cls, cfg, grid, recorder, resume_from).run()
    summary["output_dir"] = str(recorder_dir(cfg))
    return recorder.finish(summary)


def _run_ray(cfg: RunConfig, strategy_cls: type, recorder: RunRecorder, nodes: int,
             resume_from: Path | None) -> dict[str, Any]:
    """The run on Flower's Ray simulation engine: ``nodes`` virtual SuperNodes, node ``i`` the party of its
    ``partition-id`` (:func:`fl_app.vertical.party.party_index`), one CPU each.

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
        result["summary"] = make_strategy(strategy_cls, cfg, grid, recorder, resume_from).run()

    run_simulation(server_app=server_app, client_app=party_app, num_supernodes=nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": max(2, nodes), "include_dashboard": False,
                                                 "log_to_driver": False}})
    if "summary" not in result:
        raise RuntimeError("the Ray simulation ended without a summary; see the log above")
    return result["summary"]
