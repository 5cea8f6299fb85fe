"""Vertical split learning (issue 45): PSI, vertical data, the vertical strategy."""

from __future__ import annotations

import csv as _csv
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_app.vertical import psi

from fl_app.vertical import party as vertical_party
from fl_app.vertical import models as V
from fl_app.run.config import RunConfig
from fl_app.data.vertical import PartyTable, load_vertical, read_party_csv
from fl_app.run.errors import ConfigError
from simulation import cli
from simulation.engine import InProcessGrid
from simulation.vertical import run_vertical
from strategies.algorithms.vertical import VerticalSL

BACKENDS = [b for b in psi.BACKENDS if b != "openmined" or psi.openmined_available()]


def _parties(n: int, overlap: float, seed: int = 0) -> tuple[list[str], list[str], set[str]]:
    rng = np.random.default_rng(seed)
    shared = round(overlap * n)
    pool = [f"cust-{v:010d}" for v in rng.choice(10**8, size=2 * n - shared, replace=False)]
    a, b = pool[:n], pool[n - shared:]
    return [a[i] for i in rng.permutation(n)], [b[i] for i in rng.permutation(n)], set(a) & set(b)


# ---------------------------------------------------------------- PSI
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("overlap", [0.5, 0.8, 1.0])
def test_psi_equals_the_true_intersection(backend, overlap):
    a, b, truth = _parties(400, overlap, seed=int(overlap * 10))
    pos, stats = psi.run_psi(a, b, backend)
    assert {a[i] for i in pos} == truth and len(pos) == len(truth) == round(overlap * 400)
    assert stats.bytes["request"] > 0 and stats.bytes["response"] > 0 and stats.total_seconds > 0
    size, _ = psi.run_psi(a, b, backend, reveal=False)  # cardinality only
    assert size == len(truth)


def test_psi_cardinality_mode_hides_which_ids():
    """With reveal=False (dh) the double encryptions come back shuffled: their order is not the request's."""
    a, b, _ = _parties(200, 0.5)
    rec = psi.Receiver(a, "dh", reveal=False)
    req = rec.request()
    ordered = psi.Sender(b, "dh", reveal=True, seed=3).respond(req)
    shuffled = psi.Sender(b, "dh", reveal=False, seed=3).respond(req)
    assert ordered[:8] == shuffled[:8] and ordered[8:8 + 200 * 32] != shuffled[8:8 + 200 * 32]
    assert rec.intersect(shuffled) == 100


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_party_receives_an_id_outside_the_intersection(backend, monkeypatch):
    """Every message a party receives during the alignment carries no ID (nor its hash) outside the
    intersection, and what each feature party learns is exactly the final intersection."""
    label, f1, _ = _parties(300, 0.8, seed=1)
    f2 = label[:200] + [f"only-f2-{i:06d}" for i in range(50)]
    received: list[bytes] = []
    real_respond, real_request = psi.Sender.respond, psi.Receiver.request

    def respond(self, request):
        received.append(request)  # what the sender receives
        out = real_respond(self, request)
        received.append(out)  # what the receiver receives
        return out

    monkeypatch.setattr(psi.Sender, "respond", respond)
    monkeypatch.setattr(psi.Receiver, "request", real_request)
    final, stats = psi.align(label, [f1, f2], backend)
    assert set(final) == set(label) & set(f1) & set(f2) and len(stats) == 4
    outside = (set(label) | set(f1) | set(f2)) - set(final)
    blob = b"".join(received)
    for x in outside:
        assert x.encode() not in blob and psi._hash_point(x) not in blob
    for ids in (f1, f2):  # a feature party's own view: its positions in the final intersection
        pos, _ = psi.run_psi(ids, final, backend)
        assert {ids[i] for i in pos} == set(final)


def test_psi_one_line_errors():
    with pytest.raises(ConfigError, match="duplicate sample ID 'a'"):
        psi.run_psi(["a", "b", "a"], ["b"], "dh")
    with pytest.raises(ConfigError, match="share no sample ID"):
        psi.align(["a", "b"], [["c", "d"]], "dh")
    with pytest.raises(ConfigError, match="no sample IDs"):
        psi.run_psi([], ["b"], "dh")
    with pytest.raises(ConfigError, match="psi-backend"):
        psi.resolve_backend("rsa")


# ---------------------------------------------------------------- data


DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "vertical").is_dir(), reason="../shared/data/vertical not present")


def _write(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as f:
        w = _csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.mark.parametrize("header,rows,label,features,message", [
    (["key", "x0"], [[1, 0.5]], False, 1, "sample IDs missing"),
    (["id", "x0"], [["", 0.5]], False, 1, "sample IDs missing"),
    (["id", "x0", "x1"], [[1, 0.5, 0.1]], False, 3, "2 feature columns, declared 3"),
    (["id", "y", "x0"], [[1, 0, 0.5]], False, 1, "feature party's file has the label column"),
    (["id", "x0"], [[1, 0.5], [1, 0.7]], False, 1, "duplicate sample ID '1'"),
    (["id", "x0"], [[1, 0.5]], True, 1, "no label column"),
])
def test_party_csv_one_line_errors(tmp_path, header, rows, label, features, message):
    path = _write(tmp_path / "p.csv", header, rows)
    with pytest.raises(ConfigError, match=message) as err:
        read_party_csv(path, label=label, features=features)
    assert "\n" not in str(err.value)


@needs_data
def test_vertical_breast_loads_with_partial_overlap():
    (guest, host), classes = load_vertical("vertical-breast", DATA, overlap=0.8, seed=3)
    assert classes == 2 and guest.x.shape == (455, 10) and host.x.shape == (455, 20)
    assert guest.y is not None and host.y is None and set(guest.y.tolist()) == {0, 1}
    shared = set(guest.ids) & set(host.ids)
    assert 0.55 * 569 < len(shared) < 0.75 * 569  # about 0.8² of the rows
    again, _ = load_vertical("vertical-breast", DATA, overlap=0.8, seed=3)
    assert again[1].ids == host.ids  # seeded


# ---------------------------------------------------------------- numerics
@pytest.mark.parametrize("join", ["concat", "sum"])
def test_vertical_step_equals_the_unsplit_step(join):
    """One vertical step (parties' bottoms, join, top, returned gradients) equals one SGD step of the
    unsplit model on the concatenated columns, to 1e-6."""
    gen = torch.Generator().manual_seed(0)
    dims, h, lr = (3, 5, 4), 6, 0.3
    xs = [torch.randn(16, d, generator=gen) for d in dims]
    y = torch.randint(0, 3, (16,), generator=gen)
    bottoms = [V.bottom_model(d, h, 7, k) for k, d in enumerate(dims)]
    top = V.top_model(V.joined_width(h, 3, join), 3, 7)
    ref_b = [V.bottom_model(d, h, 7, k) for k, d in enumerate(dims)]
    ref_t = V.top_model(V.joined_width(h, 3, join), 3, 7)
    # the unsplit model on the concatenated columns
    x_all = torch.cat(xs, 1)
    cols = torch.split(x_all, dims, 1)
    loss = torch.nn.functional.cross_entropy(ref_t(V.join_embeddings([b(c) for b, c in zip(ref_b, cols)], join)), y)
    loss.backward()
    with torch.no_grad():
        for p in [*ref_t.parameters(), *(q for b in ref_b for q in b.parameters())]:
            p -= lr * p.grad
    # the vertical step
    with torch.no_grad():
        emb = [b(x) for b, x in zip(bottoms, xs)]
    vloss, grads = V.top_step(top, emb, y, join, lr)
    for b, x, g in zip(bottoms, xs, grads):
        V.bottom_backward(b, x, g, lr)
    assert abs(vloss - float(loss.detach())) < 1e-6
    for a, b in zip([*top.parameters(), *(q for m in bottoms for q in m.parameters())],
                    [*ref_t.parameters(), *(q for m in ref_b for q in m.parameters())]):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
    assert all(g.shape == (16, h) for g in grads)


# ---------------------------------------------------------------- the strategy, end to end


STRATEGY = "strategies.algorithms.vertical:VerticalSL"


def _cfg(tmp_path, name="run", **kw) -> RunConfig:
    base = {"strategy": STRATEGY, "dataset": "vertical-breast", "data-dir": str(DATA), "global-iterations": 80,
            "eval-every": 40, "batch-size": 32, "lr": 0.1, "vertical-overlap": 0.9, "psi-backend": "dh",
            "output-dir": str(tmp_path / name)}
    return RunConfig.from_mapping({**base, **kw})


def _metrics(path) -> list[dict]:
    with open(path / "metrics.csv") as f:
        return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in _csv.DictReader(f)]


@needs_data
def test_vertical_sl_learns_breast_cancer_deterministically(tmp_path):
    """Held-out accuracy of the vertical run on breast cancer (10 + 20 columns, 90 % kept per party) above 0.9;
    a second run with the same seed writes the same metrics.csv but for wall time; the server as the label
    party gives the same accuracies and losses."""
    s = run_vertical(_cfg(tmp_path, "a"), VerticalSL)
    assert s["final_accuracy"] >= 0.9 and 400 < s["intersection"] < 520 and s["psi_bytes"] > 0
    rows = _metrics(tmp_path / "a")
    assert [int(r["global_iteration"]) for r in rows] == [0, 40, 80]
    assert float(rows[0]["test_accuracy"]) < float(rows[-1]["test_accuracy"])
    assert float(rows[0]["virtual_time_s"]) > 0  # the PSI is on the clock before the first step
    run_vertical(_cfg(tmp_path, "b"), VerticalSL)
    assert _metrics(tmp_path / "b") == rows
    run_vertical(_cfg(tmp_path, "c", **{"label-party": "server"}), VerticalSL)
    server = _metrics(tmp_path / "c")
    assert [(r["test_accuracy"], r["test_loss"]) for r in server] == [(r["test_accuracy"], r["test_loss"]) for r in rows]
    assert int(server[-1]["bytes_up"]) < int(rows[-1]["bytes_up"])  # the label party's messages stay in the server


def test_feature_party_receives_no_id_outside_the_intersection(tmp_path, monkeypatch):
    """Every message the relay delivers to a feature party, through PSI and training, holds no ID outside the
    intersection (as text or as its PSI hash); the party's aligned rows are exactly the intersection."""
    rng = np.random.default_rng(5)
    label_ids = [f"customer-{i:06d}-L" for i in range(300)]
    ids = [f"customer-{i:06d}-L" for i in range(60, 300)] + [f"customer-{i:06d}-F" for i in range(40)]
    tables = [PartyTable(label_ids, rng.normal(size=(300, 4)).astype(np.float32), rng.integers(0, 2, 300)),
              PartyTable(ids, rng.normal(size=(280, 3)).astype(np.float32))]
    monkeypatch.setattr(vertical_party, "_table", lambda *a: (tables[a[-1]], 2))
    seen: list[bytes] = []
    push = InProcessGrid.push_messages

    def spy(self, messages):
        messages = list(messages)
        for m in messages:
            if self.contexts[m.metadata.dst_node_id].node_config[vertical_party.PARTY] == 1:
                for rec in m.content.config_records.values():
                    seen.extend(v if isinstance(v, bytes) else str(v).encode() for v in rec.values())
                for rec in m.content.array_records.values():
                    seen.extend(a.data for a in rec.values())
        return push(self, messages)

    monkeypatch.setattr(InProcessGrid, "push_messages", spy)
    grid_state = {}
    real = vertical_party.handle

    def keep_state(content, state, node_config):
        grid_state[node_config[vertical_party.PARTY]] = state
        return real(content, state, node_config)

    monkeypatch.setattr(vertical_party, "handle", keep_state)
    s = run_vertical(_cfg(tmp_path, global_iterations=2, eval_every=1, dataset="vertical-breast"), VerticalSL)
    shared = set(label_ids) & set(ids)
    assert s["intersection"] == len(shared) == 240
    blob = b"".join(seen)
    for x in (set(label_ids) | set(ids)) - shared:
        assert x.encode() not in blob and psi._hash_point(x) not in blob
    rows = vertical_party.record_tensor(grid_state[1][vertical_party.ROWS], "rows").numpy()
    assert [ids[i] for i in rows] == sorted(shared)


def test_vertical_cli_refuses_an_image_dataset_in_one_line(capsys):
    code = cli.main(["run", "--quiet", f"strategy={STRATEGY}", "dataset=mnist-5k"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and err.count("\n") == 0 and "needs a vertical dataset" in err


@pytest.mark.slow
@needs_data
def test_returned_gradients_leak_labels_and_marvell_reduces_it(tmp_path):
    """Li et al.'s direction attack on the gradients the feature party receives reads the labels undefended
    (AUC > 0.95 on breast cancer) and drops below 0.75 under Marvell at s=4, accuracy kept above 0.9."""
    from benchmarks.vertical_leakage import measure

    plain = measure(_cfg(tmp_path, "p", global_iterations=30, eval_every=0))
    marvell = measure(_cfg(tmp_path, "m", global_iterations=30, eval_every=0,
                           **{"label-defence": "marvell", "label-power": 4.0}))
    assert plain["direction_auc"] > 0.95 and plain["noise_power"] == 0.0
    assert marvell["direction_auc"] < 0.75 and marvell["noise_power"] > 0 and marvell["accuracy"] > 0.9


def test_a_label_defence_without_its_strength_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="label-defence=marvell with label-power > 0"):
        run_vertical(_cfg(tmp_path, **{"label-defence": "marvell"}), VerticalSL)


def test_no_shared_id_stops_the_run_in_one_line(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    tables = [PartyTable([f"a{i}" for i in range(50)], rng.normal(size=(50, 2)).astype(np.float32),
                         rng.integers(0, 2, 50)),
              PartyTable([f"b{i}" for i in range(50)], rng.normal(size=(50, 2)).astype(np.float32))]
    monkeypatch.setattr(vertical_party, "_table", lambda *a: (tables[a[-1]], 2))
    with pytest.raises(ConfigError, match="party 0: PSI: the parties share no sample ID") as err:
        run_vertical(_cfg(tmp_path), VerticalSL)
    assert "\n" not in str(err.value)


@pytest.mark.e2e
@needs_data
def test_ray_engine_writes_the_in_process_metrics(tmp_path):
    """The same vertical run on Flower's Ray simulation engine writes the in-process run's metrics.csv, in every
    column but wall time."""
    run_vertical(_cfg(tmp_path, "inproc", global_iterations=40, eval_every=20), VerticalSL)
    run_vertical(_cfg(tmp_path, "ray", global_iterations=40, eval_every=20), VerticalSL, engine="ray")
    assert _metrics(tmp_path / "ray") == _metrics(tmp_path / "inproc")


@needs_data
def test_cardinality_mode_gives_the_size_and_trains_nothing(tmp_path):
    """vertical-psi=cardinality: the label party learns |X_L ∩ X_1| (equal to the true size) and no row is aligned."""
    cfg = _cfg(tmp_path, "card", **{"vertical-psi": "cardinality"})
    s = run_vertical(cfg, VerticalSL)
    (guest, host), _ = load_vertical("vertical-breast", DATA, overlap=0.9, seed=0)
    assert s["pairwise_intersections"] == {"1": len(set(guest.ids) & set(host.ids))} and s["psi_bytes"] > 0
    assert not (tmp_path / "card" / "metrics.csv").exists()


@pytest.mark.parametrize("pair,message", [
    ("model=resnet18", "model=resnet18: strategy=vertical-sl does not read it"),
    ("momentum=0.5", "momentum=0.5: strategy=vertical-sl does not read it"),
    ("clock=wall", "clock=wall: a vertical run keeps its own virtual clock"),
    ("num-clients=30", "num-clients=30: a vertical run's nodes are its parties"),
])
def test_a_key_the_vertical_run_does_not_read_stops_it_in_one_line(tmp_path, capsys, pair, message):
    """No input accepted silently: every core key a vertical run does not read stops it with exit 2 and one line
    naming the key, before any output."""
    code = cli.main(["run", "--quiet", f"strategy={STRATEGY}", "dataset=vertical-breast", f"data-dir={DATA}",
                     f"output-dir={tmp_path / 'out'}", pair])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and message in err, err
    assert not (tmp_path / "out").exists()


class _Killed(BaseException):
    """Stands for a kill: not an Exception, so nothing in the run handles it."""


def _killed_run(tmp_path: Path, monkeypatch, holder: str = "node") -> Path:
    """An uninterrupted run in ``tmp_path/reference`` and, in ``tmp_path/killed``, the same with checkpoint-every=15
    of 30 iterations stopped right after its row of iteration 20; returns the killed run's directory."""
    from simulation.outputs.records import RunRecorder

    keys = {"strategy": "vertical-sl", "global-iterations": 30, "eval-every": 10, "label-party": holder}
    run_vertical(_cfg(tmp_path, "reference", **keys), VerticalSL)
    append = RunRecorder.append

    def append_then_stop(self, row):
        append(self, row)
        if row["global_iteration"] == 20:
            raise _Killed

    with monkeypatch.context() as m:
        m.setattr(RunRecorder, "append", append_then_stop)
        with pytest.raises(_Killed):
            run_vertical(_cfg(tmp_path, "killed", **keys, **{"checkpoint-every": 15}), VerticalSL)
    return tmp_path / "killed"


@needs_data
@pytest.mark.parametrize("holder", ["node", "server"])
def test_a_killed_run_resumes_from_its_checkpoint_without_psi_to_the_uninterrupted_metrics(tmp_path, monkeypatch,
                                                                                           holder):
    """checkpoint-every=15 of 30 iterations, the run stopped right after the row of iteration 20, then
    ``sflower run resume=RUN_DIR``: metrics.csv equals an uninterrupted run's in every column but wall time (virtual
    time, bytes and exchanges included), the resumed run sends no PSI message (the aligned rows and the split come
    back from the checkpoint), and the checkpoint holds the party nodes' states sealed only."""
    from strategies.core import checkpoint as ckpt

    run = _killed_run(tmp_path, monkeypatch, holder)
    meta, state = ckpt.read(run / ckpt.CHECKPOINT_FILE)
    assert meta["global_iteration"] == 15 and meta["rows"] == 2 and len(_metrics(run)) == 3
    saved = ckpt.loads(state, {})
    assert sorted(saved["clients"]) == ([0, 1] if holder == "node" else [1])  # the party nodes' states, sealed
    assert all(set(c.keys()) == {"sealed"} for c in saved["clients"].values())
    assert ("vertical.top" in saved["strategy"]["server_state"]) == (holder == "server")  # the server's label party
    ops: list[str] = []
    handle = vertical_party.handle
    monkeypatch.setattr(vertical_party, "handle", lambda c, st, nc: (ops.append(str(c["vertical"]["op"])),
                                                                     handle(c, st, nc))[1])
    stop = ["checkpoint-every=0"] if holder == "node" else []  # a resume may stop checkpointing: the keys stay found
    assert cli.main(["run", "-q", f"resume={run}", f"data-dir={DATA}", *stop]) == 0
    assert ops and not [op for op in ops if op.startswith("psi")] and "backward" in ops
    assert _metrics(run) == _metrics(tmp_path / "reference")
    assert [int(r["global_iteration"]) for r in _metrics(run)] == [0, 10, 20, 30]


@needs_data
def test_the_serverapp_resumes_a_killed_vertical_run(tmp_path, monkeypatch):
    """Under ``flwr run`` (the ServerApp's main, here on an in-process grid of the two parties): ``--run-config
    "resume='RUN_DIR' data-dir='...'"`` continues the killed run from its checkpoint to the uninterrupted run's
    metrics, and leaves the ``sflower`` logger as it found it."""
    from types import SimpleNamespace

    from simulation import server_app
    from simulation.engine import _task_identity

    run = _killed_run(tmp_path, monkeypatch)
    grid = InProcessGrid(vertical_party.app, 2, 0, [{vertical_party.PARTY: k} for k in (0, 1)])
    given = {"resume": str(run), "data-dir": str(DATA)}
    grid.run.override_config = given
    sflower_log = logging.getLogger("sflower")
    before = (list(sflower_log.handlers), sflower_log.level, sflower_log.propagate)
    with _task_identity(grid.run.run_id):
        server_app.main(grid, SimpleNamespace(run_config=given))
    assert _metrics(run) == _metrics(tmp_path / "reference")
    # the ServerApp ran in this process: it leaves the logger as it found it (else caplog misses later records)
    assert (list(sflower_log.handlers), sflower_log.level, sflower_log.propagate) == before


@pytest.mark.e2e
@needs_data
def test_a_checkpoint_written_on_ray_resumes_in_process(tmp_path):
    """Checkpoints on Flower's Ray engine: a Ray run with checkpoint-every=15 of 30 writes the uninterrupted run's
    metrics, and resuming its checkpoint of iteration 15 in-process (each party's sealed state opened with the key
    its Ray node left in the run directory) rewrites rows 20 and 30 to the same metrics."""
    from strategies.core import checkpoint as ckpt

    keys = {"strategy": "vertical-sl", "global-iterations": 30, "eval-every": 10}
    run_vertical(_cfg(tmp_path, "reference", **keys), VerticalSL)
    run_vertical(_cfg(tmp_path, "ray", **keys, **{"checkpoint-every": 15}), VerticalSL, engine="ray")
    run = tmp_path / "ray"
    assert _metrics(run) == _metrics(tmp_path / "reference")
    assert ckpt.read_meta(run / ckpt.CHECKPOINT_FILE)["global_iteration"] == 15
    assert sorted(p.parent.name for p in (run / "nodes").rglob("checkpoint.key")) == ["node-0", "node-1"]
    assert cli.main(["run", "-q", f"resume={run}", f"data-dir={DATA}"]) == 0
    assert _metrics(run) == _metrics(tmp_path / "reference")


@needs_data
def test_tensorboard_tracker_logs_the_vertical_metrics(tmp_path):
    """tracker=tensorboard on a vertical run: the event file holds metrics.csv's accuracy series, the
    vertical columns beside it."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_vertical(_cfg(tmp_path, "tb", **{"tracker": "tensorboard"}), VerticalSL)
    rows = _metrics(tmp_path / "tb")
    ea = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    ea.Reload()
    acc = ea.Scalars("test_accuracy")
    assert [e.step for e in acc] == [int(r["global_iteration"]) for r in rows] == [0, 40, 80]
    assert [e.value for e in acc] == pytest.approx([float(r["test_accuracy"]) for r in rows], abs=1e-7)
    assert {"psi_bytes", "intersection", "virtual_time_s"} <= set(ea.Tags()["scalars"])


@needs_data
def test_a_sweep_of_vertical_runs_collects_one_table(tmp_path, capsys):
    """``sflower sweep`` over vertical-sl's ``vertical-join`` and two seeds: four completed runs in one table, each
    run's metrics.csv that of the same keys run alone; a second sweep skips them all."""
    from simulation.sweep import run_sweep

    path = tmp_path / "v.toml"
    path.write_text(f"""
[meta]
target-accuracy = 0.9
[base]
strategy = "vertical-sl"
dataset = "vertical-breast"
data-dir = "{DATA}"
global-iterations = 20
eval-every = 10
vertical-overlap = 0.9
psi-backend = "dh"
[grid]
vertical-join = ["concat", "sum"]
seed = [0, 1]
""")
    table = run_sweep(path, tmp_path / "out", progress=False)
    assert len(table) == 4 and set(table["status"]) == {"completed"} and set(table["strategy"]) == {"vertical-sl"}
    alone = run_vertical(_cfg(tmp_path, "alone", **{"strategy": "vertical-sl", "global-iterations": 20,
                                                     "eval-every": 10, "vertical-join": "sum", "seed": 1,
                                                     "batch-size": 32, "lr": 0.01}), VerticalSL)
    (one,) = [d for d in (tmp_path / "out").iterdir() if d.is_dir() and "sum" in d.name and "seed=1" in d.name]
    assert _metrics(one) == _metrics(tmp_path / "alone") and alone["status"] == "completed"
    capsys.readouterr()
    run_sweep(path, tmp_path / "out", progress=False)
    assert capsys.readouterr().out.count("skipped") == 4


def test_checkpoints_of_a_cardinality_only_run_are_refused_in_one_line(tmp_path, capsys):
    """vertical-psi=cardinality trains nothing: checkpoint-every with it stops the run with exit 2 and one line."""
    code = cli.main(["run", "--quiet", f"strategy={STRATEGY}", "dataset=vertical-breast", f"data-dir={DATA}",
                     "vertical-psi=cardinality", "checkpoint-every=5", f"output-dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "vertical-psi=cardinality trains nothing" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
@needs_data
def test_flwr_run_in_simulation_writes_the_in_process_metrics(tmp_path):
    """``flwr run . --run-config 'strategy="vertical-sl" ...'`` on a simulation SuperLink with 2 virtual SuperNodes:
    the ServerApp hands the run to the vertical strategy, the ClientApp answers ``query.vertical``, and the
    metrics.csv equals the in-process run's in every column but wall time."""
    from simulation.deploy.cluster import Deployment
    from simulation.deploy.processes import flower_binaries_missing
    from tests.test_engines import wait_for_summary

    if flower_binaries_missing():
        pytest.skip("Flower's binaries are not installed")
    keys = {"strategy": "vertical-sl", "dataset": "vertical-breast", "data-dir": str(DATA), "global-iterations": 40,
            "eval-every": 20, "batch-size": 32, "lr": 0.1, "vertical-overlap": 0.9, "psi-backend": "dh"}
    run_vertical(RunConfig.from_mapping({**keys, "output-dir": str(tmp_path / "inproc")}), VerticalSL)
    out = tmp_path / "flwr"
    with Deployment(tmp_path / "deploy", tls=False, auth=False) as dep:
        dep.start_superlink(simulation=True)
        runner = dep.run_app({**keys, "output-dir": str(out)},
                             federation_config="num-supernodes=2 client-resources-num-cpus=1 init-args-num-cpus=1")
        log = wait_for_summary(out, runner, 300)
    assert (out / "summary.json").exists(), log[-3000:]
    assert _metrics(out) == _metrics(tmp_path / "inproc")
    assert len(_metrics(out)) == 3


@needs_data
def test_a_party_data_dir_holds_only_its_own_file_and_loads_the_same_table(tmp_path):
    """``write_party_dirs`` gives each party a directory with only its CSV (the label party's with ``y``), and the
    party's table read from it alone equals its table from the shared data, for breast cancer and for a small
    vertical Fashion-MNIST with 3 parties (its bands written as CSV read back to the same float32)."""
    from fl_app.data.vertical import load_party, write_party_dirs

    dirs = write_party_dirs("vertical-breast", DATA, tmp_path / "b")
    assert [sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()) for d in dirs] == \
        [["vertical/breast_hetero_guest.csv"], ["vertical/breast_hetero_host.csv"]]
    full, _ = load_vertical("vertical-breast", DATA, overlap=0.9, seed=0)
    for k, d in enumerate(dirs):
        own, classes = load_party("vertical-breast", d, k, overlap=0.9, seed=0)
        assert classes == 2 and own.ids == full[k].ids and np.array_equal(own.x, full[k].x)
        assert (own.y is None) == (k == 1) and (k == 1 or np.array_equal(own.y, full[k].y))
    with pytest.raises(ConfigError, match="breast_hetero_guest.csv: no such file"):
        load_party("vertical-breast", dirs[1], 0)  # a party's dir has nobody else's file
    fm = write_party_dirs("vertical-fmnist", DATA, tmp_path / "f", parties=3, rows=40)
    assert [len(list(d.rglob("*.csv"))) for d in fm] == [1, 1, 1]
    full, _ = load_vertical("vertical-fmnist", DATA, overlap=0.9, parties=3, rows=40)
    for k, d in enumerate(fm):
        own, _ = load_party("vertical-fmnist", d, k, overlap=0.9, parties=3, rows=40)
        assert own.ids == full[k].ids and own.x.dtype == np.float32 and np.array_equal(own.x, full[k].x)


def test_deploy_takes_one_supernode_per_party_and_reads_no_unread_key():
    """``sflower deploy strategy=vertical-sl``: num-clients and clock are not set for it (it reads neither), and
    a node count other than one per party is one line."""
    from simulation.deploy.options import parse_deploy_args
    from simulation.deploy.vertical import check_vertical_deploy

    opts = parse_deploy_args({"strategy": "vertical-sl", "dataset": "vertical-breast", "nodes": "2"})
    assert not {"num-clients", "clock", "concurrency"} & set(opts.run_pairs)
    check_vertical_deploy(opts.cfg, 2)
    with pytest.raises(ConfigError, match="nodes=3: vertical-breast with label-party=node runs on 2 SuperNodes"):
        check_vertical_deploy(opts.cfg, 3)
    fm = parse_deploy_args({"strategy": "vertical-sl", "dataset": "vertical-fmnist", "vertical-parties": "3"}).cfg
    check_vertical_deploy(fm, 3)


@pytest.mark.e2e
@needs_data
def test_deployed_on_supernodes_with_their_own_files_writes_the_in_process_metrics(tmp_path):
    """``sflower deploy strategy=vertical-sl dataset=vertical-breast nodes=2``: TLS, SuperNode authentication and
    the session transport; each SuperNode's data-dir holds only its party's CSV; metrics.csv equals the
    in-process run's in every column but wall time."""
    import json

    from simulation.deploy.options import parse_deploy_args
    from simulation.deploy.processes import flower_binaries_missing
    from simulation.deploy.run import deploy

    if flower_binaries_missing():
        pytest.skip("Flower's binaries are not installed")
    keys = {"strategy": "vertical-sl", "dataset": "vertical-breast", "data-dir": str(DATA), "global-iterations": 10,
            "eval-every": 5, "batch-size": 32, "lr": 0.1, "vertical-overlap": 0.9, "psi-backend": "dh"}
    run_vertical(RunConfig.from_mapping({**keys, "output-dir": str(tmp_path / "inproc")}), VerticalSL)
    s = deploy(parse_deploy_args({**{k: str(v) for k, v in keys.items()}, "nodes": "2", "fast": "true",
                                  "timeout": "240", "run-dir": str(tmp_path / "run")}), quiet=True)
    run = Path(s["deploy"]["run_dir"])
    assert s["deploy"]["tls"] and s["deploy"]["auth"] and s["status"] == "completed"
    assert s["wire_bytes_up"] > s["bytes_up"] > 0 and s["wire_bytes_down"] > 0  # the messages took the sessions
    assert "<given>" == json.loads((run / "out" / "config.json").read_text())["config"]["session-certificate"]
    assert [sorted(p.name for p in (run / "data" / f"party-{k}").rglob("*") if p.is_file()) for k in (0, 1)] == \
        [["breast_hetero_guest.csv"], ["breast_hetero_host.csv"]]
    assert _metrics(run / "out") == _metrics(tmp_path / "inproc") and len(_metrics(run / "out")) == 3


@pytest.mark.e2e
@needs_data
def test_deployed_with_the_server_as_label_party_writes_the_in_process_metrics(tmp_path):
    """``sflower deploy strategy=vertical-sl label-party=server nodes=1``: the ServerApp holds the labels and the top
    model (Flower's own vertical-FL example's shape) and reads the label party's CSV alone (its data-dir is
    ``RUN_DIR/data/party-0``); the one SuperNode, the feature party, has only its own file; TLS, authentication and
    the session transport; metrics.csv equals the in-process run's (same keys) in every column but wall time."""
    import json

    from simulation.deploy.options import parse_deploy_args
    from simulation.deploy.processes import flower_binaries_missing
    from simulation.deploy.run import deploy

    if flower_binaries_missing():
        pytest.skip("Flower's binaries are not installed")
    keys = {"strategy": "vertical-sl", "dataset": "vertical-breast", "data-dir": str(DATA), "global-iterations": 10,
            "eval-every": 5, "batch-size": 32, "lr": 0.1, "vertical-overlap": 0.9, "psi-backend": "dh",
            "label-party": "server"}
    run_vertical(RunConfig.from_mapping({**keys, "output-dir": str(tmp_path / "inproc")}), VerticalSL)
    s = deploy(parse_deploy_args({**{k: str(v) for k, v in keys.items()}, "nodes": "1", "fast": "true",
                                  "timeout": "240", "run-dir": str(tmp_path / "run")}), quiet=True)
    run = Path(s["deploy"]["run_dir"])
    assert s["deploy"]["tls"] and s["deploy"]["auth"] and s["status"] == "completed" and s["label_party"] == "server"
    assert s["wire_bytes_up"] > s["bytes_up"] > 0  # the feature party's messages took its session
    config = json.loads((run / "out" / "config.json").read_text())["config"]
    assert Path(config["data-dir"]) == (run / "data" / "party-0").resolve()  # the ServerApp's own file only
    assert [sorted(p.name for p in (run / "data" / f"party-{k}").rglob("*") if p.is_file()) for k in (0, 1)] == \
        [["breast_hetero_guest.csv"], ["breast_hetero_host.csv"]]
    assert _metrics(run / "out") == _metrics(tmp_path / "inproc") and len(_metrics(run / "out")) == 3


@pytest.mark.e2e
@needs_data
def test_a_deployed_serverapp_killed_and_resumed_writes_the_in_process_metrics(tmp_path):
    """``sflower deploy ... checkpoint-every=50 kill-server-after=1``: the ServerApp is SIGKILLed once a checkpoint
    is on disk and ``flwr run`` starts again with ``resume``; the parties' states come back from the checkpoint
    (sealed on their SuperNodes) and metrics.csv equals the uninterrupted in-process run's but for wall time."""
    from simulation.deploy.options import parse_deploy_args
    from simulation.deploy.processes import flower_binaries_missing
    from simulation.deploy.run import deploy

    if flower_binaries_missing():
        pytest.skip("Flower's binaries are not installed")
    keys = {"strategy": "vertical-sl", "dataset": "vertical-breast", "data-dir": str(DATA), "global-iterations": 300,
            "eval-every": 50, "batch-size": 32, "lr": 0.1, "vertical-overlap": 0.9, "psi-backend": "dh"}
    run_vertical(RunConfig.from_mapping({**keys, "output-dir": str(tmp_path / "inproc")}), VerticalSL)
    s = deploy(parse_deploy_args({**{k: str(v) for k, v in keys.items()}, "checkpoint-every": "50", "nodes": "2",
                                  "kill-server-after": "1", "fast": "true", "timeout": "400",
                                  "run-dir": str(tmp_path / "run")}), quiet=True)
    events = [e["event"] for e in s["deploy"]["events"]]
    assert any(e.startswith("killed the ServerApp") for e in events) and "restarted the ServerApp with resume" in events
    assert s["status"] == "completed"
    assert _metrics(Path(s["deploy"]["run_dir"]) / "out") == _metrics(tmp_path / "inproc")


# scikit-learn's bundled breast cancer (vertical-breast-sklearn) and flwr-datasets' vertical partitioners

needs_sklearn = pytest.mark.skipif(__import__("importlib.util").util.find_spec("sklearn") is None,
                                   reason="scikit-learn not installed (pip install 'sflower[vertical]')")


@pytest.mark.parametrize("parties", [2, 3, 4])
def test_vertical_fmnist_bands_from_the_partitioner_equal_the_contiguous_split(parties):
    """VerticalEvenPartitioner over the 28 pixel columns gives vertical-fmnist the bands it always had,
    ``np.array_split(np.arange(28), parties)`` (the label party the leftmost), so its numbers do not change."""
    from fl_app.data.vertical import fmnist_bands

    bands = fmnist_bands(parties)
    old = np.array_split(np.arange(28), parties)
    assert len(bands) == parties and all(np.array_equal(b, o) for b, o in zip(bands, old))


def test_vertical_fmnist_party_count_outside_2_to_4_is_one_line():
    from fl_app.data.vertical import fmnist_bands

    with pytest.raises(ConfigError, match=r"vertical-parties=5: .*2 to 4 parties") as err:
        fmnist_bands(5)
    assert "\n" not in str(err.value)


@needs_sklearn
def test_sklearn_breast_loads_569_rows_and_30_features_across_2_parties():
    """The label party holds y and the 10 ``mean ...`` columns, the feature party the 10 ``... error`` and 10
    ``worst ...`` ones (VerticalSizePartitioner([10, 20])), standardised; the overlap is seeded as for the others."""
    from sklearn.datasets import load_breast_cancer

    from fl_app.data.vertical import party_count, sklearn_breast

    (label, other), columns = sklearn_breast()
    names = list(load_breast_cancer().feature_names)
    assert columns == [names[:10], names[10:]] and columns[0][0] == "mean radius" and columns[1][-1] == "worst fractal dimension"
    assert label.x.shape == (569, 10) and other.x.shape == (569, 20) and label.ids == other.ids
    assert label.y is not None and other.y is None and np.bincount(label.y).tolist() == [212, 357]
    assert label.x.dtype == np.float32 and np.allclose(label.x.mean(0), 0, atol=1e-5) and np.allclose(other.x.std(0), 1, atol=1e-4)
    assert party_count("vertical-breast-sklearn") == 2
    (g, h), classes = load_vertical("vertical-breast-sklearn", DATA, overlap=0.8, seed=3)
    assert classes == 2 and g.x.shape == (455, 10) and h.x.shape == (455, 20)
    assert 0.55 * 569 < len(set(g.ids) & set(h.ids)) < 0.75 * 569
    again, _ = load_vertical("vertical-breast-sklearn", DATA, overlap=0.8, seed=3)
    assert again[1].ids == h.ids and np.array_equal(again[0].x, g.x)


@needs_sklearn
def test_sklearn_breast_party_dirs_hold_only_their_own_file_and_load_the_same_table(tmp_path):
    from fl_app.data.vertical import load_party, write_party_dirs

    dirs = write_party_dirs("vertical-breast-sklearn", DATA, tmp_path / "s")
    assert [sorted(p.name for p in d.rglob("*.csv")) for d in dirs] == \
        [["vertical-breast-sklearn-p0of2.csv"], ["vertical-breast-sklearn-p1of2.csv"]]
    full, _ = load_vertical("vertical-breast-sklearn", DATA, overlap=0.9, seed=0)
    for k, d in enumerate(dirs):
        own, classes = load_party("vertical-breast-sklearn", d, k, overlap=0.9, seed=0)
        assert classes == 2 and own.ids == full[k].ids and np.array_equal(own.x, full[k].x)
        assert (own.y is None) == (k == 1)


@needs_sklearn
def test_vertical_sl_learns_sklearn_breast_cancer(tmp_path):
    """300 mini-batches of 32 at lr 0.1, 90 % of the rows kept per party: held-out accuracy 0.9891 measured
    (``sflower run`` with the same keys), so 0.95 with a margin."""
    s = run_vertical(_cfg(tmp_path, "skl", dataset="vertical-breast-sklearn", **{"global-iterations": 300,
                                                                                  "eval-every": 150}), VerticalSL)
    assert s["final_accuracy"] >= 0.95 and 400 < s["intersection"] < 520
    rows = _metrics(tmp_path / "skl")
    assert float(rows[0]["test_accuracy"]) < float(rows[-1]["test_accuracy"])


def test_sklearn_breast_without_scikit_learn_is_one_line(monkeypatch):
    import sys

    from fl_app.data.vertical import sklearn_breast

    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # import fails
    with pytest.raises(ConfigError, match=r"^dataset=vertical-breast-sklearn needs scikit-learn: "
                                          r"pip install 'sflower\[vertical\]'$"):
        sklearn_breast()


def test_sklearn_breast_has_two_parties_only(tmp_path):
    from simulation.vertical_server import check_vertical

    with pytest.raises(ConfigError, match="vertical-parties=3: vertical-breast-sklearn has 2 parties"):
        check_vertical(_cfg(tmp_path, dataset="vertical-breast-sklearn", **{"vertical-parties": 3}))
