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
(:func:`fl_app.privacy.activations.write_ground_truth`, :func:`fl_app.privacy.activations.append_tail_truth`).

In a U-shaped run it also writes what else the server legitimately holds of
the tails (``RUN_DIR/privacy/tails.safetensors``, :data:`TAILS_FILE`: its
tensors, with a JSON index of the events in the file's metadata; no pickle; read by
:func:`read_tail_events`): per client, in order, the events of its tail as
the server saw them: ``{"kind": "sent", "weights"}`` (the tail's start
weights the server sent with a tail request), ``{"kind": "forward", "z",
"g", "config"}`` (the middle's output ``z`` ``[B, ...]`` the server computed
and sent, the gradient ``g`` ``[B, d]`` it got back, the request's
:class:`~fl_app.protocol.ForwardConfig` as a dict: the tail's optimiser) and
``{"kind": "uploaded", "weights"}`` (the tail a client returned at the end
of a round). The attacks of :mod:`simulation.privacy.strongest` read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import RecordDict

from fl_app import protocol as P
from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError
from fl_app.privacy.activations import EVALUATOR_DIR, PRIVACY_DIR

#: The server's file of received activations, under ``RUN_DIR/privacy/``.
RECEIVED_FILE = "received.npz"
#: The server's record of the U-shaped tails (weights sent and received, ``z`` sent, ``g`` received).
TAILS_FILE = "tails.safetensors"


class ReceivedActivations:
    """What the server received from each client, for the attacks (see the module docstring).

    Args:
        tails: also keep the gradients that U-shaped tails return (``P.GRADIENT`` of a reply).
    """

    def __init__(self, tails: bool = False) -> None:  # noqa: D107
        self.tails = tails
        self.last: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        self.gradients: dict[int, list[np.ndarray]] = {}
        self.tail_events: dict[int, list[dict[str, Any]]] = {}

    def __call__(self, pid: int, content: RecordDict, request: Any = None) -> None:
        """Keep ``content``'s activations ``"x"`` (and labels ``"y"``, where sent) as client ``pid``'s last; with
        ``tails``, append its gradient ``"g"`` (rows flattened) to the client's list, and, given the
        ``request`` (a :class:`~strategies.core.dispatcher.Request`) the reply answers, the tail's events
        (see the module docstring)."""
        if self.tails and request is not None:
            self._tail_event(int(pid), content, request)
        if P.ACTIVATIONS in content:
            x = np.array(P.record_tensor(P.array_of(content, P.ACTIVATIONS), "x").numpy(), dtype=np.float32)
            labels = P.get_array(content, P.LABELS)
            y = None if labels is None else np.array(P.record_tensor(labels, "y").numpy(), dtype=np.int64)
            self.last[int(pid)] = (x, y)
        if self.tails and P.GRADIENT in content:
            g = np.array(P.record_tensor(P.array_of(content, P.GRADIENT), "g").numpy(), dtype=np.float32)
            self.gradients.setdefault(int(pid), []).append(g.reshape(g.shape[0], -1))

    def _tail_event(self, pid: int, content: RecordDict, request: Any) -> None:
        """Append the tail's events of one reply and its request to :attr:`tail_events`."""
        import torch

        config = P.get_config(request.content, P.CONFIG)
        if config is None or config.get("slot") != P.TAIL_SLOT:
            return
        events = self.tail_events.setdefault(pid, [])
        if request.action == P.TRAIN_FORWARD and config.get("loss") and P.GRADIENT in content:
            sent = P.get_array(request.content, P.WEIGHTS)
            if sent is not None:
                events.append({"kind": "sent", "weights": {k: v.clone() for k, v in
                                                           P.record_state(sent).items()}})
            z = P.record_tensor(P.array_of(request.content, P.ACTIVATIONS), "x").float()
            g = P.record_tensor(P.array_of(content, P.GRADIENT), "g").float()
            events.append({"kind": "forward", "z": z.clone(),
                           "g": g.reshape(g.shape[0], -1).clone(),
                           "config": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in config.items()}})
        elif request.action == P.TRAIN_STEP and config.get("return-weights") and P.WEIGHTS in content:
            weights, _ = P.replies.weights(content)
            events.append({"kind": "uploaded", "weights": {k: torch.as_tensor(v).clone() for k, v in weights.items()}})

    def write(self, run_dir: str | Path) -> Path:
        """Write ``RUN_DIR/privacy/received.npz`` (and, with tail events, :data:`TAILS_FILE`); its path."""
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
        if self.tail_events:
            _write_tail_events(self.tail_events, folder / TAILS_FILE)
        return path

    @staticmethod
    def clear_truth(run_dir: str | Path) -> None:
        """Remove a former run's tail records and label audits under ``RUN_DIR/privacy/evaluator/`` (the clients
        add to them): in simulation, where the server and the clients share ``output-dir``."""
        folder = Path(run_dir) / PRIVACY_DIR / EVALUATOR_DIR
        for path in [*folder.glob("tail-*.npys"), *folder.glob("audit-*.jsonl")]:
            path.unlink()


def _write_tail_events(events: dict[int, list[dict[str, Any]]], path: Path) -> None:
    """Write the tail events as one safetensors file: each tensor under ``"<pid>/<i>/<field>"`` (``weights``
    entries as ``"<pid>/<i>/weights/<name>"``), and the events' order, kinds and configs as the JSON index
    ``"events"`` of the file's metadata."""
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    index: list[dict[str, Any]] = []
    for pid, rows in sorted(events.items()):
        for i, event in enumerate(rows):
            entry: dict[str, Any] = {"pid": int(pid), "i": i, "kind": event["kind"]}
            for field, value in event.items():
                if field == "weights":
                    entry["weights"] = list(value)
                    tensors.update({f"{pid}/{i}/weights/{k}": v.contiguous() for k, v in value.items()})
                elif field in ("z", "g"):
                    tensors[f"{pid}/{i}/{field}"] = value.contiguous()
                elif field == "config":
                    entry["config"] = value
            index.append(entry)
    save_file(tensors, str(path), metadata={"events": json.dumps(index)})


def read_tail_events(run_dir: str | Path) -> dict[int, list[dict[str, Any]]] | None:
    """The server's tail events per client (:data:`TAILS_FILE`; see the module docstring), or None where the
    run recorded none (not U-shaped, or recorded before sflower recorded them). The file is untrusted input:
    safetensors (no code), its JSON index parsed with a depth bound and checked against the tensors.

    Raises:
        ConfigError: the file exists but cannot be read, or its index does not match its tensors (one line).
    """
    from safetensors import SafetensorError, safe_open

    path = Path(run_dir) / PRIVACY_DIR / TAILS_FILE
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            index = json.loads(meta.get("events", "[]"))
            if not isinstance(index, list):
                raise ValueError("index is not a list")
            events: dict[int, list[dict[str, Any]]] = {}
            for entry in index:
                pid, i, kind = int(entry["pid"]), int(entry["i"]), str(entry["kind"])
                event: dict[str, Any] = {"kind": kind}
                if "weights" in entry:
                    event["weights"] = {str(k): fh.get_tensor(f"{pid}/{i}/weights/{k}") for k in entry["weights"]}
                if kind == "forward":
                    event["z"], event["g"] = fh.get_tensor(f"{pid}/{i}/z"), fh.get_tensor(f"{pid}/{i}/g")
                    config = entry.get("config", {})
                    if not isinstance(config, dict):
                        raise ValueError("config is not an object")
                    event["config"] = config
                events.setdefault(pid, []).append(event)
        return events
    except (OSError, SafetensorError, ValueError, KeyError, TypeError, RecursionError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{path}: unreadable tail record ({first})") from None


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
