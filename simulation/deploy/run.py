"""One loopback deployment from start to summary: :func:`deploy` (``sflower deploy``).

It writes each node's data, starts the cluster (:class:`~simulation.deploy.cluster.Deployment`),
runs the app, injects the fault asked for (``kill-node``), waits for
``summary.json`` and stops everything (the package docstring lists the steps).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from fl_app.run.config import RunConfig, installed_declarations
from fl_app.run.plugins import options_of, strategy_class
from simulation.deploy.cluster import Deployment
from simulation.deploy.faults import Faults
from simulation.deploy.keys import certificate_paths
from simulation.deploy.options import DeployOptions, fresh_run_dir
from simulation.deploy.processes import DeployError, terminate_on_sigterm, wait_for
from strategies.core.checkpoint import CHECKPOINT_FILE


#: ``session-timeout`` of a loopback deployment (s): every node opens its session at the handshake, and on one
#: machine their ClientApps all start at once (20 on 2 cores took over the default 60 s to connect).
LOOPBACK_SESSION_TIMEOUT_S = 300.0


def run_config_for(cfg: RunConfig, given: Mapping[str, Any], out_dir: Path,
                   certs: Mapping[str, Path] | None = None) -> dict[str, Any]:
    """The ``--run-config`` table: the keys given (typed as in ``cfg``; a plugin's in ``strategy-options``),
    plus ``output-dir``.

    Unless given, it also sets up the session transport (docs/explanation/design.md §4):
    ``session-address=localhost:0`` (a free loopback port),
    ``session-timeout`` = :data:`LOOPBACK_SESSION_TIMEOUT_S` and, with TLS
    (``certs``: the deployment's ``ca``, ``cert`` and ``key``), the
    endpoint's certificate, key and CA (the SuperLink's own, made for
    localhost); without TLS, ``session-tls=false``.
    """
    values = cfg.as_dict()
    pyproject_keys = installed_declarations(builtin_only=True)  # Flower refuses other keys: a plugin's go in strategy-options
    table = {k: values[k] for k in given if k in pyproject_keys and k != "strategy-options"}
    own = [opt.key for opt in options_of(strategy_class(cfg.strategy))] + list(given)
    plugin = {k: values[k] for k in dict.fromkeys(own) if k in values and k not in pyproject_keys}
    if plugin:
        table["strategy-options"] = " ".join(f"{k}={v}" for k, v in plugin.items())
    table["output-dir"] = str(out_dir)
    session: dict[str, Any] = {"session-address": "localhost:0", "session-timeout": LOOPBACK_SESSION_TIMEOUT_S}
    if certs:
        session.update({"session-certificate": str(certs["cert"]), "session-key": str(certs["key"]),
                        "session-ca": str(certs["ca"])})
    else:
        session["session-tls"] = False
    for key, value in session.items():
        table.setdefault(key, value)
    return table


def _trained_rows(path: Path) -> int:
    """Rows of ``metrics.csv`` written after training started (global iteration >= 1; 0 while there is no file).

    Row 0 is the evaluation of the initial model, before any node has opened
    its session: a fault timed from it can land while a node is still
    starting its ClientApp, where only SuperLink's heartbeat (tens of
    seconds) notices it. After a trained row, the sessions are open.
    """
    try:
        lines = path.read_text().strip().splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines[1:] if line.split(",", 1)[0].strip() not in ("", "0"))


def deploy(options: DeployOptions, *, quiet: bool = False) -> dict[str, Any]:
    """Run one loopback deployment (module docstring); return the run's summary plus a ``deploy`` entry.

    The ``deploy`` entry holds the run directory, the wall seconds to start
    the processes and to run, the node count, and the fault injected (if any).

    Raises:
        ConfigError: bad run configuration (checked before anything starts).
        DeployError: a process failed, the run failed, or ``timeout`` passed.
        KeyboardInterrupt: Ctrl-C or SIGTERM; every process is stopped first.
    """
    from fl_app.learning.task import write_partition_dirs
    from simulation.server_app import plan_run  # imported late: it loads torch

    o, cfg = options.opts, options.cfg
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = fresh_run_dir(o["run-dir"], f"runs/deploy-{cfg.strategy}-{stamp}")
    out_dir = run_dir / "out"
    run_config = run_config_for(cfg, options.run_pairs, out_dir,
                                certificate_paths(run_dir / "certs") if o["tls"] else None)
    vertical = bool(getattr(strategy_class(cfg.strategy), "vertical", False))
    if vertical:  # one SuperNode per party, each with its own file only (simulation.deploy.vertical)
        from simulation.deploy.vertical import check_vertical_deploy

        check_vertical_deploy(RunConfig.from_mapping(run_config), o["nodes"])
    else:
        plan_run(RunConfig.from_mapping(run_config))  # one-line errors before anything starts
    say = (lambda *a: None) if quiet else (lambda msg: print(f"[deploy] {msg}", flush=True))
    nodes, intruders = o["nodes"], o["intruders"]
    t_start = time.monotonic()
    with terminate_on_sigterm(), Deployment(run_dir, tls=o["tls"], auth=o["auth"], fast=o["fast"],
                                             isolation=o["isolation"]) as dep:
        if vertical:
            from simulation.deploy.vertical import server_run_config, write_vertical_dirs

            dirs = write_vertical_dirs(cfg, run_dir / "data", nodes + intruders)
            run_config = server_run_config(cfg, run_config, run_dir / "data")  # label-party=server: its own file
        else:
            dirs = write_partition_dirs(cfg, run_dir / "data")
        say(f"wrote {len(dirs)} {'party data dirs' if vertical else 'partitions'} to {run_dir / 'data'}")
        dep.start_superlink()
        say(f"SuperLink on 127.0.0.1:{dep.port} (tls={dep.tls}, auth={dep.auth}); logs in {dep.logs}")
        specs = [dep.add_node(k, dirs[k], authorised=k < nodes) for k in range(nodes + intruders)]
        for spec in specs:
            dep.start_node(spec, cfg.num_clients)
        say(f"{nodes} SuperNodes started" + (f", {intruders} with unregistered keys" if intruders else ""))
        t_run = time.monotonic()
        runner = dep.run_app(run_config)
        summary_path = out_dir / "summary.json"
        deadline = t_run + o["timeout"]
        first_row_at = None
        faults = Faults(o, dep, specs[:nodes], cfg.num_clients,
                        lambda: dep.run_app({**run_config, "resume": str(out_dir)}, name="flwr-run-resumed"),
                        out_dir / CHECKPOINT_FILE, say)
        while not summary_path.exists():
            dep.processes.refresh()
            now = time.monotonic()
            if first_row_at is None and _trained_rows(out_dir / "metrics.csv") >= 1:
                first_row_at = now
            runner = faults.step(runner, first_row_at)
            if not dep.superlink.alive():
                raise DeployError(f"the SuperLink exited (code {dep.superlink.popen.returncode}); "
                                  f"see {dep.superlink.log_path}")
            if not runner.alive():
                # `flwr run --stream` returns when the run ends; give the summary a moment to land
                with suppress(DeployError):
                    wait_for(summary_path.exists, 10.0, "summary.json")
                if not summary_path.exists():
                    raise DeployError(f"the run ended without summary.json (flwr run exit {runner.popen.returncode});"
                                      f" see {runner.log_path} and {dep.logs}")
                break
            if now > deadline:
                raise DeployError(f"the run did not finish within timeout={o['timeout']:g} s; see {dep.logs}")
            time.sleep(0.5)
        summary = json.loads(summary_path.read_text())
        t_end = time.monotonic()
        # the ServerApp writes summary.json, then closes its sessions (the nodes' handlers return and Flower stores
        # their context.state) and stops its endpoint; `flwr run --stream` exits when it is done
        with suppress(DeployError):
            wait_for(lambda: not runner.alive(), 60.0, "the end of the run")
        # unregistered SuperNodes: Flower refuses them (they exit with "Failed to activate SuperNode")
        refused = {s.pid: s.proc.popen.returncode for s in specs if not s.authorised and s.proc is not None
                   and not s.proc.alive()}
    summary["deploy"] = {
        "run_dir": str(run_dir), "nodes": nodes, "intruders": intruders, "tls": o["tls"], "auth": o["auth"],
        "fast": o["fast"], "isolation": o["isolation"], "startup_s": round(t_run - t_start, 3),
        "run_s": round(t_end - t_run, 3),
        "killed_node": o["kill-node"] if o["kill-node"] >= 0 and faults.events else None,
        **faults.record(),
        "refused_nodes": {str(k): v for k, v in refused.items()},
    }
    (run_dir / "deploy.json").write_text(json.dumps(summary["deploy"], indent=2))
    if not str(summary.get("status", "")).startswith("completed"):
        raise DeployError(f"the run ended with status '{summary.get('status')}'; outputs in {out_dir}")
    return summary

