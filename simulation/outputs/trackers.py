"""Experiment trackers: TensorBoard, MLflow and Weights & Biases, offline, inside the run directory.

``tracker=tensorboard,mlflow,wandb`` (any of them, comma-separated; default
``none``) logs, besides ``metrics.csv`` and ``summary.json``:

* every metric row (the columns of ``metrics.csv``) keyed by global
  iteration, with the virtual time as a second axis where the tracker has one;
* the configuration (``config.json``'s ``config``);
* the final summary (``summary.json``), also for a run that diverged or failed.

Where it goes (``store_dir`` is the run directory, or a sweep's directory
for the runs of a sweep, see :class:`TrackingContext`):

==============  =================================================================
tensorboard     ``RUN_DIR/tensorboard/`` event files (``SummaryWriter`` of
                ``torch.utils.tensorboard``). Scalars at step = global iteration;
                each event's time is the *virtual* time, so TensorBoard's
                "Relative" horizontal axis shows virtual seconds (``wall_time_s``
                is a scalar of its own). Texts ``config`` and ``summary`` (JSON).
mlflow          ``store_dir/mlflow.db`` (SQLite tracking store) and
                ``store_dir/mlartifacts/``: one MLflow run per sflower run, named
                after the run directory, in the experiment ``sflower`` (a sweep:
                the sweep's name); params = configuration, metrics at step =
                global iteration (``virtual_time_s`` is a metric too, which
                MLflow's charts can use as their x axis), the summary's numbers as
                metrics and ``summary.json`` as an artifact, the status as the
                run's end state. Open with ``mlflow ui --backend-store-uri
                sqlite:///RUN_DIR/mlflow.db``.
wandb           ``store_dir/wandb/offline-run-*`` (``mode="offline"``, nothing is
                sent): config, history with ``global_iteration`` as its step
                metric (``virtual_time_s`` can be chosen as x axis), summary;
                ``wandb sync`` uploads it later if wanted.
==============  =================================================================

Each tracker's package is an optional extra (``pip install
'sflower[tensorboard]'``, ``[mlflow]``, ``[wandb]``), imported only when a run
asks for it; :func:`check_trackers` refuses a missing one, with the install
command, before anything runs. A resumed run (``resume=RUN_DIR``) continues
the TensorBoard log (events after the checkpoint are purged) and starts a
new MLflow or W&B run that first replays the checkpoint's rows.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import numbers
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_app.run.errors import ConfigError
from simulation.outputs.records import RunListener

#: The experiment trackers of the ``tracker`` key (implemented below).
TRACKERS: tuple[str, ...] = ("tensorboard", "mlflow", "wandb")


def tracker_names(value: str) -> tuple[str, ...]:
    """The trackers a ``tracker`` value asks for, in order, without repeats.

    ``"none"`` or ``""`` gives ``()``; ``"tensorboard,mlflow"`` gives both.

    Raises:
        ConfigError: a name not in :data:`TRACKERS`, or ``none`` beside another name.
    """
    names = [n.strip() for n in str(value).split(",") if n.strip()]
    if names == ["none"] or not names:
        return ()
    for name in names:
        if name == "none":
            raise ConfigError(f"tracker={value!r}: 'none' cannot be combined with a tracker")
        if name not in TRACKERS:
            raise ConfigError(f"tracker={value!r}: unknown tracker '{name}'; choose none or any of "
                              f"{', '.join(TRACKERS)} (comma-separated)")
    return tuple(dict.fromkeys(names))


__all__ = ["TRACKERS", "EXTRAS", "TRACKER_CLASSES", "TrackingContext", "check_trackers", "open_trackers", "TensorBoardTracker",
           "MLflowTracker", "WandbTracker"]

#: tracker -> (the module it imports, the extra that installs it).
EXTRAS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "sflower[tensorboard]"),
    "mlflow": ("mlflow", "sflower[mlflow]"),
    "wandb": ("wandb", "sflower[wandb]"),
}


def check_trackers(value: str) -> tuple[str, ...]:
    """The trackers of a ``tracker`` value, each checked to be installed (nothing is imported).

    Raises:
        ConfigError: an unknown name, or a tracker whose package is missing
            (the message names ``pip install 'sflower[NAME]'``).
    """
    names = tracker_names(value)
    for name in names:
        module, extra = EXTRAS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"tracker={name} needs the {module} package: pip install '{extra}'")
    return names


@dataclass
class TrackingContext:
    """Where and under which names a run is tracked.

    Attributes:
        store_dir: the directory of the MLflow store (``mlflow.db``) and of
            the W&B offline runs (``wandb/``): the run directory, or a sweep's
            directory so that its runs sit side by side in one store.
        run_name: the tracker run's name (the run directory's name; in a
            sweep ``variant=...,seed=...``).
        experiment: the MLflow experiment and W&B project.
        group: the W&B group (a sweep's name), or None.
        tags: tracker tags (strategy, dataset, seed; in a sweep also the grid
            keys, e.g. variant and seed).
    """

    store_dir: Path
    run_name: str
    experiment: str = "sflower"
    group: str | None = None
    tags: dict[str, str] = field(default_factory=dict)

    @classmethod
    def for_run(cls, out_dir: Path, config: Mapping[str, Any]) -> TrackingContext:
        """The context of a single run: everything inside ``out_dir``."""
        tags = {k: str(config[k]) for k in ("strategy", "dataset", "seed") if k in config}
        return cls(store_dir=Path(out_dir), run_name=Path(out_dir).name, tags=tags)


def _numbers(row: Mapping[str, Any]) -> dict[str, float]:
    """The numeric columns of a row (booleans and text left out)."""
    return {k: float(v) for k, v in row.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}


class Tracker(RunListener):
    """Base of the trackers: a :class:`~simulation.outputs.records.RunListener` that logs rows, config and summary.

    Args:
        run_dir: the run directory.
        config: the resolved configuration (hyphenated keys).
        context: names and the store directory.
        resume: the run continues from a checkpoint (its rows arrive in
            :meth:`on_resume`).
    """

    def __init__(self, run_dir: Path, config: Mapping[str, Any], context: TrackingContext,
                 resume: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.config = dict(config)
        self.context = context
        self.resume = resume

    def on_resume(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Default: log the checkpoint's rows again (a new tracker run holds the whole history)."""
        for row in rows:
            self.on_row(row)


class TensorBoardTracker(Tracker):
    """TensorBoard event files in ``RUN_DIR/tensorboard`` (step: global iteration; event time: virtual time)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log_dir = self.run_dir / "tensorboard"
        self._writer: Any = None

    def writer(self, purge_step: int | None = None) -> Any:
        """The ``SummaryWriter``, opened on first use (a fresh run also logs its configuration)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)
            if not self.resume:
                self._writer.add_text("config", _json_block(self.config), global_step=0, walltime=0.0)
        return self._writer

    def on_resume(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Continue the event log: events at global iterations after the checkpoint's are purged."""
        if rows:
            self.writer(purge_step=int(rows[-1]["global_iteration"]) + 1)

    def on_row(self, row: Mapping[str, Any]) -> None:
        """Every numeric column as a scalar at step = global iteration, event time = virtual time."""
        w = self.writer()
        step, vtime = int(row["global_iteration"]), float(row["virtual_time_s"])
        for key, value in _numbers(row).items():
            if key != "global_iteration":
                w.add_scalar(key, value, global_step=step, walltime=vtime)
        w.flush()

    def on_finish(self, summary: Mapping[str, Any]) -> None:
        """The summary as text; close the writer."""
        w = self.writer()
        w.add_text("summary", _json_block(summary), global_step=int(summary.get("global_iterations", 0)),
                   walltime=float(summary.get("virtual_time_s", 0.0)))
        w.close()


class MLflowTracker(Tracker):
    """An MLflow run in the SQLite store ``store_dir/mlflow.db`` (artifacts in ``store_dir/mlartifacts``)."""

    #: MLflow accepts at most 100 params in one ``log_batch``.
    PARAMS_PER_BATCH = 100

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("alembic", "mlflow.store.db.utils", "mlflow.store.db.db_types"):  # schema set-up chatter
            logging.getLogger(name).setLevel(logging.WARNING)
        from mlflow import MlflowClient
        from mlflow.entities import Param

        store = self.context.store_dir.resolve()
        store.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = f"sqlite:///{store / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment = self.client.get_experiment_by_name(self.context.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None else self.client.create_experiment(
            self.context.experiment, artifact_location=(store / "mlartifacts").as_uri()))
        tags = {**self.context.tags, "sflower.run_dir": str(self.run_dir.resolve())}
        self.run_id = self.client.create_run(experiment_id, run_name=self.context.run_name, tags=tags).info.run_id
        params = [Param(k, str(v)) for k, v in self.config.items()]
        for i in range(0, len(params), self.PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + self.PARAMS_PER_BATCH])

    def _metrics(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def on_row(self, row: Mapping[str, Any]) -> None:
        """Every numeric column as a metric at step = global iteration."""
        self._metrics({k: v for k, v in _numbers(row).items() if k != "global_iteration"},
                      int(row["global_iteration"]))

    def on_finish(self, summary: Mapping[str, Any]) -> None:
        """The summary's numbers as metrics, ``summary.json`` as an artifact, the status as the run's end."""
        status = str(summary.get("status", ""))
        self._metrics(_numbers(summary), int(summary.get("global_iterations", 0)))
        self.client.set_tag(self.run_id, "status", status)
        self.client.log_dict(self.run_id, dict(summary), "summary.json")
        end = "FINISHED" if status == "completed" else "KILLED" if status.startswith("interrupted") else "FAILED"
        self.client.set_terminated(self.run_id, status=end)


class WandbTracker(Tracker):
    """A Weights & Biases run in offline mode under ``store_dir/wandb`` (nothing leaves the machine)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        import wandb

        store = self.context.store_dir.resolve()
        store.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(mode="offline", console="off", silent=True, x_disable_stats=True,
                                  x_save_requirements=False, save_code=False)
        self.run = wandb.init(mode="offline", dir=str(store), project=self.context.experiment,
                              group=self.context.group, name=self.context.run_name, config=self.config,
                              tags=[f"{k}={v}"[:64] for k, v in self.context.tags.items()],
                              reinit="create_new", settings=settings)
        self.run.define_metric("global_iteration")
        self.run.define_metric("virtual_time_s")
        self.run.define_metric("*", step_metric="global_iteration")

    def on_row(self, row: Mapping[str, Any]) -> None:
        """Every numeric column, in one history row."""
        self.run.log(_numbers(row))

    def on_finish(self, summary: Mapping[str, Any]) -> None:
        """The summary into the run's summary; finish the run (exit code 1 unless completed)."""
        self.run.summary.update(dict(summary))
        self.run.finish(exit_code=0 if summary.get("status") == "completed" else 1)


#: The class of each tracker name (the names are :data:`TRACKERS`; a test keeps them equal).
TRACKER_CLASSES: dict[str, type[Tracker]] = {"tensorboard": TensorBoardTracker, "mlflow": MLflowTracker,
                                             "wandb": WandbTracker}


def open_trackers(value: str, run_dir: Path, config: Mapping[str, Any], context: TrackingContext | None = None,
                  resume: bool = False) -> list[Tracker]:
    """Start the trackers of a ``tracker`` value for one run (their packages are imported here).

    Args:
        value: the ``tracker`` key (``none``, or names, comma-separated).
        run_dir: the run directory.
        config: the resolved configuration.
        context: names and store (default: :meth:`TrackingContext.for_run`).
        resume: the run continues from a checkpoint.

    Raises:
        ConfigError: as :func:`check_trackers`.
    """
    names = check_trackers(value)
    context = context or TrackingContext.for_run(run_dir, config)
    return [TRACKER_CLASSES[name](Path(run_dir), config, context, resume) for name in names]


def _json_block(payload: Mapping[str, Any]) -> str:
    """A JSON dump as a Markdown code block (TensorBoard renders text as Markdown)."""
    return "```json\n" + json.dumps(dict(payload), indent=2, default=str) + "\n```"
