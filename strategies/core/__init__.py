"""The runtime every strategy shares: the base classes, the loops, the exchange, the dispatcher, membership, checkpoints, validation, the clock and the registry.

Imports: ``fl_app`` and ``strategies``; nothing from ``simulation`` or ``benchmarks``.
"""
