"""The dispatcher: requests, a FIFO queue per node, due times, tagged replies.

docs/explanation/design.md §5. A strategy sends :class:`Request` objects; the
dispatcher gives each one a **due time** when it is sent: the node starts
it when its previous request is due (requests to one node run one after
the other, in order) and needs ``duration`` seconds for it. Several
requests may be queued for one node; they are delivered **one at a time**
(Flower runs concurrent messages to one node in parallel and loses state),
each as soon as the node's previous reply has arrived.

With an ordered (virtual) clock, :meth:`Dispatcher.next_reply` returns the
reply of the earliest-due request, ties broken by send order, and moves the
clock to its due time; replies that arrive earlier in real time wait in a
buffer. So a run is reproducible from its seed whatever the real
scheduling. With the wall clock, replies are returned in arrival order.

A cancelled request never produces a reply. If it was already delivered, the
node finishes it (its state may reflect the work) and the reply is dropped on
arrival; until then nothing else is delivered to that node, but in virtual
time the node is free at once.

It polls ``grid.pull_messages`` (``send_and_receive`` sleeps for seconds).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from fl_app import protocol as P
from strategies.core.clock import Clock


@dataclass
class Request:
    """A piece of work for one node.

    Attributes:
        action: the message type, e.g. ``"train.forward"``.
        content: the message content.
        flops: the node's compute for it (FLOPs).
        bits_up: bits the node uploads in its reply.
        bits_down: bits it downloads; ``None``: the content's array payload.
        tag: anything the strategy wants back with the reply (e.g. the
            origin client and the hop of a relayed batch).
        metered: count the reply's payload in ``bytes_up`` (False for an
            evaluation-only upload that the algorithm itself would not send,
            such as a PSL client's model); what the request carries down
            (e.g. the gradient that ends the round) always counts in ``bytes_down``.
        d2d_bits: bits the node sends straight to another node over a
            device-to-device link (a RingSFL relay hop), charged at the
            strategy's D2D rate (:attr:`~strategies.core.base.SFLStrategy.d2d_bps`)
            instead of as uplink; 0 for ordinary requests. Flower has no
            node-to-node channel, so the bytes really travel through the
            ServerApp; only the virtual clock charges them as one D2D hop.
        wire: the content as sent (the downlink codec's encoding, :mod:`fl_app.cut.link`); None: ``content``.
    """

    action: str
    content: RecordDict
    flops: float = 0.0
    bits_up: float = 0.0
    bits_down: float | None = None
    tag: Any = None
    metered: bool = True
    d2d_bits: float = 0.0
    wire: RecordDict | None = None

    @property
    def payload_bytes(self) -> int:
        """Bytes of the arrays sent (what ``bytes_down`` counts): the :attr:`wire` content's, else ``content``'s."""
        sent = self.content if self.wire is None else self.wire
        return sum(P.record_bytes(r) for r in P.array_records(sent).values())

    @property
    def download_bits(self) -> float:
        """Bits the node downloads: ``bits_down``, or the array payload."""
        return 8.0 * self.payload_bytes if self.bits_down is None else self.bits_down


SCHEDULED, DONE, CANCELLED = "scheduled", "done", "cancelled"


@dataclass
class Reply:
    """A node's answer to a :class:`Request`.

    Attributes:
        pid: the client (partition id).
        request: the request it answers (its ``tag`` comes back here).
        content: the reply content; ``None`` when the client failed.
        due: the clock time (s) at which it was handled.
        seq: the request's send order.
    """

    pid: int
    request: Request
    content: RecordDict | None
    due: float
    seq: int

    @property
    def tag(self) -> Any:
        """The strategy's tag of the request."""
        return self.request.tag

    @property
    def action(self) -> str:
        """The request's message type."""
        return self.request.action

    @property
    def ok(self) -> bool:
        """False when the client failed (error reply or timeout)."""
        return self.content is not None


@dataclass(order=True)
class Pending:
    """One request that was sent and not yet answered.

    Attributes:
        due: virtual due time (s); ordering key.
        seq: send order; breaks ties.
        partition_id: the client it went to.
        request: the request.
        sent_at: clock time (s) when the strategy sent it.
        start: clock time (s) when the node starts it (after its earlier requests).
        message_id: Flower message id once delivered (None while queued).
        wall_sent: ``time.monotonic()`` at delivery (for timeouts).
        state: ``"scheduled"``, ``"done"`` or ``"cancelled"``.
    """

    due: float
    seq: int
    partition_id: int = field(compare=False)
    request: Request = field(compare=False)
    sent_at: float = field(compare=False, default=0.0)
    start: float = field(compare=False, default=0.0)
    message_id: str | None = field(compare=False, default=None)
    wall_sent: float = field(compare=False, default=0.0)
    state: str = field(compare=False, default=SCHEDULED)

    @property
    def action(self) -> str:
        """The request's message type."""
        return self.request.action


class Dispatcher:
    """Sends requests to partitions and hands back replies in clock order.

    Args:
        grid: the Flower grid.
        clock: time source; ``clock.ordered`` selects due-time order.
        node_of: partition id -> Flower node id (from the handshake).
        poll_interval: seconds between empty pulls.
        timeout: wall seconds a delivered message may take before it counts
            as failed (reported as a ``None`` reply).
    """

    def __init__(self, grid: Grid, clock: Clock, node_of: dict[int, int],
                 poll_interval: float = 0.002, timeout: float = 600.0) -> None:
        self.grid = grid
        self.clock = clock
        self.node_of = dict(node_of)
        self.poll_interval = poll_interval
        self.timeout = timeout
        self._seq = itertools.count()
        self._heap: list[Pending] = []
        self._live: dict[int, list[Pending]] = defaultdict(list)
        self._outbox: dict[int, deque[Pending]] = defaultdict(deque)
        self._wire: dict[int, Pending] = {}
        self._arrived: dict[int, Message] = {}
        self._arrival_order: list[Pending] = []
        self.exchanges = 0
        #: wall seconds spent pushing and waiting (client compute included in-process)
        self.seconds = 0.0
        #: while True (a checkpoint or resume, :meth:`drain`), nothing new is delivered
        self.held = False

    # ------------------------------------------------------------------ state
    def busy(self, partition_id: int) -> bool:
        """Whether requests to this partition are scheduled (delivered or queued)."""
        return bool(self._live[partition_id])

    @property
    def in_flight(self) -> int:
        """Number of partitions with scheduled requests."""
        return sum(1 for v in self._live.values() if v)

    @property
    def outstanding(self) -> int:
        """Number of scheduled requests, over all partitions."""
        return len(self._heap)

    def free_at(self, partition_id: int) -> float:
        """Clock time at which the partition finishes its scheduled requests (now if idle)."""
        live = self._live[partition_id]
        return max(self.clock.now(), live[-1].due) if live else self.clock.now()

    # ------------------------------------------------------------------ checkpoints
    #: attributes that make up the pending work (see :meth:`state_dict`)
    _STATE = ("_heap", "_live", "_outbox", "_wire", "_arrived", "_arrival_order", "exchanges", "seconds")

    def state_dict(self) -> dict[str, Any]:
        """The pending work, for a checkpoint: scheduled requests (queued, delivered, or answered and
        waiting in due-time order), the next sequence number and the counters. The grid, the clock and
        the node map are not included (the resumed run brings its own)."""
        nxt = next(self._seq)
        self._seq = itertools.count(nxt)
        return {"seq": nxt, **{k: getattr(self, k) for k in self._STATE}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (written after a :meth:`drain`: nothing on the wire) and deliver the
        queued requests.

        Raises:
            ValueError: the state has requests on the wire (a checkpoint not written after a drain).
        """
        if state["_wire"]:
            raise ValueError("the checkpoint has messages on the wire, which no node will answer now")
        self._seq = itertools.count(int(state["seq"]))
        for k in self._STATE:
            setattr(self, k, state[k])
        self.release()

    def drain(self, timeout: float) -> bool:
        """Deliver nothing new and wait for every message on the wire to be answered (the replies wait, in
        order, to be handled), so each node's state is whole: for a checkpoint. Then :meth:`release`.

        Returns:
            False when a node did not answer within ``timeout`` wall seconds (its message is still on the wire).
        """
        self.held = True
        end = time.monotonic() + timeout
        t0 = time.perf_counter()
        while self._wire and time.monotonic() < end:
            self._pull()
            if self._wire:
                time.sleep(self.poll_interval)
        self.seconds += time.perf_counter() - t0
        return not self._wire

    def arrived_errors(self) -> list[str]:
        """The reasons of the error replies that arrived and wait to be handled."""
        return [m.error.reason for m in self._arrived.values() if m.has_error()]

    def release(self) -> None:
        """Deliver again after :meth:`drain`: each node's next queued request goes out."""
        self.held = False
        for partition_id in list(self._outbox):
            self._deliver(partition_id)

    # ------------------------------------------------------------------ sending
    def send(self, partition_id: int, request: Request, duration: float) -> Pending:
        """Schedule a request: due ``duration`` seconds after the node's earlier requests.

        It is delivered at once if the node has nothing in flight, else when
        the node's previous reply arrives.

        Raises:
            KeyError: unknown partition.
        """
        if partition_id not in self.node_of:
            raise KeyError(f"unknown partition {partition_id}")
        now = self.clock.now()
        start = self.free_at(partition_id)
        pending = Pending(start + max(0.0, duration), next(self._seq), partition_id, request, now, start)
        heapq.heappush(self._heap, pending)
        self._live[partition_id].append(pending)
        self._outbox[partition_id].append(pending)
        t0 = time.perf_counter()
        self._deliver(partition_id)
        self.seconds += time.perf_counter() - t0
        return pending

    def _deliver(self, partition_id: int) -> None:
        """Push the node's next queued request if nothing is on the wire to it (and not :attr:`held`)."""
        if self.held or partition_id in self._wire or not self._outbox[partition_id]:
            return
        pending = self._outbox[partition_id].popleft()
        request = pending.request
        msg = Message(request.content if request.wire is None else request.wire, self.node_of[partition_id],
                      request.action)
        (pending.message_id,) = list(self.grid.push_messages([msg]))
        pending.wall_sent = time.monotonic()
        self._wire[partition_id] = pending

    def cancel(self, partition_id: int) -> list[Pending]:
        """Cancel every scheduled request of a partition; returns them.

        Queued ones are dropped; a delivered one's reply is dropped on
        arrival. The node is free at once in virtual time.
        """
        cancelled = list(self._live[partition_id])
        for pending in cancelled:
            self.cancel_pending(pending)
        return cancelled

    def cancel_pending(self, pending: Pending) -> None:
        """Cancel one scheduled request (no-op if it is done or cancelled)."""
        if pending.state != SCHEDULED:
            return
        pending.state = CANCELLED
        self._heap.remove(pending)
        heapq.heapify(self._heap)
        self._live[pending.partition_id].remove(pending)
        if pending in self._outbox[pending.partition_id]:
            self._outbox[pending.partition_id].remove(pending)
        self._arrived.pop(pending.seq, None)
        if pending in self._arrival_order:
            self._arrival_order.remove(pending)

    # ------------------------------------------------------------------ receiving
    def _pull(self) -> None:
        waiting = {p.message_id: p for p in self._wire.values()}
        if not waiting:
            return
        for reply in self.grid.pull_messages(list(waiting)):
            pending = waiting[reply.metadata.reply_to_message_id]
            del self._wire[pending.partition_id]
            if pending.state == SCHEDULED:
                self._arrived[pending.seq] = reply
                self._arrival_order.append(pending)
            self._deliver(pending.partition_id)

    def _pop(self, pending: Pending) -> tuple[Pending, Message | None]:
        self._heap.remove(pending)
        heapq.heapify(self._heap)
        self._live[pending.partition_id].remove(pending)
        pending.state = DONE
        reply = self._arrived.pop(pending.seq, None)
        if pending in self._arrival_order:
            self._arrival_order.remove(pending)
        self.clock.advance_to(pending.due)
        self.exchanges += 1
        return pending, reply

    def _timed_out(self) -> Pending | None:
        """The first scheduled request of a node whose delivered message exceeded the timeout."""
        now = time.monotonic()
        for pid, wired in self._wire.items():
            if now - wired.wall_sent > self.timeout and self._live[pid]:
                return self._live[pid][0]
        return None

    def next_reply(self, until: float | None = None) -> tuple[Pending, Message | None] | None:
        """Wait for the next reply to handle.

        Args:
            until: a clock time (s). With the virtual clock, return None when
                the earliest-due request is due after it; with the wall
                clock, when the clock passes it with no reply.

        Returns:
            ``(pending, reply)``; ``reply`` is ``None`` when the node timed
            out. Check ``reply.has_error()`` for a node's error reply.

        Raises:
            RuntimeError: nothing is scheduled.
        """
        if not self._heap:
            raise RuntimeError("next_reply() with no request scheduled")
        t0 = time.perf_counter()
        try:
            while True:
                self._pull()
                if self.clock.ordered:
                    head = self._heap[0]
                    if until is not None and head.due > until:
                        return None
                    if head.seq in self._arrived:
                        return self._pop(head)
                elif self._arrival_order:
                    return self._pop(self._arrival_order[0])
                elif until is not None and self.clock.now() >= until:
                    return None
                late = self._timed_out()
                if late is not None:
                    return self._pop(late)
                time.sleep(self.poll_interval)
        finally:
            self.seconds += time.perf_counter() - t0
