"""Layers of an image and a streaming filter for `docker save` archives.

A node that already holds some of an image's layers only needs the others. `docker load` (the graph-driver
loader of engines 20.10 to 28) walks the image's layers in order and, for each one, looks up the chain ID
(the layer and everything under it) in its layer store: a layer it has is taken from there and its file in
the archive is never opened. So an archive from `docker save` with the files of the layers the node has
removed loads to the same image ID. This module removes them on the fly, without spooling the archive.

Two archive layouts exist:
- legacy (engine 20.10 to 24): one folder per layer, `<v1 id>/{VERSION,json,layer.tar}`, where the v1 id is
  a hash the engine derives at save time. For every layer but the top one it depends only on the chain, so it
  is computed here (`legacy_layer_dirs`) and confirmed by the folder names the stream shows; the top layer's
  folder names its parent in its `json`. A folder that none of this identifies is hashed while it is held in
  a temporary file (its layer.tar's sha256 is its diff ID), then sent or dropped;
- OCI (engine 25 and later): `blobs/sha256/<hex>`, where a layer's blob name is its diff ID.

The filter also renames what the archive loads as: the manifest's RepoTags (and the OCI index's name
annotations) become one temporary tag, so a load that fails or is cut off never moves a real tag; the caller
checks the loaded image ID and only then tags it. The legacy `repositories` file (tags for the pre-manifest
loader) is dropped, and the archive starts with an empty folder named to sort before any layer folder: Go's
tar reader accepts an archive cut at an entry boundary, and without manifest.json (the last entry) the engine
falls back to its pre-manifest loader, which would import every complete layer folder as an untagged image;
that loader stops at the first folder without a `json`, this one, before importing anything.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
HEX64 = re.compile(r"[0-9a-f]{64}")
SMALL_ENTRY = 16 * 1024 * 1024  # metadata we read into memory (json, manifest); larger entries stream
SPOOL_CHUNK = 1024 * 1024
GUARD_FOLDER = "-sparkdeploy-partial-archive-guard/"  # '-' sorts before every hex digit

# json.Marshal(image.V1Image{Created: time.Unix(0, 0)}) minus the id: what engine 20.10's save hashes, with the
# chain ID and the parent's v1 id, into the folder name of every layer but the top one (image/v1.CreateID).
_LEGACY_CONTAINER_CONFIG = (
    '{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,"AttachStderr":false,'
    '"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":null,"Cmd":null,"Image":"","Volumes":null,'
    '"WorkingDir":"","Entrypoint":null,"OnBuild":null,"Labels":null}'
)
_LEGACY_CREATED = '"1970-01-01T00:00:00Z"'


def chain_ids(diff_ids: list[str]) -> list[str]:
    """Chain ID of each layer: the layer together with every layer under it (what the layer store keys on)."""
    chains: list[str] = []
    for diff in diff_ids:
        if not chains:
            chains.append(diff)
        else:
            chains.append("sha256:" + hashlib.sha256(f"{chains[-1]} {diff}".encode()).hexdigest())
    return chains


def legacy_layer_dirs(diff_ids: list[str]) -> list[str]:
    """The folder names a 20.10 `docker save` gives the layers below the top one (a guess the stream confirms)."""
    dirs: list[str] = []
    parent = ""
    for chain in chain_ids(diff_ids)[:-1]:
        fields = {
            "container_config": _LEGACY_CONTAINER_CONFIG,
            "created": _LEGACY_CREATED,
            "layer_id": json.dumps(chain),
        }
        if parent:
            fields["parent"] = json.dumps("sha256:" + parent)
        body = "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in sorted(fields.items())) + "}"
        parent = hashlib.sha256(body.encode()).hexdigest()
        dirs.append(parent)
    return dirs


def missing_layers(diff_ids: list[str], node_chains: set[str]) -> list[int]:
    """Positions of the layers a node lacks, given the chain IDs of every image it has."""
    return [i for i, chain in enumerate(chain_ids(diff_ids)) if chain not in node_chains]


def estimate_bytes(sizes: list[int], needed: list[bool]) -> int:
    """An upper bound of the bytes of the needed layers from `docker history` sizes (oldest first).

    History lists one size per build step and does not say which steps made no layer; when it has more
    entries than the image has layers, an entry may belong to any position its order allows, and it is
    counted when any of those positions is needed. Tar headers add about 1 KiB per file: 10% + 1 MiB per
    layer covers that for images of ordinary files.
    """
    n = len(needed)
    nonzero = [s for s in sizes if s > 0]
    total = 0
    if len(sizes) == n:
        total = sum(s for s, need in zip(sizes, needed, strict=False) if need)
    else:
        slack = max(0, n - len(nonzero))
        for j, size in enumerate(nonzero):
            if any(needed[j : j + slack + 1]):
                total += size
    return int(total * 1.1) + sum(needed) * (1 << 20)


# -- tar headers ----------------------------------------------------------------------------------------------


def _parse_number(field_bytes: bytes) -> int:
    if field_bytes and field_bytes[0] & 0x80:  # GNU base-256 (files of 8 GiB and more)
        value = field_bytes[0] & 0x7F
        for b in field_bytes[1:]:
            value = (value << 8) | b
        return value
    text = field_bytes.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _header_name(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if prefix:
            name = f"{prefix}/{name}"
    return name


def with_size(header: bytes, size: int) -> bytes:
    """The same header for an entry of another size (the checksum recomputed)."""
    h = bytearray(header)
    if size < 8**11:
        h[124:136] = f"{size:011o}\0".encode()
    else:  # GNU base-256, which Go's tar reader (docker load) accepts: layers of 8 GiB and more
        h[124:136] = bytes([0x80]) + size.to_bytes(11, "big")
    h[148:156] = b" " * 8
    h[148:156] = f"{sum(h):06o}\0 ".encode()
    return bytes(h)


def file_header(name: str, size: int, kind: bytes = b"0", mode: bytes = b"0000644\0") -> bytes:
    h = bytearray(BLOCK)
    h[0 : len(name)] = name.encode()
    h[100:108] = mode
    h[108:116] = h[116:124] = b"0000000\0"
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    return with_size(bytes(h), size)


def folder_header(name: str) -> bytes:
    return file_header(name, 0, b"5", b"0000755\0")


def _pax_records(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


@dataclass
class _Entry:
    raw: bytes  # extended headers (PAX / GNU long name) followed by this entry's header
    path: str
    size: int
    kind: bytes  # typeflag
    action: str = "pass"  # pass | drop | collect | spool
    collected: bytearray = field(default_factory=bytearray)
    config: bool = False  # the image config of a legacy archive


@dataclass
class _Folder:
    """A legacy layer folder held back until we know whether its layer is sent."""

    name: str
    pieces: list[bytes] = field(default_factory=list)
    parent: str | None = None  # from its json; "" when it has none (the bottom layer)
    decision: str | None = None  # send | drop


class ArchiveFilter:
    """Stream a `docker save` archive through, keeping only the layers in `needed_diffs`.

    feed(chunk) and finish() return the pieces of the filtered archive, in order. `rename_to` is the one tag
    the archive loads as (None: untagged). `bytes_in`/`bytes_out`, `sent`/`dropped` (one diff ID per layer
    file, None for a layer sent or dropped without being identified: all candidates were alike) and
    `spooled` (folders that had to be hashed to be identified) say what happened.

    With `image_id` given, a legacy archive is finished early: once the image's config and every needed
    layer have gone through, the filter writes the manifest itself (its paths for the layers the node has are
    never opened) and sets `done`; the rest of the save (on average half of it) need not be read.
    """

    def __init__(
        self,
        diff_ids: list[str],
        needed_diffs: set[str],
        rename_to: str | None = None,
        spool_dir: str | None = None,
        guess_legacy_dirs: bool = True,
        image_id: str | None = None,
    ):
        self.diff_ids = list(diff_ids)
        self.needed = set(needed_diffs)
        self.rename_to = rename_to
        self.spool_dir = spool_dir
        self.positions: dict[str, int] = {}  # legacy folder -> layer position
        if guess_legacy_dirs:
            self.positions.update({d: i for i, d in enumerate(legacy_layer_dirs(self.diff_ids))})
        self._confirmed: set[int] = set()  # positions whose folder the stream has shown
        self._config_name = f"{image_id.split(':')[-1]}.json" if image_id else None
        self._config_seen = False
        self._legacy = False  # the archive has layer folders
        self._sent_folders: dict[int, str] = {}  # needed position -> the folder sent for it
        self._sent_files: set[str] = set()  # diff IDs whose layer.tar went out as a file (not a link)
        self.done = False  # finished early: the rest of the input is not needed
        self.bytes_in = 0
        self.bytes_out = 0
        # diff IDs; None for a layer whose position in the image is not known (counted, not named)
        self.sent: list[str | None] = []
        self.dropped: list[str | None] = []
        self.spooled = 0
        self.ended = False  # saw the end-of-archive blocks
        self._buf = bytearray()
        self._entry: _Entry | None = None
        self._remaining = 0  # data + padding bytes of the current entry still to come
        self._ext: list[bytes] = []  # extended headers waiting for their entry
        self._ext_records: dict[str, str] = {}
        self._folder: _Folder | None = None
        self._spool: Any = None  # a TemporaryFile while an entry spools
        self._spool_hash: Any = None  # hashlib.sha256() while an entry spools
        self._spool_left = 0
        self._out: list[bytes] = []
        self._zeros = 0
        self._emit(folder_header(GUARD_FOLDER))

    # -- public ---------------------------------------------------------------------------------------
    def feed(self, data: bytes) -> list[bytes]:
        if self.done:
            return []
        view = memoryview(data)
        pos = 0
        while pos < len(view) and not self.done:
            if self._entry is None:
                take = min(BLOCK - len(self._buf), len(view) - pos)
                self._buf += view[pos : pos + take]
                pos += take
                if len(self._buf) == BLOCK:
                    header = bytes(self._buf)
                    self._buf.clear()
                    self._on_header(header)
            else:
                take = min(self._remaining, len(view) - pos)
                self._on_data(view[pos : pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._on_entry_end()
        self.bytes_in += pos
        return self._take()

    def finish(self) -> list[bytes]:
        if self.done:
            return self._take()
        if self._entry is not None or self._buf:
            raise ValueError("the image archive ended in the middle of an entry (the save was cut off)")
        if not self.ended:
            raise ValueError("the image archive ended without its end marker (the save was cut off)")
        self._flush_folder()
        return self._take()

    # -- internals ------------------------------------------------------------------------------------
    def _emit(self, piece: bytes) -> None:
        if piece:
            self._out.append(piece)
            self.bytes_out += len(piece)

    def _take(self) -> list[bytes]:
        out, self._out = self._out, []
        return out

    def _on_header(self, header: bytes) -> None:
        if header == ZERO_BLOCK:
            self._flush_folder()
            self._zeros += 1
            self.ended = self._zeros >= 2
            self._emit(header)
            return
        if self.ended:  # anything after the end marker is padding: keep it as it came
            self._emit(header)
            return
        self._zeros = 0
        kind = header[156:157]
        size = _parse_number(header[124:136])
        path = _header_name(header)
        if kind in (b"x", b"L", b"K"):  # extended header for the next entry
            entry = _Entry(header, path, size, kind, action="collect")
        else:
            records, self._ext_records = self._ext_records, {}
            raw = b"".join(self._ext) + header
            self._ext = []
            path = records.get("path", path)
            if "size" in records:
                size = int(records["size"])
            entry = _Entry(raw, path[2:] if path.startswith("./") else path, size, kind)
            self._classify(entry)
            if entry.action == "pass":
                self._emit(entry.raw)
        self._entry = entry
        self._remaining = padded(size)
        if self._remaining == 0:
            self._on_entry_end()

    def _classify(self, entry: _Entry) -> None:
        parts = entry.path.strip("/").split("/")
        top = parts[0]
        if HEX64.fullmatch(top) and (len(parts) > 1 or entry.kind == b"5"):  # legacy layer folder
            self._legacy = True
            if self._folder is None or self._folder.name != top:
                self._flush_folder()
                self._folder = _Folder(top)
            folder = self._folder
            if len(parts) > 1 and parts[1] == "layer.tar":
                self._decide_layer(folder, entry)
            elif folder.decision is not None:
                entry.action = "pass" if folder.decision == "send" else "drop"
            else:
                entry.action = "collect"  # VERSION, json, the folder itself: small, held with the folder
            return
        self._flush_folder()
        if len(parts) == 3 and parts[0] == "blobs" and HEX64.fullmatch(parts[2]) and entry.kind in (b"0", b"\0"):
            digest = f"{parts[1]}:{parts[2]}"
            if digest in self.diff_ids:  # an OCI-layout layer blob, named by its diff ID
                self._record(digest, digest in self.needed)
                entry.action = "pass" if digest in self.needed else "drop"
            return
        if entry.path == self._config_name:
            entry.config = True
        if entry.path == "repositories":
            entry.action = "drop"
        elif entry.path in ("manifest.json", "index.json") and entry.size <= SMALL_ENTRY:
            entry.action = "collect"

    def _record(self, diff: str | None, send: bool) -> None:
        (self.sent if send else self.dropped).append(diff)

    def _position(self, folder: _Folder) -> int | None:
        pos = self.positions.get(folder.name)
        if pos is None and folder.parent is not None:
            if folder.parent == "":
                pos = 0
            elif folder.parent in self.positions:
                pos = self.positions[folder.parent] + 1
        if pos is not None and pos < len(self.diff_ids):
            self.positions[folder.name] = pos
            self._confirmed.add(pos)
            return pos
        return None

    def _decide_layer(self, folder: _Folder, entry: _Entry) -> None:
        pos = self._position(folder)
        if pos is not None:
            send = self.diff_ids[pos] in self.needed
        else:
            # Not identified yet: if every layer whose folder has not shown up is needed (or none is), the
            # answer is the same whichever it is; otherwise hash it to find out.
            open_diffs = {d for i, d in enumerate(self.diff_ids) if i not in self._confirmed}
            if open_diffs and open_diffs <= self.needed:
                send = True
            elif not open_diffs & self.needed:
                send = False
            elif entry.kind in (b"0", b"\0") and entry.size > 0:
                entry.action = "spool"
                folder.pieces.append(entry.raw)
                self._spool = tempfile.TemporaryFile(dir=self.spool_dir, prefix="sparkdeploy-layer-")
                self._spool_hash = hashlib.sha256()
                self._spool_left = entry.size
                self.spooled += 1
                return
            else:
                send = True  # a link to another folder's layer.tar: tiny, and harmless when not needed
        self._settle(folder, entry, send, pos)

    def _settle(self, folder: _Folder, entry: _Entry, send: bool, pos: int | None) -> None:
        folder.decision = "send" if send else "drop"
        diff = self.diff_ids[pos] if pos is not None else None
        if entry.kind in (b"0", b"\0"):  # a link to another folder's layer.tar is no second copy
            self._record(diff, send)
        if send:
            self._sent(folder, entry, pos)
            for piece in folder.pieces:
                self._emit(piece)
            entry.action = "pass"
        else:
            entry.action = "drop"
        folder.pieces = []

    def _on_data(self, chunk: memoryview) -> None:
        entry = self._entry
        assert entry is not None
        if entry.action == "pass":
            self._emit(bytes(chunk))
        elif entry.action == "collect":
            entry.collected += chunk
        elif entry.action == "spool":
            data = chunk[: self._spool_left]  # the rest is tar padding, written again when it is sent
            self._spool.write(data)
            self._spool_hash.update(data)
            self._spool_left -= len(data)

    def _on_entry_end(self) -> None:
        entry, self._entry = self._entry, None
        assert entry is not None
        if entry.action == "collect":
            data = bytes(entry.collected[: entry.size])
            if entry.kind in (b"x", b"L", b"K"):
                self._ext.append(entry.raw + bytes(entry.collected))
                if entry.kind == b"x":
                    self._ext_records.update(_pax_records(data))
                elif entry.kind == b"L":
                    self._ext_records["path"] = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                return
            if self._folder is not None and HEX64.fullmatch(entry.path.split("/", 1)[0]):
                if entry.path.endswith("/json"):
                    self._folder.parent = _parent_of(data)
                self._folder.pieces.append(entry.raw + bytes(entry.collected))
                return
            if entry.path == "manifest.json":
                self._emit_rewritten(entry, _retag_manifest(data, self.rename_to))
            elif entry.path == "index.json":
                self._emit_rewritten(entry, _retag_index(data, self.rename_to))
            else:
                self._emit(entry.raw + bytes(entry.collected))
        elif entry.action == "spool":
            self._finish_spool(entry)
        if entry.config:
            self._config_seen = True
        self._maybe_finish_early()

    def _sent(self, folder: _Folder, entry: _Entry, pos: int | None) -> None:
        if pos is None:
            return
        self._sent_folders[pos] = folder.name
        if entry.kind in (b"0", b"\0"):
            self._sent_files.add(self.diff_ids[pos])

    def _maybe_finish_early(self) -> None:
        if self.done or not (self._legacy and self._config_seen):
            return
        if self._folder is not None and self._folder.decision is None:
            return
        needed = [i for i, d in enumerate(self.diff_ids) if d in self.needed]
        if (
            any(i not in self._sent_folders for i in needed)
            or not {self.diff_ids[i] for i in needed} <= self._sent_files
        ):
            return
        guesses = {pos: name for name, pos in self.positions.items()}
        layers = [
            f"{self._sent_folders.get(i) or guesses.get(i) or f'absent-{i}'}/layer.tar"
            for i in range(len(self.diff_ids))
        ]  # the node has every layer not sent: never opened
        manifest = (
            json.dumps(
                [
                    {
                        "Config": self._config_name,
                        "RepoTags": [self.rename_to] if self.rename_to else None,
                        "Layers": layers,
                    }
                ],
                separators=(",", ":"),
            ).encode()
            + b"\n"
        )
        self._emit(
            file_header("manifest.json", len(manifest))
            + manifest
            + bytes(padded(len(manifest)) - len(manifest))
            + ZERO_BLOCK
            + ZERO_BLOCK
        )
        self.done = self.ended = True

    def _emit_rewritten(self, entry: _Entry, data: bytes) -> None:
        header = entry.raw[-BLOCK:]
        prefix = entry.raw[:-BLOCK]
        self._emit(prefix + with_size(header, len(data)) + data + bytes(padded(len(data)) - len(data)))

    def _finish_spool(self, entry: _Entry) -> None:
        folder = self._folder
        assert folder is not None
        diff = "sha256:" + self._spool_hash.hexdigest()
        spool, self._spool = self._spool, None
        try:
            candidates = [i for i, d in enumerate(self.diff_ids) if d == diff and i not in self._confirmed]
            if candidates:
                self.positions[folder.name] = candidates[0]
                self._confirmed.add(candidates[0])
            send = diff in self.needed or (not candidates and diff not in self.diff_ids)
            header_raw = folder.pieces.pop()  # the layer.tar header, kept last
            folder.decision = "send" if send else "drop"
            self._record(diff, send)
            if send:
                self._sent(folder, entry, candidates[0] if candidates else None)
                for piece in folder.pieces:
                    self._emit(piece)
                self._emit(header_raw)
                spool.seek(0)
                while True:
                    block = spool.read(SPOOL_CHUNK)
                    if not block:
                        break
                    self._emit(block)
                self._emit(bytes(padded(entry.size) - entry.size))
            folder.pieces = []
        finally:
            spool.close()

    def _flush_folder(self) -> None:
        """A folder that ended without a layer.tar (not something docker writes): pass what it held."""
        folder, self._folder = self._folder, None
        if folder is not None and folder.decision is None:
            for piece in folder.pieces:
                self._emit(piece)


def _parent_of(json_bytes: bytes) -> str | None:
    try:
        data = json.loads(json_bytes)
    except ValueError:
        return None
    parent = data.get("parent") or ""
    return parent.split(":", 1)[-1]


def _retag_manifest(data: bytes, tag: str | None) -> bytes:
    manifest = json.loads(data)
    for item in manifest:
        item["RepoTags"] = [tag] if tag else None
    return json.dumps(manifest, separators=(",", ":")).encode() + b"\n"


def _retag_index(data: bytes, tag: str | None) -> bytes:
    index = json.loads(data)
    for desc in index.get("manifests", []):
        notes = desc.get("annotations") or {}
        notes.pop("io.containerd.image.name", None)
        notes.pop("org.opencontainers.image.ref.name", None)
        if tag:
            repo, _, version = tag.rpartition(":")
            first = repo.split("/", 1)[0]
            if "/" in repo and ("." in first or ":" in first or first == "localhost"):
                full = repo
            else:
                full = f"docker.io/{repo}" if "/" in repo else f"docker.io/library/{repo}"
            notes["io.containerd.image.name"] = f"{full}:{version}"
            notes["org.opencontainers.image.ref.name"] = version
        if notes:
            desc["annotations"] = notes
        else:
            desc.pop("annotations", None)
    return json.dumps(index, separators=(",", ":")).encode() + b"\n"
