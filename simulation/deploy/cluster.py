"""The loopback cluster: a SuperLink, SuperNodes and ``flwr run``, in one run directory.

:class:`Deployment` is a context manager: everything it started is stopped
when it exits, whatever happens.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulation.deploy.keys import make_certificates, make_node_key
from simulation.deploy.processes import (Proc, Processes, flower_exe, is_flower_process, run_logged, send_signal,
                                         wait_for)

log = logging.getLogger("sflower.deploy")

#: The repository root: the Flower app that ``flwr run`` builds.
APP_DIR = Path(__file__).resolve().parents[2]
#: Name of the SuperLink connection written to the run's ``FLWR_HOME/config.toml``.
CONNECTION = "sflower-deploy"
#: Environment of every Flower process: offline, no telemetry, no update check (docs/explanation/design.md §4).
OFFLINE_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
}
#: Poll interval (s) used by ``fast=true`` for the SuperExec and the SuperNode's idle loop.
FAST_POLL_S = 0.02


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (asked from the kernel)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class NodeSpec:
    """One SuperNode to start: its partition id, data dir, key (None without auth), runtime port."""

    pid: int
    data_dir: Path
    key: Path | None
    port: int
    authorised: bool = True
    proc: Proc | None = None


class Deployment:
    """SuperLink, SuperNodes and ``flwr run`` on loopback, in ``run_dir``; a context manager.

    Args:
        run_dir: the run directory (``data/``, ``certs/``, ``keys/``, ``logs/``, ``out/``, ``flwr-home/``).
        tls: TLS on the SuperLink's single HTTP port (Fleet, Control, Runtime APIs).
        auth: SuperNode authentication (``--enable-supernode-auth``; keys registered with
            ``flwr supernode register``).
        fast: the low-latency polling settings (module docstring).
        isolation: the SuperNode's ``--isolation`` mode.
    """

    def __init__(self, run_dir: Path, *, tls: bool = True, auth: bool = True, fast: bool = False,
                 isolation: str = "subprocess") -> None:
        self.run_dir = Path(run_dir).resolve()
        self.tls, self.auth, self.fast, self.isolation = tls, auth, fast, isolation
        self.logs = self.run_dir / "logs"
        self.home = self.run_dir / "flwr-home"
        self.processes = Processes()
        self.port = 0
        self.certs: dict[str, Path] = {}
        self.nodes: list[NodeSpec] = []
        self.superlink: Proc | None = None

    # -- context manager: everything started is stopped, whatever happens
    def __enter__(self) -> Deployment:
        for sub in ("logs", "keys", "certs"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.processes.stop_all(extra=self._detached())
        # a detached process may appear while the others stop: sweep until none is left (at most 10 s)
        deadline = time.monotonic() + 10.0
        while (left := self._detached()) and time.monotonic() < deadline:
            for pid in left:
                send_signal(pid, signal.SIGKILL)
            time.sleep(0.2)
        if left:
            log.warning("processes %s did not stop", left)

    def _detached(self) -> list[int]:
        """Flower processes that our SuperLink/SuperNodes started detached (the ServerApp process is
        re-parented to init): found by the runtime API address of ours they were given."""
        ports = [self.port] + [n.port for n in self.nodes]
        marks = [f"--runtime-api-address 127.0.0.1:{p} " for p in ports if p]
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if any(m in cmd for m in marks) and is_flower_process(int(entry.name)):
                    found.append(int(entry.name))
        return found

    def serverapp_pids(self) -> list[int]:
        """The ServerApp processes our SuperLink started (detached): the program of their command line (the
        executable or, under Python, the script) is ``flwr-serverapp`` (not merely a path that mentions it)."""
        mark = f"127.0.0.1:{self.port}"
        out = []
        for pid in self._detached():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(Path(a).name == "flwr-serverapp" for a in argv[:2]) and any(mark in a for a in argv):
                out.append(pid)
        return out

    def env(self, home: Path | None = None) -> dict[str, str]:
        """The environment of a Flower process: offline settings and its own ``FLWR_HOME``."""
        env = {**os.environ, **OFFLINE_ENV, "FLWR_HOME": str(home or self.home), "PYTHONUNBUFFERED": "1"}
        if self.fast:
            env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(FAST_POLL_S)
        return env

    def start_superlink(self, ready_timeout: float = 120.0, simulation: bool = False) -> None:
        """Make certificates (with TLS) and start the SuperLink; write the CLI's connection config.

        With ``simulation``, the SuperLink runs Flower's simulation engine
        (``--simulation``): no SuperNodes, ``flwr run --federation-config``
        sizes the virtual federation.

        Raises:
            DeployError: certificates failed, or the SuperLink died or did not
                open its port within ``ready_timeout`` s.
        """
        self.port = free_port()
        argv = [flower_exe("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
                "--disable-runtime-dependency-installation"]
        if simulation:
            argv += ["--simulation", "--isolation", "subprocess"]
        if self.tls:
            self.certs = make_certificates(self.run_dir / "certs", self.logs / "certs.log")
            argv += ["--ssl-ca-certfile", str(self.certs["ca"]), "--ssl-certfile", str(self.certs["cert"]),
                     "--ssl-keyfile", str(self.certs["key"])]
        else:
            argv += ["--insecure"]
        if self.auth:
            argv += ["--enable-supernode-auth"]
        self.superlink = self.processes.start("superlink", argv, self.logs / "superlink.log",
                                              self.env(self.run_dir / "flwr-home-superlink"))
        self._write_connection()
        wait_for(lambda: _port_open(self.port), ready_timeout, "the SuperLink to open its port",
                  alive=[self.superlink])

    def _write_connection(self) -> None:
        """``FLWR_HOME/config.toml``: the SuperLink connection ``sflower-deploy`` that ``flwr`` uses."""
        import tomli_w

        conn: dict[str, Any] = {"address": f"127.0.0.1:{self.port}"}
        if self.tls:
            conn["root-certificates"] = str(self.certs["ca"])
        else:
            conn["insecure"] = True
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(tomli_w.dumps({"superlink": {"default": CONNECTION,
                                                                            CONNECTION: conn}}))

    def add_node(self, pid: int, data_dir: Path, *, authorised: bool = True) -> NodeSpec:
        """Prepare SuperNode ``pid``: its key pair (with auth), registered when ``authorised``.

        Raises:
            DeployError: key generation or registration failed.
        """
        key = pub = None
        if self.auth:
            key, pub = make_node_key(self.run_dir / "keys", f"node-{pid}", self.logs / "keys.log")
            if authorised:
                run_logged(f"{flower_exe('flwr')} supernode register {pub} {CONNECTION}",
                            self.logs / "register.log", f"registering node {pid}", env=self.env())
        spec = NodeSpec(pid, Path(data_dir).resolve(), key, free_port(), authorised)
        self.nodes.append(spec)
        return spec

    def start_node(self, spec: NodeSpec, num_partitions: int) -> Proc:
        """Start (or restart) one SuperNode with its own data dir, partition id, key and TLS root.

        Raises:
            DeployError: ``flower-supernode`` is not installed.
        """
        node_config = f'data-dir="{spec.data_dir}" partition-id={spec.pid} num-partitions={num_partitions}'
        args = ["--superlink", f"127.0.0.1:{self.port}", "--port", str(spec.port), "--node-config", node_config,
                "--isolation", self.isolation]
        if self.tls:
            args += ["--root-certificates", str(self.certs["ca"])]
        else:
            args += ["--insecure"]
        if spec.key is not None:
            args += ["--auth-supernode-private-key", str(spec.key)]
        # through our launcher (simulation.deploy.supernode): the ClientApps' start window, and with fast=true
        # the SuperNode's idle sleeps capped
        flower_exe("flower-supernode")  # installed (DeployError otherwise), as the launcher runs its code
        argv = [sys.executable, "-m", "simulation.deploy", "supernode-fast" if self.fast else "supernode", *args]
        env = self.env(self.run_dir / "nodes" / f"node-{spec.pid}" / "flwr-home")
        name = f"node-{spec.pid}" + ("" if spec.authorised else "-unauthorised")
        spec.proc = self.processes.start(name, argv, self.logs / f"{name}.log", env, cwd=APP_DIR)
        if self.isolation == "process":  # the SuperExec that runs the ClientApp processes, started by us
            sx = [flower_exe("flower-superexec"), "--runtime-api-address", f"127.0.0.1:{spec.port}", "--insecure",
                  "--parent-pid", str(spec.proc.pid)]
            self.processes.start(f"{name}-superexec", sx, self.logs / f"{name}-superexec.log", env)
        return spec.proc

    def run_app(self, run_config: Mapping[str, Any], app_dir: Path = APP_DIR,
                federation_config: str | None = None, name: str = "flwr-run") -> Proc:
        """``flwr run APP sflower-deploy --run-config RUN_DIR/NAME.toml --stream`` in the background (its log:
        ``logs/NAME.log``; a second ``flwr run``, e.g. a resume, takes another ``name``).

        ``federation_config`` (e.g. ``"num-supernodes=2"``) is passed as
        ``--federation-config`` (a simulation SuperLink's federation).

        Raises:
            DeployError: ``flwr`` is not installed.
        """
        import tomli_w

        path = self.run_dir / ("run-config.toml" if name == "flwr-run" else f"{name}.toml")
        path.write_text(tomli_w.dumps(dict(run_config)))
        argv = [flower_exe("flwr"), "run", str(app_dir), CONNECTION, "--run-config", str(path), "--stream"]
        if federation_config:
            argv += ["--federation-config", federation_config]
        return self.processes.start(name, argv, self.logs / f"{name}.log", self.env(), cwd=app_dir)

