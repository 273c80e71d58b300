"""One port map per node: every port sparkdeploy's containers listen on there, and who listens.

Every container runs on the host network, so the engines (vLLM, each stack deployment on its own `port`), the
Ray head (ray_port), torchrun's rendezvous and vLLM's multi-node master (master_port), the LiteLLM proxy of
2xsolo/replicas (proxy_port) or the stack's gateway, and Prometheus (metrics_port) share each node's ports. The
memory guard listens on none. The map is built from the rendered containers themselves
(`ContainerSpec.listens`, set where each topology starts them), so it cannot drift from what runs; a port two
of them want on one node is refused before anything starts, naming both and proposing a port free there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sparkdeploy.errors import Problem
from sparkdeploy.topologies.deployment import Deployment, Listen

FIRST_FREE = 1024  # a proposed port is never a privileged one
LAST_PORT = 65535


@dataclass(frozen=True)
class Owner:
    node: str
    listen: Listen
    deployment: str = ""  # a stack deployment's name ("": the single deployment)

    def words(self, setting: str) -> str:
        who = f"{self.deployment}'s {self.listen.what}" if self.deployment else self.listen.what
        return f"{who} ({setting})"


@dataclass
class PortMap:
    owners: dict[str, dict[int, list[Owner]]] = field(default_factory=dict)  # node -> port -> who listens

    def add(self, node: str, listen: Listen, deployment: str = "") -> None:
        self.owners.setdefault(node, {}).setdefault(listen.port, []).append(Owner(node, listen, deployment))

    def add_deployment(self, dep: Deployment, name: str = "") -> None:
        for nd in dep.nodes:
            for c in nd.containers:
                for listen in c.listens:
                    self.add(nd.node.name, listen, name)

    def free_port(self, after: int) -> int:
        """The first port above `after` (and not privileged) that nothing listens on at any node of the map (a
        deployment's port is one setting for all its nodes)."""
        used = {port for ports in self.owners.values() for port in ports}
        port = max(after + 1, FIRST_FREE)
        while port in used and port < LAST_PORT:
            port += 1
        return port

    def clashing(self) -> set[frozenset[str]]:
        """The pairs of deployments (by name) that want one port on one node."""
        return {
            frozenset((owners[0].deployment, other.deployment))
            for ports in self.owners.values()
            for owners in ports.values()
            for other in owners[1:]
        }

    def problems(self, source: str, setting: Callable[[Owner], str] = lambda o: o.listen.setting) -> list[Problem]:
        """One line per port two owners want on one node (`setting` names where each one's port is set)."""
        out = []
        for node, ports in self.owners.items():
            for port, owners in sorted(ports.items()):
                first = owners[0]
                for other in owners[1:]:
                    out.append(
                        Problem(
                            source,
                            setting(other),
                            f"port {port} on {node}: {first.words(setting(first))} and "
                            f"{other.words(setting(other))} would both listen there",
                            f"set {setting(other)} to a port free on {node}, e.g. {self.free_port(port)}",
                        )
                    )
        return out


def deployment_problems(dep: Deployment, source: str) -> list[Problem]:
    """The port clashes of one deployment on each of its nodes (the inventory's ports)."""
    ports = PortMap()
    ports.add_deployment(dep)
    return ports.problems(source)
