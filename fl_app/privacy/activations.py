"""Defences a client applies to the activations it uploads, and the evaluator's record of what it sent.

Two defences, both off by default (nothing changes when they are off) and
both run on the client, so they run on devices:

* **NoPeek** (``nopeek-alpha`` = α; Vepakomma, Gupta, Swedish, Raskar,
  "NoPeek: Information leakage reduction to share activations in distributed
  deep learning", ICDMW 2020, eq. 2): the client minimises
  ``α·dCor(X, Z) + L`` where ``X`` is its input batch, ``Z`` its client-side
  model's activations and ``L`` the task loss whose gradient w.r.t. what it
  sent the server returns. ``dCor`` is the (biased, V-statistic) distance
  correlation of Székely, Rizzo and Bakirov (2007), as
  ``dcor.distance_correlation`` computes it (:func:`distance_correlation`,
  tested against that package). The term enters the client's backward
  (:func:`fl_app.client.split_handlers.train_backward`): the objective
  back-propagated is ``<g, Z_sent> + α·dCor(X, Z)``, whose gradient w.r.t. the
  client's weights is exactly that of ``L + α·dCor`` (``g = ∂L/∂Z_sent``).
* **Clipped Gaussian noise** (``act-clip`` = C, ``act-noise`` = σ): each
  sample's activation is scaled to an L2 norm of at most C, then
  ``N(0, (σC)²)`` noise is added to every coordinate
  (:meth:`ActivationDefence.release`), on the client, before the uplink codec.
  The noise of a forward pass is drawn from its own generator, seeded by
  ``(run seed, stream 31, partition, forward counter)`` (:func:`noise_seed`),
  never from the global RNG, and stored with the batch; the client's
  ``train.backward`` recomputes exactly the noisy activations it sent. The
  server's gradient is taken w.r.t. the noisy activations (as in DP-style
  split learning); the client back-propagates it through the clipping (the
  noise is additive, its Jacobian the identity). No differential-privacy ε is
  claimed: sflower reports σ, C and the measured leakage
  (``sflower attack``), not an accounted privacy budget.

Both apply to what a client computes on its own data and uploads (a range
that starts at block 0), not to relayed segments. Central evaluation runs
the clean model.

The **evaluator's record** (``privacy-record``): a client writes the inputs of
its last uploaded batch, with the activations it sent, under
``RUN_DIR/privacy/evaluator/`` (:func:`write_ground_truth`). That is the
ground truth an attack is scored against, never the server's: the server
keeps only what it received (``RUN_DIR/privacy/received.npz``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_app.run.errors import ConfigError

#: The batch-record key of a forward pass's noise seed (the slot's ``batch`` ConfigRecord).
NOISE_SEED = "noise-seed"
#: The seed stream of the activation noise (``fl_app.client.state.STREAM_DROPOUT`` is 29).
STREAM_NOISE = 31
#: Where, under the run directory, the privacy measurement's files go.
PRIVACY_DIR = "privacy"
#: The evaluator's ground truth, under :data:`PRIVACY_DIR` (written by the clients, read by the scorer only).
EVALUATOR_DIR = "evaluator"


def distance_correlation(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The sample distance correlation ``dCor(X, Z)`` of two batches, differentiable.

    The biased (V-statistic) estimator of Székely, Rizzo and Bakirov, "Measuring and testing
    dependence by correlation of distances", Ann. Statist. 35(6), 2007, eq. 2.8 and Definition 4:
    double-centred Euclidean distance matrices ``A``, ``B``; ``dCov² = mean(A∘B)``;
    ``dCor = sqrt(dCov² / sqrt(dVar²(X) dVar²(Z)))``, 0 when a variance is 0. The same number as
    ``dcor.distance_correlation(x, z)`` (tests/test_privacy.py). Computed in float64.

    Args:
        x: ``[B, ...]`` (flattened to ``[B, p]``).
        z: ``[B, ...]`` (flattened to ``[B, q]``), the same ``B``.

    Returns:
        A scalar tensor in ``[0, 1]`` (the dtype of ``x``), differentiable in both.

    Raises:
        ValueError: the batch sizes differ or are below 2.
    """
    if x.shape[0] != z.shape[0] or x.shape[0] < 2:
        raise ValueError(f"distance correlation needs two batches of the same size >= 2, got {x.shape[0]}, {z.shape[0]}")
    a, b = _centred_distances(x.flatten(1).double()), _centred_distances(z.flatten(1).double())
    dcov2, var_a, var_b = (a * b).mean(), (a * a).mean(), (b * b).mean()
    denom = torch.sqrt(var_a * var_b)
    if float(denom.detach()) <= 0.0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.sqrt((dcov2 / denom).clamp_min(1e-18)).to(x.dtype)


def _centred_distances(x: torch.Tensor) -> torch.Tensor:
    """The double-centred Euclidean distance matrix ``[B, B]`` of the rows of ``x`` (a zero diagonal whose
    gradient is 0, not NaN)."""
    sq = (x * x).sum(dim=1)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)).clamp_min(0.0)
    positive = d2 > 0
    d = torch.where(positive, torch.sqrt(torch.where(positive, d2, torch.ones_like(d2))), torch.zeros_like(d2))
    return d - d.mean(dim=0, keepdim=True) - d.mean(dim=1, keepdim=True) + d.mean()


def clip_rows(acts: torch.Tensor, bound: float) -> torch.Tensor:
    """Each sample of ``acts`` ``[B, ...]`` scaled to an L2 norm of at most ``bound`` (differentiable; the
    per-example clipping of Abadi et al., "Deep learning with differential privacy", CCS 2016, eq. of
    Algorithm 1, applied to activations)."""
    norms = acts.flatten(1).norm(dim=1)
    factor = (bound / norms.clamp_min(1e-12)).clamp(max=1.0)
    return acts * factor.view(-1, *([1] * (acts.dim() - 1)))


def noise_seed(run_seed: int, partition_id: int, forward: int) -> int:
    """The seed of the activation noise of a node's ``forward``-th training forward pass (a 63-bit int)."""
    seq = np.random.SeedSequence([int(run_seed), STREAM_NOISE, int(partition_id), int(forward)])
    return int(seq.generate_state(1, np.uint64)[0] >> 1)


@dataclass(frozen=True)
class ActivationDefence:
    """The run's defences on a client's uploaded activations (see the module docstring).

    Attributes:
        nopeek_alpha: α, the weight of ``dCor(X, Z)`` in the client's loss (0: off).
        clip: C, the per-sample L2 bound of the activations (0: off).
        sigma: σ, the noise multiplier: noise ``N(0, (σC)²)`` per coordinate (0: off; needs ``clip``).
    """

    nopeek_alpha: float = 0.0
    clip: float = 0.0
    sigma: float = 0.0

    @classmethod
    def from_config(cls, cfg: Any) -> ActivationDefence | None:
        """The defences of a run configuration (``nopeek-alpha``, ``act-clip``, ``act-noise``); None when all
        are off (the clients run exactly as without this module)."""
        out = cls(float(cfg.get("nopeek-alpha")), float(cfg.get("act-clip")), float(cfg.get("act-noise")))
        return out if out.nopeek_alpha or out.clip or out.sigma else None

    @property
    def noisy(self) -> bool:
        """Whether the uploaded activations get noise (a seeded draw per forward pass)."""
        return self.sigma > 0 and self.clip > 0

    def release(self, acts: torch.Tensor, seed: int | None) -> torch.Tensor:
        """What the client uploads: ``clip_C(acts) + N(0, (σC)²)`` (the noise from a CPU generator seeded by
        ``seed``; the same seed gives the same tensor). Differentiable w.r.t. ``acts`` through the clipping.

        Raises:
            ValueError: noise is on and ``seed`` is None.
        """
        out = clip_rows(acts, self.clip) if self.clip > 0 else acts
        if not self.noisy:
            return out
        if seed is None:
            raise ValueError("activation noise needs the forward pass's noise seed")
        gen = torch.Generator().manual_seed(int(seed))
        noise = torch.randn(tuple(out.shape), generator=gen, dtype=torch.float32)
        return out + (self.sigma * self.clip) * noise.to(device=out.device, dtype=out.dtype)

    def objective(self, x: torch.Tensor, acts: torch.Tensor, grad: torch.Tensor, seed: int | None) -> torch.Tensor:
        """The scalar the client back-propagates: ``<grad, release(acts)> + α·dCor(x, acts)``.

        Args:
            x: the client's input batch ``[B, ...]``.
            acts: its model's activations ``[B, ...]`` (in the autograd graph).
            grad: the server's gradient w.r.t. the uploaded activations, shaped as ``acts``.
            seed: the forward pass's noise seed (see :meth:`release`).
        """
        sent = self.release(acts, seed) if self.clip > 0 else acts
        out = (sent * grad).sum()
        if self.nopeek_alpha > 0:
            out = out + self.nopeek_alpha * distance_correlation(x, acts)
        return out


def check_defences(strategy: str, cfg: Any, *, sends_activations: bool, zeroth_order: bool) -> None:
    """Refuse a defence a strategy cannot use, or an incomplete one.

    Args:
        strategy: the strategy's name (for the message).
        cfg: the run configuration.
        sends_activations: whether the strategy's clients upload activations (FL baselines: no).
        zeroth_order: whether its clients train zeroth-order (they never back-propagate).

    Raises:
        ConfigError: one line: a defence on a strategy that sends no activations; NoPeek or noise with
            zeroth-order clients; ``act-noise`` without ``act-clip``.
    """
    defence = ActivationDefence.from_config(cfg)
    if defence is None:
        return
    keys = ", ".join(k for k, v in (("nopeek-alpha", defence.nopeek_alpha), ("act-clip", defence.clip),
                                    ("act-noise", defence.sigma)) if v)
    if not sends_activations:
        raise ConfigError(f"{keys}: {strategy}'s clients send no activations (full models only); nothing to defend")
    if zeroth_order:
        raise ConfigError(f"{keys}: {strategy}'s clients train zeroth-order and never back-propagate (NoPeek needs "
                          "a backward pass; noise on the perturbed pairs is not supported)")
    if defence.sigma > 0 and defence.clip <= 0:
        raise ConfigError("act-noise needs act-clip > 0: the noise is act-noise × act-clip")


def write_ground_truth(run_dir: str, partition_id: int, x: torch.Tensor, acts: torch.Tensor) -> None:
    """The evaluator's record of a client's last uploaded batch: ``RUN_DIR/privacy/evaluator/client-K.npz``
    with ``x`` (its normalised inputs) and ``acts`` (what it sent, float32), replaced atomically."""
    folder = Path(run_dir) / PRIVACY_DIR / EVALUATOR_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"client-{partition_id}.npz"
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, x=x.detach().cpu().float().numpy(), acts=acts.detach().cpu().float().numpy())
    os.replace(tmp, path)


def tail_truth_path(run_dir: str | Path, partition_id: int) -> Path:
    """``RUN_DIR/privacy/evaluator/tail-K.npys``: client K's record of its tail's returned gradients."""
    return Path(run_dir) / PRIVACY_DIR / EVALUATOR_DIR / f"tail-{partition_id}.npys"


def append_tail_truth(run_dir: str, partition_id: int, grad: torch.Tensor, labels: torch.Tensor) -> None:
    """Append a U-shaped tail's returned gradient (as sent, ``[B, ...]``, as float32 ``[B, d]``) and its
    batch's labels (int64 ``[B]``) to the evaluator's record :func:`tail_truth_path`: the ground truth of the
    label attack (:mod:`simulation.privacy.label_leakage`). The file is a stream of ``.npy`` arrays, ``g`` then ``y``
    per reply, appended without reading it back (one write per reply, however long the run)."""
    path = tail_truth_path(run_dir, partition_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        np.save(fh, grad.detach().cpu().float().reshape(grad.shape[0], -1).numpy())
        np.save(fh, labels.detach().cpu().to(torch.int64).numpy())


def read_tail_truth(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(g [N, d] float32, y [N] int64)``: every pair :func:`append_tail_truth` wrote to ``path``, in order
    (a pair cut short, as by a killed client, is left out).

    Raises:
        OSError: ``path`` cannot be read.
    """
    grads, labels = [], []
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        while fh.tell() < size:
            try:
                g, y = np.load(fh, allow_pickle=False), np.load(fh, allow_pickle=False)  # object arrays refused
            except (ValueError, EOFError, OSError):
                break
            grads.append(g)
            labels.append(y)
    if not grads:
        return np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.int64)
    return np.concatenate(grads), np.concatenate(labels)
