"""Vertically partitioned data: each party holds some columns of the same samples, under its sample IDs.

A party's table is a CSV whose column ``id`` is the sample ID; the **label party** (FATE's *guest*)
also has the label column ``y``; a **feature party** (FATE's *host*) must not. The catalogue
:data:`VERTICAL_DATASETS` names the files of ``DATA_DIR/vertical/`` (FATE's CSVs, see its README)
with the feature count each file must have; ``vertical-fmnist``: Fashion-MNIST's training images
split by columns of pixels across 2–4 parties (the label party holds the leftmost band and the labels);
and ``vertical-breast-sklearn``: scikit-learn's bundled copy of the UCI Wisconsin Diagnostic Breast Cancer
data, split by columns across 2 parties (:func:`sklearn_breast`). The columns of the last two are assigned
to the parties by flwr-datasets' vertical partitioners (:func:`column_parties`).

Every party then keeps a seeded random subset of its rows (``overlap``, the fraction each keeps), so
the parties' ID sets overlap partially and must be aligned by PSI (:mod:`fl_app.vertical.psi`) before training.

Errors are one line (:class:`~fl_app.run.errors.ConfigError`): IDs missing, a feature count other than
the declared one, a label column at a feature party, duplicate IDs; an empty intersection is
:func:`fl_app.vertical.psi.align`'s.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fl_app.run.errors import ConfigError

ID_COLUMN, LABEL_COLUMN = "id", "y"


@dataclass(frozen=True)
class VerticalSpec:
    """One vertically split dataset: per party its file and declared feature count; the class count."""

    files: tuple[tuple[str, int], ...]
    num_classes: int


#: ``dataset`` name -> its files in ``DATA_DIR/vertical/`` (label party first) and its classes.
VERTICAL_DATASETS = {
    "vertical-breast": VerticalSpec((("breast_hetero_guest.csv", 10), ("breast_hetero_host.csv", 20)), 2),
    "vertical-credit": VerticalSpec((("default_credit_hetero_guest.csv", 13),
                                     ("default_credit_hetero_host.csv", 10)), 2),
    "vertical-vehicle": VerticalSpec((("vehicle_scale_hetero_guest.csv", 9), ("vehicle_scale_hetero_host.csv", 9)), 4),
}
#: The image benchmark: Fashion-MNIST by columns of pixels (``vertical-parties`` of them, 2 to 4).
FMNIST = "vertical-fmnist"
#: scikit-learn's bundled breast cancer (:func:`sklearn_breast`), 2 parties.
SKLEARN_BREAST = "vertical-breast-sklearn"
#: Its parties' feature counts: the label party the 10 ``mean ...`` columns, the other the 10 ``... error``
#: and the 10 ``worst ...`` columns (scikit-learn's column order).
SKLEARN_BREAST_SIZES = (10, 20)


def vertical_names() -> list[str]:
    """Every vertical ``dataset`` name."""
    return [*VERTICAL_DATASETS, FMNIST, SKLEARN_BREAST]


@dataclass(frozen=True)
class PartyTable:
    """One party's rows.

    Attributes:
        ids: ``[n]`` unique sample IDs (strings).
        x: ``[n, d]`` float32 features.
        y: ``[n]`` int64 labels at the label party; None at a feature party.
    """

    ids: list[str]
    x: np.ndarray
    y: np.ndarray | None = None

    def rows(self, ids: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        """The features (and labels) of ``ids``, in that order (every one must be held)."""
        where = {i: k for k, i in enumerate(self.ids)}
        idx = np.asarray([where[i] for i in ids], dtype=np.int64)
        return self.x[idx], (None if self.y is None else self.y[idx])


def read_party_csv(path: str | Path, *, label: bool, features: int | None = None) -> PartyTable:
    """A party's CSV: ``id``, then ``y`` at the label party, then ``features`` feature columns.

    Raises:
        ConfigError: missing file, no ``id`` column or an empty ID, a label column at a feature party
            (``label=False``) or none at the label party, a feature count other than ``features``,
            duplicate IDs, a non-numeric value. One line, naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ConfigError(f"{path}: empty file")
    header, body = [h.strip() for h in rows[0]], rows[1:]
    if ID_COLUMN not in header:
        raise ConfigError(f"{path}: sample IDs missing (no '{ID_COLUMN}' column)")
    if not label and LABEL_COLUMN in header:
        raise ConfigError(f"{path}: a feature party's file has the label column '{LABEL_COLUMN}'")
    if label and LABEL_COLUMN not in header:
        raise ConfigError(f"{path}: the label party's file has no label column '{LABEL_COLUMN}'")
    cols = [c for c in header if c not in (ID_COLUMN, LABEL_COLUMN)]
    if features is not None and len(cols) != features:
        raise ConfigError(f"{path}: {len(cols)} feature columns, declared {features}")
    ic = header.index(ID_COLUMN)
    ids = [r[ic].strip() if ic < len(r) else "" for r in body]
    if not body or any(not i for i in ids):
        raise ConfigError(f"{path}: sample IDs missing (row {next((k + 2 for k, i in enumerate(ids) if not i), 2)})")
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise ConfigError(f"{path}: duplicate sample ID {dup!r}")
    fc = [header.index(c) for c in cols]
    try:
        x = np.asarray([[float(r[c]) for c in fc] for r in body], dtype=np.float32)
        y = np.asarray([int(float(r[header.index(LABEL_COLUMN)])) for r in body], dtype=np.int64) if label else None
    except (ValueError, IndexError) as exc:
        raise ConfigError(f"{path}: a non-numeric or missing value ({exc})") from None
    return PartyTable(ids, x.reshape(len(ids), len(cols)), y)


def subsample(table: PartyTable, keep: float, seed: int, party: int) -> PartyTable:
    """A seeded random ``keep`` fraction of ``table``'s rows (at least one), in their original order."""
    if keep >= 1.0:
        return table
    rng = np.random.default_rng([seed, 45, party])
    n = len(table.ids)
    idx = np.sort(rng.choice(n, size=max(1, round(keep * n)), replace=False))
    return PartyTable([table.ids[i] for i in idx], table.x[idx], None if table.y is None else table.y[idx])


def column_parties(frame, *, label: str | None = None, parties: int | None = None,
                   sizes: tuple[int, ...] | None = None) -> list[list[str]]:
    """The columns of each party of ``frame`` (a ``pandas.DataFrame``), by flwr-datasets' vertical partitioners on
    ``datasets.Dataset.from_pandas(frame)``: ``VerticalEvenPartitioner(parties)`` (the first ``n mod parties``
    parties one column more) or ``VerticalSizePartitioner(sizes)``, in the frame's column order (no shuffle), the
    ``label`` column added to the first party (the label party). Party 0 first; ``label`` is not in the lists.
    """
    from datasets import Dataset
    from flwr_datasets.partitioner import (
        VerticalEvenPartitioner,
        VerticalSizePartitioner,
    )

    common = {"active_party_columns": label, "active_party_columns_mode": "add_to_first", "shuffle": False}
    partitioner = (VerticalEvenPartitioner(parties, **common) if sizes is None
                   else VerticalSizePartitioner(list(sizes), **common))
    partitioner.dataset = Dataset.from_pandas(frame, preserve_index=False)
    cols = [partitioner.load_partition(k).column_names for k in range(partitioner.num_partitions)]
    return [[c for c in part if c != label] for part in cols]


def fmnist_bands(parties: int) -> list[np.ndarray]:
    """The pixel columns (0..27) of each party of :data:`FMNIST`, the label party's (the leftmost) first:
    :func:`column_parties` with ``VerticalEvenPartitioner`` on the 28 columns of pixels, which gives the same
    contiguous bands as ``np.array_split(np.arange(28), parties)`` (tested).

    Raises:
        ConfigError: ``parties`` outside 2..4.
    """
    import pandas as pd

    if not 2 <= parties <= 4:
        raise ConfigError(f"vertical-parties={parties}: vertical-fmnist splits its 28 pixel columns across 2 to 4 parties")
    frame = pd.DataFrame({name: pd.Series(dtype="float32") for name in [*(f"col{j:02d}" for j in range(28)), LABEL_COLUMN]})
    return [np.asarray([int(c[3:]) for c in part], dtype=np.int64)
            for part in column_parties(frame, label=LABEL_COLUMN, parties=parties)]


def _fmnist(data_dir: Path, parties: int, rows: int) -> list[PartyTable]:
    from fl_app.data.load import load_dataset

    bands = fmnist_bands(parties)
    data = load_dataset("fashion-mnist", str(data_dir))
    x = np.asarray(data.x_train[:rows].numpy(), dtype=np.float32).reshape(-1, 28, 28) / 255.0
    y = np.asarray(data.y_train[:rows].numpy(), dtype=np.int64)
    ids = [f"fm{i:05d}" for i in range(len(y))]
    return [PartyTable(ids, x[:, :, b].reshape(len(ids), -1).copy(), y if k == 0 else None)
            for k, b in enumerate(bands)]


def sklearn_breast() -> tuple[list[PartyTable], list[list[str]]]:
    """:data:`SKLEARN_BREAST`: scikit-learn's bundled breast cancer data (``sklearn.datasets.load_breast_cancer``,
    offline), the UCI Wisconsin Diagnostic Breast Cancer data (Wolberg, Street and Mangasarian, 1995; UCI Machine
    Learning Repository, CC BY 4.0), shipped with scikit-learn under its BSD-3-Clause licence: 569 samples, 30
    features of the cell nuclei, label 0 (malignant, 212) or 1 (benign, 357).

    The columns go to 2 parties by flwr-datasets' ``VerticalSizePartitioner([10, 20])`` (:func:`column_parties`,
    scikit-learn's column order, no shuffle): the **label party** holds ``y`` and the 10 ``mean ...`` features
    (``mean radius`` ... ``mean fractal dimension``), the **feature party** the 10 ``... error`` and the 10
    ``worst ...`` features, as FATE's ``vertical-breast`` splits the same samples 10 + 20. Each party standardises
    its own columns (z-scores over the 569 rows: no other party's data needed). The sample IDs are ``bc000`` to
    ``bc568`` (the row numbers) at both parties.

    Returns:
        The two parties' tables (before subsampling) and their column names.

    Raises:
        ConfigError: scikit-learn is not installed (one line naming the pip command).
    """
    try:
        from sklearn.datasets import load_breast_cancer
    except ImportError:
        raise ConfigError(f"dataset={SKLEARN_BREAST} needs scikit-learn: pip install 'sflower[vertical]'") from None
    frame = load_breast_cancer(as_frame=True).frame.rename(columns={"target": LABEL_COLUMN})
    parts = column_parties(frame, label=LABEL_COLUMN, sizes=SKLEARN_BREAST_SIZES)
    ids = [f"bc{i:03d}" for i in range(len(frame))]
    y = frame[LABEL_COLUMN].to_numpy(dtype=np.int64)
    tables = []
    for k, cols in enumerate(parts):
        x = frame[cols].to_numpy(dtype=np.float64)
        x = ((x - x.mean(axis=0)) / x.std(axis=0)).astype(np.float32)
        tables.append(PartyTable(ids, x, y.copy() if k == 0 else None))
    return tables, parts


def load_vertical(name: str, data_dir: str | Path, *, overlap: float = 1.0, seed: int = 0, parties: int = 2,
                  rows: int = 10000) -> tuple[list[PartyTable], int]:
    """Every party's table of dataset ``name`` (label party first) after subsampling, and the class count.

    ``data_dir`` holds ``vertical/`` (and ``fashion-mnist/`` for :data:`FMNIST`); ``overlap`` is the
    fraction of rows each party keeps (seeded by ``seed`` and the party); ``parties`` and ``rows`` apply
    to :data:`FMNIST` only (the first ``rows`` training images).

    Raises:
        ConfigError: an unknown name, or any error of :func:`read_party_csv`.
    """
    data_dir = Path(data_dir)
    if name == FMNIST:
        tables, classes = _fmnist(data_dir, parties, rows), 10
    elif name == SKLEARN_BREAST:
        tables, classes = sklearn_breast()[0], 2
    elif name in VERTICAL_DATASETS:
        spec = VERTICAL_DATASETS[name]
        tables = [read_party_csv(data_dir / "vertical" / f, label=k == 0, features=d)
                  for k, (f, d) in enumerate(spec.files)]
        classes = spec.num_classes
    else:
        raise ConfigError(f"dataset={name!r} is not vertical: choose one of {', '.join(vertical_names())}")
    return [subsample(t, overlap, seed, k) for k, t in enumerate(tables)], classes


def party_count(name: str, parties: int = 2) -> int:
    """K, the parties of dataset ``name`` (the label party included): ``parties`` for :data:`FMNIST`, 2 for
    :data:`SKLEARN_BREAST`, else its files.

    Raises:
        ConfigError: an unknown name.
    """
    if name == FMNIST:
        return parties
    if name == SKLEARN_BREAST:
        return len(SKLEARN_BREAST_SIZES)
    if name in VERTICAL_DATASETS:
        return len(VERTICAL_DATASETS[name].files)
    raise ConfigError(f"dataset={name!r} is not vertical: choose one of {', '.join(vertical_names())}")


def party_file(name: str, party: int, parties: int = 2, rows: int = 10000) -> str:
    """The file name of party ``party``'s CSV in ``DATA_DIR/vertical/``: FATE's for a CSV pair; for
    :data:`FMNIST` and :data:`SKLEARN_BREAST` the one :func:`write_party_dirs` writes
    (``vertical-fmnist-p{party}of{parties}-{rows}.csv``, ``vertical-breast-sklearn-p{party}of2.csv``)."""
    if name == FMNIST:
        return f"{FMNIST}-p{party}of{parties}-{rows}.csv"
    if name == SKLEARN_BREAST:
        return f"{SKLEARN_BREAST}-p{party}of{len(SKLEARN_BREAST_SIZES)}.csv"
    return VERTICAL_DATASETS[name].files[party][0]


def load_party(name: str, data_dir: str | Path, party: int, *, overlap: float = 1.0, seed: int = 0,
               parties: int = 2, rows: int = 10000) -> tuple[PartyTable, int]:
    """Party ``party``'s table alone (after subsampling, as in :func:`load_vertical`) and the class count: it
    reads only ``DATA_DIR/vertical/<its file>`` (:func:`party_file`). For :data:`FMNIST` without that file it
    cuts its band out of ``DATA_DIR/fashion-mnist``; for :data:`SKLEARN_BREAST` without it, its columns out of
    scikit-learn's bundled copy. Equal to ``load_vertical(...)[0][party]``.

    Raises:
        ConfigError: an unknown name, a party outside ``0..K-1``, or any error of :func:`read_party_csv`.
    """
    k = party_count(name, parties)
    if not 0 <= party < k:
        raise ConfigError(f"party {party}: {name} has parties 0..{k - 1}")
    path = Path(data_dir) / "vertical" / party_file(name, party, parties, rows)
    if name == FMNIST:
        width = 28 * len(fmnist_bands(parties)[party])
        table = (read_party_csv(path, label=party == 0, features=width) if path.is_file()
                 else _fmnist(Path(data_dir), parties, rows)[party])
        return subsample(table, overlap, seed, party), 10
    if name == SKLEARN_BREAST:
        table = (read_party_csv(path, label=party == 0, features=SKLEARN_BREAST_SIZES[party]) if path.is_file()
                 else sklearn_breast()[0][party])
        return subsample(table, overlap, seed, party), 2
    table = read_party_csv(path, label=party == 0, features=VERTICAL_DATASETS[name].files[party][1])
    return subsample(table, overlap, seed, party), VERTICAL_DATASETS[name].num_classes


def write_party_dirs(name: str, data_dir: str | Path, out: str | Path, *, parties: int = 2,
                     rows: int = 10000) -> list[Path]:
    """One data directory per party, ``OUT/party-K``, holding only that party's CSV in ``vertical/``
    (:func:`party_file`): for a deployment where each SuperNode has only its own file. A CSV pair's files are
    copied; :data:`FMNIST`'s bands are written from ``DATA_DIR/fashion-mnist`` and :data:`SKLEARN_BREAST`'s columns
    from scikit-learn's copy (``id``, ``y`` at the label party, the features with 9 significant digits, so that
    they read back to the same float32).

    Returns the directories, party 0 (the label party) first.

    Raises:
        ConfigError: an unknown name, a missing or bad source file.
    """
    import shutil

    out, dirs = Path(out), []
    k = party_count(name, parties)
    tables = (_fmnist(Path(data_dir), parties, rows) if name == FMNIST
              else sklearn_breast()[0] if name == SKLEARN_BREAST else None)
    for party in range(k):
        target = out / f"party-{party}" / "vertical" / party_file(name, party, parties, rows)
        target.parent.mkdir(parents=True, exist_ok=True)
        if tables is None:
            source = Path(data_dir) / "vertical" / target.name
            read_party_csv(source, label=party == 0, features=VERTICAL_DATASETS[name].files[party][1])  # checked
            shutil.copyfile(source, target)
        else:
            t = tables[party]
            with open(target, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow([ID_COLUMN, *([LABEL_COLUMN] if t.y is not None else []),
                            *(f"x{j}" for j in range(t.x.shape[1]))])
                for i, row in enumerate(t.x):
                    w.writerow([t.ids[i], *([int(t.y[i])] if t.y is not None else []), *(f"{v:.9g}" for v in row)])
        dirs.append(target.parents[1])
    return dirs

