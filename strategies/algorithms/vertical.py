"""``vertical-sl``: vertical split learning with private set intersection (issue 45).

The ServerApp coordinates and relays; the parties compute (:mod:`fl_app.vertical.party`). A run:

1. **Handshake** (``info``): every node reports its party index; party 0 is the label party.
2. **PSI** (:mod:`fl_app.vertical.psi`): round 1, the label party receives against each feature party (it
   learns each pairwise intersection ``I_k``; ``I = ∩ I_k``); round 2, each feature party receives
   against the label party's ``I`` and learns ``I`` only. The relay sees encrypted points and counts.
   The PSI's curve operations and bytes are charged on the virtual clock.
3. **Training**, synchronous: the label party draws a mini-batch (positions in the sorted ``I``, over
   its seeded training part), the feature parties send embeddings, the label party joins them, steps
   the top model and returns ``∂L/∂e_k``; each party steps its bottom model. Every ``eval-every``
   iterations the held-out test part of ``I`` is evaluated.

``label-party=server`` runs the label party inside the ServerApp (Flower's own vertical-FL example's
shape, for comparison): the server then holds the labels. A *global iteration* here is one mini-batch.

**Checkpoints** (``checkpoint-every=N``, ``resume=RUN_DIR``) go through the horizontal strategies'
:class:`~strategies.core.checkpoint.Checkpointer` and file format: the server's counters, metric rows and virtual
clock (:meth:`VerticalSL.checkpoint_state`), the label party's state when the ServerApp holds it, the RNG states,
and each party node's whole ``context.state`` (``query.checkpoint``, sealed on the node): its bottom model, the
label party's top model, and the PSI's result (each party's aligned rows, the label party's train/test split).
A resume does the handshake again, puts the states back and goes on with the next mini-batch: **it does not redo
the PSI**. Training is plain SGD, so there is no optimiser state beyond the weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fl_app.vertical import psi
from fl_app.run.config import RunConfig, defaults
from fl_app.run.errors import ConfigError
from fl_app.run.options import Option
from fl_app.protocol.records import record_bytes, record_tensor
from fl_app.vertical.models import joined_width
from fl_app.vertical.party import CFG, PARTY, handle
from strategies.core.checkpoint import Checkpointer
from strategies.core.errors import RunFailedError
from strategies.core.registry import register

#: X25519 scalar multiplications per second on one core, for the virtual clock's PSI charge
#: (``docs/results/vertical-psi/psi.csv``: 10k against 10k IDs, 40,000 multiplications in 2.53 CPU-s).
PSI_OPS_PER_S = 15800.0


@register
class VerticalSL:
    """Vertical split learning: feature parties' bottom models, the label party's join and top model."""

    name = "vertical-sl"
    #: not an event-loop strategy: ``sflower run`` hands it to :func:`simulation.vertical.run_vertical`
    vertical = True
    ushaped_refusal = "vertical-sl has no U-shaped form: the label party holds the top model and the loss"
    options = (
        Option("label-party", "node", "who holds the labels and the top model: its own node, or the ServerApp "
               "(as Flower's own vertical-FL example)", ("node", "server")),
        Option("vertical-join", "concat", "how the label party joins the parties' embeddings", ("concat", "sum")),
        Option("vertical-overlap", 1.0, "fraction of rows each party keeps (seeded): partial overlap for PSI",
               above=0.0, at_most=1.0),
        Option("vertical-parties", 2, "parties of vertical-fmnist (pixel-column bands, the label party's first)",
               at_least=2, at_most=4),
        Option("vertical-rows", 10000, "vertical-fmnist: the first N training images", at_least=10),
        Option("vertical-embedding", 8, "width h of each bottom model's embedding", at_least=1),
        Option("vertical-test-fraction", 0.2, "held-out test part of the intersection (seeded)", above=0.0,
               at_most=0.9),
        Option("vertical-psi", "intersection", "`intersection`: align and train; `cardinality`: the label party "
               "learns only the size of its intersection with each feature party (no ID), and the run stops there",
               ("intersection", "cardinality")),
        Option("psi-backend", "auto", "PSI: openmined.psi 2.0.4 if it imports, else X25519 DH",
               ("auto", "openmined", "dh")),
        Option("vertical-link-mbps", 100.0, "each party's link to the ServerApp, Mbit/s (virtual clock)", above=0.0),
        Option("vertical-gflops", 10.0, "each party's compute, GFLOP/s (virtual clock)", above=0.0),
    )

    def __init__(self, cfg: RunConfig, grid: Grid, on_row: Callable[[dict[str, Any]], None]) -> None:
        self.cfg, self.grid, self.on_row = cfg, grid, on_row
        self.backend = psi.resolve_backend(cfg.psi_backend)
        self.virtual_s = 0.0
        self.bytes_up = self.bytes_down = self.exchanges = 0
        self.server_state = RecordDict()  # the label party's state when label-party=server
        self.psi_bytes, self.psi_virtual_s, self.psi_cpu_s = 0, 0.0, 0.0
        self.nodes: dict[int, int] = {}
        self.rows: list[dict[str, Any]] = []
        self.shared = self.test = 0
        self.noise_power = 0.0  # summed over the steps: the label defence's mean squared noise norm per row
        self.iteration = 0  # the next mini-batch
        #: called with the checkpoint's rows at a resume (the recorder's ``resume``: metrics.csv cut to them)
        self.on_resume: Callable[[list[dict[str, Any]]], None] | None = None
        self.checkpoints = Checkpointer(self.name, self.checkpoint_state, self.load_checkpoint_state,
                                        lambda g: {"strategy": self, "cfg": self.cfg, "grid": g}, _Direct,
                                        lambda: dict(self.nodes), self.reconnect, float(cfg.node_timeout))
        self._wall0 = time.perf_counter()

    # ------------------------------------------------------------------ checkpoints
    #: Attributes that are not server state: the run's environment, the nodes' ids (a resume's handshake finds
    #: them again), the checkpointing itself and the wall clock's start (saved as elapsed seconds).
    NOT_CHECKPOINTED: ClassVar[frozenset[str]] = frozenset({"cfg", "grid", "on_row", "on_resume", "nodes",
                                                            "checkpoints", "_wall0"})
    checkpoint_path = property(lambda self: self.checkpoints.path, lambda self, v: setattr(self.checkpoints, "path", v),
                               doc="Where checkpoints are written (set by the runner with ``checkpoint-every``).")
    resume_from = property(lambda self: self.checkpoints.resume_from,
                           lambda self, v: setattr(self.checkpoints, "resume_from", v),
                           doc="The checkpoint :meth:`run` resumes from (set by the runner).")

    def checkpoint_state(self) -> dict[str, Any]:
        """The server state for a checkpoint: every attribute but :attr:`NOT_CHECKPOINTED` (counters, the virtual
        clock, metric rows, the PSI's sizes, the label party's state when the ServerApp holds it)."""
        return {k: v for k, v in vars(self).items() if k not in self.NOT_CHECKPOINTED}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`checkpoint_state`."""
        self.__dict__.update(state)

    def resume_at(self, t: float) -> None:
        """The virtual clock at a resume (:meth:`Checkpointer.restore`; it is also in the restored state)."""
        self.virtual_s = float(t)

    def reconnect(self, grid: Grid) -> dict[int, int]:
        """A resume's handshake on ``grid``: ``{party: node id}`` of the party nodes, whose states are put back."""
        self.grid = grid
        self.handshake()
        return dict(self.nodes)

    def maybe_checkpoint(self) -> None:
        """Write a checkpoint when ``checkpoint-every`` mini-batches have passed since the last one
        (:meth:`Checkpointer.write`; between two mini-batches, when nothing is on the wire)."""
        if self.checkpoints.due(self.cfg.checkpoint_every, self.iteration):
            meta = {"strategy": self.name, "config": self.cfg.as_dict(), "global_iteration": self.iteration,
                    "rows": len(self.rows), "virtual_time_s": self.virtual_s}
            wall = time.perf_counter() - self._wall0
            self.checkpoints.write(self.checkpoint_path, _Direct(self.grid), meta, (wall, wall))

    def restore(self) -> None:
        """Continue from :attr:`resume_from` instead of the handshake and the PSI (:meth:`Checkpointer.restore`),
        and cut the run's metric rows to the checkpoint's (:attr:`on_resume`).

        Raises:
            CheckpointError: unreadable, or of another strategy or configuration.
        """
        _, wall_s, _ = self.checkpoints.restore(self.grid, self.resume_from, self.cfg.as_dict(), defaults(), self)
        self.checkpoints.last = self.iteration
        self._wall0 = time.perf_counter() - wall_s
        if self.on_resume is not None:
            self.on_resume(self.rows)

    # ------------------------------------------------------------------ relay
    def settings(self, op: str, **extra: Any) -> ConfigRecord:
        """The message's config: ``op``, the run's settings, ``extra``."""
        c = self.cfg
        return ConfigRecord({"op": op, "run": True, "dataset": c.dataset, "data-dir": c.data_dir,
                             "overlap": c.vertical_overlap, "seed": c.seed, "parties": c.vertical_parties,
                             "rows": c.vertical_rows, "join": c.vertical_join, "lr": c.lr,
                             "embedding": c.vertical_embedding, "test-fraction": c.vertical_test_fraction,
                             "batch-size": c.batch_size, "backend": self.backend, "label-holder": c.label_party,
                             "reveal": True, "defence": c.label_defence, "run-dir": self.run_dir,
                             "noise": c.label_noise, "power": c.label_power, **extra})

    def exchange(self, requests: Mapping[int, RecordDict]) -> dict[int, RecordDict]:
        """Send each party its content (in parallel), return each reply's content; meter the bytes.

        Raises:
            RunFailedError: a party's error reply (its reason's last line).
        """
        out, messages = {}, []
        for party, content in requests.items():
            if party == 0 and self.cfg.label_party == "server":  # in the ServerApp: no transfer
                out[0] = handle(content, self.server_state, {PARTY: 0})
            else:
                self.bytes_down += _size(content)
                messages.append(Message(content, self.nodes[party], "query.vertical"))
        if messages:
            by_node = {v: k for k, v in self.nodes.items()}
            for reply in self.grid.send_and_receive(messages):
                if reply.has_error():
                    _raise(by_node[reply.metadata.src_node_id], reply.error.reason)
                out[by_node[reply.metadata.src_node_id]] = reply.content
                self.bytes_up += _size(reply.content)
        self.exchanges += 1
        return out

    def charge(self, bits: float, flops: float = 0.0, cpu_s: float = 0.0) -> float:
        """Virtual seconds of one step: transfer, compute (FLOPs) and measured-equivalent CPU seconds."""
        s = bits / (self.cfg.vertical_link_mbps * 1e6) + flops / (self.cfg.vertical_gflops * 1e9) + cpu_s
        self.virtual_s += s
        return s

    # ------------------------------------------------------------------ phases
    def handshake(self) -> None:
        """Ask every node its party index; the run needs parties ``0..K-1``, each once (0 may be the server)."""
        want = set(range(self.parties)) - ({0} if self.cfg.label_party == "server" else set())
        ids, deadline = sorted(self.grid.get_node_ids()), time.monotonic() + 120.0
        while len(ids) < len(want) and time.monotonic() < deadline:  # simulated nodes register in the background
            time.sleep(0.2)
            ids = sorted(self.grid.get_node_ids())
        replies = self.grid.send_and_receive([Message(RecordDict({CFG: self.settings("info")}), n, "query.vertical")
                                              for n in ids])
        for r in replies:
            if r.has_error():
                _raise(None, r.error.reason)
            self.nodes[int(r.content[CFG]["party"])] = r.metadata.src_node_id
        if set(self.nodes) != want:
            raise ConfigError(f"vertical-sl needs parties {sorted(want)}, the nodes are parties {sorted(self.nodes)}")

    @property
    def run_dir(self) -> str:
        """The run directory, where a party node without a ``state-dir`` keeps its checkpoint key: that of the
        checkpoint written or resumed from ("" without either)."""
        path = self.checkpoint_path if self.checkpoint_path is not None else self.resume_from
        return str(Path(path).parent) if path is not None else ""

    @property
    def parties(self) -> int:
        """K, the parties (the label party included)."""
        return self.cfg.vertical_parties if self.cfg.dataset == "vertical-fmnist" else 2

    def step(self, iteration: int, phase: str = "train") -> dict[str, float]:
        """One synchronous mini-batch (``train``) or the test evaluation (``test``)."""
        pos = self.exchange({0: _msg(self.settings("batch", phase=phase, iteration=iteration))})[0]["positions"]
        b = len(record_tensor(pos, "positions"))
        feats = range(1, self.parties)
        emb = self.exchange({k: _msg(self.settings("forward"), positions=pos) for k in feats})
        top = _msg(self.settings("top" if phase == "train" else "evaluate", iteration=iteration), positions=pos)
        for k in feats:
            top[f"e{k}"] = emb[k]["embedding"]
        up = 32.0 * b * self.cfg.vertical_embedding
        flops = model_flops_estimate(self, b)
        reply = self.exchange({0: top})[0]
        if phase == "test":
            self.charge(up, flops / 3.0)
            return dict(reply["metrics"])
        self.exchange({k: _msg(self.settings("backward"), positions=pos, grad=reply[f"g{k}"]) for k in feats})
        self.charge(2 * up, flops)
        self.noise_power += float(reply["metrics"]["noise_power"])
        return dict(reply["metrics"])

    def run(self) -> dict[str, Any]:
        """Handshake, PSI, ``global-iterations`` mini-batches with evaluations; returns the summary."""
        wall = self._wall0 = time.perf_counter()
        if self.resume_from is not None:
            self.restore()
            wall = self._wall0
        else:
            self.handshake()
            if self.cfg.vertical_psi == "cardinality":
                return cardinality(self, wall)
            align(self)
        it = self.iteration
        evaluated = self.resume_from is not None  # a checkpoint of iteration `it` comes after its evaluation
        while True:
            every = self.cfg.eval_every  # 0: only before the first step and after the last
            if not evaluated and (it == 0 or (every and it % every == 0) or it == self.cfg.global_iterations):
                m = self.step(it, "test")
                self.rows.append({"global_iteration": it, "server_updates": it,
                                  "virtual_time_s": round(self.virtual_s, 6),
                                  "wall_time_s": round(time.perf_counter() - wall, 3),
                                  "test_accuracy": m["accuracy"], "test_loss": m["loss"],
                                  "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                                  "exchanges": self.exchanges, "psi_bytes": self.psi_bytes,
                                  "intersection": self.shared})
                self.on_row(self.rows[-1])
            evaluated = False
            if it == self.cfg.global_iterations:
                break
            self.maybe_checkpoint()
            self.step(it)
            it = self.iteration = it + 1
        return summary(self, it, wall)


def summary(s: VerticalSL, it: int, wall: float) -> dict[str, Any]:
    """The summary of a trained run ``s`` after ``it`` iterations (``wall``: its start, ``perf_counter``)."""
    last = s.rows[-1]
    return {"strategy": s.name, "dataset": s.cfg.dataset, "final_accuracy": last["test_accuracy"],
            "best_accuracy": max(r["test_accuracy"] for r in s.rows), "global_iterations": it,
            "virtual_time_s": s.virtual_s, "wall_time_s": time.perf_counter() - wall,
            "bytes_up": s.bytes_up, "bytes_down": s.bytes_down, "psi_backend": s.backend,
            "psi_bytes": s.psi_bytes, "psi_virtual_s": s.psi_virtual_s, "psi_cpu_s": s.psi_cpu_s,
            "intersection": s.shared, "test_rows": s.test, "label_party": s.cfg.label_party,
            "label_noise_power": s.noise_power / max(1, it), "exchanges": s.exchanges,
            "status": "completed"}


def align(s: VerticalSL) -> None:
    """The two PSI rounds of ``s``'s parties through the relay (:func:`fl_app.vertical.psi.align`'s protocol, one
    message at a time); their curve operations and bytes on the virtual clock.

    Raises:
        ConfigError: no shared ID (the label party's one line).
        RunFailedError: a feature party aligned another number of rows than the label party.
    """
    t0, b0 = time.process_time(), s.bytes_up + s.bytes_down
    for k in range(1, s.parties):  # round 1: the label party learns I_k
        req = s.exchange({0: _msg(s.settings("psi_request"))})[0][CFG]["blob"]
        resp = s.exchange({k: _msg(s.settings("psi_respond", blob=req, source="own"))})[k][CFG]["blob"]
        s.exchange({0: _msg(s.settings("psi_intersect", blob=resp))})
        _charge_psi(s, len(req), len(resp))
    done = s.exchange({0: _msg(s.settings("psi_finish"))})[0][CFG]
    s.shared, s.test = int(done["count"]), int(done["test"])
    for k in range(1, s.parties):  # round 2: feature party k learns I
        req = s.exchange({k: _msg(s.settings("psi_request"))})[k][CFG]["blob"]
        resp = s.exchange({0: _msg(s.settings("psi_respond", blob=req, source="shared"))})[0][CFG]["blob"]
        count = int(s.exchange({k: _msg(s.settings("psi_intersect", blob=resp))})[k][CFG]["count"])
        if count != s.shared:
            raise RunFailedError(f"PSI: feature party {k} aligned {count} rows, the label party {s.shared}")
        _charge_psi(s, len(req), len(resp))
    s.psi_cpu_s = time.process_time() - t0
    s.psi_bytes = s.bytes_up + s.bytes_down - b0


def cardinality(s: VerticalSL, wall: float) -> dict[str, Any]:
    """``vertical-psi=cardinality``: one PSI per feature party in which the label party learns only
    ``|X_L ∩ X_k|``; no alignment, no training. The summary holds the sizes (``pairwise_intersections``)."""
    sizes = {}
    for k in range(1, s.parties):
        req = s.exchange({0: _msg(s.settings("psi_request", reveal=False))})[0][CFG]["blob"]
        resp = s.exchange({k: _msg(s.settings("psi_respond", blob=req, source="own", reveal=False))})[k][CFG]["blob"]
        sizes[str(k)] = int(s.exchange({0: _msg(s.settings("psi_intersect", blob=resp, reveal=False))})[0][CFG]["count"])
        _charge_psi(s, len(req), len(resp))
    return {"strategy": s.name, "dataset": s.cfg.dataset, "vertical_psi": "cardinality", "psi_backend": s.backend,
            "pairwise_intersections": sizes, "psi_bytes": s.bytes_up + s.bytes_down, "psi_virtual_s": s.psi_virtual_s,
            "virtual_time_s": s.virtual_s, "wall_time_s": time.perf_counter() - wall, "status": "completed"}


def _charge_psi(s: VerticalSL, req: int, resp: int) -> None:
    """Charge one PSI: its bytes, and its curve multiplications at :data:`PSI_OPS_PER_S`.

    Counted from the message sizes at 32 bytes a point: the receiver encrypts its request's points and decrypts
    the sender's own points; the sender encrypts the request's points again and its own once.
    """
    ops = (req + 2 * resp) / 32.0
    s.psi_virtual_s += s.charge(8.0 * (req + resp), cpu_s=ops / PSI_OPS_PER_S)


def model_flops_estimate(strategy: VerticalSL, batch: int) -> float:
    """FLOPs of one step on ``batch`` rows, forward and backward: a bottom model of 64 inputs and the top model.

    The server does not know the parties' column counts; 64 stands for them (an estimate for the clock).
    """
    h = strategy.cfg.vertical_embedding
    return 6.0 * batch * (64 * h + joined_width(h, strategy.parties, strategy.cfg.vertical_join) * 16 + 16 * 10)


def _raise(party: int | None, reason: str) -> None:
    """A party's error reply as one line: its input's fault (``ConfigError: ...``) is a ConfigError, else the run
    failed.

    Raises:
        ConfigError: the party refused its data or the run's settings.
        RunFailedError: any other failure.
    """
    last = (reason.strip().splitlines() or ["no reason given"])[-1]
    who = "a vertical party" if party is None else f"party {party}"
    if last.startswith("ConfigError: "):
        raise ConfigError(f"{who}: {last.removeprefix('ConfigError: ')}")
    raise RunFailedError(f"{who}: {last}")


class _Direct:
    """What :class:`~strategies.core.checkpoint.Checkpointer` needs of a dispatcher, for a run that has none:
    the vertical run exchanges synchronously, so between two mini-batches nothing is on the wire or queued."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def drain(self, timeout: float) -> bool:
        """Nothing is in flight: drained at once."""
        return True

    def arrived_errors(self) -> list[str]:
        """No reply waits to be handled."""
        return []

    def release(self) -> None:
        """Nothing to deliver."""

    def state_dict(self) -> None:
        """No pending work to save."""
        return None

    def load_state_dict(self, state: None) -> None:
        """No pending work to restore."""


def _msg(config: ConfigRecord, **arrays: Any) -> RecordDict:
    content = RecordDict({CFG: config})
    for key, value in arrays.items():
        content[key] = value
    return content


def _size(content: RecordDict) -> int:
    """Bytes of a message's arrays and byte strings."""
    n = sum(record_bytes(v) for v in content.array_records.values())
    for rec in content.config_records.values():
        n += sum(len(v) for v in rec.values() if isinstance(v, bytes))
    return n

