"""Reply messages made by a grid that answers without Flower's SuperLink (the in-process and session grids)."""

from __future__ import annotations

from flwr.app import Error, Message, RecordDict


def reply_message(request: Message, message_id: str, answer: RecordDict | Error) -> Message:
    """A reply to ``request`` that the grid pushed under ``message_id``: content, or an error reply.

    The dispatcher matches replies by ``metadata.reply_to_message_id``, so the
    request's id is set to ``message_id`` first, as Flower's SuperLink would.
    """
    request.metadata.__dict__["_message_id"] = message_id
    reply = Message(answer, reply_to=request)
    reply.metadata.__dict__["_reply_to_message_id"] = message_id
    return reply
