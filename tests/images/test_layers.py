"""The `docker save` filter: which layer files go, which stay, and that the result still loads.

The fast tests build archives in the two layouts docker writes (legacy folders, OCI blobs) and check them with
the rule `docker load` applies (`load_check` below: a layer the node has is taken from its store and its file
is never opened; every other layer's file must be in the archive with its diff ID). The lab-marked test runs
a real `docker save` through the filter into the real engine on this machine.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import tarfile

import pytest

from sparkdeploy.nodeside.layers import ArchiveFilter, chain_ids, estimate_bytes, legacy_layer_dirs, missing_layers

# -- archives as docker writes them, and docker load's rule ---------------------------------------------------


def layer_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _write(entries: list[tuple[str, bytes | None, str | None]], fmt=tarfile.GNU_FORMAT) -> bytes:
    """(path, data, link target) sorted by path like the engine's archive.Tar; data None is a folder."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for path, data, link in sorted(entries, key=lambda e: e[0]):
            info = tarfile.TarInfo(path)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _config(layers: list[bytes]) -> tuple[bytes, str]:
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": diffs_of(layers)},
        }
    ).encode()
    return config, hashlib.sha256(config).hexdigest()


def legacy_archive(
    layers: list[bytes],
    tag: str | None = None,
    dir_names: list[str] | None = None,
    link_duplicates: bool = False,
    extra: dict[str, bytes] | None = None,
    fmt=tarfile.GNU_FORMAT,
) -> tuple[bytes, bytes]:
    """An engine-20.10-style `docker save`: one folder per layer, named as the engine names them."""
    diffs = diffs_of(layers)
    names = dir_names or legacy_layer_dirs(diffs) + ["f" * 63 + "0"]
    config, image_id = _config(layers)
    entries: list[tuple[str, bytes | None, str | None]] = []
    first_of: dict[str, str] = {}
    for i, (name, data) in enumerate(zip(names, layers, strict=False)):
        meta = {"id": name, "created": "1970-01-01T00:00:00Z", "os": "linux"}
        if i:
            meta["parent"] = names[i - 1]
        entries += [
            (name, None, None),
            (f"{name}/VERSION", b"1.0", None),
            (f"{name}/json", json.dumps(meta).encode(), None),
        ]
        if link_duplicates and diffs[i] in first_of:
            entries.append((f"{name}/layer.tar", None, f"../{first_of[diffs[i]]}/layer.tar"))
        else:
            first_of.setdefault(diffs[i], name)
            entries.append((f"{name}/layer.tar", data, None))
    manifest = [
        {"Config": f"{image_id}.json", "RepoTags": [tag] if tag else None, "Layers": [f"{n}/layer.tar" for n in names]}
    ]
    entries += [
        (f"{image_id}.json", config, None),
        ("manifest.json", json.dumps(manifest).encode(), None),
        ("repositories", b"{}", None),
    ]
    entries += [(name, data, None) for name, data in (extra or {}).items()]
    return _write(entries, fmt), config


def oci_archive(layers: list[bytes], tag: str) -> bytes:
    """An engine-25-style `docker save`: blobs named by digest (a layer's is its diff ID), index.json."""
    config, image_id = _config(layers)
    entries: list[tuple[str, bytes | None, str | None]] = [("blobs", None, None), ("blobs/sha256", None, None)]
    entries += [
        (f"blobs/sha256/{d.split(':')[1]}", data, None) for d, data in zip(diffs_of(layers), layers, strict=False)
    ]
    entries.append((f"blobs/sha256/{image_id}", config, None))
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "digest": "sha256:" + "e" * 64,
                "annotations": {
                    "io.containerd.image.name": f"docker.io/{tag}",
                    "org.opencontainers.image.ref.name": tag.split(":")[1],
                },
            }
        ],
    }
    manifest = [
        {
            "Config": f"blobs/sha256/{image_id}",
            "RepoTags": [tag],
            "Layers": [f"blobs/sha256/{d.split(':')[1]}" for d in diffs_of(layers)],
        }
    ]
    entries += [
        ("index.json", json.dumps(index).encode(), None),
        ("oci-layout", b"{}", None),
        ("manifest.json", json.dumps(manifest).encode(), None),
    ]
    return _write(entries)


def load_check(archive: bytes, node_chains: set[str], expect_tags: list[str] | None = None) -> None:
    """What `docker load` (tarexport.Load) needs from the archive, given the chain IDs the node has."""
    tar = tarfile.open(fileobj=io.BytesIO(archive))
    files = {m.name: m for m in tar.getmembers()}
    manifest = json.loads(tar.extractfile("manifest.json").read())
    assert len(manifest) == 1
    item = manifest[0]
    config = json.loads(tar.extractfile(item["Config"]).read())
    diffs = config["rootfs"]["diff_ids"]
    assert len(item["Layers"]) == len(diffs)
    for diff, chain, path in zip(diffs, chain_ids(diffs), item["Layers"], strict=False):
        if chain in node_chains:
            continue
        member = files.get(path)
        assert member is not None, f"layer {diff[:19]} is needed but {path} is not in the archive"
        if member.issym():
            path = os.path.normpath(os.path.join(os.path.dirname(path), member.linkname))
            assert path in files, f"{path}: link target missing"
        assert "sha256:" + hashlib.sha256(tar.extractfile(path).read()).hexdigest() == diff
    if expect_tags is not None:
        assert item["RepoTags"] == expect_tags


def run_filter(archive: bytes, diff_ids, needed, chunk=7919, **kw) -> tuple[bytes, ArchiveFilter]:
    flt = ArchiveFilter(diff_ids, needed, **kw)
    out = []
    for i in range(0, len(archive), chunk):  # odd chunk size: headers and data split across feeds
        out += flt.feed(archive[i : i + chunk])
    out += flt.finish()
    return b"".join(out), flt


def diffs_of(layers: list[bytes]) -> list[str]:
    return ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]


@pytest.fixture
def layers() -> list[bytes]:
    rnd = random.Random(7)
    return [layer_tar({f"f{i}.bin": rnd.randbytes(20000 + 1000 * i)}) for i in range(5)]


def test_chain_ids_follow_docker_rule():
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    chains = chain_ids([a, b])
    assert chains[0] == a
    assert chains[1] == "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    assert missing_layers([a, b], {a}) == [1]
    assert missing_layers([a, b], set()) == [0, 1]
    # the same layer on top of a different base is a different layer for the store
    assert missing_layers([b], {chains[1]}) == [0]


def test_legacy_dir_names_match_engine_20_10():
    """Folder names taken from a real `docker save` on engine 20.10.24 (an image of 4 layers)."""
    diffs = [
        "sha256:49a364d34b0bdfe1dd95fe3c0684b37af4cc4923ce6a730759f5de78d07b0046",
        "sha256:300c9a804f81c28e073cebab69da50d3b969b26c51395f9b92c010021fd196ba",
        "sha256:228970f7680601cdc54275f9677972100cbcc5074a8fb60f7026a38ec1ed50e5",
        "sha256:961409c296fa10c486a2b1ad1b3465d56bff85e7c726389c2f9f4ebd548302ae",
    ]
    assert legacy_layer_dirs(diffs) == [
        "2a35c3ecd19c406d9031e7911347b43937092afe6c3c958a4d3f3e1763e129d5",
        "c1b8113bb2faa868393fabca4e18a7edb21151c20370a5db7b005c5fcd44628b",
        "7da567ccaad2e0cbbbcb8e7748e1998f0e70c78a7ef60d874259f8da69c4612b",
    ]


@pytest.mark.parametrize("guess", [True, False], ids=["computed-names", "names-unknown"])
@pytest.mark.parametrize("present", [set(), {0}, {0, 1, 2, 3}, {0, 1, 2, 3, 4}, {0, 2}])
def test_legacy_archive_keeps_exactly_the_missing_layers(layers, present, guess):
    diffs = diffs_of(layers)
    chains = chain_ids(diffs)
    node = {chains[i] for i in present if all(j in present for j in range(i + 1))}
    needed = {diffs[i] for i in missing_layers(diffs, node)}
    archive, _config = legacy_archive(layers, tag="src/img:1")
    out, flt = run_filter(archive, diffs, needed, rename_to="incoming/img:abc", guess_legacy_dirs=guess)
    load_check(out, node, expect_tags=["incoming/img:abc"])
    names = tarfile.open(fileobj=io.BytesIO(out)).getnames()
    layer_files = [n for n in names if n.endswith("/layer.tar")]
    assert len(layer_files) == len(needed) == len(flt.sent)
    assert {d for d in flt.sent if d} <= needed
    assert "repositories" not in names
    if not needed:
        assert len(out) < 8 * 1024  # metadata only


@pytest.mark.parametrize("guess", [True, False], ids=["computed-names", "names-unknown"])
@pytest.mark.parametrize("present", [set(), {0}, {0, 1, 2, 3}, {0, 2}])
def test_legacy_archive_finishes_early_with_its_own_manifest(layers, present, guess):
    """Given the image ID, the filter stops once the config and the needed layers are through (when it can
    tell which folders they are: with the engine's folder names, always; with unknown names, it reads on)."""
    diffs = diffs_of(layers)
    chains = chain_ids(diffs)
    node = {chains[i] for i in present if all(j in present for j in range(i + 1))}
    needed = {diffs[i] for i in missing_layers(diffs, node)}
    names = legacy_layer_dirs(diffs) + ["0" * 63 + "a"]  # as the engine names them; the top one sorts first
    archive, config = legacy_archive(layers, tag="src/img:1", dir_names=names)
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    out, flt = run_filter(
        archive, diffs, needed, rename_to="incoming/img:abc", guess_legacy_dirs=guess, image_id=image_id
    )
    load_check(out, node, expect_tags=["incoming/img:abc"])
    if guess:
        assert flt.done and flt.bytes_in < len(archive)  # manifest.json and repositories were never read
        assert flt.feed(b"more") == [] and flt.finish() == []


def test_early_finish_waits_for_the_file_a_link_points_to():
    empty = layer_tar({})
    layers = [layer_tar({"x": b"x" * 5000}), empty, layer_tar({"y": b"y"}), empty]
    diffs = diffs_of(layers)
    chains = chain_ids(diffs)
    # position 3 (a link to position 1's layer.tar) is needed; position 1 is not, but its file must travel
    node = set(chains[:3])
    archive, config = legacy_archive(layers, link_duplicates=True, dir_names=["5" * 64, "9" * 64, "6" * 64, "0" * 64])
    out, _flt = run_filter(
        archive, diffs, {diffs[3]}, image_id="sha256:" + hashlib.sha256(config).hexdigest(), guess_legacy_dirs=False
    )
    load_check(out, node)


def test_first_push_streams_without_spooling(layers):
    """Nothing on the node: every unidentified folder is needed, so none is held back."""
    diffs = diffs_of(layers)
    archive, _ = legacy_archive(layers)
    out, flt = run_filter(archive, diffs, set(diffs), guess_legacy_dirs=False)
    assert flt.spooled == 0
    load_check(out, set())


def test_mixed_unknown_folders_are_hashed_to_decide(layers):
    """Unknown folder names and a node holding some layers: folders are identified by their content."""
    diffs = diffs_of(layers)
    chains = chain_ids(diffs)
    node = set(chains[:3])
    needed = {diffs[3], diffs[4]}
    archive, _ = legacy_archive(layers, dir_names=[f"{i:x}" * 64 for i in (9, 3, 7, 1, 5)])
    out, flt = run_filter(archive, diffs, needed, guess_legacy_dirs=False)
    assert flt.spooled >= 1
    load_check(out, node)
    assert sorted(d for d in flt.sent) == sorted(needed)  # the hashed ones are identified


def test_repeated_layer_links_keep_their_target():
    """docker save writes a second copy of a layer as a symlink to the first folder's layer.tar."""
    empty = layer_tar({})
    data = layer_tar({"x": b"x" * 5000})
    layers = [data, empty, layer_tar({"y": b"y"}), empty]
    diffs = diffs_of(layers)
    chains = chain_ids(diffs)
    archive, _ = legacy_archive(layers, link_duplicates=True)
    for present in (set(), {chains[0]}, set(chains[:3])):
        needed = {diffs[i] for i in missing_layers(diffs, present)}
        for guess in (True, False):
            out, _ = run_filter(archive, diffs, needed, guess_legacy_dirs=guess)
            load_check(out, present)


@pytest.mark.parametrize("present", [0, 2, 5])
def test_oci_layout_filters_by_blob_name(layers, present):
    diffs = diffs_of(layers)
    node = set(chain_ids(diffs)[:present])
    needed = {diffs[i] for i in missing_layers(diffs, node)}
    archive = oci_archive(layers, tag="src/img:1")
    out, flt = run_filter(archive, diffs, needed, rename_to="incoming/img:abc")
    load_check(out, node, expect_tags=["incoming/img:abc"])
    index = json.loads(tarfile.open(fileobj=io.BytesIO(out)).extractfile("index.json").read())
    notes = index["manifests"][0]["annotations"]
    assert notes["io.containerd.image.name"] == "docker.io/incoming/img:abc"
    assert notes["org.opencontainers.image.ref.name"] == "abc"
    assert sorted(flt.dropped) == sorted(set(diffs) - needed)


def test_long_names_and_pax_headers_pass_through(layers):
    """Entries with PAX headers (long names) stay intact and keep their extended header."""
    diffs = diffs_of(layers)
    archive, _ = legacy_archive(
        layers, extra={"x" * 150 + ".txt": b"long name", "caf\u00e9.json": b"{}"}, fmt=tarfile.PAX_FORMAT
    )
    out, _ = run_filter(archive, diffs, set(diffs[3:]))
    names = tarfile.open(fileobj=io.BytesIO(out)).getnames()
    assert "x" * 150 + ".txt" in names and "caf\u00e9.json" in names


@pytest.mark.parametrize("cut", [100, 600, 30000, -1030])
def test_a_cut_off_archive_is_an_error(layers, cut):
    diffs = diffs_of(layers)
    archive, _ = legacy_archive(layers)
    flt = ArchiveFilter(diffs, set(diffs))
    flt.feed(archive[:cut])
    with pytest.raises(ValueError, match="cut off"):
        flt.finish()


def test_estimate_bytes_is_an_upper_bound():
    # one history entry per layer: exact sizes (+10%, +1 MiB per needed layer)
    assert estimate_bytes([100, 200, 300], [False, False, True]) == int(300 * 1.1) + (1 << 20)
    # more history entries than layers (steps without a layer, size 0): each size counted when any
    # position it may belong to is needed
    sizes = [100, 0, 200, 0, 50]
    bound = estimate_bytes(sizes, [False, False, True])
    assert bound >= int(50 * 1.1) + (1 << 20)
    assert estimate_bytes(sizes, [False, False, False]) == 0


# -- against the real engine on this machine ---------------------------------------------------------------


@pytest.mark.lab
def test_real_save_filtered_loads_to_same_id(test_images):
    """`docker save` of an image this engine has, every layer dropped: `docker load` still recreates it."""
    import docker

    client = docker.from_env()
    image = client.images.get(test_images.v1)
    diffs = image.attrs["RootFS"]["Layers"]
    assert len(diffs) >= 3
    flt = ArchiveFilter(diffs, set(), rename_to="sparkdeploy-test-incoming/layers:probe")
    body = io.BytesIO()
    for chunk in client.api.get_image(image.id, chunk_size=1 << 20):
        body.writelines(flt.feed(chunk))
    body.writelines(flt.finish())
    assert flt.spooled == 0, "engine 20.10 folder names were not recognised"
    assert len(flt.dropped) == len(diffs) and body.tell() < 64 * 1024
    try:
        client.images.load(body.getvalue())
        assert client.images.get("sparkdeploy-test-incoming/layers:probe").id == image.id
    finally:
        client.images.remove("sparkdeploy-test-incoming/layers:probe", noprune=True)
