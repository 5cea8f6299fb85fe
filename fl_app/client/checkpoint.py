"""The ClientApp's checkpoint handlers: ``query.checkpoint`` and ``query.restore``.

docs/explanation/design.md §4. A node keeps all its state in ``context.state``
(:mod:`fl_app.client.state`), so its whole state is that one RecordDict:
``query.checkpoint`` returns it as the reply's records, and
``query.restore`` replaces it with the request's records. The ServerApp
sends them outside the dispatcher's queue, when nothing else is on the wire
to the node (:mod:`strategies.core.client_states`), so the state is whole:
the same on every engine (in-process, Ray's virtual SuperNodes, SuperNodes
on devices, over Flower's messages or a session). The state travels sealed
(:mod:`fl_app.client.sealing`): AES-GCM under a key that stays on the node, so
the server stores and returns a blob it cannot read.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from fl_app import protocol as P
from fl_app.client.node import Node
from fl_app.client.sealing import key_path, node_key, seal, unseal
from fl_app.client.state import CHECKPOINT_IDENTITY
from fl_app.client.live import forget


def _key_and_partition(context: Context) -> tuple[bytes, int]:
    """The node's checkpoint key (made on first use, :func:`~fl_app.client.sealing.node_key`) and its partition id:
    its :class:`~fl_app.client.node.Node`'s, or for a node without a task (a vertical party) those its
    :data:`~fl_app.client.state.CHECKPOINT_IDENTITY` record names."""
    if CHECKPOINT_IDENTITY in context.state:
        ident = context.state[CHECKPOINT_IDENTITY]
        run_dir, pid = str(ident["run-dir"]), int(ident["partition-id"])
    else:
        node = Node(context)
        run_dir, pid = str(node.cfg.get("output-dir")), node.partition_id
    return node_key(key_path(context, run_dir, pid)), pid


def query_checkpoint(msg: Message, context: Context) -> Message:
    """``query.checkpoint``: reply with every record of the node's ``context.state``, sealed
    (:func:`~fl_app.client.sealing.seal`: one ``sealed`` record the server cannot read).

    Raises:
        SealError: the node's key cannot be read or made (one line, as the error reply's reason).
    """
    key, pid = _key_and_partition(context)
    return Message(seal(RecordDict(dict(context.state.items())), key, pid), reply_to=msg)


def query_restore(msg: Message, context: Context) -> Message:
    """``query.restore``: replace the node's ``context.state`` with the state sealed in the request (opened with
    the node's key, :func:`~fl_app.client.sealing.unseal`), and drop its live cache (:mod:`fl_app.client.live`), which
    rebuilds its models from the restored state. Replies ``info`` ``{ok: True}``.

    Raises:
        SealError: the request is not a state this node sealed, or was changed (one line); the node's state
            is then left as it was.
    """
    secret, pid = _key_and_partition(context)
    restored = unseal(msg.content, secret, pid)
    forget(context.state)
    for key in list(context.state.keys()):
        del context.state[key]
    for key, record in restored.items():
        context.state[key] = record
    return Message(RecordDict({P.INFO: ConfigRecord({P.INFO_OK: True})}), reply_to=msg)
