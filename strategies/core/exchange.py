"""The exchange: sending requests, receiving and gathering replies in clock order, and metering them.

:class:`Exchange` wraps the :class:`~strategies.core.dispatcher.Dispatcher` (made
once the handshake is done): each request sent gets its duration from the
``duration`` callback (the strategy's timing model, :func:`request_seconds`,
with a per-client draw counter) and its content's arrays count in ``bytes_down``; each reply is
checked by the ``validate`` callback and counts in ``bytes_up`` when its
request is metered. A failed or malformed reply excludes its client
(:meth:`Exchange.exclude`: recorded in the :class:`~strategies.core.membership.Membership`,
its work cancelled, the ``on_failure`` callback told). :class:`~strategies.core.base.SFLStrategy` keeps one and delegates
``send``, ``receive``, ``gather``, ``gather_replies`` and ``cancel`` to it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import RecordDict

from fl_app import protocol as P
from fl_app.run.config import RunConfig
from fl_app.cut.link import LinkCodecs, decode
from strategies.core.clock import Clock, Timing
from strategies.core.dispatcher import SCHEDULED, Dispatcher, Pending, Reply, Request
from strategies.core.client_states import last_line as _last_line
from strategies.core.membership import Membership
from strategies.core.errors import NODE_UNAVAILABLE, NodeLostError
from strategies.core.validation import ReplyProblem

log = logging.getLogger("sflower")


def request_seconds(timing: Timing, d2d_bps: float, pid: int, request: Request, draw: int | None) -> float:
    """Compute and client-server transfer time of ``request`` on client ``pid`` (``draw``: its straggler draw,
    None: the mean), plus its D2D hop (``request.d2d_bits`` at ``d2d_bps`` bits/s) when it has one."""
    seconds = timing.duration(pid, request.flops, request.bits_up, request.download_bits, draw)
    if request.d2d_bits:
        seconds += timing.link_duration(request.d2d_bits, d2d_bps)
    return seconds


class Exchange:
    """Metered, timed messaging with the clients (see the module docstring).

    Args:
        clock: the run's clock (a straggler deadline moves it).
        duration: ``(pid, request, draw) -> seconds`` (``draw`` None: the expected value).
        validate: ``(pid, request, content) -> problem or None`` for each successful reply.
        membership: the run's clients, where an exclusion is recorded.
        on_failure: ``(pid, action, reason) -> None``, told after a client's exclusion.
    """

    def __init__(self, clock: Clock, duration: Callable[[int, Request, int | None], float],
                 validate: Callable[[int, Request, RecordDict], ReplyProblem | None],
                 membership: Membership, on_failure: Callable[[int, str, str], None]) -> None:
        self.clock = clock
        self.duration, self.validate = duration, validate
        self.membership, self.on_failure = membership, on_failure
        self.dispatcher: Dispatcher | None = None
        self.bytes_up = 0
        self.bytes_down = 0
        self.draws: dict[int, int] = defaultdict(int)
        #: replies to earlier requests that a later gather received (see :meth:`gather_replies`)
        self.stray_replies: list[Reply] = []
        #: told the dispatcher's ``exchanges`` after each reply received, failed ones too (the progress bar)
        self.on_reply: Callable[[int], None] | None = None
        #: the run's codecs at the cut (:mod:`fl_app.cut.link`); None: float32 both ways, nothing encoded
        self.links: LinkCodecs | None = None
        #: ``node-loss=rollback``: a client whose node is lost raises :class:`NodeLostError` instead of being excluded
        self.roll_back = False
        #: ``(pid, content, request) -> None``, told of every valid reply, decoded as the server uses it, with
        #: the request it answers (``privacy-record``: :class:`simulation.privacy.record.ReceivedActivations`)
        self.tap: Callable[[int, RecordDict, Request], None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A checkpoint saves the dispatcher by its own ``state_dict``; the resumed run makes a new one (and
        sets its own :attr:`on_reply`)."""
        return {k: v for k, v in vars(self).items() if k not in ("dispatcher", "on_reply", "tap")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.dispatcher, self.on_reply, self.tap = None, None, None

    def send(self, pid: int, request: Request) -> Pending:
        """Send work to a client; it is due after its device's compute + transfer time.

        The duration comes from the timing model: ``request.flops`` of
        compute, ``request.bits_up`` of upload and ``request.bits_down`` (by
        default the content's array payload, as the downlink codec encodes it) of download. Requests to a busy
        client queue behind its earlier ones (one message in flight per node).

        Returns:
            the dispatcher's :class:`~strategies.core.dispatcher.Pending` entry.
        """
        assert self.dispatcher is not None
        if self.links is not None:  # the one place the server encodes what goes down (fl_app.cut.link)
            request.wire = self.links.encode(request.content, up=False, owner=pid)
        self.bytes_down += request.payload_bytes
        draw = self.draws[pid]
        self.draws[pid] += 1
        return self.dispatcher.send(pid, request, self.duration(pid, request, draw))

    def exclude(self, pending: Pending, reason: str, non_finite: bool = False) -> Reply:
        """Exclude a failed client: record it in the membership, cancel its work, tell ``on_failure``;
        the empty reply (``content=None``).

        Raises:
            DivergedError: no live client is left and every exclusion was for
                non-finite values (the run itself diverged).
            RunFailedError: no live client is left otherwise.
        """
        assert self.dispatcher is not None
        pid = pending.partition_id
        self.membership.exclude(pid, f"{pending.action}: {reason}", non_finite)
        self.dispatcher.cancel(pid)
        self.on_failure(pid, pending.action, reason)
        self.membership.check_any_left(pid, reason)
        return Reply(pid, pending.request, None, pending.due, pending.seq)

    def readmit(self, cfg: RunConfig) -> list[int]:
        """Re-admit excluded clients whose SuperNode came back (:meth:`Membership.readmit
        <strategies.core.membership.Membership.readmit>`); their messages go to the new node. None before the
        handshake."""
        if self.dispatcher is None:
            return []
        back = self.membership.readmit(self.dispatcher.grid, cfg)
        for pid in back:
            self.dispatcher.node_of[pid] = self.membership.clients[pid].node_id
        return back

    def receive(self, until: float | None = None) -> Reply | None:
        """The next reply in clock order (see :meth:`Dispatcher.next_reply`).

        A failed client (error reply, timeout, or a reply that
        ``validate`` rejects) gives a :class:`Reply` with ``content=None``
        from :meth:`exclude`.

        Raises:
            NodeLostError: with :attr:`roll_back`, a client's node is lost (the reason holds
                :data:`~strategies.core.errors.NODE_UNAVAILABLE`).
            DivergedError: the last live client was excluded and every
                exclusion was for non-finite values.
            RunFailedError: the last live client was excluded otherwise.

        Args:
            until: return None instead of a reply due after this clock time.
        """
        assert self.dispatcher is not None
        got = self.dispatcher.next_reply(until)
        if got is None:
            return None
        if self.on_reply is not None:
            self.on_reply(self.dispatcher.exchanges)
        pending, reply = got
        pid = pending.partition_id
        if reply is None or reply.has_error():
            reason = "timed out" if reply is None else _last_line(reply.error.reason)
            if self.roll_back and NODE_UNAVAILABLE in reason.lower():
                raise NodeLostError(pid, reason)
            log.warning("client %d failed on %s (%s); excluded from the run", pid, pending.action, reason)
            return self.exclude(pending, reason, False)
        content = reply.content
        sent = sum(P.record_bytes(r) for r in P.array_records(content).values()) if pending.request.metered else 0
        if self.links is not None:  # the one place the server decodes what came up (fl_app.cut.link)
            content = decode(content)
        problem = self.validate(pid, pending.request, content)
        if problem is not None:
            log.warning("client %d sent a malformed reply to %s (%s); excluded from the run",
                        pid, pending.action, problem.reason)
            return self.exclude(pending, f"malformed reply: {problem.reason}", problem.non_finite)
        self.bytes_up += sent  # as encoded on the wire, scales and indices included
        if self.tap is not None:
            self.tap(pid, content, pending.request)
        return Reply(pid, pending.request, content, pending.due, pending.seq)

    def gather_replies(self, requests: Iterable[tuple[int, Request]], *, first: int | None = None,
                       deadline: float | None = None, rest: str = "keep") -> list[Reply]:
        """Send requests and wait for their replies, in clock order.

        Several requests may go to one client: they queue (see :meth:`send`).

        Args:
            requests: ``(pid, request)`` pairs, sent in this order.
            first: return once this many have succeeded (the first ``first``
                in virtual completion order).
            deadline: a clock time (s): stop waiting for replies due after it;
                the clock then moves to the deadline (a straggler cut-off).
            rest: what happens to requests still scheduled on return:
                ``"keep"`` (their replies come later, through :meth:`receive`
                or as :attr:`stray_replies` of a later gather) or ``"cancel"``.

        Returns:
            the successful replies, in the order they were handled. Replies to
            earlier requests that arrive meanwhile go to :attr:`stray_replies`.

        Raises:
            ValueError: ``rest`` is neither ``"keep"`` nor ``"cancel"``.
        """
        if rest not in ("keep", "cancel"):
            raise ValueError(f"rest must be 'keep' or 'cancel', got {rest!r}")
        assert self.dispatcher is not None
        mine = [self.send(pid, req) for pid, req in requests]
        seqs = {p.seq for p in mine}
        out: list[Reply] = []
        while any(p.state == SCHEDULED for p in mine) and (first is None or len(out) < first):
            reply = self.receive(until=deadline)
            if reply is None:
                self.clock.advance_to(deadline)
                break
            if reply.seq not in seqs:
                self.stray_replies.append(reply)
            elif reply.ok:
                out.append(reply)
        if rest == "cancel":
            for pending in mine:
                self.dispatcher.cancel_pending(pending)
        return out

    def gather(self, requests: Mapping[int, Request], **kwargs: Any) -> dict[int, RecordDict]:
        """One request per client, then wait (a synchronous step); see :meth:`gather_replies`.

        Returns:
            ``pid -> reply content`` for the clients that succeeded. The clock
            ends at the latest due time among those waited for.
        """
        return {r.pid: r.content for r in self.gather_replies(requests.items(), **kwargs)}

    def cancel(self, pid: int) -> int:
        """Cancel every scheduled request of client ``pid``; returns how many."""
        assert self.dispatcher is not None
        return len(self.dispatcher.cancel(pid))
