"""Node containers: one virtual DGX Spark each (sshd + an inner Docker engine, see images/lab-node).

Docker-in-Docker without --privileged (CAP_SYS_RESOURCE cannot be granted on the development and CI machines):
all capabilities but SYS_RESOURCE, no seccomp/apparmor confinement, the host's cgroup tree, and a named volume
for the inner /var/lib/docker so the inner engine can use overlay2 (not possible on the container's own
overlay root) and keeps its images when the node container is recreated. /run is a tmpfs, so every start is
a clean boot (no stale pid files; the node's ready marker lives there).

A container is reused as long as its config hash (image ID, addresses, network IDs, keys, environment)
matches; otherwise it is replaced. That is what makes `lab up` idempotent and lets it cope with leftovers:
a stopped container is started again, one whose network was deleted under it (engine restart, manual
cleanup) fails the hash check and is recreated, keeping its volume.
"""

from __future__ import annotations

import hashlib
import io
import json
import socket
import sys
import tarfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import docker

from sparkdeploy.errors import StepFailed
from sparkdeploy.lab.bare import PASSWORD_IN_NODE, password
from sparkdeploy.lab.spec import CONFIG_LABEL, NODE_LABEL, Filters, LabSpec, NodeSpec
from sparkdeploy.lab.ssh_keys import KeyPair

if TYPE_CHECKING:  # the docker SDK's types only: no import at run time
    from docker import DockerClient
    from docker.models.containers import Container
    from docker.models.volumes import Volume


CLIENT_KEY_COPY = "etc/sparkdeploy-lab/client/lab_ed25519"
HOST_KEY = "etc/ssh/ssh_host_ed25519_key"
SPARK_UID = 1000  # the `spark` user of images/lab-node/Dockerfile
READY = "/run/sparkdeploy-lab/ready"
FAILED = "/run/sparkdeploy-lab/failed"
READY_TIMEOUT_S = 120


@dataclass
class LabContainerSpec:
    """Everything that decides what a node container looks like (its NodeSpec plus image, networks, keys)."""

    node: NodeSpec
    image_id: str
    image_tag: str
    mgmt_net_id: str
    fabric_net_id: str
    host_key: KeyPair
    client_key: KeyPair

    def environment(self, spec: LabSpec) -> dict[str, str]:
        env = {
            "SPARKDEPLOY_LAB": spec.name,
            "SPARKDEPLOY_LAB_NODE": self.node.name,
            "SPARKDEPLOY_LAB_MGMT_IP": self.node.mgmt_ip,
            "SPARKDEPLOY_LAB_FABRIC_IP": self.node.fabric_ip,
            "SPARKDEPLOY_LAB_FABRIC_IFACE": spec.fabric_iface_for(self.node.name),
            "SPARKDEPLOY_LAB_HCAS": ",".join(spec.hcas),
        }
        if spec.bare:  # lab-bare-init renames and empties the link itself: lab-node-init must not look for the IP
            env.update({"SPARKDEPLOY_LAB_FABRIC_IP": "", "SPARKDEPLOY_LAB_BARE": "1"})
        return env

    def config_hash(self, spec: LabSpec) -> str:
        data = {
            "image": self.image_id,
            "env": self.environment(spec),
            "nets": [self.mgmt_net_id, self.fabric_net_id],
            "ips": [self.node.mgmt_ip, self.node.fabric_ip],
            "volume": spec.volume_name(self.node.name),
            "host_key": self.host_key.fingerprint,
            "client_key": self.client_key.fingerprint,
            "layout": 2,  # bump when create() changes in a way the fields above do not show
        }
        if spec.node_memory_mb:  # only when set, so a lab without the limit keeps its nodes
            data["memory_mb"] = spec.node_memory_mb
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def find_container(client: DockerClient, spec: LabSpec, node: str) -> Container | None:
    try:
        return client.containers.get(spec.container_name(node))
    except docker.errors.NotFound:
        return None


def ensure_volume(client: DockerClient, spec: LabSpec, node: str) -> Volume:
    name = spec.volume_name(node)
    try:
        return client.volumes.get(name)
    except docker.errors.NotFound:
        return client.volumes.create(name, labels=spec.labels(node))


def _tar(files: list[tuple[str, bytes, int, int]], dirs: list[tuple[str, int, int]]) -> bytes:
    """A tar of (path, data, mode, uid) files and (path, mode, uid) folders, paths relative to /."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, mode, uid in dirs:
            info = tarfile.TarInfo(path)
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, uid
            tar.addfile(info)
        for path, data, mode, uid in files:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, uid, uid, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def install_keys(container: Container, plan: LabContainerSpec) -> None:
    """Put the node's host key and the client's authorized key in place (before the first start).

    A root-only copy of the client key stays on the node so that `lab up` from another state folder can
    adopt this lab's keys (read_keys) instead of replacing the nodes under whoever else uses them.
    """
    archive = _tar(
        files=[
            (HOST_KEY, plan.host_key.private, 0o600, 0),
            (HOST_KEY + ".pub", (plan.host_key.public + "\n").encode(), 0o644, 0),
            ("home/spark/.ssh/authorized_keys", (plan.client_key.public + "\n").encode(), 0o600, SPARK_UID),
            (CLIENT_KEY_COPY, plan.client_key.private, 0o600, 0),
            (CLIENT_KEY_COPY + ".pub", (plan.client_key.public + "\n").encode(), 0o644, 0),
        ],
        dirs=[("home/spark/.ssh", 0o700, SPARK_UID), ("etc/sparkdeploy-lab/client", 0o700, 0)],
    )
    if not container.put_archive("/", archive):
        raise StepFailed(f"could not install SSH keys into {container.name}")


def install_password(container: Container, spec: LabSpec) -> None:
    """A bare node's password, root-only, read once by lab-bare-init through chpasswd (never a command line)."""
    archive = _tar(files=[(PASSWORD_IN_NODE, password(spec).encode(), 0o600, 0)], dirs=[])
    if not container.put_archive("/", archive):
        raise StepFailed(f"could not install the password into {container.name}")


DAEMON_JSON = "etc/docker/daemon.json"


def nest_engine_cgroups(client: DockerClient, container: Container) -> None:
    """The node's inner Docker puts its containers' cgroups under the node container's own (cgroup-parent), so the
    node's memory limit covers the engine, the guard and anything started over SSH: one node's memory, as on a
    Spark. Only with the cgroupfs driver (its cgroups are /docker/<id>); under systemd's driver the node keeps the
    limit for its own processes and the engines run beside it (said on stderr)."""
    info = client.info()
    if info.get("CgroupDriver") != "cgroupfs":
        print(
            f"lab: the host's Docker uses the {info.get('CgroupDriver')} cgroup driver: the node's memory limit does "
            "not cover its engine containers",
            file=sys.stderr,
        )
        return
    config = json.dumps({"cgroup-parent": f"/docker/{container.id}"}).encode()
    if not container.put_archive("/", _tar(files=[(DAEMON_JSON, config, 0o644, 0)], dirs=[("etc/docker", 0o755, 0)])):
        raise StepFailed(f"could not write {DAEMON_JSON} into {container.name}")


def _read_file(container: Container, path: str) -> bytes | None:
    try:
        stream, _ = container.get_archive("/" + path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            fh = tar.extractfile(member) if member else None
            return fh.read() if fh else None
    except (docker.errors.APIError, tarfile.TarError):
        return None


def read_keys(container: Container) -> dict[str, tuple[bytes, str]]:
    """{"host": (private, public), "client": (private, public)} as installed in a node, where present."""
    found = {}
    for kind, path in (("host", HOST_KEY), ("client", CLIENT_KEY_COPY)):
        private, public = _read_file(container, path), _read_file(container, path + ".pub")
        if private and public:
            found[kind] = (private, public.decode().strip())
    return found


def create(client: DockerClient, spec: LabSpec, plan: LabContainerSpec) -> Container:
    """Create (not start) the node container on both networks with its fixed addresses."""
    api = client.api
    node = plan.node
    volume = ensure_volume(client, spec, node.name)
    # no swap beyond it: a node out of memory stalls or OOM-kills, as a Spark does (None: no limit, as unset)
    memory = f"{spec.node_memory_mb}m" if spec.node_memory_mb else None
    host_config = api.create_host_config(
        mem_limit=memory,
        memswap_limit=memory,
        cap_add=["ALL"],
        cap_drop=["SYS_RESOURCE"],
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        binds=["/sys/fs/cgroup:/sys/fs/cgroup:rw", f"{volume.name}:/var/lib/docker:rw"],
        tmpfs={"/run": "rw,nosuid,nodev,exec,size=256m,mode=755"},
        init=True,
        network_mode=spec.mgmt_network,
    )
    networking = api.create_networking_config(
        {spec.mgmt_network: api.create_endpoint_config(ipv4_address=node.mgmt_ip)}  # type: ignore[arg-type]  # docker-stubs: one EndpointConfig; the SDK takes them by network
    )
    labels = dict(spec.labels(node.name), **{CONFIG_LABEL: plan.config_hash(spec)})
    created = api.create_container(
        plan.image_tag,
        name=spec.container_name(node.name),
        hostname=node.name,
        detach=True,
        labels=labels,
        environment=plan.environment(spec),
        host_config=host_config,
        networking_config=networking,
    )
    try:
        api.connect_container_to_network(created["Id"], spec.fabric_network, ipv4_address=node.fabric_ip)
        container = client.containers.get(created["Id"])
        install_keys(container, plan)
        if spec.bare:
            install_password(container, spec)
        if spec.node_memory_mb:
            nest_engine_cgroups(client, container)
    except BaseException:  # half-made (no fabric link, no keys): never leave it for a later run to reuse
        api.remove_container(created["Id"], force=True)
        raise
    return container


def is_current(container: Container, spec: LabSpec, plan: LabContainerSpec) -> bool:
    """Same config hash, and still attached to the current networks at its addresses (a network deleted
    and recreated since, e.g. by a cleanup while the node was stopped, leaves a stale endpoint)."""
    if (container.labels or {}).get(CONFIG_LABEL) != plan.config_hash(spec):
        return False
    endpoints = container.attrs.get("NetworkSettings", {}).get("Networks") or {}
    for name, net_id, ip in (
        (spec.mgmt_network, plan.mgmt_net_id, plan.node.mgmt_ip),
        (spec.fabric_network, plan.fabric_net_id, plan.node.fabric_ip),
    ):
        ep = endpoints.get(name) or {}
        if ep.get("NetworkID") != net_id or (ep.get("IPAMConfig") or {}).get("IPv4Address") != ip:
            return False
    return True


def exec_text(container: Container, argv: list[str]) -> tuple[int, str]:
    """argv run in the container: its exit code and its output (stdout and stderr), decoded and stripped."""
    code, out = container.exec_run(argv, demux=False)
    data = out if isinstance(out, bytes) else b"".join(out or [])  # bytes unless streamed
    return (-1 if code is None else code), data.decode(errors="replace").strip()


def wait_ready(container: Container, node: NodeSpec, timeout: float = READY_TIMEOUT_S) -> None:
    """Wait for lab-node-init's ready marker, then for sshd to answer on the management IP."""
    deadline = time.monotonic() + timeout
    while True:
        container.reload()
        if container.status != "running":
            logs = container.logs(tail=30).decode(errors="replace")
            raise StepFailed(f"lab node {node.name} stopped while starting (status {container.status}):\n{logs}")
        code, _ = exec_text(container, ["test", "-e", READY])
        if code == 0:
            break
        code, reason = exec_text(container, ["cat", FAILED])
        if code == 0:
            _, log = exec_text(container, ["tail", "-n", "20", "/var/log/sparkdeploy-lab-init.log"])
            raise StepFailed(f"lab node {node.name} failed to start: {reason}\n{log}")
        if time.monotonic() > deadline:
            raise StepFailed(
                f"lab node {node.name} not ready after {timeout:.0f} s "
                f"(see: docker exec {container.name} cat /var/log/sparkdeploy-lab-init.log)"
            )
        time.sleep(0.3)
    while not ssh_banner(node.mgmt_ip):
        if time.monotonic() > deadline:
            raise StepFailed(f"lab node {node.name}: sshd does not answer on {node.mgmt_ip}:22 from this machine")
        time.sleep(0.3)


def ssh_banner(ip: str, port: int = 22, timeout: float = 2.0) -> str:
    """The SSH server's identification line, or "" if nothing answers (a cheap liveness check)."""
    try:
        with socket.create_connection((ip, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(256).decode(errors="replace").strip()
    except OSError:
        return ""


def list_containers(client: DockerClient, spec: LabSpec) -> list[Container]:
    """The lab's node containers (not its hub: that one carries no node label)."""
    filters: Filters = {"label": [*spec.filter_labels, NODE_LABEL]}
    return client.containers.list(all=True, filters=filters)


def node_name(container: Container) -> str:
    return (container.labels or {}).get(NODE_LABEL) or str(container.name)


def storage_driver(container: Container) -> str:
    code, out = exec_text(container, ["head", "-n", "1", "/var/lib/docker/.sparkdeploy-lab-storage-driver"])
    return out if code == 0 else ""
