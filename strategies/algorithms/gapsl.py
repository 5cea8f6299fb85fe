"""GAPSL: gradient-aligned parallel split learning (leader gradient identification
and gradient direction alignment).

Source: the GAPSL paper (Sec. III, eqs. 1-8, Algorithms 1-2) and docs/explanation/design.md
§7. The functions here are the paper's equations on flattened
server-side gradients ``g_i`` (one per client of the round):

* LGI: consistency scores (eq. 1), the adaptive selection ratio ``K_t``
  (eq. 2), the leader gradient from the ``⌈K_t·S⌉`` most consistent clients
  (eqs. 3-4);
* GDA: angles to the leader (eq. 5), the adaptive threshold (eq. 6), the
  selected set ``Ŝ`` and the regulariser ``λ(1 − cos θ_i)`` of eq. 7.

:class:`GAPSL` is PSL (per-client client-side models, one server-side model)
whose server step uses them: the selected clients' regularised losses
(eq. 8), with the regulariser's gradient in one of two modes
(:func:`aligned_gradient`).

Who receives activation gradients (``gapsl-client-grads``). Sec. III's
workflow: "the server employs LGI to construct a leader gradient and then
utilizes GDA to regulate each device's gradient direction, followed by BP on
the server-side model to generate activation's gradients; and iii) the
server sends all generated gradients to the client device". The
back-propagation is of eq. 8's loss, a sum over ``Ŝ``, so:

* ``selected`` (default, the paper's reading): each client in ``Ŝ`` receives
  ``∇_{A_i} Σ_{j∈Ŝ} L_j`` (its own ``∇_{A_i} L_i`` when the server-side model
  mixes no samples, as without BatchNorm); a client outside ``Ŝ`` receives no
  gradient message, so it takes no step that iteration (as PyTorch's
  optimizers skip a parameter whose gradient is None) and goes on with its
  next batch: it is charged that forward and upload, no download and no
  backward pass;
* ``all`` (an earlier reading, ours): every client receives its own ``∇_{A_i} L_i``.

With ``gapsl-gda=none`` (Non-GDA) the server steps on the leader gradient,
so ``Ŝ`` is the leader set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError
from fl_app.run.options import Option
from fl_app.learning.task import Task
from strategies.core.errors import check_loss
from strategies.algorithms.psl import PSL, per_client_losses
from strategies.core.server_step import optimizer_step, set_gradient
from strategies.core.registry import register

#: Seed stream of the Rand-LGI / Rand-GDA ablations.
STREAM_ABLATION = 29


def pairwise_angles(grads: torch.Tensor) -> torch.Tensor:
    """``θ_ij = arccos(<g_i, g_j> / (‖g_i‖‖g_j‖))`` (radians) for rows of ``grads`` ``[S, D]``; ``[S, S]``."""
    g = grads.double()
    unit = g / g.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return torch.arccos((unit @ unit.T).clamp(-1.0, 1.0))


def consistency_scores(grads: torch.Tensor) -> torch.Tensor:
    """GAPSL eq. 1: ``θ_i = (1/(S−1)) Σ_{j≠i} θ_ij``, ``[S]`` radians (lower = more consistent).

    Raises:
        ValueError: fewer than two gradients.
    """
    s = grads.shape[0]
    if s < 2:
        raise ValueError("consistency scores need at least two client gradients")
    ang = pairwise_angles(grads)
    return (ang.sum(dim=1) - ang.diagonal()) / (s - 1)


@dataclass
class SelectionRatio:
    """GAPSL eq. 2: ``K_t = K_min + (t/T)·((ν_max − ν)/(ν_max − ν_min))·(K_max − K_min)``.

    ``ν`` is the standard deviation (population) of the round's consistency
    scores; ``ν_max``/``ν_min`` are its running extremes, including this round.
    When they are equal (the first round) the stability factor is taken as 1.

    Attributes:
        k_min, k_max: bounds of the ratio (paper defaults 0.2 and 0.8).
        total_rounds: ``T``.
    """

    k_min: float = 0.2
    k_max: float = 0.8
    total_rounds: int = 1
    nu_min: float = math.inf
    nu_max: float = -math.inf

    def __call__(self, scores: torch.Tensor, t: int) -> float:
        """``K_t`` for round ``t`` (0-based) from this round's scores; updates the running extremes."""
        nu = float(scores.double().std(unbiased=False))
        self.nu_min, self.nu_max = min(self.nu_min, nu), max(self.nu_max, nu)
        span = self.nu_max - self.nu_min
        stability = 1.0 if span <= 0 else (self.nu_max - nu) / span
        return self.k_min + (t / self.total_rounds) * stability * (self.k_max - self.k_min)


def leader_gradient(grads: torch.Tensor, scores: torch.Tensor, ratio: float) -> tuple[torch.Tensor, list[int]]:
    """GAPSL eqs. 3-4: the mean of the ``⌈ratio·S⌉`` gradients with the lowest scores.

    Returns:
        ``(g_lead [D], selected row indices in ascending score order)``.
    """
    k = max(1, math.ceil(ratio * grads.shape[0] - 1e-9))
    order = torch.argsort(scores, stable=True)[:k].tolist()
    return grads[order].mean(dim=0), order


def alignment(grads: torch.Tensor, lead: torch.Tensor, eta: float) -> tuple[torch.Tensor, float, list[int]]:
    """GAPSL eqs. 5-6: angles to the leader, the threshold, the selected set ``Ŝ``.

    ``θ_th = max(min(mean(θ) − η·std(θ), π/2), 0)`` (population std) and
    ``Ŝ = {i : θ_lead,i ≤ θ_th}``.

    Returns:
        ``(θ_lead [S] radians, θ_th, Ŝ as row indices)``.
    """
    ang = pairwise_angles(torch.cat([lead[None], grads]))[0, 1:]
    th = max(min(float(ang.mean()) - eta * float(ang.std(unbiased=False)), math.pi / 2), 0.0)
    return ang, th, [i for i, a in enumerate(ang.tolist()) if a <= th]


def alignment_penalty_gradient(g: torch.Tensor, lead: torch.Tensor) -> torch.Tensor:
    """``∂(1 − cos(g, g_lead))/∂g = −(ĝ_lead − cos·ĝ)/‖g‖`` (hats: unit vectors); shape of ``g``.

    GAPSL's first-order mode adds ``λ`` times this to a selected client's
    server-side gradient (eq. 7 with the Hessian of ``L_i`` taken as the
    identity), where the paper's implementation, which detaches ``g_i``,
    gets no gradient from the regulariser at all (its footnote 6).
    """
    gn, ln = g.norm(), lead.norm()
    cos = (g @ lead) / (gn * ln)
    return -(lead / ln - cos * g / gn) / gn


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The concatenation of ``tensors``, flattened (``[Σ numel]``)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def aligned_gradient(losses: Sequence[torch.Tensor], params: Sequence[torch.Tensor], selected: Sequence[int],
                     lead: torch.Tensor, lam: float, mode: str) -> torch.Tensor:
    """The gradient of eq. 8, ``Σ_{i∈Ŝ} [L_i + λ(1 − cos(g_i, g_lead))]``, flattened like ``params``.

    Modes:
        ``"exact"``: double back-propagation through ``g_i = ∇L_i`` (eq. 7 as
            written); the paper's text.
        ``"first-order"``: ``Σ_{i∈Ŝ} [g_i + λ ∂(1 − cos)/∂g_i]``, i.e. the
            Hessian of ``L_i`` taken as the identity; equal to ``"exact"`` when
            it is (a quadratic ``½‖w − c‖²``). The paper's implementation
            (footnote 6) detaches ``g_i`` and ``g_lead``, which makes the
            regulariser's gradient zero: that is ``λ = 0`` here.

    Raises:
        ValueError: unknown mode.
    """
    if mode not in ("exact", "first-order"):
        raise ValueError(f"unknown GAPSL mode {mode!r}; choose exact or first-order")
    total = torch.zeros_like(flat([p.detach() for p in params]))
    for i in selected:
        if mode == "exact" and lam:
            g = flat(torch.autograd.grad(losses[i], params, retain_graph=True, create_graph=True))
            penalty = 1 - (g @ lead) / (g.norm() * lead.norm())
            total += flat(torch.autograd.grad(losses[i] + lam * penalty, params, retain_graph=True))
        else:
            g = flat(torch.autograd.grad(losses[i], params, retain_graph=True))
            total += g + (lam * alignment_penalty_gradient(g, lead) if lam else 0.0)
    return total


@register
class GAPSL(PSL):
    """GAPSL: PSL whose server step follows the leader gradient (LGI) and aligns the selected clients (GDA)."""

    name = "gapsl"
    ushaped_refusal = ("LGI and GDA select and align per-client server-side gradients of losses the server "
                       "computes from the labels (GAPSL Sec. III, eqs. 1-8); the paper defines no U-shaped form "
                       "and none is implemented")
    options = (
        Option("gapsl-k-min", 0.2, "LGI: lower bound K_min of the selection ratio (eq. 2)", above=0, at_most=1,
               source="GAPSL eq. 2"),
        Option("gapsl-k-max", 0.8, "LGI: upper bound K_max of the selection ratio (eq. 2)", above=0, at_most=1,
               source="GAPSL eq. 2"),
        Option("gapsl-eta", 0.5, "GDA: threshold sensitivity η of eq. 6 (not stated in the paper)",
               source="GAPSL eq. 6"),
        Option("gapsl-lambda", 0.0, "GDA: regularisation coefficient λ of eq. 7 (0 = the paper's per model: "
                                   "3e-5 for vit-small, 5e-4 otherwise)", at_least=0, source="GAPSL eq. 7"),
        Option("gapsl-mode", "first-order", "GDA regulariser gradient: first-order (Hessian as identity) or exact "
               "(double back-propagation)", ("first-order", "exact")),
        Option("gapsl-lgi", "on", "ablation (Fig. 20): leader from the most consistent clients (on), from all "
               "(none: Non-LGI) or from a random subset of the same size (random: Rand-LGI)", ("on", "none", "random")),
        Option("gapsl-client-grads", "selected", "who receives activation gradients: the clients of eq. 8's sum "
               "(selected; Sec. III's BP of eq. 8) or every client its own (all)", ("selected", "all")),
        Option("gapsl-gda", "on", "ablation (Fig. 21): align the clients within the threshold (on), none, the "
               "server steps on the leader gradient (Non-GDA), or a random subset of the same size (random: Rand-GDA)",
               ("on", "none", "random")),
    )

    @classmethod
    def check_config(cls, cfg: RunConfig, task: Task) -> None:
        """PSL's checks, and K_min <= K_max (eq. 2).

        Raises:
            ConfigError: ``gapsl-k-min`` above ``gapsl-k-max`` (one line).
        """
        super().check_config(cfg, task)
        if cfg.gapsl_k_min > cfg.gapsl_k_max:
            raise ConfigError(f"need gapsl-k-min <= gapsl-k-max, got {cfg.gapsl_k_min} and {cfg.gapsl_k_max}")

    #: λ of eq. 7 per model where the paper gives one (Sec. V-A); other models get the VGG-16 value.
    PAPER_LAMBDA = {"vit-small": 3e-5}

    @property
    def regularisation(self) -> float:
        """λ: ``gapsl-lambda``, or when 0 the paper's value for the model (5e-4 VGG-16, 3e-5 ViT)."""
        return self.cfg.gapsl_lambda or self.PAPER_LAMBDA.get(self.task.model_name, 5e-4)

    def initialize(self) -> None:
        """PSL's state plus the running dispersion extremes of eq. 2."""
        super().initialize()
        c = self.cfg
        self.ratio = SelectionRatio(c.gapsl_k_min, c.gapsl_k_max, c.global_iterations)
        self.last_selected = 0
        self.ablation_rng = np.random.default_rng([c.seed, STREAM_ABLATION])

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]
                         ) -> dict[int, torch.Tensor | None]:
        """LGI and GDA on the per-client server-side gradients, one step on eq. 8; activation gradients back
        to ``Ŝ`` (None for the others) or to everyone (``gapsl-client-grads``)."""
        c = self.cfg
        pids, xs, losses = per_client_losses(self.server_model, batches)
        for p, loss in zip(pids, losses):
            check_loss(loss.detach(), f"server step (client {p})")
        params = [p for p in self.server_model.parameters() if p.requires_grad]
        grads = torch.stack([flat(torch.autograd.grad(loss, params, retain_graph=True)) for loss in losses])
        if len(pids) > 1:
            lead, selected = self.leader_and_selection(grads)
        else:
            lead, selected = grads[0], [0]
        self.last_selected = len(selected)
        receivers = range(len(pids)) if c.gapsl_client_grads == "all" else selected
        act_grads: dict[int, torch.Tensor | None] = dict.fromkeys(pids)
        if receivers:
            loss = sum(losses) if c.gapsl_client_grads == "all" else sum(losses[i] for i in selected)
            sent = torch.autograd.grad(loss, [xs[i] for i in receivers], retain_graph=True)
            act_grads.update({pids[i]: g.detach() for i, g in zip(receivers, sent)})
        total = None
        if c.gapsl_gda == "none":  # Non-GDA: the server steps on the leader gradient alone
            total = lead.detach()
        elif selected:
            total = aligned_gradient(losses, params, selected, lead.detach(), self.regularisation, c.gapsl_mode)
        if total is not None:
            optimizer_step(self.server_model, self.server_opt, c.clip_norm, lambda: set_gradient(params, total))
            self.server_updates += 1
        return act_grads

    def server_iteration_flops(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]],
                               grads: dict[int, torch.Tensor | None]) -> float:
        """The server FLOPs of one GAPSL iteration (an estimate from the block profiles, rows as the mean batch):

        one forward of all rows; one backward per client for its own server-side gradient ``g_i`` (LGI and
        GDA need them apart); one backward of the receivers' rows for their activation gradients; and eq. 8's
        step: with GDA, the selected clients' gradients again, once (``first-order``) or three times
        (``exact``: the double back-propagation's graph and its gradient); Non-GDA steps on the leader,
        already computed.
        """
        rows = sum(x.shape[0] for x, _ in batches.values())
        if not rows:
            return 0.0
        per_client = rows / len(batches)
        backward = self.server_flops(per_client, forward=False, backward=True)  # one client's backward
        receivers = sum(1 for g in grads.values() if g is not None)
        step = 0.0
        if self.cfg.gapsl_gda != "none":
            step = (3.0 if self.cfg.gapsl_mode == "exact" and self.regularisation else 1.0) * self.last_selected
        return self.server_flops(rows, backward=False) + (len(batches) + receivers + step) * backward

    def leader_and_selection(self, grads: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """LGI's leader gradient and GDA's selected rows, or their ablations (``gapsl-lgi``, ``gapsl-gda``).

        With ``gapsl-gda=none`` the rows returned are the leader set's (the
        server steps on the leader gradient), ascending.
        """
        c, n = self.cfg, grads.shape[0]
        scores = consistency_scores(grads)
        ratio = self.ratio(scores, self.global_iteration)
        if c.gapsl_lgi == "none":
            ratio = 1.0
        elif c.gapsl_lgi == "random":
            k = max(1, math.ceil(ratio * n - 1e-9))
            scores = torch.as_tensor(self.ablation_rng.permutation(n), dtype=torch.float64,
                                     device=grads.device)  # a random order
            ratio = k / n
        lead, leaders = leader_gradient(grads, scores, ratio)
        if c.gapsl_gda == "none":
            return lead, sorted(leaders)
        _, _, selected = alignment(grads, lead.to(grads.dtype), c.gapsl_eta)
        if c.gapsl_gda == "random":
            selected = sorted(int(i) for i in self.ablation_rng.choice(n, size=len(selected), replace=False))
        return lead, selected

    def extra_metrics(self) -> dict[str, float]:
        """How many clients GDA selected in the last server step."""
        return {"gda_selected": float(self.last_selected)}
