"""`lab status`: what each node container is doing, read from the engine and the nodes (changes nothing).

sshd is checked from this machine (its banner on the management IP, as a deploy would reach it), the inner
dockerd and the fabric interface from inside the node.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sparkdeploy.errors import StepFailed
from sparkdeploy.images.build import docker_client
from sparkdeploy.lab import nodes
from sparkdeploy.lab.spec import LabSpec

if TYPE_CHECKING:  # the docker SDK's types only: no import at run time
    from docker import DockerClient
    from docker.models.containers import Container


@dataclass
class NodeStatus:
    node: str
    container: str
    state: str
    mgmt_ip: str = ""
    fabric_ip: str = ""
    fabric_iface: str = ""
    ssh: bool = False
    dockerd: bool = False
    storage_driver: str = ""
    image: str = ""
    started_at: str = ""
    container_id: str = ""


def _fabric_iface(container: Container) -> str:
    code, out = nodes.exec_text(container, ["cat", "/etc/sparkdeploy-lab/node.env"])
    want = ""
    for line in out.splitlines() if code == 0 else []:
        if line.startswith("SPARKDEPLOY_LAB_FABRIC_IFACE="):
            want = line.split("=", 1)[1]
    code = nodes.exec_text(container, ["ip", "link", "show", "dev", want])[0] if want else 1
    return want if code == 0 else ""


def status(spec: LabSpec | None = None, client: DockerClient | None = None) -> list[NodeStatus]:
    """What each node container is doing: state, addresses, and whether sshd and the inner dockerd answer."""
    spec = spec or LabSpec()
    client = client or docker_client()
    found = []
    for container in sorted(nodes.list_containers(client, spec), key=lambda c: c.name or ""):
        attrs = container.attrs
        nets = attrs.get("NetworkSettings", {}).get("Networks") or {}
        st = NodeStatus(
            node=nodes.node_name(container),
            container=container.name or "",
            state=container.status,
            mgmt_ip=(nets.get(spec.mgmt_network) or {}).get("IPAddress", ""),
            fabric_ip=(nets.get(spec.fabric_network) or {}).get("IPAddress", ""),
            image=attrs.get("Config", {}).get("Image", ""),
            started_at=attrs.get("State", {}).get("StartedAt", ""),
            container_id=container.id or "",
        )
        if container.status == "running":
            st.ssh = bool(st.mgmt_ip and nodes.ssh_banner(st.mgmt_ip))
            code, _ = container.exec_run(["docker", "info", "--format", "{{.ServerVersion}}"])
            st.dockerd = code == 0
            st.storage_driver = nodes.storage_driver(container)
            st.fabric_iface = _fabric_iface(container)
        found.append(st)
    return found


def status_dicts(rows: list[NodeStatus]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


def fail_if_not_up(rows: list[NodeStatus], spec: LabSpec) -> None:
    if not rows:
        raise StepFailed(f"lab {spec.name} is not up (run: sparkdeploy lab up)")
    bad = [r.node for r in rows if r.state != "running" or not r.ssh or not r.dockerd]
    if bad:
        raise StepFailed(f"lab {spec.name}: not healthy on {', '.join(bad)} (run: sparkdeploy lab up)")
