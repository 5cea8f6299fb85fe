"""The run configuration: every key, its default, its type and its checks.

One table, :data:`DEFAULTS`, is the source of truth for the keys that
``flwr run --run-config``, ``sflower run KEY=VALUE`` and the sweep files
accept. ``pyproject.toml``'s ``[tool.flwr.app.config]`` repeats it (Flower
requires every run-config key to exist there); a test keeps the two equal.

Keys are written with hyphens, as Flower does (``num-clients``);
:class:`RunConfig` exposes them as attributes with underscores
(``cfg.num_clients``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fl_app.errors import ConfigError

#: Every run-config key with its default. The type of the default is the
#: type of the key. Empty strings mean "not set".
DEFAULTS: dict[str, Any] = {
    # what runs
    "strategy": "gas",
    "dataset": "mnist-5k",
    "data-dir": "",
    "model": "alexnet",
    "cut-layer": 2,
    # federation
    "num-clients": 20,
    "concurrency": 10,
    "partition": "shard",
    "normalize": "dataset",
    "alpha": 0.1,
    "shards": 2,
    "min-partition-size": 1,
    "num-classes-per-partition": 2,  # partition=pathological
    "class-assignment-mode": "first-deterministic",  # partition=pathological
    "partition-sizes": "",  # partition=inner-dirichlet: "n0:n1:..." (empty: equal sizes)
    "heterogeneity": "gas",
    "batch-parallel": False,
    "downlink": False,
    "straggler-rate": 1.0,
    # training (GAS paper defaults: lr 0.01, momentum 0.9, wd 5e-4, clip 10, B 32)
    "global-iterations": 6,  # the main job (sflower run) in under 3 minutes on 2 cores, at >= 0.95 on mnist-5k
    "local-iterations": 20,
    "local-epochs": 0,  # > 0: each client's local work is N passes over its partition (overrides local-iterations)
    "batch-size": 32,
    "lr": 0.01,
    "client-lr": 0.0,
    "server-lr-split": 0.0,
    "optimizer": "sgd",
    "init": "default",
    "device": "auto",
    "momentum": 0.9,
    "weight-decay": 0.0005,
    "clip-norm": 10.0,
    # GAS (docs/design.md §7)
    "generate": True,
    "covariance": "full",
    "buffer-activations": 0,
    "buffer-models": 0,
    "weighting": "linear",
    "progress": "flushes",
    "logit-adjust": True,
    "aggregation": "data-size",
    "dissimilarity-every": 0,
    "client-momentum": "own",
    # FL baselines
    "server-lr": 1.0,
    "fl-buffer": 0,
    "staleness": "none",
    # MU-SplitFed and the ZO baselines
    "client-optimizer": "sgd",
    "server-optimizer": "sgd",
    "perturbations": 1,
    "zo-smoothing": 0.001,
    "zo-clip": 10.0,  # 0 (the paper) diverges at the global defaults; preset mu-splitfed sets 0
    "server-steps": 1,
    # GAPSL
    "gapsl-k-min": 0.2,
    "gapsl-k-max": 0.8,
    "gapsl-eta": 0.5,
    "gapsl-lambda": 0.0,
    "gapsl-mode": "first-order",
    "gapsl-lgi": "on",
    "gapsl-gda": "on",
    "gapsl-client-grads": "selected",
    # PSL family, EPSL and S2FL
    "psl-loss": "mean",
    "epsl-phi": 0.5,
    "s2fl-cuts": "1:2",
    "s2fl-groups": 2,
    # RingSFL and the order of vanilla SL
    "ring-lengths": "",
    "ring-version": 2,
    "d2d-rate": 135.0,
    "drop-per-round": 0,
    "sl-order": "client",
    # run control
    "preset": "",
    "seed": 0,
    "init-seed": -1,  # seeds the initial weights alone (-1: seed)
    "partition-seed": -1,  # seeds the partition alone (-1: seed)
    "eval-every": 1,
    "eval-samples": 0,
    "target-accuracy": 0.0,
    "max-virtual-time": 0.0,
    "clock": "virtual",
    "node-timeout": 600.0,
    "min-clients": 0,
    "join-timeout": 0.0,
    # the transport of a deployment's requests (docs/design.md §4, "The session transport")
    "transport": "auto",  # auto, flower, session
    "session-address": "localhost:9099",
    "session-certificate": "",
    "session-key": "",
    "session-ca": "",
    "session-tls": True,
    "session-timeout": 60.0,
    "checkpoint-every": 0,
    "output-dir": "",
    # what a run leaves besides its metrics
    "tracker": "none",  # none, tensorboard, mlflow, wandb (comma-separated for several)
    "save-best": False,  # also keep the best-accuracy model (model-best.safetensors)
    "numerics": "fast",  # fast (this machine's kernels) or portable (the same numbers on every x86-64 machine)
}

#: Keys every strategy reads. The other keys of :data:`DEFAULTS` are
#: strategy options: each is declared, with its help line, by the strategy
#: classes that use it (``options = (Option(...), ...)``; ``sflower
#: strategies`` prints them), and a test keeps both tables equal.
CORE_KEYS: tuple[str, ...] = (
    "strategy", "dataset", "data-dir", "model", "cut-layer", "num-clients", "concurrency",
    "partition", "normalize", "alpha", "shards", "min-partition-size", "num-classes-per-partition",
    "class-assignment-mode", "partition-sizes", "heterogeneity", "batch-parallel",
    "downlink", "straggler-rate", "global-iterations", "local-iterations", "local-epochs", "batch-size", "lr", "client-lr", "server-lr-split", "optimizer", "init", "device", "momentum",
    "weight-decay", "clip-norm", "preset", "seed", "init-seed", "partition-seed", "eval-every", "eval-samples", "target-accuracy",
    "max-virtual-time", "clock", "node-timeout", "min-clients", "join-timeout", "checkpoint-every", "output-dir",
    "tracker", "save-best", "transport", "session-address", "session-certificate", "session-key", "session-ca",
    "session-tls", "session-timeout", "numerics",
)


#: Named sets of keys (``preset=NAME``); keys given explicitly win over the preset's.
PRESETS: dict[str, dict[str, Any]] = {
    # The GAS authors' published code (github.com/eejiarong/GAS): their AlexNet
    # (no ReLU after conv3, conv4, fc1, fc2), PyTorch's own init, uniform
    # client-model averaging, a batch timed as one sample's FLOPs, their hard-coded
    # seed 2023 for the initial weights, and their one client optimizer shared by all
    # clients, never reset (client-momentum=shared), and their progress weight, which counts
    # each client's uploads (progress=uploads; README: "Presets").
    "gas-reference": {"model": "alexnet-gas", "init": "torch-default", "aggregation": "uniform",
                      "batch-parallel": True, "client-momentum": "shared", "init-seed": 2023,
                      "progress": "uploads"},
    # MU-SplitFed (mu-splitfed.txt, §5): 10 clients, 5 per round, exponential
    # stragglers, one exchange per round (Algorithm 1), tau = 2 (its best in
    # Table 1), ZO-SGD on both sides without clipping (as the paper). The model is LeNet-5 cut
    # after conv1 (156 client parameters, 61k server ones), not the paper's
    # AlexNet, whose 3M-parameter ZO server diverges at this lr and learns about
    # ten times slower per wall second at a stable one; lr and P are the tuning
    # grid's (README: "MU-SplitFed").
    "mu-splitfed": {"model": "lenet5", "cut-layer": 3, "num-clients": 10, "concurrency": 5, "partition": "iid",
                    "heterogeneity": "exponential", "global-iterations": 100, "local-iterations": 1,
                    "lr": 0.008, "momentum": 0.0, "weight-decay": 0.0, "perturbations": 8, "server-steps": 2,
                    "zo-clip": 0.0},
    # The RingSFL authors' code (ShenJinglong/StalRingSFL, models in DistRingSFL):
    # their LeNet (average pooling) with PyTorch's init, plain SGD at lr 0.02, B = 64,
    # pixels normalised to [-1, 1], rounds of 2 local epochs (374 steps on MNIST's
    # 12,000 images a client), 5 clients; their IID split is 5 contiguous chunks in
    # file order (give partition=label-sorted for their non-IID split).
    "ringsfl-reference": {"model": "lenet5-ringsfl", "init": "torch-default", "lr": 0.02, "momentum": 0.0,
                          "weight-decay": 0.0, "clip-norm": 0.0, "batch-size": 64, "normalize": "half",
                          "local-epochs": 2, "num-clients": 5, "concurrency": 5, "partition": "contiguous"},
}


@dataclass(frozen=True)
class Option:
    """A run-config key that a strategy declares next to its class.

    Attributes:
        key: the hyphenated key, e.g. ``"buffer-models"``.
        default: its default; its type is the key's type. Must equal
            ``DEFAULTS[key]`` (a test checks).
        help: one line for ``sflower strategies``.
        choices: the accepted values of a string option (empty: any).
    """

    key: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()

    @property
    def type(self) -> type:
        """The value type (``bool``, ``int``, ``float`` or ``str``)."""
        return type(self.default)


def _coerce(key: str, value: Any) -> Any:
    """Convert ``value`` to the type of ``DEFAULTS[key]``.

    Strings (from the command line) are parsed; ``"true"/"false"`` become
    booleans. Raises :class:`ConfigError` when the conversion fails.
    """
    default = DEFAULTS[key]
    try:
        if isinstance(default, bool):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int):
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value) if not isinstance(value, str) else int(value.strip())
        if isinstance(default, float):
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
            if math.isnan(out):
                raise ValueError
            return out
        return str(value)
    except (TypeError, ValueError):
        kind = type(default).__name__
        raise ConfigError(f"{key}={value!r} is not a valid {kind}") from None


class RunConfig:
    """A resolved, checked run configuration.

    Build it with :meth:`from_mapping`; unknown keys and badly typed values
    raise :class:`ConfigError`. Read values as attributes with underscores
    (``cfg.batch_size``) or with :meth:`get` by their hyphenated key.
    """

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    @classmethod
    def from_mapping(cls, overrides: Mapping[str, Any] | None = None) -> RunConfig:
        """Defaults updated with ``overrides``; keys may use ``-`` or ``_``.

        ``preset=NAME`` (:data:`PRESETS`) sets its keys, except those given
        here with a value other than their default.

        Raises:
            ConfigError: on an unknown key, a value of the wrong type, or a
                value outside its allowed range.
        """
        values = dict(DEFAULTS)
        overrides = dict(overrides or {})
        preset = str(overrides.get("preset", "") or "")
        if preset:
            if preset not in PRESETS:
                raise ConfigError(f"unknown preset '{preset}'; choose one of: {', '.join(PRESETS)}")
            # Under `flwr run` every key arrives (with its default), so a key counts
            # as given only when its value differs from the default.
            keyed = {str(k).replace("_", "-"): v for k, v in overrides.items()}
            given = {k for k, v in keyed.items() if k in DEFAULTS and _coerce(k, v) != DEFAULTS[k]}
            overrides.update({k: v for k, v in PRESETS[preset].items() if k not in given})
        for raw_key, value in overrides.items():
            key = str(raw_key).replace("_", "-")
            if key not in DEFAULTS:
                close = [k for k in DEFAULTS if k.split("-")[0] == key.split("-")[0]]
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise ConfigError(f"unknown run-config key '{raw_key}'{hint}")
            values[key] = _coerce(key, value)
        cfg = cls(values)
        cfg._check()
        return cfg

    def _check(self) -> None:
        positive = ["num-clients", "concurrency", "global-iterations", "local-iterations", "batch-size",
                    "perturbations", "server-steps", "num-classes-per-partition"]
        for key in positive:
            if self._values[key] < 1:
                raise ConfigError(f"{key} must be >= 1, got {self._values[key]}")
        for key in ["lr", "alpha", "server-lr", "node-timeout", "zo-smoothing", "straggler-rate"]:
            if not self._values[key] > 0:
                raise ConfigError(f"{key} must be > 0, got {self._values[key]}")
        for key in ["momentum", "weight-decay", "clip-norm", "zo-clip", "target-accuracy", "max-virtual-time", "server-lr-split",
                    "client-lr"]:
            if self._values[key] < 0:
                raise ConfigError(f"{key} must be >= 0, got {self._values[key]}")
        for key in ["local-epochs", "buffer-activations", "buffer-models", "fl-buffer", "eval-every", "eval-samples", "dissimilarity-every", "seed", "min-partition-size",
                    "drop-per-round", "checkpoint-every"]:
            if self._values[key] < 0:
                raise ConfigError(f"{key} must be >= 0, got {self._values[key]}")
        for key in ("init-seed", "partition-seed"):
            if self._values[key] < -1:
                raise ConfigError(f"{key} must be >= 0, or -1 for seed; got {self._values[key]}")
        if self.concurrency > self.num_clients:
            raise ConfigError(
                f"concurrency={self.concurrency} exceeds num-clients={self.num_clients}"
            )
        if not 0 <= self.min_clients <= self.num_clients:
            raise ConfigError(f"min-clients must be in 0..num-clients ({self.num_clients}), got {self.min_clients}")
        if not self.join_timeout >= 0:
            raise ConfigError(f"join-timeout must be >= 0, got {self.join_timeout}")
        if self.transport not in ("auto", "flower", "session"):
            raise ConfigError(f"transport must be 'auto', 'flower' or 'session', got '{self.transport}'")
        if not self.session_timeout > 0:
            raise ConfigError(f"session-timeout must be > 0, got {self.session_timeout}")
        if self.clock not in ("virtual", "wall"):
            raise ConfigError(f"clock must be 'virtual' or 'wall', got '{self.clock}'")
        if self.aggregation not in ("data-size", "uniform"):
            raise ConfigError(f"aggregation must be 'data-size' or 'uniform', got '{self.aggregation}'")
        if self.get("client-optimizer") not in ("sgd", "zo"):
            raise ConfigError(f"client-optimizer must be 'sgd' or 'zo', got '{self.get('client-optimizer')}'")
        if self.get("gapsl-mode") not in ("first-order", "exact"):
            raise ConfigError(f"gapsl-mode must be 'first-order' or 'exact', got '{self.get('gapsl-mode')}'")
        for key in ("gapsl-lgi", "gapsl-gda"):
            if self.get(key) not in ("on", "none", "random"):
                raise ConfigError(f"{key} must be 'on', 'none' or 'random', got '{self.get(key)}'")
        if not 0 < self.gapsl_k_min <= self.gapsl_k_max <= 1:
            raise ConfigError(f"need 0 < gapsl-k-min <= gapsl-k-max <= 1, got {self.gapsl_k_min} and {self.gapsl_k_max}")
        for key, choices in (("optimizer", ("sgd", "adamw")), ("init", ("default", "ringsfl", "torch-default")),
                             ("sl-order", ("client", "batch")), ("server-optimizer", ("sgd", "zo")),
                             ("gapsl-client-grads", ("selected", "all")), ("psl-loss", ("mean", "sum")),
                             ("normalize", ("dataset", "half")), ("client-momentum", ("own", "shared")),
                             ("progress", ("flushes", "iterations", "uploads")),
                             ("class-assignment-mode", ("first-deterministic", "deterministic", "random"))):
            if self.get(key) not in choices:
                raise ConfigError(f"{key} must be one of {', '.join(choices)}; got '{self.get(key)}'")
        from fl_app.device import check_device_name
        from fl_app.numerics import check_mode

        check_mode(self.numerics)

        check_device_name(self.device)
        tracker_names(self.tracker)  # known names only; whether their packages are installed: plan_run
        if not 0 <= self.epsl_phi <= 1:
            raise ConfigError(f"epsl-phi must be in [0, 1], got {self.epsl_phi}")
        if self.s2fl_groups < 1:
            raise ConfigError(f"s2fl-groups must be >= 1, got {self.s2fl_groups}")
        if self.ring_version not in (1, 2):
            raise ConfigError(f"ring-version must be 1 or 2, got {self.ring_version}")
        if not self.d2d_rate > 0:
            raise ConfigError(f"d2d-rate must be > 0 (Mbit/s), got {self.d2d_rate}")
        if self.staleness not in ("none", "polynomial"):
            raise ConfigError(f"staleness must be 'none' or 'polynomial', got '{self.staleness}'")

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values")
        key = name.replace("_", "-")
        if values is not None and key in values:
            return values[key]
        raise AttributeError(name)

    def get(self, key: str) -> Any:
        """The value of a hyphenated key."""
        return self._values[key]

    def as_dict(self) -> dict[str, Any]:
        """All keys with hyphens, JSON-friendly (a copy)."""
        return dict(self._values)

    def replace(self, **changes: Any) -> RunConfig:
        """A new checked config with some keys changed (underscored names)."""
        values = self.as_dict()
        values.update({k.replace("_", "-"): v for k, v in changes.items()})
        return RunConfig.from_mapping(values)

    def __repr__(self) -> str:
        return f"RunConfig({self._values!r})"


#: The experiment trackers of the ``tracker`` key (:mod:`simulation.outputs.trackers` implements them).
TRACKERS: tuple[str, ...] = ("tensorboard", "mlflow", "wandb")


def tracker_names(value: str) -> tuple[str, ...]:
    """The trackers a ``tracker`` value asks for, in order, without repeats.

    ``"none"`` or ``""`` gives ``()``; ``"tensorboard,mlflow"`` gives both.

    Raises:
        ConfigError: a name not in :data:`TRACKERS`, or ``none`` beside another name.
    """
    names = [n.strip() for n in str(value).split(",") if n.strip()]
    if names == ["none"] or not names:
        return ()
    for name in names:
        if name == "none":
            raise ConfigError(f"tracker={value!r}: 'none' cannot be combined with a tracker")
        if name not in TRACKERS:
            raise ConfigError(f"tracker={value!r}: unknown tracker '{name}'; choose none or any of "
                              f"{', '.join(TRACKERS)} (comma-separated)")
    return tuple(dict.fromkeys(names))


def parse_key_values(pairs: list[str]) -> dict[str, str]:
    """Parse ``["key=value", ...]`` from the command line.

    Raises:
        ConfigError: for an item without ``=``.
    """
    out: dict[str, str] = {}
    for item in pairs:
        if "=" not in item:
            raise ConfigError(f"expected KEY=VALUE, got '{item}'")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out
