"""The lab's container registry: Debian's docker-registry (images/lab-registry) on the management network.

Like the model hub (hub.py), it stands where the Internet's registries stand for a Spark: on the LAN side
(MGMT .6, port 5000), never on the fabric. It speaks plain HTTP, so the lab's node engines, and only they,
list it as an insecure registry (`/etc/docker/daemon.json` in each node container, which dockerd reloads on
SIGHUP): a lab setting, never an owner's default. This machine's own Docker engine is left alone.

`publish` puts an image the lab built into it: on the first node, a one-line `FROM` of the lab's vllm-sim with
a label of its own (a new image ID over the same layers, so no node has it yet), pushed by tag with that node's
`docker push`, then its local tag removed. Registry images are then pulled from a real registry in the lab
(tests/images/test_registry_lab.py). Started on demand (`ensure`): a lab service (service.py).
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkdeploy.errors import StepFailed
from sparkdeploy.images.build import ensure_image
from sparkdeploy.lab import nodes, service
from sparkdeploy.lab.spec import LabSpec

if TYPE_CHECKING:  # the docker SDK's types only: no import at run time
    from docker import DockerClient


REGISTRY_HOST = 6  # MGMT .6: beside the hub (.5), away from the gateway (.1) and the nodes (.11 up)
REGISTRY_PORT = 5000
IMAGE = "lab-registry"
DAEMON_JSON = "/etc/docker/daemon.json"


def address(spec: LabSpec) -> str:
    """HOST:PORT of the lab registry, the first part of its image references."""
    return f"{ipaddress.IPv4Network(spec.mgmt_subnet)[REGISTRY_HOST]}:{REGISTRY_PORT}"


def container_name(spec: LabSpec) -> str:
    return f"{spec.prefix}-registry"


def ensure(client: DockerClient, spec: LabSpec, say: Callable[[str], None] = lambda _line: None) -> str:
    """Start (or reuse) the registry and make every lab node's engine trust it; returns its HOST:PORT."""
    tag = ensure_image(IMAGE, client, progress=say)
    image_id = service.image_id(client, tag)
    name = container_name(spec)
    config = image_id[7:23]
    container = service.reusable(client, name, config)
    if container is None:
        say(f"registry: {name} on {address(spec)} (management network only, plain HTTP)")
        ip = address(spec).split(":")[0]
        container = service.create(client, spec, role="registry", name=name, image=tag, ip=ip, config=config)
    service.start(container, "registry", f"http://{address(spec)}/v2/", address(spec))
    for node in nodes.list_containers(client, spec):  # every node of the lab as it runs (N, whatever --nodes was)
        trust_on_node(client, spec, nodes.node_name(node))
    return address(spec)


def trust_on_node(client: DockerClient, spec: LabSpec, node: str) -> None:
    """The node's dockerd lists the lab registry as insecure (plain HTTP): daemon.json, then SIGHUP (a reload,
    no restart: containers keep running). Idempotent."""
    container = nodes.find_container(client, spec, node)
    if container is None:
        raise StepFailed(f"lab node {node} is not up: run `sparkdeploy lab up` first")
    code, out = nodes.exec_text(container, ["cat", DAEMON_JSON])
    try:
        config = json.loads(out) if code == 0 else {}
    except ValueError:
        config = {}
    wanted = address(spec)
    if wanted in (config.get("insecure-registries") or []):
        return
    config["insecure-registries"] = sorted({*(config.get("insecure-registries") or []), wanted})
    text = json.dumps(config, indent=1)
    script = (
        f"mkdir -p /etc/docker && printf '%s\\n' {shlex.quote(text)} > {DAEMON_JSON} "
        '&& kill -HUP "$(cat /run/docker.pid)"'
    )
    code, out = nodes.exec_text(container, ["sh", "-c", script])
    if code != 0:
        raise StepFailed(f"lab node {node}: could not make dockerd trust {wanted}: {out}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the reload is asynchronous: wait until `docker info` lists it
        code, out = nodes.exec_text(container, ["docker", "info", "--format", "{{json .RegistryConfig.IndexConfigs}}"])
        if code == 0 and wanted in out:
            return
        time.sleep(0.3)
    raise StepFailed(f"lab node {node}: dockerd did not list {wanted} as insecure after SIGHUP")


def publish(client: DockerClient, spec: LabSpec, base_tag: str, repo: str, tag: str, label: str) -> str:
    """Build `FROM base_tag` + LABEL on the first node, push it to the lab registry as repo:tag, drop the local
    tag there; returns the reference pinned with the digest the registry serves."""
    first = spec.node_specs()[0].name
    container = nodes.find_container(client, spec, first)
    if container is None:
        raise StepFailed(f"lab node {first} is not up: run `sparkdeploy lab up` first")
    ref = f"{address(spec)}/{repo}:{tag}"
    dockerfile = f"FROM {base_tag}\nLABEL io.sparkdeploy.lab.published={label}\n"
    script = (
        f"printf '%s' {shlex.quote(dockerfile)} | docker build -q -t {shlex.quote(ref)} - >/dev/null "
        f"&& docker push -q {shlex.quote(ref)} >/dev/null "
        f"&& docker image inspect --format '{{{{json .RepoDigests}}}}' {shlex.quote(ref)} "
        f"&& docker image rm {shlex.quote(ref)} >/dev/null"
    )
    code, text = nodes.exec_text(container, ["sh", "-c", script])
    if code != 0:
        raise StepFailed(f"lab node {first}: could not publish {ref} to the lab registry: {text[-500:]}")
    digests = json.loads(text.splitlines()[0])
    digest = next(d.split("@", 1)[1] for d in digests if d.startswith(f"{address(spec)}/{repo}@"))
    return f"{ref}@{digest}"


def manifest_clients(client: DockerClient, spec: LabSpec, repo: str) -> list[str]:
    """The address of every client the registry served repo's manifest to with a GET (its access log, in the
    combined format: `IP - - [time] "GET /v2/REPO/manifests/REF HTTP/1.1" 200 ...`), in order."""
    logs = client.containers.get(container_name(spec)).logs().decode(errors="replace")
    out = []
    for line in logs.splitlines():
        if f'"GET /v2/{repo}/manifests/' in line and '" 200 ' in line:
            out.append(line.split(" ", 1)[0])
    return out
