"""The `store` reader: the layers nodes lack, read from the layer store and sent as a pipeline of loads.

One `docker load` of a big archive unpacks all of it to <root>/tmp and registers the layers only after the
last byte: the node writes everything twice, the second time after the transfer (16 s of a 37 s push of
2 GB to the two lab nodes). Here the layers travel in loads of about `batch_bytes` each. Every load is a
complete archive: the layers it carries, and a config for the image made of the layers up to its top one (a
partial image: untagged, labelled with the image it is part of, archive.partial_config). The last load
carries the real config and the temporary tag.

Load k+1 streams while load k registers its layers. Only its trailer (config and manifest: without them the
loader does nothing) waits until load k has finished, since load k+1 finds load k's layers by their chain
IDs. The unpacked archive of one load is deleted seconds after it is written (often before the kernel has
written it back to disk), where one big load keeps all of it until the end.

A push cut midway leaves the loads that completed as untagged partial images: the next push finds their
layers on the node and sends only the rest. The partial images are removed once the image is tagged there.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkdeploy.errors import StepFailed
from sparkdeploy.images.channel import Fanout, FeedChannel, load_timeout, open_loads, wait_load
from sparkdeploy.images.push_progress import PushProgress
from sparkdeploy.images.streams import NodeStream, StreamGroup, StreamSource
from sparkdeploy.nodeside import archive
from sparkdeploy.nodeside.layer_store import LayerMismatch
from sparkdeploy.nodeside.layers import chain_ids

if TYPE_CHECKING:
    from sparkdeploy.runtime.remote import NodeConnection

BATCH_BYTES = 256 * 1024 * 1024  # per load: big enough that a load's fixed cost (~0.3 s) is small


@dataclass
class Load:
    top: int  # position of the highest layer of the image this load's image reaches
    positions: list[int]  # the layers it carries
    final: bool  # carries the real config and the tag


def plan_loads(layer_count: int, positions: list[int], sizes: dict[int, int], batch_bytes: int) -> list[Load]:
    """Consecutive missing layers gathered into loads of at least `batch_bytes` (the last may be smaller)."""
    loads: list[Load] = []
    current: list[int] = []
    gathered = 0
    for pos in sorted(positions):
        current.append(pos)
        gathered += sizes[pos]
        if gathered >= batch_bytes:
            loads.append(Load(pos, current, False))
            current, gathered = [], 0
    if current or not loads:
        loads.append(Load(layer_count - 1, current, True))
    else:  # the last batch ended on a boundary: it becomes the final load
        loads[-1] = Load(layer_count - 1, loads[-1].positions, True)
    return loads


def stream_from_store(
    source: StreamSource,
    groups: list[StreamGroup],
    conns: dict[str, NodeConnection],
    progress: PushProgress,
    temp_tag: str,
    batch_bytes: int = BATCH_BYTES,
) -> dict[str, NodeStream]:
    """Send each group its loads, the groups in parallel; returns node -> what it received and any error.

    An exception in a group (an interrupt from a progress hook, say) aborts every stream and is raised here.
    """
    results: dict[str, NodeStream] = {}
    senders = [_GroupSender(source, group, conns, progress, temp_tag, batch_bytes) for group in groups]
    threads = [threading.Thread(target=s.run, daemon=True, name=f"push-group-{i}") for i, s in enumerate(senders)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # wakes for a Ctrl-C
    except BaseException:
        for s in senders:
            s.abort()
        raise
    for s in senders:
        if s.raised is not None:
            for other in senders:
                other.abort()
            raise s.raised
        results.update(s.results)
    return results


class _GroupSender:
    """The loads of one group, in order, to every node of the group (run() in a thread of its own)."""

    def __init__(
        self,
        source: StreamSource,
        group: StreamGroup,
        conns: dict[str, NodeConnection],
        progress: PushProgress,
        temp_tag: str,
        batch_bytes: int,
    ) -> None:
        self.source, self.group, self.conns, self.progress = source, group, conns, progress
        self.temp_tag = temp_tag
        self.batch_bytes = 1 << 62 if group.single_load else batch_bytes
        self.chains = chain_ids(source.diff_ids)
        self.results = {name: NodeStream() for name in group.names}
        self.raised: BaseException | None = None
        self._previous: dict[str, FeedChannel] = {}  # the load registering its layers
        self._current: dict[str, FeedChannel] = {}  # the load being sent
        self._lock = threading.Lock()
        self._aborted = False

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            for c in list(self._previous.values()) + list(self._current.values()):
                c.abort()

    def run(self) -> None:
        try:
            self._send_loads()
        except LayerMismatch as exc:
            self._fail_all(f"the layer store gave what its image does not name ({exc}); push with --layer-source save")
        except (ValueError, StepFailed, OSError) as exc:
            self._fail_all(f"reading the image's layers from this machine's layer store failed: {exc}")
        except BaseException as exc:  # noqa: BLE001 - an interrupt: handed to the calling thread
            self.raised = exc
            self.abort()

    def _send_loads(self) -> None:
        store, source = self.source.store, self.source
        assert store is not None  # stream_from_store is only called for a source whose layer store opened
        positions = [i for i, d in enumerate(source.diff_ids) if d in self.group.needed]
        sizes = {i: store.layer_size(self.chains[i], source.diff_ids[i]) for i in positions}
        for name in self.group.names:
            self.progress.begin(name, self.group.estimate)
        for load in plan_loads(len(source.diff_ids), positions, sizes, self.batch_bytes):
            names = [n for n in self.group.names if self.results[n].error is None]
            if not names or self._aborted:
                break
            opened, failed = open_loads(self.conns, names, self.group.method, self.progress)
            for name, error in failed.items():
                self._failed(name, error)
            if not opened:
                break
            with self._lock:
                self._current = opened
            fan = Fanout(self.group.method, list(opened.values()), self.progress)
            try:
                fan.write([archive.archive_start()])
                for pos in load.positions:
                    diff = source.diff_ids[pos]
                    fan.write([archive.layer_header(diff, sizes[pos])])
                    for chunk in store.layer_chunks(self.chains[pos], diff):
                        if not fan.alive:
                            break
                        fan.write([chunk])
                    fan.write([archive.layer_padding(sizes[pos])])
                self._wait_previous()  # its layers must be registered before this load's manifest arrives
                for name, c in opened.items():
                    if self.results[name].error is not None:
                        c.abort()  # that node's previous load failed: stop it here
                diffs = source.diff_ids[: load.top + 1]
                config = store.config_bytes(source.id)
                if load.final:
                    image_id, tag = source.id, self.temp_tag
                else:
                    config = archive.partial_config(config, diffs, source.id)
                    image_id, tag = archive.config_id(config), None
                fan.write([archive.archive_end(image_id, config, diffs, tag)])
                fan.finish()
            finally:
                fan.kill()
            for name, c in opened.items():
                if not load.final:
                    self.results[name].partial_ids.append(image_id)
                elif c.alive:
                    self.progress.loading(name)
            with self._lock:
                self._previous, self._current = opened, {}
        self._wait_previous()

    def _failed(self, name: str, error: str) -> None:
        if self.results[name].error is None:
            self.results[name].error = error

    def _wait_previous(self) -> None:
        for name, c in self._previous.items():
            error = wait_load(c, load_timeout(self.group.estimate))
            self._account(name, c)
            if error:
                self._failed(name, error)
        with self._lock:
            self._previous = {}

    def _account(self, name: str, c: FeedChannel) -> None:
        self.results[name].raw += c.raw
        self.results[name].wire += c.wire

    def _fail_all(self, error: str) -> None:
        """The reader failed: cut every stream (a cut archive loads nothing) and fail every node of the group."""
        self.abort()
        for name in self.group.names:
            self._failed(name, error)
        for channels in (self._previous, self._current):
            for name, c in channels.items():
                wait_load(c, 5)
                self._account(name, c)
