"""Runs ON the source node as root (`sudo -n python3 - CONFIG`, shipped as text after layers.py, archive.py and
layer_store.py; standard library only): writes to stdout the archive of the layers the chain lacks, read
straight from the node's layer store (layer_store.py: only those layers are read, each checked against its
diff ID as it streams, the config against the image ID), where `docker save` would first write the whole image
to a temporary folder. The archive loads under the temporary tag; a layer that does not hash to its diff ID
stops it before its end, so nothing loads.
"""

import base64
import json
import sys
from pathlib import Path


def write_store_archive(cfg, out):
    store = LayerStore(Path(cfg["root"]), cfg["driver"])  # noqa: F821 - from layer_store.py, shipped before
    diff_ids, needed = cfg["diff_ids"], set(cfg["needed"])
    chains = chain_ids(diff_ids)  # noqa: F821 - from layers.py
    config = store.config_bytes(cfg["image_id"])
    out.write(archive_start())  # noqa: F821 - from archive.py
    for pos, diff in enumerate(diff_ids):
        if diff not in needed:
            continue
        size = store.layer_size(chains[pos], diff)
        out.write(layer_header(diff, size))  # noqa: F821
        for chunk in store.layer_chunks(chains[pos], diff):
            out.write(chunk)
        out.write(layer_padding(size))  # noqa: F821
    out.write(archive_end(cfg["image_id"], config, diff_ids, cfg["temp_tag"]))  # noqa: F821
    out.flush()


def reader_main():
    cfg = json.loads(base64.b64decode(sys.argv[1]))
    try:
        write_store_archive(cfg, sys.stdout.buffer)
    except (LayerMismatch, OSError, ValueError) as exc:  # noqa: F821
        sys.stderr.write(f"reading the layer store failed: {exc}\n")
        return 3
    return 0
