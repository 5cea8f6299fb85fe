"""Typed per-action configs: the ``config`` record of every message, one frozen dataclass per action.

Config keys are never written as bare strings: each action has a frozen
dataclass whose fields are the keys (``batch_size`` <-> ``"batch-size"``)
with their types, encoded by :meth:`ActionConfig.to_record` and decoded by
:meth:`ActionConfig.from_record`. What a ``train.forward`` does with its
config is read in one place, :meth:`ForwardConfig.plan`.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from flwr.app import ConfigRecord

from fl_app.protocol import keys as K

C = TypeVar("C", bound="ActionConfig")


def _key(field_name: str) -> str:
    return field_name.replace("_", "-")


@dataclass(frozen=True)
class ActionConfig:
    """Base of the typed per-action configs carried under :data:`CONFIG`.

    Field ``batch_size`` travels as key ``"batch-size"``; values are encoded
    with their declared types (``int``, ``float``, ``bool``, ``str``,
    ``list[float]``).
    """

    action: ClassVar[str] = ""

    def to_record(self) -> ConfigRecord:
        """The ConfigRecord sent in the message (a new one each call)."""
        out: dict[str, Any] = {}
        for key, (name, _) in _fields(type(self)).items():
            value = getattr(self, name)
            out[key] = list(value) if isinstance(value, tuple) else value
        return ConfigRecord(out)

    def record(self) -> ConfigRecord:
        """:meth:`to_record`, encoded once per config object and then shared by every message built from it
        (a message's content is only read; RingSFL sends one hop's config in every step)."""
        cached = self.__dict__.get("_record")
        if cached is None:
            cached = self.to_record()
            object.__setattr__(self, "_record", cached)
        return cached

    @classmethod
    def from_record(cls: type[C], record: Mapping[str, Any] | None) -> C:
        """Decode a record made by :meth:`to_record`; absent keys take their defaults.

        Raises:
            ValueError: an unknown key, or a value that cannot be converted to its field's type.
        """
        if record is not None:  # the very record decoded before (strategies send their config records as built)
            hit = _BY_RECORD.get(id(record))
            if hit is not None and hit[0] is record and hit[1] is cls:
                return hit[2]
        given = dict(record.items()) if record else {}
        try:  # the strategies send the same configs over and over: decoded once (the classes are frozen)
            key = (cls, tuple(given.items()), tuple(map(type, given.values())))  # typed: True == 1 == 1.0
            hit = _DECODED.get(key)
        except TypeError:  # a list value (a tuple field): not cached
            key, hit = None, None
        if hit is not None:
            _remember(record, cls, hit)
            return hit
        fields = _fields(cls)
        unknown = given.keys() - fields.keys()
        if unknown:
            raise ValueError(f"unknown {cls.action or cls.__name__} config keys: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for key, raw in given.items():
            name, kind = fields[key]
            if kind is bool:
                values[name] = bool(raw)
            elif kind in (int, float, str):
                values[name] = kind(raw)
            else:  # tuple[float, ...]
                values[name] = tuple(float(v) for v in raw)
        config = cls(**values)
        if key is not None:
            if len(_DECODED) >= 1024:
                _DECODED.clear()
            _DECODED[key] = config
        _remember(record, cls, config)
        return config


#: ``(class, record items) -> config`` of recently decoded records (see :meth:`ActionConfig.from_record`)
_DECODED: dict[tuple, Any] = {}
#: ``id(record) -> (record, class, config)``: the ConfigRecords decoded last (kept alive, so ids stay unique)
_BY_RECORD: dict[int, tuple[Any, type, Any]] = {}


def _remember(record: Mapping[str, Any] | None, cls: type, config: Any) -> None:
    """Keep ``record``'s decoding for its next :meth:`ActionConfig.from_record` (a ConfigRecord only).

    Config records are not changed after they are sent: a strategy builds
    each config's record once and sends it many times
    (:meth:`ActionConfig.to_record` caches it), and a handler only reads it.
    """
    if isinstance(record, ConfigRecord):
        if len(_BY_RECORD) >= 256:
            _BY_RECORD.clear()
        _BY_RECORD[id(record)] = (record, cls, config)


@functools.cache
def _fields(cls: type) -> dict[str, tuple[str, Any]]:
    """``record key -> (field name, type)`` of an :class:`ActionConfig` class, in field order (cached:
    ``typing.get_type_hints`` is slow)."""
    hints = typing.get_type_hints(cls)
    return {_key(f.name): (f.name, hints[f.name]) for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class OptimizerConfig(ActionConfig):
    """SGD settings of a training message (both sides use GAS's SGD by default).

    Attributes:
        lr: learning rate.
        momentum: SGD momentum.
        weight_decay: L2 weight decay.
        clip_norm: gradient-norm clipping threshold (0 = none).
        lr_scale: per-block learning-rate multipliers for the slot's blocks
            ``[start, end)`` (empty = all 1). RingSFL v2 (eq. 7) multiplies an
            overlapping block's rate by its overlap count.
        optimizer: ``"sgd"`` or ``"adamw"`` (``momentum`` then unused).
    """

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    lr_scale: tuple[float, ...] = ()
    optimizer: str = "sgd"


def range_end(end: int, cut: int) -> int:
    """The end of a block range ``[start, end)`` of a ``train.forward``, ``train.zo_forward`` or request
    builder: ``end``, or the run's cut layer ``cut`` when ``end`` is 0. The one reading of that convention
    (0, never None, means the cut), on the server and on the client."""
    return end or cut


@dataclass(frozen=True)
class ForwardConfig(OptimizerConfig):
    """``train.forward``: run blocks ``[start, end)`` of the model in ``slot``.

    With ``start == 0`` the node samples ``batch_size`` examples of its own
    data; otherwise the input arrives as :data:`ACTIVATIONS` (and the labels
    as :data:`LABELS`) from the previous hop. Sent :data:`WEIGHTS` replace
    the slot's weights and reset its optimizer and accumulator.

    With ``loss`` the range ends the model: the node computes the mean
    cross-entropy on the labels, back-propagates it at once (weighted by
    ``weight``; accumulated or stepped as ``accumulate`` says) and replies
    with the gradient w.r.t. the range's input (when ``start > 0``) and the
    loss in :data:`INFO`. Otherwise it replies with the range's output
    (:data:`ACTIVATIONS`) and the labels.

    ``model_slot`` names another slot whose weights, optimizer state and
    accumulator this slot uses (empty: its own); the slot keeps only its
    stored input. RingSFL: every path through a node trains blocks of that
    node's one local model, each path keeping its input in its own slot.

    ``label_slot`` keeps the labels on the node (a label-private, U-shaped
    split): an own-data forward replies no :data:`LABELS`, and a relayed
    input sent without labels (the U-shaped tail) is scored against the
    labels of that slot's last own batch.
    """

    action: ClassVar[str] = K.TRAIN_FORWARD
    slot: str = K.OWN_SLOT
    start: int = 0
    end: int = 0  # 0: the run's cut layer
    batch_size: int = 0
    loss: bool = False
    accumulate: bool = False
    weight: float = 1.0
    model_slot: str = ""
    label_slot: str = ""

    def plan(self, cut: int) -> ForwardPlan:
        """What this forward does and what its reply holds, for a run whose cut layer is ``cut``:
        the one reading of a ``train.forward`` config (the ClientApp's handler, the strategies'
        request builders and reply validation all use it)."""
        return ForwardPlan(self.start, range_end(self.end, cut), self.batch_size, self.loss, bool(self.label_slot))


@dataclass(frozen=True)
class ForwardPlan:
    """A ``train.forward`` read from its :class:`ForwardConfig` (:meth:`ForwardConfig.plan`).

    Attributes:
        start, end: the block range ``[start, end)`` run (``end`` resolved: 0 is the cut layer).
        batch_size: examples sampled from the node's own data (``start == 0``).
        loss: the range ends the model: the node computes the loss and back-propagates at once.
        private_labels: the labels stay on the node (``label_slot``): no reply carries them.
    """

    start: int
    end: int
    batch_size: int
    loss: bool
    private_labels: bool = False

    @property
    def own_data(self) -> bool:
        """The input is a batch of the node's own data (else the relayed ``activations``)."""
        return self.start == 0

    @property
    def replies_activations(self) -> bool:
        """The reply holds the range's output (``activations``); else, with ``loss``, the loss in ``info``."""
        return not self.loss

    @property
    def replies_input_gradient(self) -> bool:
        """The reply holds the gradient w.r.t. the range's input (``gradient``): a loss range not starting at 0."""
        return self.loss and self.start > 0

    def replies_labels(self, labels_sent: bool) -> bool:
        """The reply holds ``labels``: the output of own data, or of a relayed input sent with its labels."""
        return not self.loss and not self.private_labels and (self.own_data or labels_sent)

    def input_batch(self, relayed_batch: int | None) -> int:
        """The batch the range runs on: the relayed input's (``relayed_batch``), else ``batch_size``."""
        return self.batch_size if relayed_batch is None else relayed_batch


@dataclass(frozen=True)
class BackwardConfig(OptimizerConfig):
    """``train.backward``: back-propagate :data:`GRADIENT` through the slot's last forward.

    The forward pass of the stored input is recomputed (live objects do not
    survive between messages). The parameter gradient, times ``weight``, is
    either added to the slot's accumulator (``accumulate``; applied later by
    ``train.step``) or clipped and stepped at once. The reply holds the
    gradient w.r.t. the range's input when the range does not start at 0,
    plus, by ``next``: the next batch's activations (``batch_size``), the
    slot's weights and example count, or nothing more. ``model_slot`` and
    ``label_slot`` (a piggybacked forward replies no labels) as in
    :class:`ForwardConfig`.
    """

    action: ClassVar[str] = K.TRAIN_BACKWARD
    slot: str = K.OWN_SLOT
    next: str = K.NEXT_NONE
    batch_size: int = 0
    accumulate: bool = False
    weight: float = 1.0
    model_slot: str = ""
    label_slot: str = ""


@dataclass(frozen=True)
class StepConfig(OptimizerConfig):
    """``train.step``: apply the slot's accumulated gradient (clip, SGD step with ``lr_scale``), clear it.

    The blocks ``[start, end)`` are stepped (``end`` 0: the range of the
    slot's last forward); RingSFL steps a node's whole model, ``[0, W)``.
    With ``return_weights`` the reply holds the slot's new weights.
    """

    action: ClassVar[str] = K.TRAIN_STEP
    slot: str = K.OWN_SLOT
    return_weights: bool = False
    start: int = 0
    end: int = 0


@dataclass(frozen=True)
class ZOForwardConfig(OptimizerConfig):
    """``train.zo_forward``: sample ``batch_size`` own examples; reply the embedding ``h``
    of blocks ``[0, end)`` (:data:`ACTIVATIONS`) and ``P = perturbations`` pairs
    ``h(w ± μ u_p)`` (:data:`PERTURBED`), ``μ = smoothing`` (MU-SplitFed eq. 4).

    The directions ``u_p`` stay on the node: it keeps their seeds. Sent
    :data:`WEIGHTS` replace the slot's weights and reset its optimizer.
    """

    action: ClassVar[str] = K.TRAIN_ZO_FORWARD
    slot: str = K.OWN_SLOT
    end: int = 0  # 0: the run's cut layer
    batch_size: int = 0
    perturbations: int = 1
    smoothing: float = 1e-3


@dataclass(frozen=True)
class ZOUpdateConfig(OptimizerConfig):
    """``train.zo_update``: the ``P`` loss differences ``diffs`` of the last
    ``train.zo_forward``; the node regenerates each ``u_p`` from its seed, forms
    the SPSA estimate (:func:`fl_app.learning.zo.spsa_gradient`), clips and steps. No
    backward pass. ``next`` and ``batch_size`` as in :class:`BackwardConfig`;
    a piggybacked forward is a ``train.zo_forward`` with the same ``P`` and ``μ``.
    """

    action: ClassVar[str] = K.TRAIN_ZO_UPDATE
    slot: str = K.OWN_SLOT
    diffs: tuple[float, ...] = ()
    smoothing: float = 1e-3
    next: str = K.NEXT_NONE
    batch_size: int = 0


@dataclass(frozen=True)
class FitConfig(OptimizerConfig):
    """``train.fit``: ``local_iterations`` full-model SGD steps of ``batch_size`` (FL baselines)."""

    action: ClassVar[str] = K.TRAIN_FIT
    local_iterations: int = 1
    batch_size: int = 32


@dataclass(frozen=True)
class EvaluateConfig(ActionConfig):
    """``evaluate``: evaluate sent full-model weights on the test set or the local partition."""

    action: ClassVar[str] = K.EVALUATE
    split: str = K.SPLIT_TEST
