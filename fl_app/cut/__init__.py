"""What crosses the cut: what a message's tensors become on the wire.

* :mod:`fl_app.cut.link`: the seam at the cut, one place per side (codecs on, bytes counted).
* :mod:`fl_app.cut.compression`: the codecs (fp16/bf16 casts, int8 quantisation, top-k sparsification).

Imports: ``fl_app`` only: :mod:`fl_app.run`, :mod:`fl_app.models`, :mod:`fl_app.learning` and
:mod:`fl_app.protocol`.
"""
