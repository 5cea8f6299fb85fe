"""The ClientApp's parts, by concern; the ``ClientApp`` object itself is :mod:`fl_app.client_app`.

* :mod:`~fl_app.client.state` -- the layout of a node's ``context.state``.
* :mod:`~fl_app.client.slots` -- model slots (:class:`~fl_app.client.slots.Slot`).
* :mod:`~fl_app.client.node` -- the node (:class:`~fl_app.client.node.Node`): identity, task, data; the handshake.
* :mod:`~fl_app.client.split_handlers`, :mod:`~fl_app.client.zo_handlers`,
  :mod:`~fl_app.client.fl_handlers` -- the message handlers.
* :mod:`~fl_app.client.warm_up` -- a long-lived client process's one-time imports, in the background.

Imports: ``fl_app`` only (the bottom floor); nothing from ``strategies``, ``simulation`` or ``benchmarks``.
"""
