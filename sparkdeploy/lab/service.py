"""A service container of the lab beside its nodes (the model hub, hub.py; the registry, registry_server.py): on the
management network only, at a fixed address, reused while its config hash label matches, replaced otherwise,
and waited for until its URL answers 200. `lab down` removes it with the rest (the lab's labels); the nodes'
listing skips it (no node label)."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import docker

from sparkdeploy.errors import StepFailed
from sparkdeploy.lab.spec import CONFIG_LABEL, LabSpec

if TYPE_CHECKING:  # the docker SDK's types only: no import at run time
    from docker import DockerClient
    from docker.models.containers import Container


ROLE_LABEL = "io.sparkdeploy.lab.role"
READY_TIMEOUT_S = 30.0


def reusable(
    client: DockerClient, name: str, config: str, on_replace: Callable[[], None] = lambda: None
) -> Container | None:
    """The container `name` while its config label is `config`; one built from another config is removed
    (on_replace is told first). None when there is none to reuse."""
    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        return None
    if (container.labels or {}).get(CONFIG_LABEL) == config:
        return container
    on_replace()
    container.remove(force=True)
    return None


def create(
    client: DockerClient, spec: LabSpec, *, role: str, name: str, image: str, ip: str, config: str, **options: Any
) -> Container:
    """A new service container `name` (hostname and role label `role`) at `ip` on the management network,
    restarted unless stopped. options: create_container's `command`, or create_host_config's (`cap_add`,
    `binds`)."""
    api = client.api
    command = options.pop("command", None)
    host_config = api.create_host_config(
        network_mode=spec.mgmt_network, init=True, restart_policy={"Name": "unless-stopped"}, **options
    )
    networking = api.create_networking_config(
        {spec.mgmt_network: api.create_endpoint_config(ipv4_address=ip)}  # type: ignore[arg-type]  # docker-stubs: one EndpointConfig; the SDK takes them by network
    )
    labels = dict(spec.labels(), **{CONFIG_LABEL: config, ROLE_LABEL: role})
    created = api.create_container(
        image,
        name=name,
        hostname=role,
        detach=True,
        labels=labels,
        command=command,
        host_config=host_config,
        networking_config=networking,
    )
    return client.containers.get(created["Id"])


def start(container: Container, role: str, url: str, shown: str, timeout: float = READY_TIMEOUT_S) -> None:
    """Start the container if it is not running, then wait until `url` answers 200; a container that stops or
    does not answer in time fails with its last log lines (`shown`: the address the message names)."""
    container.reload()
    if container.status != "running":
        container.start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        container.reload()
        if container.status not in ("running", "created") or time.monotonic() > deadline:
            logs = container.logs(tail=20).decode(errors="replace")
            raise StepFailed(f"lab {role} {container.name} does not answer on {shown}:\n{logs}")
        time.sleep(0.3)


def image_id(client: DockerClient, tag: str) -> str:
    """The ID of an image the engine has (docker-stubs type Image.id Optional: an image the engine lists has one)."""
    found = client.images.get(tag).id
    if not found:
        raise StepFailed(f"the Docker engine lists {tag} without an ID")
    return found
