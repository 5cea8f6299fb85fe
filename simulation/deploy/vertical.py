"""``sflower deploy strategy=vertical-sl``: one SuperNode per party, each with only its own party's CSV.

SuperNode ``i`` (``partition-id=i``) is party ``i`` (0: the label party), or party ``i + 1`` with
``label-party=server`` (:func:`fl_app.vertical.party.party_index`); its ``data-dir`` is ``RUN_DIR/data/party-K``
(:func:`fl_app.data.vertical.write_party_dirs`), which holds ``vertical/<its file>`` and nothing else. With
``label-party=server`` the ServerApp is the label party: its ``data-dir`` is ``RUN_DIR/data/party-0``, which holds
the label party's CSV alone (:func:`server_run_config`), as Flower's own vertical-FL example's server holds the labels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fl_app.run.config import RunConfig
from fl_app.data.vertical import write_party_dirs
from fl_app.run.errors import ConfigError
from simulation.vertical_server import check_vertical, parties_of


def party_nodes(cfg: RunConfig) -> int:
    """The SuperNodes a vertical run needs: its parties, less the label party with ``label-party=server``."""
    return parties_of(cfg) - (1 if cfg.label_party == "server" else 0)


def check_vertical_deploy(cfg: RunConfig, nodes: int) -> None:
    """The vertical run's checks (:func:`~simulation.vertical_server.check_vertical`), and ``nodes`` = one
    SuperNode per party.

    Raises:
        ConfigError: one line.
    """
    check_vertical(cfg)
    if nodes != party_nodes(cfg):
        raise ConfigError(f"nodes={nodes}: {cfg.dataset} with label-party={cfg.label_party} runs on "
                          f"{party_nodes(cfg)} SuperNodes, one per party (vertical-parties={parties_of(cfg)})")


def write_vertical_dirs(cfg: RunConfig, out: Path, count: int) -> list[Path]:
    """The data directory of each of ``count`` SuperNodes (in ``partition-id`` order): its party's own directory
    (only its CSV); a SuperNode beyond the parties (an intruder) gets an empty one.

    Raises:
        ConfigError: the data are missing or bad (:func:`~fl_app.data.vertical.write_party_dirs`).
    """
    dirs = write_party_dirs(cfg.dataset, cfg.data_dir, out, parties=parties_of(cfg), rows=cfg.vertical_rows)
    dirs = dirs[1:] if cfg.label_party == "server" else dirs
    for k in range(len(dirs), count):
        extra = out / f"node-{k}"
        extra.mkdir(parents=True, exist_ok=True)
        dirs.append(extra)
    return dirs


def server_run_config(cfg: RunConfig, run_config: dict[str, Any], data_root: Path) -> dict[str, Any]:
    """The ServerApp's run config: with ``label-party=server`` its ``data-dir`` is the label party's own directory
    (``data_root/party-0``, written by :func:`write_vertical_dirs`: the label party's CSV only), so the server reads
    no feature party's file; otherwise ``run_config`` unchanged."""
    if cfg.label_party != "server":
        return run_config
    return {**run_config, "data-dir": str((data_root / "party-0").resolve())}
