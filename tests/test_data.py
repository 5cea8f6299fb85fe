"""Tests for the fl_app.data package: loading, normalisation, augmentation, partitioning."""

from __future__ import annotations

import gzip
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_app import data as D
from fl_app.data import files as D_files
from fl_app.data import hub as D_hub
from fl_app.run.errors import ConfigError

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MNIST_DIR = SHARED_DATA / "mnist"
FMNIST_DIR = SHARED_DATA / "fashion-mnist"

needs_mnist = pytest.mark.skipif(
    not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(), reason="../shared/data/mnist absent"
)
needs_fmnist = pytest.mark.skipif(
    not (FMNIST_DIR / "train-images-idx3-ubyte.gz").is_file(), reason="../shared/data/fashion-mnist absent"
)


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch):
    """Never touch the network from tests (unless a test re-enables the probe)."""
    monkeypatch.setenv("SFLOWER_NO_HUB", "1")
    D_hub._hub_probe_cache.clear()
    yield
    D_hub._hub_probe_cache.clear()


@pytest.fixture(scope="module")
def fmnist():
    if not (FMNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("../shared/data/fashion-mnist absent")
    return D.load_dataset("fashion-mnist", str(FMNIST_DIR))


@pytest.fixture(scope="module")
def fmnist_labels(fmnist):
    return fmnist.y_train.numpy()


# --------------------------------------------------------------------------- #
# mnist-5k
# --------------------------------------------------------------------------- #


def test_mnist5k_shapes_and_fixed_split():
    ds = D.load_dataset("mnist-5k")
    assert ds.name == "mnist-5k"
    assert ds.x_train.shape == (4000, 1, 28, 28) and ds.x_train.dtype == torch.uint8
    assert ds.x_test.shape == (1000, 1, 28, 28) and ds.x_test.dtype == torch.uint8
    assert ds.y_train.shape == (4000,) and ds.y_train.dtype == torch.int64
    assert ds.y_test.shape == (1000,) and ds.y_test.dtype == torch.int64
    assert ds.input_shape == (1, 28, 28)
    assert ds.num_classes == 10 and not ds.augment
    assert ds.mean == (0.1307,) and ds.std == (0.3081,)
    assert int(ds.x_train.max()) == 255 and int(ds.x_train.min()) == 0
    # stratified: 100 test images per class
    assert D.label_histogram(ds.y_test.numpy(), 10).tolist() == [100] * 10
    # cached: same object; data_dir ignored
    assert D.load_dataset("mnist-5k") is ds
    assert D.load_dataset("mnist-5k", "/does/not/matter") is ds
    # the split is fixed: recomputing from scratch gives identical tensors
    fresh = D_files._load_mnist5k()
    assert torch.equal(fresh.x_train, ds.x_train) and torch.equal(fresh.y_train, ds.y_train)
    assert torch.equal(fresh.x_test, ds.x_test) and torch.equal(fresh.y_test, ds.y_test)


# --------------------------------------------------------------------------- #
# IDX (real files)
# --------------------------------------------------------------------------- #


def test_fmnist_idx(fmnist):
    assert fmnist.x_train.shape == (60000, 1, 28, 28) and fmnist.x_train.dtype == torch.uint8
    assert fmnist.x_test.shape == (10000, 1, 28, 28)
    assert fmnist.y_train.dtype == torch.int64
    assert D.label_histogram(fmnist.y_train.numpy(), 10).tolist() == [6000] * 10
    assert D.label_histogram(fmnist.y_test.numpy(), 10).tolist() == [1000] * 10
    assert fmnist.mean == (0.286,) and fmnist.std == (0.3205,)


@needs_mnist
def test_mnist_idx_and_parent_dir():
    ds = D.load_dataset("mnist", str(MNIST_DIR))
    assert ds.x_train.shape == (60000, 1, 28, 28)
    assert ds.x_test.shape == (10000, 1, 28, 28)
    hist = D.label_histogram(ds.y_train.numpy(), 10)
    assert hist.tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert D.label_histogram(ds.y_test.numpy(), 10)[0] == 980
    # data_dir may also be the parent holding mnist/
    parent = D.load_dataset("mnist", str(SHARED_DATA))
    assert torch.equal(parent.y_train, ds.y_train)
    assert D.load_dataset("mnist", str(MNIST_DIR)) is ds  # cached


@needs_mnist
def test_mnist_normalisation():
    ds = D.load_dataset("mnist", str(MNIST_DIR))
    x, y = ds.train_batch(np.arange(0, 60000, 3))
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert abs(float(x.mean())) < 0.05
    assert abs(float(x.std()) - 1.0) < 0.05


def test_fmnist_normalisation(fmnist):
    x, y = fmnist.train_batch(np.arange(60000))
    assert x.shape == (60000, 1, 28, 28) and x.dtype == torch.float32
    assert torch.equal(y, fmnist.y_train)
    assert abs(float(x.mean())) < 0.05
    # The papers' constant 0.3205 is below the true pixel std (0.353), so the
    # normalised std is about 1.10 rather than 1.
    assert 0.95 < float(x.std()) < 1.15
    # exact formula
    ref = (fmnist.x_train[:5].float() / 255 - 0.286) / 0.3205
    assert torch.allclose(x[:5], ref, atol=1e-6)


def test_test_batches_in_order(fmnist):
    chunks = list(fmnist.test_batches(3000))
    assert [c[0].shape[0] for c in chunks] == [3000, 3000, 3000, 1000]
    xs = torch.cat([c[0] for c in chunks])
    ys = torch.cat([c[1] for c in chunks])
    assert torch.equal(ys, fmnist.y_test)
    ref = (fmnist.x_test.float() / 255 - 0.286) / 0.3205
    assert torch.allclose(xs, ref, atol=1e-6)
    with pytest.raises(ConfigError):
        next(fmnist.test_batches(0))


# --------------------------------------------------------------------------- #
# IDX (synthetic files)
# --------------------------------------------------------------------------- #


def _idx_bytes(arr: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def _write_idx_set(d: Path, n_train=20, n_test=10, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": (rng.integers(0, 256, (n_train, 28, 28)), 2051),
        "train-labels-idx1-ubyte": (rng.integers(0, 10, n_train), 2049),
        "t10k-images-idx3-ubyte": (rng.integers(0, 256, (n_test, 28, 28)), 2051),
        "t10k-labels-idx1-ubyte": (rng.integers(0, 10, n_test), 2049),
    }
    for name, (arr, magic) in arrays.items():
        raw = _idx_bytes(arr, magic)
        if gz:
            with gzip.open(d / (name + ".gz"), "wb") as f:
                f.write(raw)
        else:
            (d / name).write_bytes(raw)
    return {k: v[0] for k, v in arrays.items()}


def test_idx_uncompressed_and_layout(tmp_path):
    arrays = _write_idx_set(tmp_path, gz=False)
    ds = D.load_dataset("fashion-mnist", str(tmp_path))
    assert ds.x_train.shape == (20, 1, 28, 28)
    assert np.array_equal(ds.x_train[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    assert np.array_equal(ds.y_test.numpy(), arrays["t10k-labels-idx1-ubyte"])


def test_idx_corrupt_magic(tmp_path):
    _write_idx_set(tmp_path)
    # swap the label file for an image file: wrong magic number
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes((tmp_path / "t10k-images-idx3-ubyte.gz").read_bytes())
    with pytest.raises(ConfigError, match="magic"):
        D.load_dataset("mnist", str(tmp_path))


def test_idx_truncated_gzip(tmp_path):
    _write_idx_set(tmp_path)
    f = tmp_path / "t10k-images-idx3-ubyte.gz"
    f.write_bytes(f.read_bytes()[:50])
    with pytest.raises(ConfigError):
        D.load_dataset("mnist", str(tmp_path))


# --------------------------------------------------------------------------- #
# CIFAR pickles (synthetic)
# --------------------------------------------------------------------------- #


def _write_pickle(path: Path, obj) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def _cifar_rows(rng, n):
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8)


def test_cifar10_pickles(tmp_path):
    rng = np.random.default_rng(1)
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    rows, labels = [], []
    for i in range(1, 6):
        r, lab = _cifar_rows(rng, 4), rng.integers(0, 10, 4).tolist()
        rows.append(r)
        labels += lab
        _write_pickle(d / f"data_batch_{i}", {b"batch_label": b"x", b"data": r, b"labels": lab})
    test_rows, test_labels = _cifar_rows(rng, 3), [1, 2, 3]
    _write_pickle(d / "test_batch", {b"data": test_rows, b"labels": test_labels})

    for where in (tmp_path, d):  # parent dir or the batches dir itself
        ds = D.load_dataset("cifar10", str(where))
        assert ds.x_train.shape == (20, 3, 32, 32) and ds.x_train.dtype == torch.uint8
        assert ds.x_test.shape == (3, 3, 32, 32)
        assert ds.y_train.tolist() == labels and ds.y_test.tolist() == test_labels
        assert ds.num_classes == 10 and ds.augment and ds.input_shape == (3, 32, 32)
        assert ds.mean == (0.4914, 0.4822, 0.4465) and ds.std == (0.2470, 0.2435, 0.2616)
    # channel-major layout: row[c*1024 + i*32 + j] == x[c, i, j]
    all_rows = np.concatenate(rows)
    x = ds.x_train.numpy()
    for n, c, i, j in [(0, 0, 0, 0), (5, 1, 3, 7), (19, 2, 31, 31), (7, 2, 0, 31)]:
        assert x[n, c, i, j] == all_rows[n, c * 1024 + i * 32 + j]
    assert np.array_equal(x.reshape(20, -1), all_rows)


def test_cifar100_pickles(tmp_path):
    rng = np.random.default_rng(2)
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    tr, te = _cifar_rows(rng, 6), _cifar_rows(rng, 2)
    _write_pickle(d / "train", {b"data": tr, b"fine_labels": [0, 99, 5, 6, 7, 8], b"coarse_labels": [0] * 6})
    _write_pickle(d / "test", {b"data": te, b"fine_labels": [42, 17], b"coarse_labels": [1, 1]})
    ds = D.load_dataset("cifar100", str(tmp_path))
    assert ds.num_classes == 100 and ds.augment
    assert ds.y_train.tolist() == [0, 99, 5, 6, 7, 8] and ds.y_test.tolist() == [42, 17]
    assert ds.mean == (0.5071, 0.4865, 0.4409) and ds.std == (0.2673, 0.2564, 0.2762)
    assert np.array_equal(ds.x_test.numpy(), te.reshape(2, 3, 32, 32))
    assert ds.x_test[1, 2, 4, 9] == te[1, 2 * 1024 + 4 * 32 + 9]


def test_cifar_corrupt_pickle(tmp_path):
    (tmp_path / "train").write_bytes(b"not a pickle")
    (tmp_path / "test").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="corrupt CIFAR"):
        D.load_dataset("cifar100", str(tmp_path))


# --------------------------------------------------------------------------- #
# Augmentation
# --------------------------------------------------------------------------- #


def _tiny_cifar(n=8, seed=0, augment=True) -> D.ImageDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    y = torch.arange(n, dtype=torch.int64) % 10
    return D.ImageDataset(
        name="cifar10", x_train=x, y_train=y, x_test=x[:2], y_test=y[:2], num_classes=10,
        mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616), augment=augment,
    )


def test_augmentation_deterministic_and_shape_preserving():
    ds = _tiny_cifar()
    idx = np.array([0, 3, 5, 7, 3])
    a1, y1 = ds.train_batch(idx, torch.Generator().manual_seed(7))
    a2, y2 = ds.train_batch(torch.tensor(idx), torch.Generator().manual_seed(7))
    a3, _ = ds.train_batch(idx, torch.Generator().manual_seed(8))
    plain, _ = ds.train_batch(idx)
    assert a1.shape == (5, 3, 32, 32) and a1.dtype == torch.float32
    assert torch.equal(a1, a2) and torch.equal(y1, y2)
    assert y1.tolist() == [0, 3, 5, 7, 3]
    assert not torch.equal(a1, a3)
    assert not torch.equal(a1, plain)  # (crop offset 0,0 and no flip for all 5 is ~1e-10)
    # no augmentation without a generator, or when augment=False
    ref = (ds.x_train[idx].float() / 255 - torch.tensor(ds.mean).view(1, 3, 1, 1)) / torch.tensor(ds.std).view(
        1, 3, 1, 1
    )
    assert torch.allclose(plain, ref, atol=1e-6)
    off = _tiny_cifar(augment=False)
    b, _ = off.train_batch(idx, torch.Generator().manual_seed(7))
    assert torch.allclose(b, ref, atol=1e-6)


def test_augmentation_is_a_padded_crop_or_flip():
    ds = _tiny_cifar(n=1)
    img = ds.x_train[0]
    padded = torch.nn.functional.pad(img, (4, 4, 4, 4))
    candidates = []
    for oy in range(9):
        for ox in range(9):
            crop = padded[:, oy : oy + 32, ox : ox + 32]
            candidates += [crop, crop.flip(-1)]
    mean = torch.tensor(ds.mean).view(3, 1, 1)
    std = torch.tensor(ds.std).view(3, 1, 1)
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        out, _ = ds.train_batch(np.array([0]), g)
        raw = torch.round((out[0] * std + mean) * 255).to(torch.uint8)
        assert any(torch.equal(raw, c) for c in candidates)


# --------------------------------------------------------------------------- #
# Partitioning
# --------------------------------------------------------------------------- #


def _check_disjoint_cover(parts, n, full=True):
    allidx = np.concatenate(parts)
    assert all(p.dtype == np.int64 for p in parts)
    assert len(np.unique(allidx)) == len(allidx)  # disjoint
    assert allidx.min() >= 0 and allidx.max() < n
    if full:
        assert np.array_equal(np.sort(allidx), np.arange(n))


def test_iid_partition():
    labels = np.random.default_rng(0).integers(0, 10, 1003)
    parts = D.partition_indices(labels, 7, "iid", seed=3)
    assert len(parts) == 7
    _check_disjoint_cover(parts, 1003)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    again = D.partition_indices(labels, 7, "iid", seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = D.partition_indices(labels, 7, "iid", seed=4)
    assert not np.array_equal(parts[0], other[0])
    # shuffled, not contiguous chunks
    assert not np.array_equal(np.sort(parts[0]), np.arange(sizes[0]))


def test_partition_results_are_copies():
    labels = np.arange(100) % 10
    p1 = D.partition_indices(labels, 4, "iid", seed=0)
    p1[0][:] = -1
    p2 = D.partition_indices(labels, 4, "iid", seed=0)
    assert (p2[0] >= 0).all()


def test_dirichlet_partition_seeded(fmnist_labels):
    n = len(fmnist_labels)
    a = D.partition_indices(fmnist_labels, 10, "dirichlet", alpha=0.1, seed=0)
    b = D.partition_indices(fmnist_labels.copy(), 10, "dirichlet", alpha=0.1, seed=0)
    c = D.partition_indices(fmnist_labels, 10, "dirichlet", alpha=0.1, seed=1)
    _check_disjoint_cover(a, n)
    _check_disjoint_cover(c, n)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert any(len(x) != len(y) or not np.array_equal(x, y) for x, y in zip(a, c))
    assert all(len(p) > 0 for p in a)
    # alpha=0.1 is strongly non-IID: sizes vary a lot
    sizes = [len(p) for p in a]
    assert max(sizes) > 2 * min(sizes)


def test_dirichlet_small_dataset():
    labels = np.arange(200) % 4
    parts = D.partition_indices(labels, 5, "dirichlet", alpha=1.0, seed=0)
    _check_disjoint_cover(parts, 200)


def test_shard_partition_fmnist(fmnist_labels):
    parts = D.partition_indices(fmnist_labels, 10, "shard", shards=2, seed=0)
    _check_disjoint_cover(parts, 60000)  # 10 x 2 shards of 3000 use every FMNIST sample
    for p in parts:
        assert len(p) == 6000
        # FMNIST classes are 6000 each, a multiple of the shard size, so each
        # shard holds one class and each client at most 2 classes
        assert (D.label_histogram(fmnist_labels[p], 10) > 0).sum() <= 2
    other = D.partition_indices(fmnist_labels, 10, "shard", shards=2, seed=1)
    assert any(not np.array_equal(x, y) for x, y in zip(parts, other))


def test_shard_partition_general_bound():
    # unbalanced classes: a shard may straddle a class boundary, so a client can
    # hold up to 2 classes per shard; the partitions stay disjoint
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 997)
    parts = D.partition_indices(labels, 8, "shard", shards=3, seed=5)
    _check_disjoint_cover(parts, 997, full=False)
    shard_size = 997 // (8 * 3)
    for p in parts:
        assert len(p) == 3 * shard_size
        assert (D.label_histogram(labels[p], 10) > 0).sum() <= 2 * 3


# --------------------------------------------------------------------------- #
# Errors
# --------------------------------------------------------------------------- #


def test_unknown_dataset():
    with pytest.raises(ConfigError, match="known datasets: mnist-5k, mnist"):
        D.load_dataset("imagenet")


def test_missing_data_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="does not exist"):
        D.load_dataset("mnist", str(missing))


def test_missing_files_offline_fails_fast(tmp_path):
    t = time.monotonic()
    with pytest.raises(ConfigError) as ei:
        D.load_dataset("fashion-mnist", str(tmp_path))
    msg = str(ei.value)
    assert "'fashion-mnist'" in msg and str(tmp_path) in msg
    assert "train-images-idx3-ubyte.gz" in msg and "data-dir=DIR" in msg
    with pytest.raises(ConfigError, match="data_batch_1"):
        D.load_dataset("cifar10", None)
    assert time.monotonic() - t < 5


def test_hub_probe_times_out_quickly(monkeypatch):
    monkeypatch.delenv("SFLOWER_NO_HUB")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(D_hub, "_HUB_HOST", ("192.0.2.1", 443))  # TEST-NET-1: never answers
    monkeypatch.setattr(D_hub, "_HUB_PROBE_TIMEOUT_S", 1.0)
    t = time.monotonic()
    assert D_hub._hub_reachable(1.0) is False
    assert time.monotonic() - t < 3
    # the negative answer is remembered
    t = time.monotonic()
    assert D_hub._hub_reachable(1.0) is False
    assert time.monotonic() - t < 0.1


def test_hub_disabled_by_env(monkeypatch):
    monkeypatch.delenv("SFLOWER_NO_HUB")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert D_hub._hub_reachable() is False


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_partitions=0, scheme="iid"), "at least 1"),
        (dict(num_partitions=-2, scheme="dirichlet"), "at least 1"),
        (dict(num_partitions=101, scheme="iid"), "exceeds the number of training samples"),
        (dict(num_partitions=4, scheme="dirichlet", alpha=0.0), "alpha"),
        (dict(num_partitions=4, scheme="dirichlet", alpha=-1.0), "alpha"),
        (dict(num_partitions=4, scheme="shard", shards=0), "shards"),
        (dict(num_partitions=60, scheme="shard", shards=2), "lower num-clients or shards"),
        (dict(num_partitions=4, scheme="quantity-skew"), "unknown partition scheme"),
        (dict(num_partitions=2.5, scheme="iid"), "integer"),
        (dict(num_partitions=2, scheme="iid", seed="x"), "seed"),
    ],
)
def test_partition_errors(kwargs, match):
    labels = np.arange(100) % 10
    with pytest.raises(ConfigError, match=match):
        D.partition_indices(labels, **kwargs)


def test_dirichlet_impossible_is_config_error():
    # 60 clients, 60 samples, tiny alpha: some client is always empty
    labels = np.arange(60) % 3
    with pytest.raises(ConfigError, match="raise alpha"):
        D.partition_indices(labels, 60, "dirichlet", alpha=0.01, seed=0)


def _error_cases(tmp_path):
    labels = np.arange(100) % 10
    return [
        lambda: D.load_dataset("imagenet"),
        lambda: D.load_dataset("mnist", str(tmp_path / "nope")),
        lambda: D.load_dataset("fashion-mnist", str(tmp_path)),
        lambda: D.partition_indices(labels, 60, "shard", shards=2),
        lambda: D.partition_indices(labels, 101, "iid"),
        lambda: D.partition_indices(np.arange(60) % 3, 60, "dirichlet", alpha=0.01),
        lambda: D.partition_indices(labels, 3, "nope"),
        lambda: D.label_histogram(np.array([0, 11]), 10),
    ]


def test_error_messages_are_one_line(tmp_path):
    for case in _error_cases(tmp_path):
        with pytest.raises(ConfigError) as ei:
            case()
        msg = str(ei.value)
        assert msg and "\n" not in msg, msg
        # no library traceback chained onto it
        assert ei.value.__cause__ is None
        assert ei.value.__suppress_context__ or ei.value.__context__ is None


# --------------------------------------------------------------------------- #
# label_histogram
# --------------------------------------------------------------------------- #


def test_label_histogram():
    h = D.label_histogram(np.array([0, 2, 2, 9]), 10)
    assert h.dtype == np.int64 and h.tolist() == [1, 0, 2, 0, 0, 0, 0, 0, 0, 1]
    assert D.label_histogram(torch.tensor([1, 1]), 3).tolist() == [0, 2, 0]
    assert D.label_histogram(np.array([], dtype=np.int64), 4).tolist() == [0, 0, 0, 0]
    with pytest.raises(ConfigError):
        D.label_histogram(np.array([-1]), 3)
    with pytest.raises(ConfigError):
        D.label_histogram(np.array([0]), 0)


def test_public_names():
    assert D.DATASETS == ("mnist-5k", "mnist", "fashion-mnist", "cifar10", "cifar100")
    assert D.PARTITIONS == ("iid", "dirichlet", "shard", "label-sorted", "contiguous", "pathological",
                            "inner-dirichlet", "linear", "square", "exponential")
    for obj in (D.ImageDataset, D.ImageDataset.train_batch, D.ImageDataset.test_batches,
                D.load_dataset, D.partition_indices, D.label_histogram):
        assert obj.__doc__


# --------------------------------------------------------------------------- #
# Device-local data (a SuperNode's own files: --node-config data-dir=DIR)
# --------------------------------------------------------------------------- #


def _images(rng, n, shape):
    return rng.integers(0, 256, (n, *shape), dtype=np.uint8)


@pytest.mark.parametrize("name", ["mnist-5k", "mnist", "fashion-mnist"])
def test_device_idx_round_trip(name, tmp_path):
    rng = np.random.default_rng(3)
    x, y = _images(rng, 37, (1, 28, 28)), rng.integers(0, 10, 37)
    written = D.write_training_files(name, x, y, tmp_path / "dev")
    assert [p.name for p in written] == ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]
    ds = D.load_device_dataset(name, tmp_path / "dev")
    assert ds.name == name and ds.input_shape == (1, 28, 28)
    assert np.array_equal(ds.x_train.numpy(), x) and ds.y_train.tolist() == y.tolist()
    assert ds.x_test.shape == (0, 1, 28, 28) and ds.y_test.shape == (0,)  # no test files: empty test split
    ref = D.load_dataset("mnist-5k") if name == "mnist-5k" else None
    if ref is not None:
        assert ds.mean == ref.mean and ds.std == ref.std
    # the files are the ones the existing IDX parser reads, byte-identical for the same examples
    assert D_files.read_idx(written[1], 2049).tolist() == y.tolist()
    again = D.write_training_files(name, x, y, tmp_path / "again")
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in written]


def test_device_idx_layouts(tmp_path):
    """Uncompressed files, the DIR/<dataset> subdirectory, and optional test files are all read."""
    arrays = _write_idx_set(tmp_path / "fashion-mnist", n_train=12, n_test=5, gz=False)
    ds = D.load_device_dataset("fashion-mnist", tmp_path)
    assert np.array_equal(ds.x_train[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    assert ds.y_test.tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()  # test files present: read too


@pytest.mark.parametrize("name, n", [("cifar10", 23), ("cifar10", 3), ("cifar100", 9)])
def test_device_cifar_round_trip(name, n, tmp_path):
    rng = np.random.default_rng(4)
    x, y = _images(rng, n, (3, 32, 32)), rng.integers(0, 10 if name == "cifar10" else 100, n)
    written = D.write_training_files(name, x, y, tmp_path)
    expected = [f"data_batch_{i}" for i in range(1, 6)] if name == "cifar10" else ["train"]
    assert [p.name for p in written] == expected  # cifar10 with n < 5: some batches are empty, still valid
    ds = D.load_device_dataset(name, tmp_path)
    assert np.array_equal(ds.x_train.numpy(), x) and ds.y_train.tolist() == y.tolist()
    assert ds.augment and ds.x_test.shape == (0, 3, 32, 32)


def _device_error_cases(tmp_path):
    rng = np.random.default_rng(5)
    empty = tmp_path / "empty"
    empty.mkdir()
    cifar = tmp_path / "cifar"
    D.write_training_files("cifar10", _images(rng, 4, (3, 32, 32)), np.arange(4), cifar)
    big = tmp_path / "big"  # IDX files of 32x32 images: not MNIST's 28x28
    big.mkdir()
    with gzip.open(big / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(_idx_bytes(_images(rng, 3, (32, 32)), 2051))
    with gzip.open(big / "train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(_idx_bytes(np.arange(3), 2049))
    none = tmp_path / "none"  # valid files holding no example
    D.write_training_files("mnist", np.zeros((0, 1, 28, 28), np.uint8), np.zeros(0, np.int64), none)
    corrupt = tmp_path / "corrupt"
    D.write_training_files("mnist", _images(rng, 3, (1, 28, 28)), np.arange(3), corrupt)
    (corrupt / "train-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b garbage")
    labels = tmp_path / "labels"  # label 12 in a 10-class dataset
    D.write_training_files("mnist", _images(rng, 3, (1, 28, 28)), np.array([0, 12, 3]), labels)
    return {
        "missing dir": (lambda: D.load_device_dataset("mnist", tmp_path / "nope"), "does not exist"),
        "no dir given": (lambda: D.load_device_dataset("mnist", ""), "data-dir is empty"),
        "empty dir": (lambda: D.load_device_dataset("mnist", empty), "it is empty"),
        "wrong format": (lambda: D.load_device_dataset("mnist", cifar), "no mnist training files"),
        "idx for cifar": (lambda: D.load_device_dataset("cifar10", corrupt), "no cifar10 training files"),
        "wrong image shape": (lambda: D.load_device_dataset("mnist", big), "images are 1x32x32"),
        "no examples": (lambda: D.load_device_dataset("mnist", none), "no training examples"),
        "corrupt file": (lambda: D.load_device_dataset("mnist", corrupt), "cannot read"),
        "labels out of range": (lambda: D.load_device_dataset("mnist", labels), "labels outside"),
        "unknown dataset": (lambda: D.load_device_dataset("imagenet", empty), "unknown dataset"),
    }


def test_device_bad_input_is_one_line_config_error(tmp_path):
    for what, (case, fragment) in _device_error_cases(tmp_path).items():
        with pytest.raises(ConfigError) as ei:
            case()
        msg = str(ei.value)
        assert fragment in msg, (what, msg)
        assert "\n" not in msg, (what, msg)
        assert ei.value.__cause__ is None, what


def test_write_training_files_refuses_bad_arrays(tmp_path):
    with pytest.raises(ConfigError, match="cannot write mnist"):
        D.write_training_files("mnist", np.zeros((2, 3, 32, 32), np.uint8), np.zeros(2), tmp_path)
    with pytest.raises(ConfigError, match="cannot write cifar10"):
        D.write_training_files("cifar10", np.zeros((2, 3, 32, 32), np.float32), np.zeros(2), tmp_path)
