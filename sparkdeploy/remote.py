"""SSH to the nodes, with host keys checked.

Fabric adds unknown host keys silently by default; here an unknown key stops the run with its fingerprint
and the command that trusts it, and a changed key is always a hard failure. Commands are argv lists
(quoted once, here); environment values never travel on a command line (Fabric's inline env would put
them in /proc/*/cmdline): secrets go to files written over SFTP with mode 0600 from creation.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import paramiko

from sparkdeploy.errors import StepFailed
from sparkdeploy.inventory import Inventory, Node
from sparkdeploy.thread_imports import preload

T = TypeVar("T")
CONNECT_TIMEOUT_S = 10
CONNECT_ATTEMPTS = 3
# Commands at once on one connection: sshd refuses sessions past MaxSessions (10 by default: "open failed:
# Connect failed"), and SFTP and push streams take sessions too.
MAX_PARALLEL_COMMANDS = 6


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(ip: str, port: int) -> str:
    return ip if port == 22 else f"[{ip}]:{port}"


class HostKeyError(StepFailed):
    """The node's host key is unknown or changed: nothing ran."""

    def __init__(self, node: Node, message: str, key: paramiko.PKey | None = None):
        self.node = node
        self.key = key
        super().__init__(message)


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey):
        self.hostname = hostname
        self.key = key
        super().__init__(f"unknown host key for {hostname}")


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(hostname, key)


class _Capture(paramiko.MissingHostKeyPolicy):
    """For `sparkdeploy trust`: remember the offered key and refuse the connection."""

    def __init__(self):
        self.key: paramiko.PKey | None = None

    def missing_host_key(self, client, hostname, key):
        self.key = key
        raise UnknownHostKey(hostname, key)


@dataclass
class CommandResult:
    node: str
    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class NodeConnection:
    """One SSH connection to one node (opened lazily, reused for every command). Safe to share between
    threads: one connection is opened however many ask at once, and at most MAX_PARALLEL_COMMANDS commands
    run on it at a time (the others wait their turn)."""

    def __init__(self, node: Node, inventory: Inventory, connect_timeout: float = CONNECT_TIMEOUT_S):
        self.node = node
        self.inventory = inventory
        self.connect_timeout = connect_timeout
        self._conn = None
        self._sftp = None
        self._open_lock = threading.Lock()
        self._sessions = threading.BoundedSemaphore(MAX_PARALLEL_COMMANDS)

    # -- connection ----------------------------------------------------------------------------------
    @property
    def known_hosts(self) -> Path:
        return self.inventory.local_path(self.inventory.cluster.known_hosts)  # type: ignore[return-value]

    def _fabric(self):
        from fabric import Config, Connection

        ssh = self.node.ssh
        # The TCP connect timeout goes in connect_timeout only: Fabric 3 refuses it given twice.
        connect_kwargs: dict = {"banner_timeout": self.connect_timeout, "auth_timeout": self.connect_timeout}
        if ssh.key:
            connect_kwargs["key_filename"] = str(self.inventory.local_path(ssh.key))
        conn = Connection(self.node.mgmt_ip, user=ssh.user, port=ssh.port, config=Config(),
                          connect_timeout=int(self.connect_timeout), connect_kwargs=connect_kwargs)
        # Fabric installs AutoAddPolicy: replace it, and trust only the inventory's known_hosts (+ the system's).
        conn.client.set_missing_host_key_policy(_RejectUnknown())
        conn.client.load_system_host_keys()
        if self.known_hosts and self.known_hosts.is_file():
            conn.client.load_host_keys(str(self.known_hosts))
        return conn

    def open(self):
        with self._open_lock:
            return self._open()

    def _open(self):
        if self._conn is not None and self._conn.is_connected:
            return self._conn
        conn = self._fabric()
        delay = 1.0
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                conn.open()
                break
            except UnknownHostKey as exc:
                name = known_hosts_name(self.node.mgmt_ip, conn.port)
                raise HostKeyError(
                    self.node,
                    f"{self.node.name} ({name}): unknown SSH host key {exc.key.get_name()} {fingerprint(exc.key)}; "
                    f"nothing was run. If that fingerprint is the node's, trust it with: sparkdeploy trust "
                    f"{self.node.name}", exc.key) from None
            except paramiko.BadHostKeyException as exc:
                raise HostKeyError(
                    self.node,
                    f"{self.node.name} ({self.node.mgmt_ip}): the SSH host key CHANGED (now {fingerprint(exc.key)}, "
                    f"expected {fingerprint(exc.expected_key)}); refusing to connect. If the node was reinstalled, "
                    f"check the new fingerprint on its console, then run: sparkdeploy trust {self.node.name} "
                    f"--replace",
                    exc.key) from None
            except paramiko.AuthenticationException as exc:
                raise StepFailed(f"{self.node.name} ({self.node.mgmt_ip}): SSH authentication failed ({exc}); "
                                 "check ssh.user and ssh.key in the inventory") from None
            except (OSError, socket.timeout, paramiko.SSHException, EOFError) as exc:
                # Transient: connection refused or timed out. Connecting is idempotent, so retry with backoff.
                if attempt == CONNECT_ATTEMPTS:
                    raise StepFailed(f"{self.node.name} ({self.node.mgmt_ip}): unreachable over SSH after "
                                     f"{attempt} attempts: {exc.__class__.__name__}: {exc}") from None
                time.sleep(delay)
                delay *= 2
                conn = self._fabric()
        self._conn = conn
        return conn

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- commands ------------------------------------------------------------------------------------
    def run(self, argv: list[str] | str, *, check: bool = True, timeout: float | None = 120,
            stdin: str | None = None) -> CommandResult:
        """Run argv (quoted here) or a fixed shell snippet (str: only our own constant text, never values)."""
        command = argv if isinstance(argv, str) else shlex.join(argv)
        with self._sessions:
            return self._run(command, check, timeout, stdin)

    def _run(self, command: str, check: bool, timeout: float | None, stdin: str | None) -> CommandResult:
        conn = self.open()
        try:
            chan = conn.client.get_transport().open_session(timeout=self.connect_timeout)
            chan.settimeout(timeout)
            chan.exec_command(command)
            if stdin is not None:
                chan.sendall(stdin.encode())
            chan.shutdown_write()
            out, err = _drain(chan, timeout)
            code = chan.recv_exit_status()
        except (socket.timeout, TimeoutError):
            raise StepFailed(f"{self.node.name}: `{_short(command)}` timed out after {timeout:g}s") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._conn = None
            raise StepFailed(f"{self.node.name}: connection lost during `{_short(command)}`: {exc}") from None
        result = CommandResult(self.node.name, command, code, out, err)
        if check and code != 0:
            tail = (err or out).strip().splitlines()[-5:]
            raise StepFailed(f"{self.node.name}: `{_short(command)}` exited {code}" +
                             (": " + " | ".join(tail) if tail else ""))
        return result

    # -- files ---------------------------------------------------------------------------------------
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.open().client.open_sftp()
        return self._sftp

    def put(self, content: str | bytes, path: str, mode: int = 0o644) -> None:
        """Write a file atomically: a temp file created with its final mode first, then renamed over."""
        data = content.encode() if isinstance(content, str) else content
        directory = os.path.dirname(path) or "."
        tmp = f"{directory}/.{os.path.basename(path)}.sparkdeploy-tmp"
        # `install -m` creates the file with the mode already set: a secret is never readable by others.
        self.run(["install", "-m", f"{mode:04o}", "/dev/null", tmp])
        sftp = self.sftp()
        with sftp.open(tmp, "w") as fh:
            fh.write(data)
        sftp.chmod(tmp, mode)
        sftp.posix_rename(tmp, path)

    def read(self, path: str) -> bytes | None:
        try:
            with self.sftp().open(path, "r") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
        except OSError:
            return None

    def home(self) -> str:
        return self.sftp().normalize(".")


def _drain(chan, timeout: float | None) -> tuple[str, str]:
    out, err = bytearray(), bytearray()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        progressed = False
        if chan.recv_ready():
            out += chan.recv(65536)
            progressed = True
        if chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
            progressed = True
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if deadline is not None and time.monotonic() > deadline:
            raise socket.timeout()
        if not progressed:
            time.sleep(0.01)
    return out.decode(errors="replace"), err.decode(errors="replace")


def _short(command: str, limit: int = 120) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."


# -- many nodes at once ----------------------------------------------------------------------------------

@dataclass
class NodeOutcome:
    node: Node
    value: object = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def on_nodes(nodes: list[Node], fn: Callable[[Node], T], max_workers: int | None = None) -> list[NodeOutcome]:
    """Run fn on every node in parallel; every node gets a result or its error (never stop at the first)."""
    outcomes = [NodeOutcome(n) for n in nodes]
    if not nodes:
        return outcomes

    def call(outcome: NodeOutcome) -> None:
        try:
            outcome.value = fn(outcome.node)
        except Exception as exc:  # collected per node and reported by the caller
            outcome.error = exc

    preload()  # nothing is first imported on a node's thread (CPython 3.11 compile race: see thread_imports)
    with ThreadPoolExecutor(max_workers=max_workers or len(nodes)) as pool:
        list(pool.map(call, outcomes))
    return outcomes


# -- trust -----------------------------------------------------------------------------------------------

def scan_host_key(node: Node, inventory: Inventory, timeout: float = CONNECT_TIMEOUT_S) -> paramiko.PKey:
    """The host key the node offers (read during the key exchange; no authentication is attempted)."""
    port = node.ssh.port or 22
    sock = socket.create_connection((node.mgmt_ip, port), timeout=timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    finally:
        transport.close()


def record_host_key(path: Path, node: Node, key: paramiko.PKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    name = known_hosts_name(node.mgmt_ip, node.ssh.port or 22)
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    existing = path.read_text() if path.is_file() else ""
    if line in existing:
        return
    with open(path, "a") as fh:
        if existing and not existing.endswith("\n"):
            fh.write("\n")
        fh.write(line)
