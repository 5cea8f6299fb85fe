"""Checkpoint files of a run's server state (``checkpoint-every=N``, ``sflower run resume=RUN_DIR``).

A checkpoint is one file, ``RUN_DIR/checkpoint.sfl``, written atomically (a
temporary file in the same directory, flushed and fsynced, then
:func:`os.replace`), so a run killed while writing one keeps the previous
one. Loading it executes nothing: no pickle anywhere, and every part is
checked before it is used (a run directory is untrusted input; see
:func:`read` and :func:`loads`). It holds

* a magic line (:data:`MAGIC`), then the length of a JSON header and the
  header: ``format`` (:data:`FORMAT`) and ``meta``, plain JSON values
  (strategy, the whole run configuration, the global iteration, the number
  of metric rows written), readable without the task by :func:`read_meta`;
* ``state``: the server state (:func:`dumps`): the object graph as typed
  JSON (:mod:`strategies.core.state_codec`), then one safetensors blob of
  the tensor storages and NumPy buffers (uint8 tensors):
  the strategy's attributes, the dispatcher's pending work, the clock, the
  RNG states and every live client's ``context.state``, fetched from its node
  (:mod:`strategies.core.client_states`; see :meth:`Checkpointer.write`).
  Shared objects stay shared (an optimizer's state keys are the model's
  Parameters), views keep sharing their storage;
* the SHA-256 digest of everything before it (32 bytes): a truncated or
  bit-flipped file is refused before its state is parsed. (Anyone can
  recompute it: it detects corruption, it authenticates nothing. What keeps a
  crafted checkpoint harmless is the codec's allowlist and the checks of
  :func:`loads` and of the configuration, :func:`fl_app.run.untrusted.run_dir_config`.)

Objects of the run's environment (the task and its data, the
configuration, clock, timing, recorder and grid) are not written: they are
written as references by name (see :func:`dumps`) and replaced by the
resumed run's own objects when loading (:func:`loads`). Other objects are
rebuilt only if their classes belong to the codec's allowlist of modules
(:data:`~strategies.core.state_codec.ALLOWED_MODULES`); anything else is
refused when writing and when reading.

A checkpoint of an earlier format (``checkpoint.pt``, a pickle) is refused
with one line, without being read.

:class:`Checkpointer` is a strategy's checkpointing: when one is due, writing
it, resuming from it; it receives the strategy's callbacks, not the strategy.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
import random
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from fl_app.run.errors import ConfigError
from strategies.core import client_states, state_codec
from strategies.core.errors import NODE_UNAVAILABLE, NodeLostError, RunFailedError
from strategies.core.state_decoder import decode

log = logging.getLogger("sflower")

#: The checkpoint's file name inside the run directory.
CHECKPOINT_FILE = "checkpoint.sfl"
#: The file name of format 1 and 2 checkpoints (pickles): refused, never read.
LEGACY_CHECKPOINT_FILE = "checkpoint.pt"
#: Version of the file layout; a file of another version is refused. 2: the strategy's state holds its
#: collaborators (membership, exchange, metric log, checkpointer; issue 22) where 1 held their attributes.
#: 3: JSON + safetensors instead of a pickle. 4: the clients' states by partition, fetched with ``query.checkpoint`` on
#: every engine, where 3 held the in-process grid's node states. 5: the file ends with a SHA-256 digest of what
#: precedes it (a truncated or altered file is refused before its state is parsed), and each client's state is
#: sealed on its node (:mod:`fl_app.client.sealing`), where 4 held it in the clear.
FORMAT = 5
#: The first bytes of a checkpoint file.
MAGIC = b"SFLOWER-CHECKPOINT\n"
#: The largest JSON header read (bytes): a larger length field is refused before anything is allocated.
MAX_HEADER_BYTES = 64 * 2**20
#: The length of the SHA-256 digest that ends a checkpoint file (of everything before it).
DIGEST_BYTES = 32

__all__ = ["CHECKPOINT_FILE", "FORMAT", "LEGACY_CHECKPOINT_FILE", "MAGIC",
           "CheckpointError", "dumps", "loads", "write", "read", "read_meta", "rng_state", "set_rng_state",
           "environment", "save_run", "load_run", "RESUMABLE_KEYS", "Checkpointer"]


class CheckpointError(ConfigError):
    """A checkpoint cannot be used: missing, unreadable, of another format, or of another run (one line)."""


def dumps(obj: Any, env: Mapping[str, Any]) -> bytes:
    """``obj`` as bytes, with the objects of ``env`` (name -> object) as references: the length of its
    object graph's JSON (8 bytes, little-endian), the JSON (:func:`state_codec.encode
    <strategies.core.state_codec.encode>`), then one safetensors blob of its tensor and array bytes. (The
    graph is not in the safetensors metadata, whose header safetensors limits to 100 MB.)

    Raises:
        CheckpointError: something in ``obj`` is of a type the codec cannot write (one line).
    """
    try:
        graph, blobs = state_codec.encode(obj, env)
    except state_codec.CodecError as err:
        raise CheckpointError(f"cannot write a checkpoint: {err}") from None
    text = json.dumps(graph, allow_nan=False, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + safetensors.torch.save(blobs)


def loads(data: bytes, env: Mapping[str, Any]) -> Any:
    """Inverse of :func:`dumps`: references to ``env`` names become the objects ``env`` gives now. Nothing
    named by the data is executed but the constructors the codec allows.

    Raises:
        CheckpointError: unreadable bytes, a referenced name not in ``env``, or a graph naming something
            outside the codec's allowlist.
    """
    try:
        (n,) = struct.unpack("<Q", data[:8])
        if n > len(data) - 8:
            raise ValueError("truncated graph")
        graph = json.loads(data[8:8 + n])
        blobs = safetensors.torch.load(bytes(data[8 + n:]))
    except Exception as err:  # noqa: BLE001 - any unreadable state gets the same one-line error
        raise CheckpointError(f"the checkpoint's state is unreadable ({type(err).__name__})") from None
    try:
        return decode(graph, blobs, env)
    except state_codec.CodecError as err:
        raise CheckpointError(f"cannot load the checkpoint: {err}") from None
    except RecursionError:
        raise CheckpointError("cannot load the checkpoint: its object graph is nested too deep") from None
    except Exception as err:  # noqa: BLE001 - a malformed graph (wrong shapes, kinds, arguments): one line
        raise CheckpointError(f"cannot load the checkpoint: malformed state ({type(err).__name__})") from None


def write(path: str | Path, meta: Mapping[str, Any], state: bytes) -> None:
    """Write a checkpoint atomically: ``path.tmp`` (flushed, fsynced), then :func:`os.replace`. The file ends with
    the SHA-256 digest of everything before it (:data:`DIGEST_BYTES` bytes).

    Raises:
        CheckpointError: ``meta`` is not plain JSON (its ``config``'s non-finite floats are written as
            strings: :func:`plain_config`).
    """
    path = Path(path)
    meta = {**meta, "config": plain_config(meta["config"])} if "config" in meta else meta
    try:
        header = json.dumps({"format": FORMAT, "meta": dict(meta)}, allow_nan=False).encode()
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"cannot write a checkpoint: its meta is not plain JSON ({err})") from None
    head = MAGIC + struct.pack("<Q", len(header)) + header
    digest = hashlib.sha256(head)
    digest.update(state)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(head)
        fh.write(state)
        fh.write(digest.digest())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _older(path: Path) -> CheckpointError:
    return CheckpointError(f"{path} is a checkpoint of an older sflower (a pickle, format 1 or 2), which this "
                           f"sflower refuses to load (format {FORMAT}): start the run again")


def _header(path: Path, data: bytes) -> tuple[dict[str, Any], int]:
    """``(header, offset of the state)`` of a checkpoint's bytes; checks the magic line, the header's length
    (within the file, at most :data:`MAX_HEADER_BYTES`), its JSON and its format version."""
    if not data.startswith(MAGIC):
        if data[:1] == b"\x80" or data[:4] == b"PK\x03\x04":  # a pickle (protocol 2+), a torch.save zip
            raise _older(path)
        raise CheckpointError(f"{path} is not a readable checkpoint (no sflower checkpoint header)")
    start = len(MAGIC) + 8
    if len(data) < start:
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated header)")
    (n,) = struct.unpack("<Q", data[len(MAGIC):start])
    if n > min(MAX_HEADER_BYTES, len(data) - start):
        raise CheckpointError(f"{path} is not a readable checkpoint (header length {n} exceeds the file or "
                              f"{MAX_HEADER_BYTES} bytes)")
    try:
        header = json.loads(data[start:start + n])
    except RecursionError:
        raise CheckpointError(f"{path} is not a readable checkpoint (header nested too deep)") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(err).__name__})") from None
    if not isinstance(header, dict) or not isinstance(header.get("meta"), dict):
        raise CheckpointError(f"{path} is not an sflower checkpoint")
    if header.get("format") != FORMAT:
        shown = str(header.get("format"))[:40] if isinstance(header.get("format"), (int, str)) else "?"
        raise CheckpointError(f"{path} has checkpoint format {shown}; this sflower reads {FORMAT}")
    return header, start + n


def _open(path: str | Path) -> tuple[Path, bytes]:
    path = Path(path)
    if not path.is_file():
        legacy = path.with_name(LEGACY_CHECKPOINT_FILE)
        if path.name == CHECKPOINT_FILE and legacy.is_file():
            raise _older(legacy)
        raise CheckpointError(f"no checkpoint at {path} (was the run started with checkpoint-every=N?)")
    try:
        return path, path.read_bytes()
    except (OSError, MemoryError) as err:
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(err).__name__})") from None


def read(path: str | Path) -> tuple[dict[str, Any], bytes]:
    """``(meta, state bytes)`` of a checkpoint file; nothing in it is executed.

    Raises:
        CheckpointError: no such file, not a checkpoint, another format version (an older pickle
            checkpoint included: refused without being read), a digest that does not match (truncated or
            altered), a header length beyond the file.
    """
    path, data = _open(path)
    header, offset = _header(path, data)
    body, digest = data[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
    if len(body) < offset or not hmac.compare_digest(hashlib.sha256(body).digest(), digest):
        raise CheckpointError(f"{path} is corrupt: its SHA-256 digest does not match (truncated or altered)")
    return header["meta"], body[offset:]


def read_meta(path: str | Path) -> dict[str, Any]:
    """The ``meta`` part of a checkpoint (see :func:`read`; the whole file is checked against its digest)."""
    return read(path)[0]


def rng_state() -> dict[str, Any]:
    """The process-wide RNG states: torch's default generator (and CUDA's, once initialised), NumPy's legacy
    global one, Python's ``random``."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def environment(named: Mapping[str, Any], task: Any) -> dict[str, Any]:
    """The run's objects that a checkpoint refers to by name instead of writing them: ``named``
    (name -> object; None values left out) and the task's non-scalar attributes as ``task.<name>``."""
    env = dict(named)
    env.update({f"task.{k}": v for k, v in vars(task).items()
                if not isinstance(v, (bool, int, float, str, bytes, type(None)))})
    return {k: v for k, v in env.items() if v is not None}


def save_run(path: str | Path, clients: Mapping[int, Any], strategy: Any, dispatcher: Any, clock: float,
             seconds: tuple[float, float], env: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    """Write a run's checkpoint: the strategy's state, the dispatcher's, the clients' states (``clients``:
    partition id -> the node's ``context.state`` records, :func:`strategies.core.client_states.fetch`), the
    clock, the process RNG states and the ``(wall, run)`` seconds so far, with ``env``'s objects as references
    (:func:`dumps`, :func:`write`).

    Raises:
        CheckpointError: something is of a type the codec cannot write, or ``meta`` is not plain JSON.
    """
    state = {"strategy": strategy, "dispatcher": dispatcher, "clients": dict(clients), "clock": clock,
             "rng": rng_state(), "wall_s": seconds[0], "run_s": seconds[1]}
    write(path, meta, dumps(state, env))


def plain_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A run configuration as a checkpoint's meta records it (plain JSON): a non-finite float, such as the
    default ``server-speed=inf``, as its string (``"inf"``, which the key's option reads back)."""
    return {k: str(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in config.items()}


def load_run(path: str | Path, name: str, config: Mapping[str, Any], env: Mapping[str, Any],
             defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Read a checkpoint of strategy ``name`` and run configuration ``config``: the saved state (see
    :func:`save_run`).

    A key newer than the checkpoint had its default (in ``defaults``) then; ``checkpoint-every`` and
    ``output-dir`` may differ.

    Raises:
        CheckpointError: unreadable file, another strategy or configuration.
    """
    meta, data = read(path)
    if meta.get("strategy") != name:
        raise CheckpointError(f"{path} is a checkpoint of strategy '{meta.get('strategy')}', not '{name}'")
    mine, theirs = plain_config(config), dict(meta.get("config", {}))
    theirs = {**{k: v for k, v in plain_config(defaults).items() if k in mine}, **theirs}
    diff = sorted(k for k in set(mine) | set(theirs)
                  if k not in RESUMABLE_KEYS and mine.get(k) != theirs.get(k))
    if diff:
        k = diff[0]
        raise CheckpointError(f"configuration differs from the checkpoint's: {k}={mine.get(k)!r} "
                              f"(checkpoint: {theirs.get(k)!r})" + (f" and {len(diff) - 1} more" if len(diff) > 1 else ""))
    return loads(data, env)


#: Run-config keys a resumed run may change: where and how often it checkpoints, what it resumes from, where
#: the data lies on this machine (``data-dir``: a run directory's is never read, the user gives it again;
#: ``dataset`` must match) and the session endpoint of a restarted deployment's ServerApp (its address and TLS
#: files are the new process's).
RESUMABLE_KEYS = frozenset({"checkpoint-every", "output-dir", "resume", "data-dir", "session-address",
                            "session-certificate", "session-key", "session-ca"})


class Checkpointer:
    """A strategy's checkpoints: when one is due, writing one (:func:`save_run`), resuming from one (:func:`load_run`).

    The strategy's state (its ``checkpoint_state`` hook, by default every
    attribute but ``NOT_CHECKPOINTED``) is written in one object graph
    (:func:`dumps`) with the dispatcher's and the clients' state, so shared objects (an
    optimizer's parameters, a request both pending and tagged) stay shared.
    References to the run's environment (the strategy itself, ``cfg``,
    ``task`` and its attributes, clock, timing, recorder, grid) are written by
    name and resolve to the resumed run's objects, which are rebuilt from the
    configuration: a strategy must keep its changing state in its own
    attributes, not in those objects. A strategy holding an object of a type
    the codec cannot write (:mod:`strategies.core.state_codec`: outside its
    allowlist of modules) extends the allowlist or overrides
    ``checkpoint_state`` and ``load_checkpoint_state``.

    Args:
        name: the strategy's registry name (a checkpoint of another is refused).
        state: ``() -> dict``, the strategy's server state (its ``checkpoint_state`` hook).
        load_state: ``(dict) -> None``, restores it (its ``load_checkpoint_state`` hook).
        env: ``(grid) -> {name: object}``, the run's objects written by name (:func:`environment`).
        new_dispatcher: ``(grid) -> Dispatcher`` for the registered clients, made after ``load_state``.
        live_nodes: ``() -> {partition id: node id}`` of the live clients, whose states a checkpoint holds.
        reconnect: ``(grid) -> {partition id: node id}``, a resume's handshake with the live clients' nodes
            (:meth:`~strategies.core.membership.Membership.reconnect`), after ``load_state``.
        timeout: wall seconds a node has to answer (``node-timeout``).
    """

    def __init__(self, name: str, state: Callable[[], dict[str, Any]], load_state: Callable[[dict[str, Any]], None],
                 env: Callable[[Any], dict[str, Any]], new_dispatcher: Callable[[Any], Any],
                 live_nodes: Callable[[], dict[int, int]], reconnect: Callable[[Any], dict[int, int]],
                 timeout: float) -> None:
        self.name, self.state, self.load_state, self.env = name, state, load_state, env
        self.new_dispatcher, self.live_nodes, self.reconnect = new_dispatcher, live_nodes, reconnect
        self.timeout = timeout
        #: where checkpoints are written (set by the runner when ``checkpoint-every`` > 0)
        self.path: Path | None = None
        #: the checkpoint the run resumes from instead of starting afresh (set by the runner)
        self.resume_from: Path | None = None
        #: global iteration of the last checkpoint written or resumed from
        self.last = 0
        #: whether the run resumed from a checkpoint
        self.resumed = False
        #: times the run went back to its last checkpoint after a lost node (``node-loss=rollback``)
        self.rollbacks = 0

    def due(self, every: int, global_iteration: int) -> bool:
        """Whether ``every`` (``checkpoint-every``; 0: never) global iterations have passed since the last
        checkpoint and the runner gave a :attr:`path`."""
        return bool(every) and self.path is not None and global_iteration >= self.last + every

    def write(self, path: str | Path, dispatcher: Any, meta: Mapping[str, Any], seconds: tuple[float, float]) -> bool:
        """Write the run's state to ``path`` (atomically, :func:`save_run`): ``state()``, the dispatcher's
        pending work, every live client's ``context.state``, the clock, the RNG states and the ``(wall, run)``
        seconds.

        The dispatcher is drained first (:meth:`~strategies.core.dispatcher.Dispatcher.drain`: nothing on the
        wire), the clients' states are fetched (:func:`strategies.core.client_states.fetch`), and delivery
        resumes once the file is written. ``meta`` holds ``strategy``, ``config``, ``global_iteration``,
        ``rows`` and ``virtual_time_s``.

        Returns:
            False (a warning says why) when a node did not answer or failed, or a lost node's reply waits to be
            handled: no checkpoint this time.

        Raises:
            CheckpointError: something in the state is of a type the codec cannot write.
        """
        try:
            if not dispatcher.drain(self.timeout):
                log.warning("no checkpoint at global iteration %d: a node did not answer within %g s",
                            meta["global_iteration"], self.timeout)
                return False
            if any(NODE_UNAVAILABLE in reason.lower() for reason in dispatcher.arrived_errors()):
                # a lost node's reply waits to be handled: with node-loss=rollback it sends the run back to the
                # previous checkpoint, which this one must not replace (it would hold that reply)
                log.warning("no checkpoint at global iteration %d: a lost node's reply waits to be handled",
                            meta["global_iteration"])
                return False
            try:
                clients = client_states.fetch(dispatcher.grid, self.live_nodes(), self.timeout)
            except RunFailedError as err:
                log.warning("no checkpoint at global iteration %d: %s", meta["global_iteration"], err)
                return False
            self.last = meta["global_iteration"]
            save_run(path, clients, self.state(), dispatcher.state_dict(), meta["virtual_time_s"], seconds,
                     self.env(dispatcher.grid), meta)
        finally:
            dispatcher.release()
        log.info("checkpoint at global iteration %d -> %s", meta["global_iteration"], path)
        return True

    def run(self, run: Callable[[], None], roll_back: Callable[[Path], None]) -> None:
        """``run()``; where it raises :class:`~strategies.core.errors.NodeLostError` (``node-loss=rollback``),
        ``roll_back(path)`` restores the last checkpoint (the strategy's :meth:`restore`, which waits for the
        lost node and restores every client's state) and ``run()`` goes on from there: on the virtual clock the
        numbers are those of a run that lost nothing.

        Raises:
            RunFailedError: a node was lost before the first checkpoint.
        """
        while True:
            try:
                run()
                return
            except NodeLostError as err:
                if self.path is None or not Path(self.path).is_file():
                    raise RunFailedError(f"{err}; no checkpoint to roll back to yet") from None
                log.warning("%s: rolling back to the checkpoint of global iteration %d once the node is back",
                            err, self.last)
                roll_back(Path(self.path))
                self.rollbacks += 1

    def restore(self, grid: Any, path: str | Path, config: Mapping[str, Any], defaults: Mapping[str, Any],
                clock: Any) -> tuple[Any, float, float]:
        """Restore the strategy (``load_state``), find the live clients' nodes (``reconnect``) and restore their
        states (:func:`strategies.core.client_states.push`), then ``clock``, the RNG states and the pending
        work (a new dispatcher on ``grid``, which delivers the queued requests) from the checkpoint at ``path``.

        Returns:
            ``(dispatcher, wall seconds, run seconds)`` so far.

        Raises:
            CheckpointError: unreadable file, another strategy or configuration (:data:`RESUMABLE_KEYS` may
                differ; :func:`load_run`).
            RunFailedError: a live client's node is not there or holds other data, or a node failed to restore.
        """
        state = load_run(path, self.name, config, self.env(grid), defaults)
        self.load_state(state["strategy"])

        def reconnect_and_push() -> None:  # tried again while a node is gone (restarting)
            node_of = self.reconnect(grid)
            client_states.push(grid, node_of, {p: state["clients"][p] for p in node_of}, self.timeout)

        client_states.when_nodes_are_back(reconnect_and_push, self.timeout)
        clock.resume_at(float(state["clock"]))
        set_rng_state(state["rng"])
        dispatcher = self.new_dispatcher(grid)
        try:
            dispatcher.load_state_dict(state["dispatcher"])
        except ValueError as err:
            raise CheckpointError(f"{path}: {err}") from None
        self.resumed = True
        return dispatcher, float(state["wall_s"]), float(state["run_s"])
