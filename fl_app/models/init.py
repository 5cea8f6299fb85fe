"""The weight initialisations of the run-config key ``init`` (:data:`INITS`), applied by :func:`initialise`.

* ``default``: He init (:func:`he_init`); for ``vit-small`` the usual
  transformer init (:func:`transformer_init`).
* ``ringsfl``: RingSFL's init (section 4.1, :func:`ringsfl_init`), on the
  models with BatchNorm only, as the authors' code does.
* ``torch-default``: PyTorch's own layer initialisation (what the GAS
  authors' code uses).

Every scheme draws from the global torch RNG, which
:func:`~fl_app.models.build_model` seeds (and restores) around the build.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch import nn

from fl_app.models.vit import PatchEmbedding

INITS: tuple[str, ...] = ("default", "ringsfl", "torch-default")
"""Weight initialisations accepted by :func:`~fl_app.models.build_model` (run-config key ``init``)."""


def initialise(name: str, blocks: Sequence[tuple[str, nn.Module]], init: str) -> None:
    """Initialise the freshly built ``blocks`` of model ``name`` in place with scheme ``init``.

    ``init="ringsfl"`` on a model without BatchNorm keeps PyTorch's own init,
    as the RingSFL authors' LeNet and AlexNet do, and logs one line saying
    so (once per model and process): three stacked N(0, 0.01) linear layers
    without BatchNorm start at a saddle (loss 2.30).

    Args:
        name: the model's name (``vit-small`` gets the transformer init by default).
        blocks: ``(name, module)`` pairs, in order; initialised in that order.
        init: one of :data:`INITS` (checked by the caller).
    """
    if init == "ringsfl" and not any(isinstance(m, nn.BatchNorm2d) for _, b in blocks for m in b.modules()):
        _note_once(name, f"init=ringsfl: {name} has no BatchNorm, and the RingSFL authors apply their init only "
                         "to their BatchNorm models; using PyTorch's default init, as their code does")
        init = "torch-default"
    if init == "ringsfl":
        init_fn = ringsfl_init
    elif init == "torch-default":
        init_fn = lambda block: None  # noqa: E731 - keep the layers' own reset_parameters()
    else:
        init_fn = transformer_init if name == "vit-small" else he_init
    for _, block in blocks:
        init_fn(block)


_NOTED: set[str] = set()


def _note_once(key: str, message: str) -> None:
    """Log ``message`` on the ``sflower`` logger the first time ``key`` is seen in this process."""
    if key not in _NOTED:
        _NOTED.add(key)
        logging.getLogger("sflower").warning(message)


def he_init(module: nn.Module) -> None:
    """He (Kaiming) normal init, fan-in, for ReLU nets; zero biases.

    PyTorch's default (uniform, a = sqrt(5)) shrinks the signal through the
    eight plain-ReLU layers of AlexNet so much that SGD at lr 0.01 sits on the
    loss plateau of 2.30 for hundreds of steps; He init starts learning at once.
    Norm layers keep PyTorch's weight 1 / bias 0.
    """
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def ringsfl_init(module: nn.Module) -> None:
    """RingSFL's init: conv Kaiming-normal (fan-out, ReLU), linear N(0, 0.01), zero biases, norms 1 / 0."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, PatchEmbedding):
            m.reset_tokens()


def transformer_init(module: nn.Module) -> None:
    """ViT init: linear and patch-conv weights truncated-normal(0, 0.02), zero biases,
    LayerNorm 1 / 0, class token and position embedding truncated-normal(0, 0.02)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, PatchEmbedding):
            m.reset_tokens()
