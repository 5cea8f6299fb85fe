"""The bottom floor: the ClientApp and what the server and the clients share.

The ClientApp (:mod:`fl_app.client_app`, its handlers in :mod:`fl_app.client`), the message protocol
(:mod:`fl_app.protocol`), the splittable models (:mod:`fl_app.models`), datasets and partitions
(:mod:`fl_app.data`), the session transport's client side (:mod:`fl_app.session`), and the loose modules
both sides use: the run configuration and its keys (:mod:`fl_app.config`, :mod:`fl_app.options`), the
strategy catalogue (:mod:`fl_app.plugins`), training steps (:mod:`fl_app.training`), zeroth-order
estimates (:mod:`fl_app.zo`), block costs (:mod:`fl_app.costs`), the cut's codecs
(:mod:`fl_app.compression`, :mod:`fl_app.link`), the defences (:mod:`fl_app.privacy`,
:mod:`fl_app.label_defence`), the live-model cache (:mod:`fl_app.live`), devices and numerics.

Imports: ``fl_app`` only (and third-party packages); nothing from ``strategies``, ``simulation`` or
``benchmarks`` (``tests/test_architecture.py``).
"""
