"""The run's configuration: every key declared once, resolved once, and read one way.

* :mod:`fl_app.run.options`: the :class:`~fl_app.run.options.Option` declarations (type, default, range,
  help, source) and the one parser of ``key=value`` input.
* :mod:`fl_app.run.config`: :class:`~fl_app.run.config.RunConfig`, the resolved keys of a run (the user's, a
  preset's, the declared defaults) and its derived properties.
* :mod:`fl_app.run.plugins`: the strategy catalogue (built-ins and plugins, found the same way).
* :mod:`fl_app.run.numerics`, :mod:`fl_app.run.device`: the ``numerics`` and ``device`` modes.
* :mod:`fl_app.run.codec_names`: the values of ``compress-up``/``compress-down``.
* :mod:`fl_app.run.errors`: :class:`~fl_app.run.errors.ConfigError`, the one exception for bad input.
* :mod:`fl_app.run.untrusted`: reading a run directory's JSON files and recorded configuration as untrusted
  input.

Imports: ``fl_app`` only, and within it nothing outside this package: every other sub-package may import it.
"""
