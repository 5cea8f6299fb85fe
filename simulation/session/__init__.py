"""The session transport's server side (docs/explanation/design.md §4, "The session transport").

In a deployment, Flower (1.41, 1.42) starts a new ClientApp process for every
message (seconds each). A session carries all of a node's requests over one
gRPC stream instead, served by one long-running ``query.session`` message:

* :mod:`simulation.session.endpoint`: the gRPC server and its authenticated sessions;
* :mod:`simulation.session.grid`: :class:`~simulation.session.grid.SessionGrid`,
  the grid under the dispatcher that routes requests through them.

This module decides which transport a run uses (:func:`choose_transport`)
and builds the session grid (:func:`open_session_grid`).

Imports: ``fl_app``, ``strategies`` and ``simulation``; nothing from ``benchmarks``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.serverapp import Grid

from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError

if TYPE_CHECKING:
    from simulation.session.grid import SessionGrid

log = logging.getLogger("sflower")

#: Grid classes of simulations (Flower's Ray-backed engine, sflower's in-process engine): no deployment.
SIMULATION_GRIDS = frozenset({"InMemoryGrid", "InProcessGrid"})


def check_transport(cfg: RunConfig) -> None:
    """Refuse a session configuration that cannot run, before anything starts.

    Raises:
        ConfigError: a ``session-address`` whose host is a wildcard (``0.0.0.0``), which
            the nodes cannot dial; ``transport=session`` with TLS on (the default) but
            without ``session-certificate``, ``session-key`` and ``session-ca``
            (plaintext needs ``session-tls=false``, given explicitly).
    """
    host = cfg.session_address.rsplit(":", 1)[0].strip("[]")
    if cfg.transport != "flower" and host in ("0.0.0.0", "::", ""):
        raise ConfigError(f"session-address={cfg.session_address}: give the server's name or address as the "
                          "nodes reach it (they dial it, and it must be in the certificate's names)")
    if cfg.transport == "session" and cfg.session_tls and not _tls_given(cfg):
        raise ConfigError("transport=session needs session-certificate, session-key and session-ca "
                          "(or session-tls=false for plaintext)")


def is_deployment(grid: Grid) -> bool:
    """Whether the ServerApp runs in a deployment: its grid is not a simulation's (:data:`SIMULATION_GRIDS`).

    Under ``flwr run`` Flower hands the ServerApp its SuperLink's grid in a
    deployment and an in-memory grid in a simulation; the in-process engine
    hands it :class:`simulation.engine.InProcessGrid`.
    """
    return type(grid).__name__ not in SIMULATION_GRIDS


def choose_transport(cfg: RunConfig, grid: Grid) -> str:
    """``flower`` or ``session`` for this run.

    ``transport=auto`` (the default) is ``session`` on the wall clock in a
    deployment (:func:`is_deployment`) when the endpoint's TLS files are
    given (``sflower deploy`` gives them) or ``session-tls=false``, and
    ``flower`` otherwise, with one log line saying why when it falls back in
    a deployment.

    Raises:
        ConfigError: ``transport=session`` in a simulation (:func:`is_deployment`), where a session would hold
            its node's actor (Ray) or this process (in-process engine) for the whole run.
    """
    if cfg.transport == "session" and not is_deployment(grid):
        raise ConfigError("transport=session needs a deployment: a simulation runs every node's messages in "
                          "shared actors or in this process (use transport=flower or auto)")
    if cfg.transport != "auto":
        return cfg.transport
    if cfg.clock != "wall" or not is_deployment(grid):
        return "flower"
    if cfg.session_tls and not _tls_given(cfg):
        log.info("sflower: transport=flower (a session needs session-certificate, session-key and session-ca)")
        return "flower"
    return "session"


def open_session_grid(grid: Grid, cfg: RunConfig) -> SessionGrid:
    """Start the endpoint on ``session-address`` and wrap ``grid`` in a :class:`~simulation.session.grid.SessionGrid`.

    Raises:
        ConfigError: the address cannot be bound or a TLS file cannot be read.
    """
    from simulation.session.endpoint import SessionEndpoint, TlsFiles
    from simulation.session.grid import SessionGrid

    tls = (TlsFiles(Path(cfg.session_certificate), Path(cfg.session_key), Path(cfg.session_ca))
           if cfg.session_tls else None)
    if tls is None:
        log.warning("sflower: session-tls=false: the sessions run in plaintext")
    endpoint = SessionEndpoint(cfg.session_address, tls, max_sessions=cfg.num_clients)
    log.info("sflower: session endpoint on %s (tls=%s)", endpoint.address, tls is not None)
    return SessionGrid(grid, endpoint, cfg.session_timeout)


def _tls_given(cfg: RunConfig) -> bool:
    return bool(cfg.session_certificate and cfg.session_key and cfg.session_ca)
