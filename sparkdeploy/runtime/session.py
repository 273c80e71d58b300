"""A run's connections: one per node of the inventory (remote.NodeConnection, host keys checked), opened lazily,
closed at the end of the run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.runtime.remote import NodeConnection


@dataclass
class Session:
    """One connection per node of the inventory, opened lazily, closed at the end of the run."""

    inventory: Inventory
    conns: dict[str, NodeConnection]

    @classmethod
    def open(
        cls, inventory: Inventory, connect_timeout: float | None = None, mask: Callable[[str], str] | None = None
    ) -> Session:
        """mask: the run's secrets mask, applied to what a failed command's error carries."""
        kwargs = {"connect_timeout": connect_timeout} if connect_timeout else {}
        return cls(inventory, {n.name: NodeConnection(n, inventory, mask=mask, **kwargs) for n in inventory.nodes})

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()  # a dead connection closes quietly (NodeConnection.close)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def conn(self, node: Node | str) -> NodeConnection:
        return self.conns[node if isinstance(node, str) else node.name]
