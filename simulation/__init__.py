"""The top floor of the installed package: putting a run together, carrying its messages, timing it, deploying it, measuring it.

The ServerApp (:mod:`simulation.server_app`), the engines (:mod:`simulation.engine`,
:mod:`simulation.ray_engine`), virtual time (:mod:`simulation.timing`), the session transport's server
side (:mod:`simulation.session`), the loopback deployment (:mod:`simulation.deploy`), a run's outputs and
reports (:mod:`simulation.outputs`), the leakage measurements (:mod:`simulation.privacy`), sweeps, statistics and the ``sflower`` command line
(:mod:`simulation.cli`).

Imports: ``fl_app``, ``strategies`` and ``simulation``; nothing from ``benchmarks``, the floor above it,
which ``sflower bench`` starts as a child program (``tests/test_architecture.py``).
"""
