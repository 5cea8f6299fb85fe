"""Exchange latency in deployment (issue 12, P6): one split exchange against a bare echo ClientApp.

``sflower deploy bench [fast=false|true|both] [exchanges=E] [tls=true] [auth=true] [run-dir=DIR]``

For each setting it starts a loopback deployment (:mod:`simulation.deploy`)
with one SuperNode and measures, on the wall clock:

* **echo**: a bare Flower app (written to ``RUN_DIR/echo-app``) whose
  ServerApp sends the payload of one split exchange (a float32 array of the
  cut layer's activation size, ``batch-size`` x 64x7x7 for AlexNet on MNIST)
  and whose ClientApp returns it unchanged; ``E`` sequential round trips,
  timed from ``push_messages`` to the reply's ``pull_messages``;
* **split**: ``splitfed-v1`` with one client, ``concurrency=1``,
  ``local-iterations`` chosen so the run makes about ``E`` exchanges; the
  per-exchange latency is ``(wall_time_s of the final row - of the first row)
  / exchanges`` from ``metrics.csv`` (it includes the client's compute and
  the final evaluation, so it slightly overstates the exchange).

P6 = split exchange / echo exchange. Results go to ``RUN_DIR/bench.json`` and
are printed as a table.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fl_app.errors import ConfigError
from simulation.deploy.cluster import Deployment
from simulation.deploy.options import coerce_opt, fresh_run_dir, parse_deploy_args
from simulation.deploy.processes import DeployError, wait_for
from simulation.deploy.run import deploy

BENCH_DEFAULTS: dict[str, Any] = {"fast": "both", "exchanges": 10, "tls": "true", "auth": "true", "run-dir": "",
                                  "batch-size": 32}

ECHO_PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "sflower-echo"
version = "0.1.0"
description = "Echo ClientApp: returns the message it receives (sflower deploy bench)"
license = "Apache-2.0"
dependencies = ["flwr==1.41.0"]

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
"""

ECHO_APP = '''"""Echo app: the ServerApp times round trips of a float32 payload that the ClientApp returns unchanged."""

import json
import time

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@client.query()
def echo(msg: Message, context: Context) -> Message:
    return Message(msg.content, reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    rounds, floats, out = int(cfg["rounds"]), int(cfg["floats"]), str(cfg["out"])
    while not list(grid.get_node_ids()):
        time.sleep(0.05)
    node = list(grid.get_node_ids())[0]
    payload = np.random.default_rng(0).standard_normal(floats).astype(np.float32)
    seconds = []
    for _ in range(rounds):
        content = RecordDict({"x": ArrayRecord({"x": Array(payload)})})
        t0 = time.perf_counter()
        ids = list(grid.push_messages([Message(content, node, "query")]))
        replies = []
        while not replies:
            replies = list(grid.pull_messages(ids))
            if not replies:
                time.sleep(0.01)
        seconds.append(time.perf_counter() - t0)
        reply = replies[0]
        assert not reply.has_error(), reply.error.reason
        back = reply.content["x"]["x"].numpy()
        assert np.array_equal(back, payload)
    with open(out, "w") as fh:
        json.dump({"seconds": seconds, "floats": floats}, fh)
'''


def echo_exchange(run_dir: Path, *, exchanges: int, floats: int, tls: bool, auth: bool, fast: bool,
                  timeout: float = 900.0) -> list[float]:
    """Seconds of each echo round trip through a loopback SuperLink and one SuperNode.

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
        runner = dep.run_app({"rounds": exchanges, "floats": floats, "out": str(out)}, app_dir=app)
        wait_for(lambda: out.exists() or not runner.alive(), timeout, "the echo run", alive=[dep.superlink])
        wait_for(out.exists, 10.0, f"echo.json (see {runner.log_path})")
    return [float(s) for s in json.loads(out.read_text())["seconds"]]


def split_exchange(run_dir: Path, *, exchanges: int, batch_size: int, tls: bool, auth: bool,
                   fast: bool) -> tuple[float, int, dict[str, Any]]:
    """Mean wall seconds per split exchange (splitfed-v1, one SuperNode); returns (seconds, exchanges, summary).

    Raises:
        ConfigError: bad options; DeployError: the deployment failed (see :func:`simulation.deploy.run.deploy`).
    """
    local = max(1, exchanges // 2)  # a local iteration is a forward and a backward exchange
    options = parse_deploy_args({
        "nodes": "1", "tls": str(tls), "auth": str(auth), "fast": str(fast), "run-dir": str(run_dir),
        "strategy": "splitfed-v1", "num-clients": "1", "concurrency": "1", "partition": "iid",
        "global-iterations": "1", "local-iterations": str(local), "batch-size": str(batch_size),
    })
    summary = deploy(options, quiet=True)
    with open(run_dir / "out" / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    n = int(rows[-1]["exchanges"])
    seconds = (float(rows[-1]["wall_time_s"]) - float(rows[0]["wall_time_s"])) / max(n, 1)
    return seconds, n, summary


def run_bench(pairs: Mapping[str, str]) -> dict[str, Any]:
    """``sflower deploy bench``: echo and split exchange latency, P6, for each setting; print and save.

    Raises:
        ConfigError: an unknown key or a bad value.
        DeployError: a deployment failed.
    """
    opts = dict(BENCH_DEFAULTS)
    for key, value in pairs.items():
        if key not in BENCH_DEFAULTS:
            raise ConfigError(f"deploy bench takes {', '.join(BENCH_DEFAULTS)}, not '{key}'")
        opts[key] = value
    fast_values = {"both": [False, True], "true": [True], "false": [False]}.get(str(opts["fast"]).lower())
    if fast_values is None:
        raise ConfigError(f"fast must be true, false or both, got '{opts['fast']}'")
    try:
        exchanges, batch = int(opts["exchanges"]), int(opts["batch-size"])
    except ValueError:
        raise ConfigError("exchanges and batch-size must be integers") from None
    if exchanges < 2 or batch < 1:
        raise ConfigError("exchanges must be >= 2 and batch-size >= 1")
    tls, auth = coerce_opt("tls", opts["tls"]), coerce_opt("auth", opts["auth"])
    root = fresh_run_dir(opts["run-dir"], f"runs/deploy-bench-{time.strftime('%Y%m%d-%H%M%S')}")
    floats = batch * 64 * 7 * 7  # AlexNet (MNIST) activation at the default cut
    results: dict[str, Any] = {"exchanges": exchanges, "batch_size": batch, "payload_bytes": floats * 4,
                               "tls": tls, "auth": auth, "settings": {}}
    for fast in fast_values:
        name = "fast" if fast else "default"
        echo = echo_exchange(root / f"echo-{name}", exchanges=exchanges, floats=floats, tls=tls, auth=auth, fast=fast)
        split, n, _ = split_exchange(root / f"split-{name}", exchanges=exchanges, batch_size=batch, tls=tls,
                                     auth=auth, fast=fast)
        echo_mean = statistics.fmean(echo)
        results["settings"][name] = {
            "echo_s_mean": echo_mean, "echo_s_median": statistics.median(echo), "echo_s_min": min(echo),
            "echo_s_max": max(echo), "split_s_per_exchange": split, "split_exchanges": n,
            "p6": split / echo_mean,
        }
        print(f"{name:8s} echo {echo_mean:6.2f} s/exchange (median {statistics.median(echo):.2f}, "
              f"min {min(echo):.2f}, max {max(echo):.2f}); split {split:6.2f} s/exchange over {n}; "
              f"P6 = {split / echo_mean:.2f}", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / "bench.json").write_text(json.dumps(results, indent=2))
    print(f"written: {root / 'bench.json'}")
    return results


__all__ = ["DeployError", "echo_exchange", "run_bench", "split_exchange"]
