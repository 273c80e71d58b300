"""Read one layer of an image straight from this machine's Docker layer store, without `docker save`.

Engines 20.10 to 28 (graph-driver store) keep every layer as its unpacked files (overlay2: `<root>/overlay2/
<cache-id>/diff`) plus a tar-split record (`<root>/image/overlay2/layerdb/sha256/<chain>/tar-split.json.gz`):
the tar headers and padding of the archive the layer was made from, as JSON lines, with a `File` entry
wherever a file's contents go. The engine itself rebuilds a layer's tar from those two (that is how `docker
save` and `docker push` produce byte-identical layers); doing the same here gives one layer in the time it
takes to read its files, where `docker save` of engine 20.10 first writes every layer of the image to a temp
folder (image/tarexport/save.go).

The result is checked, not trusted: the image config's bytes must hash to the image ID, and each layer's
bytes to its diff ID as they stream (`LayerMismatch` at the end of a layer that does not: the archive is then
never finished, so nothing loads). `open_store` returns None, with the reason, where this cannot work: another
storage driver, the containerd image store, an engine on another machine (DOCKER_HOST) or in a VM, or a
Docker root this user cannot read (it is root's: run as root, or push with the `save` reader).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

READ_CHUNK = 1024 * 1024


class Engine(Protocol):
    """What open_store asks of a Docker client: the engine's `docker info`."""

    def info(self) -> dict[str, Any]: ...


class Digest(Protocol):
    """A hashlib hash, as the layer's chunks feed it."""

    def update(self, data: bytes, /) -> None: ...


_FILE, _SEGMENT = 1, 2  # tar-split entry types (github.com/vbatts/tar-split/tar/storage)


class LayerMismatch(Exception):
    """What the store gave does not hash to the ID the image names: the store is not what it claims."""


@dataclass
class LayerStore:
    root: Path  # the engine's DockerRootDir
    driver: str = "overlay2"
    _sizes: dict[str, int] = field(default_factory=dict)

    @property
    def layerdb(self) -> Path:
        return self.root / "image" / self.driver / "layerdb" / "sha256"

    @property
    def imagedb(self) -> Path:
        return self.root / "image" / self.driver / "imagedb" / "content" / "sha256"

    def config_bytes(self, image_id: str) -> bytes:
        """The image's config exactly as the engine keeps it (its sha256 is the image ID)."""
        data = (self.imagedb / _hex(image_id)).read_bytes()
        if "sha256:" + hashlib.sha256(data).hexdigest() != image_id:
            raise LayerMismatch(f"the config of {image_id[:19]} in {self.imagedb} does not hash to its ID")
        return data

    def layer_dir(self, chain_id: str, diff_id: str) -> Path:
        """The layerdb folder of the layer; checked to be the layer with this diff ID."""
        folder = self.layerdb / _hex(chain_id)
        recorded = (folder / "diff").read_text().strip()
        if recorded != diff_id:
            raise LayerMismatch(f"layer {chain_id[:19]} in {self.layerdb} is {recorded[:19]}, not {diff_id[:19]}")
        return folder

    def layer_size(self, chain_id: str, diff_id: str) -> int:
        """The exact size of the layer's tar (headers, contents and padding), from its tar-split record."""
        if diff_id not in self._sizes:
            total = 0
            for entry in self._entries(self.layer_dir(chain_id, diff_id)):
                if entry["type"] == _SEGMENT:
                    total += len(base64.b64decode(entry.get("payload") or ""))
                else:
                    total += int(entry.get("size") or 0)
            self._sizes[diff_id] = total
        return self._sizes[diff_id]

    def layer_chunks(self, chain_id: str, diff_id: str) -> Iterator[bytes]:
        """The layer's tar, byte for byte as the engine would export it, in chunks; hashed as it goes."""
        folder = self.layer_dir(chain_id, diff_id)
        files = self.root / self.driver / (folder / "cache-id").read_text().strip() / "diff"
        digest = hashlib.sha256()
        pending = bytearray()
        for entry in self._entries(folder):
            if entry["type"] == _SEGMENT:
                pending += base64.b64decode(entry.get("payload") or "")
            else:
                size = int(entry.get("size") or 0)
                if size:
                    yield from _flush(pending, digest)
                    yield from _file_chunks(files, _entry_name(entry), size, digest)
            if len(pending) >= READ_CHUNK:
                yield from _flush(pending, digest)
        yield from _flush(pending, digest)
        if "sha256:" + digest.hexdigest() != diff_id:
            raise LayerMismatch(f"layer {diff_id[:19]} rebuilt from {files} does not hash to its diff ID")

    @staticmethod
    def _entries(folder: Path) -> Iterator[dict[str, Any]]:
        with gzip.open(folder / "tar-split.json.gz", "rt", encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)


def open_store(client: Engine, image_id: str) -> tuple[LayerStore | None, str]:
    """This engine's layer store when it can be read here, or None and why not."""
    try:
        info = client.info()
    except Exception as exc:  # noqa: BLE001 - any engine failure means no store here, said why
        return None, f"docker info failed ({exc.__class__.__name__})"
    driver = info.get("Driver") or ""
    if any("containerd.snapshotter" in str(pair) for pair in info.get("DriverStatus") or []):
        return None, "the engine keeps images in containerd"
    if driver != "overlay2":
        return None, f"the engine's storage driver is {driver or 'unknown'}, not overlay2"
    store = LayerStore(Path(info.get("DockerRootDir") or "/var/lib/docker"), driver)
    if not os.access(store.root, os.R_OK | os.X_OK):
        return None, f"its Docker root {store.root} is not readable by this user (it is root's)"
    try:
        store.config_bytes(image_id)  # proves this is the engine's own store, seen from here
    except FileNotFoundError:
        return None, f"{store.root} here is not the engine's (a remote engine, or one in a VM)"
    except (OSError, LayerMismatch) as exc:
        return None, f"its image store cannot be read ({exc})"
    return store, ""


def _hex(digest: str) -> str:
    algo, _, value = digest.partition(":")
    if algo != "sha256" or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise LayerMismatch(f"{digest!r} is not a sha256 digest")
    return value


def _entry_name(entry: dict[str, Any]) -> str:
    raw = entry.get("name_raw")
    return os.fsdecode(base64.b64decode(raw)) if raw else entry.get("name") or ""


def _file_chunks(files: Path, name: str, size: int, digest: Digest) -> Iterator[bytes]:
    """The `size` bytes of one file of the layer; a name that leaves the layer's folder is refused."""
    relative = Path(name.lstrip("/"))
    if ".." in relative.parts or not relative.parts:
        raise LayerMismatch(f"layer entry {name!r} is outside the layer")
    left = size
    with open(files / relative, "rb") as f:
        while left:
            data = f.read(min(READ_CHUNK, left))
            if not data:
                raise LayerMismatch(f"{files / relative} is shorter than the {size} bytes its layer records")
            left -= len(data)
            digest.update(data)
            yield data


def _flush(pending: bytearray, digest: Digest) -> Iterator[bytes]:
    if pending:
        data = bytes(pending)
        pending.clear()
        digest.update(data)
        yield data
