"""SSH to the nodes, with host keys checked.

Fabric adds unknown host keys silently by default; here an unknown key stops the run with its fingerprint
and the command that trusts it, and a changed key is always a hard failure. Commands are argv lists
(quoted once, here); environment values never travel on a command line (Fabric's inline env would put
them in /proc/*/cmdline): secrets go to files written over SFTP with mode 0600 from creation.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import paramiko

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.config.userfile import read_text
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.runtime.interrupts import STOPPING, in_threads  # STOPPING: a second stop signal, no new remote command
from sparkdeploy.runtime.thread_imports import preload

if TYPE_CHECKING:
    from fabric import Connection

T = TypeVar("T")
CONNECT_TIMEOUT_S = 10
CONNECT_ATTEMPTS = 3
# Commands at once on one connection: sshd refuses sessions past MaxSessions (10 by default: "open failed:
# Connect failed"), and SFTP and push streams take sessions too.
MAX_PARALLEL_COMMANDS = 6
KEEPALIVE_S = 15
# What closing a connection whose peer is gone can raise.
CLOSE_ERRORS = (OSError, EOFError, paramiko.SSHException)
TAIL_CHARS = 4000  # of a failed command's stdout and stderr, kept on its CommandFailed
TRANSFER_TIMEOUT_S = 60.0  # one SFTP request, or unacknowledged data on the TCP connection
SYSTEM_KNOWN_HOSTS = "~/.ssh/known_hosts"
# Sent data unacknowledged this long fails the connection. Generous: Linux also counts a zero receive window
# (a node's `docker load` pausing its reads during a push) against it.
TCP_USER_TIMEOUT_S = 300
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
# Data between key exchanges from our side: twice OpenSSH's own limit for 128-bit block ciphers (2^32 blocks =
# 64 GiB, RFC 4344), not paramiko's 512 MiB. The node's sshd counts the same bytes and asks first; ours is the
# backstop for a server that never does (see NodeTransport).
REKEY_BYTES = 1 << 37

# paramiko's transport thread logs every failed handshake with its traceback (a port that accepts TCP but is not
# sshd: a dozen "Error reading SSH protocol banner" tracebacks), and with no logging configured Python's last-resort
# handler prints them on stderr. The same error reaches the caller, who reports it once per node (connect_problem),
# so paramiko's records go nowhere unless the program configures logging itself (e.g. INVOKE_DEBUG=1).
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(ip: str, port: int) -> str:
    return ip if port == 22 else f"[{ip}]:{port}"


def connect_problem(exc: BaseException, host: str, port: int | None) -> str:
    """A failed SSH connection in words, for the node's one line (no paramiko internals)."""
    where = f"{host}:{port or 22}"
    if isinstance(exc, paramiko.SSHException) and ("protocol banner" in str(exc) or "protocol version" in str(exc)):
        return f"{where} accepts TCP connections but does not speak SSH (no SSH banner: another service on that port?)"
    if isinstance(exc, EOFError):
        return f"{where} closed the connection during the SSH handshake"
    return f"{where}: {exc.__class__.__name__}: {exc}"


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
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


class _Capture(paramiko.MissingHostKeyPolicy):
    """For `sparkdeploy trust`: remember the offered key and refuse the connection."""

    def __init__(self) -> None:
        self.key: paramiko.PKey | None = None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
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

    def masked(self, mask: Callable[[str], str], tail: int = TAIL_CHARS) -> CommandResult:
        """The result as an error may carry it: secrets masked, only the last `tail` characters of the output."""
        return CommandResult(
            self.node, mask(self.command), self.exit_code, mask(self.stdout[-tail:]), mask(self.stderr[-tail:])
        )


# -- what can go wrong with a remote command (all StepFailed: every `except StepFailed` still catches them) ----


class RemoteError(StepFailed):
    """What went wrong on one node: `node` (its name), `command` (what ran, secrets masked; None while connecting
    or writing a file) and `cause` (the exception underneath, also its `__cause__`: raised `from` it)."""

    def __init__(self, message: str, *, node: str, command: str | None = None, cause: BaseException | None = None):
        self.node = node
        self.command = command
        self.cause = cause
        super().__init__(message)


class CommandFailed(RemoteError):
    """The command ran and exited non-zero; `result` is what it returned (secrets masked, output tails), the way
    invoke's UnexpectedExit carries its Result."""

    def __init__(self, result: CommandResult, message: str | None = None):
        self.result = result
        if message is None:
            tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
            message = f"{result.node}: `{_short(result.command)}` exited {result.exit_code}" + (
                ": " + " | ".join(tail) if tail else ""
            )
        super().__init__(message, node=result.node, command=result.command)


class ConnectionLost(RemoteError):
    """The SSH connection died during a command or a write (the node went away mid-run), or never came up."""


class NodeUnreachable(ConnectionLost):
    """No SSH connection could be opened to the node (refused, timed out, not SSH): nothing ran there."""


class CommandTimeout(RemoteError):
    """The command ran past its timeout; the connection itself may still be fine."""

    def __init__(
        self, message: str, command: str, timeout: float | None, *, node: str, cause: BaseException | None = None
    ):
        self.timeout = timeout
        super().__init__(message, node=node, command=command, cause=cause)


class NodeConnection:
    """One SSH connection to one node (opened lazily, reused for every command). Safe to share between
    threads: one connection is opened however many ask at once, and at most MAX_PARALLEL_COMMANDS commands
    run on it at a time (the others wait their turn)."""

    def __init__(
        self,
        node: Node,
        inventory: Inventory,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        mask: Callable[[str], str] | None = None,
    ):
        self.node = node
        self.inventory = inventory
        self.connect_timeout = connect_timeout
        self.mask = mask or _unmasked  # applied to what a CommandFailed carries (the secrets of the run)
        self._conn: Connection | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._open_lock = threading.Lock()
        self._sessions = threading.BoundedSemaphore(MAX_PARALLEL_COMMANDS)
        self._running = 0  # commands under way (one a stop abandoned may never end: see idle())
        self._ran = threading.Condition()
        self.lost = False  # the connection died during a command or a write (the node went away mid-run)
        # Day zero only (`init`, `setup ssh` on a node that takes nothing but a password yet): set by the caller,
        # held in memory, handed to paramiko; never on a command line or in a message.
        self.password: str | None = None

    # -- connection ----------------------------------------------------------------------------------
    @property
    def known_hosts(self) -> Path:
        # cast: local_path is None only for an empty value, and known_hosts has a default (~/.ssh/known_hosts)
        return cast(Path, self.inventory.local_path(self.inventory.cluster.known_hosts))

    def _fabric(self) -> Connection:
        from fabric import Config, Connection  # fabric: 14 modules `up --help` and `status` skip (preload loads it)

        ssh = self.node.ssh
        # The TCP connect timeout goes in connect_timeout only: Fabric 3 refuses it given twice.
        connect_kwargs: dict[str, Any] = {"banner_timeout": self.connect_timeout, "auth_timeout": self.connect_timeout}
        if ssh.key:
            connect_kwargs["key_filename"] = str(self.inventory.local_path(ssh.key))
        if self.password is not None:
            connect_kwargs["password"] = self.password
        connect_kwargs["transport_factory"] = NodeTransport
        conn = Connection(
            self.node.mgmt_ip,
            user=ssh.user,
            port=ssh.port,
            config=Config(),
            connect_timeout=int(self.connect_timeout),
            connect_kwargs=connect_kwargs,
        )
        # Fabric installs AutoAddPolicy on the node and on every ProxyJump hop: reject unknown keys on all of them.
        hop = conn
        while hop is not None:
            if isinstance(hop.gateway, str):  # ProxyCommand: that program's own ssh checks its hops
                break
            hop.client.set_missing_host_key_policy(_RejectUnknown())
            name = known_hosts_name(hop.host if hop is not conn else self.node.mgmt_ip, hop.port or 22)
            self._install_host_keys(hop.client, name)
            hop = hop.gateway
        return conn

    def _install_host_keys(self, client: paramiko.SSHClient, name: str) -> None:
        """The inventory's known_hosts first; ~/.ssh/known_hosts only for a host the inventory does not pin
        (paramiko would let the system file win), and a disagreement between them is an error naming both."""
        pinned = _host_keys(self.known_hosts)
        system_path = Path(os.path.expanduser(SYSTEM_KNOWN_HOSTS))
        same_file = self.known_hosts is not None and _same_file(self.known_hosts, system_path)
        system = paramiko.HostKeys() if same_file else _host_keys(system_path)
        mine, theirs = pinned.lookup(name), system.lookup(name)
        if mine is not None and theirs is not None:
            for ktype in theirs.keys():
                if ktype in mine.keys() and mine[ktype] != theirs[ktype]:
                    raise HostKeyError(
                        self.node,
                        f"{self.node.name} ({name}): the {ktype} host key pinned in {self.known_hosts} "
                        f"({fingerprint(mine[ktype])}) differs from the one in {system_path} "
                        f"({fingerprint(theirs[ktype])}); refusing to connect. Check the node's key on its console, "
                        f"then remove the wrong line (ssh-keygen -R {name} -f FILE)",
                    )
        keys = client.get_host_keys()
        for host_keys in (pinned, system):
            entry = host_keys.lookup(name)
            if entry is not None and (host_keys is pinned or mine is None):
                for ktype in entry.keys():
                    keys.add(name, ktype, entry[ktype])

    def open(self) -> Connection:
        with self._open_lock:
            return self._open()

    def _open(self) -> Connection:
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
                    f"{self.node.name}",
                    exc.key,
                ) from exc
            except paramiko.BadHostKeyException as exc:
                raise HostKeyError(
                    self.node,
                    f"{self.node.name} ({self.node.mgmt_ip}): the SSH host key CHANGED (now {fingerprint(exc.key)}, "
                    f"expected {fingerprint(exc.expected_key)}); refusing to connect. If the node was reinstalled, "
                    f"check the new fingerprint on its console, then run: sparkdeploy trust {self.node.name} "
                    f"--replace",
                    exc.key,
                ) from exc
            except paramiko.AuthenticationException as exc:
                raise StepFailed(
                    f"{self.node.name} ({self.node.mgmt_ip}): SSH authentication failed ({exc}); "
                    "check ssh.user and ssh.key in the inventory"
                ) from exc
            except (TimeoutError, OSError, paramiko.SSHException, EOFError) as exc:
                # Transient: connection refused or timed out. Connecting is idempotent, so retry with backoff.
                if attempt == CONNECT_ATTEMPTS:
                    raise NodeUnreachable(
                        f"{self.node.name} ({self.node.mgmt_ip}): unreachable over SSH after "
                        f"{attempt} attempts: {connect_problem(exc, conn.host, conn.port)}",
                        node=self.node.name,
                        cause=exc,
                    ) from exc
                time.sleep(delay)
                delay *= 2
                conn = self._fabric()
        _keepalive(conn.client.get_transport())
        self._conn = conn
        return conn

    def close(self) -> None:
        """Close what is open; closing a dead connection is not an error (nothing to report)."""
        sftp, conn, self._sftp, self._conn = self._sftp, self._conn, None, None
        for thing in (sftp, conn):
            if thing is not None:
                try:
                    thing.close()
                except CLOSE_ERRORS:
                    pass

    def __enter__(self) -> NodeConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands ------------------------------------------------------------------------------------
    def run(
        self,
        argv: list[str] | str,
        *,
        check: bool = True,
        timeout: float | None = 120,
        stdin: str | None = None,
        force: bool = False,
    ) -> CommandResult:
        """Run argv (quoted here) or a fixed shell snippet (str: only our own constant text, never values).
        After a second Ctrl-C (STOPPING) nothing new starts, except `force` (releasing our node lock)."""
        command = argv if isinstance(argv, str) else shlex.join(argv)
        if STOPPING.is_set() and not force:
            raise StepFailed(f"{self.node.name}: stopped (Ctrl-C) before `{_short(command)}`")
        with self._ran:
            self._running += 1
        try:
            with self._sessions:
                return self._run(command, check, timeout, stdin)
        finally:
            with self._ran:
                self._running -= 1
                self._ran.notify_all()

    def idle(self, wait: float) -> bool:
        """True once no command runs here, waiting at most `wait` seconds. After a stop, a command still
        running is one its caller abandoned, stalled on a node that does not answer: do not queue behind it."""
        with self._ran:
            return self._ran.wait_for(lambda: self._running == 0, timeout=wait)

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
        except TimeoutError as exc:
            raise CommandTimeout(
                f"{self.node.name}: `{_short(self.mask(command))}` timed out after {timeout:g}s",
                self.mask(command),
                timeout,
                node=self.node.name,
                cause=exc,
            ) from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._conn, self.lost = None, True
            raise ConnectionLost(
                f"{self.node.name}: connection lost during `{_short(self.mask(command))}`: {self.mask(str(exc))}",
                node=self.node.name,
                command=self.mask(command),
                cause=exc,
            ) from exc
        result = CommandResult(self.node.name, command, code, out, err)
        if check and code != 0:
            raise self.failed(result)
        return result

    def failed(self, result: CommandResult, message: str | None = None) -> CommandFailed:
        """The error for a failed command: its result masked and trimmed; `message` (masked too) when the caller
        words it itself (the default names the command, its exit code and the last lines of its output)."""
        return CommandFailed(result.masked(self.mask), None if message is None else self.mask(message))

    # -- files ---------------------------------------------------------------------------------------
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.open().client.open_sftp()
            # Each SFTP request waits at most this long for its answer: a node gone mid-write fails, never hangs.
            channel = self._sftp.get_channel()
            assert channel is not None, "a client just opened has its channel"
            channel.settimeout(TRANSFER_TIMEOUT_S)
        return self._sftp

    def put(self, content: str | bytes, path: str, mode: int = 0o644) -> None:
        """Write a file atomically: a temp file created with its final mode first, then renamed over."""
        data = content.encode() if isinstance(content, str) else content
        if STOPPING.is_set():
            raise StepFailed(f"{self.node.name}: stopped (Ctrl-C) before writing {path}")
        directory = os.path.dirname(path) or "."
        tmp = f"{directory}/.{os.path.basename(path)}.sparkdeploy-tmp"
        # `install -m` creates the file with the mode already set: a secret is never readable by others.
        self.run(["install", "-m", f"{mode:04o}", "/dev/null", tmp])
        try:
            sftp = self.sftp()
            with sftp.open(tmp, "w") as fh:
                fh.write(data)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except (TimeoutError, EOFError, paramiko.SSHException) as exc:
            # that session is in an unknown state: open a new one next time
            self._sftp, self._conn, self.lost = None, None, True
            raise ConnectionLost(
                f"{self.node.name}: writing {path} failed or stalled over {TRANSFER_TIMEOUT_S:g} s "
                f"({exc.__class__.__name__}); the node may be gone",
                node=self.node.name,
                cause=exc,
            ) from exc

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


def load_host_keys(path: Path | None) -> paramiko.HostKeys:
    """A known_hosts file read through the one door (userfile.py: a regular UTF-8 file of at most 1 MiB, never
    /dev/zero), its lines parsed as ssh(1) does; a missing file holds no key. ConfigError for a bad file or line."""
    keys = paramiko.HostKeys()
    if path is None or not (path.exists() or path.is_symlink()):
        return keys
    text = read_text(path, "known_hosts file", "fix or remove the file (sparkdeploy trust NODE records keys)")
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        except paramiko.SSHException:  # a key of a type paramiko does not know: skipped, as paramiko does
            continue
        except (paramiko.hostkeys.InvalidHostKey, ValueError, IndexError, TypeError) as exc:
            raise ConfigError(
                Problem(
                    str(path),
                    f"line {number}",
                    f"not a known_hosts line ({exc.__class__.__name__})",
                    "fix or remove the bad line",
                )
            ) from None
        if entry is not None:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)
    return keys


def _host_keys(path: Path | None) -> paramiko.HostKeys:
    try:
        return load_host_keys(path)
    except ConfigError as exc:
        raise StepFailed(str(exc)) from exc


def pinned_fingerprints(inventory: Inventory) -> dict[str, str | None]:
    """node -> the fingerprint of its pinned host key (the inventory's known_hosts, else ~/.ssh/known_hosts; the
    first key type by name where several are pinned), read on this machine without connecting; None: not pinned."""
    path = inventory.local_path(inventory.cluster.known_hosts)
    files = [_host_keys(path), _host_keys(Path(os.path.expanduser(SYSTEM_KNOWN_HOSTS)))]
    out: dict[str, str | None] = {}
    for node in inventory.nodes:
        name = known_hosts_name(node.mgmt_ip, node.ssh.port or 22)
        entry = next((e for e in (f.lookup(name) for f in files) if e is not None), None)
        out[node.name] = fingerprint(entry[sorted(entry.keys())[0]]) if entry is not None and entry.keys() else None
    return out


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.is_file() and b.is_file() and os.path.samefile(a, b)
    except OSError:
        return False


class NodeTransport(paramiko.Transport):
    """paramiko's transport with AES-GCM first and a re-key limit past OpenSSH's: no key exchange of ours mid-run.

    paramiko handles a channel's close in its transport thread, and the reply it sends there waits for any key
    exchange in progress, which only that thread can finish: a close that arrives while our side re-keys hangs the
    connection for 30 s, then kills every command and stream on it ("Key-exchange timed out waiting for key
    negotiation"). A re-key started by us mid-run (paramiko's after 512 MiB, or a switch to a faster cipher) races
    every command's close on other threads; one started by the node cannot, since the node sends nothing else
    once it asks. So the cipher is chosen at the first key exchange, and the node's sshd decides when to re-key.

    GCM first: for bulk data (pushes) it costs about 40% less CPU here and 35% less in the node's sshd than
    paramiko's default AES-CTR + HMAC (500 MB: 1.4-1.8 cpu-s here and 0.7 in sshd, against 2.3-2.6 and 1.05).
    """

    # AES only (128-bit blocks, so the limit below holds for each); 3des-cbc (64-bit blocks) is left out.
    _preferred_ciphers = AEAD_CIPHERS + tuple(
        c
        for c in paramiko.Transport._preferred_ciphers  # type: ignore[attr-defined]  # not in types-paramiko
        if c.startswith("aes") and c not in AEAD_CIPHERS
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.packetizer.REKEY_BYTES = REKEY_BYTES


def _keepalive(transport: paramiko.Transport | None) -> None:
    """SSH keepalives, and TCP settings that fail a dead peer in minutes instead of the kernel's ~15."""
    if transport is None:
        return
    transport.set_keepalive(KEEPALIVE_S)
    sock = transport.sock
    if not isinstance(sock, socket.socket):
        return  # a ProxyJump channel or ProxyCommand pipe: the SSH keepalive covers it
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_S),
        ("TCP_KEEPINTVL", 5),
        ("TCP_KEEPCNT", 4),
        ("TCP_USER_TIMEOUT", TCP_USER_TIMEOUT_S * 1000),
    ):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, opt, value in options:
        try:
            sock.setsockopt(level, opt, value)
        except OSError:
            pass


def _drain(chan: paramiko.Channel, timeout: float | None) -> tuple[str, str]:
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
        # Done at the channel's EOF, not at its exit status: sshd may send the exit status while the command's
        # last output is still on its way, and stopping there returned an empty stdout now and then (a
        # `date` with no time, testinfra reading an empty `uname -s`).
        if (chan.eof_received or chan.closed) and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError()
        if not progressed:
            time.sleep(0.01)
    return out.decode(errors="replace"), err.decode(errors="replace")


def _unmasked(text: str) -> str:
    return text


def _short(command: str, limit: int = 120) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."


# -- many nodes at once ----------------------------------------------------------------------------------


@dataclass
class NodeOutcome:
    node: Node
    value: Any = None  # what fn returned (typed by the caller, who knows fn)
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
        # Broad on purpose: a node's worker thread must hand any failure (even a bug) to the caller, who reports
        # it on that node; an exception left in the thread would leave the node in an unknown state.
        except Exception as exc:  # noqa: BLE001 - broad on purpose, see above
            outcome.error = exc

    preload()  # nothing is first imported on a node's thread (CPython 3.11 compile race: see thread_imports)
    # A stop (Ctrl-C, SIGTERM) ends the wait at once; the threads, which start nothing new after a second one
    # (STOPPING), are abandoned (sparkdeploy/runtime/interrupts.py).
    in_threads(outcomes, call, max_workers)
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
    existing = read_text(path, "known_hosts file") if path.exists() else ""
    if line in existing:
        return
    with open(path, "a") as fh:
        if existing and not existing.endswith("\n"):
            fh.write("\n")
        fh.write(line)
