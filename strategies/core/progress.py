"""The progress bar of a run: it counts exchanges (replies received), so that it moves within a global iteration.

The bar's unit is the exchange (one reply, successful or not: the
dispatcher's ``exchanges`` counter); its description names the global
iteration (``gas it 2/6``) and its postfix the last test accuracy and the
virtual time. Its total is an estimate, the exchanges per global iteration
so far times the global iterations of the run (none before the first ends),
which gives the percentage and the time left. On a terminal it is redrawn at
tqdm's pace; when stderr is not a terminal (a log file, a pipe, a sweep, the
ServerApp under ``flwr run``) at most once every :data:`PIPE_INTERVAL_S`
seconds, so that a log gets about one update per second, not one per
exchange (``TQDM_MININTERVAL`` in the process's environment overrides both).
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: Seconds between two redraws of a bar whose stderr is not a terminal.
PIPE_INTERVAL_S = 1.0


class RunBar:
    """A run's tqdm bar (:attr:`tqdm`) of exchanges, with the run's name and its number of global iterations."""

    def __init__(self, tqdm_bar: Any, name: str, iterations: int) -> None:
        self.tqdm, self.name, self.iterations = tqdm_bar, name, iterations

    def name_iteration(self, iteration: int, exchanges: int) -> None:
        """Name global ``iteration`` in the description; estimate the total from ``exchanges`` by then."""
        self.tqdm.set_description_str(label(self.name, iteration, self.iterations), refresh=False)
        self.tqdm.total = estimate(iteration, self.iterations, exchanges)


def label(name: str, iteration: int, iterations: int) -> str:
    """The bar's description: the run's ``name`` and its global ``iteration`` of ``iterations``."""
    return f"{name} it {iteration}/{iterations}"


def estimate(iteration: int, iterations: int, exchanges: int) -> int | None:
    """The exchanges of a run of ``iterations`` global iterations, at ``exchanges`` after ``iteration`` of
    them (None before the first)."""
    if iteration <= 0 or exchanges <= 0:
        return None
    return max(exchanges, round(exchanges * iterations / iteration))


def open_bar(enabled: bool, total: int, initial: int, desc: str, exchanges: int = 0) -> RunBar | None:
    """A bar of exchanges starting at ``exchanges``, named ``desc`` at global iteration ``initial`` of
    ``total``, or None when not ``enabled``."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    options: dict[str, Any] = {}
    if "TQDM_MININTERVAL" not in os.environ and not _is_terminal(sys.stderr):
        options["mininterval"] = PIPE_INTERVAL_S
    # miniters=1: redraw on the first reply after the interval; tqdm's default adapts a minimum count of updates
    # to the rate so far and then stands still for seconds when replies slow down (a server update, a straggler)
    return RunBar(tqdm(total=estimate(initial, total, exchanges), initial=exchanges, desc=label(desc, initial, total),
                       unit="exch", leave=True, miniters=1, **options), desc, total)


def _is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (False for a stream without ``isatty``)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def show(bar: RunBar | None, accuracy: float, virtual_time: float) -> None:
    """Show the last test accuracy and the virtual time (seconds) beside ``bar`` (None: nothing)."""
    if bar is not None:
        bar.tqdm.set_postfix(acc=f"{accuracy:.4f}", vtime=f"{virtual_time:.1f}s")


def advance(bar: RunBar | None, exchanges: int) -> None:
    """Move ``bar`` (None: nothing) to ``exchanges`` replies received; tqdm redraws it when its interval
    has passed."""
    if bar is not None and exchanges > bar.tqdm.n:
        bar.tqdm.update(exchanges - bar.tqdm.n)


def tick(bar: RunBar | None, iteration: int, exchanges: int) -> None:
    """Global ``iteration`` is reached after ``exchanges`` replies: name it on ``bar`` (None: nothing),
    re-estimate the total, redraw."""
    if bar is not None:
        advance(bar, exchanges)
        bar.name_iteration(iteration, exchanges)
        bar.tqdm.refresh()


def close_bar(bar: RunBar | None) -> None:
    """Close ``bar`` (None: nothing); the caller drops its reference."""
    if bar is not None:
        bar.tqdm.close()
