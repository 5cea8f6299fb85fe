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

Between replies (a GAS server update, a straggler) a :class:`Heartbeat`
redraws the bar every :data:`HEARTBEAT_S` seconds, so its elapsed time and
rate keep moving; the counts move only with exchanges.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

#: Seconds between two redraws of a bar whose stderr is not a terminal.
PIPE_INTERVAL_S = 1.0
#: Seconds between two redraws by a :class:`Heartbeat` (the display moves at least this often).
HEARTBEAT_S = 1.0


class Heartbeat:
    """A daemon thread that redraws a tqdm bar every ``interval`` seconds until :meth:`stop`.

    tqdm redraws only when updated; between updates (a long server step)
    its elapsed time would stand still. Redraws take the bar's own lock.
    """

    def __init__(self, tqdm_bar: Any, interval: float = HEARTBEAT_S) -> None:
        self._bar, self._interval = tqdm_bar, interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sflower-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self._bar.refresh()
            except Exception:  # a bar closed under us, a closed stream: the display is best effort
                return

    def stop(self) -> None:
        """Stop redrawing and wait for the thread (at most one interval)."""
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self._interval + 1.0)


_waiting: tuple[Any, Heartbeat] | None = None


def start_waiting(stream: Any = None) -> None:
    """Show the seconds elapsed on ``stream`` (stdout) until the run's bar opens or :func:`stop_waiting`.

    The start of a run (imports, the data, the plan, the handshake, the
    first evaluation) takes seconds without an exchange to count.
    """
    global _waiting
    from tqdm.auto import tqdm

    stop_waiting()
    bar = tqdm(file=stream or sys.stdout, bar_format="  {desc} {elapsed}", desc="starting", leave=False,
               mininterval=0)
    _waiting = (bar, Heartbeat(bar))


def stop_waiting() -> None:
    """Stop and clear the start-up display of :func:`start_waiting` (nothing if none is shown)."""
    global _waiting
    if _waiting is not None:
        bar, heartbeat = _waiting
        _waiting = None
        heartbeat.stop()
        bar.close()


class RunBar:
    """A run's tqdm bar (:attr:`tqdm`) of exchanges, with the run's name and its number of global iterations."""

    def __init__(self, tqdm_bar: Any, name: str, iterations: int) -> None:
        self.tqdm, self.name, self.iterations = tqdm_bar, name, iterations
        #: redraws the bar between exchanges (:class:`Heartbeat`)
        self.heartbeat = Heartbeat(tqdm_bar)

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
    stop_waiting()
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
        bar.heartbeat.stop()
        bar.tqdm.close()
