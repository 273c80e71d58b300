"""`lab up` and `lab down`: the order of the steps, progress output, and nothing else (status: nodestatus.py).

up: keys -> lab images (built once, content-hash tags) -> networks -> node containers (reused when their
config hash matches, started when stopped, replaced otherwise) -> wait for sshd and the inner dockerd ->
known_hosts, secrets.env, inventory.yaml -> the model hub (hub.py) -> engine images into the nodes. Each step
checks before it acts, so a second `up` changes nothing and an interrupted one is finished by the next.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker
from rich.console import Console
from rich.markup import escape

from sparkdeploy import paths
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.images.build import docker_client, ensure_image
from sparkdeploy.images.definitions import LABEL
from sparkdeploy.images.push_progress import RichPushProgress
from sparkdeploy.lab import bare, engine_images, hub, network, nodes, seed
from sparkdeploy.lab import ssh_keys as keys
from sparkdeploy.lab.inventory_writer import ensure_secrets, write_inventory
from sparkdeploy.lab.nodestatus import NodeStatus, status
from sparkdeploy.lab.spec import INSTANCE_ENV, LAB_LABEL, NAME_LABEL, NODE_IMAGE, LabSpec

_console = Console(stderr=True, highlight=False)


def _say(msg: str) -> None:
    _console.print("[dim]lab:[/dim] " + escape(msg), soft_wrap=True)


@contextmanager
def _step(what: str):
    """A spinner for steps that may take more than a few seconds (image builds, node boot)."""
    with _console.status(what, spinner="dots"):
        yield


@contextmanager
def _lab_lock(spec: LabSpec):
    """One `lab up`/`down` of a given lab at a time on this machine, whatever the state folder."""
    path = Path(tempfile.gettempdir()) / f"sparkdeploy-lab-{spec.qualified_name}.lock"
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"waiting for another `lab up/down` of lab {spec.name} to finish")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


@dataclass
class UpResult:
    spec: LabSpec
    inventory: str
    nodes: list[NodeStatus]
    images: list[engine_images.LoadResult] = field(default_factory=list)
    created: list[str] = field(default_factory=list)  # node names whose container was (re)created
    started: list[str] = field(default_factory=list)  # node names started by this run
    seeded: list[str] = field(default_factory=list)  # node names whose image store was copied (spec.seed)
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase (CLI summary, benchmark)


# -- up ------------------------------------------------------------------------------------------------------


def _lab_images(client, rebuild: bool, image: str = NODE_IMAGE) -> str:
    if rebuild:
        with _step("rebuilding debian-base (debootstrap, about a minute)"):
            ensure_image("debian-base", client, progress=_say, force=True)
    with _step(f"{image} image (built once, then reused)"):
        return ensure_image(image, client, progress=_say, force=rebuild)


def _prune_replaced_lab_images(client, current_tag: str) -> None:
    """Drop lab-node images of older definitions (and ones a rebuild left untagged) once no container uses
    them; Docker refuses to remove an image a container still uses, so another lab's nodes keep theirs."""
    for image in client.images.list(filters={"label": f"{LABEL}={NODE_IMAGE}"}):
        if current_tag in image.tags:
            continue
        try:
            client.images.remove(image.id)
        except docker.errors.APIError:  # in use, or removed by someone else meanwhile
            pass


def _check_names(client, spec: LabSpec) -> None:
    """A container holding a lab node's name but not labelled as this lab's is someone else's: stop."""
    for node in spec.node_specs():
        container = nodes.find_container(client, spec, node.name)
        if container is not None and (container.labels or {}).get(NAME_LABEL) != spec.qualified_name:
            raise ConfigError(
                Problem(
                    "docker",
                    f"container {container.name}",
                    "exists and is not this lab's",
                    f"remove it (docker rm -f {container.name}) or choose another --name",
                )
            )


def _adopt_keys(client, spec: LabSpec) -> None:
    """The keys of an existing lab win over this state folder's (see ssh_keys.py): adopt them, don't replace."""
    have_client = False
    for container in sorted(nodes.list_containers(client, spec), key=lambda c: c.name):
        found = nodes.read_keys(container)
        if "host" in found:
            keys.store_keypair(keys.host_key_path(spec.directory, nodes.node_name(container)), *found["host"])
        if "client" in found and not have_client:
            keys.store_keypair(keys.client_key_path(spec.directory), *found["client"])
            have_client = True


def _remove_extra_nodes(client, spec: LabSpec) -> None:
    wanted = {n.name for n in spec.node_specs()}
    for container in nodes.list_containers(client, spec):
        if nodes.node_name(container) not in wanted:
            _say(f"removing {container.name} (beyond --nodes {spec.nodes})")
            container.remove(force=True)
            try:
                client.volumes.get(spec.volume_name(nodes.node_name(container))).remove(force=True)
            except docker.errors.NotFound:
                pass


def _ensure_node(client, spec: LabSpec, plan: nodes.LabContainerSpec, result: UpResult):
    name = plan.node.name
    container = nodes.find_container(client, spec, name)
    if container is not None and not nodes.is_current(container, spec, plan):
        _say(f"{name}: replacing {container.name} (image, keys, addresses or networks changed)")
        container.remove(force=True)
        container = None
    if container is None:
        container = nodes.create(client, spec, plan)
        result.created.append(name)
    container.reload()
    if container.status != "running":
        try:
            container.start()
        except docker.errors.APIError as exc:  # e.g. a leftover whose network vanished in an engine restart
            _say(f"{name}: leftover container does not start ({exc.explanation}); recreating it")
            container.remove(force=True)
            container = nodes.create(client, spec, plan)
            result.created.append(name)
            container.start()
        result.started.append(name)
    return container


def _phase_timer(start: float):
    last = [start]

    def mark() -> float:
        now = time.monotonic()
        spent, last[0] = now - last[0], now
        return spent

    return mark


def up(
    spec: LabSpec | None = None,
    rebuild: bool = False,
    before_replace: Callable[[list[str]], None] = lambda nodes: None,
) -> UpResult:
    """Bring the lab up (idempotent). Returns what it found and did. before_replace: called with the nodes whose
    container this run removes (--rebuild, fewer --nodes, a node whose image, keys or networks changed) before
    any is removed; it may refuse (raise), e.g. when a deployment serves there (deploy/serving.py)."""
    spec = spec or LabSpec()
    with _lab_lock(spec):
        return _up(spec, rebuild, before_replace)


def _doomed(client, spec: LabSpec, rebuild: bool, plans: dict[str, nodes.LabContainerSpec]) -> list[str]:
    """The nodes whose running container this run removes."""
    out = []
    for container in nodes.list_containers(client, spec):
        name = nodes.node_name(container)
        if container.status == "running" and (
            rebuild or name not in plans or not nodes.is_current(container, spec, plans[name])
        ):
            out.append(name)
    return sorted(out)


def _up(spec: LabSpec, rebuild: bool, before_replace: Callable[[list[str]], None] = lambda nodes: None) -> UpResult:
    from sparkdeploy.config.inventory import load_inventory  # the inventory schema: ~18 ms that `lab --help` skips

    t0 = time.monotonic()
    client = docker_client()
    paths.state_folder(path=spec.directory)
    os.chmod(spec.directory, 0o700)
    _check_names(client, spec)
    _adopt_keys(client, spec)

    client_key = keys.client_key(spec.directory)
    host_keys = {n.name: keys.host_key(spec.directory, n.name) for n in spec.node_specs()}

    if rebuild:
        before_replace(_doomed(client, spec, True, {}))
        for container in nodes.list_containers(client, spec):
            container.remove(force=True)
    image_tag = _lab_images(client, rebuild, spec.node_image)
    image_id = client.images.get(image_tag).id
    assert image_id, "an image docker has has its ID"
    mark = _phase_timer(t0)
    phases = {"lab images": mark()}

    nets = network.ensure_networks(client, spec, say=_say)
    mgmt_id, fabric_id = nets["mgmt"].id, nets["fabric"].id
    assert mgmt_id and fabric_id, "a network docker listed or created has its ID"
    plans = {
        node.name: nodes.LabContainerSpec(
            node, image_id, image_tag, mgmt_id, fabric_id, host_keys[node.name], client_key
        )
        for node in spec.node_specs()
    }
    doomed = _doomed(client, spec, False, plans)
    if doomed:
        before_replace(doomed)
    _remove_extra_nodes(client, spec)

    result = UpResult(spec, str(spec.inventory_path), [], phases=phases)
    containers = {}
    for node in spec.node_specs():
        containers[node.name] = _ensure_node(client, spec, plans[node.name], result)
    phases["networks and containers"] = mark()
    with _step(f"waiting for sshd and dockerd on {', '.join(containers)}"):
        for node in spec.node_specs():
            nodes.wait_ready(containers[node.name], node)
    phases["boot"] = mark()

    secrets_path = ensure_secrets(spec)
    if spec.bare:  # no inventory, no known_hosts: `sparkdeploy init` makes them, as on new Sparks
        hub.ensure(client, spec, image_tag, secrets_path, _say)
        result.inventory = str(bare.write_notes(spec, hub.endpoint(spec)))
        result.nodes, result.seconds = status(spec, client), time.monotonic() - t0
        result.phases = {k: round(v, 1) for k, v in {**phases, "hub": mark()}.items()}
        return result
    keys.write_known_hosts(spec.directory, [(n.mgmt_ip, host_keys[n.name]) for n in spec.node_specs()])
    write_inventory(spec)
    hub.ensure(client, spec, image_tag, secrets_path, _say)
    phases["hub"] = mark()
    if spec.images:
        inventory = load_inventory(str(spec.inventory_path))
        with RichPushProgress(console=_console) as progress:
            if spec.seed and len(inventory.nodes) > 1:  # push to the head, copy its store into the fresh others
                first = inventory.head.name
                engine_images.preload(client, list(spec.images), inventory, _say, progress, nodes=[first])
                phases["engine images: push to " + first] = mark()
                result.seeded = seed.seed(client, spec, first, [n.name for n in inventory.workers], image_tag, _say)
                phases["engine images: seed " + (", ".join(result.seeded) or "none")] = mark()
            result.images = engine_images.preload(client, list(spec.images), inventory, _say, progress)

    phases["engine images"] = mark()
    _prune_replaced_lab_images(client, image_tag)
    result.nodes = status(spec, client)
    result.seconds = time.monotonic() - t0
    result.phases = {k: round(v, 1) for k, v in phases.items()}
    return result


# -- down ----------------------------------------------------------------------------------------------------


def down(spec: LabSpec | None = None, all_labs: bool = False, purge: bool = False) -> dict[str, list[str]]:
    """Remove the lab's containers, networks and volumes (selected by label) and its inventory.

    With all_labs, every lab on this engine (label io.sparkdeploy.lab=1), or only the labs of the developer's
    SPARKDEPLOY_LAB_INSTANCE when it is set. Keys and secrets stay
    (a later `up` reuses them) unless purge is set.
    """
    spec = spec or LabSpec()
    with _lab_lock(spec):
        return _down(spec, all_labs, purge)


def _all_lab_filters(client) -> list[dict]:
    """One filter per lab on this engine; with SPARKDEPLOY_LAB_INSTANCE set, only that instance's labs (a
    developer's `lab down --all` must not take down a lab of another checkout sharing the engine)."""
    everything = {"label": [f"{LAB_LABEL}=1"]}
    objects = [
        *client.containers.list(all=True, filters=everything),
        *client.networks.list(filters=everything),
        *client.volumes.list(filters=everything),
    ]
    names = {(o.attrs.get("Labels") or o.attrs.get("Config", {}).get("Labels") or {}).get(NAME_LABEL) for o in objects}
    instance = os.environ.get(INSTANCE_ENV, "")
    mine = sorted(n for n in names if n and (not instance or n.startswith(f"{instance}-")))
    return [{"label": [f"{LAB_LABEL}=1", f"{NAME_LABEL}={n}"]} for n in mine]


def _down(spec: LabSpec, all_labs: bool, purge: bool) -> dict[str, list[str]]:
    client = docker_client()
    removed: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": []}
    for filters in _all_lab_filters(client) if all_labs else [spec.filters]:
        for container in client.containers.list(all=True, filters=filters):
            container.remove(force=True, v=False)
            removed["containers"].append(container.name or container.short_id)
        removed["networks"] += network.remove_networks(client, filters)
        for volume in client.volumes.list(filters=filters):
            volume.remove(force=True)
            removed["volumes"].append(volume.name)
    for name in ("inventory.yaml", keys.KNOWN_HOSTS):
        (spec.directory / name).unlink(missing_ok=True)
    if purge and spec.directory.is_dir():
        shutil.rmtree(spec.directory)
    return removed
