"""What the two readers (store_stream, save_stream) share: the groups they send to and what each node got."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkdeploy.images.push import PushTarget


@dataclass
class StreamGroup:
    """Nodes that lack the same layers and use the same compression: they get the same archives."""

    names: list[str]
    needed: set[str]  # diff IDs to send
    method: str  # zstd | gzip | none
    estimate: int  # archive bytes, for progress and timeouts
    single_load: bool = False  # one load with every layer (the containerd image store)


@dataclass
class NodeStream:
    raw: int = 0  # archive bytes fed to the node (before compression)
    wire: int = 0  # bytes written to its SSH channels
    error: str | None = None
    partial_ids: list[str] = field(default_factory=list)  # partial images its loads made (store reader)


def group_plans(plans: Iterable[PushTarget]) -> list[StreamGroup]:
    """PushTargets (push.py) that need the same layers with the same compression, as groups."""
    groups: dict[tuple[frozenset[str], str, bool], StreamGroup] = {}
    for plan in plans:
        single = plan.facts.containerd_store
        key = (frozenset(plan.needed), plan.compression, single)
        if key not in groups:
            groups[key] = StreamGroup([], set(plan.needed), plan.compression, plan.estimate, single)
        groups[key].names.append(plan.node.name)
    return list(groups.values())
