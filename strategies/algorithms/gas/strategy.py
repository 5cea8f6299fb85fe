"""GAS: generative activation-aided asynchronous split federated learning.

Source: the GAS paper (Yang & Liu, AAAI 2025); docs/explanation/design.md
§7 fixes the choices the paper leaves open.

* ``C = concurrency`` clients train at once, each for ``E`` local
  iterations from the current client-side model, then upload it.
* Every arriving activation batch ``A_k`` gets ``G_k = ∇_A l_k(w_s; A_k, Y_k)``
  from the **current** server-side model under client k's logit-adjusted
  loss (eq. 6) at once, and goes into the activation buffer.
* A full activation buffer (``Q_s·B`` activations) updates the per-label
  Gaussians (eqs. 11–12), tops the buffer up with generated activations so
  that every label has at least ``B`` samples, and makes one server step on
  the concatenation with plain cross-entropy (eq. 5).
* A full model buffer (``Q_c`` client models) is averaged with weights
  ``|D_k|`` (eq. 10) into the current client-side model: one global
  iteration. Then a new client is drawn uniformly from the idle ones.

With ``generate=false`` this is the paper's plain asynchronous SFL
framework (the ablation without generated activations).

``client-optimizer=zo server-optimizer=zo`` is ZO-GAS, MU-SplitFed's
baseline as its §5 defines it: ZO clients (loss differences under the
current server model and eq. 6's loss), and a ZO-SGD server step (eq. 5 of
MU-SplitFed) on the buffer plus generated activations. ``client-optimizer=zo``
alone keeps the first-order server step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from fl_app import protocol as P
from fl_app.learning.task import Task, seeded_generator
from fl_app.run.config import RunConfig
from fl_app.run.options import Option
from strategies.core.aggregation import AGGREGATION_OPTION
from strategies.core.loops import AsyncStrategy
from strategies.core.dispatcher import Reply
from strategies.algorithms.gas.metrics import gradient_dissimilarity, reference_batch
from strategies.algorithms.gas.progress import PROGRESS_OPTION, TrainingProgress
from strategies.algorithms.gas.generation import LabelGaussians, generation_flops
from strategies.core.registry import register
from strategies.algorithms.gas.shared_momentum import CLIENT_MOMENTUM_OPTION, SharedMomentum, check_shared_momentum
from strategies.core.server_step import activation_gradient, server_step
from strategies.core.split import CLIENT_OPTIMIZER_OPTION, SERVER_OPTIMIZER_OPTION, ZO_OPTIONS, SplitMixin

STREAM_GENERATION = 13


def logit_adjusted_loss(logits: torch.Tensor, labels: torch.Tensor, label_prior: torch.Tensor) -> torch.Tensor:
    """GAS eq. 6: cross-entropy on ``logits + log(P_k(y) + 1e-12)``.

    Args:
        logits: ``[B, M]`` server-side outputs.
        labels: int64 ``[B]``.
        label_prior: ``[M]`` client k's label distribution ``P_k`` (sums to 1).

    Returns:
        the mean loss over the batch (scalar).
    """
    return nn.functional.cross_entropy(logits + torch.log(label_prior + 1e-12).to(logits.dtype), labels)


def _client_loss(logits: torch.Tensor, labels: torch.Tensor, label_prior: torch.Tensor | None) -> torch.Tensor:
    """Client k's loss: eq. 6's logit-adjusted loss, or plain cross-entropy with ``label_prior=None``."""
    if label_prior is None:
        return nn.functional.cross_entropy(logits, labels)
    return logit_adjusted_loss(logits, labels, label_prior)


def top_up(gaussians: LabelGaussians, x: torch.Tensor, y: torch.Tensor, batch: int, generator: torch.Generator,
           move: Callable[[torch.Tensor], torch.Tensor], progress: torch.Tensor | None = None,
           ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Fold a flushed buffer ``(x, y)`` into the per-label Gaussians (eqs. 11-12), then append generated
    activations so that every label has at least ``batch`` samples (none before the statistics are ready).

    ``progress``: each activation's training progress n(A), int64 ``[N]`` (None: the flush counter, see
    :meth:`~strategies.algorithms.gas.generation.LabelGaussians.update`). The statistics and their draws stay on the CPU
    (float64, exact); ``move`` takes the generated batch to the server's device. Returns the new
    ``(x, y)`` and how many activations were generated.
    """
    gaussians.update(x.reshape(x.shape[0], -1), y, progress=progress)
    if not gaussians.ready():
        return x, y, 0
    gx, gy = gaussians.generate(y, batch, generator)
    if not gy.numel():
        return x, y, 0
    gx, gy = move(gx), move(gy)
    return torch.cat([x, gx.reshape(-1, *x.shape[1:])]), torch.cat([y, gy]), int(gy.numel())


#: GAS's run-config keys (its class's ``options``).
GAS_OPTIONS = (
    Option("generate", True, "generated activations on/off (off: the plain async SFL framework)"),
    Option("covariance", "full", "per-label Gaussians: full or diagonal covariance", ("full", "diagonal"),
           source="GAS eqs. 11-12"),
    Option("buffer-activations", 0, "activation buffer Q_s, in batches (0 = concurrency)", at_least=0,
           source="GAS Algorithm 1"),
    Option("buffer-models", 0, "model buffer Q_c (0 = concurrency)", at_least=0, source="GAS Algorithm 1"),
    Option("weighting", "linear", "progress weight s(n) of eqs. 11-12", ("linear", "exponential", "polynomial"),
           source="GAS eqs. 11-12"),
    PROGRESS_OPTION,
    Option("logit-adjust", True, "eq. 6 logit-adjusted loss for G_k", source="GAS eq. 6"),
    Option("dissimilarity-every", 0, "record Fig. 2's gradient dissimilarity every N server updates (0 = off)",
           at_least=0, source="GAS Fig. 2"),
    CLIENT_MOMENTUM_OPTION,
    AGGREGATION_OPTION,
    CLIENT_OPTIMIZER_OPTION,
    SERVER_OPTIMIZER_OPTION,
    *ZO_OPTIONS,
)


@register
class GAS(SplitMixin, AsyncStrategy):
    """GAS (AAAI 2025): asynchronous SFL with activation and model buffers and generated activations."""

    name = "gas"
    ushaped_refusal = ("its server keeps an activation distribution per label and generates labelled activations "
                       "to update the server-side model (GAS, Generative Activation-Aided Updates)")
    run_with = "preset=gas-reference (the authors' code: their AlexNet, PyTorch's init, one shared client momentum)"
    options = GAS_OPTIONS

    def initialize(self) -> None:
        """Server model, optimiser, buffers, per-label Gaussians."""
        super().initialize()
        c = self.cfg
        self.server_opt = None if self.server_zo else self.server_optimizer(self.server_model)
        self.q_s = c.buffer_activations or c.concurrency
        self.q_c = c.buffer_models or c.concurrency
        #: ``(A_k, Y_k, n(A_k))`` per buffered batch (n: :class:`~strategies.algorithms.gas.progress.TrainingProgress`)
        self.activation_buffer: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self.model_buffer: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.progress_of: dict[int, int] = {}
        self.training_progress = TrainingProgress(c.progress)  # n(A) of each activation
        shape = self.task.profiles[self.cut - 1].output_shape
        self.activation_shape = tuple(shape)
        self.gaussians = (LabelGaussians(self.task.data.num_classes, math.prod(shape), c.covariance,
                                         1e-5, c.weighting) if c.generate else None)
        self.generator = seeded_generator(c.seed, STREAM_GENERATION)
        self.generated_total, self.client_iterations = 0, 0
        self.last_dissimilarity = float("nan")
        #: ``client-momentum=shared``: the authors' one client optimizer (:mod:`strategies.algorithms.gas.shared_momentum`)
        self.shared_momentum = SharedMomentum(c.momentum, self.device) if c.client_momentum == "shared" else None

    @classmethod
    def check_config(cls, cfg: RunConfig, task: Task) -> None:
        """See :func:`~strategies.algorithms.gas.shared_momentum.check_shared_momentum` (raises ConfigError)."""
        super().check_config(cfg, task)
        check_shared_momentum(cfg)

    def label_prior(self, pid: int) -> torch.Tensor | None:
        """``P_k`` from the handshake histogram, or None with logit adjustment off."""
        if not self.cfg.logit_adjust:
            return None
        hist = torch.as_tensor(self.clients[pid].label_histogram, dtype=torch.float32)
        return self.on_device(hist / hist.sum())

    # ------------------------------------------------------------------ events
    def launch(self, pid: int) -> None:
        """Start a local round of E iterations from the current client-side model."""
        self.progress_of[pid] = 0
        self.training_progress.launch(pid, self.global_iteration)
        self.send(pid, self.forward_request(self.cfg.batch_size, P.state_record(self.client_model.state_dict())))

    def on_reply(self, reply: Reply) -> None:
        """Activations: answer with G_k and buffer them. Weights: model buffer."""
        returned = P.get_array(reply.content, P.OPTIMIZER)
        if returned is not None and self.shared_momentum is not None:
            self.shared_momentum.fold(reply.pid, returned)
        if P.get_array(reply.content, P.ACTIVATIONS) is not None:
            self.on_activations(reply.pid, *self.smashed_of(reply.pid, reply.content))
        elif P.get_array(reply.content, P.WEIGHTS) is not None:
            self.on_upload(reply.pid, *self.weights_of(reply.content))
            self.refill()

    def on_activations(self, pid: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Return ``G_k`` from the current server-side model; buffer ``(A_k, Y_k)``.

        With ZO clients (ZO-GAS) the client instead gets the loss differences
        of its perturbed pairs under the same model and loss (eq. 6).
        """
        prior = self.label_prior(pid)
        loss_fn = lambda logits, labels: _client_loss(logits, labels, prior)  # noqa: E731
        if self.client_zo:
            grad = self.feedback(self.server_model, y, None, pid, loss_fn)
        else:
            grad = activation_gradient(self.server_model, x, y, loss_fn)
            self.charge_server(self.server_flops(x.shape[0]))  # G_k: a forward and a backward, before it is sent
        self.progress_of[pid] += 1
        self.client_iterations += 1
        progress = self.training_progress.activation(pid, self.progress_of[pid], self.local_steps(pid))
        done = self.progress_of[pid] >= self.local_steps(pid)
        nxt = P.NEXT_WEIGHTS if done else P.NEXT_FORWARD
        request = self.backward_request(grad, nxt, self.cfg.batch_size)
        if self.shared_momentum is not None:  # the buffer goes down, and comes back up
            request = self.shared_momentum.attach(pid, request, self.costs.param_bits(0, self.cut, encoded=False))
        self.send(pid, request)
        self.activation_buffer.append((x, y, progress))
        if sum(int(b[1].numel()) for b in self.activation_buffer) >= self.q_s * self.cfg.batch_size:
            self.flush_activations()

    def flush_activations(self) -> None:
        """Update the Gaussians, top up with generated activations, one server step (eq. 5; ZO-SGD with a ZO server);
        the generation and the step are charged as server compute (``server-speed``)."""
        x = torch.cat([b[0] for b in self.activation_buffer])
        y = torch.cat([b[1] for b in self.activation_buffer])
        progress = self.training_progress.flushed([(int(b[1].numel()), b[2]) for b in self.activation_buffer])
        self.activation_buffer = []
        if self.gaussians is not None:
            folded = int(y.numel())
            x, y, generated = top_up(self.gaussians, x, y, self.cfg.batch_size, self.generator, self.on_device,
                                     progress)
            self.generated_total += generated
            self.charge_server(generation_flops(self.gaussians.dim, self.cfg.covariance, folded, generated))
        every = self.cfg.dissimilarity_every
        if every and self.server_updates % every == 0:
            self.last_dissimilarity = self.gradient_dissimilarity(x, y)
        if self.server_zo:
            self.zo_server_update(self.server_model, x, y, 0)
            return
        server_step(self.server_model, self.server_opt, x, y, self.cfg.clip_norm, input_grad=False)
        self.server_updates += 1
        self.charge_server(self.server_flops(x.shape[0]))

    def on_upload(self, pid: int, state: dict[str, torch.Tensor], num_examples: int) -> None:
        """Model buffer; a full buffer is averaged (eq. 10) into the current client model."""
        self.model_buffer.append((pid, state))
        if len(self.model_buffer) >= self.q_c:
            self.client_model.load_state_dict(self.aggregate_uploads(self.model_buffer))
            self.model_buffer = []
            self.training_progress.aggregated()
            self.end_global_iteration()

    def on_failure(self, partition_id: int, action: str, reason: str) -> None:
        """Drop the failed client's local round (and the momentum it was sent)."""
        self.progress_of.pop(partition_id, None)
        self.training_progress.forget(partition_id)
        if self.shared_momentum is not None:
            self.shared_momentum.forget(partition_id)

    # ------------------------------------------------------------------ metrics
    def gradient_dissimilarity(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """GAS Fig. 2 on the buffer ``(x, y)`` (:func:`strategies.algorithms.gas.metrics.gradient_dissimilarity`)."""
        if not hasattr(self, "_reference"):
            self._reference = reference_batch(self.task.data, self.cfg.seed)
        rx, ry = (self.on_device(t) for t in self._reference)
        return gradient_dissimilarity(self.server_model, self.client_model, x, y, rx, ry)

    def extra_metrics(self) -> dict[str, float]:
        """Generated activations so far and the last gradient dissimilarity."""
        out = {"generated_activations": float(self.generated_total),
               "client_iterations": float(self.client_iterations)}
        if self.cfg.dissimilarity_every:
            out["grad_dissimilarity"] = self.last_dissimilarity
        return out

