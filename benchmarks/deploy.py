"""Exchange latency in deployment (issues 12 and 23): the session transport against Flower's messages.

``sflower deploy bench [exchanges=E] [tls=true] [auth=true] [fast=false] [batch-size=B] [run-dir=DIR]``

It starts loopback deployments (:mod:`simulation.deploy`) with one
SuperNode and measures, on the wall clock, three routes with the same
payload (a float32 array of the cut layer's activation size, ``B`` x 64x7x7
for AlexNet on MNIST: 401 kB at B=32):

* **session echo**: a bare app (written to ``RUN_DIR/echo-app``) whose
  ServerApp sends the payload over a session (:mod:`simulation.session`,
  TLS with the deployment's CA) and whose ClientApp returns it unchanged;
  ``E`` sequential round trips, each timed from ``push_messages`` to the
  reply's ``pull_messages``, after one untimed round trip that opens the
  session (reported as ``session_open_s``);
* **Flower echo**: the same app and payload through Flower messages;
* **session split**: ``splitfed-v1`` with one client (``concurrency=1``)
  over a session, 2 global iterations of about ``E/2`` local iterations;
  the per-exchange latency is the second global iteration's wall time over
  its exchanges (the session is open by then; it includes the client's
  compute and one evaluation, so it overstates the exchange).

``fast=true`` runs the deployments with the SuperNode's polling shortened
(:mod:`simulation.deploy.supernode`). Results go to ``RUN_DIR/bench.json``
and are printed as a table.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fl_app.run.errors import ConfigError
from simulation.deploy.cluster import Deployment
from simulation.deploy.options import coerce_opt, fresh_run_dir, parse_deploy_args
from simulation.deploy.processes import DeployError, wait_for
from simulation.deploy.run import deploy

BENCH_DEFAULTS: dict[str, Any] = {"fast": "false", "exchanges": 10, "tls": "true", "auth": "true", "run-dir": "",
                                  "batch-size": 32}

ECHO_PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sflower-echo"
version = "0.1.0"
description = "Echo ClientApp: returns the message it receives (sflower deploy bench)"
license = "Apache-2.0"
dependencies = ["flwr>=1.42.0,<1.43"]

[tool.setuptools]
py-modules = ["sflower_echo"]

[tool.flwr.app]
publisher = "sflower"

[tool.flwr.app.components]
serverapp = "sflower_echo:server"
clientapp = "sflower_echo:client"

[tool.flwr.app.config]
rounds = 10
floats = 100352
out = ""
transport = "flower"
session-certificate = ""
session-key = ""
session-ca = ""
session-tls = true
"""

ECHO_APP = '''"""Echo app: the ServerApp times round trips of a float32 payload that the ClientApp returns unchanged."""

import json
import time

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fl_app.run.config import RunConfig
from fl_app.session.client import serve_session
from simulation.session import open_session_grid

server = ServerApp()
client = ClientApp()


@client.query()
def echo(msg: Message, context: Context) -> Message:
    return Message(msg.content, reply_to=msg)


@client.query("session")
def session(msg: Message, context: Context) -> Message:
    return serve_session(msg, context, client)


def round_trip(grid, node, payload):
    content = RecordDict({"x": ArrayRecord({"x": Array(payload)})})
    t0 = time.perf_counter()
    ids = list(grid.push_messages([Message(content, node, "query")]))
    replies = []
    while not replies:
        replies = list(grid.pull_messages(ids))
        if not replies:
            time.sleep(0.001)
    seconds = time.perf_counter() - t0
    reply = replies[0]
    assert not reply.has_error(), reply.error.reason
    assert np.array_equal(reply.content["x"]["x"].numpy(), payload)
    return seconds


@server.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    rounds, floats, out = int(cfg["rounds"]), int(cfg["floats"]), str(cfg["out"])
    while not list(grid.get_node_ids()):
        time.sleep(0.05)
    node = list(grid.get_node_ids())[0]
    payload = np.random.default_rng(0).standard_normal(floats).astype(np.float32)
    opened = 0.0
    if cfg["transport"] == "session":
        keys = ("session-certificate", "session-key", "session-ca", "session-tls")
        grid = open_session_grid(grid, RunConfig.from_mapping({"session-address": "localhost:0", "num-clients": 1, "concurrency": 1,
                                                               **{k: cfg[k] for k in keys}}))
        opened = round_trip(grid, node, payload)
    try:
        seconds = [round_trip(grid, node, payload) for _ in range(rounds)]
    finally:
        if cfg["transport"] == "session":
            grid.close()
    with open(out, "w") as fh:
        json.dump({"seconds": seconds, "floats": floats, "session_open_s": opened}, fh)
'''


def echo_exchange(run_dir: Path, *, exchanges: int, floats: int, tls: bool, auth: bool, fast: bool,
                  transport: str, timeout: float = 900.0) -> dict[str, Any]:
    """Echo round trips through a loopback SuperLink and one SuperNode, by ``transport`` (``flower`` or ``session``).

    Returns:
        ``{"seconds": [s per round trip], "session_open_s": s}`` (0 for ``flower``).

    Raises:
        DeployError: a process failed or the echo run did not write its result in ``timeout`` s.
    """
    app = run_dir / "echo-app"
    app.mkdir(parents=True, exist_ok=True)
    (app / "pyproject.toml").write_text(ECHO_PYPROJECT)
    (app / "sflower_echo.py").write_text(ECHO_APP)
    out = run_dir / "echo.json"
    with Deployment(run_dir, tls=tls, auth=auth, fast=fast) as dep:
        dep.start_superlink()
        spec = dep.add_node(0, run_dir)
        dep.start_node(spec, 1)
        config: dict[str, Any] = {"rounds": exchanges, "floats": floats, "out": str(out), "transport": transport,
                                  "session-tls": tls}
        if tls:
            config.update({"session-certificate": str(dep.certs["cert"]), "session-key": str(dep.certs["key"]),
                           "session-ca": str(dep.certs["ca"])})
        runner = dep.run_app(config, app_dir=app)
        wait_for(lambda: out.exists() or not runner.alive(), timeout, "the echo run", alive=[dep.superlink])
        wait_for(out.exists, 10.0, f"echo.json (see {runner.log_path})")
    result = json.loads(out.read_text())
    return {"seconds": [float(x) for x in result["seconds"]], "session_open_s": float(result["session_open_s"])}


def split_exchange(run_dir: Path, *, exchanges: int, batch_size: int, tls: bool, auth: bool,
                   fast: bool) -> tuple[float, int, dict[str, Any]]:
    """Wall seconds per split exchange over a session (splitfed-v1, one SuperNode, the second global iteration).

    Returns:
        ``(seconds per exchange, exchanges timed, summary)``.

    Raises:
        ConfigError: bad options; DeployError: the deployment failed (see :func:`simulation.deploy.run.deploy`).
    """
    local = max(1, exchanges // 2)  # a local iteration is a forward and a backward exchange
    options = parse_deploy_args({
        "nodes": "1", "tls": str(tls), "auth": str(auth), "fast": str(fast), "run-dir": str(run_dir),
        "strategy": "splitfed-v1", "num-clients": "1", "concurrency": "1", "partition": "iid",
        "global-iterations": "2", "local-iterations": str(local), "batch-size": str(batch_size),
        "transport": "session", "eval-samples": "200",
    })
    summary = deploy(options, quiet=True)
    with open(run_dir / "out" / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    n = int(rows[-1]["exchanges"]) - int(rows[-2]["exchanges"])
    seconds = (float(rows[-1]["wall_time_s"]) - float(rows[-2]["wall_time_s"])) / max(n, 1)
    return seconds, n, summary


def _stats(seconds: list[float]) -> dict[str, float]:
    return {"mean_s": statistics.fmean(seconds), "median_s": statistics.median(seconds), "min_s": min(seconds),
            "max_s": max(seconds)}


def run_bench(pairs: Mapping[str, str]) -> dict[str, Any]:
    """``sflower deploy bench``: the three routes of the module docstring; print and save.

    Raises:
        ConfigError: an unknown key or a bad value.
        DeployError: a deployment failed.
    """
    opts = dict(BENCH_DEFAULTS)
    for key, value in pairs.items():
        if key not in BENCH_DEFAULTS:
            raise ConfigError(f"deploy bench takes {', '.join(BENCH_DEFAULTS)}, not '{key}'")
        opts[key] = value
    try:
        exchanges, batch = int(opts["exchanges"]), int(opts["batch-size"])
    except ValueError:
        raise ConfigError("exchanges and batch-size must be integers") from None
    if exchanges < 2 or batch < 1:
        raise ConfigError("exchanges must be >= 2 and batch-size >= 1")
    tls, auth, fast = coerce_opt("tls", opts["tls"]), coerce_opt("auth", opts["auth"]), coerce_opt("fast", opts["fast"])
    root = fresh_run_dir(opts["run-dir"], f"runs/deploy-bench-{time.strftime('%Y%m%d-%H%M%S')}")
    floats = batch * 64 * 7 * 7  # AlexNet (MNIST) activation at the default cut
    results: dict[str, Any] = {"exchanges": exchanges, "batch_size": batch, "payload_bytes": floats * 4,
                               "tls": tls, "auth": auth, "fast": fast, "routes": {}}
    for transport in ("session", "flower"):
        echo = echo_exchange(root / f"echo-{transport}", exchanges=exchanges, floats=floats, tls=tls, auth=auth,
                             fast=fast, transport=transport)
        entry = _stats(echo["seconds"])
        if transport == "session":
            entry["session_open_s"] = echo["session_open_s"]
        results["routes"][f"{transport} echo"] = entry
    split, n, _ = split_exchange(root / "split-session", exchanges=exchanges, batch_size=batch, tls=tls, auth=auth,
                                 fast=fast)
    results["routes"]["session split"] = {"mean_s": split, "exchanges": n}
    print(f"payload {floats * 4 / 1e3:.0f} kB, tls={tls}, auth={auth}, fast={fast}")
    print(f"{'route':<15} {'mean ms':>9} {'median ms':>10} {'min ms':>8} {'max ms':>8}")
    for name, r in results["routes"].items():
        cells = [f"{1e3 * r[k]:>{w}.1f}" if k in r else f"{'-':>{w}}"
                 for k, w in (("mean_s", 9), ("median_s", 10), ("min_s", 8), ("max_s", 8))]
        print(f"{name:<15} {' '.join(cells)}")
    print(f"session opening (one Flower message, untimed above): {results['routes']['session echo']['session_open_s']:.2f} s")
    root.mkdir(parents=True, exist_ok=True)
    (root / "bench.json").write_text(json.dumps(results, indent=2))
    print(f"written: {root / 'bench.json'}")
    return results


__all__ = ["DeployError", "echo_exchange", "run_bench", "split_exchange"]
