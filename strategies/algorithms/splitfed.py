"""Synchronous SFL baselines: SplitFed-V1/V2, MiniBatch-SFL and vanilla SL (docs/explanation/design.md §7)."""

from __future__ import annotations

import torch

from fl_app import protocol as P
from fl_app.run.options import Option
from fl_app.models import BlockModel
from strategies.core.aggregation import AGGREGATION_OPTION
from strategies.core.registry import register
from strategies.core.server_step import server_step, server_steps
from strategies.core.split import CLIENT_OPTIMIZER_OPTION, SERVER_OPTIMIZER_OPTION, ZO_OPTIONS, SyncSplitStrategy, copy_model


@register
class SplitFedV1(SyncSplitStrategy):
    """SplitFed-V1 (Thapa et al. 2022): a server-side model copy per client.

    Each cohort member trains its own copy of the server-side model on its
    activations; at the end of the round the copies are averaged (weights
    ``|D_k|``), as are the client-side models: both through
    :meth:`~strategies.core.aggregation.ModelAggregation.aggregate_models`.

    ``client-optimizer=zo server-optimizer=zo`` is ZO-SplitFed, MU-SplitFed's
    baseline as its §5 defines it ("we modify both vanilla SplitFed and GAS to
    use ZO optimization"): ZO clients, and one ZO-SGD step (eq. 5) of each
    server copy per exchange, i.e. ``mu-splitfed server-steps=1``.
    ``client-optimizer=zo`` alone keeps a first-order server.
    """

    name = "splitfed-v1"
    ushaped_refusal = ""
    hides_client_models = True  # strategies.core.hidden
    options = (AGGREGATION_OPTION, CLIENT_OPTIMIZER_OPTION, SERVER_OPTIMIZER_OPTION, *ZO_OPTIONS)

    def begin_round(self, cohort: list[int]) -> None:
        """Give each cohort member a copy of the server-side model and, first-order, a fresh optimizer."""
        self.copies: dict[int, BlockModel] = {pid: copy_model(self.server_model) for pid in cohort}
        self.copy_opts = {} if self.server_zo else {pid: self.server_optimizer(m) for pid, m in self.copies.items()}

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict[int, torch.Tensor]:
        """One step of each client's server copy on its own batch.

        With ZO clients, each gets the loss differences of its perturbed pairs
        under its updated copy instead of the gradient; with a ZO server the
        copy's step is ZO-SGD (eq. 5).
        """
        if self.server_zo:
            grads = {}
            for pid in sorted(batches):
                x, y = batches[pid]
                self.zo_server_update(self.copies[pid], x, y, pid)
                grads[pid] = self.feedback(self.copies[pid], y, None, pid)
            return grads
        labels = {pid: y for pid, (_, y) in batches.items()}
        grads = server_steps({pid: (self.copies[pid], self.copy_opts[pid], x) for pid, (x, _) in batches.items()},
                             lambda outputs: self.client_losses(outputs, labels), self.cfg.clip_norm)
        self.server_updates += len(grads)
        return {pid: self.feedback(self.copies[pid], labels[pid], g, pid) for pid, g in grads.items()}

    def end_round(self, cohort: list[int]) -> None:
        """Aggregate the server copies of the clients that finished the round (:meth:`aggregate_models`)."""
        if cohort:
            states = {p: self.copies[p].state_dict() for p in cohort}
            self.server_model.load_state_dict(self.aggregate_uploads(states))
        self.copies, self.copy_opts = {}, {}


@register
class MiniBatchSFL(SyncSplitStrategy):
    """MiniBatch-SFL (Huang et al. 2023): one server step on the cohort's concatenated activations.

    Client ``k``'s batch is ``B·C·|D_k| / Σ_{cohort}|D|`` (at least 1), so the
    concatenated batch holds about ``B·C`` samples (GAS's baseline code).
    The loss is the mean over the concatenated batch; each client receives
    the gradient of that loss scaled by ``ΣB / B_k``, i.e. the gradient of
    its own mean loss, so a client's step size does not shrink with the
    cohort size. Client-side models are averaged with weights ``|D_k|``.
    """

    name = "minibatch-sfl"
    ushaped_refusal = ""
    hides_client_models = True  # strategies.core.hidden
    options = (AGGREGATION_OPTION,)

    def initialize(self) -> None:
        """One server-side model with a persistent optimizer."""
        super().initialize()
        self.server_opt = self.server_optimizer(self.server_model)

    def batch_size_for(self, pid: int, cohort: list[int]) -> int:
        """``B·C·|D_k| / Σ_cohort |D|``, clipped to ``[1, |D_k|]``."""
        total = sum(self.clients[p].num_examples for p in cohort)
        n_k = self.clients[pid].num_examples
        share = round(self.cfg.batch_size * len(cohort) * n_k / total)
        return int(min(max(share, 1), n_k))

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict[int, torch.Tensor]:
        """One step on ``concat(activations)``; split the gradient back per client."""
        pids = sorted(batches)
        x = torch.cat([batches[p][0] for p in pids])
        y = None if self.cuts else torch.cat([batches[p][1] for p in pids])
        grad, _ = server_step(self.server_model, self.server_opt, x, y, self.cfg.clip_norm,
                              self.batch_loss(pids, [batches[p][0].shape[0] for p in pids]))
        self.server_updates += 1
        out, start = {}, 0
        for p in pids:
            b = batches[p][0].shape[0]
            out[p] = grad[start:start + b] * (x.shape[0] / b)
            start += b
        return out


@register
class SplitFedV2(SyncSplitStrategy):
    """SplitFed-V2 (Thapa et al. 2022): one server-side model, updated by the cohort's clients in turn."""

    name = "splitfed-v2"
    ushaped_refusal = ""
    hides_client_models = True  # strategies.core.hidden
    options = (AGGREGATION_OPTION,)

    def initialize(self) -> None:
        """One server-side model with a persistent optimizer."""
        super().initialize()
        self.server_opt = self.server_optimizer(self.server_model)

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict[int, torch.Tensor]:
        """One server step per client, in partition order, each on the updated model."""
        grads: dict[int, torch.Tensor] = {}
        for pid in sorted(batches):
            x, y = batches[pid]
            got = server_steps({pid: (self.server_model, self.server_opt, x)},
                               lambda outputs: self.client_losses(outputs, {pid: y}), self.cfg.clip_norm)
            grads.update(got)
            self.server_updates += len(got)
        return grads


@register
class VanillaSL(SplitFedV2):
    """Vanilla split learning (Gupta & Raskar 2018): the cohort's clients train in turn.

    One client-side model passes from client to client, against one
    server-side model. ``sl-order`` says when it moves on:

    * ``client`` (default): each client runs its E local iterations from the
      previous client's client-side model; a global iteration is one pass over
      the cohort (``concurrency`` clients, in selection order), so its virtual
      time is the sum of theirs.
    * ``batch``: the RingSFL authors' baseline (docs/explanation/design.md §7): the model
      moves to the next client after every batch, round-robin over the cohort
      in partition order, continuing where the previous global iteration
      stopped. A global iteration is E batches in all, the paper's
      ``local_epoch × batch_num`` steps of SL per round (RingSFL, footnote 2).
      Each batch is a forward with the current client-side model, one server
      step, and a backward whose reply returns the client-side model. With
      ``local-epochs=N``, a global iteration is ``N·⌊|D_k|/B⌋`` batches in all
      (the most over the cohort), as RingSFL §6 counts it: "when vanilla SL
      updates local_epoch_num × batch_num steps, we treat it as a round", where
      batch_num is one client's batches per epoch (the authors' ``vanilla_sl.py``
      takes ``len(trainloaders[0])``). A round of SL thus sees 1/K of the
      cohort's data, the same number of steps as a RingSFL round.
    """

    name = "vanilla-sl"
    options = (Option("sl-order", "client", "vanilla SL: the client-side model moves to the next client after "
                      "its E local iterations (client) or after every batch, round-robin (batch; RingSFL's baseline)",
                      ("client", "batch")),)

    def initialize(self) -> None:
        """The split model, the server optimizer, and the round-robin position (``sl-order=batch``)."""
        super().initialize()
        self.turn = 0

    def run_round(self, cohort: list[int]) -> None:
        """``client``: one SplitFed-V2 round per client, in selection order; ``batch``: E batches, round-robin."""
        if self.cfg.sl_order == "client":
            for pid in cohort:
                super().run_round([pid])
            return
        order = sorted(cohort)
        for _ in range(self.cohort_steps(order)):
            pid = order[self.turn % len(order)]
            self.turn += 1
            replies = self.gather({pid: self.forward_request(self.cfg.batch_size, self.round_start([pid]))})
            if pid not in replies:
                continue  # the client failed and is excluded; the model stays where it was
            grads = self.serve({pid: self.smashed_of(pid, replies[pid])})
            if pid not in grads:
                continue  # its tail failed (U-shaped): excluded
            replies = self.gather({pid: self.backward_request(grads[pid], P.NEXT_WEIGHTS)})
            self.collect_client_models(self.with_tails({p: self.weights_of(c)[0] for p, c in replies.items()}))
