"""Label inference from the gradients a U-shaped client returns: norm and direction scoring, as a measurement.

In a label-private (U-shaped) split, ``cut-layers=c1,c2``, a client's tail
replies to the server with the gradient of its mean loss w.r.t. the middle's
output at ``c2``: one row per sample, ``g_i = (1/B) ∂ℓ(f(z_i), y_i)/∂z_i``
(the rows are independent when the tail mixes no samples, as without
BatchNorm). Li et al., "Label Leakage and Protection in Two-party Split
Learning" (ICLR 2022), show that a server can read the labels off them:

* **norm scoring**: ``s_i = ‖g_i‖``; with imbalanced classes the rarer class
  has the larger gradients;
* **direction (cosine) scoring**: ``s_i = cos(g_i, g_ref)`` with ``g_ref`` the
  gradient of one example whose label the server knows: examples of its
  class point the same way.

Both papers' attacks are binary. For ``K`` classes this module scores one
against the rest: for each class ``c``, the AUC of the score against
``1[y_i = c]`` (direction: against one known example of ``c``, the first one
recorded, which is then left out), averaged over the classes present with
both outcomes (macro one-vs-rest; ``sklearn.metrics.roc_auc_score`` per
class). 0.5 is chance; 1 reads every label.

The measurement (:class:`TailGradients`) wraps the ClientApp of an in-process
run and keeps every tail reply's gradient exactly as sent, with the labels of
the client's batch as ground truth (which the server does not have).
:func:`measure` runs a configuration and returns both AUCs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.app import ConfigRecord, Context, Message

from fl_app import protocol as P
from fl_app.client.state import slot_key
from fl_app.config import RunConfig


def norm_scores(grads: np.ndarray) -> np.ndarray:
    """``‖g_i‖₂`` of each row of ``grads`` ``[N, d]`` (Li et al. 2022, norm scoring)."""
    return np.linalg.norm(grads, axis=1)


def direction_scores(grads: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``cos(g_i, reference)`` of each row of ``grads`` ``[N, d]`` (Li et al. 2022, direction scoring);
    0 for a zero row."""
    norms = np.linalg.norm(grads, axis=1) * np.linalg.norm(reference)
    dots = grads @ reference
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def one_vs_rest_auc(scores: Callable[[int], tuple[np.ndarray, np.ndarray]], classes: list[int]) -> float:
    """The mean over ``classes`` of ``roc_auc_score(is_c, s)``, ``(is_c, s) = scores(c)``; classes whose
    ``is_c`` is all one value are skipped (NaN if none is left)."""
    from sklearn.metrics import roc_auc_score

    aucs = []
    for c in classes:
        truth, s = scores(c)
        if 0 < truth.sum() < truth.size:
            aucs.append(roc_auc_score(truth, s))
    return float(np.mean(aucs)) if aucs else float("nan")


@dataclass(frozen=True)
class LeakageAUC:
    """Attack AUCs, one-vs-rest, macro over classes (see the module docstring).

    Attributes:
        norm: norm scoring.
        direction: direction scoring against one known example per class.
        samples: gradient rows scored.
    """

    norm: float
    direction: float
    samples: int


def leakage_auc(grads: np.ndarray, labels: np.ndarray) -> LeakageAUC:
    """Both attacks on gradient rows ``grads`` ``[N, d]`` with true labels ``labels`` int ``[N]``."""
    grads = grads.reshape(grads.shape[0], -1).astype(np.float64)
    classes = sorted(int(c) for c in np.unique(labels))
    norms = norm_scores(grads)
    norm = one_vs_rest_auc(lambda c: (labels == c, norms), classes)

    def direction(c: int) -> tuple[np.ndarray, np.ndarray]:
        ref = int(np.flatnonzero(labels == c)[0])  # the one example of c the server knows
        keep = np.arange(labels.size) != ref
        return labels[keep] == c, direction_scores(grads[keep], grads[ref])

    return LeakageAUC(norm, one_vs_rest_auc(direction, classes), int(labels.size))


class TailGradients:
    """A ClientApp wrapper that records every U-shaped tail reply's gradient (as sent) with its batch's labels.

    Args:
        app: the ClientApp (``(message, context) -> reply``).
        labels_of: the training labels of dataset indices (``int64 [N]`` of ``int [N]``): the ground truth.
    """

    def __init__(self, app: Callable[[Message, Context], Message], labels_of: Callable[[np.ndarray], np.ndarray]):
        self.app, self.labels_of = app, labels_of
        self.grads: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []

    def __call__(self, msg: Message, context: Context) -> Message:
        reply = self.app(msg, context)
        config = msg.content.get(P.CONFIG) if msg.metadata.message_type == P.TRAIN_FORWARD else None
        if reply.has_error() or config is None or not config.get("label-slot") or not config.get("loss"):
            return reply
        grad = P.record_tensor(P.array_of(reply.content, P.GRADIENT), "g").numpy()
        batch = context.state[slot_key(str(config["label-slot"]), "batch")]
        assert isinstance(batch, ConfigRecord)
        self.grads.append(grad.reshape(grad.shape[0], -1))
        self.labels.append(self.labels_of(np.asarray(list(batch["indices"]), dtype=np.int64)))
        return reply

    def auc(self) -> LeakageAUC:
        """:func:`leakage_auc` of everything recorded."""
        return leakage_auc(np.concatenate(self.grads), np.concatenate(self.labels))


def measure(cfg: RunConfig) -> LeakageAUC:
    """Run ``cfg`` (a U-shaped configuration) in-process and attack every gradient its clients returned.

    Raises:
        ConfigError: ``cfg`` is not U-shaped (``cut-layers`` empty), or any check of ``plan_run``.
    """
    from fl_app.client_app import app
    from fl_app.errors import ConfigError
    from fl_app.task import load_task
    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run

    if not cfg.get("cut-layers"):
        raise ConfigError("label inference needs a U-shaped run (cut-layers=c1,c2): in a prefix split the "
                          "server holds the labels already")
    y = load_task(cfg).data.y_train.numpy()
    recorder = TailGradients(app, lambda idx: y[idx])
    run_inprocess(plan_run(cfg), progress=False, client_app=recorder)
    return recorder.auc()
