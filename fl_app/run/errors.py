"""The one exception type for bad user input.

Anything a user can get wrong (an unknown strategy or dataset, a missing data
directory, an impossible partition, a cut layer out of range) raises
:class:`ConfigError` with a one-line message. The command line prints that line
and exits with status 2; it never shows a traceback for it.
"""


class ConfigError(ValueError):
    """Bad user input. ``str(err)`` is a single line meant for the user."""
