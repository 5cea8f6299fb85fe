"""S²FL (Yan et al. 2023), the synchronous baseline of GAS's Fig. 3.

"Have Your Cake and Eat It Too: Toward Efficient and Accurate Split Federated
Learning": MiniBatch-SFL plus an adaptive cut layer per client (chosen by
speed) and activation grouping. This follows what GAS's own S²FL baseline
code does (``baseline/S2FL.py`` in ``eejiarong/GAS``; docs/explanation/design.md §7):

* the clients of a round are split into ``s2fl-groups`` groups whose label
  histograms are closest (mean L2 distance) to uniform, by swapping clients
  (:func:`balanced_groups`);
* each local iteration every client gets the gradient of its own mean loss
  under the current server-side model; then, per group, a copy of the
  server-side model steps once on the group's concatenated activations, and
  the group copies are averaged (uniformly) into the server-side model;
* batch sizes are proportional to data size and client-side models are
  averaged by data size (as MiniBatch-SFL);
* the adaptive cut changes time only: each client is charged the candidate
  cut (``s2fl-cuts``) whose per-iteration time is closest to the median over
  all clients and candidate cuts (:func:`closest_to_median`); the model split
  itself stays at ``cut-layer``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from fl_app.run.options import Option
from fl_app.run.errors import ConfigError
from fl_app import protocol as P
from strategies.core.aggregation import AGGREGATION_OPTION
from strategies.core.dispatcher import Request
from strategies.core.registry import register
from strategies.core.server_step import activation_gradient, step_on_loss
from strategies.core.split import copy_model
from strategies.algorithms.splitfed import MiniBatchSFL


def label_distance(histogram: np.ndarray) -> float:
    """L2 distance of a label histogram's distribution from uniform, ``‖h/Σh − 1/n‖₂`` (``n`` classes;
    an empty histogram counts as all zeros, as in S²FL's code)."""
    h = np.asarray(histogram, dtype=np.float64)
    total = h.sum()
    frac = h / total if total > 0 else np.zeros_like(h)
    return float(np.sqrt(((frac - 1.0 / len(h)) ** 2).sum()))


def balanced_groups(histograms: list[np.ndarray], num_groups: int, max_passes: int = 100) -> list[list[int]]:
    """Split clients ``0..K-1`` into ``num_groups`` groups with label mixes close to uniform (S²FL's grouping).

    Start from contiguous chunks of ``0..K-1`` (``np.array_split``); then,
    up to ``max_passes`` times, scan clients group by group and apply the
    first client's best swap with a client of another group that lowers the
    mean over groups of :func:`label_distance` of the group's summed
    histogram; stop when no swap helps.

    Args:
        histograms: per client, its label counts ``[num_classes]``.
        num_groups: G >= 1; at most K groups are made.

    Returns:
        The groups, as lists of client indices.
    """
    k = len(histograms)
    g = max(1, min(num_groups, k))
    groups = [list(map(int, part)) for part in np.array_split(np.arange(k), g)]
    hist = [np.asarray(h, dtype=np.float64) for h in histograms]

    def cost(gs: list[list[int]]) -> float:
        return float(np.mean([label_distance(sum(hist[i] for i in grp)) for grp in gs]))

    current = cost(groups)
    for _ in range(max_passes):
        improved = False
        for gi, group in enumerate(groups):
            for a in list(group):
                best, best_cost = None, current
                for gj, other in enumerate(groups):
                    if gj == gi:
                        continue
                    for b in other:
                        trial = [list(grp) for grp in groups]
                        trial[gi][trial[gi].index(a)] = b
                        trial[gj][trial[gj].index(b)] = a
                        c = cost(trial)
                        if c < best_cost - 1e-12:
                            best, best_cost = trial, c
                if best is not None:
                    groups, current, improved = best, best_cost, True
                    break
            if improved:
                break
        if not improved:
            break
    return groups


def closest_to_median(times: np.ndarray) -> np.ndarray:
    """S²FL's adaptive cut: per client, the candidate whose time is closest to the median of all.

    Args:
        times: ``[K, M]`` seconds of one local iteration of client ``k`` at
            candidate cut ``m``.

    Returns:
        ``[K]`` indices into the candidates (ties: the first).
    """
    times = np.asarray(times, dtype=np.float64)
    median = np.median(times)
    return np.argmin(np.abs(times - median), axis=1)


@register
class S2FL(MiniBatchSFL):
    """S²FL as in GAS's baseline code: activation grouping and a time-only adaptive cut (see the module)."""

    name = "s2fl"
    ushaped_refusal = ("its adaptive cut (s2fl-cuts) moves one prefix cut per client; a second cut is not part "
                       "of S²FL and is not implemented")
    options = (
        AGGREGATION_OPTION,
        Option("s2fl-cuts", "1:2", "candidate cut layers of the adaptive cut, e.g. 1:2 (GAS's code: after "
               "AlexNet's conv1 and conv2); only the time charged changes"),
        Option("s2fl-groups", 2, "number of activation groups, each with its own server-side step", at_least=1,
               source="S²FL §4"),
    )

    def initialize(self) -> None:
        """Check the candidate cuts; one server-side model copy and optimizer per group."""
        super().initialize()
        try:
            self.candidate_cuts = [int(v) for v in str(self.cfg.s2fl_cuts).split(":")]
        except ValueError:
            raise ConfigError(f"s2fl-cuts must be cut layers separated by ':', got '{self.cfg.s2fl_cuts}'") from None
        n = self.costs.num_blocks
        bad = [c for c in self.candidate_cuts if not 1 <= c <= n - 1]
        if bad:
            raise ConfigError(f"s2fl-cuts {bad[0]} out of range for {self.task.model_name} ({n} blocks): choose 1..{n - 1}")
        self.group_models = [self.server_model] + [copy_model(self.server_model)
                                                   for _ in range(self.cfg.s2fl_groups - 1)]
        self.group_opts = [self.server_opt] + [self.server_optimizer(m) for m in self.group_models[1:]]
        self.groups: list[list[int]] = []
        self.charged_cut: dict[int, int] = {}

    def iteration_time(self, pid: int, cut: int, batch: int) -> float:
        """Expected seconds of one local iteration of ``pid`` with the cut at ``cut``: forward and
        backward of blocks ``[0, cut)`` on ``batch`` samples, the upload of their activations and
        the download of their gradient."""
        flops = self.costs.flops(0, cut, batch, forward=True, backward=True)
        return self.expected_duration(pid, Request(
            P.TRAIN_BACKWARD, RecordDict(), flops, self.costs.activation_bits(cut, batch),
            bits_down=self.costs.activation_bits(cut, batch, labels=False, down=True)))

    def begin_round(self, cohort: list[int]) -> None:
        """Group the cohort by label mix; pick each client's charged cut."""
        super().begin_round(cohort)
        hist = [self.clients[p].label_histogram for p in cohort]
        self.groups = [[cohort[i] for i in grp] for grp in balanced_groups(hist, self.cfg.s2fl_groups)]
        times = np.array([[self.iteration_time(p, c, self.batch_size_for(p, cohort)) for c in self.candidate_cuts]
                          for p in cohort])
        picks = closest_to_median(times)
        self.charged_cut = {p: self.candidate_cuts[int(i)] for p, i in zip(cohort, picks)}

    def timed_cut(self, pid: int) -> int | None:
        """The candidate cut chosen for ``pid`` this round."""
        return self.charged_cut.get(pid)

    def server_iteration_flops(self, batches: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
                               grads: Mapping[int, torch.Tensor]) -> float:
        """Two forward-and-backward passes of every row: each client's gradient from the current model, then
        the groups' steps on the same rows."""
        return 2.0 * super().server_iteration_flops(batches, grads)

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict[int, torch.Tensor]:
        """Client gradients from the current server-side model, then one step per group, then the group average."""
        grads = {p: activation_gradient(self.server_model, *batches[p], where="server step") for p in sorted(batches)}
        state = {k: v.clone() for k, v in self.server_model.state_dict().items()}
        stepped = {}
        for g, group in enumerate(self.groups):
            members = [p for p in group if p in batches]
            if not members:
                continue
            model, opt = self.group_models[g], self.group_opts[g]
            model.load_state_dict(state)
            x = torch.cat([batches[p][0] for p in members]).detach()
            y = torch.cat([batches[p][1] for p in members])
            step_on_loss(model, opt, nn.functional.cross_entropy(model(x), y), self.cfg.clip_norm)
            self.server_updates += 1
            stepped[g] = {k: v.clone() for k, v in model.state_dict().items()}
        if stepped:
            self.server_model.load_state_dict(self.aggregate_uploads(stepped, lambda g: 1.0))
        return grads
