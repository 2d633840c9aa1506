"""Run the sdf_server node as a subprocess (demo, tests): start, wait until ready, stop; and
reserve a private ROS domain id for it.

Imports no ROS module, so a caller can report a missing ROS install itself.
"""
from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# ROS_DOMAIN_IDs handed out: 1..DOMAIN_COUNT (DDS ports of higher ids can collide with the
# ephemeral port range on Linux).
DOMAIN_COUNT = 100
# domain id -> open lock file; held (so the id stays reserved) until this process exits.
_reserved_domains: dict[int, int] = {}


def reserve_domain_id(preferred: int) -> int:
    """A ROS_DOMAIN_ID in 1..DOMAIN_COUNT that no other process on this machine has reserved
    here: the first id from ``preferred`` on (wrapping) whose lock file in the temp directory
    this process can lock exclusively (flock). The lock is held until the process exits, so two
    test runs, demos or benchmarks started side by side (CI jobs on one host, a developer's
    worktrees) never share a domain: with discovery on localhost, a shared domain lets one
    run's nodes answer, or receive meshes from, the other's. ``preferred`` is usually derived
    from the pid. RuntimeError when all ids are taken.
    """
    lock_dir = Path(tempfile.gettempdir())
    for step in range(DOMAIN_COUNT):
        domain = 1 + (preferred - 1 + step) % DOMAIN_COUNT
        if domain in _reserved_domains:
            continue
        fd = os.open(lock_dir / f"robot_sdf_ros_domain_{domain}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _reserved_domains[domain] = fd
        return domain
    raise RuntimeError(f"all ROS domain ids 1..{DOMAIN_COUNT} are reserved by other processes on this machine")


class ServerProcess:
    """``python -m robot_sdf.ros.sdf_server --ros-args --params-file <file>``; output to a log file.

    env: the full environment of the child (set ROS_DOMAIN_ID and
    ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST there); executable: the command that starts the node
    (default ``python -m robot_sdf.ros.sdf_server``; e.g. an installed ``lib/robot_sdf/sdf_server``);
    ros_args: more ``--ros-args`` arguments after the parameter file (``-p name:=value``).
    """

    def __init__(self, params_file: Path, log_path: Path, env: dict[str, str], cwd: Path | None = None,
                 executable: list[str] | None = None, ros_args: list[str] | None = None) -> None:
        self.params_file = Path(params_file)
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "w")
        start = executable or [sys.executable, "-m", "robot_sdf.ros.sdf_server"]
        cmd = [*start, "--ros-args", "--params-file", str(params_file), *(ros_args or [])]
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the node logged 'ready:'; RuntimeError (with its log) if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "ready:" in self.log():
                return
            if not self.alive():
                raise RuntimeError(f"sdf_server exited with status {self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.1)
        raise RuntimeError(f"sdf_server not ready after {timeout_s:.0f} s:\n{self.tail()}")

    def device(self) -> str | None:
        """The device the node reported at start, once it is ready."""
        m = re.search(r"ready: device=([^,\s]+)", self.log())
        return m.group(1) if m else None

    def tail(self, lines: int = 15) -> str:
        return "\n".join("    | " + s for s in self.log().splitlines()[-lines:])

    def stop(self) -> int:
        """SIGINT (clean shutdown, exit code 0), then kill after 10 s; returns the exit code.

        A node that is still running after 10 s first gets SIGUSR1, on which it writes every
        thread's Python stack into its log (faulthandler), so a hang in shutdown can be read there.
        """
        if self.alive():
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGUSR1)
                try:
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode
