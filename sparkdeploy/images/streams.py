"""What the two readers (store_stream, save_stream) share: the groups they send to and what each node got."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sparkdeploy.nodeside.layer_store import LayerStore


class StreamSource(Protocol):
    """What the readers take of the image pushed (push.SourceImage)."""

    id: str
    diff_ids: list[str]
    store: LayerStore | None  # the layer store reader's; None: docker save


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
