"""Vertically partitioned data: each party holds some columns of the same samples, under its sample IDs.

A party's table is a CSV whose column ``id`` is the sample ID; the **label party** (FATE's *guest*)
also has the label column ``y``; a **feature party** (FATE's *host*) must not. The catalogue
:data:`VERTICAL_DATASETS` names the files of ``DATA_DIR/vertical/`` (FATE's CSVs, see its README)
with the feature count each file must have, and ``vertical-fmnist``: Fashion-MNIST's training images
split by columns of pixels across 2–4 parties (the label party holds the leftmost band and the labels).

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


def _fmnist(data_dir: Path, parties: int, rows: int) -> list[PartyTable]:
    from fl_app.data.load import load_dataset

    if not 2 <= parties <= 4:
        raise ConfigError(f"vertical-parties={parties}: vertical-fmnist splits its 28 pixel columns across 2 to 4 parties")
    data = load_dataset("fashion-mnist", str(data_dir))
    x = np.asarray(data.x_train[:rows].numpy(), dtype=np.float32).reshape(-1, 28, 28) / 255.0
    y = np.asarray(data.y_train[:rows].numpy(), dtype=np.int64)
    ids = [f"fm{i:05d}" for i in range(len(y))]
    bands = np.array_split(np.arange(28), parties)
    return [PartyTable(ids, x[:, :, b].reshape(len(ids), -1).copy(), y if k == 0 else None)
            for k, b in enumerate(bands)]


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
    elif name in VERTICAL_DATASETS:
        spec = VERTICAL_DATASETS[name]
        tables = [read_party_csv(data_dir / "vertical" / f, label=k == 0, features=d)
                  for k, (f, d) in enumerate(spec.files)]
        classes = spec.num_classes
    else:
        raise ConfigError(f"dataset={name!r} is not vertical: choose one of {', '.join([*VERTICAL_DATASETS, FMNIST])}")
    return [subsample(t, overlap, seed, k) for k, t in enumerate(tables)], classes


def party_count(name: str, parties: int = 2) -> int:
    """K, the parties of dataset ``name`` (the label party included): ``parties`` for :data:`FMNIST`, else its
    files.

    Raises:
        ConfigError: an unknown name.
    """
    if name == FMNIST:
        return parties
    if name in VERTICAL_DATASETS:
        return len(VERTICAL_DATASETS[name].files)
    raise ConfigError(f"dataset={name!r} is not vertical: choose one of {', '.join([*VERTICAL_DATASETS, FMNIST])}")


def party_file(name: str, party: int, parties: int = 2, rows: int = 10000) -> str:
    """The file name of party ``party``'s CSV in ``DATA_DIR/vertical/``: FATE's for a CSV pair; for
    :data:`FMNIST` the one :func:`write_party_dirs` writes (``vertical-fmnist-p{party}of{parties}-{rows}.csv``)."""
    if name == FMNIST:
        return f"{FMNIST}-p{party}of{parties}-{rows}.csv"
    return VERTICAL_DATASETS[name].files[party][0]


def load_party(name: str, data_dir: str | Path, party: int, *, overlap: float = 1.0, seed: int = 0,
               parties: int = 2, rows: int = 10000) -> tuple[PartyTable, int]:
    """Party ``party``'s table alone (after subsampling, as in :func:`load_vertical`) and the class count: it
    reads only ``DATA_DIR/vertical/<its file>`` (:func:`party_file`). For :data:`FMNIST` without that file it
    cuts its band out of ``DATA_DIR/fashion-mnist``. Equal to ``load_vertical(...)[0][party]``.

    Raises:
        ConfigError: an unknown name, a party outside ``0..K-1``, or any error of :func:`read_party_csv`.
    """
    k = party_count(name, parties)
    if not 0 <= party < k:
        raise ConfigError(f"party {party}: {name} has parties 0..{k - 1}")
    path = Path(data_dir) / "vertical" / party_file(name, party, parties, rows)
    if name == FMNIST:
        if not 2 <= parties <= 4:
            raise ConfigError(f"vertical-parties={parties}: vertical-fmnist splits its 28 pixel columns across 2 to "
                              "4 parties")
        width = 28 * len(np.array_split(np.arange(28), parties)[party])
        table = (read_party_csv(path, label=party == 0, features=width) if path.is_file()
                 else _fmnist(Path(data_dir), parties, rows)[party])
        return subsample(table, overlap, seed, party), 10
    table = read_party_csv(path, label=party == 0, features=VERTICAL_DATASETS[name].files[party][1])
    return subsample(table, overlap, seed, party), VERTICAL_DATASETS[name].num_classes


def write_party_dirs(name: str, data_dir: str | Path, out: str | Path, *, parties: int = 2,
                     rows: int = 10000) -> list[Path]:
    """One data directory per party, ``OUT/party-K``, holding only that party's CSV in ``vertical/``
    (:func:`party_file`): for a deployment where each SuperNode has only its own file. A CSV pair's files are
    copied; :data:`FMNIST`'s bands are written from ``DATA_DIR/fashion-mnist`` (``id``, ``y`` at the label
    party, the band's pixels in [0, 1] with 9 significant digits, so that they read back to the same float32).

    Returns the directories, party 0 (the label party) first.

    Raises:
        ConfigError: an unknown name, a missing or bad source file.
    """
    import shutil

    out, dirs = Path(out), []
    k = party_count(name, parties)
    tables = _fmnist(Path(data_dir), parties, rows) if name == FMNIST else None
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

