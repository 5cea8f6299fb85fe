"""Vertical split learning: parties holding different features of the same samples.

* :mod:`fl_app.vertical.psi`: private set intersection of the parties' sample IDs.
* :mod:`fl_app.vertical.models`: bottom models per party, the join, the top model, and their steps.
* :mod:`fl_app.vertical.party`: a party's side of the protocol (the ``query.vertical`` handler, its ClientApp).

Imports: ``fl_app`` only: :mod:`fl_app.run`, :mod:`fl_app.data`, :mod:`fl_app.privacy`,
:mod:`fl_app.protocol`, and :mod:`fl_app.client`'s checkpoint handlers (``query.checkpoint``, ``query.restore``),
which import nothing of this package.
"""
