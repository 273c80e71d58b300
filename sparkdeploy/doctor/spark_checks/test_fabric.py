"""The ConnectX-7 ports the inventory names are up at the MTU `setup network` writes, and its RDMA devices exist."""

from testinfra.host import Host

from sparkdeploy.config.inventory import Node
from sparkdeploy.dayzero.proposal import FABRIC_MTU


def test_ports_up_at_mtu(host: Host, node: Node) -> None:
    for name in node.fabric_ifaces:
        link = host.interface(name).link[0]  # `ip -json link show NAME`
        assert link["operstate"] == "UP", f"{name} is {link['operstate']}"
        assert link["mtu"] == FABRIC_MTU, f"{name} has MTU {link['mtu']}, not {FABRIC_MTU} (sparkdeploy setup network)"


def test_rdma_devices(host: Host, node: Node) -> None:
    listed = host.check_output("ibv_devices")
    for hca in node.hcas:
        assert hca in listed.split(), f"RDMA device {hca} missing (ibv_devices lists: {listed})"
