"""The ClientApp's checkpoint handlers: ``query.checkpoint`` and ``query.restore``.

docs/explanation/design.md §4. A node keeps all its state in ``context.state``
(:mod:`fl_app.client.state`), so its whole state is that one RecordDict:
``query.checkpoint`` returns it as the reply's records, and
``query.restore`` replaces it with the request's records. The ServerApp
sends them outside the dispatcher's queue, when nothing else is on the wire
to the node (:mod:`strategies.core.client_states`), so the state is whole:
the same on every engine (in-process, Ray's virtual SuperNodes, SuperNodes
on devices, over Flower's messages or a session).
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from fl_app import protocol as P
from fl_app.live import forget


def query_checkpoint(msg: Message, context: Context) -> Message:
    """``query.checkpoint``: reply with every record of the node's ``context.state`` (the records themselves;
    the reply is encoded or copied on its way to the server, and the node replaces rather than mutates them)."""
    return Message(RecordDict(dict(context.state.items())), reply_to=msg)


def query_restore(msg: Message, context: Context) -> Message:
    """``query.restore``: replace the node's ``context.state`` with the request's records, and drop its live cache
    (:mod:`fl_app.live`), which rebuilds its models from the restored state. Replies ``info`` ``{ok: True}``."""
    forget(context.state)
    for key in list(context.state.keys()):
        del context.state[key]
    for key, record in msg.content.items():
        context.state[key] = record
    return Message(RecordDict({P.INFO: ConfigRecord({P.INFO_OK: True})}), reply_to=msg)
