"""The lab's model hub container: hub_server.py over the generated repositories (hub_repo.py).

It runs the lab-node image (already built for the nodes: python3 and tc, nothing new to build), on the
management network only (MGMT .5), like the internet is reached from a Spark over its LAN port, never over
the CX7 link. Its egress is shaped with tc to HUB_RATE_MBIT, a tenth of what the lab's fabric carries for one
SSH stream on the development machines (see docs/benchmarks.md), so the lab shows why copying over the fabric matters.
The lab's HF_TOKEN is the token that opens its gated repository (a 0600 file in the container).

A lab service (service.py): reused while its config hash (image, repositories, rate, token digest, server code)
matches, replaced otherwise.
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdeploy.errors import StepFailed
from sparkdeploy.lab import hub_repo, service
from sparkdeploy.lab.spec import LabSpec

if TYPE_CHECKING:  # the docker SDK's types only: no import at run time
    from docker import DockerClient
    from docker.models.containers import Container


HUB_HOST = 5  # MGMT .5: away from the gateway (.1) and the nodes (.11 up)
HUB_PORT = 80
HUB_RATE_MBIT = 50  # one SSH stream over the lab's fabric moves ~60 MB/s (~500 Mbit/s) on the 2-core machines
SERVER = Path(__file__).with_name("hub_server.py")
LAYOUT = 1  # bump when create() changes in a way the hash fields do not show


def hub_ip(spec: LabSpec) -> str:
    return str(ipaddress.IPv4Network(spec.mgmt_subnet)[HUB_HOST])


def endpoint(spec: LabSpec) -> str:
    """What HF_ENDPOINT is for the lab's nodes (written into the lab inventory as cluster.hf_endpoint)."""
    return f"http://{hub_ip(spec)}" + ("" if HUB_PORT == 80 else f":{HUB_PORT}")


def container_name(spec: LabSpec) -> str:
    return f"{spec.prefix}-hub"


def _token(secrets_path: Path) -> str:
    for line in secrets_path.read_text().splitlines():
        if line.startswith("HF_TOKEN="):
            return line.split("=", 1)[1].strip()
    return ""


def _config_hash(image_id: str, repos: Path, token: str, rate: int) -> str:
    data = [
        image_id,
        str(repos),
        str(rate),
        hashlib.sha256(token.encode()).hexdigest(),
        hashlib.sha256(SERVER.read_bytes()).hexdigest(),
        str(LAYOUT),
    ]
    return hashlib.sha256("\n".join(data).encode()).hexdigest()[:16]


def _put_token(container: Container, token: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("srv/hub-secret/token")
        data = (token + "\n").encode()
        info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    if not container.put_archive("/", buf.getvalue()):
        raise StepFailed(f"could not install the hub token into {container.name}")


def ensure(
    client: DockerClient,
    spec: LabSpec,
    image_tag: str,
    secrets_path: Path,
    say: Callable[[str], None],
    rate_mbit: int = HUB_RATE_MBIT,
) -> Container:
    """Create or reuse the hub container; returns it running and answering."""
    repos = hub_repo.ensure_repos()
    token = _token(secrets_path)
    image_id = service.image_id(client, image_tag)
    chash = _config_hash(image_id, repos, token, rate_mbit)
    name = container_name(spec)
    container = service.reusable(
        client, name, chash, lambda: say(f"hub: replacing {name} (image, repositories, rate or token changed)")
    )
    if container is None:
        say(f"hub: {name} on {hub_ip(spec)} (management network only, egress shaped to {rate_mbit} Mbit/s)")
        # tc first: a hub that could not be shaped must not serve at full speed (the benchmark would lie).
        script = (
            f"tc qdisc replace dev eth0 root tbf rate {int(rate_mbit)}mbit burst 256kb latency 400ms "
            f"&& exec python3 /srv/hub/hub_server.py /srv/hub/repos {HUB_PORT} /srv/hub-secret/token"
        )
        container = service.create(
            client,
            spec,
            role="hub",
            name=name,
            image=image_tag,
            ip=hub_ip(spec),
            config=chash,
            command=["sh", "-c", script],
            cap_add=["NET_ADMIN"],
            binds=[f"{repos}:/srv/hub/repos:ro", f"{SERVER}:/srv/hub/hub_server.py:ro"],
        )
        _put_token(container, token)
    service.start(container, "hub", endpoint(spec) + "/_lab/stats", endpoint(spec))
    return container


def stats(spec: LabSpec) -> dict[str, Any]:
    """What the hub has served since it started: {"requests", "bytes", "repos": {id: {"bytes", "files"}}}."""
    with urllib.request.urlopen(endpoint(spec) + "/_lab/stats", timeout=5) as resp:
        served: dict[str, Any] = json.loads(resp.read())
        return served
