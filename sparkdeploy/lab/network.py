"""The lab's two Docker networks: management (SSH, API) and fabric (jumbo frames, the CX7 link's stand-in).

Fixed subnets make node IPs predictable across runs. The fabric network is `internal` (like a point-to-point
cable it leads nowhere), which also guarantees the nodes' default route goes through the management network,
and it carries `com.docker.network.driver.mtu=9000`, which gives real jumbo frames on the veth pairs.

Leftovers from an earlier run are reused when they match, recreated when they do not (after removing this
lab's containers still attached to them), and a network that is not the lab's but holds the name or overlaps
the subnet is reported as a ConfigError instead of being touched.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import docker
from docker.models.networks import Network
from docker.types import IPAMConfig, IPAMPool

from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.lab.spec import LAB_LABEL, NAME_LABEL, Filters, LabSpec, side_octets

if TYPE_CHECKING:  # the docker SDK's types only: no import at run time
    from docker import DockerClient


MTU_OPTION = "com.docker.network.driver.mtu"
FABRIC_MTU = 9000


@dataclass(frozen=True)
class NetworkWanted:
    kind: str  # "mgmt" | "fabric"
    name: str
    subnet: str
    gateway: str
    internal: bool
    options: dict[str, str]


def wanted_networks(spec: LabSpec) -> list[NetworkWanted]:
    return [
        NetworkWanted("mgmt", spec.mgmt_network, spec.mgmt_subnet, spec.gateway(spec.mgmt_subnet), False, {}),
        NetworkWanted(
            "fabric",
            spec.fabric_network,
            spec.fabric_subnet,
            spec.gateway(spec.fabric_subnet),
            True,
            {MTU_OPTION: str(FABRIC_MTU)},
        ),
    ]


def _matches(net: Network, want: NetworkWanted, spec: LabSpec) -> bool:
    attrs = net.attrs
    configs = (attrs.get("IPAM") or {}).get("Config") or []
    subnets = {c.get("Subnet") for c in configs}
    options = attrs.get("Options") or {}
    return (
        subnets == {want.subnet}
        and bool(attrs.get("Internal")) == want.internal
        and all(options.get(k) == v for k, v in want.options.items())
        and (attrs.get("Labels") or {}).get(NAME_LABEL) == spec.qualified_name
    )


def _is_ours(net: Network, spec: LabSpec) -> bool:
    labels = net.attrs.get("Labels") or {}
    return labels.get(LAB_LABEL) == "1" and labels.get(NAME_LABEL) == spec.qualified_name


def _remove_network(client: DockerClient, net: Network, spec: LabSpec) -> None:
    """Remove one of this lab's networks, first removing this lab's containers that still hold an endpoint."""
    net.reload()
    for cid in net.attrs.get("Containers") or {}:
        try:
            container = client.containers.get(cid)
        except docker.errors.NotFound:
            continue
        if (container.labels or {}).get(NAME_LABEL) == spec.qualified_name:
            container.remove(force=True)
        else:
            net.disconnect(container, force=True)
    net.remove()


def _overlapping(client: DockerClient, subnet: str, name: str) -> list[str]:
    wanted = ipaddress.ip_network(subnet)
    hits = []
    for net in client.networks.list():
        if net.name == name:
            continue
        for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
            try:
                if cfg.get("Subnet") and ipaddress.ip_network(cfg["Subnet"]).overlaps(wanted):
                    hits.append(str(net.name))
            except ValueError:
                continue
    return hits


def free_subnets(client: DockerClient, count: int = 2, second_octets: range | None = None) -> list[str]:
    """`count` 172.30.X.0/24 subnets no Docker network on this engine uses (for extra labs: tests, benchmarks),
    X in `second_octets` (default: spec.side_octets(), SPARKDEPLOY_LAB_SIDE_OCTETS or 100-249).

    Fixed subnets for throw-away labs collide sooner or later with someone's experiment on a shared engine.
    """
    if second_octets is None:
        second_octets = side_octets()
    used = []
    for net in client.networks.list():
        for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
            try:
                used.append(ipaddress.ip_network(cfg["Subnet"]))
            except (KeyError, ValueError):
                continue
    free = []
    for octet in second_octets:
        candidate = ipaddress.ip_network(f"172.30.{octet}.0/24")
        if not any(candidate.overlaps(u) for u in used):
            free.append(str(candidate))
            if len(free) == count:
                return free
    raise ConfigError(Problem("docker", "networks", "no free 172.30.X.0/24 subnet left", "remove unused networks"))


def ensure_networks(
    client: DockerClient, spec: LabSpec, say: Callable[[str], None] = lambda _msg: None
) -> dict[str, Network]:
    """Create or reuse both networks; returns {"mgmt": Network, "fabric": Network}."""
    result: dict[str, Network] = {}
    for want in wanted_networks(spec):
        existing = [n for n in client.networks.list(names=[want.name]) if n.name == want.name]
        for net in existing:
            net.reload()
            if not _is_ours(net, spec):
                raise ConfigError(
                    Problem(
                        "docker",
                        f"network {want.name}",
                        "exists and was not made by this lab",
                        f"remove it (docker network rm {want.name}) or choose another --name",
                    )
                )
            if _matches(net, want, spec):
                result[want.kind] = net
            else:
                say(f"network {want.name}: settings differ from a previous run, recreating it")
                _remove_network(client, net, spec)
        if want.kind in result:
            continue
        clash = _overlapping(client, want.subnet, want.name)
        if clash:
            flag = "--subnet" if want.kind == "mgmt" else "--fabric-subnet"
            raise ConfigError(
                Problem(
                    "docker",
                    flag,
                    f"{want.subnet} overlaps the Docker network(s) {', '.join(clash)}",
                    f"remove them or pass another {flag}",
                )
            )
        ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=want.subnet, gateway=want.gateway)])
        say(f"network {want.name} ({want.subnet}{', MTU 9000' if want.options else ''})")
        result[want.kind] = client.networks.create(
            want.name,
            driver="bridge",
            ipam=ipam,
            internal=want.internal,
            options=want.options,
            labels=spec.labels(),
            check_duplicate=True,
        )
    return result


def remove_networks(client: DockerClient, filters: Filters) -> list[str]:
    """Remove the networks matching `filters` (lab labels), disconnecting anything still attached."""
    removed = []
    for net in client.networks.list(filters=filters):
        net.reload()
        for cid in net.attrs.get("Containers") or {}:
            try:
                net.disconnect(cid, force=True)
            except docker.errors.APIError:
                pass
        net.remove()
        removed.append(str(net.name))
    return removed
