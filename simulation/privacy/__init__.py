"""Privacy measurements: what the server received and holds (:mod:`.record`), and the attacks on it: the decoder
(:mod:`.inversion`), norm/direction scoring (:mod:`.label_leakage`), the strongest known attacks
(:mod:`.matching`, :mod:`.update_labels`, :mod:`.clustering`, :mod:`.whitebox`; the worst case:
:mod:`.strongest`), all run by :mod:`.attack` (``sflower attack RUN_DIR``).

Imports: ``fl_app``, ``strategies`` and ``simulation``; nothing from ``benchmarks``.
"""
