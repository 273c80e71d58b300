"""`images push NAME --from NODE`: an image built on one node, sent to the others.

A definition built on a Spark (`images build NAME --on spark1`) exists only in that node's engine. This
streams `docker save` of its tag from the source node, gzip-compressed there, through this machine to a
`docker load` on every other node at once (one read of the source, fanned out), over the nodes' host-key-checked
SSH connections. A node that already has the source's image ID is skipped; after the load each node's image
ID must equal the source's. Nothing is written to this machine's disk.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from sparkdeploy.errors import StepFailed
from sparkdeploy.images.channel import CHUNK, FeedChannel, load_argv, load_failure
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.inventory import Inventory, Node
from sparkdeploy.remote import NodeConnection, NodeOutcome


@dataclass
class FromResult:
    node: str
    action: str  # sent | present
    image_id: str
    bytes_sent: int
    seconds: float


def _image_id(conn: NodeConnection, ref: str) -> str | None:
    r = conn.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], check=False)
    return r.stdout.strip() if r.ok and r.stdout.strip() else None


def _tag_of(name: str) -> str:
    """A definition's content-hash tag, or a REPO:TAG given as is."""
    return name if ":" in name else load_definition(name).tag


def push_from_node(name: str, inventory: Inventory, source: Node, targets: list[Node],
                   say=lambda line: None, timeout: float = 6 * 3600) -> list[NodeOutcome]:
    tag = _tag_of(name)
    targets = [n for n in targets if n.name != source.name]
    with NodeConnection(source, inventory) as src:
        source_id = _image_id(src, tag)
        if source_id is None:
            raise StepFailed(f"{source.name} has no image {tag}: build it there first "
                             f"(sparkdeploy images build {name} --on {source.name})")
        conns = {n.name: NodeConnection(n, inventory) for n in targets}
        outcomes: dict[str, NodeOutcome] = {}
        channels: dict[str, FeedChannel] = {}
        started = time.monotonic()
        try:
            for node in targets:
                try:
                    if _image_id(conns[node.name], tag) == source_id:
                        outcomes[node.name] = NodeOutcome(node, FromResult(node.name, "present", source_id, 0, 0.0))
                    else:
                        channels[node.name] = FeedChannel(conns[node.name], load_argv("gzip"))
                except Exception as exc:  # noqa: BLE001 - reported per node
                    outcomes[node.name] = NodeOutcome(node, error=exc)
            if channels:
                say(f"{source.name}: docker save {tag} | gzip -> {', '.join(channels)}")
                sent = _stream(src, tag, channels, say)
                for node in targets:
                    if node.name not in channels:
                        continue
                    chan = channels[node.name]
                    code, output = chan.finish(timeout)
                    why = chan.error or load_failure(code, output)
                    if why is None:
                        got = _image_id(conns[node.name], tag)
                        why = None if got == source_id else \
                            f"loaded image ID {got} differs from {source.name}'s {source_id}"
                    outcomes[node.name] = NodeOutcome(node, FromResult(node.name, "sent", source_id, sent,
                                                                       time.monotonic() - started)) \
                        if why is None else NodeOutcome(node, error=StepFailed(f"{node.name}: {why}"))
        finally:
            for chan in channels.values():
                if chan.error is not None:
                    chan.abort()
            for conn in conns.values():
                conn.close()
    return [outcomes[n.name] for n in targets]


def _stream(src: NodeConnection, tag: str, channels: dict[str, FeedChannel], say) -> int:
    """Read `docker save | gzip` from the source node and queue every chunk to each live channel."""
    script = (f"set -o pipefail; docker save {shlex.quote(tag)} | "
              "(command -v pigz >/dev/null && pigz -1 -c || gzip -1 -c)")
    chan = src.open().client.get_transport().open_session(timeout=src.connect_timeout)
    chan.settimeout(300)
    chan.exec_command(shlex.join(["bash", "-c", script]))
    sent, said = 0, time.monotonic()
    try:
        while True:
            data = chan.recv(CHUNK)
            if not data:
                break
            sent += len(data)
            for c in channels.values():
                if c.alive:
                    c.put(data)
            if time.monotonic() - said > 30:
                said = time.monotonic()
                say(f"{src.node.name}: {sent / 1e9:.1f} GB sent")
        code = chan.recv_exit_status()
        if code != 0:
            err = chan.recv_stderr(65536).decode(errors="replace").strip()
            raise StepFailed(f"{src.node.name}: docker save {tag} exited {code}: {err[-300:]}")
    finally:
        chan.close()
    return sent
