"""The options of ``sflower deploy``: which keys are deploy options, their defaults and checks.

``sflower deploy nodes=N [deploy options] [run-config KEY=VALUE ...]``: the
deploy options are the keys of :data:`DEPLOY_DEFAULTS`; every other key is a
run-config key (:func:`fl_app.run.config.installed_declarations`, a plugin's included).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_app.run.config import RunConfig, installed_declarations, preset_values
from fl_app.run.errors import ConfigError
from fl_app.run.options import Option, core_option
from fl_app.run.plugins import strategy_class

#: The deploy options (the other ``KEY=VALUE`` pairs are run-config keys): typed, bounded and parsed as
#: run-config keys are (:class:`~fl_app.run.options.Option`).
DEPLOY_OPTIONS: tuple[Option, ...] = (
    Option("nodes", 3, "authorised SuperNodes", at_least=1),
    Option("intruders", 0, "extra SuperNodes whose keys are not registered (need auth=true)", at_least=0),
    Option("tls", True, "TLS between SuperNodes / CLI and the SuperLink"),
    Option("auth", True, "--enable-supernode-auth (needs tls=true)"),
    Option("fast", False, "low-latency polling (see simulation.deploy)"),
    Option("isolation", "subprocess", "SuperNode --isolation (process: sflower starts the SuperExec itself)",
           choices=("subprocess", "process")),
    Option("run-dir", "", "the run directory (default runs/deploy-<strategy>-<time>)"),
    Option("timeout", 1800.0, "seconds for the whole run, from `flwr run` to summary.json", above=0),
    Option("kill-node", -1, "partition id of a node to SIGKILL mid-run (-1: none)", at_least=-1),
    Option("kill-after", 5.0, "seconds after the first metric row of a trained model (global iteration >= 1)",
           at_least=0),
    Option("restart-after", 0.0, "seconds after the kill to start the node again (0: never)", at_least=0),
    Option("chaos", 0, "SuperNode kills at random points, each node restarted (simulation.deploy.faults)",
           at_least=0),
    Option("chaos-seed", 0, "seeds which nodes chaos kills, and when", at_least=0),
    Option("kill-server-after", 0.0, "seconds after the first trained row to SIGKILL the ServerApp and resume it "
           "(0: never)", at_least=0),
)
_DEPLOY = {opt.key: opt for opt in DEPLOY_OPTIONS}
#: The deploy options' defaults, ``key -> default``.
DEPLOY_DEFAULTS: dict[str, Any] = {opt.key: opt.default for opt in DEPLOY_OPTIONS}


@dataclass
class DeployOptions:
    """The parsed ``sflower deploy`` arguments.

    Attributes:
        opts: the deploy options (:data:`DEPLOY_DEFAULTS` keys).
        run_pairs: run-config overrides as given (strings), hyphenated keys.
        cfg: the resolved run configuration (``num-clients`` = nodes + intruders
            unless given, ``clock=wall`` unless given; neither for a vertical strategy, which reads neither).
    """

    opts: dict[str, Any]
    run_pairs: dict[str, Any]
    cfg: RunConfig


def parse_deploy_args(pairs: Mapping[str, str]) -> DeployOptions:
    """Split ``KEY=VALUE`` pairs into deploy options and run-config keys, and check them.

    Raises:
        ConfigError: an unknown key, a badly typed value, or an impossible
            combination (auth without TLS, intruders without auth, kill-node
            out of range, num-clients below nodes + intruders).
    """
    opts = dict(DEPLOY_DEFAULTS)
    run_pairs: dict[str, Any] = {}
    for raw, value in pairs.items():
        key = raw.replace("_", "-")
        if key in _DEPLOY:
            opts[key] = coerce_opt(key, value)
            _DEPLOY[key].validate(opts[key])
        elif key in installed_declarations():
            run_pairs[key] = value
        else:
            raise ConfigError(f"unknown key '{raw}': deploy takes {', '.join(DEPLOY_DEFAULTS)} and run-config keys")
    nodes, intruders = opts["nodes"], opts["intruders"]
    if opts["auth"] and not opts["tls"]:
        raise ConfigError("auth=true needs tls=true (Flower refuses SuperNode authentication without TLS)")
    if intruders and not opts["auth"]:
        raise ConfigError("intruders need auth=true (without authentication every SuperNode is accepted)")
    if "output-dir" in run_pairs:
        raise ConfigError("deploy writes the outputs to RUN_DIR/out; set run-dir=DIR instead of output-dir")
    vertical = _is_vertical(run_pairs)
    if not vertical:  # a vertical run's nodes are its parties, on its own virtual clock: it reads neither key
        run_pairs.setdefault("num-clients", nodes + intruders)
    if "concurrency" not in run_pairs and not vertical:
        try:
            clients = int(str(run_pairs["num-clients"]).strip() or 0)
        except ValueError:
            raise ConfigError(f"num-clients must be an integer, got {run_pairs['num-clients']!r}") from None
        run_pairs["concurrency"] = min(int(core_option("concurrency").default), clients)
    if not vertical:
        run_pairs.setdefault("clock", "wall")
    if intruders:
        run_pairs.setdefault("min-clients", nodes)
        run_pairs.setdefault("join-timeout", 30.0)
    cfg = RunConfig.from_mapping(run_pairs)
    if cfg.num_clients < nodes + intruders:
        raise ConfigError(f"num-clients={cfg.num_clients} is below nodes + intruders = {nodes + intruders}")
    if (opts["chaos"] or opts["kill-server-after"] > 0) and not cfg.checkpoint_every:
        raise ConfigError("chaos and kill-server-after need checkpoint-every=N: the run resumes from its checkpoint")
    if not -1 <= opts["kill-node"] < nodes:
        raise ConfigError(f"kill-node must be a node's partition id 0..{nodes - 1} (or -1), got {opts['kill-node']}")
    return DeployOptions(opts, run_pairs, cfg)


def _is_vertical(run_pairs: Mapping[str, Any]) -> bool:
    """Whether the strategy of ``run_pairs`` (given, else its preset's, else the default) is a vertical one.

    Raises:
        ConfigError: an unknown strategy or preset.
    """
    name = run_pairs.get("strategy") or (preset_values(str(run_pairs["preset"])).get("strategy")
                                         if run_pairs.get("preset") else None) or core_option("strategy").default
    return bool(getattr(strategy_class(str(name)), "vertical", False))


def fresh_run_dir(given: str, default: str) -> Path:
    """The absolute run directory: ``given``, or ``default`` when empty.

    Raises:
        ConfigError: it exists and is a file, or a directory that is not empty.
    """
    run_dir = Path(given or default).resolve()
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ConfigError(f"run-dir '{run_dir}' exists and is not an empty directory")
    return run_dir


def coerce_opt(key: str, value: Any) -> Any:
    """``value`` (a string) as the type of deploy option ``key`` (:meth:`fl_app.run.options.Option.coerce`).

    Raises:
        ConfigError: the value does not parse as that type (one line).
    """
    return _DEPLOY[key].coerce(value)
