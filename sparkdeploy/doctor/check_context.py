"""What a check takes: the one interface every check of the registry (doctor/registry.py) is written against.

`CheckContext` is what `up`'s preflight offers (deploy/preflight.py `PreflightRun`: the facts `up` read, no
command on the node) and what doctor's run offers too (doctor_run.py `DoctorRun`). A check that runs commands on
a node declares it in its type: it takes a `SessionContext` (doctor's run, the fabric gate's `GateRun`), so mypy
rejects a preflight check (registered with `preflight=`, typed `CheckContext`) that calls `run.session()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sparkdeploy.checks import Result
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.facts import NodeFacts
from sparkdeploy.topologies.deployment import Deployment, NodeDeployment

from .doctor_run import NodeSession, Options, _Memo


class CheckContext(Protocol):
    """What every check may look at: the inventory, the deployment, each node's facts (read once, elsewhere)."""

    @property
    def inventory(self) -> Inventory | None: ...

    @property
    def deployment(self) -> Deployment | None: ...

    @property
    def simulated_image(self) -> bool: ...

    @property
    def nodes(self) -> list[Node]: ...

    def peers(self, node: Node) -> list[Node]: ...

    def reachable(self, node: Node) -> bool: ...

    def node_deployment(self, node: Node) -> NodeDeployment | None: ...

    def node_facts(self, node: Node) -> NodeFacts: ...

    def starts_engine(self, node: Node) -> bool: ...

    def ssh_check(self, node: Node) -> Result: ...


class SessionContext(CheckContext, Protocol):
    """A check that runs its own commands on the nodes (versions in the image, the NCCL probe, ping): doctor's run
    and the fabric gate's offer one open session per node. Never `up`'s preflight."""

    @property
    def options(self) -> Options: ...

    @property
    def extra(self) -> dict[str, Any]: ...

    @property
    def memo(self) -> _Memo: ...

    def session(self, node: Node) -> NodeSession: ...


NodeCheck = Callable[[CheckContext, Node], Result | list[Result]]
ClusterCheck = Callable[[CheckContext], Result | list[Result]]
