"""The learning task and its primitives, shared by the ClientApp and the server.

* :mod:`fl_app.learning.task`: the task of a run (dataset, partitions, splittable model).
* :mod:`fl_app.learning.training`: optimizers, training steps, batches, evaluation.
* :mod:`fl_app.learning.zo`: zeroth-order (SPSA) estimates.
* :mod:`fl_app.learning.costs`: compute and transfer figures of any block range, for the virtual clock.
* :mod:`fl_app.learning.averaging`: the weighted mean of model states.

Imports: ``fl_app`` only: :mod:`fl_app.run`, :mod:`fl_app.models`, :mod:`fl_app.data` and
:mod:`fl_app.protocol`.
"""
