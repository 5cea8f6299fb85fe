"""Metric rows and the run summary: what each evaluation appends to ``metrics.csv``, what ``summary.json``
holds, and Flower's ``Result`` of a run.

:class:`MetricLog` keeps the rows, the best accuracy and the evaluation
seconds; it receives the run's counters, evaluations and recorder, not the
strategy (:class:`~strategies.core.base.SFLStrategy` keeps one, checkpointed with
its state, and gathers the counters in
:meth:`~strategies.core.base.SFLStrategy.counters`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Result

from strategies.core.errors import DivergedError, RunFailedError

#: ``(test loss, test accuracy, extra columns)`` of one evaluation.
Evaluation = tuple[float, float, dict[str, float]]
#: The counters a metric row and the summary report, in their column order (after the first two).
COUNTERS = ("bytes_up", "bytes_down", "exchanges")


def metric_row(counters: Mapping[str, Any], loss: float, accuracy: float,
               columns: Mapping[str, float]) -> dict[str, Any]:
    """One row of ``metrics.csv``: the counters (virtual time rounded to µs, wall time to ms), the test
    accuracy and loss, then ``columns`` (per-client accuracies, the strategy's extra metrics)."""
    return {
        "global_iteration": counters["global_iteration"],
        "server_updates": counters["server_updates"],
        "virtual_time_s": round(counters["virtual_time_s"], 6),
        "wall_time_s": round(counters["wall_time_s"], 3),
        "test_accuracy": accuracy,
        "test_loss": loss,
        **{k: counters[k] for k in COUNTERS},
        **columns,
    }


def run_status(err: BaseException) -> str:
    """The summary's ``status`` of a run that ended with ``err`` (one that did not: ``"completed"``)."""
    if isinstance(err, DivergedError):
        return f"diverged: {err}"
    if isinstance(err, RunFailedError):
        return f"failed: {err}"
    return f"interrupted: {type(err).__name__}"


class MetricLog:
    """The run's metric rows, its best test accuracy and the wall seconds spent evaluating."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.best_accuracy = float("nan")
        #: wall seconds spent evaluating inside the strategy's loop (excluded from ``server_compute_s``)
        self.eval_seconds = 0.0
        #: the initial evaluation, made while the handshake runs, until recorded
        self.early: Evaluation | None = None

    def timed(self, evaluate: Callable[[], Evaluation]) -> Evaluation:
        """``evaluate()``, its wall seconds counted in :attr:`eval_seconds`."""
        t0 = time.perf_counter()
        result = evaluate()
        self.eval_seconds += time.perf_counter() - t0
        return result

    def evaluation(self, evaluate: Callable[[], Evaluation], early_ok: bool) -> Evaluation:
        """The :attr:`early` evaluation when there is one and ``early_ok`` (then dropped); else :meth:`timed`."""
        if self.early is not None and early_ok:
            result, self.early = self.early, None
            return result
        return self.timed(evaluate)

    def record(self, counters: Mapping[str, Any], evaluation: Evaluation, columns: Mapping[str, float],
               recorder: Any) -> dict[str, Any]:
        """Append the :func:`metric_row` of ``evaluation`` (its extra columns, then ``columns``) to the rows and
        to ``recorder`` (``append(row)``; None: none) and update the best accuracy; the row."""
        loss, acc, per_client = evaluation
        row = metric_row(counters, loss, acc, {**per_client, **columns})
        self.rows.append(row)
        if not (acc <= self.best_accuracy):
            self.best_accuracy = acc
        if recorder is not None:
            recorder.append(row)
        return row

    def summary(self, name: str, status: str, counters: Mapping[str, Any], clients: Mapping[str, Any],
                server_compute_s: float) -> dict[str, Any]:
        """The ``summary.json`` content: the last row's accuracy and loss, the best accuracy, the counters
        (unrounded), the clients' part (:meth:`strategies.core.membership.Membership.summary`) and the server's
        compute seconds (:func:`server_compute_seconds`)."""
        last = self.rows[-1] if self.rows else {}
        return {
            "strategy": name,
            "status": status,
            "final_accuracy": last.get("test_accuracy", float("nan")),
            "best_accuracy": self.best_accuracy,
            "final_loss": last.get("test_loss", float("nan")),
            "global_iterations": counters["global_iteration"],
            **{k: counters[k] for k in ("server_updates", "virtual_time_s", "wall_time_s", *COUNTERS)},
            **clients,
            "server_compute_s": server_compute_s,
        }

    def result(self, arrays: ArrayRecord) -> Result:
        """Flower's ``Result`` of the run: the final weights ``arrays`` and each row's numeric columns, keyed
        by its global iteration."""
        result = Result(arrays=arrays)
        for row in self.rows:
            result.evaluate_metrics_serverapp[int(row["global_iteration"])] = MetricRecord(
                {k: float(v) for k, v in row.items() if isinstance(v, (int, float))})
        return result


def server_compute_seconds(run_s: float, waited_s: float, eval_s: float) -> float:
    """Wall seconds of the strategy's loop outside the dispatcher (``waited_s``) and evaluation (``eval_s``):
    server-side compute."""
    return max(0.0, run_s - waited_s - eval_s)
