"""The bottom floor: the ClientApp and what the server and the clients share, one concept per sub-package.

* :mod:`fl_app.client_app`: the ClientApp (Flower's entry point); its handlers are in :mod:`fl_app.client`.
* :mod:`fl_app.run`: the run's configuration: its keys (:mod:`~fl_app.run.options`), the resolved
  configuration (:mod:`~fl_app.run.config`), the strategy catalogue, numerics and device modes, the one error
  type for bad input, and the reading of untrusted run directories.
* :mod:`fl_app.learning`: the learning task: dataset, partitions and model put together
  (:mod:`~fl_app.learning.task`), training steps, zeroth-order estimates, block costs, model averaging.
* :mod:`fl_app.cut`: what crosses the cut on the wire: the link's seam and the codecs.
* :mod:`fl_app.privacy`: the defences a client applies (activations, labels, Marvell) and client-side models
  hidden from the server.
* :mod:`fl_app.vertical`: vertical split learning's parties, models and private set intersection.
* :mod:`fl_app.protocol` (the message protocol), :mod:`fl_app.models` (the splittable models),
  :mod:`fl_app.data` (datasets and partitions), :mod:`fl_app.session` (the session transport's client side).

Imports: ``fl_app`` only (and third-party packages); nothing from ``strategies``, ``simulation`` or
``benchmarks`` (``tests/test_architecture.py``). Inside the floor the sub-packages import without a cycle:
``run`` imports no other sub-package; ``models`` and ``data`` import ``run``; ``learning`` imports ``run``,
``models``, ``data`` and ``protocol``; ``cut`` and ``privacy`` import those below them; ``client``,
``vertical`` and :mod:`fl_app.client_app` sit on top.
"""
