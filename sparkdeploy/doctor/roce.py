"""roce.*: RDMA devices present and ACTIVE, the inventory's HCA names exist, the RoCEv2 GID index of the
fabric IP, and the NCCL_* interface and HCA names of the rendered node.env exist on the node."""

from __future__ import annotations

from sparkdeploy.checks import Result, fail, ok, skip, warn
from sparkdeploy.config.inventory import Node
from sparkdeploy.facts import RdmaFact
from sparkdeploy.facts.parsers import parse_env_lines

from . import network_checks as network
from .doctor_run import DoctorRun

EXPECTED_RDMA_MTU = 4096  # with Ethernet MTU 9000; 1500 gives 1024


def facts(run: DoctorRun, node: Node) -> RdmaFact:
    return run.node_facts(node).rdma or RdmaFact()


def _sim(f: RdmaFact) -> bool:
    return f.simulated


def devices(run: DoctorRun, node: Node) -> Result:
    f = facts(run, node)
    sim = _sim(f)
    expected = "RDMA devices present, ports ACTIVE, active_mtu 4096"
    if f.rc == 127:
        return fail("ibv_devinfo not found", expected, "sudo apt install ibverbs-utils rdma-core (DGX OS ships them)")
    devs = f.devices
    if not devs:
        return fail(
            f"no RDMA device ({f.error or 'ibv_devinfo lists none'})",
            expected,
            "check the ConnectX-7 driver: lsmod | grep mlx5; sudo modprobe mlx5_ib",
        )
    wanted = [d for d in devs.values() if not node.hcas or d.name in node.hcas] or list(devs.values())
    down = [d.name for d in wanted if not d.active]
    mtus = {p.active_mtu for d in wanted for p in d.ports.values() if p.active_mtu}
    measured = ", ".join(f"{d.name} {'ACTIVE' if d.active else 'DOWN'}" for d in wanted)
    if mtus:
        measured += f"; active_mtu {'/'.join(map(str, sorted(mtus)))}"
    if down:
        return fail(
            measured,
            expected,
            f"bring the fabric link up (network.link); check the cable on {', '.join(down)}",
            simulated=sim,
        )
    if mtus and min(mtus) < EXPECTED_RDMA_MTU:
        return warn(
            measured,
            expected,
            "RoCE runs 1024-byte frames on an Ethernet MTU of 1500: set MTU 9000 on the fabric port (network.mtu)",
            simulated=sim,
        )
    return ok(measured, expected, simulated=sim)


def hcas(run: DoctorRun, node: Node) -> Result:
    f = facts(run, node)
    found = sorted(f.devices)
    sim = _sim(f)
    expected = "every inventory hcas name exists on the node"
    if not node.hcas:
        if not found:
            return skip("no hcas in the inventory and no RDMA device")
        return warn(
            f"no hcas in the inventory (node has: {', '.join(found)})",
            "both RoCE twins listed",
            f"set hcas: [{', '.join(found)}] for {node.name}: NCCL with one twin only reached ~3 GB/s "
            "vs ~23.7 GB/s with both",
            simulated=sim,
        )
    missing = [h for h in node.hcas if h not in f.devices]
    if missing:
        return fail(
            f"not on {node.name}: {', '.join(missing)} (has: {', '.join(found) or 'none'})",
            expected,
            f"set hcas: [{', '.join(found)}] for {node.name} in the inventory (names from ibv_devices)",
            simulated=sim,
        )
    return ok(", ".join(node.hcas), expected, simulated=sim)


def gid(run: DoctorRun, node: Node) -> Result:
    """NCCL_IB_GID_INDEX is one value for every HCA: each listed HCA needs a RoCEv2 IPv4 GID at that index.

    On a Spark the two twins of a port are two PCIe functions, each with its own netdev: the fabric IP's GID
    is on the twin whose netdev holds it; the other twin needs an IPv4 address of its own for a RoCEv2 GID.
    """
    f = facts(run, node)
    sim = _sim(f)
    names = [h for h in node.hcas if h in f.devices] or sorted(f.devices)
    if not names:
        return skip("no RDMA device (see roce.devices)")
    found: dict[str, tuple[int, str, str] | None] = {}
    for h in names:
        v2 = [e for e in f.gids if e.dev == h and e.version == "v2" and e.ipv4]
        best = next((e for e in v2 if e.ipv4 == node.fabric_address), v2[0] if v2 else None)
        found[h] = (best.index, best.ipv4, best.netdev) if best else None
    expected = "a RoCEv2 IPv4 GID on every HCA at one index" + (
        f" = gid_index {node.gid_index}" if node.gid_index is not None else ""
    )
    measured = ", ".join(f"{h}: {v[0]} ({v[1]} on {v[2]})" if v else f"{h}: none" for h, v in found.items())
    missing = [h for h, v in found.items() if v is None]
    if missing:
        return fail(
            measured,
            expected,
            f"no RoCEv2 IPv4 GID on {', '.join(missing)}: give its netdev an IPv4 "
            f"address (the fabric IP for {node.fabric_ifaces[0]}), then check with show_gids",
            simulated=sim,
        )
    if not any(v[1] == node.fabric_address for v in found.values()):  # type: ignore[index]  # None values: checked above
        return fail(
            measured,
            expected,
            f"no HCA has a GID for the fabric IP {node.fabric_address}: it must be on "
            "one RoCE port's netdev (network.link)",
            simulated=sim,
        )
    indexes = {v[0] for v in found.values()}  # type: ignore[index]  # None values: checked above
    if len(indexes) > 1:
        return fail(
            measured,
            expected,
            "the HCAs have their RoCEv2 IPv4 GID at different indexes, and "
            "NCCL_IB_GID_INDEX is one value: align the address order on their netdevs",
            simulated=sim,
        )
    (index,) = indexes
    if node.gid_index is not None and node.gid_index != index:
        return fail(measured, expected, f"set gid_index: {index} for {node.name} (NCCL_IB_GID_INDEX)", simulated=sim)
    note = "" if node.gid_index is not None else f" (gid_index not set: NCCL picks; gid_index: {index} pins it)"
    return ok(measured + note, expected, simulated=sim)


def _names_match(wanted: str, have: list[str]) -> list[str]:
    """NCCL name lists: `=a,b` exact, `^a` excludes (not checked), otherwise prefixes; `:port` suffixes cut."""
    if wanted.startswith("^"):
        return []
    exact = wanted.startswith("=")
    missing = []
    for item in wanted.lstrip("=").split(","):
        name = item.split(":")[0].strip()
        if not name:
            continue
        ok_ = name in have if exact else any(h.startswith(name) for h in have)
        if not ok_:
            missing.append(name)
    return missing


def nccl_env(run: DoctorRun, node: Node) -> Result:
    nd = run.node_deployment(node)
    if nd is None or not any(f.name == "node.env" for f in nd.files):
        return skip(f"no node.env rendered for {node.name}")
    env = parse_env_lines(nd.file("node.env").content)
    ifaces = list(network.facts(run, node).links)
    hca_names = sorted(facts(run, node).devices)
    problems, shown = [], []
    for key in (
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "TP_SOCKET_IFNAME",
        "UCX_NET_DEVICES",
        "OMPI_MCA_btl_tcp_if_include",
    ):
        if key in env:
            miss = _names_match(env[key], ifaces)
            shown.append(f"{key}={env[key]}")
            if miss:
                problems.append(f"{key}: no interface {', '.join(miss)}")
    if "NCCL_IB_HCA" in env:
        shown.append(f"NCCL_IB_HCA={env['NCCL_IB_HCA']}")
        miss = _names_match(env["NCCL_IB_HCA"], hca_names)
        if miss:
            problems.append(f"NCCL_IB_HCA: no RDMA device {', '.join(miss)} (has: {', '.join(hca_names) or 'none'})")
    elif env.get("NCCL_IB_DISABLE", "0") != "1":
        problems.append("NCCL_IB_HCA not set: NCCL may use one RoCE twin only")
    expected = "every NCCL_*/GLOO interface and HCA name in node.env exists on the node"
    if problems:
        return fail(
            "; ".join(problems),
            expected,
            f"fix fabric_ifaces / hcas for {node.name} in the inventory (node.env is rendered from them)",
            detail="; ".join(shown),
        )
    return ok("; ".join(shown), expected, simulated=_sim(facts(run, node)))
