"""The algorithms: one module (or one package, with its helpers) per published system or baseline.

Imports: ``fl_app`` and ``strategies``; nothing from ``simulation`` or ``benchmarks``.
"""
