"""The middle floor: the server side of every algorithm, whatever carries its messages and however time passes.

:mod:`strategies.core` is the machinery every strategy shares (the base classes and their hooks, the loop
shapes, the exchange, the dispatcher, membership, checkpoints, the clock interface, the registry);
:mod:`strategies.algorithms` holds the algorithms, one module or package per family.

Imports: ``fl_app`` and ``strategies``; nothing from ``simulation`` or ``benchmarks``
(``tests/test_architecture.py``).
"""
