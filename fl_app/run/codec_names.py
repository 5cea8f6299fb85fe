"""The names of the link codecs, the values of ``compress-up`` and ``compress-down``: the one list.

:mod:`fl_app.cut.compression` implements them (and re-exports :data:`CODECS`);
:mod:`fl_app.run.options` declares the two keys with them as choices. The list
lives here, apart from the codecs' NumPy code, because the option
declarations import with the standard library alone.
"""

#: Every codec name; ``none`` (float32, lossless) first.
CODECS: tuple[str, ...] = ("none", "fp16", "bf16", "int8", "int8-channel", "topk")
