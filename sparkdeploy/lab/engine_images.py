"""Preload engine images (vllm-sim, litellm-proxy, ...) into each lab node's inner Docker engine.

A lab node starts with an empty inner engine and no registry can fill it, so `lab up` pushes each image the
way `sparkdeploy images push` does (sparkdeploy.images.push): over SSH with the lab's host keys, only the layers
a node lacks, read from the host's layer store and loaded as a pipeline; a node with the image ID is skipped.
Definitions that do not exist (yet) are skipped with a message; the list is open (`--images a,b,c`).
"""

from __future__ import annotations

from dataclasses import dataclass

import docker

from sparkdeploy.errors import ConfigError, SparkdeployError, StepFailed


@dataclass
class LoadResult:
    image: str
    tag: str | None
    loaded: list[str]  # node names that received it now
    present: list[str]  # node names that had it already
    skipped: str = ""  # why the image was not loaded at all


def resolve(name: str, client, say) -> tuple[str | None, str]:
    """(tag, why-skipped) for an image definition: build it if needed (bases first)."""
    from sparkdeploy.images.build import ensure_image
    from sparkdeploy.images.definitions import load_definition

    try:
        load_definition(name)
    except ConfigError:
        return None, f"no definition images/{name}/ in this checkout"
    try:
        return ensure_image(name, client, progress=say), ""
    except (SparkdeployError, docker.errors.DockerException) as exc:
        return None, f"building it failed: {(str(exc).splitlines() or ['?'])[0]}"


def preload(client, names: list[str], inventory, say, progress=None, nodes=None) -> list[LoadResult]:
    """Make every named image present on every node of the lab's inventory (or the named `nodes`).

    `progress`: a sparkdeploy.images.push_progress.PushProgress (bars per node). A node that fails raises
    StepFailed naming it: a lab whose engine images are missing is not up.
    """
    from concurrent.futures import ThreadPoolExecutor

    import difflib  # noqa: F401 - everything the build thread uses is imported here first (thread_imports)
    import sparkdeploy.images.build  # noqa: F401
    import sparkdeploy.images.channel  # noqa: F401
    import sparkdeploy.images.definitions  # noqa: F401
    from sparkdeploy.images.push import push_image
    from sparkdeploy.thread_imports import preload as preload_imports

    preload_imports()
    results = []
    # Builds one after the other on a thread, each push as soon as its image is built: image k+1 builds (apt and
    # pip, mostly waiting on the network) while image k goes to the nodes (disk and SSH). A cold lab's bring-up
    # is mostly these two.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lab-image-build") as builder:
        built = [builder.submit(resolve, name, client, say) for name in names]
        try:
            for name, future in zip(names, built):
                tag, why = future.result()
                results.append(_load(name, tag, why, inventory, nodes, progress, client, push_image))
        except BaseException:
            for future in built:  # a failed push (or Ctrl-C) starts no further build
                future.cancel()
            raise
    return results


def _load(name, tag, why, inventory, nodes, progress, client, push_image) -> LoadResult:
    if tag is None:
        return LoadResult(name, None, [], [], why)
    outcomes = push_image(tag, inventory, nodes, progress, client=client)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise StepFailed("; ".join(f"loading {tag} into lab node {o.node.name}: {o.error}" for o in failed))
    loaded = [o.node.name for o in outcomes if o.value.action == "sent"]
    present = [o.node.name for o in outcomes if o.value.action != "sent"]
    return LoadResult(name, tag, loaded, present)
