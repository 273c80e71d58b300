"""testinfra over sparkdeploy's own SSH: the backend `doctor --tests` and the lab tests read a node through.

testinfra's own paramiko backend sets `paramiko.WarningPolicy` and loads no known_hosts (an unknown host key is
accepted with a warning; /work/shared/design.md section 7), so it is never used. `NodeBackend` is a testinfra
backend (registered in testinfra's BACKENDS under `sparkdeploy://NODE`, testinfra's own backend mechanism) whose
every command runs over a `runtime.remote.NodeConnection`: the inventory's user, key and port, the host key pinned
in the inventory's known_hosts (an unknown or changed key is refused: `HostKeyError`, nothing runs), and sudo as
sparkdeploy uses it (`sudo -n`: a password prompt fails at once instead of hanging).

`RecordedBackend` replays what a `NodeBackend` recorded (command -> exit code, stdout, stderr), so a fast test runs
the shipped example checks against a real Spark's or the lab's answers without a node.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import testinfra.backend
import testinfra.host
from testinfra.backend.base import BaseBackend, CommandResult

from sparkdeploy.config.userfile import load_json_file
from sparkdeploy.runtime.remote import NodeConnection

NAME = "sparkdeploy"
COMMAND_TIMEOUT_S = 60.0
SIMULATED = "SIMULATED"
SUDO_SH = 'import os, sys; os.execv("/bin/sh", ["sh", "-c", sys.argv[1]])'  # python3 -c SUDO_SH COMMAND

# Where the backend finds its connection (or recording) by node name: testinfra builds backends from a host spec
# string (`sparkdeploy://spark1`), so the objects are handed over here, keyed by that name.
_TARGETS: dict[str, NodeConnection | dict[str, Any]] = {}
_lock = threading.Lock()
MADE: list[_Backend] = []  # every backend testinfra built in this process (the child reads their SIMULATED lines)
RECORD = False  # NodeBackends keep every command and its answer (testinfra_node --record)


class _Backend(BaseBackend):  # type: ignore[misc]  # testinfra ships no types: its BaseBackend is Any
    """What both backends share: sudo as sparkdeploy runs it, and the SIMULATED lines a test's commands printed."""

    NAME = NAME

    def __init__(self, hostname: str, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("connection", None)
        super().__init__(hostname, *args, **kwargs)
        self._encoding = "utf-8"  # no round trip to ask the node's Python
        self.simulated: list[str] = []  # lines with SIMULATED in a command's output, since the last reset
        MADE.append(self)

    def get_sudo_command(self, command: str, sudo_user: str | None) -> str:
        # As sparkdeploy runs sudo: `sudo -n` (no password typed: a prompt fails at once, never hangs) of python3, the
        # one program `setup ssh` asks a node to grant (dayzero/sudo_needs.py), which runs the command with sh.
        if sudo_user is None:
            quoted: str = self.quote("sudo -n python3 -c %s %s", SUDO_SH, command)
        else:
            quoted = self.quote("sudo -n -u %s python3 -c %s %s", sudo_user, SUDO_SH, command)
        return quoted

    def note(self, stdout: str, stderr: str) -> None:
        for line in (stdout + "\n" + stderr).splitlines():
            if SIMULATED in line and line.strip() not in self.simulated:
                self.simulated.append(line.strip())


class NodeBackend(_Backend):
    """Every command over the node's NodeConnection (pinned host key, never auto-added)."""

    def __init__(self, hostname: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(hostname, *args, **kwargs)
        target = _TARGETS.get(hostname)
        if not isinstance(target, NodeConnection):
            raise RuntimeError(f"sparkdeploy://{hostname}: no sparkdeploy connection was registered for this node")
        self.conn = target
        self.recorded: dict[str, list[Any]] | None = {} if RECORD else None  # command -> [rc, stdout, stderr]

    def run(self, command: str, *args: str, **kwargs: Any) -> CommandResult:
        cmd = self.get_command(command, *args)
        res = self.conn.run(cmd, check=False, timeout=COMMAND_TIMEOUT_S)
        self.note(res.stdout, res.stderr)
        if self.recorded is not None:
            self.recorded[cmd] = [res.exit_code, res.stdout, res.stderr]
        return self.result(res.exit_code, self.encode(cmd), res.stdout.encode(), res.stderr.encode())


class RecordedBackend(_Backend):
    """Replays a recording: a command not recorded answers exit 127 and says so on stderr."""

    def __init__(self, hostname: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(hostname, *args, **kwargs)
        target = _TARGETS.get(hostname)
        if not isinstance(target, dict):
            raise RuntimeError(f"sparkdeploy://{hostname}: no recording was registered for this node")
        self.commands: dict[str, list[Any]] = target["commands"]

    def run(self, command: str, *args: str, **kwargs: Any) -> CommandResult:
        cmd = self.get_command(command, *args)
        rc, out, err = self.commands.get(cmd, [127, "", f"not in the recording: {cmd}\n"])
        self.note(out, err)
        return self.result(int(rc), self.encode(cmd), out.encode(), err.encode())


class _Dispatch(_Backend):
    """What testinfra's BACKENDS names for `sparkdeploy://`: a connection or a recording, by what was registered."""

    def __new__(cls, hostname: str, *args: Any, **kwargs: Any) -> Any:
        target = _TARGETS.get(hostname)
        klass = RecordedBackend if isinstance(target, dict) else NodeBackend
        return klass(hostname, *args, **kwargs)


def register(name: str, target: NodeConnection | dict[str, Any]) -> None:
    """Hand a node's connection (or a recording: load_recording) to the backend, under testinfra's BACKENDS."""
    with _lock:
        _TARGETS[name] = target
        testinfra.backend.BACKENDS[NAME] = f"{__name__}._Dispatch"


def host_for(conn: NodeConnection) -> testinfra.host.Host:
    """A testinfra Host over `conn` (the lab tests' second, independent reader of a node's state)."""
    register(conn.node.name, conn)
    return testinfra.host.Host(NodeBackend(conn.node.name))


def load_recording(path: Path) -> dict[str, Any]:
    """A recording (testinfra_node --record) read through the one door (config/userfile.py)."""
    data: dict[str, Any] = load_json_file(path, "testinfra recording", "record it again with --record")
    return data
