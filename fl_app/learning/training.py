"""Training primitives, shared by the ClientApp and the server: optimizers, steps, batches, evaluation.

Everything here is stateless: the state a client carries between messages
(weights, optimizer momentum, sampler position) is passed in and returned as
Flower records, because live objects do not survive between a node's
messages (docs/explanation/design.md §4).
"""

from __future__ import annotations

import functools
import weakref

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord
from torch import nn

from fl_app.protocol import (
    array_record,
    canonical,
    record_state,
    record_tensor,
    record_view,
    state_record,
    tensor_array,
)
from fl_app.run.device import model_device, to_device
from fl_app.learning.task import Task, seeded_generator

#: Seed-stream tags, so that the streams drawn from one run seed never overlap.
STREAM_SAMPLER = 7
STREAM_AUGMENT = 11


OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")
"""Optimizer names of the ``optimizer`` run-config key."""


#: model -> its ``named_parameters()`` and its blocks' parameters (a model's parameters are the same objects for
#: its whole life: weights are loaded into them, never replaced)
_PARAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def named_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``list(model.named_parameters())``, cached per model object (it walks every module: a cost per
    relay message)."""
    hit = _PARAMS.get(model)
    if hit is None:
        hit = _PARAMS[model] = list(model.named_parameters())
    return hit


def make_sgd(model: nn.Module, lr: float, momentum: float, weight_decay: float,
             lr_scale: Sequence[float] = (), kind: str = "sgd") -> torch.optim.Optimizer:
    """SGD (the GAS paper's optimiser) or AdamW over ``model``'s parameters.

    Args:
        lr_scale: per-block learning-rate multipliers of a
            :class:`~fl_app.models.BlockModel` (one per block, in order; empty:
            one group at ``lr``). RingSFL v2 (eq. 7) scales an overlapping
            block's rate by its overlap count.
        kind: ``"sgd"`` (with ``momentum``) or ``"adamw"`` (default betas,
            decoupled ``weight_decay``; ``momentum`` unused), GAPSL's choice
            for its ViT.

    Raises:
        ValueError: ``lr_scale`` does not have one entry per block, or an
            unknown ``kind``.
    """
    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r}; choose one of {', '.join(OPTIMIZERS)}")
    if not lr_scale:
        params: list = [p for _, p in named_parameters(model)]
    else:
        blocks = list(model.blocks.values())
        if len(lr_scale) != len(blocks):
            raise ValueError(f"lr-scale has {len(lr_scale)} entries for {len(blocks)} blocks")
        groups = [{"params": [p for _, p in named_parameters(b)], "lr": lr * float(s)}
                  for b, s in zip(blocks, lr_scale)]
        params = [g for g in groups if g["params"]]
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def accumulate_gradients(model: nn.Module, record: ArrayRecord | None, weight: float) -> ArrayRecord:
    """``accum + weight · grad`` per parameter name (parameters without a gradient add 0).

    Args:
        record: the accumulator so far (:func:`accumulate_gradients`' output), or None.
        weight: the weight of this gradient, e.g. RingSFL's ``a_i = D_i / ΣD``.

    Returns:
        the new accumulator, float32 tensors keyed like ``model.named_parameters()``
        (entries without a gradient here are passed on as they are, see
        :func:`~fl_app.protocol.canonical`).
    """
    out = {k: canonical(a) for k, a in record.items()} if record is not None else {}
    for name, p in named_parameters(model):
        if p.grad is None:
            continue
        g = (p.grad.detach() * weight).cpu()
        if name not in out:
            out[name] = tensor_array(g)
            continue
        old = record_view(record, name)
        if old.dtype == g.numpy().dtype and old.shape == tuple(g.shape):
            new = g.numpy()  # g is this call's own tensor: old + g written into it (float add, as torch's)
            np.add(old, new, out=new)
            out[name] = tensor_array(g)
        else:
            out[name] = tensor_array(record_tensor(record, name) + g)
    return array_record(out)


def load_gradients(model: nn.Module, record: ArrayRecord | None) -> bool:
    """Set ``p.grad`` from an accumulator made by :func:`accumulate_gradients`.

    Returns:
        False when there is nothing accumulated (no step should be taken).
    """
    if record is None:
        return False
    acc = record_state(record)  # fresh copies
    for name, p in named_parameters(model):
        p.grad = to_device(acc[name], p.device) if name in acc else None
    return bool(acc)


def _state_key(name: str, entry: str) -> str:
    """Record key of one optimizer-state tensor: SGD's momentum buffer under the parameter's name,
    other entries (AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``) as ``name|entry``."""
    return name if entry == "momentum_buffer" else f"{name}|{entry}"


def optimizer_record(model: nn.Module, opt: torch.optim.Optimizer) -> ArrayRecord:
    """The optimizer's per-parameter state tensors keyed by parameter name (see :func:`_state_key`).

    Parameters without state (before the first step) are left out.
    """
    names = {id(p): n for n, p in named_parameters(model)}
    bufs = {}
    for group in opt.param_groups:
        for p in group["params"]:
            for entry, value in opt.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    bufs[_state_key(names[id(p)], entry)] = value
    return state_record(bufs)


def load_optimizer(model: nn.Module, opt: torch.optim.Optimizer, record: ArrayRecord | None) -> None:
    """Restore the state saved by :func:`optimizer_record`."""
    if record is None:
        return
    bufs = record_state(record)
    for name, p in named_parameters(model):
        for key, value in bufs.items():
            if key == name:
                opt.state[p]["momentum_buffer"] = to_device(value, p.device)
            elif key.startswith(name + "|"):
                entry = key[len(name) + 1:]
                # AdamW keeps its ``step`` count on the CPU; everything else lives with the parameter
                opt.state[p][entry] = value if entry == "step" else to_device(value, p.device)


def clip_and_step(model: nn.Module, opt: torch.optim.Optimizer, clip_norm: float) -> None:
    """Clip the gradient norm to ``clip_norm`` (0 = no clipping), then step."""
    if clip_norm > 0:
        nn.utils.clip_grad_norm_([p for _, p in named_parameters(model)], clip_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)


def backward_step(model: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, clip_norm: float, *,
                  check: Callable[[torch.Tensor], None] | None = None,
                  gradient: torch.Tensor | None = None) -> None:
    """One optimizer step on ``loss``: check it, zero the gradients, back-propagate, clip and step.

    Args:
        loss: a scalar loss; or, with ``gradient``, any output to back-propagate
            ``gradient`` (same shape) from (EPSL's aggregated last-layer gradient).
        clip_norm: clip the gradient norm to this (0 = no clipping).
        check: called first with ``loss.detach()``, e.g. to stop on a non-finite loss
            (the strategies' ``check_loss``).
    """
    if check is not None:
        check(loss.detach())
    opt.zero_grad(set_to_none=True)
    loss.backward(gradient)
    clip_and_step(model, opt, clip_norm)


@functools.lru_cache(maxsize=32)
def _epoch_permutation(seed: int, partition_id: int, epoch: int, n: int) -> np.ndarray:
    """The order of a partition's ``n`` examples in one epoch, seeded by ``(seed, partition_id, epoch)``
    (read-only; cached, since every batch of the epoch reads it)."""
    perm = np.random.default_rng([seed, STREAM_SAMPLER, partition_id, epoch]).permutation(n)
    perm.flags.writeable = False
    return perm


def sample_batch(task: Task, partition_id: int, sampler: ConfigRecord, batch_size: int) -> np.ndarray:
    """Next mini-batch of a client, without replacement within an epoch.

    Each epoch is a permutation of the partition seeded by
    ``(seed, partition_id, epoch)``; a batch that would run past the end
    starts a new epoch (the partial remainder is dropped). ``sampler`` holds
    ``epoch`` and ``pos`` and is updated in place.

    Returns:
        int64 ``[batch_size]`` indices into the training set.

    Raises:
        ValueError: ``batch_size`` exceeds the partition size.
    """
    part = task.partitions[partition_id]
    n = len(part)
    if batch_size > n:
        raise ValueError(f"batch size {batch_size} exceeds partition {partition_id} size {n}")
    epoch, pos = int(sampler.get("epoch", 0)), int(sampler.get("pos", 0))
    if pos + batch_size > n:
        epoch, pos = epoch + 1, 0
    perm = _epoch_permutation(task.seed, partition_id, epoch, n)
    batch = part[perm[pos:pos + batch_size]]
    sampler["epoch"], sampler["pos"] = epoch, pos + batch_size
    return batch.astype(np.int64)


def load_batch(task: Task, partition_id: int, indices: Iterable[int], step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised (and, for CIFAR, augmented) batch of a client's step.

    The augmentation is seeded by ``(seed, partition_id, step)``, so that the
    forward pass and its recomputation in ``train.backward`` see identical
    inputs.

    Returns:
        ``(x, y)``: float32 ``[B, C, H, W]`` and int64 ``[B]``.
    """
    gen = seeded_generator(task.seed, STREAM_AUGMENT, partition_id, step) if task.data.augment else None
    idx = indices if isinstance(indices, np.ndarray) else np.asarray(list(indices))
    return task.data.train_batch(idx.astype(np.int64, copy=False), gen)


def next_batch(task: Task, partition_id: int, sampler: ConfigRecord, batch_size: int,
               ) -> tuple[np.ndarray, int, torch.Tensor, torch.Tensor]:
    """A client's next mini-batch of own data: :func:`sample_batch`, then :func:`load_batch`.

    ``sampler`` (``epoch``, ``pos``, ``step``) is advanced in place by one step.

    Returns:
        ``(indices, step, x, y)``: the int64 indices, the step that seeds the
        augmentation, and the CPU batch (see :func:`load_batch`).
    """
    step = int(sampler.get("step", 0))
    idx = sample_batch(task, partition_id, sampler, batch_size)
    sampler["step"] = step + 1
    x, y = load_batch(task, partition_id, idx, step)
    return idx, step, x, y


def local_fit(
    model: nn.Module,
    task: Task,
    partition_id: int,
    sampler: ConfigRecord,
    *,
    iterations: int,
    batch_size: int,
    lr: float,
    momentum: float,
    weight_decay: float,
    clip_norm: float,
    optimizer: str = "sgd",
) -> float:
    """Full-model local training (FL baselines): ``iterations`` SGD steps.

    Starts from a fresh optimizer. ``sampler`` (``epoch``, ``pos``,
    ``step``) is updated in place.

    Returns:
        the mean training loss over the steps.
    """
    opt = make_sgd(model, lr, momentum, weight_decay, kind=optimizer)
    model.train()
    total = 0.0
    device = model_device(model)
    for _ in range(iterations):
        _, _, x, y = next_batch(task, partition_id, sampler, batch_size)
        x, y = to_device(x, device), to_device(y, device)
        loss = nn.functional.cross_entropy(model(x), y)
        backward_step(model, opt, loss, clip_norm)
        total += float(loss.detach())
    return total / max(iterations, 1)


@torch.no_grad()
def evaluate_model(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float, int]:
    """Mean cross-entropy loss, accuracy and example count over ``batches`` (moved to the model's device)."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    device = model_device(model)
    for x, y in batches:
        x, y = to_device(x, device), to_device(y, device)
        logits = model(x)
        loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(dim=1) == y).sum())
        count += int(y.numel())
    model.train()
    if count == 0:
        return float("nan"), float("nan"), 0
    return loss_sum / count, correct / count, count
