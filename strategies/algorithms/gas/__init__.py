"""GAS (gas.pdf): the strategy, its activation generation, its progress weights, metrics and shared momentum.

Imports: ``fl_app`` and ``strategies``; nothing from ``simulation`` or ``benchmarks``.
"""
