"""One doctor run: the inventory, the rendered deployment, and one SSH session per node.

Every node gets ONE SSH connection (sparkdeploy.runtime.remote.NodeConnection: host keys checked, unknown keys
refused). Checks share it: paramiko multiplexes channels, so checks of one node run in parallel over it.
The node's facts (sparkdeploy.facts: every fact doctor reads, the deploy pipeline's included) are read once
per node in one command and memoized (`DoctorRun.node_facts`); the first check that asks runs it, the others
wait for it. Probes that are not facts of the node (ping to peers, the clock, the NCCL probe) run their own
commands over the same connection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sparkdeploy.checks import Result
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.errors import ConfigError
from sparkdeploy.facts import FactArgs, NodeFacts, gather, hub_folder
from sparkdeploy.facts.parsers import Section, parse_sections
from sparkdeploy.facts.read import FACTS_TIMEOUT_S, SETS
from sparkdeploy.facts.script import SECTION_FUNCTION
from sparkdeploy.runtime.remote import CommandResult, NodeConnection
from sparkdeploy.topologies.deployment import Deployment, NodeDeployment

T = TypeVar("T")

# prepended to every probe script: facts/script.py's `sec` (one command's stdout, stderr and exit code, framed)
SCRIPT_PRELUDE = "\n" + SECTION_FUNCTION


class _Memo:
    """Compute each key once; concurrent callers of the same key wait for the first one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Hashable, list[Any]] = {}  # key -> [done, value, exception]

    def get(self, key: Hashable, fn: Callable[[], T]) -> T:
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
        value: T = entry[1]
        return value


@dataclass
class NodeSession:
    node: Node
    conn: NodeConnection
    connect_error: Exception | None = None
    connected: bool = False
    memo: _Memo = field(default_factory=_Memo)

    def run(self, argv: list[str] | str, timeout: float = 20, stdin: str | None = None) -> CommandResult:
        return self.conn.run(argv, check=False, timeout=timeout, stdin=stdin)

    def script(self, script: str, args: list[str], timeout: float = 20) -> dict[str, Section]:
        """Run a constant bash script (sent on stdin) with positional args; return its sections."""
        res = self.conn.run(["bash", "-s", "--", *args], check=False, timeout=timeout, stdin=SCRIPT_PRELUDE + script)
        return parse_sections(res.stdout)

    def facts(self, key: str, fn: Callable[[NodeSession], T]) -> T:
        return self.memo.get(key, lambda: fn(self))

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
    tests: tuple[str, ...] = ()  # the owner's testinfra modules (--tests, cluster.doctor_tests): testinfra_run.py


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
    connector: Callable[[DoctorRun, Node], Result] | None = None  # runner.connect (access.ssh)
    # A stack runs (up --stack): each deployment, by name, that the recipe checks look at (render_deployed);
    # `deployment` is then None, and --deployment NAME narrows these to one.
    stack: list[tuple[str, Deployment]] = field(default_factory=list)

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

    def node_deployment(self, node: Node) -> NodeDeployment | None:
        if self.deployment is None:
            return None
        for nd in self.deployment.nodes:
            if nd.node.name == node.name:
                return nd
        return None

    def facts(self, node: Node, key: str, fn: Callable[[NodeSession], T]) -> T:
        return self.session(node).facts(key, fn)

    def node_facts(self, node: Node) -> NodeFacts:
        """Every fact doctor reads of `node`, in ONE command (sparkdeploy.facts, the set `doctor`), once."""
        return self.facts(
            node, "facts", lambda s: gather(s.conn, SETS["doctor"], self.fact_args(node), FACTS_TIMEOUT_S)
        )

    def fact_args(self, node: Node) -> FactArgs:
        nd = self.node_deployment(node)
        cluster = self.inventory.cluster  # type: ignore[union-attr]  # checks run only with an inventory (runner)
        model = self.deployment.recipe.recipe.model if self.deployment else ""
        return FactArgs(
            state_dir=cluster.state_dir,
            hf_cache=cluster.hf_cache,
            model_folder=hub_folder(model) if model else "",
            fabric_ifaces=tuple(node.fabric_ifaces),
            images=tuple(sorted({c.image for c in nd.containers})) if nd else (),
        )

    def starts_engine(self, node: Node) -> bool:
        """Whether an engine (re)starts on the node: doctor has no plan, so it checks as if one did."""
        return True

    def ssh_check(self, node: Node) -> Result:
        """The access.ssh row: the runner's connect (runner.connect, set as `connector`)."""
        assert self.connector is not None, "the runner sets connector before any check runs"
        return self.connector(self, node)
