"""One doctor run: the inventory, the rendered deployment, and one SSH session per node.

Every node gets ONE SSH connection (sparkdeploy.remote.NodeConnection: host keys checked, unknown keys
refused). Checks share it: paramiko multiplexes channels, so checks of one node run in parallel over it.
Facts several checks need are gathered once per node by a constant bash script (values travel as its
positional arguments) and memoized; the first check that asks runs it, the others wait for it.

testinfra's host modules run over the same connection: `NodeBackend` is testinfra's paramiko backend with
its client replaced by ours, so testinfra never opens a connection of its own and never sees an unknown
host key (its paramiko backend would only warn and accept one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkdeploy.deployment import Deployment
from sparkdeploy.errors import ConfigError
from sparkdeploy.inventory import Inventory, Node
from sparkdeploy.remote import CommandResult, NodeConnection
from sparkdeploy.secrets import Secrets

from .parsers import SECTION, Section, parse_sections

# A section helper prepended to every gather script: stdout, stderr and exit code of one command, delimited.
SCRIPT_PRELUDE = (
    r"""
sec() { local n=$1 t rc; shift; t=$(mktemp); printf '\n%s %s\n' '"""
    + SECTION
    + r"""' "$n"; "$@" 2>"$t"; rc=$?;
  printf '\n%s %s.err\n' '"""
    + SECTION
    + r"""' "$n"; cat "$t"; rm -f "$t"; printf '\n%s %s.rc %s\n' '"""
    + SECTION
    + r"""' "$n" "$rc"; }
"""
)


def parallel_script(parts: list[str]) -> str:
    """One script running each part in its own background subshell, outputs concatenated in order."""
    lines = ["__d=$(mktemp -d)"]
    for i, part in enumerate(parts):
        lines.append(f'(\n{part}\n) >"$__d/{i}" 2>/dev/null &')
    lines.append("wait")
    lines.append("cat " + " ".join(f'"$__d/{i}"' for i in range(len(parts))))
    lines.append('rm -rf "$__d"')
    return "\n".join(lines) + "\n"


class _Memo:
    """Compute each key once; concurrent callers of the same key wait for the first one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[Any, list] = {}

    def get(self, key, fn: Callable[[], Any]):
        with self._lock:
            entry: Any = self._entries.get(key)
            owner = entry is None
            if owner:
                entry = self._entries[key] = [threading.Event(), None, None]
        event, _, _ = entry
        if owner:
            try:
                entry[1] = fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised to every caller
                entry[2] = exc
            finally:
                event.set()
        else:
            event.wait()
        if entry[2] is not None:
            raise entry[2]
        return entry[1]


def _testinfra_backend_class():
    from testinfra.backend.paramiko import ParamikoBackend

    class NodeBackend(ParamikoBackend):
        """testinfra's paramiko backend over our host-key-checked NodeConnection (never its own client)."""

        NAME = "paramiko"

        def __init__(self, conn: NodeConnection, timeout: float = 20):
            self.conn = conn
            ssh = conn.node.ssh
            spec = f"{ssh.user + '@' if ssh.user else ''}{conn.node.url_host}:{ssh.port or 22}"
            super().__init__(spec, timeout=int(timeout))
            self._encoding = "utf-8"  # skip testinfra's python round trip to ask the node

        @property
        def client(self):  # replaces ParamikoBackend.client (which would connect with WarningPolicy)
            return self.conn.open().client

        def run(self, command: str, *args: str, **kwargs: Any):
            command = self.get_command(command, *args)
            res = self.conn.run(command, check=False, timeout=self.timeout)
            return self.result(res.exit_code, self.encode(command), res.stdout.encode(), res.stderr.encode())

    return NodeBackend


def _fill_system_info(host) -> None:
    """Compute testinfra's `system_info` for this host now, with testinfra's own code, and store it on the
    instance. CPython 3.11's functools.cached_property holds ONE lock per class, not per instance (gh-87634,
    gone in 3.12): left to the descriptor, every node's first testinfra call (host.user(), host.socket, ...)
    waited for the previous node's three round trips, so doctor grew with the node count."""
    info = host.system_info
    info.__dict__["sysinfo"] = type(info).sysinfo.func(info)


@dataclass
class NodeSession:
    node: Node
    conn: NodeConnection
    connect_error: Exception | None = None
    connected: bool = False
    memo: _Memo = field(default_factory=_Memo)
    _host: Any = None
    _host_lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, argv: list[str] | str, timeout: float = 20, stdin: str | None = None) -> CommandResult:
        return self.conn.run(argv, check=False, timeout=timeout, stdin=stdin)

    def script(self, script: str, args: list[str], timeout: float = 20) -> dict[str, Section]:
        """Run a constant bash script (sent on stdin) with positional args; return its sections."""
        res = self.conn.run(["bash", "-s", "--", *args], check=False, timeout=timeout, stdin=SCRIPT_PRELUDE + script)
        return parse_sections(res.stdout)

    def script_parts(self, parts: list[str], args: list[str], timeout: float = 30) -> dict[str, Section]:
        """Several gather scripts in ONE command (one SSH channel), run in parallel on the node."""
        return self.script(parallel_script(parts), args, timeout=timeout)

    def facts(self, key: str, fn: Callable[[NodeSession], Any]):
        return self.memo.get(key, lambda: fn(self))

    @property
    def host(self):
        """A testinfra Host over this session's connection."""
        with self._host_lock:
            if self._host is None:
                import testinfra.host

                host = testinfra.host.Host(_testinfra_backend_class()(self.conn))
                _fill_system_info(host)
                self._host = host
            return self._host

    def close(self) -> None:
        self.conn.close()  # a broken connection closes quietly (NodeConnection.close)


@dataclass
class Options:
    recipe: str | None = None
    topology: str | None = None
    nccl: bool = False
    nccl_max_bytes: int | None = None
    strict: bool = False
    deployment: str | None = None  # endpoint checks of one deployment of a stack (up --stack)


@dataclass
class DoctorRun:
    """Everything a check may look at. Built by `prepare()`; the runner fills `sessions`."""

    inventory: Inventory | None
    inventory_error: ConfigError | None = None
    deployment: Deployment | None = None
    deployment_error: ConfigError | None = None
    recipe_name: str | None = None
    recipe_source: str = ""  # why this recipe: given with --recipe, deployed on the nodes, or the default
    render_later: Callable[[DoctorRun], None] | None = None  # renders what the nodes run, once connected
    simulated_image: bool = False  # the image that runs is a lab stand-in (image_override: vllm-sim)
    secrets: Secrets = field(default_factory=Secrets)
    options: Options = field(default_factory=Options)
    sessions: dict[str, NodeSession] = field(default_factory=dict)
    memo: _Memo = field(default_factory=_Memo)
    started: float = field(default_factory=time.monotonic)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the NCCL probe's table, for the report

    @property
    def nodes(self) -> list[Node]:
        return list(self.inventory.nodes) if self.inventory else []

    def session(self, node: Node) -> NodeSession:
        return self.sessions[node.name]

    def reachable(self, node: Node) -> bool:
        s = self.sessions.get(node.name)
        return bool(s and s.connected)

    def peers(self, node: Node) -> list[Node]:
        return [n for n in self.nodes if n.name != node.name]

    def node_deployment(self, node: Node):
        if self.deployment is None:
            return None
        for nd in self.deployment.nodes:
            if nd.node.name == node.name:
                return nd
        return None

    def facts(self, node: Node, key: str, fn: Callable[[NodeSession], Any]):
        return self.session(node).facts(key, fn)
