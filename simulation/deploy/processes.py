"""The processes of a deployment: start them, watch them, and stop them with all their descendants.

Flower's SuperExec starts its ServerApp and ClientApp processes in sessions of
their own, so :class:`Processes` collects descendants from ``/proc`` while the
tree is intact and signals each. Also here: the one-shot shell commands
(:func:`run_logged`), where Flower's console scripts are (:func:`flower_exe`)
and polling with a deadline (:func:`wait_for`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("sflower.deploy")

#: The Flower that sflower is pinned to (pyproject.toml), as a ``pip install`` argument for the messages
#: that name it; tests/test_fab.py checks it against pyproject.toml.
FLOWER_REQUIREMENT = "flwr[simulation]>=1.42.0,<1.43"


class DeployError(RuntimeError):
    """The deployment failed (a process died, the run failed or timed out); one line."""


def run_logged(command: str, log_file: Path, what: str, env: Mapping[str, str] | None = None,
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


def _descendants(pids: Sequence[int], children: Mapping[int, list[int]] | None = None) -> set[int]:
    """Every descendant of ``pids`` (not the pids themselves); ``children``: a :func:`_children_map` already
    read (one walk of /proc), else it is read."""
    children = _children_map() if children is None else children
    seen: set[int] = set()
    stack = list(pids)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


def send_signal(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``; a process that is gone (or not ours) is ignored."""
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
        """Remember the current descendants of every live process (called while polling): one walk of /proc for
        all of them (a walk per process took a quarter of a core with 20 SuperNodes, on the cores they share)."""
        children = _children_map()
        for proc in self.procs:
            if proc.alive():
                proc.known |= _descendants([proc.pid], children)

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        """Signal one process, its group and every descendant of it (SIGKILL: a crash)."""
        targets = _descendants([proc.pid]) | proc.known
        _signal_group(proc.pid, sig)
        for pid in targets:
            send_signal(pid, sig)
        try:
            proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    @staticmethod
    def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
        """Signal a process we did not start (e.g. the detached ServerApp) and every descendant of it."""
        for target in _descendants([pid]) | {pid}:
            send_signal(target, sig)

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
            send_signal(pid, signal.SIGTERM)
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
            if is_flower_process(pid):
                send_signal(pid, signal.SIGKILL)
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


def is_flower_process(pid: int) -> bool:
    """True when ``pid`` still runs a Flower/sflower program (so a recycled pid is never killed)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return any(word in cmd for word in ("flwr", "flower", "simulation.deploy"))


@contextmanager
def terminate_on_sigterm() -> Iterator[None]:
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


def find_exe(name: str) -> str | None:
    """The path of a Flower console script (next to this Python first, then on PATH), or None."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def flower_exe(name: str) -> str:
    """:func:`find_exe`, or DeployError when the script is not installed."""
    found = find_exe(name)
    if found is None:
        raise DeployError(f"'{name}' not found: install Flower (pip install '{FLOWER_REQUIREMENT}')")
    return found


def flower_binaries_missing() -> list[str]:
    """The Flower console scripts a deployment needs that are not installed (empty: all there)."""
    return [n for n in ("flower-superlink", "flower-supernode", "flower-superexec", "flwr") if find_exe(n) is None]


def wait_for(check: Any, timeout: float, what: str, alive: Sequence[Proc] = (), poll: float = 0.2) -> None:
    """Poll ``check()`` every ``poll`` s until it is true.

    Raises:
        DeployError: one of ``alive`` exited, or ``timeout`` s passed (the message names ``what``).
    """
    deadline = time.monotonic() + timeout
    while not check():
        for proc in alive:
            if not proc.alive():
                raise DeployError(f"{proc.name} exited (code {proc.popen.returncode}) while waiting for {what}; "
                                  f"see {proc.log_path}")
        if time.monotonic() > deadline:
            raise DeployError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)

