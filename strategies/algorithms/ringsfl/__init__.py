"""RingSFL (ringsfl.pdf): the strategy, its ring schedule and one round of relays.

Imports: ``fl_app`` and ``strategies``; nothing from ``simulation`` or ``benchmarks``.
"""
