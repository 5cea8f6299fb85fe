"""The session transport's client side and its frames (docs/explanation/design.md §4, "The session transport").

* :mod:`fl_app.session.wire`: a RecordDict and a header as bytes, and back;
* :mod:`fl_app.session.client`: the ``query.session`` handler, which connects
  back to the ServerApp's endpoint and serves every request of the session
  with the ClientApp's own handlers.

The server side (the endpoint and the grid that routes requests through it)
is :mod:`simulation.session`.

Imports: ``fl_app`` only (the bottom floor); nothing from ``strategies``, ``simulation`` or ``benchmarks``.
"""
