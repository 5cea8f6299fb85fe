"""Metric rows and the run summary: what each evaluation appends to ``metrics.csv`` and what ``summary.json`` holds.

The functions receive the run's counters and rows, not the strategy:
:class:`~strategies.base.SFLStrategy` gathers its counters
(:meth:`~strategies.base.SFLStrategy.counters`) and calls them from
``evaluate_and_record`` and ``summary_dict``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Result

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


def record(row: dict[str, Any], rows: list[dict[str, Any]], best_accuracy: float, recorder: Any) -> float:
    """Append ``row`` to ``rows`` and to ``recorder`` (``append(row)``; None: none); the best test accuracy
    so far, counting ``row`` (NaN until a finite one)."""
    rows.append(row)
    acc = row["test_accuracy"]
    if not (acc <= best_accuracy):
        best_accuracy = acc
    if recorder is not None:
        recorder.append(row)
    return best_accuracy


def summary(name: str, status: str, rows: list[dict[str, Any]], best_accuracy: float, counters: Mapping[str, Any],
            clients: Mapping[str, Any], server_compute_s: float) -> dict[str, Any]:
    """The ``summary.json`` content: the last row's accuracy and loss, the best accuracy, the counters
    (unrounded), the clients' part (:meth:`strategies.membership.Membership.summary`) and the server's
    compute seconds (:func:`server_compute_seconds`)."""
    last = rows[-1] if rows else {}
    return {
        "strategy": name,
        "status": status,
        "final_accuracy": last.get("test_accuracy", float("nan")),
        "best_accuracy": best_accuracy,
        "final_loss": last.get("test_loss", float("nan")),
        "global_iterations": counters["global_iteration"],
        **{k: counters[k] for k in ("server_updates", "virtual_time_s", "wall_time_s", *COUNTERS)},
        **clients,
        "server_compute_s": server_compute_s,
    }


def server_compute_seconds(run_s: float, waited_s: float, eval_s: float) -> float:
    """Wall seconds of the strategy's loop outside the dispatcher (``waited_s``) and evaluation (``eval_s``):
    server-side compute."""
    return max(0.0, run_s - waited_s - eval_s)


def flower_result(arrays: ArrayRecord, rows: list[dict[str, Any]]) -> Result:
    """Flower's ``Result`` of a run: the final weights ``arrays`` and each row's numeric columns, keyed by
    its global iteration."""
    result = Result(arrays=arrays)
    for row in rows:
        result.evaluate_metrics_serverapp[int(row["global_iteration"])] = MetricRecord(
            {k: float(v) for k, v in row.items() if isinstance(v, (int, float))})
    return result
