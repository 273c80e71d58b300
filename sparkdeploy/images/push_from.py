"""`images push NAME --from NODE`: an image a node has, sent from that node to the others over the fabric.

A definition built on a Spark (`images build NAME --on spark1`) exists only in that node's engine. This
machine only orchestrates; the image bytes go node to node:

1. read every node's images (one SSH command each, inventory_images) and plan each target as push.py does
   (plan_target): a node with the image ID is skipped (tagged if it lacks the tag); the others get only the
   layers they lack, after a free-space check (2x the archive the chain carries) before the first byte;
2. make sure each sender of the chain may SSH to its receiver over the fabric with host keys checked
   (peers.ensure_plan_trust: per-node key, from= the sender's fabric IP, host keys pinned by fabric IP);
3. start nodeside's push-source on the source node (its python3; the package's push bundle shipped whole,
   nodeside/ship.py): `docker save`, filtered to the layers any target lacks, under a temporary tag,
   compressed, into a peer ssh to the first target's fabric IP, where nodeside's relay loads it and forwards
   it to the next target as it arrives (peers.transfer_plan: a chain, so the source sends each byte once
   whatever N is). Only progress lines (node, bytes) and one result line per node come back to this machine;
4. on every target, check the loaded image ID against the source's, and only then move the tag (push.py's
   finalize): a cut or failed load moves no tag.

Read from the layer store, the layers go as a pipeline of loads of about 256 MB (store_stream's design: each
relay runs load k+1 while load k registers); a push cut midway keeps the loads that finished as untagged
partial images, and the next push sends only the rest. Read with `docker save`, it is one load per node: a cut
push starts over.
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import StepFailed
from sparkdeploy.facts import FactArgs, gather
from sparkdeploy.images.channel import load_argv, load_failure
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.images.inventory_images import NodeImages, read_node_images
from sparkdeploy.images.push import (
    INCOMING_REPO,
    PushResult,
    PushTarget,
    SourceImage,
    _finalize,
    _tag_existing,
    node_outcomes,
    plan_target,
)
from sparkdeploy.images.push_progress import PushProgress, human_size
from sparkdeploy.images.store_stream import BATCH_BYTES
from sparkdeploy.nodeside import ship
from sparkdeploy.nodeside.layers import estimate_bytes
from sparkdeploy.nodeside.relay import PROGRESS, RESULT
from sparkdeploy.nodeside.ship import encode
from sparkdeploy.runtime.peers import ensure_plan_trust, peer_ssh_prefix, transfer_plan
from sparkdeploy.runtime.remote import NodeConnection, NodeOutcome, on_nodes

COMPRESSIONS = ("auto", "zstd", "gzip", "none")
DECOMPRESSORS = {"zstd": ["zstd", "-d", "-q", "-c"], "gzip": ["gzip", "-d", "-c"], "none": ["cat"]}
LINE_TIMEOUT_S = 600  # no progress line from the chain for this long: the push is stalled


def _tag_of(name: str) -> str:
    """A definition's content-hash tag, or a REPO:TAG given as is."""
    return name if ":" in name else load_definition(name).tag


@dataclass
class FromPlan:
    source: Node
    image: SourceImage
    plans: dict[str, PushTarget] = field(default_factory=dict)  # target -> what it needs
    refused: dict[str, Exception] = field(default_factory=dict)  # target -> why it gets nothing (preflight)
    edges: list[tuple[Node, Node]] = field(default_factory=list)  # the chain, source first
    needed: set[str] = field(default_factory=set)  # diff IDs the chain carries (any target lacks them)
    estimate: int = 0  # archive bytes the chain carries
    compression: str = "none"
    compression_note: str = ""  # why that compression
    trust: list[str] = field(default_factory=list)  # peer SSH changes (would be) made
    reader: str = "save"  # store: the source's layer store read as root (sudo -n); save: docker save there
    reader_note: str = ""  # why not the store
    store_root: str = ""
    store_driver: str = "overlay2"

    @property
    def receivers(self) -> list[Node]:
        return [b for _a, b in self.edges]

    def chain_text(self) -> str:
        nodes = [self.source] + self.receivers
        return " -> ".join(f"{n.name} ({n.fabric_address})" for n in nodes)

    def lines(self) -> list[str]:
        img = self.image
        out = [
            (
                f"source: {self.source.name}, fabric {self.source.fabric_address}; image {img.tag} "
                f"{img.id.removeprefix('sha256:')[:12]} ({len(img.diff_ids)} layers)"
            )
        ]
        for name, plan in self.plans.items():
            node = plan.node
            if plan.action == "present":
                out.append(f"{name} ({node.fabric_address}): has it, nothing sent")
            elif plan.action == "tag":
                out.append(f"{name} ({node.fabric_address}): has the image ID, only tagged")
            else:
                out.append(
                    f"{name} ({node.fabric_address}): lacks {plan.layers_sent}/{len(img.diff_ids)} layers, "
                    f"about {human_size(plan.estimate)}" + (f" ({plan.note})" if plan.note else "")
                )
        for name, why in self.refused.items():
            out.append(f"{name}: refused: {why}")
        if self.edges:
            out.append(
                f"chain over the fabric: {self.chain_text()}; {len(self.needed)} layers, about "
                f"{human_size(self.estimate)}, {self.compression}"
                + (f" ({self.compression_note})" if self.compression_note else "")
                + "; the source sends each byte once, "
                "each target loads it and forwards it to the next as it arrives"
            )
            out.append(
                f"layers read on {self.source.name} from "
                + (
                    "its layer store (sudo -n): only the layers sent"
                    if self.reader == "store"
                    else f"docker save of the whole image ({self.reader_note})"
                )
            )
            out.append(
                "this machine starts the stream on the source and reads progress lines only: no image "
                "bytes pass through it"
            )
        else:
            out.append("nothing to send")
        out += [f"peer SSH: {line}" for line in self.trust] or (
            ["peer SSH: keys and fabric host keys already in place"] if self.edges else []
        )
        return out


# -- the plan --------------------------------------------------------------------------------------------------


def _source_image(tag: str, facts: NodeImages, history: str) -> SourceImage:
    record = next((i for i in facts.images if tag in i.tags), None)
    if record is None:
        raise StepFailed(
            f"{facts.node} has no image {tag}: build it there first "
            f"(sparkdeploy images build NAME --on {facts.node}) or name a node that has it"
        )
    sizes = [int(s) for s in reversed(history.split()) if s.isdigit()]
    short = tag.rsplit(":", 1)[0].rsplit("/", 1)[-1] or "image"
    return SourceImage(tag, record.id, short, list(record.layers), sizes, reader_note="docker save on the node")


def _store_readable(src: NodeConnection, facts: NodeImages, image_id: str) -> str:
    """Why the source's layer store cannot be read as root through `sudo -n` ("" when it can): the
    store_readable fact."""
    if facts.containerd_store:
        return "the engine keeps images in containerd"
    if facts.driver != "overlay2":
        return f"the storage driver is {facts.driver or 'unknown'}, not overlay2"
    read = gather(src, "store", FactArgs(images=(image_id,)))
    if not (read.has("store_readable") and image_id in read.store_readable):
        return f"no passwordless sudo on {src.node.name} to read {facts.root_dir}"
    return ""


INCOMPRESSIBLE = 0.9  # a sample that zlib -1 shrinks by less than 10%: zstd would cost CPU on every hop for nothing
WORTH_COMPRESSING = 64 << 20  # below this the fabric moves the bytes in well under a second: neither sample nor zstd


def _sample_ratio(src: NodeConnection, plan: FromPlan) -> float | None:
    """zlib -1's ratio on a sample of the layers the chain carries, read on the source from its layer store
    (nodeside's store-reader, its sample mode: about 16 MB read); None when it cannot be sampled."""
    config = encode(
        {
            "root": plan.store_root,
            "driver": plan.store_driver,
            "image_id": plan.image.id,
            "diff_ids": plan.image.diff_ids,
            "needed": sorted(plan.needed),
            "sample": True,
        }
    )
    r = src.run(["sudo", "-n", *ship.argv("store-reader", config)], check=False)
    try:
        return float(json.loads(r.stdout.strip().splitlines()[-1])["ratio"])
    except (ValueError, KeyError, IndexError):
        return None


def _choose_compression(
    requested: str, facts: list[NodeImages], ratio: float | None = None, estimate: int = WORTH_COMPRESSING
) -> tuple[str, str]:
    """(compression, why). auto: zstd when every node of the chain has it, there is enough to send and the
    layers compress; else none (the fabric is faster than gzip on one core, and random or already-compressed
    layers gain nothing)."""
    if requested == "auto":
        if estimate < WORTH_COMPRESSING:
            return "none", f"only {human_size(estimate)} to send"
        if not all(f.zstd for f in facts):
            return "none", "zstd is not on every node of the chain"
        if ratio is not None and ratio > INCOMPRESSIBLE:
            return "none", f"a sample of the layers compresses only to {ratio:.2f}x"
        return "zstd", "" if ratio is None else f"a sample of the layers compresses to {ratio:.2f}x"
    if requested == "zstd":
        lacking = [f.node for f in facts if not f.zstd]
        if lacking:
            raise StepFailed(f"zstd is not installed on {', '.join(lacking)} (use --compress none, or install it)")
    return requested, "asked for"


def plan_from(
    name: str,
    inventory: Inventory,
    source: Node,
    targets: list[Node],
    compression: str = "auto",
    free_space_factor: float = 2.0,
    dry_run: bool = False,
    reader: str = "auto",
    conns: dict[str, NodeConnection] | None = None,
) -> tuple[FromPlan, list[NodeOutcome]]:
    """What each target needs and the chain that carries it; the node facts that could not be read come
    back as failed outcomes. Sets up peer SSH for the chain (or, with dry_run, says what it would set up).
    `conns`: connections by node name to use and leave open (the push goes on over them); else its own."""
    targets = [n for n in targets if n.name != source.name]
    if conns is not None:
        return _plan_from(name, inventory, source, targets, compression, free_space_factor, dry_run, reader, conns)
    conns = {n.name: NodeConnection(n, inventory) for n in [source] + targets}
    try:
        return _plan_from(name, inventory, source, targets, compression, free_space_factor, dry_run, reader, conns)
    finally:
        for conn in conns.values():
            conn.close()


def _plan_from(
    name: str,
    inventory: Inventory,
    source: Node,
    targets: list[Node],
    compression: str,
    free_space_factor: float,
    dry_run: bool,
    reader: str,
    conns: dict[str, NodeConnection],
) -> tuple[FromPlan, list[NodeOutcome]]:
    tag = _tag_of(name)
    src = conns[source.name]

    def facts_of(
        node: Node,
    ) -> NodeImages | tuple[NodeImages, SourceImage, str]:  # every node at once, the source with its image's history
        facts = read_node_images(conns[node.name])
        if node.name != source.name:
            return facts
        history = src.run(
            ["docker", "image", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}", tag], check=False
        ).stdout
        image = _source_image(tag, facts, history)
        return facts, image, _store_readable(src, facts, image.id) if reader != "save" else "--layer-source save"

    read = on_nodes([source] + targets, facts_of)
    if read[0].error is not None:
        raise read[0].error
    facts, image, plan_note = read[0].value
    read = read[1:]
    plan = FromPlan(
        source,
        image,
        reader="save" if plan_note else "store",
        reader_note=plan_note,
        store_root=facts.root_dir,
        store_driver=facts.driver,
    )
    if reader == "store" and plan.reader != "store":
        raise StepFailed(
            f"{source.name}: its layer store cannot be read: {plan.reader_note} (use --layer-source auto or save)"
        )
    failed = [o for o in read if not o.ok]
    senders = _plan_receivers(plan, image, targets, {o.node.name: o.value for o in read if o.ok}, free_space_factor)
    if senders:
        chain_facts = [facts] + [p.facts for p in senders]
        ratio = (
            _sample_ratio(src, plan)
            if (
                compression == "auto"
                and plan.reader == "store"
                and plan.estimate >= WORTH_COMPRESSING
                and all(f.zstd for f in chain_facts)
            )
            else None
        )
        plan.compression, plan.compression_note = _choose_compression(compression, chain_facts, ratio, plan.estimate)
        plan.edges = transfer_plan(source, [p.node for p in senders])
        plan.trust = ensure_plan_trust(inventory, plan.edges, dry_run=dry_run)
    return plan, failed


def _plan_receivers(
    plan: FromPlan,
    image: SourceImage,
    targets: list[Node],
    target_facts: dict[str, NodeImages],
    free_space_factor: float,
) -> list[PushTarget]:
    """Each readable target's plan (or its refusal) into `plan`, the bytes the chain carries, and the room
    each sender needs for them; returns the senders that have it."""
    for node in targets:
        if node.name not in target_facts:
            continue
        try:
            plan.plans[node.name] = plan_target(image, node, target_facts[node.name], "none", free_space_factor)
        except StepFailed as exc:
            plan.refused[node.name] = exc
    senders = [p for p in plan.plans.values() if p.action == "send"]
    plan.needed = set().union(*(p.needed for p in senders)) if senders else set()
    needed_flags = [d in plan.needed for d in image.diff_ids]
    plan.estimate = estimate_bytes(image.sizes or [0] * len(image.diff_ids), needed_flags)
    for p in list(senders):  # each node unpacks the whole archive the chain carries, not only its own layers
        required = int((plan.estimate + p.estimate) * free_space_factor / 2)
        free = p.facts.free_bytes or 0
        if free < required:
            plan.refused[p.node.name] = StepFailed(
                f"{p.node.name}: refused before sending: the chain carries about {human_size(plan.estimate)} and "
                f"the node writes its {human_size(p.estimate)} of layers; need {human_size(required)} free in the "
                f"Docker root {p.facts.root_dir}, it has {human_size(free)}. Free space there and push again"
            )
            del plan.plans[p.node.name]
            senders.remove(p)
    return senders


# -- the stream -----------------------------------------------------------------------------------------------


def stream_config(plan: FromPlan, temp_tag: str, batch_bytes: int = BATCH_BYTES) -> dict[str, Any]:
    """The source's config: the image, the layers to keep, and the chain (each hop's peer ssh to the next)."""
    chain = [plan.source] + plan.receivers
    hops = [
        {"name": n.name, "next_ssh": peer_ssh_prefix(n, chain[i + 1]) if i + 1 < len(chain) else None}
        for i, n in enumerate(chain)
    ]
    relay: dict[str, Any] = {"sink": shlex.join(load_argv(plan.compression)), "chain": hops}
    if plan.reader == "store":  # a pipeline of loads: each relay unpacks the stream and runs the loads itself
        relay.update(framed=True, decompress=DECOMPRESSORS[plan.compression], load=["docker", "load"])
    config = {
        "image_id": plan.image.id,
        "diff_ids": plan.image.diff_ids,
        "needed": sorted(plan.needed),
        "temp_tag": temp_tag,
        "compress": plan.compression,
        "relay": relay,
    }
    if plan.reader == "store":
        config["reader_config"] = encode(
            {
                "root": plan.store_root,
                "driver": plan.store_driver,
                "image_id": plan.image.id,
                "diff_ids": plan.image.diff_ids,
                "needed": sorted(plan.needed),
                "temp_tag": temp_tag,
                "batch_bytes": batch_bytes,
            }
        )
    return config


def run_stream(
    src: NodeConnection, config: dict[str, Any], progress: PushProgress, timeout: float = LINE_TIMEOUT_S
) -> tuple[dict[str, dict[str, Any]], str, int]:
    """Start nodeside's push-source on the source node and follow its lines: (results by node, other output, bytes this
    machine received on the channel)."""
    transport = src.open().client.get_transport()
    chan = transport.open_session(timeout=src.connect_timeout)
    chan.settimeout(timeout)
    chan.exec_command(shlex.join(ship.argv("push-source", encode(config))))
    chan.shutdown_write()
    results: dict[str, dict[str, Any]] = {}
    other: list[str] = []
    received = 0
    buffers = {"out": b"", "err": b""}
    seen: dict[str, int] = {}
    last = time.monotonic()
    try:
        while True:
            got = False
            for kind, ready, recv in (
                ("out", chan.recv_ready, chan.recv),
                ("err", chan.recv_stderr_ready, chan.recv_stderr),
            ):
                if ready():
                    data = recv(65536)
                    received += len(data)
                    buffers[kind] += data
                    got = True
                    last = time.monotonic()
            for kind in buffers:
                *lines, buffers[kind] = buffers[kind].split(b"\n")
                for raw in lines:
                    _on_line(raw.decode(errors="replace"), results, other, seen, progress)
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if not got:
                if chan.closed:
                    break
                time.sleep(0.05)
                if time.monotonic() - last > timeout:
                    raise TimeoutError()
    except TimeoutError:
        chan.close()
        raise StepFailed(f"{src.node.name}: the stream from it sent no progress for {timeout:g} s; stopped") from None
    for kind in buffers:
        if buffers[kind]:
            _on_line(buffers[kind].decode(errors="replace"), results, other, seen, progress)
    code = chan.recv_exit_status()
    chan.close()
    if code != 0 and src.node.name not in results:
        other.append(f"exit {code}")
    return results, "\n".join(other[-10:]), received


def _on_line(
    line: str, results: dict[str, dict[str, Any]], other: list[str], seen: dict[str, int], progress: PushProgress
) -> None:
    if line.startswith(PROGRESS):
        try:
            record = json.loads(line[len(PROGRESS) :])
        except ValueError:
            return
        node = str(record.get("node"))
        if "received" in record:  # a receiver: bytes off the wire (compressed)
            value = int(record.get("received") or 0)
            step = max(0, value - seen.get(node, 0))
            progress.advance(node, raw=step, wire=step)
            seen[node] = value
    elif line.startswith(RESULT):
        try:
            record = json.loads(line[len(RESULT) :])
        except ValueError:
            return
        results[str(record.get("node"))] = record
    elif line.strip():
        other.append(line.strip()[:300])


# -- the entry point ---------------------------------------------------------------------------------------


def push_from_node(
    name: str,
    inventory: Inventory,
    source: Node,
    targets: list[Node],
    progress: PushProgress | None = None,
    compression: str = "auto",
    free_space_factor: float = 2.0,
    reader: str = "auto",
    batch_bytes: int = BATCH_BYTES,
) -> tuple[FromPlan, list[NodeOutcome], int]:
    """Make every target hold `name` with the source node's image ID, sent node to node over the fabric.
    Returns the plan, one outcome per target (value a PushResult, or error naming the node) and the bytes
    this machine received from the source during the stream (progress and result lines only)."""
    progress = progress or PushProgress()
    targets = [n for n in targets if n.name != source.name]
    started = time.monotonic()
    # One connection per node for the whole push (plan, stream, tag): every SSH handshake saved is a tenth of a
    # second of a re-push that sends one small layer.
    conns = {n.name: NodeConnection(n, inventory) for n in [source] + targets}
    try:
        plan, failed = plan_from(
            name, inventory, source, targets, compression, free_space_factor, reader=reader, conns=conns
        )
    except BaseException:
        for conn in conns.values():
            conn.close()
        raise
    for line in plan.trust:
        progress.note(f"peer SSH: {line}")
    results: dict[str, PushResult | Exception] = {o.node.name: o.error for o in failed if o.error is not None}
    results.update(plan.refused)
    image = plan.image
    received = 0
    try:
        for p in plan.plans.values():
            if p.action == "present":
                results[p.node.name] = PushResult(p.node.name, image.tag, image.id, "present", len(image.diff_ids))

        def tag_only(node: Node) -> PushResult:
            _tag_existing(conns[node.name], image)
            return PushResult(node.name, image.tag, image.id, "tagged", len(image.diff_ids))

        for o in on_nodes([p.node for p in plan.plans.values() if p.action == "tag"], tag_only):
            results[o.node.name] = o.value if o.error is None else o.error
        if plan.edges:
            temp_tag = f"{INCOMING_REPO}/{image.name}:{secrets.token_hex(6)}"
            progress.note(
                f"{plan.chain_text()}: {len(plan.needed)} layers, about {human_size(plan.estimate)}, "
                f"{plan.compression}, read from "
                + ("the layer store" if plan.reader == "store" else f"docker save ({plan.reader_note})")
            )
            for node in plan.receivers:
                progress.begin(node.name, plan.estimate)
            streamed, other, received = run_stream(
                conns[source.name], stream_config(plan, temp_tag, batch_bytes), progress
            )
            results.update(_finish(plan, streamed, other, conns, temp_tag))
    finally:
        for conn in conns.values():
            conn.close()
    return plan, node_outcomes(targets, results, progress, {n.name: started for n in targets}), received


def _finish(
    plan: FromPlan, streamed: dict[str, dict[str, Any]], other: str, conns: dict[str, NodeConnection], temp_tag: str
) -> dict[str, PushResult | Exception]:
    """Per receiver: its load's result, then the image ID check and the tag (in parallel)."""
    image, source = plan.image, plan.source
    src = streamed.get(source.name, {})
    upstream_error = src.get("error")

    def finish(node: Node) -> PushResult:
        record = streamed.get(node.name)
        if record is None:
            why = upstream_error or f"the stream did not reach it ({other or 'no report from the chain'})"
            again = (
                "; push again: the loads that finished are kept, only the rest is sent"
                if plan.reader == "store"
                else "; push again"
            )
            raise StepFailed(f"{node.name}: push of {image.tag} from {source.name} failed, no tag moved: {why}{again}")
        why = load_failure(record.get("load_rc"), "\n".join(record.get("load_tail") or []))
        if why:
            kept = (
                " (the loads that finished are kept: a push again sends the rest)"
                if plan.reader == "store" and int(record.get("loads") or 0) > 1
                else ""
            )
            raise StepFailed(f"{node.name}: push of {image.tag} from {source.name} failed, no tag moved: {why}{kept}")
        p = plan.plans[node.name]
        _finalize(conns[node.name], temp_tag, image, p.stale_partials + list(src.get("partials") or []))
        return PushResult(
            node.name,
            image.tag,
            image.id,
            "sent",
            len(image.diff_ids),
            p.layers_sent,
            int(src.get("raw") or 0),
            int(record.get("received") or 0),
            plan.compression,
            f"{source.name}'s {plan.reader} over the fabric",
        )

    return {o.node.name: (o.value if o.error is None else o.error) for o in on_nodes(plan.receivers, finish)}
