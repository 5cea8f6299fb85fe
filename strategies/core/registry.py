"""The strategy registry of this floor: :mod:`fl_app.run.plugins`' catalogue, typed for strategies.

A new algorithm is one class with a ``name``, findable by an entry point of the group
``sflower.strategies`` (how sflower's own strategies are found) or by
``strategy=package.module:Class``. :func:`register` is needed only where an entry point names a
module (each class it registers) or for a class imported before the run without one. See
:mod:`fl_app.run.plugins`.
"""

from __future__ import annotations

from fl_app.run.plugins import GROUP, register, strategy_class, strategy_names

__all__ = ["GROUP", "register", "get_strategy", "strategy_names"]


def get_strategy(name: str) -> type:
    """The strategy class of a ``strategy`` value: a registered name or ``package.module:Class``.

    Raises:
        ConfigError: unknown name (the message lists the known ones), or a plugin that cannot be imported.
    """
    return strategy_class(name)
