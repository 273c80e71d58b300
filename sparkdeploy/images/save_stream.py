"""The `save` reader: one `docker save` of the image, filtered on the fly into each group's archive.

For engines whose layer store cannot be read here (sparkdeploy.nodeside.layer_store says why). Every group of
nodes (same missing layers, same compression) gets one archive and one `docker load`; the save is read only as
far as the groups need (sparkdeploy.nodeside.layers.ArchiveFilter finishes an archive early). Engine 20.10
writes the whole image to a temp folder before the first byte of a save, so this reader costs at least that
even when one small layer is sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sparkdeploy.errors import StepFailed
from sparkdeploy.images.channel import CHUNK, Fanout, FeedChannel, load_timeout, open_loads, wait_load
from sparkdeploy.images.push_progress import PushProgress
from sparkdeploy.images.streams import NodeStream, StreamGroup, StreamSource
from sparkdeploy.nodeside.layers import ArchiveFilter

if TYPE_CHECKING:
    from docker import DockerClient

    from sparkdeploy.runtime.remote import NodeConnection


def stream_from_save(
    source: StreamSource,
    groups: list[StreamGroup],
    conns: dict[str, NodeConnection],
    client: DockerClient,
    progress: PushProgress,
    temp_tag: str,
) -> dict[str, NodeStream]:
    """Send each group its archive; returns node -> what it received and whether its load worked."""
    outcome: dict[str, NodeStream] = {}
    channels: dict[str, FeedChannel] = {}
    fans: list[tuple[StreamGroup, Fanout, ArchiveFilter]] = []
    try:
        for group in groups:
            opened, failed = open_loads(conns, group.names, group.method, progress)
            for name, why in failed.items():
                outcome[name] = NodeStream(error=why)
            for name in opened:
                progress.begin(name, group.estimate)
            channels.update(opened)
            if opened:
                fan = Fanout(group.method, list(opened.values()), progress)
                fans.append(
                    (group, fan, ArchiveFilter(source.diff_ids, group.needed, rename_to=temp_tag, image_id=source.id))
                )
        error = _pump_save(source, fans, client)
        if error:
            for c in channels.values():
                c.abort()
                c.error = error
        for group, _fan, _flt in fans:
            for name in group.names:
                chan = channels.get(name)
                if chan is None:
                    continue
                if chan.alive:
                    progress.loading(name)
                error = wait_load(chan, load_timeout(group.estimate))  # sends what is queued: count after it
                outcome[name] = NodeStream(chan.raw, chan.wire, error)
    except BaseException:
        for c in channels.values():
            c.abort()
        raise
    finally:
        for _group, fan, _flt in fans:
            fan.kill()
    return outcome


def _pump_save(
    source: StreamSource, fans: list[tuple[StreamGroup, Fanout, ArchiveFilter]], client: DockerClient
) -> str | None:
    """One `docker save` of the source, filtered for every group; returns why it failed, or None."""
    import docker  # the docker SDK: about 180 ms to import, which `up` and `status` never need

    if not fans:
        return None
    try:
        with _saved(client, source.id) as chunks:
            for chunk in chunks:
                live = [(fan, flt) for _g, fan, flt in fans if fan.alive and not flt.done]
                if not live:
                    break
                for fan, flt in live:
                    fan.write(flt.feed(chunk))
        for _group, fan, flt in fans:
            if fan.alive:
                fan.write(flt.finish())
                fan.finish()
    except (ValueError, StepFailed, docker.errors.APIError, OSError) as exc:
        return f"reading the image from this machine's engine failed: {exc}"
    return None


@contextmanager
def _saved(client: DockerClient, image_id: str) -> Iterator[Iterator[bytes]]:
    """`docker save` of one image as a stream of chunks; leaving the block early closes the connection.

    (The SDK's get_image gives no handle to close when the rest of the archive is not wanted.) No read timeout:
    the engine writes the whole archive to a temp folder before it sends the first byte.
    """
    api: Any = client.api  # the SDK's private _get, _url, _raise_for_status: not in types-docker
    response = api._get(api._url("/images/{0}/get", image_id), stream=True, timeout=None)
    try:
        api._raise_for_status(response)
        yield response.iter_content(CHUNK, False)
    finally:
        response.close()
