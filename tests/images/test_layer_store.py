"""Reading layers from the engine's layer store (sparkdeploy.nodeside.layer_store) and the archive written from them.

The fast tests build a layer store on disk the way engine 20.10 lays it out: a layer tar made by Python's
tarfile, its tar-split record (the headers and padding as Segment entries, a File entry where each file's
contents go) and the unpacked files. The lab-marked tests read the real store of this machine's engine and
compare with `docker save`.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from sparkdeploy.nodeside import archive
from sparkdeploy.nodeside.layer_store import LayerMismatch, LayerStore, open_store
from sparkdeploy.nodeside.layers import chain_ids, with_size

# -- a store on disk, as the engine writes it -----------------------------------------------------------------


def _layer_tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _tar_split(layer: bytes) -> list[dict]:
    """What tar-split records for a tar: the bytes between file contents as segments, the contents as files."""
    entries: list[dict] = []
    position = 0
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        for info in tar:
            entries.append({"type": 2, "payload": base64.b64encode(layer[position : info.offset_data]).decode()})
            name = info.name.encode("utf-8", "surrogateescape")
            entry = {"type": 1, "size": info.size if info.isreg() else 0}
            try:
                entry["name"] = name.decode("utf-8")
            except UnicodeDecodeError:
                entry["name_raw"] = base64.b64encode(name).decode()
            entries.append(entry)
            position = info.offset_data + (info.size if info.isreg() else 0)
    entries.append({"type": 2, "payload": base64.b64encode(layer[position:]).decode()})
    for i, entry in enumerate(entries):
        entry["position"] = i
    return entries


class DiskStore:
    """An overlay2 layer store in a temporary Docker root, one image of the given layers."""

    def __init__(self, root: Path, layers: list[list[tuple[tarfile.TarInfo, bytes | None]]]):
        self.root = root
        self.tars = [_layer_tar(members) for members in layers]
        self.diff_ids = ["sha256:" + hashlib.sha256(t).hexdigest() for t in self.tars]
        self.chains = chain_ids(self.diff_ids)
        for n, (tar_bytes, members) in enumerate(zip(self.tars, layers, strict=False)):
            folder = self.root / "image/overlay2/layerdb/sha256" / self.chains[n].split(":")[1]
            folder.mkdir(parents=True)
            (folder / "diff").write_text(self.diff_ids[n])
            (folder / "cache-id").write_text(f"cache{n}")
            with gzip.open(folder / "tar-split.json.gz", "wt") as out:
                for entry in _tar_split(tar_bytes):
                    out.write(json.dumps(entry) + "\n")
            files = self.root / "overlay2" / f"cache{n}" / "diff"
            files.mkdir(parents=True)
            for info, data in members:
                if info.isreg():
                    path = files / info.name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data or b"")
        config = json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": self.diff_ids},
            }
        ).encode()
        self.image_id = "sha256:" + hashlib.sha256(config).hexdigest()
        configs = self.root / "image/overlay2/imagedb/content/sha256"
        configs.mkdir(parents=True)
        (configs / self.image_id.split(":")[1]).write_bytes(config)
        self.config = config

    def files(self, n: int) -> Path:
        return self.root / "overlay2" / f"cache{n}" / "diff"


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o755
    return info, None


def _layers() -> list[list]:
    long_dir = "d" * 60 + "/" + "e" * 70
    return [
        [
            _special("etc", tarfile.DIRTYPE),
            _file("etc/hostname", b"spark1\n"),
            _file("etc/empty", b""),
            _special("etc/link", tarfile.SYMTYPE, "hostname"),
            _file(f"{long_dir}/deep.bin", bytes(range(256)) * 9),
        ],
        [
            _file("blob.bin", bytes(3 * 1024 * 1024 + 7)),
            _special("etc/hard", tarfile.LNKTYPE, "etc/hostname"),
            _file("etc/.wh.empty", b""),
            _file("caf\udce9.txt", b"latin-1 name\n"),
        ],
    ]


@pytest.fixture
def disk_store(tmp_path) -> DiskStore:
    return DiskStore(tmp_path, _layers())


def _read(store: LayerStore, disk: DiskStore, n: int) -> bytes:
    return b"".join(store.layer_chunks(disk.chains[n], disk.diff_ids[n]))


# -- fast: the store on disk --------------------------------------------------------------------------------


def test_layers_are_rebuilt_byte_for_byte(disk_store):
    store = LayerStore(disk_store.root)
    for n, tar_bytes in enumerate(disk_store.tars):
        assert _read(store, disk_store, n) == tar_bytes
        assert store.layer_size(disk_store.chains[n], disk_store.diff_ids[n]) == len(tar_bytes)
    assert store.config_bytes(disk_store.image_id) == disk_store.config


def test_a_changed_file_is_caught_at_the_end_of_its_layer(disk_store):
    path = disk_store.files(1) / "blob.bin"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(LayerMismatch, match="does not hash to its diff ID"):
        _read(LayerStore(disk_store.root), disk_store, 1)


def test_a_truncated_file_is_caught(disk_store):
    path = disk_store.files(0) / "etc/hostname"
    path.write_bytes(b"sp")
    with pytest.raises(LayerMismatch, match="shorter than the 7 bytes"):
        _read(LayerStore(disk_store.root), disk_store, 0)


def test_a_layer_folder_for_another_diff_is_refused(disk_store):
    store = LayerStore(disk_store.root)
    with pytest.raises(LayerMismatch, match="not sha256:"):
        b"".join(store.layer_chunks(disk_store.chains[0], disk_store.diff_ids[1]))


def test_an_entry_outside_the_layer_is_refused(tmp_path):
    disk = DiskStore(tmp_path, [[_file("ok.txt", b"fine\n")]])
    folder = tmp_path / "image/overlay2/layerdb/sha256" / disk.chains[0].split(":")[1]
    with gzip.open(folder / "tar-split.json.gz", "rt") as f:
        entries = [json.loads(line) for line in f]
    for entry in entries:
        if entry["type"] == 1:
            entry["name"] = "../../../../etc/passwd"
    with gzip.open(folder / "tar-split.json.gz", "wt") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)
    with pytest.raises(LayerMismatch, match="outside the layer"):
        _read(LayerStore(tmp_path), disk, 0)


def test_a_config_that_does_not_hash_to_its_id_is_refused(disk_store):
    path = disk_store.root / "image/overlay2/imagedb/content/sha256" / disk_store.image_id.split(":")[1]
    path.write_bytes(disk_store.config + b" ")
    with pytest.raises(LayerMismatch, match="does not hash to its ID"):
        LayerStore(disk_store.root).config_bytes(disk_store.image_id)


class _Engine:
    """What open_store asks of the Docker SDK client: docker info (a stand-in for pure decision logic)."""

    def __init__(self, **info):
        self._info = info

    def info(self):
        return self._info


def test_open_store_says_why_not(disk_store, tmp_path):
    image = disk_store.image_id
    store, why = open_store(_Engine(Driver="overlay2", DockerRootDir=str(disk_store.root)), image)
    assert store is not None and why == ""
    cases = {
        "vfs": (_Engine(Driver="vfs", DockerRootDir=str(disk_store.root)), "storage driver is vfs"),
        "containerd": (
            _Engine(
                Driver="overlayfs",
                DockerRootDir=str(disk_store.root),
                DriverStatus=[["driver-type", "io.containerd.snapshotter.v1"]],
            ),
            "containerd",
        ),
        "elsewhere": (_Engine(Driver="overlay2", DockerRootDir=str(tmp_path / "nowhere")), "not readable"),
    }
    for name, (engine, reason) in cases.items():
        store, why = open_store(engine, image)
        assert store is None and reason in why, (name, why)
    (tmp_path / "other").mkdir()
    store, why = open_store(_Engine(Driver="overlay2", DockerRootDir=str(tmp_path / "other")), image)
    assert store is None and "is not the engine's" in why


def test_archive_loads_in_pythons_tar_reader_with_the_manifest_last(disk_store):
    store = LayerStore(disk_store.root)
    body = archive.archive_start()
    size = store.layer_size(disk_store.chains[1], disk_store.diff_ids[1])
    body += archive.layer_header(disk_store.diff_ids[1], size) + _read(store, disk_store, 1)
    body += archive.layer_padding(size)
    body += archive.archive_end(disk_store.image_id, disk_store.config, disk_store.diff_ids, "repo/x:incoming")
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))
        layer = tar.extractfile(archive.layer_path(disk_store.diff_ids[1])).read()
    assert names[0] == "-sparkdeploy-partial-archive-guard" and names[-1] == "manifest.json"
    assert layer == disk_store.tars[1]
    assert manifest == [
        {
            "Config": disk_store.image_id.split(":")[1] + ".json",
            "RepoTags": ["repo/x:incoming"],
            "Layers": [archive.layer_path(d) for d in disk_store.diff_ids],
        }
    ]


def test_sizes_of_8_gib_and_more_use_base_256():
    header = archive.layer_header("sha256:" + "a" * 64, 0)
    big = with_size(header, 9 * 1024**3 + 5)
    info = tarfile.TarInfo.frombuf(big, "utf-8", "surrogateescape")
    assert info.size == 9 * 1024**3 + 5
    assert tarfile.TarInfo.frombuf(with_size(header, 8**11 - 1), "utf-8", "surrogateescape").size == 8**11 - 1


# -- the real store of this machine's engine ------------------------------------------------------------------


@pytest.mark.lab
def test_the_engines_own_layers_equal_docker_save(test_images):
    """Every layer of a real image (the Debian base: links, devices, whiteouts; and random files), rebuilt
    from the engine's store, is byte-identical to the layer.tar `docker save` writes."""
    import docker

    client = docker.from_env()
    image = client.images.get(test_images.big)
    store, why = open_store(client, image.id)
    assert store is not None, why
    saved = {}
    with tarfile.open(fileobj=io.BytesIO(b"".join(client.api.get_image(image.id))), mode="r:") as tar:
        for member in tar:
            if member.name.endswith("/layer.tar") and member.isreg():
                saved["sha256:" + hashlib.sha256(tar.extractfile(member).read()).hexdigest()] = member.size
    diffs = image.attrs["RootFS"]["Layers"]
    assert set(saved) == set(diffs)
    for chain, diff in zip(chain_ids(diffs), diffs, strict=False):
        digest, size = hashlib.sha256(), 0
        for chunk in store.layer_chunks(chain, diff):
            digest.update(chunk)
            size += len(chunk)
        assert "sha256:" + digest.hexdigest() == diff
        assert size == saved[diff] == store.layer_size(chain, diff)
