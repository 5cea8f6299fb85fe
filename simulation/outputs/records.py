"""Run outputs (docs/explanation/design.md §9): config.json, metrics.csv, summary.json, accuracy.png.

``metrics.csv`` is appended one row per evaluation and flushed at once, so a
killed run keeps every row written so far. Listeners (:class:`RunListener`:
the experiment trackers of :mod:`simulation.outputs.trackers`, the model saver of
:mod:`simulation.outputs.saved_model`) see every row, a resume and the summary.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("sflower")

#: Columns every metrics.csv starts with; strategies may add more after them.
METRIC_COLUMNS = (
    "global_iteration", "server_updates", "virtual_time_s", "wall_time_s",
    "test_accuracy", "test_loss", "bytes_up", "bytes_down", "exchanges",
)


def default_output_dir(strategy: str, dataset: str, seed: int, root: str = "runs") -> Path:
    """``runs/<strategy>-<dataset>-seed<seed>-<YYYYmmdd-HHMMSS>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{strategy}-{dataset}-seed{seed}-{stamp}"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class RunListener:
    """Something that follows a run's outputs: a tracker, the model saver. The hooks do nothing by default.

    The recorder calls them after its own writing, in this order: :meth:`on_resume`
    (a resumed run only), :meth:`on_row` for each metric row, :meth:`on_finish`
    once, also for a run that diverged, failed or was interrupted
    (``summary["status"]`` says which).
    """

    def on_row(self, row: Mapping[str, Any]) -> None:
        """A metric row (the columns of metrics.csv), just appended."""

    def on_resume(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """The run resumed from a checkpoint holding these first rows (already in metrics.csv)."""

    def on_finish(self, summary: Mapping[str, Any]) -> None:
        """The summary.json content, just written."""


class RunRecorder:
    """Writes one run's directory.

    Args:
        out_dir: the run directory (created).
        config: the resolved configuration, written to config.json with
            ``extra`` (device profiles, model figures) beside it.
        resume: the run continues from a checkpoint: config.json and
            metrics.csv are kept (see :meth:`resume`).
        listeners: :class:`RunListener` objects (duck-typed) told of every row,
            the resume and the summary. A listener that raises is reported in
            one warning line and dropped; the run goes on.
        machine: the machine and numerics mode (:func:`fl_app.run.numerics.machine_record`),
            recorded in config.json and summary.json alike.
    """

    def __init__(self, out_dir: str | Path, config: Mapping[str, Any], extra: Mapping[str, Any] | None = None,
                 *, resume: bool = False, listeners: Sequence[Any] = (),
                 machine: Mapping[str, Any] | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.machine = dict(machine) if machine else None
        payload = {"config": dict(config), **dict(extra or {}), **({"machine": self.machine} if machine else {})}
        if not (resume and (self.out_dir / "config.json").exists()):  # a resumed run keeps the run's own
            (self.out_dir / "config.json").write_text(json.dumps(_json_safe(payload), indent=2))
        self.metrics_path = self.out_dir / "metrics.csv"
        if self.metrics_path.exists() and not resume:  # a resumed run truncates it instead, see resume()
            self.metrics_path.unlink()
        self._columns: list[str] | None = None
        self.rows: list[dict[str, Any]] = []
        self.listeners = list(listeners)
        #: fields known only when the run ends, merged into summary.json (the session transport's wire bytes)
        self.late: Callable[[], Mapping[str, Any]] | None = None

    def _tell(self, hook: str, arg: Any) -> None:
        """Call ``hook(arg)`` on every listener; drop one that raises (one warning line)."""
        for listener in list(self.listeners):
            try:
                getattr(listener, hook)(arg)
            except Exception as err:  # noqa: BLE001 - a tracker or a full disk must not stop the run
                first = (str(err).strip().splitlines() or [""])[0]
                log.warning("sflower: %s failed in %s (%s: %s); it is switched off for this run",
                            type(listener).__name__, hook, type(err).__name__, first)
                self.listeners.remove(listener)

    def append(self, row: Mapping[str, Any]) -> None:
        """Append one evaluation row to metrics.csv (header on the first row)."""
        row = dict(row)
        if self._columns is None:
            self._columns = list(METRIC_COLUMNS) + [k for k in row if k not in METRIC_COLUMNS]
            with self.metrics_path.open("w", newline="") as fh:
                csv.writer(fh).writerow(self._columns)
        with self.metrics_path.open("a", newline="") as fh:
            csv.writer(fh).writerow([row.get(c, "") for c in self._columns])
        self.rows.append(row)
        self._tell("on_row", row)

    def resume(self, rows: list[Mapping[str, Any]]) -> None:
        """Continue a killed run's metrics.csv after its first ``len(rows)`` rows (a checkpoint's).

        Rows written after the checkpoint are dropped (atomically: a
        temporary file, then :func:`os.replace`), so that the resumed run
        appends each of them once; ``rows`` become :attr:`rows` (for the plot).

        Raises:
            ConfigError: metrics.csv is missing or holds fewer rows than ``rows``.
        """
        from fl_app.run.errors import ConfigError

        if not rows:
            return
        # bytes, not text: the csv module ends rows with \r\n, which text mode would rewrite
        lines = self.metrics_path.read_bytes().splitlines(keepends=True) if self.metrics_path.exists() else []
        if len(lines) < 1 + len(rows):
            raise ConfigError(f"{self.metrics_path} holds {max(0, len(lines) - 1)} rows, "
                              f"the checkpoint needs {len(rows)}")
        self._columns = next(csv.reader([lines[0].decode()]))
        tmp = self.metrics_path.with_name(self.metrics_path.name + ".tmp")
        tmp.write_bytes(b"".join(lines[:1 + len(rows)]))
        os.replace(tmp, self.metrics_path)
        self.rows = [dict(r) for r in rows]
        self._tell("on_resume", self.rows)

    def finish(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        """Write summary.json and accuracy.png; returns the summary written."""
        late = dict(self.late()) if self.late is not None else {}
        summary = _json_safe({**dict(summary), **late, **({"machine": self.machine} if self.machine else {})})
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self._tell("on_finish", summary)
        if self.rows:
            plot_accuracy(self.rows, self.out_dir / "accuracy.png", title=str(summary.get("strategy") or ""))
        return summary


def plot_accuracy(rows: list[Mapping[str, Any]], path: Path, title: str = "") -> None:
    """Accuracy against global iteration and against virtual time (two panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    it = [r["global_iteration"] for r in rows]
    vt = [r["virtual_time_s"] for r in rows]
    acc = [r["test_accuracy"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    axes[0].plot(it, acc, marker="o")
    axes[0].set_xlabel("global iteration")
    axes[0].set_ylabel("test accuracy")
    axes[1].plot(vt, acc, marker="o")
    axes[1].set_xlabel("virtual time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: Run-config keys that name files of the ServerApp's machine holding TLS material: ``config.json`` says
#: only whether they were given.
TLS_FILE_KEYS = ("session-certificate", "session-key", "session-ca")


def recorded_config(cfg: Any) -> dict[str, Any]:
    """The configuration ``config.json`` records: every key, but only ``"<given>"`` for :data:`TLS_FILE_KEYS`
    (no key, certificate or path of the deployment's in the outputs)."""
    values = cfg.as_dict()
    return {**values, **{k: "<given>" for k in TLS_FILE_KEYS if values.get(k)}}
