"""Preload engine images (vllm-sim, litellm-proxy, ...) into each lab node's inner Docker engine.

A lab node starts with an empty inner engine and no registry can fill it, so `lab up` streams
`docker save` from the host engine into `docker load` inside each node that lacks the image (same image ID:
skipped). One save stream feeds every node that needs it (the host reads and tars the layers once).
Definitions that do not exist (yet) are skipped with a message; the list is open (`--images a,b,c`).
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

import docker
from docker.utils.socket import frames_iter

from sparkdeploy.errors import ConfigError, SparkdeployError, StepFailed

CHUNK = 4 * 1024 * 1024


@dataclass
class LoadResult:
    image: str
    tag: str | None
    loaded: list[str]  # node names that received it now
    present: list[str]  # node names that had it already
    skipped: str = ""  # why the image was not loaded at all


def resolve(name: str, client, say) -> tuple[str | None, str]:
    """(tag, why-skipped) for an image definition: build it if needed (bases first)."""
    from sparkdeploy.images.build import ensure_image
    from sparkdeploy.images.definitions import load_definition

    try:
        load_definition(name)
    except ConfigError:
        return None, f"no definition images/{name}/ in this checkout"
    try:
        return ensure_image(name, client, progress=say), ""
    except (SparkdeployError, docker.errors.DockerException) as exc:
        return None, f"building it failed: {(str(exc).splitlines() or ['?'])[0]}"


def inner_image_id(container, tag: str) -> str:
    code, out = container.exec_run(["docker", "image", "inspect", "--format", "{{.Id}}", tag])
    return out.decode().strip() if code == 0 else ""


class _LoadStream:
    """`docker load` running inside one node, fed through the exec's hijacked stdin."""

    def __init__(self, client, container):
        self.api = client.api
        self.container = container
        self.exec_id = self.api.exec_create(container.id, ["docker", "load"], stdin=True, stdout=True,
                                            stderr=True)["Id"]
        self.sock = self.api.exec_start(self.exec_id, socket=True)
        self.raw = getattr(self.sock, "_sock", self.sock)
        self.output = b""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        self.output = b"".join(data for _stream, data in frames_iter(self.sock, tty=False))

    def send(self, chunk: bytes) -> None:
        self.raw.sendall(chunk)

    def finish(self) -> tuple[int, str]:
        self.raw.shutdown(socket.SHUT_WR)
        self.reader.join(timeout=600)
        code = self.api.exec_inspect(self.exec_id).get("ExitCode")
        try:
            self.sock.close()
        except OSError:
            pass
        return code if code is not None else -1, self.output.decode(errors="replace").strip()


def load_into_nodes(client, image_tag: str, containers: dict[str, object], progress=None) -> list[str]:
    """Stream one `docker save` of image_tag into every given node; returns the node names loaded."""
    image = client.images.get(image_tag)
    streams = {node: _LoadStream(client, c) for node, c in containers.items()}
    try:
        for chunk in image.save(chunk_size=CHUNK, named=True):
            for stream in streams.values():
                stream.send(chunk)
            if progress:
                progress(len(chunk))
    except (OSError, docker.errors.APIError) as exc:
        raise StepFailed(f"streaming {image_tag} into the lab nodes failed: {exc}") from None
    for node, stream in streams.items():
        code, output = stream.finish()
        if code != 0:
            raise StepFailed(f"docker load of {image_tag} on lab node {node} failed (exit {code}): {output}")
        if inner_image_id(containers[node], image_tag) != image.id:
            raise StepFailed(f"lab node {node}: {image_tag} loaded but its image ID differs from the host's")
    return list(streams)


def preload(client, names: list[str], containers: dict[str, object], say, bar=None) -> list[LoadResult]:
    """Make every named image present in every node; `bar(total_bytes)` returns a per-chunk callback."""
    results = []
    for name in names:
        tag, why = resolve(name, client, say)
        if tag is None:
            results.append(LoadResult(name, None, [], [], why))
            continue
        host_id = client.images.get(tag).id
        present = [n for n, c in containers.items() if inner_image_id(c, tag) == host_id]
        missing = {n: c for n, c in containers.items() if n not in present}
        loaded = []
        if missing:
            size = client.images.get(tag).attrs.get("Size", 0)
            say(f"image {tag}: loading into {', '.join(missing)} ({size / 1e6:.0f} MB)")
            loaded = load_into_nodes(client, tag, missing, bar(tag, size) if bar else None)
        results.append(LoadResult(name, tag, loaded, present))
    return results
