"""Write a `docker load` archive from layers read one by one (layer_store.py).

The layout is the manifest form every graph-driver engine loads (20.10 to 28): `<diff hex>/layer.tar` for
each layer sent, `<image id hex>.json` (the config), and `manifest.json` naming the config, the one tag it
loads as and a path for every layer. The loader opens a layer's path only when the node lacks that layer's
chain, so the layers a node has are simply left out.

Order matters for a transfer that is cut: an empty guard folder first (it sorts before any layer folder and
stops the pre-manifest loader that Docker falls back to when manifest.json is missing, as in layers.py), the
layers, and the config and manifest last: an archive cut anywhere before its end loads nothing.
"""

from __future__ import annotations

import hashlib
import json

from .layers import GUARD_FOLDER, ZERO_BLOCK, file_header, folder_header, padded

PARTIAL_LABEL = "io.sparkdeploy.partial-of"  # on the image of a load that carries part of an image's layers


def layer_path(diff_id: str) -> str:
    return f"{diff_id.split(':', 1)[1]}/layer.tar"


def archive_start() -> bytes:
    return folder_header(GUARD_FOLDER)


def layer_header(diff_id: str, size: int) -> bytes:
    """The tar header of a layer whose `size` bytes of tar follow; end it with layer_padding(size)."""
    return file_header(layer_path(diff_id), size)


def layer_padding(size: int) -> bytes:
    return bytes(padded(size) - size)


def archive_end(image_id: str, config: bytes, diff_ids: list[str], tag: str | None) -> bytes:
    """The config, the manifest (written by the serializer) and the end-of-archive blocks."""
    config_name = f"{image_id.split(':', 1)[1]}.json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [tag] if tag else [], "Layers": [layer_path(d) for d in diff_ids]}]
    ).encode()
    return _entry(config_name, config) + _entry("manifest.json", manifest) + ZERO_BLOCK + ZERO_BLOCK


def partial_config(config: bytes, diff_ids: list[str], image_id: str) -> bytes:
    """The config of an image made of the first layers of `image_id` (for a load that carries some of them).

    No history (the engine refuses more history entries with layers than the image has layers) and the label
    that says which image it is part of; architecture and OS as the image's. Written by the serializer.
    """
    source = json.loads(config)
    partial = {
        "architecture": source.get("architecture", ""),
        "os": source.get("os", "linux"),
        "created": "1970-01-01T00:00:00Z",
        "config": {"Labels": {PARTIAL_LABEL: image_id}},
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
    }
    if source.get("variant"):
        partial["variant"] = source["variant"]
    return json.dumps(partial, sort_keys=True, separators=(",", ":")).encode()


def config_id(config: bytes) -> str:
    return "sha256:" + hashlib.sha256(config).hexdigest()


def _entry(name: str, data: bytes) -> bytes:
    return file_header(name, len(data)) + data + layer_padding(len(data))


def archive_overhead(layers: int) -> int:
    """Bytes of the archive that are not layer contents, at most: headers, padding, config and manifest."""
    return (layers + 8) * 1024 + 64 * 1024
