"""Runs ON the source node as root (`sudo -n`, `store-reader CONFIG` of this package's archive): writes to stdout
the layers the chain lacks as a pipeline of loads (framed: see write_store_archive), read straight from the
node's layer store (layer_store.py: only those layers are read, each checked against its diff ID as it
streams, the config against the image ID), where `docker save` would first write the whole image to a
temporary folder. The archive loads under the temporary tag; a layer that does not hash to its diff ID
stops it before its end, so nothing loads.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path
from typing import IO, Any

from .archive import archive_end, archive_start, config_id, layer_header, layer_padding, partial_config
from .layer_store import LayerMismatch, LayerStore
from .layers import chain_ids
from .ship import decode

BODY, TRAILER = b"B", b"T"  # frames: part of the current load's layers | its config, manifest and end (it ends)


def frame(kind: bytes, data: bytes) -> bytes:
    return kind + len(data).to_bytes(8, "big") + data


class _Counted:
    """The output, counting what was written (reported as `wrote N` on stderr at the end)."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.bytes = out, 0

    def write(self, data: bytes) -> None:
        self.bytes += len(data)
        self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def plan_batches(positions: list[int], sizes: dict[int, int], batch_bytes: int) -> list[list[int]]:
    """Consecutive layers to send gathered into loads of at least batch_bytes (images.store_stream.plan_loads)."""
    loads: list[list[int]] = []
    current: list[int] = []
    gathered = 0
    for pos in sorted(positions):
        current.append(pos)
        gathered += sizes[pos]
        if gathered >= batch_bytes:
            loads.append(current)
            current, gathered = [], 0
    if current or not loads:
        loads.append(current)
    return loads


def write_store_archive(cfg: dict[str, Any], out: IO[bytes] | _Counted, err: IO[str]) -> None:
    """A pipeline of loads, as frames: each load a complete archive of some layers and the config of the image
    made of the layers up to its top one (a partial image, labelled with the image it is part of), the last
    one the real config and the temporary tag. A cut push keeps the loads that finished."""
    store = LayerStore(Path(cfg["root"]), cfg["driver"])
    diff_ids, needed = cfg["diff_ids"], set(cfg["needed"])
    chains = chain_ids(diff_ids)
    config = store.config_bytes(cfg["image_id"])
    positions = [i for i, d in enumerate(diff_ids) if d in needed]
    sizes = {i: store.layer_size(chains[i], diff_ids[i]) for i in positions}
    batches = plan_batches(positions, sizes, int(cfg.get("batch_bytes") or 256 * 1024 * 1024))
    for n, batch in enumerate(batches):
        final = n == len(batches) - 1
        out.write(frame(BODY, archive_start()))
        for pos in batch:
            diff = diff_ids[pos]
            out.write(frame(BODY, layer_header(diff, sizes[pos])))
            for chunk in store.layer_chunks(chains[pos], diff):
                out.write(frame(BODY, chunk))
            out.write(frame(BODY, layer_padding(sizes[pos])))
        top = len(diff_ids) - 1 if final else batch[-1]
        if final:
            image_config, image_id, tag = config, cfg["image_id"], cfg["temp_tag"]
        else:
            image_config = partial_config(config, diff_ids[: top + 1], cfg["image_id"])
            image_id, tag = config_id(image_config), None
            err.write(f"partial {image_id}\n")
            err.flush()
        out.write(frame(TRAILER, archive_end(image_id, image_config, diff_ids[: top + 1], tag)))
    out.flush()


def sample_ratio(cfg: dict[str, Any], per_layer: int = 2 << 20, layers: int = 8) -> dict[str, Any]:
    """How well the layers to send compress: zlib level 1 over the first `per_layer` bytes of the `layers`
    largest of them (the ones that carry the bytes). A proxy for zstd -1, cheap enough to run before a push:
    about 1.0 means compressing would only cost CPU on both ends."""
    store = LayerStore(Path(cfg["root"]), cfg["driver"])
    diff_ids, needed = cfg["diff_ids"], set(cfg["needed"])
    chains = chain_ids(diff_ids)
    positions = [i for i, d in enumerate(diff_ids) if d in needed]
    sizes = {i: store.layer_size(chains[i], diff_ids[i]) for i in positions}
    raw = packed = 0
    for pos in sorted(positions, key=lambda i: -sizes[i])[:layers]:
        taken = bytearray()
        for chunk in store.layer_chunks(chains[pos], diff_ids[pos]):
            taken += chunk[: per_layer - len(taken)]
            if len(taken) >= per_layer:
                break
        raw += len(taken)
        packed += len(zlib.compress(bytes(taken), 1))
    return {"sampled": raw, "ratio": round(packed / raw, 3) if raw else 1.0}


def main(argv: list[str]) -> int:
    cfg = decode(argv[0])
    try:
        if cfg.get("sample"):
            print(json.dumps(sample_ratio(cfg)))
            return 0
        out = _Counted(sys.stdout.buffer)
        write_store_archive(cfg, out, sys.stderr)
        sys.stderr.write(f"wrote {out.bytes}\n")
    except (LayerMismatch, OSError, ValueError) as exc:
        sys.stderr.write(f"reading the layer store failed: {exc}\n")
        return 3
    return 0
