"""Fixtures for tests/images: with the ONE shared session lab (`lab`, tests/conftest.py), small test images
built on this machine FROM the lab's debian-base, removed from this machine and from the nodes at the end of
the session.
"""

from __future__ import annotations

import io
import random
import tarfile
from dataclasses import dataclass

import pytest

from sparkdeploy.images.push_progress import PushProgress

TEST_REPO = "sparkdeploy-test/push"
TEST_LABEL_NAME = "push-test"
CHANGED_FILE_BYTES = 1_000_000  # the small file that changes between v1 and v2 (random: zstd cannot shrink it)


@pytest.fixture(scope="session")
def lab_inventory(lab):
    from sparkdeploy.config.inventory import load_inventory

    return load_inventory(str(lab.spec.inventory_path))


@dataclass
class PushTestImages:
    v1: str  # base + 2 random layers + the small file
    v2: str  # v1 with the small file changed: only the top layer differs
    big: str  # v1's layers + a 24 MB random layer: long enough a transfer to cut midway
    base: str
    ids: dict[str, str]
    repo: str = TEST_REPO
    changed_bytes: int = CHANGED_FILE_BYTES

    def all(self) -> list[str]:
        return [self.v1, self.v2, self.big]


def _context(small: bytes, big: bool) -> io.BytesIO:
    dockerfile = (
        "ARG BASE\nFROM ${BASE}\n"
        "RUN head -c 3000000 /dev/urandom > /a.bin\n"
        "RUN head -c 2000000 /dev/urandom > /b.bin\n"
        "COPY small.bin /small.bin\n" + ("RUN head -c 24000000 /dev/urandom > /big.bin\n" if big else "")
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile.encode()), ("small.bin", small)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def _build(client, tag: str, base: str, small: bytes, big: bool = False) -> str:
    from sparkdeploy.images.definitions import LABEL

    for chunk in client.api.build(
        fileobj=_context(small, big),
        custom_context=True,
        tag=tag,
        rm=True,
        forcerm=True,
        buildargs={"BASE": base},
        labels={LABEL: TEST_LABEL_NAME},
        decode=True,
    ):
        if "error" in chunk:
            raise RuntimeError(f"building {tag}: {chunk['error']}")
    return client.images.get(tag).id


def remove_from_nodes(lab, refs: list[str]) -> None:
    """Untag our test images on every node, with the partial images a cut push of them left (never forced:
    nothing else is touched)."""
    quoted = " ".join(refs)
    partials = "".join(
        f"docker image ls -q --filter label=io.sparkdeploy.partial-of={ref} | sort -u | "
        f"xargs -r docker image rm >/dev/null 2>&1; "
        for ref in refs
        if ref.startswith("sha256:")
    )
    for node in lab.nodes:
        lab.ssh(
            node,
            f"docker image rm {quoted} >/dev/null 2>&1; {partials}"
            f"docker image ls -q --filter reference='sparkdeploy-incoming/*' | sort -u | "
            f"xargs -r docker image rm >/dev/null 2>&1; true",
            check=False,
        )


@pytest.fixture
def forget_on_nodes(lab):
    """Untag refs (tags or IDs) on every node, so the next push has to send them."""
    return lambda *refs: remove_from_nodes(lab, list(refs))


@pytest.fixture(scope="session")
def test_images(lab):
    import docker

    from sparkdeploy.images.build import ensure_image

    client = docker.from_env()
    base = ensure_image("debian-base", client, progress=lambda _line: None)
    rnd = random.Random(20)
    small_v1 = rnd.randbytes(CHANGED_FILE_BYTES)
    small_v2 = rnd.randbytes(CHANGED_FILE_BYTES)
    images = PushTestImages(f"{TEST_REPO}:v1", f"{TEST_REPO}:v2", f"{TEST_REPO}:big", base, {})
    images.ids["v1"] = _build(client, images.v1, base, small_v1)
    images.ids["v2"] = _build(client, images.v2, base, small_v2)
    images.ids["big"] = _build(client, images.big, base, small_v1, big=True)
    layers = {k: client.images.get(getattr(images, k)).attrs["RootFS"]["Layers"] for k in ("v1", "v2", "big")}
    assert layers["v1"][:-1] == layers["v2"][:-1], "the build cache did not reuse v1's layers for v2"
    assert layers["big"][:-1] == layers["v1"], "big is not v1 plus one layer"
    remove_from_nodes(lab, images.all() + [f"{TEST_REPO}:moving", *images.ids.values()])
    yield images
    remove_from_nodes(lab, images.all() + [f"{TEST_REPO}:moving", *images.ids.values()])
    for ref in images.all() + [f"{TEST_REPO}:moving"]:
        try:
            client.images.remove(ref)
        except docker.errors.ImageNotFound:
            pass
    client.images.prune(filters={"dangling": True, "label": f"io.sparkdeploy.image={TEST_LABEL_NAME}"})


def interface_bytes(lab, node) -> dict[str, int]:
    """rx+tx bytes so far of the node's management and fabric interfaces (by their addresses), read in the node
    container: compared before and after a push, they show which link its bytes took."""
    script = (
        "for d in /sys/class/net/*; do i=${d##*/}; a=$(ip -o -4 addr show dev $i | awk '{print $4}'); "
        'echo "$a $(cat $d/statistics/rx_bytes) $(cat $d/statistics/tx_bytes)"; done'
    )
    out = lab.docker_exec(node, "sh", "-c", script).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            ip = parts[0].split("/")[0]
            if ip == node.mgmt_ip:
                found["mgmt"] = int(parts[1]) + int(parts[2])
            elif ip == node.fabric_ip.split("/")[0]:
                found["fabric"] = int(parts[1]) + int(parts[2])
    return found


class CutAfter(PushProgress):
    """Calls `action` once, when `limit` bytes have been reported (the streams' archive bytes, or what the
    receivers got off the wire for `images push --from`): a cut at a known point of a real push."""

    def __init__(self, limit: int, action):
        super().__init__()
        self.limit, self.action, self.seen, self.done = limit, action, 0, False

    def advance(self, node, raw=0, wire=0):
        self.seen += raw
        if not self.done and self.seen >= self.limit:
            self.done = True
            self.action()
