"""The ClientApp: the client side of the message protocol (docs/explanation/design.md §4).

This module holds the ``ClientApp`` object (``pyproject.toml``'s
``clientapp = "fl_app.client_app:app"``) and routes each message type to its
handler. The handlers and what they work on live in :mod:`fl_app.client`, by
concern:

=====================================  ==========================================================
:mod:`fl_app.client.state`             the layout of a node's ``context.state`` and its keys
:mod:`fl_app.client.slots`             model slots: a node's named models (weights, optimizer,
                                       accumulator, last batch)
:mod:`fl_app.client.node`              the node: partition id, task, data, device; ``query.info``
:mod:`fl_app.client.split_handlers`    ``train.forward``, ``train.backward``, ``train.step``
:mod:`fl_app.client.zo_handlers`       ``train.zo_forward``, ``train.zo_update`` (MU-SplitFed)
:mod:`fl_app.client.fl_handlers`       ``train.fit`` (FL baselines) and ``evaluate``
:mod:`fl_app.client.checkpoint`        ``query.checkpoint``, ``query.restore``: the node's whole state
:mod:`fl_app.client.audit`             ``privacy-record``: what each reply carried of the labels
:mod:`fl_app.client.hidden_handlers`   ``query.hidden``: key agreement, federated evaluation (``hide-client-models``)
:mod:`fl_app.session.client`           ``query.session``: a session's requests, through this app
:mod:`fl_app.vertical.party`           ``query.vertical``: a vertical party (vertical split learning)
=====================================  ==========================================================
"""

from __future__ import annotations

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fl_app.client.audit import label_audit
from fl_app.client.checkpoint import query_checkpoint, query_restore
from fl_app.client.fl_handlers import evaluate, train_fit
from fl_app.client.hidden_handlers import query_hidden
from fl_app.client.node import query_info
from fl_app.client.split_handlers import train_backward, train_forward, train_step
from fl_app.client.warm_up import warmed
from fl_app.client.zo_handlers import train_zo_forward, train_zo_update
from fl_app.cut.link import client_mod
from fl_app.session.client import serve_session
from fl_app.vertical.party import query_vertical


def one_torch_thread(msg: Message, context: Context, call_next) -> Message:
    """Flower mod: run the handler with one intra-op torch thread, then restore.

    Ray actors run with one thread; pinning it everywhere makes the client's
    floating-point results (and so whole runs) bit-identical across engines.
    """
    old = torch.get_num_threads()
    if old == 1:
        return call_next(msg, context)
    torch.set_num_threads(1)
    try:
        return call_next(msg, context)
    finally:
        torch.set_num_threads(old)


# label_audit (outermost: the replies as they leave; fl_app.client.audit), client_mod: the cut's codecs (fl_app.cut.link)
app = ClientApp(mods=[label_audit, one_torch_thread, client_mod])
app.query("info")(query_info)
app.train("forward")(train_forward)
app.train("backward")(train_backward)
app.train("step")(train_step)
app.train("zo_forward")(train_zo_forward)
app.train("zo_update")(train_zo_update)
app.train("fit")(train_fit)
app.evaluate()(evaluate)
app.query("checkpoint")(query_checkpoint)
app.query("restore")(query_restore)
app.query("hidden")(query_hidden)
app.query("vertical")(query_vertical)  # a vertical party's operations (fl_app.vertical.party)


@app.query("session")
def session(msg: Message, context: Context) -> Message:
    """``query.session``: serve every request of a session through this app (:mod:`fl_app.session.client`),
    once this process's one-time imports, started when the session opens, are done
    (:func:`fl_app.client.warm_up.warmed`)."""
    return serve_session(msg, context, warmed(app))
