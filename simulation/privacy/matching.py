"""Label inference by gradient matching against the tail the server holds, static and tracked.

In a U-shaped split (``cut-layers=c1,c2``) the server computes the middle's
output ``z`` (one row per sample), sends it to the client's tail, and gets
back ``g = ∂L/∂z`` with ``L`` the tail's mean cross-entropy over the batch.
Where the server also holds the tail's weights ``W`` (it sends the round's
start weights and receives the updated tails at the end of the round, in
every strategy that aggregates the tails, PSL included; round 1's are the
run's seed's), it can compute, for each row and each label ``c``, the
gradient that label would give, ``ĝ_c(z_i) = (1/B) ∂ CE(tail_W(z_i), c)/∂z_i``,
and pick the closest: ``ŷ_i = argmin_c ‖ĝ_c(z_i) − g_i‖``
(:func:`match_labels`; the gradient-matching label attack of the DLG family,
Zhu et al., "Deep Leakage from Gradients", NeurIPS 2019, and of "Label
Leakage and Protection in Two-party Split Learning", Li et al., ICLR 2022,
§3, here with the tail's weights known).

**Static** uses the tail the round started from for every step of the round.
**Tracking** (:func:`track_tail`) replays each of the client's tail steps
with the inferred labels and the optimiser the server itself configured
(:class:`~fl_app.protocol.ForwardConfig`: lr, momentum, weight decay,
clipping), so that every step is matched against the tail as it then was;
where the client returns its tail, the distance between the replayed tail
and the returned one is the tracking error (0 up to float rounding when every
label was right). The rows are independent only where the tail mixes no
samples (no BatchNorm) and has no dropout the server cannot replay: the
function's result says so in ``exact`` (False for such a tail).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fl_app import protocol as P
from fl_app.learning.training import clip_and_step, make_sgd


def candidate_gradients(tail: nn.Module, z: torch.Tensor, num_classes: int, batch_size: int) -> torch.Tensor:
    """``[K, N, d]``: for every label ``c < K`` the gradient ``(1/B) ∂CE(tail(z_i), c)/∂z_i`` of each row.

    Args:
        tail: the tail (eval mode is the caller's choice; no BatchNorm: rows must be independent).
        z: the tail's inputs ``[N, d]`` (flattened as recorded; reshaped by the tail's first block).
        num_classes: ``K``.
        batch_size: ``B`` of the mean loss the client back-propagated.
    """
    z = z.detach().float()
    out = []
    for c in range(num_classes):
        x = z.clone().requires_grad_(True)
        logits = tail(x)
        target = torch.full((z.shape[0],), c, dtype=torch.int64)
        loss = nn.functional.cross_entropy(logits, target, reduction="sum") / batch_size
        (grad,) = torch.autograd.grad(loss, x)
        out.append(grad.reshape(z.shape[0], -1))
    return torch.stack(out)


def match_labels(tail: nn.Module, z: torch.Tensor, g: torch.Tensor, num_classes: int,
                 batch_size: int | None = None) -> torch.Tensor:
    """``ŷ`` int64 ``[N]``: for each row the label whose gradient is nearest (L2) the returned ``g`` ``[N, d]``.

    Args:
        tail: the tail's model with the weights it had when ``g`` was computed (or the attacker's best guess).
        z: the inputs the server sent ``[N, d]``; ``g``: the gradients it got back, the same shape.
        num_classes: ``K``.
        batch_size: ``B`` of the client's mean loss (default ``N``: one batch).
    """
    cands = candidate_gradients(tail, z, num_classes, batch_size or z.shape[0])
    dist = (cands - g.reshape(1, g.shape[0], -1).float()).pow(2).sum(dim=2)
    return dist.argmin(dim=0)


def _mixes_samples(tail: nn.Module) -> bool:
    return any(isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.Dropout)) for m in tail.modules())


@dataclass
class TrackResult:
    """What :func:`track_tail` inferred of one client's tail rows.

    Attributes:
        static: labels matched against the tail the round started from, ``[N]`` in the recorded order.
        tracked: labels matched against the replayed tail, step by step, ``[N]``.
        errors: per returned tail, the largest absolute difference between it and the replay.
        exact: whether the replay can be exact (no BatchNorm or dropout in the tail, steps not accumulated).
    """

    static: torch.Tensor
    tracked: torch.Tensor
    errors: list[float] = field(default_factory=list)
    exact: bool = True


def _optimizer(tail: nn.Module, cfg: P.ForwardConfig) -> torch.optim.Optimizer:
    return make_sgd(tail, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.lr_scale, kind=cfg.optimizer)


def track_tail(initial: nn.Module, events: list[dict[str, Any]], num_classes: int) -> TrackResult:
    """Gradient matching of one client's tail rows, static and tracked (see the module docstring).

    Args:
        initial: the tail the client starts from when no weights were sent first (the run's seed's);
            not modified.
        events: the server's record of this client's tail, in order
            (:func:`simulation.privacy.record.read_tail_events`: ``sent``, ``forward``, ``uploaded``).
        num_classes: ``K``.

    Returns:
        A :class:`TrackResult`; the rows are those of the ``forward`` events, concatenated.
    """
    tracked = copy.deepcopy(initial).train()
    start = copy.deepcopy(initial).eval()
    opt: torch.optim.Optimizer | None = None
    static, labels, errors = [], [], []
    exact = not _mixes_samples(tracked)
    for event in events:
        kind = event["kind"]
        if kind in ("sent", "uploaded"):
            if kind == "uploaded":
                errors.append(max(float((tracked.state_dict()[k] - v).abs().max()) for k, v in
                                  event["weights"].items()))
            tracked.load_state_dict(event["weights"])
            start.load_state_dict(event["weights"])
            if kind == "sent":  # the client's slot resets its optimiser when it loads weights
                opt = None
            continue
        cfg = P.ForwardConfig(**{k.replace("-", "_"): (tuple(v) if isinstance(v, list) else v)
                                 for k, v in event["config"].items()})
        z, g = event["z"], event["g"]
        static.append(match_labels(start, z, g, num_classes, cfg.batch_size or len(z)))
        y = match_labels(tracked.eval(), z, g, num_classes, cfg.batch_size or len(z))
        labels.append(y)
        if cfg.accumulate:
            exact = False
            continue
        tracked.train()
        opt = opt or _optimizer(tracked, cfg)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(tracked(z.float()), y).backward()
        if cfg.weight != 1.0:
            for p in tracked.parameters():
                if p.grad is not None:
                    p.grad.mul_(cfg.weight)
        clip_and_step(tracked, opt, cfg.clip_norm)
    empty = torch.zeros(0, dtype=torch.int64)
    return TrackResult(torch.cat(static) if static else empty, torch.cat(labels) if labels else empty, errors, exact)
