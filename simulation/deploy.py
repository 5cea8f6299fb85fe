"""A scripted loopback deployment: a SuperLink, N SuperNodes with their own data, ``flwr run``.

``sflower deploy nodes=N [deploy options] [run-config KEY=VALUE ...]`` rehearses
on one machine what a real deployment does on many (README "Deployment"):

1. each node's training data is written to ``RUN_DIR/data/partition-K``
   (:func:`fl_app.task.write_partition_dirs`, the ``sflower partition`` code);
2. TLS certificates are made with ``openssl`` (:data:`OPENSSL_COMMANDS`: a CA,
   and a server certificate for ``localhost``/``127.0.0.1`` signed by it) and
   one ECDSA P-384 key pair per SuperNode with ``ssh-keygen``
   (:data:`SSH_KEYGEN_COMMAND`);
3. a SuperLink starts with ``--ssl-* --enable-supernode-auth`` on a free
   loopback port; each authorised node's public key is registered with
   ``flwr supernode register`` (Flower 1.41 replaced ``--auth-list-public-keys``
   with this Control API call);
4. N SuperNodes start, each with ``--root-certificates``, its private key and
   ``--node-config 'data-dir="RUN_DIR/data/partition-K" partition-id=K'``;
   ``intruders=M`` more start with keys that were never registered (they are
   refused, and the run goes on with the N others after ``join-timeout``);
5. ``flwr run . sflower-deploy --stream`` runs the app with the wall clock
   and ``output-dir=RUN_DIR/out``; the script waits for ``summary.json``
   (``flwr run`` may exit 0 when the run failed);
6. every process it started (and their children: SuperExecs, the ServerApp
   and ClientApp processes) is stopped, also on Ctrl-C, SIGTERM and failure.

Logs go to ``RUN_DIR/logs``. ``RUN_DIR/out/config.json`` holds the run
configuration only: no key, certificate or node data path.

Deploy options (not run-config keys): ``nodes``, ``intruders``, ``tls``,
``auth``, ``fast``, ``isolation``, ``run-dir``, ``timeout``, ``kill-node``,
``kill-after``, ``restart-after``; see :data:`DEPLOY_DEFAULTS`.

``fast=true`` applies the latency settings measured in
``sflower deploy-bench`` (README "Deployment", "Exchange latency"): SuperExec
task polling every 20 ms (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, a Flower
setting) and the SuperNode's idle sleep cut from Flower's hard-coded 3 s to
20 ms (a patch applied by :func:`supernode_main`, which starts the SuperNode
through ``python -m simulation.deploy supernode ...``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_app.config import DEFAULTS, RunConfig
from fl_app.errors import ConfigError

log = logging.getLogger("sflower.deploy")

#: The repository root: the Flower app that ``flwr run`` builds.
APP_DIR = Path(__file__).resolve().parent.parent
#: Name of the SuperLink connection written to the run's ``FLWR_HOME/config.toml``.
CONNECTION = "sflower-deploy"
#: Environment of every Flower process: offline, no telemetry, no update check (DESIGN.md section 4).
OFFLINE_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
}
#: Poll interval (s) used by ``fast=true`` for the SuperExec and the SuperNode's idle loop.
FAST_POLL_S = 0.02

#: Deploy options with their defaults (the other ``KEY=VALUE`` pairs are run-config keys).
DEPLOY_DEFAULTS: dict[str, Any] = {
    "nodes": 3,            # authorised SuperNodes
    "intruders": 0,        # extra SuperNodes whose keys are not registered (need auth=true)
    "tls": True,           # TLS between SuperNodes / CLI and the SuperLink
    "auth": True,          # --enable-supernode-auth (needs tls=true)
    "fast": False,         # low-latency polling (see the module docstring)
    "isolation": "subprocess",  # SuperNode --isolation (process: sflower starts the SuperExec itself)
    "run-dir": "",         # default runs/deploy-<strategy>-<time>
    "timeout": 1800.0,     # s: the whole run, from `flwr run` to summary.json
    "kill-node": -1,       # partition id of a node to SIGKILL mid-run (-1: none)
    "kill-after": 5.0,     # s after the first metric row (training has started)
    "restart-after": 0.0,  # s after the kill to start the node again (0: never)
}

#: The openssl commands that make the test certificates (``{d}``: the certificate directory).
OPENSSL_COMMANDS: tuple[str, ...] = (
    "openssl genrsa -out {d}/ca.key 4096",
    'openssl req -new -x509 -key {d}/ca.key -sha256 -subj "/CN=sflower-ca" -days 365 -out {d}/ca.crt',
    "openssl genrsa -out {d}/server.key 4096",
    'openssl req -new -key {d}/server.key -subj "/CN=localhost" -out {d}/server.csr',
    "openssl x509 -req -in {d}/server.csr -CA {d}/ca.crt -CAkey {d}/ca.key -CAcreateserial "
    "-out {d}/server.pem -days 365 -sha256 -extfile {d}/server.ext",
)
#: ``{d}/server.ext``: the server certificate's subject alternative names.
SERVER_EXT = "subjectAltName = DNS:localhost, IP:127.0.0.1, IP:::1\n"
#: The command that makes one SuperNode key pair (``{key}``: private key path; ``{key}.pub`` is public).
SSH_KEYGEN_COMMAND = 'ssh-keygen -t ecdsa -b 384 -N "" -C {name} -f {key}'


class DeployError(RuntimeError):
    """The deployment failed (a process died, the run failed or timed out); one line."""


# ---------------------------------------------------------------------------- options
@dataclass
class DeployOptions:
    """The parsed ``sflower deploy`` arguments.

    Attributes:
        opts: the deploy options (:data:`DEPLOY_DEFAULTS` keys).
        run_pairs: run-config overrides as given (strings), hyphenated keys.
        cfg: the resolved run configuration (``num-clients`` = nodes + intruders
            unless given, ``clock=wall`` unless given).
    """

    opts: dict[str, Any]
    run_pairs: dict[str, Any]
    cfg: RunConfig


def parse_deploy_args(pairs: Mapping[str, str]) -> DeployOptions:
    """Split ``KEY=VALUE`` pairs into deploy options and run-config keys, and check them.

    Raises:
        ConfigError: an unknown key, a badly typed value, or an impossible
            combination (auth without TLS, intruders without auth, kill-node
            out of range, num-clients below nodes + intruders).
    """
    opts = dict(DEPLOY_DEFAULTS)
    run_pairs: dict[str, Any] = {}
    for raw, value in pairs.items():
        key = raw.replace("_", "-")
        if key in DEPLOY_DEFAULTS:
            opts[key] = _coerce_opt(key, value)
        elif key in DEFAULTS:
            run_pairs[key] = value
        else:
            raise ConfigError(f"unknown key '{raw}': deploy takes {', '.join(DEPLOY_DEFAULTS)} and run-config keys")
    nodes, intruders = opts["nodes"], opts["intruders"]
    if nodes < 1 or intruders < 0:
        raise ConfigError(f"nodes must be >= 1 and intruders >= 0, got {nodes} and {intruders}")
    if opts["auth"] and not opts["tls"]:
        raise ConfigError("auth=true needs tls=true (Flower refuses SuperNode authentication without TLS)")
    if intruders and not opts["auth"]:
        raise ConfigError("intruders need auth=true (without authentication every SuperNode is accepted)")
    if opts["isolation"] not in ("subprocess", "process"):
        raise ConfigError(f"isolation must be subprocess or process, got '{opts['isolation']}'")
    if "output-dir" in run_pairs:
        raise ConfigError("deploy writes the outputs to RUN_DIR/out; set run-dir=DIR instead of output-dir")
    run_pairs.setdefault("num-clients", nodes + intruders)
    if "concurrency" not in run_pairs:
        try:
            clients = int(str(run_pairs["num-clients"]).strip() or 0)
        except ValueError:
            raise ConfigError(f"num-clients must be an integer, got {run_pairs['num-clients']!r}") from None
        run_pairs["concurrency"] = min(int(DEFAULTS["concurrency"]), clients)
    run_pairs.setdefault("clock", "wall")
    if intruders:
        run_pairs.setdefault("min-clients", nodes)
        run_pairs.setdefault("join-timeout", 30.0)
    cfg = RunConfig.from_mapping(run_pairs)
    if cfg.num_clients < nodes + intruders:
        raise ConfigError(f"num-clients={cfg.num_clients} is below nodes + intruders = {nodes + intruders}")
    if not -1 <= opts["kill-node"] < nodes:
        raise ConfigError(f"kill-node must be a node's partition id 0..{nodes - 1} (or -1), got {opts['kill-node']}")
    return DeployOptions(opts, run_pairs, cfg)


def fresh_run_dir(given: str, default: str) -> Path:
    """The absolute run directory: ``given``, or ``default`` when empty.

    Raises:
        ConfigError: it exists and is a file, or a directory that is not empty.
    """
    run_dir = Path(given or default).resolve()
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ConfigError(f"run-dir '{run_dir}' exists and is not an empty directory")
    return run_dir


def _coerce_opt(key: str, value: Any) -> Any:
    default = DEPLOY_DEFAULTS[key]
    text = str(value).strip()
    try:
        if isinstance(default, bool):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        return text
    except ValueError:
        raise ConfigError(f"{key}={value!r} is not a valid {type(default).__name__}") from None


# ---------------------------------------------------------------------------- certificates and keys
def make_certificates(cert_dir: Path, log_file: Path) -> dict[str, Path]:
    """Make a CA and a server certificate for localhost/127.0.0.1 with :data:`OPENSSL_COMMANDS`.

    Returns:
        ``{"ca": ca.crt, "cert": server.pem, "key": server.key}``.

    Raises:
        DeployError: openssl is missing or failed (its output is in ``log_file``).
    """
    if shutil.which("openssl") is None:
        raise DeployError("openssl is not installed (needed for the TLS certificates; or pass tls=false auth=false)")
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "server.ext").write_text(SERVER_EXT)
    for command in OPENSSL_COMMANDS:
        _run_logged(command.format(d=cert_dir), log_file, "openssl")
    return {"ca": cert_dir / "ca.crt", "cert": cert_dir / "server.pem", "key": cert_dir / "server.key"}


def make_node_key(key_dir: Path, name: str, log_file: Path) -> tuple[Path, Path]:
    """Make one SuperNode's ECDSA P-384 key pair with :data:`SSH_KEYGEN_COMMAND`.

    Returns:
        ``(private key path, public key path)``.

    Raises:
        DeployError: ssh-keygen is missing or failed.
    """
    if shutil.which("ssh-keygen") is None:
        raise DeployError("ssh-keygen is not installed (needed for the SuperNode keys; or pass auth=false)")
    key_dir.mkdir(parents=True, exist_ok=True)
    key, pub = key_dir / name, key_dir / f"{name}.pub"
    for path in (key, pub):
        path.unlink(missing_ok=True)
    _run_logged(SSH_KEYGEN_COMMAND.format(name=name, key=key), log_file, "ssh-keygen")
    return key, pub


def _run_logged(command: str, log_file: Path, what: str, env: Mapping[str, str] | None = None,
                timeout: float = 120.0) -> str:
    """Run a shell command, append its output to ``log_file``; return its stdout.

    Raises:
        DeployError: non-zero exit or timeout.
    """
    try:
        proc = subprocess.run(command, shell=True, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DeployError(f"{what} timed out after {timeout:g} s: {command}") from None
    with log_file.open("a") as fh:
        fh.write(f"$ {command}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()
        raise DeployError(f"{what} failed ({last[-1] if last else 'exit ' + str(proc.returncode)}); see {log_file}")
    return proc.stdout


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (asked from the kernel)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------------------- processes
def _children_map() -> dict[int, list[int]]:
    """``ppid -> [pid]`` of every process visible in /proc."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def _descendants(pids: Sequence[int]) -> set[int]:
    """Every descendant of ``pids`` (not the pids themselves)."""
    children = _children_map()
    seen: set[int] = set()
    stack = list(pids)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Proc:
    """One process the deployment started (in its own session, so its group is its own)."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    known: set[int] = field(default_factory=set)  # descendants seen so far

    @property
    def pid(self) -> int:
        """The process id of the started command."""
        return int(self.popen.pid)

    def alive(self) -> bool:
        """Whether the started command is still running."""
        return self.popen.poll() is None


class Processes:
    """The processes a deployment started; :meth:`stop_all` ends them and all their descendants.

    Descendants are collected from /proc while the tree is intact (Flower's
    SuperExec starts its ServerApp/ClientApp processes in sessions of their
    own, so a process-group signal alone would miss them), then each gets
    SIGTERM, and SIGKILL after ``grace`` seconds.
    """

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    def start(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str],
              cwd: Path | None = None) -> Proc:
        """Start ``argv`` in a new session with stdout and stderr to ``log_path``.

        Raises:
            OSError: ``argv[0]`` cannot be executed.
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        fh = log_path.open("ab")
        fh.write(f"$ {' '.join(argv)}\n".encode())
        fh.flush()
        popen = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=dict(env), cwd=cwd, start_new_session=True)
        fh.close()
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def refresh(self) -> None:
        """Remember the current descendants of every live process (called while polling)."""
        for proc in self.procs:
            if proc.alive():
                proc.known |= _descendants([proc.pid])

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        """Signal one process, its group and every descendant of it (SIGKILL: a crash)."""
        targets = _descendants([proc.pid]) | proc.known
        _signal_group(proc.pid, sig)
        for pid in targets:
            _signal(pid, sig)
        try:
            proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self, grace: float = 5.0, extra: Sequence[int] = ()) -> None:
        """SIGTERM every process, its group and its descendants; SIGKILL what is left after ``grace`` s.

        ``extra``: more pids to end the same way (processes ours started outside our tree).
        """
        self.refresh()
        pids = [p.pid for p in self.procs]
        targets = _descendants(pids) | set(extra) | _descendants(list(extra))
        for proc in self.procs:
            targets |= proc.known
        for proc in self.procs:
            if proc.alive():
                _signal_group(proc.pid, signal.SIGTERM)
        for pid in targets:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        time.sleep(0.2)
        for proc in self.procs:
            if proc.alive():
                _signal_group(proc.pid, signal.SIGKILL)
        for pid in targets | _descendants(pids):
            if _is_flower_process(pid):
                _signal(pid, signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.warning("process %s (%d) did not stop", proc.name, proc.pid)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _is_flower_process(pid: int) -> bool:
    """True when ``pid`` still runs a Flower/sflower program (so a recycled pid is never killed)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return any(word in cmd for word in ("flwr", "flower", "simulation.deploy"))


@contextmanager
def _terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while deploying, so the cleanup runs."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# ---------------------------------------------------------------------------- the deployment
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
                _signal(pid, signal.SIGKILL)
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
                if any(m in cmd for m in marks) and _is_flower_process(int(entry.name)):
                    found.append(int(entry.name))
        return found

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
        argv = [_exe("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
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
        _wait_for(lambda: _port_open(self.port), ready_timeout, "the SuperLink to open its port",
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
                _run_logged(f"{_exe('flwr')} supernode register {pub} {CONNECTION}",
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
        if self.fast:  # through our launcher, which shortens the SuperNode's idle sleep
            argv = [sys.executable, "-m", "simulation.deploy", "supernode", *args]
        else:
            argv = [_exe("flower-supernode"), *args]
        env = self.env(self.run_dir / "nodes" / f"node-{spec.pid}" / "flwr-home")
        name = f"node-{spec.pid}" + ("" if spec.authorised else "-unauthorised")
        spec.proc = self.processes.start(name, argv, self.logs / f"{name}.log", env, cwd=APP_DIR)
        if self.isolation == "process":  # the SuperExec that runs the ClientApp processes, started by us
            sx = [_exe("flower-superexec"), "--runtime-api-address", f"127.0.0.1:{spec.port}", "--insecure",
                  "--parent-pid", str(spec.proc.pid)]
            self.processes.start(f"{name}-superexec", sx, self.logs / f"{name}-superexec.log", env)
        return spec.proc

    def run_app(self, run_config: Mapping[str, Any], app_dir: Path = APP_DIR,
                federation_config: str | None = None) -> Proc:
        """``flwr run APP sflower-deploy --run-config RUN_DIR/run-config.toml --stream`` in the background.

        ``federation_config`` (e.g. ``"num-supernodes=2"``) is passed as
        ``--federation-config`` (a simulation SuperLink's federation).

        Raises:
            DeployError: ``flwr`` is not installed.
        """
        import tomli_w

        path = self.run_dir / "run-config.toml"
        path.write_text(tomli_w.dumps(dict(run_config)))
        argv = [_exe("flwr"), "run", str(app_dir), CONNECTION, "--run-config", str(path), "--stream"]
        if federation_config:
            argv += ["--federation-config", federation_config]
        return self.processes.start("flwr-run", argv, self.logs / "flwr-run.log", self.env(), cwd=app_dir)


def _find_exe(name: str) -> str | None:
    """The path of a Flower console script (next to this Python first, then on PATH), or None."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def _exe(name: str) -> str:
    """:func:`_find_exe`, or DeployError when the script is not installed."""
    found = _find_exe(name)
    if found is None:
        raise DeployError(f"'{name}' not found: install flwr 1.41 (pip install 'flwr[simulation]>=1.41.0,<1.42')")
    return found


def flower_binaries_missing() -> list[str]:
    """The Flower console scripts a deployment needs that are not installed (empty: all there)."""
    return [n for n in ("flower-superlink", "flower-supernode", "flower-superexec", "flwr") if _find_exe(n) is None]


def _wait_for(check: Any, timeout: float, what: str, alive: Sequence[Proc] = (), poll: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for proc in alive:
            if not proc.alive():
                raise DeployError(f"{proc.name} exited (code {proc.popen.returncode}) while waiting for {what}; "
                                  f"see {proc.log_path}")
        if time.monotonic() > deadline:
            raise DeployError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def run_config_for(cfg: RunConfig, given: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """The ``--run-config`` table: the keys given (typed as in ``cfg``), plus ``output-dir``."""
    values = cfg.as_dict()
    table = {k: values[k] for k in given}
    table["output-dir"] = str(out_dir)
    return table


def _metric_rows(path: Path) -> int:
    try:
        return max(0, len(path.read_text().strip().splitlines()) - 1)
    except OSError:
        return 0


def deploy(options: DeployOptions, *, quiet: bool = False) -> dict[str, Any]:
    """Run one loopback deployment (module docstring); return the run's summary plus a ``deploy`` entry.

    The ``deploy`` entry holds the run directory, the wall seconds to start
    the processes and to run, the node count, and the fault injected (if any).

    Raises:
        ConfigError: bad run configuration (checked before anything starts).
        DeployError: a process failed, the run failed, or ``timeout`` passed.
        KeyboardInterrupt: Ctrl-C or SIGTERM; every process is stopped first.
    """
    from fl_app.server_app import plan_run
    from fl_app.task import write_partition_dirs

    o, cfg = options.opts, options.cfg
    plan_run(cfg)  # one-line errors before anything starts
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = fresh_run_dir(o["run-dir"], f"runs/deploy-{cfg.strategy}-{stamp}")
    out_dir = run_dir / "out"
    say = (lambda *a: None) if quiet else (lambda msg: print(f"[deploy] {msg}", flush=True))
    nodes, intruders = o["nodes"], o["intruders"]
    t_start = time.monotonic()
    with _terminate_on_sigterm(), Deployment(run_dir, tls=o["tls"], auth=o["auth"], fast=o["fast"],
                                             isolation=o["isolation"]) as dep:
        dirs = write_partition_dirs(cfg, run_dir / "data")
        say(f"wrote {len(dirs)} partitions to {run_dir / 'data'}")
        dep.start_superlink()
        say(f"SuperLink on 127.0.0.1:{dep.port} (tls={dep.tls}, auth={dep.auth}); logs in {dep.logs}")
        specs = [dep.add_node(k, dirs[k], authorised=k < nodes) for k in range(nodes + intruders)]
        for spec in specs:
            dep.start_node(spec, cfg.num_clients)
        say(f"{nodes} SuperNodes started" + (f", {intruders} with unregistered keys" if intruders else ""))
        t_run = time.monotonic()
        runner = dep.run_app(run_config_for(cfg, options.run_pairs, out_dir))
        summary_path = out_dir / "summary.json"
        killed_at = restarted_at = None
        deadline = t_run + o["timeout"]
        first_row_at = None
        victim = specs[o["kill-node"]] if o["kill-node"] >= 0 else None
        while not summary_path.exists():
            dep.processes.refresh()
            now = time.monotonic()
            if first_row_at is None and _metric_rows(out_dir / "metrics.csv") >= 1:
                first_row_at = now
            if victim is not None and killed_at is None and first_row_at is not None \
                    and now - first_row_at >= o["kill-after"]:
                dep.processes.kill(victim.proc)
                killed_at = now
                say(f"killed SuperNode {victim.pid} (SIGKILL) {now - t_run:.1f} s into the run")
            if victim is not None and killed_at is not None and restarted_at is None and o["restart-after"] > 0 \
                    and now - killed_at >= o["restart-after"]:
                dep.start_node(victim, cfg.num_clients)
                restarted_at = now
                say(f"restarted SuperNode {victim.pid}")
            if not dep.superlink.alive():
                raise DeployError(f"the SuperLink exited (code {dep.superlink.popen.returncode}); "
                                  f"see {dep.superlink.log_path}")
            if not runner.alive():
                # `flwr run --stream` returns when the run ends; give the summary a moment to land
                with suppress(DeployError):
                    _wait_for(summary_path.exists, 10.0, "summary.json")
                if not summary_path.exists():
                    raise DeployError(f"the run ended without summary.json (flwr run exit {runner.popen.returncode});"
                                      f" see {runner.log_path} and {dep.logs}")
                break
            if now > deadline:
                raise DeployError(f"the run did not finish within timeout={o['timeout']:g} s; see {dep.logs}")
            time.sleep(0.5)
        summary = json.loads(summary_path.read_text())
        t_end = time.monotonic()
        # unregistered SuperNodes: Flower refuses them (they exit with "Failed to activate SuperNode")
        refused = {s.pid: s.proc.popen.returncode for s in specs if not s.authorised and s.proc is not None
                   and not s.proc.alive()}
    summary["deploy"] = {
        "run_dir": str(run_dir), "nodes": nodes, "intruders": intruders, "tls": o["tls"], "auth": o["auth"],
        "fast": o["fast"], "isolation": o["isolation"], "startup_s": round(t_run - t_start, 3),
        "run_s": round(t_end - t_run, 3),
        "killed_node": o["kill-node"] if killed_at is not None else None,
        "killed_at_s": round(killed_at - t_run, 3) if killed_at is not None else None,
        "restarted_at_s": round(restarted_at - t_run, 3) if restarted_at is not None else None,
        "refused_nodes": {str(k): v for k, v in refused.items()},
    }
    (run_dir / "deploy.json").write_text(json.dumps(summary["deploy"], indent=2))
    if not str(summary.get("status", "")).startswith("completed"):
        raise DeployError(f"the run ended with status '{summary.get('status')}'; outputs in {out_dir}")
    return summary


# ---------------------------------------------------------------------------- fast SuperNode launcher
def supernode_main(argv: Sequence[str]) -> None:
    """Start ``flower-supernode ARGV`` with its idle sleeps capped at :data:`FAST_POLL_S` seconds.

    Flower 1.41's SuperNode sleeps a hard-coded 3 s whenever a pull finds no
    message (``flwr.supernode.start_client_internal``), and 0.5 s between
    checks for a ClientApp's reply; in a split exchange the node is idle
    between every pair of messages, so this sleep adds up to 3 s to each
    exchange. This launcher replaces that module's ``time`` with one whose
    ``sleep`` is capped, then runs the SuperNode unchanged. Nothing else in
    Flower is touched. The cap is ``SFLOWER_SUPERNODE_POLL_S`` (default
    :data:`FAST_POLL_S`).
    """
    import types

    import flwr.supernode.start_client_internal as sci

    cap = float(os.environ.get("SFLOWER_SUPERNODE_POLL_S", FAST_POLL_S))
    real_sleep = time.sleep
    shim = types.ModuleType("time")
    shim.__dict__.update({k: v for k, v in vars(time).items() if not k.startswith("__")})
    shim.sleep = lambda seconds: real_sleep(min(float(seconds), cap))  # type: ignore[attr-defined]
    sci.time = shim  # type: ignore[attr-defined]
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *argv]
    flower_supernode()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "supernode":
        supernode_main(sys.argv[2:])
    else:
        print("usage: python -m simulation.deploy supernode [flower-supernode args]  (or: sflower deploy ...)",
              file=sys.stderr)
        sys.exit(2)
