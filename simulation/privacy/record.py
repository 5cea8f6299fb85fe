"""The server's record of what it received (``privacy-record=true``), for ``sflower attack``.

:class:`ReceivedActivations` is the :class:`~strategies.core.exchange.Exchange`'s
``tap``: for every valid reply it keeps, per client, the last batch of
activations received (decoded as the server used it: what an
honest-but-curious server holds) and, in a U-shaped run (``tails=True``),
every gradient a client's tail returned at ``c2``, in arrival order. At the
end of the run it writes ``RUN_DIR/privacy/received.npz``: ``x-K``
activations ``[B, ...]`` float32, ``y-K`` labels ``[B]`` int64 (prefix splits
only), ``g-K`` the tail gradients ``[N, d]`` float32 (U-shaped only), for
each client K. The matching originals are not the server's: each client
writes them itself as the evaluator's ground truth
(:func:`fl_app.privacy.write_ground_truth`, :func:`fl_app.privacy.append_tail_truth`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import RecordDict

from fl_app import protocol as P
from fl_app.config import RunConfig
from fl_app.errors import ConfigError
from fl_app.privacy import EVALUATOR_DIR, PRIVACY_DIR

#: The server's file of received activations, under ``RUN_DIR/privacy/``.
RECEIVED_FILE = "received.npz"


class ReceivedActivations:
    """What the server received from each client, for the attacks (see the module docstring).

    Args:
        tails: also keep the gradients that U-shaped tails return (``P.GRADIENT`` of a reply).
    """

    def __init__(self, tails: bool = False) -> None:  # noqa: D107
        self.tails = tails
        self.last: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        self.gradients: dict[int, list[np.ndarray]] = {}

    def __call__(self, pid: int, content: RecordDict) -> None:
        """Keep ``content``'s activations ``"x"`` (and labels ``"y"``, where sent) as client ``pid``'s last; with
        ``tails``, append its gradient ``"g"`` (rows flattened) to the client's list."""
        if P.ACTIVATIONS in content:
            x = np.array(P.record_tensor(P.array_of(content, P.ACTIVATIONS), "x").numpy(), dtype=np.float32)
            labels = P.get_array(content, P.LABELS)
            y = None if labels is None else np.array(P.record_tensor(labels, "y").numpy(), dtype=np.int64)
            self.last[int(pid)] = (x, y)
        if self.tails and P.GRADIENT in content:
            g = np.array(P.record_tensor(P.array_of(content, P.GRADIENT), "g").numpy(), dtype=np.float32)
            self.gradients.setdefault(int(pid), []).append(g.reshape(g.shape[0], -1))

    def write(self, run_dir: str | Path) -> Path:
        """Write ``RUN_DIR/privacy/received.npz``; its path."""
        folder = Path(run_dir) / PRIVACY_DIR
        folder.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        for pid, (x, y) in sorted(self.last.items()):
            arrays[f"x-{pid}"] = x
            if y is not None:
                arrays[f"y-{pid}"] = y
        for pid, rows in sorted(self.gradients.items()):
            arrays[f"g-{pid}"] = np.concatenate(rows)
        path = folder / RECEIVED_FILE
        np.savez(path, **arrays)
        return path

    @staticmethod
    def clear_truth(run_dir: str | Path) -> None:
        """Remove a former run's tail records and label audits under ``RUN_DIR/privacy/evaluator/`` (the clients
        add to them): in simulation, where the server and the clients share ``output-dir``."""
        folder = Path(run_dir) / PRIVACY_DIR / EVALUATOR_DIR
        for path in [*folder.glob("tail-*.npys"), *folder.glob("audit-*.jsonl")]:
            path.unlink()


def check_record(cfg: RunConfig) -> None:
    """``privacy-record`` needs ``output-dir`` (the clients write the evaluator's files there).

    Raises:
        ConfigError: ``privacy-record=true`` without ``output-dir`` (one line).
    """
    if cfg.get("privacy-record") and not str(cfg.get("output-dir")):
        raise ConfigError("privacy-record=true needs output-dir=RUN_DIR: the clients write the evaluator's "
                          "ground truth there")


def attach(strategy: Any, recorder: ReceivedActivations) -> None:
    """Make ``recorder`` the tap of ``strategy``'s exchange, also after a checkpoint restores the exchange
    (resume, ``node-loss=rollback``: the restored exchange is a new object, and the tap is never saved)."""
    strategy.exchange.tap = recorder
    load = strategy.checkpoints.load_state

    def load_then_tap(state: dict[str, Any]) -> None:
        load(state)
        strategy.exchange.tap = recorder

    strategy.checkpoints.load_state = load_then_tap
