"""Fill fresh lab nodes' Docker engines by copying one node's image store (`lab up --seed`): lab setup only.

Why: without a registry, every empty node gets each engine image by `images push`, whose `docker load` unpacks
and hashes every layer again on each node (CPU-bound on a 2-core machine, docs/benchmarks.md), so four nodes
cost four times one. The nodes of one lab hold byte-identical images, so after the push to the first node (the real
path, over SSH) the others get a copy of its image store (`/var/lib/docker/image` and `overlay2`, read from its
volume while its dockerd is stopped, so the copy is consistent), which skips the unpacking and hashing. Only a
node whose engine holds no image at all and uses the same storage driver is seeded; any other is left to the
push that follows, which also checks every node's image ID against this machine's.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from sparkdeploy.errors import StepFailed
from sparkdeploy.lab import nodes
from sparkdeploy.lab.spec import LabSpec

if TYPE_CHECKING:  # the docker SDK's types only: no import at run time
    from docker import DockerClient
    from docker.models.containers import Container


STORE_PARTS = ("image", "overlay2")  # the image and layer databases; containers, networks, volumes stay out


def _exec(container: Container, *argv: str) -> tuple[int, str]:
    return nodes.exec_text(container, list(argv))


def _empty_engine(container: Container) -> bool:
    code, out = _exec(container, "docker", "images", "-aq")
    return code == 0 and out == ""


def seed(
    client: DockerClient, spec: LabSpec, source: str, targets: list[str], node_image: str, say: Callable[[str], None]
) -> list[str]:
    """Copy `source`'s image store into every fresh node of `targets`; returns the nodes seeded."""
    src = nodes.find_container(client, spec, source)
    if src is None:
        raise StepFailed(f"lab node {source} is not up: run `sparkdeploy lab up` first")
    driver = nodes.storage_driver(src)
    fresh = []
    for name in targets:
        container = nodes.find_container(client, spec, name)
        if container is not None and nodes.storage_driver(container) == driver and _empty_engine(container):
            fresh.append((name, container))
    if not fresh:
        return []
    say(f"seeding {', '.join(n for n, _ in fresh)} with {source}'s image store ({driver})")
    everyone = [src] + [c for _, c in fresh]
    for container in everyone:
        _exec(container, "lab-service", "stop", "dockerd")
    try:
        volumes = {spec.volume_name(source): {"bind": "/src", "mode": "ro"}}
        for i, (name, _) in enumerate(fresh):
            volumes[spec.volume_name(name)] = {"bind": f"/dst{i}", "mode": "rw"}
        # cp -a keeps the layers' whiteouts (device nodes) and opaque-dir xattrs: the nodes' own capabilities
        script = (
            'set -e; pids=""; for d in /dst*; do (rm -rf "$d/image" "$d/overlay2" && cd /src && cp -a '
            + " ".join(STORE_PARTS)
            + ' "$d"/) & pids="$pids $!"; done; for p in $pids; do wait "$p"; done'
        )
        copier = client.containers.create(
            node_image,
            ["-c", script],
            entrypoint="/bin/sh",
            volumes=volumes,
            cap_add=["ALL"],
            cap_drop=["SYS_RESOURCE"],
            security_opt=["seccomp=unconfined", "apparmor=unconfined"],
            network_mode="none",
            labels=spec.labels(),
        )
        try:
            copier.start()
            status = copier.wait().get("StatusCode")
            if status != 0:
                said = copier.logs(tail=5).decode(errors="replace").strip()
                raise StepFailed(f"copying {source}'s image store failed (exit {status}): {said}")
        finally:
            copier.remove(force=True)
    finally:
        with ThreadPoolExecutor(len(everyone)) as pool:
            started = list(pool.map(lambda c: _exec(c, "lab-service", "start", "dockerd"), everyone))
    bad = [f"{c.name}: {out}" for c, (code, out) in zip(everyone, started, strict=False) if code != 0]
    if bad:
        raise StepFailed("dockerd did not restart after seeding: " + "; ".join(bad))
    return [n for n, _ in fresh]
