"""Preload engine images (vllm-sim, litellm-proxy, ...) into each lab node's inner Docker engine.

A lab node starts with an empty inner engine and no registry can fill it, so `lab up` pushes each image the
way `sparkdeploy images push` does (sparkdeploy.images.push): over SSH with the lab's host keys, only the layers
a node lacks, read from the host's layer store and loaded as a pipeline; a node with the image ID is skipped.
Definitions that do not exist (yet) are skipped with a message; the list is open (`--images a,b,c`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import docker

from sparkdeploy.errors import ConfigError, SparkdeployError, StepFailed
from sparkdeploy.images.build import Progress, ensure_image
from sparkdeploy.images.definitions import load_definition

if TYPE_CHECKING:  # the docker SDK's types only: no import at run time
    from docker import DockerClient

    from sparkdeploy.config.inventory import Inventory
    from sparkdeploy.images.push_progress import PushProgress


@dataclass
class LoadResult:
    image: str
    tag: str | None
    loaded: list[str]  # node names that received it now
    present: list[str]  # node names that had it already
    skipped: str = ""  # why the image was not loaded at all


def resolve(name: str, client: DockerClient, say: Progress) -> tuple[str | None, str]:
    """(tag, why-skipped) for an image definition: build it if needed (bases first)."""
    try:
        load_definition(name)
    except ConfigError:
        return None, f"no definition images/{name}/ in this checkout"
    try:
        return ensure_image(name, client, progress=say), ""
    except (SparkdeployError, docker.errors.DockerException) as exc:
        return None, f"building it failed: {(str(exc).splitlines() or ['?'])[0]}"


def preload(
    client: DockerClient,
    names: list[str],
    inventory: Inventory,
    say: Progress,
    progress: PushProgress | None = None,
    nodes: list[str] | None = None,
) -> list[LoadResult]:
    """Make every named image present on every node of the lab's inventory (or the named `nodes`).

    `progress`: a sparkdeploy.images.push_progress.PushProgress (bars per node). A node that fails raises
    StepFailed naming it: a lab whose engine images are missing is not up.
    """
    from sparkdeploy.images.push import push_image  # push, remote, nodeside: ~60 ms `lab up --help` skips

    results = []
    for name in names:
        tag, why = resolve(name, client, say)
        if tag is None:
            results.append(LoadResult(name, None, [], [], why))
            continue
        outcomes = push_image(tag, inventory, nodes, progress, client=client)
        failed = [o for o in outcomes if not o.ok]
        if failed:
            raise StepFailed("; ".join(f"loading {tag} into lab node {o.node.name}: {o.error}" for o in failed))
        loaded = [o.node.name for o in outcomes if o.value.action == "sent"]
        present = [o.node.name for o in outcomes if o.value.action != "sent"]
        results.append(LoadResult(name, tag, loaded, present))
    return results
