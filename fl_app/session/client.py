"""The client side of a session: one Flower message that serves a node's requests until the session closes.

docs/explanation/design.md §4 ("The session transport"). The ServerApp opens a session
with one ``query.session`` message per node. Its :data:`SESSION` config
record holds the endpoint's ``address`` (``host:port``), the session id, the
per-session ``secret`` and, with TLS, the CA certificate (PEM) that signed
the endpoint's certificate: the message travels over Flower's TLS and
node-authenticated channel, so the secret and the CA reach only this node.

:func:`serve_session` connects to the endpoint with grpcio, says hello with
the secret, then runs each request frame through the ClientApp's own
handlers (``handle``, the ClientApp itself) with this message's
:class:`~flwr.app.Context`, and sends each reply back. The handlers keep
the node's state in ``context.state`` as for any message, and, because the
context is the same object for the whole session, the node's live models
and graphs (:mod:`fl_app.client.live`) stay in memory between requests. When the
server closes the session the handler returns; Flower then stores the
context, so ``context.state`` is written back once per session.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

from flwr.app import ConfigRecord, Context, Message, RecordDict

from fl_app.session.wire import MAX_FRAME_BYTES, decode_frame, encode_frame

#: The message type that opens a session.
OPEN_ACTION = "query.session"
#: The config record of the opening message (and of its reply).
SESSION = "session"
#: The gRPC method the endpoint serves: one bidirectional stream of frames per session.
METHOD = "/sflower.Session/Open"
#: Channel options both sides use: frames up to :data:`MAX_FRAME_BYTES`; keepalive pings every 10 s.
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_FRAME_BYTES),
                   ("grpc.max_receive_message_length", MAX_FRAME_BYTES),
                   ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
                   ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]


class SessionRefused(RuntimeError):
    """The endpoint refused this session (wrong or replayed secret, unknown or closed session)."""


def serve_session(msg: Message, context: Context, handle: Callable[[Message, Context], Message]) -> Message:
    """Serve one session (module docstring); the reply counts the requests served.

    Args:
        msg: the ``query.session`` message; its :data:`SESSION` record holds
            ``address``, ``session``, ``secret``, ``tls`` and ``ca`` (PEM).
        context: the node's context, used for every request of the session.
        handle: runs one request message and returns its reply (the ClientApp).

    Raises:
        SessionRefused: the endpoint refused the session.
        grpc.RpcError: the stream broke (the server went away).
        KeyError: the opening message lacks a field.
    """
    import grpc  # a Flower dependency

    cfg = msg.content.config_records[SESSION]
    address, tls = str(cfg["address"]), bool(cfg["tls"])
    if tls:
        creds = grpc.ssl_channel_credentials(root_certificates=str(cfg["ca"]).encode())
        channel = grpc.secure_channel(address, creds, options=CHANNEL_OPTIONS)
    else:
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    outbox: queue.Queue[bytes | None] = queue.Queue()
    outbox.put(encode_frame({"kind": "hello", "session": str(cfg["session"]), "secret": str(cfg["secret"])}))
    served = 0
    try:
        frames = channel.stream_stream(METHOD)(_drain(outbox))
        for frame in frames:
            head, content = decode_frame(frame)
            kind = head.get("kind")
            if kind == "request":
                outbox.put(_run_request(head, content or RecordDict(), msg, context, handle))
                served += 1
            elif kind == "close":
                break
            elif kind == "refused":
                raise SessionRefused(f"the endpoint refused session {cfg['session']}: {head.get('reason')}")
    finally:
        outbox.put(None)
        channel.close()
    return Message(RecordDict({SESSION: ConfigRecord({"served": served})}), reply_to=msg)


def _drain(outbox: queue.Queue[bytes | None]) -> Iterator[bytes]:
    """The frames this node sends, until None."""
    while (frame := outbox.get()) is not None:
        yield frame


def _run_request(head: dict, content: RecordDict, opening: Message, context: Context,
                 handle: Callable[[Message, Context], Message]) -> bytes:
    """One request through the ClientApp; its reply frame (an ``error`` field when the handler failed)."""
    request = Message(content, reply_to=opening)  # the opening message's run and nodes, no task identity needed
    request.metadata.message_type = str(head["action"])
    try:
        reply = handle(request, context)
    except Exception as exc:  # noqa: BLE001 - the server excludes the node with this reason
        return encode_frame({"kind": "reply", "id": head["id"], "error": f"{type(exc).__name__}: {exc}"})
    if reply.has_error():
        return encode_frame({"kind": "reply", "id": head["id"], "error": reply.error.reason})
    return encode_frame({"kind": "reply", "id": head["id"]}, reply.content)
