"""Push an image from this machine's engine to the nodes over SSH, sending only the layers each node lacks.

`push_image(name, inventory, nodes=None, progress=None)` is the entry point (the CLI's `images push` and
deploy call it). For every node, in parallel:

1. read the node's images (one SSH command, sparkdeploy.images.inventory_images): a node that has the image
   ID is done (tagged if it lacks the tag) without sending anything;
2. work out the layers it lacks: a layer is present when its chain ID (the layer and everything under it)
   is the chain of some layer of some image on the node, which is the test `docker load` itself applies;
3. preflight: the Docker root must have `free_space_factor` (2) times the bytes to send free, since
   `docker load` unpacks the archive in <root>/tmp and then writes the layers again; the bytes are exact
   when the layers come from the layer store, else estimated from `docker history` sizes (an upper
   bound); checked before anything is sent;
4. stream: nodes that lack the same layers form a group and get the same bytes, compressed once with zstd
   (gzip when a node has no zstd: docker load reads gzip itself), through an SSH channel on each node's
   existing connection, with host keys checked as everywhere else. The layers come from one of two readers:
   - store (store_stream, the default where it works): read from this engine's layer store
     (layer_store: only the layers sent are read) and sent as a pipeline of loads of about 256 MB, each
     registering while the next arrives; a cut push keeps the loads that finished;
   - save (save_stream): one `docker save` of the image, filtered on the fly, as one load per node, for
     engines whose store cannot be read here;
5. the image loads under a temporary tag; the loaded image ID is compared with the source's, and only then
   is the real tag set and the temporary one (and the partial images of the loads) removed. A cut or failed
   transfer therefore moves no tag, and `docker load` output is searched for "no space left on device",
   which it can report in its stream.

Nothing on a node is ever deleted except the temporary tag and the partial images of this image's pushes.
The streams reuse each node's SSH connection (re-keyed to AES-GCM when possible: less CPU per byte on both
ends).
"""

from __future__ import annotations

import re
import secrets
import shutil
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.images.inventory_images import NodeImages, read_node_images, select_nodes
from sparkdeploy.images.push_progress import PushProgress, human_size
from sparkdeploy.images.save_stream import stream_from_save
from sparkdeploy.images.store_stream import BATCH_BYTES, stream_from_store
from sparkdeploy.images.streams import NodeStream, StreamGroup
from sparkdeploy.nodeside import archive
from sparkdeploy.nodeside.layer_store import LayerMismatch, LayerStore, open_store
from sparkdeploy.nodeside.layers import chain_ids, estimate_bytes, missing_layers
from sparkdeploy.runtime.remote import NodeConnection, NodeOutcome, on_nodes
from sparkdeploy.runtime.thread_imports import preload

if TYPE_CHECKING:
    from docker import DockerClient

    from sparkdeploy.runtime.remote import CommandResult

INCOMING_REPO = "sparkdeploy-incoming"
READERS = ("auto", "store", "save")


@dataclass
class PushResult:
    node: str
    tag: str
    image_id: str
    action: str  # present (nothing to do) | tagged (had the image, lacked the tag) | sent
    layers_total: int
    layers_sent: int = 0
    raw_bytes: int = 0  # archive bytes after filtering, before compression
    bytes_sent: int = 0  # bytes written to the SSH channel (compressed)
    compression: str = "-"
    reader: str = "-"  # where the layers were read: store (the layer store) | save (docker save)
    seconds: float = 0.0
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


Results = dict[str, "PushResult | Exception"]  # node -> what its push ended in


@dataclass
class SourceImage:
    tag: str  # what the nodes get
    id: str
    name: str  # short name, for the temporary tag
    diff_ids: list[str]
    sizes: list[int]  # docker history sizes, oldest first (estimates, for the preflight)
    store: LayerStore | None = None  # where the layers are read; None: from a docker save
    reader_note: str = ""  # why the layer store is not used, when it is not

    @property
    def reader(self) -> str:
        return "store" if self.store is not None else "save"

    def layer_sizes(self, positions: list[int]) -> int | None:
        """The exact archive bytes of these layers (from the layer store), or None when unknown."""
        if self.store is None:
            return None
        chains = chain_ids(self.diff_ids)
        try:
            return sum(self.store.layer_size(chains[i], self.diff_ids[i]) for i in positions)
        except (OSError, ValueError, LayerMismatch):
            return None


def source_image(name: str, client: DockerClient, progress: PushProgress, reader: str = "auto") -> SourceImage:
    """An image definition's image (built if missing) or an image reference this engine has, with where its
    layers will be read (`reader`, see push_image)."""
    import docker  # the docker SDK: about 180 ms to import, which `up` and `status` never need

    from sparkdeploy.images.build import ensure_image  # images.build: ~14 ms that `up --help` and `status` skip

    try:
        definition = load_definition(name)
    except ConfigError:
        definition = None
    if definition is not None:
        tag = ensure_image(name, client, progress=progress.note)
        short = definition.name
    else:
        tag = name
        short = re.sub(r"[^a-z0-9_.-]", "-", name.rsplit(":", 1)[0].rsplit("/", 1)[-1].lower()) or "image"
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        raise ConfigError(
            Problem(
                "images",
                name,
                "neither an image definition nor an image this machine's engine has",
                "see: sparkdeploy images build --help",
            )
        ) from None
    if ":" not in tag.rsplit("/", 1)[-1] or tag.startswith("sha256:"):
        raise ConfigError(Problem("images", name, "push needs a tag the nodes can use", "give REPO:TAG"))
    image_id = image.id
    assert image_id, "an image docker has has its ID"
    history = client.api.history(image_id)  # type: ignore[no-untyped-call]  # types-docker leaves it untyped
    sizes = [int(h.get("Size") or 0) for h in reversed(history)]
    source = SourceImage(tag, image_id, short, list(image.attrs["RootFS"]["Layers"]), sizes)
    _choose_reader(source, client, reader, progress)
    return source


# -- the plan for each node ------------------------------------------------------------------------------------


@dataclass
class PushTarget:
    """One node a push goes to, and what it needs there (plan_target): present, tag, or send these layers."""

    node: Node
    facts: NodeImages
    action: str  # present | tag | send
    needed: set[str] = field(default_factory=set)  # diff IDs to send
    layers_sent: int = 0
    estimate: int = 0
    compression: str = "-"
    note: str = ""
    stale_partials: list[str] = field(default_factory=list)  # partial images of this image from a cut push


def plan_target(
    source: SourceImage, node: Node, facts: NodeImages, compression: str = "auto", free_space_factor: float = 2.0
) -> PushTarget:
    """What the node needs; raises StepFailed when the preflight refuses it (nothing was sent)."""
    have = facts.image(source.id)
    if have is not None:
        action = "present" if source.tag in have.tags else "tag"
        return PushTarget(node, facts, action)
    note = ""
    if facts.containerd_store:
        # The containerd image store imports archives its own way; a partial archive is not known to load.
        missing = list(range(len(source.diff_ids)))
        note = "containerd image store: every layer sent"
    else:
        missing = missing_layers(source.diff_ids, facts.chain_ids())
    exact = source.layer_sizes(missing)
    if exact is not None:
        estimate = exact + archive.archive_overhead(len(missing))
    else:
        estimate = estimate_bytes(_sizes_for(source), [i in missing for i in range(len(source.diff_ids))])
    if facts.free_bytes is None:
        raise StepFailed(
            f"{node.name}: refused before sending: cannot read the free space of the Docker root {facts.root_dir}"
        )
    required = int(estimate * free_space_factor)
    if facts.free_bytes < required:
        raise StepFailed(
            f"{node.name}: refused before sending: {len(missing)} layers, about {human_size(estimate)} to load, need "
            f"{human_size(required)} free in the Docker root {facts.root_dir} ({free_space_factor:g}x: docker load "
            f"unpacks the archive, then writes the layers), it has {human_size(facts.free_bytes)}. Free space there "
            f"(for example: docker image prune) and push again"
        )
    method = choose_compression(compression, facts)
    if method != compression and compression == "auto" and method == "gzip":
        note = _join(note, "no zstd on the node: gzip used (slower; install zstd there)")
    stale = [i.id for i in facts.images if i.labels.get(archive.PARTIAL_LABEL) == source.id]
    if stale:
        note = _join(note, f"resumed: {len(source.diff_ids) - len(missing)} layers already there")
    return PushTarget(
        node, facts, "send", {source.diff_ids[i] for i in missing}, len(missing), estimate, method, note, stale
    )


def _sizes_for(source: SourceImage) -> list[int]:
    return source.sizes if source.sizes else [0] * len(source.diff_ids)


def group_plans(plans: Iterable[PushTarget]) -> list[StreamGroup]:
    """PushTargets that need the same layers with the same compression, as groups."""
    groups: dict[tuple[frozenset[str], str, bool], StreamGroup] = {}
    for plan in plans:
        single = plan.facts.containerd_store
        key = (frozenset(plan.needed), plan.compression, single)
        if key not in groups:
            groups[key] = StreamGroup([], set(plan.needed), plan.compression, plan.estimate, single)
        groups[key].names.append(plan.node.name)
    return list(groups.values())


def choose_compression(requested: str, facts: NodeImages) -> str:
    if requested == "auto":
        return "zstd" if facts.zstd and shutil.which("zstd") else "gzip"
    if requested == "zstd" and not facts.zstd:
        raise StepFailed(f"{facts.node}: zstd is not installed on the node (use --compress gzip, or install it)")
    if requested not in ("zstd", "gzip", "none"):
        raise ConfigError(Problem("push", "compression", f"{requested!r}", "auto, zstd, gzip or none"))
    return requested


# -- on the node after the load: verify, then tag ---------------------------------------------------------------

FINALIZE_SCRIPT = r"""
id=$(docker image inspect --format '{{.Id}}' "$1" 2>/dev/null) || { echo "nothing was loaded under $1"; exit 3; }
if [ "$id" != "$3" ]; then docker rmi "$1" >/dev/null 2>&1; echo "loaded image ID $id differs from the source's $3"; exit 4; fi
docker tag "$id" "$2" || exit 5
docker rmi "$1" >/dev/null || exit 6
tag=$2
shift 3
[ $# -eq 0 ] || docker rmi "$@" >/dev/null 2>&1 || true
docker image inspect --format '{{.Id}}' "$tag"
"""  # noqa: E501 - shell lines run as written
TAG_SCRIPT = r"""
docker tag "$1" "$2" || exit 5
docker image inspect --format '{{.Id}}' "$2"
"""


def _finalize(conn: NodeConnection, temp_tag: str, source: SourceImage, partials: list[str]) -> None:
    """Check the loaded image ID, move the tag, and remove the partial images of the loads (their layers are
    the image's now)."""
    result = conn.run(["sh", "-c", FINALIZE_SCRIPT, "sh", temp_tag, source.tag, source.id, *partials], check=False)
    _check_tagged(conn.node.name, result, source)


def _tag_existing(conn: NodeConnection, source: SourceImage) -> None:
    result = conn.run(["sh", "-c", TAG_SCRIPT, "sh", source.id, source.tag], check=False)
    _check_tagged(conn.node.name, result, source)


def _check_tagged(node: str, result: CommandResult, source: SourceImage) -> None:
    lines = result.stdout.strip().splitlines()
    if result.exit_code != 0 or not lines or lines[-1] != source.id:
        why = " | ".join((result.stdout + result.stderr).strip().splitlines()[-3:]) or f"exit {result.exit_code}"
        raise StepFailed(f"{node}: {source.tag} was not tagged: {why}")


# -- the entry point ---------------------------------------------------------------------------------------


def push_image(
    name: str,
    inventory: Inventory,
    nodes: list[str] | list[Node] | None = None,
    progress: PushProgress | None = None,
    *,
    client: DockerClient | None = None,
    compression: str = "auto",
    free_space_factor: float = 2.0,
    reader: str = "auto",
    batch_bytes: int = BATCH_BYTES,
) -> list[NodeOutcome]:
    """Make the nodes hold image `name` (a definition name or a local REPO:TAG) with the source's image ID.

    `nodes`: node names or Node objects of the inventory (default: all). `reader`: where the layers are read,
    `store` (this engine's layer store: only the layers sent are read), `save` (docker save) or `auto`
    (the store when it can be read here, else save, with a note saying why). `batch_bytes`: the size of
    each load of the store reader (store_stream). Returns one NodeOutcome per node, in
    order: `value` a PushResult when it worked, `error` a StepFailed naming the node and the reason when not.
    Never raises for one node's failure; raises ConfigError for a bad name and KeyboardInterrupt after
    cleaning up (channels closed: the nodes' docker load sees a cut archive and loads nothing).
    """
    from sparkdeploy.images.build import docker_client  # as in source_image: images.build only when pushing

    progress = progress or PushProgress()
    if reader not in READERS:
        raise ConfigError(Problem("push", "layer source", f"{reader!r}", "auto, store or save"))
    chosen = select_nodes(inventory, nodes)
    client = client or docker_client()
    conns = {n.name: NodeConnection(n, inventory) for n in chosen}
    started = {n.name: time.monotonic() for n in chosen}
    results: Results = {}
    try:
        source, facts = _resolve_while_reading(name, chosen, conns, client, progress, reader)
        plans = _plan_targets(source, facts, compression, free_space_factor, results)

        def tag_only(node: Node) -> PushResult:
            _tag_existing(conns[node.name], source)
            return PushResult(node.name, source.tag, source.id, "tagged", len(source.diff_ids))

        _collect(results, on_nodes([p.node for p in plans.values() if p.action == "tag"], tag_only))
        senders = [p for p in plans.values() if p.action == "send"]
        _send(source, senders, conns, client, progress, batch_bytes, results)
    finally:
        for conn in conns.values():
            conn.close()
    return node_outcomes(chosen, results, progress, started)


def _resolve_while_reading(
    name: str,
    chosen: list[Node],
    conns: dict[str, NodeConnection],
    client: DockerClient,
    progress: PushProgress,
    reader: str,
) -> tuple[SourceImage, list[NodeOutcome]]:
    """The source image (resolved, or built) while the nodes' images are read: (source, one outcome per node,
    its value a NodeImages)."""
    preload()  # before any thread: CPython 3.11's compile race (sparkdeploy/runtime/thread_imports.py)
    pool = ThreadPoolExecutor(1)  # read the nodes while the source image is resolved (or built)
    try:
        reading = pool.submit(on_nodes, chosen, lambda n: read_node_images(conns[n.name]))
        source = source_image(name, client, progress, reader)
        return source, reading.result()
    finally:
        pool.shutdown(wait=False)  # after a stop (Ctrl-C), a read stalled on a node is not waited for


def _plan_targets(
    source: SourceImage, facts: list[NodeOutcome], compression: str, free_space_factor: float, results: Results
) -> dict[str, PushTarget]:
    """Each node's plan; a node that could not be read or is refused, and one that has the image, get their
    result now."""
    plans: dict[str, PushTarget] = {}
    for outcome in facts:
        node = outcome.node
        if outcome.error is not None:
            results[node.name] = outcome.error
            continue
        try:
            plans[node.name] = plan_target(source, node, outcome.value, compression, free_space_factor)
        except (StepFailed, ConfigError) as exc:
            results[node.name] = exc
    for plan in plans.values():
        if plan.action == "present":
            results[plan.node.name] = PushResult(plan.node.name, source.tag, source.id, "present", len(source.diff_ids))
    return plans


def _send(
    source: SourceImage,
    senders: list[PushTarget],
    conns: dict[str, NodeConnection],
    client: DockerClient,
    progress: PushProgress,
    batch_bytes: int,
    results: Results,
) -> None:
    """Stream the layers to the nodes that lack them (under a temporary tag), then verify and tag on each."""
    temp_tag = f"{INCOMING_REPO}/{source.name}:{secrets.token_hex(6)}"
    streamed: dict[str, NodeStream] = {}
    if senders and source.store is not None:
        streamed = stream_from_store(source, group_plans(senders), conns, progress, temp_tag, batch_bytes)
    elif senders:
        streamed = stream_from_save(source, group_plans(senders), conns, client, progress, temp_tag)
    plans = {p.node.name: p for p in senders}

    def finalize(node: Node) -> PushResult:
        stream = streamed[node.name]
        plan = plans[node.name]
        if stream.error:
            kept = " (the layers that arrived are kept: a push again sends the rest)" if stream.partial_ids else ""
            raise StepFailed(f"{node.name}: push of {source.tag} failed, no tag moved: {stream.error}{kept}")
        _finalize(conns[node.name], temp_tag, source, plan.stale_partials + stream.partial_ids)
        return PushResult(
            node.name,
            source.tag,
            source.id,
            "sent",
            len(source.diff_ids),
            plan.layers_sent,
            stream.raw,
            stream.wire,
            plan.compression,
            source.reader,
            note=_join(plan.note, f"read with docker save: {source.reader_note}" if source.reader_note else ""),
        )

    _collect(results, on_nodes([p.node for p in senders], finalize))


def node_outcomes(
    nodes: list[Node], results: Results, progress: PushProgress, started: dict[str, float]
) -> list[NodeOutcome]:
    """One outcome per node from its PushResult (timed from `started[node]`) or its error; each bar ended."""
    outcomes: list[NodeOutcome] = []
    for node in nodes:
        value = results.get(node.name)
        outcome = NodeOutcome(node)
        if isinstance(value, PushResult):
            value.seconds = time.monotonic() - started[node.name]
            outcome.value = value
            progress.end(node.name, True, value.action)
        else:
            outcome.error = value if isinstance(value, Exception) else StepFailed(f"{node.name}: not pushed")
            progress.end(node.name, False, str(outcome.error))
        outcomes.append(outcome)
    return outcomes


def _choose_reader(source: SourceImage, client: DockerClient, reader: str, progress: PushProgress) -> None:
    if reader == "save":
        return
    store, why = open_store(client, source.id)
    if store is None and reader == "store":
        raise ConfigError(
            Problem(
                "push",
                "--layer-source store",
                f"this engine's layer store cannot be read here: {why}",
                "use --layer-source auto or save",
            )
        )
    source.store = store
    if store is None:
        source.reader_note = why
        progress.note(f"reading layers with docker save: {why}; a re-push then waits for a save of the whole image")


def _collect(results: Results, outcomes: list[NodeOutcome]) -> None:
    for outcome in outcomes:
        results[outcome.node.name] = outcome.value if outcome.error is None else outcome.error


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a and b else a or b
