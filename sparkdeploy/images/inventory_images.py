"""What images the nodes hold: one SSH round trip per node, read-only.

`read_node_images(conn)` returns every image of the node's engine with its ID, tags, layer diff IDs and our
label, plus what a push needs to know: the Docker root's free space, the storage driver, whether the engine
keeps images in containerd (where a load of a partial archive is not known to work) and whether zstd is
installed. `list_images` gathers the images we manage (label io.sparkdeploy.image) on every node in parallel
and says, per tag, whether the nodes agree on its image ID.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import StepFailed, no_such
from sparkdeploy.images.definitions import LABEL
from sparkdeploy.nodeside.archive import PARTIAL_LABEL
from sparkdeploy.nodeside.layers import chain_ids
from sparkdeploy.runtime.remote import NodeConnection, NodeOutcome, on_nodes

# A fixed script (no values are interpolated): engine facts, then one JSON line per image.
_FORMAT = (
    '{"id":{{json .Id}},"tags":{{json .RepoTags}},"layers":{{json .RootFS.Layers}},'
    '"labels":{{if .Config}}{{json .Config.Labels}}{{else}}null{{end}},"size":{{.Size}}}'
)
FACTS_SCRIPT = r"""
set -u
docker version --format '{{.Server.Version}}' >/dev/null || exit 90
docker info --format 'info {"root":{{json .DockerRootDir}},"driver":{{json .Driver}},"status":{{json .DriverStatus}},"version":{{json .ServerVersion}}}' || exit 90
root=$(docker info --format '{{.DockerRootDir}}')
echo "df $(df -PB1 "$root" 2>/dev/null | awk 'NR==2 {print $4}')"
echo "zstd $(command -v zstd >/dev/null 2>&1 && echo yes || echo no)"
ids=$(docker image ls -aq --no-trunc | sort -u)
[ -z "$ids" ] || docker image inspect --format 'image FORMAT' $ids || exit 91
""".replace("FORMAT", _FORMAT)  # noqa: E501 - shell lines run as written


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


def parse_facts(node: str, text: str) -> NodeImages:
    facts = NodeImages(node, "", "", "", None, False, False)
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "info":
            info = json.loads(rest)
            facts.root_dir, facts.driver, facts.server_version = info["root"], info["driver"], info["version"]
            # docker info shows ["driver-type", "io.containerd.snapshotter.v1"] with the containerd image store
            facts.containerd_store = any("containerd.snapshotter" in str(pair) for pair in info["status"] or [])
        elif kind == "df":
            facts.free_bytes = int(rest) if rest.strip().isdigit() else None
        elif kind == "zstd":
            facts.zstd = rest.strip() == "yes"
        elif kind == "image":
            data = json.loads(rest)
            facts.images.append(
                ImageRecord(
                    data["id"],
                    data["tags"] or [],
                    data["layers"] or [],
                    data["labels"] or {},
                    int(data.get("size") or 0),
                )
            )
    if not facts.root_dir:
        raise StepFailed(f"{node}: could not read the Docker engine's facts (is the user in the docker group?)")
    return facts


def read_node_images(conn: NodeConnection, timeout: float = 60) -> NodeImages:
    result = conn.run(["sh", "-c", FACTS_SCRIPT], check=False, timeout=timeout)
    if result.exit_code != 0:
        tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
        what = "its Docker engine did not answer" if result.exit_code == 90 else "reading its images failed"
        raise StepFailed(f"{conn.node.name}: {what} (exit {result.exit_code}): {tail}")
    return parse_facts(conn.node.name, result.stdout)


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
