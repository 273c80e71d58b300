"""What images the nodes hold: one SSH round trip per node, read-only.

`read_node_images(conn)` returns every image of the node's engine with its ID, tags, layer diff IDs and our
label, plus what a push needs to know: the Docker root's free space, the storage driver, whether the engine
keeps images in containerd (where a load of a partial archive is not known to work) and whether zstd is
installed. `list_images` gathers the images we manage (label io.sparkdeploy.image) on every node in parallel
and says, per tag, whether the nodes agree on its image ID.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sparkdeploy import facts
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import StepFailed, no_such
from sparkdeploy.facts.catalog import image_store
from sparkdeploy.facts.node import ImageStoreFact
from sparkdeploy.facts.parsers import Section
from sparkdeploy.images.definitions import LABEL
from sparkdeploy.nodeside.archive import PARTIAL_LABEL
from sparkdeploy.nodeside.layers import chain_ids
from sparkdeploy.runtime.remote import NodeConnection, NodeOutcome, on_nodes


@dataclass
class ImageRecord:
    id: str
    tags: list[str]
    layers: list[str]
    labels: dict[str, str]
    size: int = 0

    @property
    def name(self) -> str | None:
        """The image definition it was built from (our label), if any."""
        return self.labels.get(LABEL)


@dataclass
class NodeImages:
    node: str
    root_dir: str
    driver: str
    server_version: str
    free_bytes: int | None  # None: df could not read the Docker root
    zstd: bool
    containerd_store: bool
    images: list[ImageRecord] = field(default_factory=list)

    def chain_ids(self) -> set[str]:
        """Chain IDs of every layer the node's images stand on: the layers `docker load` will not need."""
        chains: set[str] = set()
        for image in self.images:
            chains.update(chain_ids(image.layers))
        return chains

    def image(self, ref: str) -> ImageRecord | None:
        """The image with this ID or tag, if the node has it."""
        for image in self.images:
            if image.id == ref or ref in image.tags:
                return image
        return None

    def managed(self) -> list[ImageRecord]:
        return [i for i in self.images if i.name]

    def partials(self) -> dict[str, int]:
        """Partial images a cut push left (image ID they are part of -> how many): `images push` resumes."""
        counts: dict[str, int] = {}
        for image in self.images:
            part_of = image.labels.get(PARTIAL_LABEL)
            if part_of:
                counts[part_of] = counts.get(part_of, 0) + 1
        return counts


def node_images(node: str, store: ImageStoreFact) -> NodeImages:
    """The image store's fact (facts/catalog.py: image_store) as the pushes read it."""
    images = NodeImages(node, "", "", "", store.free_bytes, store.zstd, False)
    if store.info is not None:
        info = store.info
        images.root_dir, images.driver, images.server_version = info["root"], info["driver"], info["version"]
        # docker info shows ["driver-type", "io.containerd.snapshotter.v1"] with the containerd image store
        images.containerd_store = any("containerd.snapshotter" in str(pair) for pair in info["status"] or [])
    for data in store.images:
        images.images.append(
            ImageRecord(
                data["id"],
                data["tags"] or [],
                data["layers"] or [],
                data["labels"] or {},
                int(data.get("size") or 0),
            )
        )
    if not images.root_dir:
        raise StepFailed(f"{node}: could not read the Docker engine's facts (is the user in the docker group?)")
    return images


def parse_facts(node: str, text: str) -> NodeImages:
    """The image store's output (its fact's section) -> NodeImages (pure)."""
    return node_images(node, image_store(Section(text, "", 0)))


def read_node_images(conn: NodeConnection, timeout: float = 60) -> NodeImages:
    """The node's image store, read as its registered fact (one command)."""
    read = facts.gather(conn, "image_store", facts.FactArgs(), timeout=timeout)
    store = read.image_store if read.has("image_store") else None
    if store is None or store.rc not in (0, None):
        code = store.rc if store is not None else None
        tail = store.error if store is not None else ""
        what = "its Docker engine did not answer" if code == 90 else "reading its images failed"
        raise StepFailed(f"{conn.node.name}: {what} (exit {code}): {tail}")
    return node_images(conn.node.name, store)


def select_nodes(inventory: Inventory, nodes: Sequence[str | Node] | None = None) -> list[Node]:
    """Nodes of the inventory by name (or Node objects); all of them when None."""
    if not nodes:
        return list(inventory.nodes)
    by_name = {n.name: n for n in inventory.nodes}
    chosen = []
    for item in nodes:
        name = item if isinstance(item, str) else item.name
        if name not in by_name:
            raise no_such("node", name, list(by_name))
        if by_name[name] not in chosen:
            chosen.append(by_name[name])
    return chosen


# -- images list ----------------------------------------------------------------------------------------------


@dataclass
class TagAgreement:
    tag: str
    name: str | None
    ids: dict[str, str | None]  # node -> image ID (None: the node lacks the tag)

    @property
    def agree(self) -> bool:
        values = set(self.ids.values())
        return len(values) == 1 and None not in values


def list_images(
    inventory: Inventory, nodes: Sequence[str | Node] | None = None
) -> tuple[list[NodeOutcome], list[TagAgreement]]:
    """Per node its managed images (outcome.value: NodeImages), and per tag whether the nodes agree."""
    chosen = select_nodes(inventory, nodes)

    def read(node: Node) -> NodeImages:
        with NodeConnection(node, inventory) as conn:
            return read_node_images(conn)

    outcomes = on_nodes(chosen, read)
    readable = [o for o in outcomes if o.ok]
    tags: dict[str, TagAgreement] = {}
    for outcome in readable:
        for image in outcome.value.managed():
            for tag in image.tags or [f"<untagged {image.id[7:19]}>"]:
                row = tags.setdefault(tag, TagAgreement(tag, image.name, {}))
                row.ids[outcome.node.name] = image.id
    for row in tags.values():
        for outcome in readable:
            row.ids.setdefault(outcome.node.name, None)
    return outcomes, sorted(tags.values(), key=lambda r: r.tag)
