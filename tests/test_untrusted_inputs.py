"""No file that sflower reads can run code (issue 43, part 1): a run directory is untrusted input.

Every reader below gets a planted payload (a pickle whose ``__reduce__``
creates a marker file, or the JSON/TOML/safetensors equivalent: a config
pointing ``data-dir`` or a plugin strategy into the run directory, absurd
sizes, deep nesting). No marker ever appears, and invalid input gives one
line (:class:`~fl_app.run.errors.ConfigError`; the CLI: exit 2).

The readers covered (from ``grep -n "open(\\|read_text\\|read_bytes\\|load(\\|np.load\\|pickle\\|json.load\\|tomllib"``):

==================================================  ============================================
reader                                              test
==================================================  ============================================
checkpoint header (``checkpoint.read_meta``)        test_resume_refuses_a_run_dirs_data_dir, fuzz
checkpoint body (``checkpoint.read``/``loads``)     test_checkpoint_body_*, the fuzz tests
``config.json`` (``sflower attack``, label attack)  test_attack_config_*, test_e2e_attack
``config.json`` (``_numerics_of`` on resume)        test_numerics_of_a_bad_config_json
``summary.json``, ``inversion.json`` (attack/sweep) test_summary_and_sweep_json
CIFAR pickles (``files._read_cifar_file``)          test_cifar_*
IDX files (``files.read_idx``)                      test_idx_absurd_shape
``received.npz``, ``client-K.npz``                  test_npz_records_refuse_pickles
``tail-K.npys`` (``privacy.read_tail_truth``)       test_npz_records_refuse_pickles
``model.safetensors``, ``model.json``               test_saved_model_*, test_evaluate_refuses_*
sweep files (``sweep.load_sweep``)                  test_sweep_and_preset_toml
presets (``config.preset_values``)                  test_sweep_and_preset_toml, test_attack_config_*
``session-key``/``-certificate``/``-ca``            test_resume_refuses_a_run_dirs_tls_*, test_tls_files_*
==================================================  ============================================

Files sflower writes and reads back in one process (metrics.csv, audit logs, locks) and ``/proc`` are not
run-directory inputs of ``resume``/``attack``; ``test_no_unsafe_deserialiser`` keeps pickle/torch.load out.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fl_app.run.config import RunConfig, preset_values
from fl_app.data import files as D_files
from fl_app.run.errors import ConfigError
from fl_app.run.untrusted import read_json_table, run_dir_config
from strategies.core import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[1]
#: A small budget (as in test_checkpoint.py): mnist-5k, LeNet-5, 3 clients, 2 global iterations.
BASE = {"dataset": "mnist-5k", "model": "lenet5", "cut-layer": 2, "num-clients": 3, "concurrency": 2,
        "partition": "iid", "local-iterations": 2, "batch-size": 8, "global-iterations": 2, "eval-samples": 200,
        "seed": 1, "strategy": "fedbuff"}


class _Evil:
    """Unpickled, creates ``marker``: what a planted pickle could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _one_line(err: BaseException | str) -> str:
    text = str(err)
    assert text and "\n" not in text.strip(), text
    return text


def _plant_cifar(d: Path, marker: Path) -> None:
    """CIFAR-10 batch files whose unpickling would create ``marker``."""
    payload = pickle.dumps({b"data": _Evil(marker), b"labels": [0]}, protocol=4)
    for name in D_files._CIFAR10_FILES:
        (d / name).write_bytes(payload)


def _checkpoint(run_dir: Path, config: dict, state: bytes = b"") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ckpt.CHECKPOINT_FILE
    ckpt.write(path, {"strategy": config.get("strategy", "gas"), "config": config, "global_iteration": 1,
                      "rows": 1}, state)
    return path


# --------------------------------------------------------------------------- CIFAR pickles


class _Py2Pickler(pickle._Pickler):
    """Protocol 2 with Python 2 byte strings (``SHORT_BINSTRING``/``BINSTRING``), as the genuine CIFAR files."""

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_str8(self, obj: bytes) -> None:
        n = len(obj)
        self.write((pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING + struct.pack("<i", n)) + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_str8


def _genuine_cifar_batch(x: np.ndarray, labels: list[int], numpy1: bool) -> bytes:
    """A batch in the layout of ``cifar-10-python.tar.gz`` (dict of byte-string keys, uint8 ``[N, 3072]``)."""
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump({b"batch_label": b"training batch 1 of 5", b"labels": labels, b"data": x,
                                      b"filenames": [b"img_%d.png" % i for i in range(len(labels))]})
    data = buf.getvalue()
    assert b"_codecs" not in data  # Python 2 strings, not Python 3's encode() reduction
    if numpy1:  # the module names of NumPy 1, which wrote the real files
        data = data.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
        assert b"numpy.core.multiarray\n_reconstruct" in data
    return data


@pytest.mark.parametrize("numpy1", [True, False], ids=["numpy1-names", "numpy2-names"])
def test_cifar_genuine_batches_still_load(tmp_path, numpy1):
    """CIFAR-format batches (Python 2 strings, NumPy 1 or 2 global names) load through the restricted unpickler."""
    rng = np.random.default_rng(0)
    expect = []
    for name in D_files._CIFAR10_FILES:
        x = rng.integers(0, 256, (3, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, 3).tolist()
        (tmp_path / name).write_bytes(_genuine_cifar_batch(x, labels, numpy1))
        expect.append((x, labels))
    got_x, got_y = D_files._read_cifar_file(tmp_path / "data_batch_2", b"labels")
    assert np.array_equal(got_x.reshape(3, 3072), expect[1][0]) and got_y.tolist() == expect[1][1]
    ds = D_files._load_cifar("cifar10", tmp_path)
    assert tuple(ds.x_train.shape) == (15, 3, 32, 32) and ds.y_test.tolist() == expect[5][1]


def test_cifar_payload_is_refused_naming_file_and_global(tmp_path):
    """A CIFAR batch that names any other global is refused with one line; the payload never runs."""
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(_Evil(marker))).close()  # the payload works ...
    assert marker.exists()
    marker.unlink()
    _plant_cifar(tmp_path, marker)
    with pytest.raises(ConfigError) as err:
        D_files._load_cifar("cifar10", tmp_path)
    msg = _one_line(err.value)
    assert str(tmp_path / "data_batch_1") in msg and "refused global io.open" in msg
    # other classics: os.system through REDUCE, numpy's own non-array functions, builtins.eval
    for mod, name in (("os", "system"), ("posix", "system"), ("builtins", "eval"), ("numpy", "load"),
                      ("numpy.core.multiarray", "scalar"), ("subprocess", "Popen")):
        raw = b"\x80\x02c" + f"{mod}\n{name}\n".encode() + b"X\x05\x00\x00\x00touch\x85R."
        (tmp_path / "data_batch_1").write_bytes(raw)
        with pytest.raises(ConfigError, match=f"refused global {re.escape(mod)}.{name}"):
            D_files._read_cifar_file(tmp_path / "data_batch_1", b"labels")
    assert not marker.exists()


# --------------------------------------------------------------------------- run configuration (resume, attack)


def test_run_dir_config_checks_like_user_keys(tmp_path):
    """Unknown keys, bad types, out-of-range values, non-scalars: one line naming the file."""
    good = RunConfig.from_mapping(BASE).as_dict()
    assert run_dir_config(good, "x.json")["dataset"] == "mnist-5k"
    for bad, needle in (({**good, "no-such-key": 1}, "unknown run-config key"),
                        ({**good, "lr": "fast"}, "lr='fast' is not a valid float"),
                        ({**good, "num-clients": 0}, "num-clients must be >= 1"),
                        ({**good, "seed": [1, 2]}, "holds list"),
                        ({**good, "dataset": {"x": 1}}, "holds dict"),
                        ([1, 2], "not a table"),
                        ({**{k: v for k, v in good.items() if k != "data-dir"},
                          "strategy-options": "data-dir=/elsewhere"}, "pass data-dir=... yourself"),
                        ({**good, "strategy-options": "data-dir=/elsewhere"}, "given twice"),
                        ({**good, "strategy": "os:system"}, "imports only when you give that strategy="),
                        ({**good, "bad\nkey": 1}, "is not a run-config key"),
                        ({**good, "data-dir": "a\nb"}, "not a run-config value"),
                        ({**good, "lr": float("inf")}, "not a run-config value")):
        with pytest.raises(ConfigError) as err:
            run_dir_config(bad, "RUN/x.json")
        assert needle in _one_line(err.value) and "RUN/x.json" in str(err.value)


def test_run_dir_data_dir_needs_the_users_key(tmp_path):
    """A run dir's data-dir other than the default is refused; the user's own data-dir wins."""
    values = {**RunConfig.from_mapping(BASE).as_dict(), "data-dir": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"names data-dir=.*pass data-dir=\.\.\. yourself"):
        run_dir_config(values, "config.json")
    assert run_dir_config(values, "config.json", {"data-dir": "/mine"})["data-dir"] == str(tmp_path)
    assert RunConfig.from_mapping({**values, "data-dir": "/mine"}).data_dir == "/mine"


def test_resume_refuses_a_run_dirs_data_dir(tmp_path, capsys):
    """resume=DIR whose checkpoint sets dataset=cifar10 and data-dir=DIR (planted pickles): refused before any
    file is read; with the user's own data-dir=DIR the restricted unpickler refuses the pickles."""
    from simulation import cli

    marker = tmp_path / "pwned"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _plant_cifar(run_dir, marker)
    _checkpoint(run_dir, {**RunConfig.from_mapping(BASE).as_dict(), "dataset": "cifar10", "data-dir": str(run_dir)})
    assert cli.main(["run", "-q", f"resume={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert "pass data-dir=... yourself" in err and err.count("\n") == 1
    assert cli.main(["run", "-q", f"resume={run_dir}", f"data-dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert "refused global io.open" in err and err.count("\n") == 1
    assert not marker.exists()


def test_resume_refuses_a_run_dirs_tls_files_and_plugin(tmp_path, capsys, monkeypatch):
    """A checkpoint naming session-key/-certificate/-ca files, a plugin module or a preset file: refused."""
    from simulation import cli

    marker = tmp_path / "pwned"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "evil_plugin_43.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass S:\n    name = 'evil'\n")
    (run_dir / "evil.toml").write_text(f'data-dir = "{run_dir}"\n')
    monkeypatch.syspath_prepend(str(run_dir))
    good = RunConfig.from_mapping(BASE).as_dict()
    for key, value, needle in (("session-key", str(run_dir / "key.pem"), "pass session-key=... yourself"),
                               ("session-certificate", str(run_dir / "c.pem"), "pass session-certificate="),
                               ("session-ca", str(run_dir / "ca.pem"), "pass session-ca="),
                               ("strategy", "evil_plugin_43:S", "imports only when you give"),
                               ("preset", str(run_dir / "evil.toml"), "not one of sflower's presets")):
        _checkpoint(run_dir, {**good, key: value})
        assert cli.main(["run", "-q", f"resume={run_dir}"]) == 2, key
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
    assert not marker.exists()


def test_attack_config_json_is_checked(tmp_path, monkeypatch):
    """sflower attack's config.json: data-dir into the run dir, a plugin module, a preset path, bad JSON,
    a non-table: one line each, before anything is loaded."""
    from simulation.privacy.attack import run_attack

    marker = tmp_path / "pwned"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _plant_cifar(run_dir, marker)
    (run_dir / "evil_plugin_43b.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass S:\n    name = 'e'\n")
    monkeypatch.syspath_prepend(str(run_dir))
    good = RunConfig.from_mapping(BASE).as_dict()
    cases = [({"config": {**good, "dataset": "cifar10", "data-dir": str(run_dir)}}, "pass data-dir=... yourself"),
             ({"config": {**good, "strategy": "evil_plugin_43b:S"}}, "imports only when you give"),
             ({"config": {**good, "lr": -1}}, "lr must be > 0"),
             ({"config": "x"}, "not a table"),
             ([1], "expected a JSON object")]
    for doc, needle in cases:
        (run_dir / "config.json").write_text(json.dumps(doc))
        with pytest.raises(ConfigError) as err:
            run_attack(run_dir)
        assert needle in _one_line(err.value)
    (run_dir / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deep"):
        run_attack(run_dir)
    # the user's own data-dir wins: the planted pickles are then read, and refused
    (run_dir / "config.json").write_text(json.dumps({"config": {**good, "dataset": "cifar10",
                                                                 "data-dir": str(run_dir)}}))
    with pytest.raises(ConfigError, match="refused global io.open"):
        run_attack(run_dir, **{"data-dir": str(run_dir)})
    assert not marker.exists()


def test_numerics_of_a_bad_config_json(tmp_path):
    """resume reads config.json for its numerics mode before anything else: checked, one line."""
    from simulation import cli

    for text, needle in (("{", "not valid JSON"), ('{"config": {"numerics": "turbo"}}', "numerics must be one of")):
        (tmp_path / "config.json").write_text(text)
        args = cli.build_parser().parse_args(["run", f"resume={tmp_path}"])
        with pytest.raises(ConfigError) as err:
            cli._numerics_of(args)
        assert needle in _one_line(err.value)


def test_summary_and_sweep_json(tmp_path, monkeypatch):
    """summary.json, inversion.json: bounded size and depth; the sweep treats an unreadable summary as unfinished."""
    from fl_app.run import untrusted
    from simulation import sweep
    from simulation.outputs import results

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{" * 50_000)
    assert sweep.is_complete(run_dir) is False
    (run_dir / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deep"):
        read_json_table(run_dir / "summary.json")
    monkeypatch.setattr(untrusted, "MAX_JSON_BYTES", 100)
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "pad": "x" * 200}))
    with pytest.raises(ConfigError, match="larger than 100 bytes"):
        read_json_table(run_dir / "summary.json")
    (run_dir / "privacy").mkdir()
    (run_dir / "privacy" / "inversion.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not valid JSON"):
        results.inversion_columns(run_dir)


def test_sweep_and_preset_toml(tmp_path):
    """Sweep files and presets are TOML (data only): deep nesting, bad bytes, wrong tables give one line."""
    from simulation.sweep import load_sweep

    for text in ("a = " + "[" * 100_000 + "]" * 100_000, "\xff = 1", "grid = 3", "[grid]\nseed = [0]\nbase = 1\n",
                 "base = 'x'\n[grid]\nseed = [0]\n"):
        path = tmp_path / "s.toml"
        path.write_bytes(text.encode("utf-8", "surrogateescape") if "\xff" not in text else b"\xff = 1")
        with pytest.raises(ConfigError) as err:
            load_sweep(path)
        _one_line(err.value)
        if text.startswith(("a =", "\xff")):  # a preset is a flat table: the others are valid presets' TOML
            with pytest.raises(ConfigError) as err:
                preset_values(str(path))
            _one_line(err.value)


# --------------------------------------------------------------------------- other files of a run directory


def test_npz_records_refuse_pickles(tmp_path):
    """received.npz / client-K.npz / tail-K.npys holding a pickled object array: never unpickled."""
    from fl_app.privacy.activations import read_tail_truth
    from simulation.privacy.attack import _pairs

    marker = tmp_path / "pwned"
    evil = np.empty(1, dtype=object)
    evil[0] = _Evil(marker)
    run_dir = tmp_path / "run"
    (run_dir / "privacy" / "evaluator").mkdir(parents=True)
    np.savez(run_dir / "privacy" / "received.npz", **{"x-0": evil})
    with pytest.raises(ConfigError) as err:
        _pairs(run_dir, RunConfig.from_mapping({}))
    _one_line(err.value)
    np.savez(run_dir / "privacy" / "received.npz", **{"x-0": np.zeros((1, 2), np.float32)})
    np.savez(run_dir / "privacy" / "evaluator" / "client-0.npz", acts=evil, x=evil)
    with pytest.raises(ConfigError):
        _pairs(run_dir, RunConfig.from_mapping({}))
    (run_dir / "privacy" / "received.npz").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(ConfigError, match="not a readable .npz"):
        _pairs(run_dir, RunConfig.from_mapping({}))
    with open(tmp_path / "tail-0.npys", "wb") as fh:
        np.save(fh, evil, allow_pickle=True)
        np.save(fh, evil, allow_pickle=True)
    g, y = read_tail_truth(tmp_path / "tail-0.npys")
    assert g.size == 0 and y.size == 0
    assert not marker.exists()


def test_idx_absurd_shape(tmp_path):
    """An IDX file whose header claims 2^31 x 2^31 images: one line, nothing allocated."""
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes((2051).to_bytes(4, "big") + (2**31 - 1).to_bytes(4, "big") * 3 + b"\0" * 16)
    with pytest.raises(ConfigError, match="data bytes, expected"):
        D_files.read_idx(path, 2051)


def _saved_model_dir(tmp_path: Path, shape: tuple[int, int, int] = (1, 28, 28)) -> Path:
    import torch
    from fl_app.models import build_model
    from simulation.outputs.saved_model import FORMAT, save_model

    run_dir = tmp_path / "saved"
    run_dir.mkdir()
    model = build_model("lenet5", shape, 10)
    save_model(run_dir / "model.safetensors", model, {"format": FORMAT, "model": "lenet5", "input-shape": list(shape),
                                                     "num-classes": 10, "cut-layer": 2, "dataset": "mnist-5k"})
    del torch
    return run_dir


def test_saved_model_safetensors_and_json(tmp_path):
    """model.safetensors with absurd sizes, model.json nested deep or describing an absurd model: one line."""
    from simulation.outputs.saved_model import load_saved_model

    run_dir = _saved_model_dir(tmp_path)
    assert load_saved_model(run_dir).model is not None
    weights, meta = run_dir / "model.safetensors", json.loads((run_dir / "model.json").read_text())
    good = weights.read_bytes()
    (n,) = struct.unpack("<Q", good[:8])
    header = json.loads(good[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"] = [0, 2**62]  # claims 4 EiB of data
    text = json.dumps(header).encode()
    for data in (struct.pack("<Q", 2**63) + good[8:], good[:8] + b"{" * (n - 1) + good[8 + n - 1:],
                 struct.pack("<Q", len(text)) + text + good[8 + n:], good[: len(good) // 2]):
        weights.write_bytes(data)
        with pytest.raises(ConfigError) as err:
            load_saved_model(run_dir)
        _one_line(err.value)
    weights.write_bytes(good)
    for bad in ({**meta, "num-classes": 10**12}, {**meta, "input-shape": [1, 2**40, 28]},
                {**meta, "input-shape": "abc"}, {**meta, "client-models": "../../etc/passwd", "clients": [0]}):
        (run_dir / "model.json").write_text(json.dumps(bad))
        with pytest.raises(ConfigError) as err:
            load_saved_model(run_dir)
        _one_line(err.value)
    (run_dir / "model.json").write_text("[" * 100_000)
    with pytest.raises(ConfigError, match="nested too deep|not valid JSON"):
        load_saved_model(run_dir)


def test_evaluate_refuses_a_model_jsons_data_dir(tmp_path, capsys):
    """sflower evaluate: model.json recording dataset=cifar10 and data-dir=RUN_DIR (planted pickles) is refused
    unless the user names data-dir; then the restricted unpickler refuses the pickles. No marker."""
    from simulation import cli

    marker = tmp_path / "pwned"
    run_dir = _saved_model_dir(tmp_path, (3, 32, 32))
    _plant_cifar(run_dir, marker)
    meta = json.loads((run_dir / "model.json").read_text())
    meta.update({"dataset": "cifar10", "data-dir": str(run_dir)})
    (run_dir / "model.json").write_text(json.dumps(meta))
    assert cli.main(["evaluate", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "pass data-dir=... yourself" in err and err.count("\n") == 1
    assert cli.main(["evaluate", str(run_dir), f"data-dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert "refused global io.open" in err and err.count("\n") == 1
    assert not marker.exists()


def test_tls_files_are_parsed_before_use(tmp_path):
    """The session's certificate, key and CA files (session-certificate/-key/-ca; sflower deploy's TLS files):
    a pickle, garbage, an oversized file or a swapped file gives one line; a real pair reads."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from simulation.session import endpoint

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    pem_cert = cert.public_bytes(serialization.Encoding.PEM)
    pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    (tmp_path / "c.pem").write_bytes(pem_cert)
    (tmp_path / "k.pem").write_bytes(pem_key)
    files = endpoint.TlsFiles(tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "c.pem")
    assert files.read() == (pem_cert, pem_key, pem_cert)
    marker = tmp_path / "pwned"
    for target, data in (("k.pem", pickle.dumps(_Evil(marker))), ("k.pem", pem_cert), ("c.pem", pem_key),
                         ("c.pem", b"-----BEGIN CERTIFICATE-----\n" + b"A" * (endpoint.MAX_PEM_BYTES + 10))):
        (tmp_path / "c.pem").write_bytes(pem_cert)
        (tmp_path / "k.pem").write_bytes(pem_key)
        (tmp_path / target).write_bytes(data)
        with pytest.raises(ConfigError) as err:
            files.read()
        assert "is not a PEM" in _one_line(err.value)
    assert not marker.exists()


# --------------------------------------------------------------------------- checkpoint body and fuzzing


def test_checkpoint_body_payloads(tmp_path):
    """A correctly sealed checkpoint whose state is a pickle or names a function outside the allowlist."""
    marker = tmp_path / "pwned"
    text = json.dumps({"t": "call", "id": 0, "func": "builtins:open", "args": [str(marker), "w"]}).encode()
    for state in (pickle.dumps(_Evil(marker)), struct.pack("<Q", len(text)) + text + b"\x08" + b"\0" * 7 + b"{}"):
        path = _checkpoint(tmp_path / "c", {"strategy": "gas"}, state)
        _, data = ckpt.read(path)
        with pytest.raises(ckpt.CheckpointError) as err:
            ckpt.loads(data, {})
        _one_line(err.value)
    assert not marker.exists()


@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory):
    """A real checkpoint of a tiny fedbuff run (bytes) and the environment its state refers to."""
    import torch

    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run

    captured = {}
    original = ckpt.save_run

    def capture(path, clients, strategy, dispatcher, clock, seconds, env, meta):
        captured["env"] = dict(env)
        return original(path, clients, strategy, dispatcher, clock, seconds, env, meta)

    out = tmp_path_factory.mktemp("ckpt") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ckpt.save_run = capture
    small = {**BASE, "num-clients": 2, "local-iterations": 1, "eval-samples": 50, "checkpoint-every": 1}
    try:
        run_inprocess(plan_run(RunConfig.from_mapping({**small, "output-dir": str(out)})), progress=False)
    finally:
        ckpt.save_run = original
        torch.set_num_threads(threads)
    return (out / ckpt.CHECKPOINT_FILE).read_bytes(), captured["env"]


def _seal(body: bytes) -> bytes:
    import hashlib

    return body + hashlib.sha256(body).digest()


def _mutants(data: bytes, count: int, seed: int = 43):
    """``count`` deterministic mutations of a checkpoint's bytes: ``(kind, bytes)``; half of them resealed with a
    correct digest (what an attacker who recomputes it gets past the digest)."""
    rng = random.Random(seed)
    body = data[:-ckpt.DIGEST_BYTES]
    m = len(ckpt.MAGIC)
    (hn,) = struct.unpack("<Q", body[m:m + 8])
    state_at = m + 8 + hn
    kinds = ["truncate", "bitflip", "header-length", "state-length", "deep-header", "deep-state", "magic",
             "safetensors-length", "splice"]
    for i in range(count):
        kind = kinds[i % len(kinds)]
        b = bytearray(body)
        if kind == "truncate":
            b = b[: rng.randrange(0, len(b))]
        elif kind == "bitflip":
            for _ in range(rng.randint(1, 8)):
                pos = rng.randrange(len(b))
                b[pos] ^= 1 << rng.randrange(8)
        elif kind == "header-length":
            b[m:m + 8] = struct.pack("<Q", rng.choice([2**63 - 1, 2**64 - 1, 2**40, hn + 1, hn - 1, 0,
                                                       rng.randrange(2**64)]))
        elif kind == "state-length":
            b[state_at:state_at + 8] = struct.pack("<Q", rng.choice([2**63, 2**64 - 1, 2**32, 0, rng.randrange(2**64)]))
        elif kind == "deep-header":
            depth = rng.choice([1000, 10_000, 200_000])
            header = b"[" * depth + b"]" * depth
            b = bytearray(ckpt.MAGIC + struct.pack("<Q", len(header)) + header + body[state_at:])
        elif kind == "deep-state":
            depth = rng.choice([1000, 10_000, 200_000])
            graph = b'{"t":"list","id":0,"items":' * depth + b"[]" + b"}" * depth
            b = bytearray(body[:state_at] + struct.pack("<Q", len(graph)) + graph + b"\x08" + b"\0" * 7 + b"{}")
        elif kind == "magic":
            pos = rng.randrange(m)
            b[pos] = (b[pos] + rng.randrange(1, 256)) % 256
        elif kind == "safetensors-length":
            (gn,) = struct.unpack("<Q", body[state_at:state_at + 8])
            at = state_at + 8 + gn
            b[at:at + 8] = struct.pack("<Q", rng.choice([2**63, 2**40, 2**64 - 1, rng.randrange(2**32)]))
        else:  # splice: a random slice of the file pasted elsewhere
            a, z = sorted(rng.sample(range(len(b)), 2))
            pos = rng.randrange(len(b))
            b = b[:pos] + b[a:z] + b[pos:]
        b = bytes(b)
        yield kind, (_seal(b) if i % 2 else b + data[-ckpt.DIGEST_BYTES:]), bool(i % 2)


def _resume_read(path: Path, env: dict) -> None:
    """What resume reads, in its order: the header's configuration (checked), then the state."""
    meta = ckpt.read_meta(path)
    run_dir_config(meta.get("config"), str(path))
    _, state = ckpt.read(path)
    ckpt.loads(state, env)


class _Hang(Exception):
    pass


def _fuzz(real_checkpoint, tmp_path, count: int) -> dict:
    data, env = real_checkpoint
    path = tmp_path / ckpt.CHECKPOINT_FILE
    path.write_bytes(data)
    _resume_read(path, env)  # the real checkpoint reads
    stats = {"files": 0, "refused": 0, "loaded": 0, "max_s": 0.0, "unsealed_refused": 0, "unsealed": 0}

    def alarm(*_):
        raise _Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    try:
        for kind, mutant, sealed in _mutants(data, count):
            assert mutant != data
            path.write_bytes(mutant)
            t0 = time.perf_counter()
            signal.alarm(10)
            try:
                _resume_read(path, env)
                outcome = "loaded"
            except ConfigError as err:  # CheckpointError is a ConfigError: the CLI prints one line, exit 2
                _one_line(err)
                outcome = "refused"
            except _Hang:
                pytest.fail(f"{kind} mutant hung for 10 s")
            finally:
                signal.alarm(0)
            stats["max_s"] = max(stats["max_s"], time.perf_counter() - t0)
            stats["files"] += 1
            stats[outcome] += 1
            if not sealed:
                stats["unsealed"] += 1
                stats["unsealed_refused"] += outcome == "refused"
                assert outcome == "refused", f"an altered {kind} mutant without a new digest was accepted"
            else:  # resealed: only bytes the codec reads as valid data may load
                assert outcome == "refused" or kind in ("bitflip", "splice", "safetensors-length"), kind
    finally:
        signal.signal(signal.SIGALRM, old)
    assert stats["max_s"] < 5.0, stats
    print(f"\ncheckpoint fuzz: {stats}")
    return stats


def test_fuzz_checkpoint_reader(real_checkpoint, tmp_path):
    """108 mutants of a real checkpoint: every unsealed one refused, every outcome one line, none over 5 s."""
    stats = _fuzz(real_checkpoint, tmp_path, 108)
    assert stats["files"] == 108 and stats["unsealed_refused"] == 54


@pytest.mark.slow
def test_fuzz_checkpoint_reader_500(real_checkpoint, tmp_path):
    """The same with 504 mutants (``pytest -m slow``)."""
    stats = _fuzz(real_checkpoint, tmp_path, 504)
    assert stats["files"] == 504 and stats["unsealed_refused"] == 252


# --------------------------------------------------------------------------- end to end, in a subprocess


def _sflower(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SFLOWER_NO_HUB": "1", "FLWR_TELEMETRY_ENABLED": "0"}
    return subprocess.run([sys.executable, "-m", "simulation.cli", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)


@pytest.mark.e2e
def test_e2e_resume_and_attack_of_a_crafted_run_dir(tmp_path):
    """sflower run resume=<crafted dir> and sflower attack <crafted dir>: exit 2, one line on stderr, no marker."""
    marker = tmp_path / "pwned"
    run_dir = tmp_path / "crafted"
    run_dir.mkdir()
    _plant_cifar(run_dir, marker)
    config = {**RunConfig.from_mapping(BASE).as_dict(), "dataset": "cifar10", "data-dir": str(run_dir)}
    _checkpoint(run_dir, config)
    (run_dir / "config.json").write_text(json.dumps({"config": config}))
    for args in (["run", f"resume={run_dir}"], ["attack", str(run_dir)]):
        res = _sflower(*args)
        assert res.returncode == 2, res
        assert res.stderr.count("\n") == 1 and "pass data-dir=... yourself" in res.stderr, res.stderr
        assert "Traceback" not in res.stdout + res.stderr
    assert not marker.exists()


# --------------------------------------------------------------------------- the code itself


def test_no_unsafe_deserialiser():
    """No pickle.load(s)/Unpickler but the CIFAR reader's, no torch.load, every np.load with allow_pickle=False."""
    for path in [*REPO.glob("fl_app/**/*.py"), *REPO.glob("strategies/**/*.py"), *REPO.glob("simulation/**/*.py")]:
        source = path.read_text()
        rel = path.relative_to(REPO).as_posix()
        assert not re.search(r"pickle\.loads?\(|(?<!safetensors\.)torch\.load\(|marshal\.loads?\(|shelve\.open\(", source), rel
        if "Unpickler" in source:
            assert rel == "fl_app/data/files.py", rel
        for call in re.findall(r"np\.load\([^)]*\)", source):
            assert "allow_pickle=False" in call, f"{rel}: {call}"
