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
``1[y_i = c]`` (``sklearn.metrics.roc_auc_score``, over the classes present
with both outcomes). Direction scoring has a score per class (against one
known example of ``c``, the first one recorded, which is then left out): its
AUC is the mean over the classes (macro one-vs-rest). Norm scoring has one
score for every class, so it bets on one: the class with the largest norms,
as Li et al.'s attacker bets on the rarer class. Its AUC is the largest
one-vs-rest AUC over the classes (in the binary case ``max(AUC, 1 - AUC)``):
the best bet, an upper bound on what an attacker who must guess the class
gets. (A mean over the classes of one shared score is 0.5 by construction
with two classes and near it with more: sflower reported that until
2026-11-28, as "norm scoring is at chance".) 0.5 is chance; 1 reads every
label.

The measurement (:class:`TailGradients`) wraps the ClientApp of an in-process
run and keeps every tail reply's gradient exactly as sent, with the labels of
the client's batch as ground truth (which the server does not have).
:func:`measure` runs a configuration and returns both AUCs. After a run with
``privacy-record=true`` (any engine), :func:`attack_run` scores the gradients
its server recorded (``RUN_DIR/privacy/received.npz``) against the clients'
own record of what they sent and of their labels
(``RUN_DIR/privacy/evaluator/tail-K.npys``); ``sflower attack`` calls it on
U-shaped runs and writes ``RUN_DIR/privacy/labels.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import json
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message

from fl_app import protocol as P
from fl_app.client.state import slot_key
from fl_app.run.errors import ConfigError
from fl_app.privacy.activations import PRIVACY_DIR, read_tail_truth, tail_truth_path
from fl_app.run.config import RunConfig
from fl_app.run.untrusted import read_json_table, read_npz, run_dir_config

#: The label attack's result file, under ``RUN_DIR/privacy/``.
LABELS_JSON = "labels.json"


def norm_scores(grads: np.ndarray) -> np.ndarray:
    """``‖g_i‖₂`` of each row of ``grads`` ``[N, d]`` (Li et al. 2022, norm scoring)."""
    return np.linalg.norm(grads, axis=1)


def direction_scores(grads: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``cos(g_i, reference)`` of each row of ``grads`` ``[N, d]`` (Li et al. 2022, direction scoring);
    0 for a zero row."""
    norms = np.linalg.norm(grads, axis=1) * np.linalg.norm(reference)
    dots = grads @ reference
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def one_vs_rest_auc(scores: Callable[[int], tuple[np.ndarray, np.ndarray]], classes: list[int],
                    reduce: Callable[[list[float]], float] = np.mean) -> float:
    """``reduce`` (the mean, or ``max``) over ``classes`` of ``roc_auc_score(is_c, s)``, ``(is_c, s) =
    scores(c)``; classes whose ``is_c`` is all one value are skipped (NaN if none is left)."""
    from sklearn.metrics import roc_auc_score

    aucs = []
    for c in classes:
        truth, s = scores(c)
        if 0 < truth.sum() < truth.size:
            aucs.append(roc_auc_score(truth, s))
    return float(reduce(aucs)) if aucs else float("nan")


@dataclass(frozen=True)
class LeakageAUC:
    """Attack AUCs, one-vs-rest (see the module docstring).

    Attributes:
        norm: norm scoring, the best class's AUC.
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
    norm = one_vs_rest_auc(lambda c: (labels == c, norms), classes, reduce=max)  # the best class to bet on

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


def attack_run(run_dir: str | Path, received: np.lib.npyio.NpzFile | None = None) -> dict:
    """Norm and direction scoring of every tail gradient a U-shaped run's server recorded; writes
    ``RUN_DIR/privacy/labels.json`` and returns its content.

    The server's rows of client K (``g-K`` of ``received.npz``, in arrival order) are scored only where they
    are what the client sent (:func:`fl_app.privacy.activations.read_tail_truth` of ``tail-K.npys``: equal shape and values, within 1e-6 relative, or
    within 10 % of the largest entry when ``compress-up`` is lossy), with that file's labels as the truth.

    Args:
        run_dir: a run made with ``privacy-record=true`` and ``cut-layers``.
        received: the server's record, if already open.

    Returns:
        ``{"norm_auc", "direction_auc", "samples", "clients", "unmatched_clients", "label_defence", "label_noise",
        "label_power", "label_defence_tail"}``.

    Raises:
        ConfigError: no recorded tail gradient, or none that matches a client's record, or a
            ``config.json`` that no longer resolves (one line).
    """
    from simulation.privacy.record import RECEIVED_FILE

    run_dir = Path(run_dir)
    config = read_json_table(run_dir / "config.json").get("config")
    if not isinstance(config, dict):
        raise ConfigError(f"{run_dir / 'config.json'}: no run configuration")
    cfg = RunConfig.from_mapping(run_dir_config(config, str(run_dir / "config.json")))
    if received is None:
        path = run_dir / PRIVACY_DIR / RECEIVED_FILE
        if not path.is_file():
            raise ConfigError(f"{run_dir}: no {PRIVACY_DIR}/{RECEIVED_FILE} (run with privacy-record=true)")
        received = read_npz(path)
    lossless = cfg.lossless_up
    grads, labels, pids, unmatched = [], [], [], []
    for name in sorted((n for n in received.files if n.startswith("g-")), key=lambda n: (len(n), n)):
        pid, got = int(name[2:]), received[name]
        truth = tail_truth_path(run_dir, pid)
        sent_g, sent_y = read_tail_truth(truth) if truth.is_file() else (None, None)
        scale = float(np.abs(got).max() or 1.0)
        tol = 1e-6 * scale if lossless else 0.1 * scale
        if sent_g is None or sent_g.shape != got.shape or float(np.abs(sent_g - got).max()) > tol:
            unmatched.append(pid)
            continue
        pids.append(pid)
        grads.append(got)
        labels.append(sent_y)
    if not pids:
        raise ConfigError(f"{run_dir}: no recorded tail gradient matches a client's record (a U-shaped run with "
                          "privacy-record=true and output-dir=RUN_DIR records them)")
    auc = leakage_auc(np.concatenate(grads), np.concatenate(labels))
    result = {"norm_auc": auc.norm, "direction_auc": auc.direction, "samples": auc.samples, "clients": pids,
              "unmatched_clients": unmatched, "label_defence": cfg.label_defence,
              "label_noise": float(cfg.label_noise), "label_power": float(cfg.label_power),
              "label_defence_tail": cfg.label_defence_tail}
    (run_dir / PRIVACY_DIR / LABELS_JSON).write_text(json.dumps(result, indent=2) + "\n")
    return result
