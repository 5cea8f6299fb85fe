"""Checkpoint and resume (``checkpoint-every=N``, ``sflower run resume=RUN_DIR``; issue 12 item 6).

A run killed after a checkpoint and resumed must write the same metrics.csv
as an uninterrupted run, on the virtual clock: every column but
``wall_time_s``, byte for byte. The GAS test really SIGKILLs a
``python -m simulation.cli run`` subprocess once checkpoint 3 of 6 is on
disk; the others stop an in-process run with an exception right after a
later metric row (so resume must also drop the rows written after the
checkpoint).
"""

from __future__ import annotations

import csv
import json
import os
import pickle
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError
from simulation.outputs.records import RunRecorder
from simulation.server_app import plan_run
from simulation import cli
from simulation.engine import run_inprocess
from strategies.core import checkpoint as ckpt
from strategies.core import state_codec, state_decoder
from strategies.core.registry import strategy_names

REPO = Path(__file__).resolve().parents[1]

#: A small budget: mnist-5k, LeNet-5, 3 clients, 2 local iterations of 8 images, 6 global iterations.
BASE = {
    "dataset": "mnist-5k", "model": "lenet5", "cut-layer": 2, "num-clients": 3, "concurrency": 2,
    "partition": "iid", "local-iterations": 2, "batch-size": 8, "global-iterations": 6, "eval-samples": 200,
    "covariance": "diagonal", "seed": 1,
}


#: The vertical strategy's small budget (it refuses the image keys of :data:`BASE`): breast cancer's two parties.
VERTICAL = {"dataset": "vertical-breast", "data-dir": str(REPO.parent / "shared" / "data"), "global-iterations": 6,
            "batch-size": 32, "lr": 0.1, "vertical-overlap": 0.9, "psi-backend": "dh", "seed": 1}


def for_strategy(strategy: str) -> dict:
    """:data:`BASE` for ``strategy``, with GAS's ``covariance`` only for GAS (a strategy refuses a key it does
    not read); :data:`VERTICAL` for ``vertical-sl``."""
    if strategy == "vertical-sl":
        return {**VERTICAL, "strategy": strategy}
    return {**{k: v for k, v in BASE.items() if strategy == "gas" or k != "covariance"}, "strategy": strategy}


def _run(cfg: dict) -> dict:
    """A whole in-process run of ``cfg``: a vertical strategy's on its own runner (:mod:`simulation.vertical`)."""
    if cfg["strategy"] == "vertical-sl":
        from simulation.vertical import run_vertical
        from strategies.algorithms.vertical import VerticalSL

        return run_vertical(RunConfig.from_mapping(cfg), VerticalSL)
    return run_inprocess(plan_run(RunConfig.from_mapping(cfg)), progress=False)


def _args(cfg: dict) -> list[str]:
    return [f"{k}={v}" for k, v in cfg.items()]


def _columns(path: Path) -> dict[str, list[str]]:
    """metrics.csv as column name -> raw cell strings (the bytes written)."""
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    return {name: [r[i] for r in rows[1:]] for i, name in enumerate(rows[0])}


def _same_metrics(resumed: Path, reference: Path) -> None:
    """Every column but ``wall_time_s`` equal, cell by cell; ``test_accuracy`` byte-identical. A failure lists
    every differing cell (column, row, resumed, reference), not only the first column's."""
    a, b = _columns(resumed), _columns(reference)
    assert list(a) == list(b)
    assert len(a["test_accuracy"]) == len(b["test_accuracy"])
    differ = [(name, row, x, y) for name in a if name != "wall_time_s"
              for row, (x, y) in enumerate(zip(a[name], b[name])) if x != y]
    assert not differ, differ


def run_cli(*args: str, **kw) -> subprocess.Popen:
    """``sflower run -q ARGS`` in a fresh process of its own session (one torch thread), as every run that a
    test compares with another process's run is made."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "simulation.cli", "run", "-q", *args], cwd=REPO, env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def reference_in_its_own_process(tmp_path, cfg: dict):
    """An uninterrupted in-process run made like the runs it is compared with: ``sflower run`` in a fresh process
    with :func:`run_cli`'s environment (``OMP_NUM_THREADS=1``), not in the test process, whose torch thread count
    and state earlier tests may have changed; returns its metrics.csv.

    A run made in another process is compared only with a reference made in a fresh process of the same
    environment: the one flaky failure of the Ray resume test (``test_loss`` of global iteration 1, before the
    kill, 1.3 float32 ulp apart) was a reference computed inside a long-lived test process, against the value
    that every fresh process gives (docs/how-to/contribute.md, "Comparing runs")."""
    out = tmp_path / "reference"
    proc = run_cli(*[f"{k}={v}" for k, v in cfg.items()], f"output-dir={out}")
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-2000:]
    return out / "metrics.csv"


def _reference(tmp_path: Path, cfg: dict) -> Path:
    """An uninterrupted run without checkpoints; returns its metrics.csv."""
    out = tmp_path / "reference"
    _run({**cfg, "output-dir": str(out)})
    return out / "metrics.csv"


@pytest.mark.e2e  # a real sflower run process, SIGKILLed
def test_gas_sigkill_after_iteration_3_resumes_identically(tmp_path, capsys):
    """SIGKILL a GAS run (a real subprocess) after checkpoint 3 of 6; the resumed metrics equal an uninterrupted run's."""
    cfg = {**for_strategy("gas"), "checkpoint-every": 3}
    run_dir = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "simulation.cli", "run", "-q", *_args(cfg),
                             f"output-dir={run_dir}"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    path = run_dir / ckpt.CHECKPOINT_FILE
    deadline = time.monotonic() + 240
    try:
        while not path.exists():  # written atomically: once it exists it is whole
            assert proc.poll() is None, f"the run ended before its checkpoint: {proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "summary.json").exists()  # killed, not finished
    meta = ckpt.read_meta(path)
    assert meta["global_iteration"] == 3 and meta["rows"] == 4
    assert cli.main(["run", "-q", f"resume={run_dir}"]) == 0  # what `sflower run resume=DIR` calls
    assert "after 6 global iterations" in capsys.readouterr().out
    _same_metrics(run_dir / "metrics.csv", reference_in_its_own_process(tmp_path, cfg))
    assert len(_columns(run_dir / "metrics.csv")["global_iteration"]) == 7


class _Killed(BaseException):
    """Stands for a kill: not an Exception, so nothing in the run handles it."""


def _kill_after_row(monkeypatch, iteration: int) -> None:
    """Make the run stop right after the metric row of ``iteration`` is on disk."""
    append = RunRecorder.append

    def append_then_stop(self, row):
        append(self, row)
        if row["global_iteration"] == iteration:
            raise _Killed

    monkeypatch.setattr(RunRecorder, "append", append_then_stop)


@pytest.mark.slow  # three whole runs (killed, resumed, reference) per case
@pytest.mark.parametrize("strategy, extra", [("splitfed-v1", {}), ("fedbuff", {}),
                                             ("splitfed-v1", {"cut-layers": "2,9"})])  # U-shaped: tail slots
def test_resume_after_later_rows_identical(tmp_path, monkeypatch, strategy, extra):
    """Checkpoints at 2 and 4 of 6, stopped after row 5: resume drops row 5, redoes it and matches."""
    cfg = {**for_strategy(strategy), "checkpoint-every": 2, **extra}
    run_dir = tmp_path / "killed"
    with monkeypatch.context() as m:
        _kill_after_row(m, 5)
        with pytest.raises(_Killed):
            run_inprocess(plan_run(RunConfig.from_mapping({**cfg, "output-dir": str(run_dir)})), progress=False)
    assert ckpt.read_meta(run_dir / ckpt.CHECKPOINT_FILE)["global_iteration"] == 4
    assert len(_columns(run_dir / "metrics.csv")["global_iteration"]) == 6  # rows 0..5, row 5 after the checkpoint
    assert cli.main(["run", "-q", f"resume={run_dir}"]) == 0
    _same_metrics(run_dir / "metrics.csv", _reference(tmp_path, cfg))


@pytest.mark.slow  # two whole runs
def test_checkpointing_changes_no_number(tmp_path):
    """A run that writes checkpoints gives the metrics of one that does not."""
    cfg = {**for_strategy("fedbuff"), "global-iterations": 3}
    out = tmp_path / "with"
    run_inprocess(plan_run(RunConfig.from_mapping({**cfg, "checkpoint-every": 1, "output-dir": str(out)})),
                  progress=False)
    assert ckpt.read_meta(out / ckpt.CHECKPOINT_FILE)["global_iteration"] == 2  # none after the last iteration
    _same_metrics(out / "metrics.csv", _reference(tmp_path, cfg))


def test_bad_resume_input_is_one_line_error(tmp_path, capsys):
    """No checkpoint, a corrupt one, another configuration, another format: exit 2, one line."""
    assert cli.main(["run", f"resume={tmp_path / 'nowhere'}"]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["run", f"resume={empty}"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    (empty / ckpt.CHECKPOINT_FILE).write_bytes(b"not a pickle")
    assert cli.main(["run", f"resume={empty}"]) == 2
    err = capsys.readouterr().err
    assert "not a readable checkpoint" in err and err.count("\n") == 1
    ckpt.write(empty / ckpt.CHECKPOINT_FILE, {"strategy": "gas", "config": RunConfig.from_mapping(BASE).as_dict(),
                                             "global_iteration": 1, "rows": 2}, b"")
    assert cli.main(["run", f"resume={empty}", "lr=0.5"]) == 2
    assert "differs from the checkpoint's" in capsys.readouterr().err
    assert cli.main(["run", f"resume={empty}", "checkpoint-every=3", "resume=x"]) == 2  # no resume of a resume
    capsys.readouterr()
    header = json.dumps({"format": ckpt.FORMAT - 1, "meta": {}}).encode()  # this layout, another version
    (empty / ckpt.CHECKPOINT_FILE).write_bytes(ckpt.MAGIC + struct.pack("<Q", len(header)) + header)
    assert cli.main(["run", f"resume={empty}"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint format {ckpt.FORMAT - 1}; this sflower reads {ckpt.FORMAT}" in err and err.count("\n") == 1
    with open(empty / ckpt.CHECKPOINT_FILE, "wb") as fh:  # a pickle of format 2 (before issue 37)
        pickle.dump({"format": 2, "meta": {}, "state": b""}, fh)
    assert cli.main(["run", f"resume={empty}"]) == 2
    err = capsys.readouterr().err
    assert "older sflower" in err and err.count("\n") == 1
    with pytest.raises(ConfigError):
        RunConfig.from_mapping({"checkpoint-every": -1})


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    """A write that fails half-way leaves the previous checkpoint readable."""
    path = tmp_path / ckpt.CHECKPOINT_FILE
    ckpt.write(path, {"global_iteration": 3}, b"state-3")

    def broken_fsync(fd):  # the new file is half written when this fails
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        ckpt.write(path, {"global_iteration": 6}, b"state-6")
    monkeypatch.undo()
    assert ckpt.read(path) == ({"global_iteration": 3}, b"state-3")


@pytest.mark.slow  # three whole runs
def test_checkpoint_older_than_a_key_resumes(tmp_path, monkeypatch):
    """A checkpoint written before a key existed (its config lacks it) resumes when the key has its
    default, and ends where an uninterrupted run does."""
    cfg = {**for_strategy("fedbuff"), "global-iterations": 4, "checkpoint-every": 2}
    run_dir = tmp_path / "old"
    with monkeypatch.context() as m:
        _kill_after_row(m, 3)
        with pytest.raises(_Killed):
            run_inprocess(plan_run(RunConfig.from_mapping({**cfg, "output-dir": str(run_dir)})), progress=False)
    path = run_dir / ckpt.CHECKPOINT_FILE
    meta, state = ckpt.read(path)
    for key in ("init-seed", "tracker", "client-momentum"):
        del meta["config"][key]
    ckpt.write(path, meta, state)

    def no_unpickling(*args, **kwargs):
        raise AssertionError("a checkpoint was unpickled")

    with monkeypatch.context() as m:  # loading never unpickles (issue 37)
        for name in ("load", "loads", "Unpickler"):
            m.setattr(pickle, name, no_unpickling)
        m.setattr(torch, "load", no_unpickling)
        assert cli.main(["run", "-q", f"resume={run_dir}"]) == 0
    _same_metrics(run_dir / "metrics.csv", _reference(tmp_path, cfg))


class _Evil:
    """Unpickled, creates ``marker``: what a planted checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_planted_pickle_cannot_run_code_on_resume(tmp_path, capsys):
    """A malicious pickle as the run's checkpoint (new name or old) is refused with one line and never loaded."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Evil(marker))
    pickle.loads(payload).close()  # the payload works ...
    assert marker.exists()
    marker.unlink()
    for name in (ckpt.CHECKPOINT_FILE, ckpt.LEGACY_CHECKPOINT_FILE):
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / name).write_bytes(payload)
        assert cli.main(["run", f"resume={run_dir}"]) == 2
        err = capsys.readouterr().err
        assert "older sflower" in err and err.count("\n") == 1
        assert not marker.exists()  # ... but not on resume


def _state_bytes(graph, tensors=None) -> bytes:
    text = json.dumps(graph).encode()
    return struct.pack("<Q", len(text)) + text + safetensors.torch.save(tensors or {})


@pytest.mark.parametrize("graph", [
    {"t": "obj", "id": 0, "cls": "builtins:open", "args": ["MARKER", "w"]},
    {"t": "obj", "id": 0, "cls": "os:system", "args": ["touch MARKER"]},
    {"t": "call", "id": 0, "func": "builtins:open", "args": ["MARKER", "w"]},
    {"t": "call", "id": 0, "func": "subprocess:call", "args": [["touch", "MARKER"]]},
    {"t": "global", "name": "os:system"},
    {"t": "global", "name": "strategies.core.checkpoint:os.system"},
    {"t": "method", "self": {"t": "env", "name": "x"}, "name": "__class__"},
    {"t": "pickle", "data": "gARLAS4="},
])
def test_a_crafted_graph_cannot_call_outside_the_allowlist(tmp_path, graph):
    """A format-3 state naming functions outside the allowlist is refused with a CheckpointError."""
    marker = tmp_path / "pwned"
    graph = json.loads(json.dumps(graph).replace("MARKER", str(marker)))
    with pytest.raises(ckpt.CheckpointError):
        ckpt.loads(_state_bytes(graph), {"x": object()})
    assert not marker.exists()


def test_no_pickle_in_the_checkpoint_path():
    """The checkpoint modules neither import pickle nor call torch.load."""
    for module in (ckpt, state_codec, state_decoder):
        source = Path(module.__file__).read_text()
        assert "import pickle" not in source and "Unpickler" not in source
        assert not re.search(r"(?<!safetensors\.)torch\.load\(", source)


class _NotAllowed:
    pass


def test_codec_keeps_sharing_and_refuses_unknown_types_when_writing():
    """Round trip: an optimizer keeps the model's Parameters, views share their storage, special floats
    survive; an object of a class outside the allowlist is refused when writing."""
    import collections
    import random

    import numpy as np

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    base = torch.arange(6.0)
    state = {"model": model, "opt": opt, "base": base, "view": base[1:4], 1: (float("nan"), float("-inf"), -0.0),
             "np": np.random.default_rng(3), "random": random.Random(4), "dq": collections.deque([1], maxlen=3),
             "dd": collections.defaultdict(list, {(1, 2): [3]}), "bytes": b"\x00\x80", "gen": torch.Generator()}
    out = ckpt.loads(ckpt.dumps(state, {}), {})
    params = list(out["model"].parameters())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), params))
    assert out["opt"].param_groups[0]["params"][0] is params[0] and params[0] in out["opt"].state
    out["base"][2] = 100.0
    assert out["view"][1] == 100.0
    assert str(out[1]) == "(nan, -inf, -0.0)"
    assert out["np"].random() == np.random.default_rng(3).random()
    assert out["random"].random() == random.Random(4).random()
    assert out["dq"].maxlen == 3 and out["dd"][(1, 2)] == [3] and out["dd"].default_factory is list
    assert out["bytes"] == b"\x00\x80" and torch.equal(out["gen"].get_state(), torch.Generator().get_state())
    with pytest.raises(ckpt.CheckpointError, match="_NotAllowed"):
        ckpt.dumps({"x": _NotAllowed()}, {})


_COVERED = ("gas", "splitfed-v1", "fedbuff")  # resumed by the tests above
#: strategies that write no checkpoint: each refuses checkpoint-every in one line (tested beside it)
_NO_CHECKPOINT: tuple[str, ...] = ()


@pytest.mark.slow  # three whole runs per strategy
@pytest.mark.parametrize("strategy", [n for n in strategy_names() if n not in _COVERED + _NO_CHECKPOINT])
def test_every_strategy_writes_and_resumes_its_state(tmp_path, monkeypatch, strategy):
    """Each other strategy's state goes through the codec (a type outside its allowlist fails the write)
    and resumes identically: checkpoint at 1 of 3, stopped after row 2."""
    cfg = {**for_strategy(strategy), "global-iterations": 3, "checkpoint-every": 1}
    run_dir = tmp_path / "killed"
    with monkeypatch.context() as m:
        _kill_after_row(m, 2)
        with pytest.raises(_Killed):
            _run({**cfg, "output-dir": str(run_dir)})
    assert ckpt.read_meta(run_dir / ckpt.CHECKPOINT_FILE)["global_iteration"] == 1  # 2 comes after row 2
    where = [f"data-dir={cfg['data-dir']}"] if "data-dir" in cfg else []  # a checkpoint's data-dir is given again
    assert cli.main(["run", "-q", f"resume={run_dir}", *where]) == 0
    _same_metrics(run_dir / "metrics.csv", _reference(tmp_path, cfg))


def test_round_trip_waits_between_pulls_at_least_as_long_as_a_pull_took(monkeypatch):
    """strategies.core.client_states.round_trip (the handshake's and the checkpoint's wait for replies): a pull
    that takes longer than POLL_S is followed by a wait as long as the pull, so that pulling never holds the
    ServerApp's process more than half the time (at 10,000 nodes a pull checks 10,000 ids); a quick pull is
    followed by POLL_S. Timed on a fake clock: no test time depends on the machine."""
    from types import SimpleNamespace

    from strategies.core import client_states

    clock = SimpleNamespace(now=0.0, sleeps=[])
    monkeypatch.setattr(client_states.time, "monotonic", lambda: clock.now)

    def sleep(s):
        clock.sleeps.append(round(s, 6))
        clock.now += s

    monkeypatch.setattr(client_states.time, "sleep", sleep)

    class Grid:
        """Replies to one message per pull; a pull costs 0.05 s per waiting id, then 0.001 s from the third on."""

        def __init__(self):
            self.pulls = 0

        def push_messages(self, messages):
            return [m.metadata.message_id for m in messages]

        def pull_messages(self, ids):
            self.pulls += 1
            clock.now += (0.05 if self.pulls < 3 else 0.001) * len(ids)
            first = sorted(ids)[0]
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=first))]

    msgs = [SimpleNamespace(metadata=SimpleNamespace(message_id=f"m{i}")) for i in range(4)]
    replies = client_states.round_trip(Grid(), msgs, deadline=1e9, what="test")
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0", "m1", "m2", "m3"]
    # pulls of 4 ids (0.2 s), then 3 (0.15 s), then 2 ids at 0.001 s each (0.002 s < POLL_S): wait POLL_S
    assert clock.sleeps == [0.2, 0.15, client_states.POLL_S]
