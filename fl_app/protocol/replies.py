"""Reply readers and reply schemas: what a reply to each action holds, and how to read it.

:func:`reply_schema` says, from a request's action, its typed config and what
it carried, which records its reply must hold and with which batch sizes
(:class:`ReplySchema`); :mod:`strategies.core.validation` checks replies against
it with the task's shapes. The readers decode the records a strategy uses
(fresh, writable CPU tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, RecordDict

from fl_app.protocol import keys as K
from fl_app.protocol.configs import BackwardConfig, ForwardConfig, StepConfig, ZOForwardConfig, ZOUpdateConfig, range_end
from fl_app.protocol.records import array_of, config_of, get_array, get_config, record_state, record_tensor


# --- readers -------------------------------------------------------------------
def activations(content: RecordDict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(activations [B, ...] float32, labels [B] int64)`` of a forward reply (or of a backward's
    piggybacked forward); labels None where the reply has none (a label-private, U-shaped head)."""
    labels = get_array(content, K.LABELS)
    return record_tensor(array_of(content, K.ACTIVATIONS), "x"), \
        (None if labels is None else record_tensor(labels, "y"))


def perturbed(content: RecordDict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h⁺ [P, B, ...], h⁻ [P, B, ...])`` of a ``train.zo_forward`` reply."""
    record = record_state(array_of(content, K.PERTURBED))
    return record["plus"], record["minus"]


def weights(content: RecordDict) -> tuple[dict[str, torch.Tensor], int]:
    """``(state_dict, num_examples)`` of a reply that returns a slot's or a full model's weights."""
    return record_state(array_of(content, K.WEIGHTS)), int(config_of(content, K.INFO)[K.INFO_NUM_EXAMPLES])


def loss(content: RecordDict) -> float:
    """The loss a ``train.forward`` with ``loss`` reports."""
    return float(config_of(content, K.INFO)[K.INFO_LOSS])


def optimizer_state(content: RecordDict) -> ArrayRecord | None:
    """The optimizer state a ``train.backward`` that carried one returns (None: none)."""
    return get_array(content, K.OPTIMIZER)


def kind(content: RecordDict) -> str:
    """What a training reply carries first: ``"activations"``, ``"weights"`` or ``""`` (neither)."""
    if get_array(content, K.ACTIVATIONS) is not None:
        return K.ACTIVATIONS
    if get_array(content, K.WEIGHTS) is not None:
        return K.WEIGHTS
    return ""


# --- schemas -------------------------------------------------------------------
@dataclass(frozen=True)
class ReplySchema:
    """The records a reply must hold (see :func:`reply_schema`).

    Attributes:
        activations: ``(batch, end)``: float32 ``[batch, *output shape of block end-1]``; ``end`` None:
            any shape (after a backward: ``sample_shape``).
        sample_shape: per-sample shape of the activations when ``end`` is None and known.
        labels: batch of the int64 labels ``[batch]``, or None.
        input_gradient: the shape of the gradient w.r.t. the input sent (None: not expected; ``()``: any).
        perturbed: ``P`` perturbation pairs ``[P, *activations shape]`` expected (0: none).
        weights: ``"some"`` (named model tensors) or ``"all"`` (the full model) with the example count, or ``""``.
        info: keys of ``info`` that must be present.
        loss_exempt: a non-finite reported loss skips the finiteness check (the run's own divergence).
    """

    activations: tuple[int, int | None] | None = None
    sample_shape: tuple[int, ...] | None = None
    labels: int | None = None
    input_gradient: tuple[int, ...] | None = None
    perturbed: int = 0
    weights: str = ""
    info: tuple[str, ...] = ()
    loss_exempt: bool = False


def _shape(record: ArrayRecord | None, name: str) -> tuple[int, ...] | None:
    return tuple(int(s) for s in record[name].shape) if record is not None and name in record else None


def reply_schema(action: str, sent: RecordDict, cut: int) -> ReplySchema | None:
    """What the reply to a request must hold, read from its action, typed config and records.

    Args:
        action: the request's message type.
        sent: the request's content.
        cut: the run's cut layer (a config's ``end`` 0).

    Returns:
        the schema, or None for a request without a ``config`` record (nothing to expect but finite values).
    """
    raw = get_config(sent, K.CONFIG)
    if raw is None:
        return None
    if action == K.TRAIN_FORWARD:
        plan = ForwardConfig.from_record(raw).plan(cut)
        x_in = _shape(get_array(sent, K.ACTIVATIONS), "x")
        batch = plan.input_batch(x_in[0] if x_in is not None else None)
        if plan.loss:
            grad = (x_in if x_in is not None else ()) if plan.replies_input_gradient else None
            return ReplySchema(input_gradient=grad, info=(K.INFO_LOSS,), loss_exempt=True)
        labels = batch if plan.replies_labels(get_array(sent, K.LABELS) is not None) else None
        return ReplySchema(activations=(batch, plan.end), labels=labels)
    if action == K.TRAIN_BACKWARD:
        cfg = BackwardConfig.from_record(raw)
        if cfg.next == K.NEXT_FORWARD:
            g = _shape(get_array(sent, K.GRADIENT), "g")
            return ReplySchema(activations=(cfg.batch_size, None), sample_shape=None if g is None else g[1:],
                               labels=None if cfg.label_slot else cfg.batch_size)
        return ReplySchema(weights="some" if cfg.next == K.NEXT_WEIGHTS else "")
    if action == K.TRAIN_STEP:
        return ReplySchema(weights="some" if StepConfig.from_record(raw).return_weights else "")
    if action == K.TRAIN_FIT:
        return ReplySchema(weights="all")
    if action == K.TRAIN_ZO_FORWARD:
        cfg = ZOForwardConfig.from_record(raw)
        return ReplySchema(activations=(cfg.batch_size, range_end(cfg.end, cut)), labels=cfg.batch_size,
                           perturbed=cfg.perturbations)
    if action == K.TRAIN_ZO_UPDATE:
        cfg = ZOUpdateConfig.from_record(raw)
        if cfg.next == K.NEXT_FORWARD:
            # the range is the client's stored one: its cut is the run's unless a zo_forward named another
            return ReplySchema(activations=(cfg.batch_size, None), labels=cfg.batch_size, perturbed=len(cfg.diffs))
        return ReplySchema(weights="some" if cfg.next == K.NEXT_WEIGHTS else "")
    if action == K.EVALUATE:
        return ReplySchema(info=(K.INFO_LOSS, K.INFO_ACCURACY))
    return ReplySchema()
