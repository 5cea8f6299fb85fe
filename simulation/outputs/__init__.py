"""What a run leaves and what is built from it, one concern a module.

* :mod:`~simulation.outputs.records` -- the run directory's records (``config.json``, ``metrics.csv``,
  ``summary.json``, ``accuracy.png``);
* :mod:`~simulation.outputs.saved_model` -- ``model.safetensors`` and ``model.json``;
* :mod:`~simulation.outputs.trackers` -- TensorBoard, MLflow and W&B logs (``tracker=``);
* :mod:`~simulation.outputs.results` -- a sweep's runs and its ``results.csv`` (one row per run);
* :mod:`~simulation.outputs.report` and :mod:`~simulation.outputs.privacy_report` -- ``sflower report``'s
  tables and plots, built from a results table.

Imports: ``fl_app``, ``strategies`` and ``simulation``; nothing from ``benchmarks``. Within ``simulation``
nothing here imports a module that imports this package back (:mod:`simulation.sweep` runs runs and uses
these modules; they do not use it).
"""
