"""What the fact layer's DAYZERO set (facts/catalog.py) prints on a DGX Spark, built in the real tools' formats
(ip -j addr, sysfs, show_gids, ethtool, nvidia-smi CSV), for the parser and planner tests. One knob per fact a
test varies. (The lab's real output of the same set: tests/facts/samples/lab-bare-dayzero.txt.)"""

from __future__ import annotations

import json

from sparkdeploy.facts.parsers import SECTION

MAC = {"enp1s0f0np0": "4c:bb:47:00:00:10", "enp1s0f1np1": "4c:bb:47:00:00:11"}


def _link(index: int, name: str, up: bool, mtu: int, addrs: list[str]) -> dict:
    flags = ["BROADCAST", "MULTICAST"] + (["UP", "LOWER_UP"] if up else ["NO-CARRIER", "UP"])
    info = []
    for a in addrs:
        ip, _, prefix = a.partition("/")
        info.append({"family": "inet", "local": ip, "prefixlen": int(prefix), "scope": "global", "label": name})
    return {
        "ifindex": index,
        "ifname": name,
        "flags": flags,
        "mtu": mtu,
        "operstate": "UP" if up else "DOWN",
        "link_type": "ether",
        "address": f"4c:bb:47:00:00:{index:02x}",
        "addr_info": info,
    }


def spark_output(
    mgmt: str = "192.168.1.101",
    up_port: str | None = "f1",
    fabric_addr: str | None = None,
    mtu: int = 1500,
    gpu: str = "NVIDIA GB10, 580.95.05",
    gpu_rc: int = 0,
    machine_id: str = "0f3a9c1e2b7d4e5f8a6b1c2d3e4f5a6b",
    hostname: str = "spark-a1b2",
    speed: int = 200000,
) -> str:
    """The sections of one node: a Spark's four CX7 names (two ports x two PCIe halves) and its 10 GbE."""
    links = [
        _link(1, "lo", True, 65536, ["127.0.0.1/8"]),
        _link(2, "enP7s7", True, 1500, [f"{mgmt}/24"]),
    ]
    index = 3
    for domain in ("", "P2"):
        for fn in ("f0", "f1"):
            name = f"en{domain}p1s0{fn}np{fn[1]}"
            up = up_port == fn
            addrs = [fabric_addr] if (up and fabric_addr and not domain) else []
            links.append(_link(index, name, up, mtu, addrs))
            index += 1
    sys_map = "\n".join(f"roce{d}p1s0{fn} en{d}p1s0{fn}np{fn[1]}" for d in ("", "P2") for fn in ("f0", "f1"))
    gids = [
        "DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV",
        "---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---",
    ]
    if fabric_addr and up_port:
        ip = fabric_addr.split("/")[0]
        parts = [int(x) for x in ip.split(".")]
        gid = "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}".format(*parts)
        dev = f"rocep1s0{up_port}"
        net = f"enp1s0{up_port}np{up_port[1]}"
        gids += [
            f"{dev}\t1\t0\tfe80:0000:0000:0000:4ebb:47ff:fe00:0011\t\t\tv1\t{net}",
            f"{dev}\t1\t1\tfe80:0000:0000:0000:4ebb:47ff:fe00:0011\t\t\tv2\t{net}",
            f"{dev}\t1\t2\t{gid}\t{ip}\tv1\t{net}",
            f"{dev}\t1\t3\t{gid}\t{ip}\tv2\t{net}",
        ]
    gpu_name, _, driver = gpu.partition(", ")
    ethtool = ""
    for link in links[2:]:
        up = "LOWER_UP" in link["flags"]
        ethtool += (
            f"\n@@ethtool {link['ifname']}\nSettings for {link['ifname']}:\n\tSpeed: {speed if up else 'Unknown!'}"
            + ("Mb/s" if up else "")
            + f"\n\tLink detected: {'yes' if up else 'no'}\n"
        )
    sys_lines = "\n".join(f"sys {line}" for line in sys_map.splitlines())
    sections = {
        "home": ("/home/spark", "", 0),
        "machine_id": (
            machine_id,
            "" if machine_id else "cat: /etc/machine-id: No such file or directory",
            0 if machine_id else 1,
        ),
        "hostname": (hostname, "", 0),
        "gpu": (
            f"0, {gpu_name}, {driver}, [N/A], [N/A], [N/A], 41" if gpu_rc == 0 else "",
            "" if gpu_rc == 0 else "bash: line 1: nvidia-smi: command not found",
            gpu_rc,
        ),
        "network": (json.dumps(links) + "\n" + ethtool, "", 0),
        "max_mtu": (json.dumps([{"ifname": link["ifname"], "max_mtu": 9978} for link in links[1:]]), "", 0),
        "rdma_netdevs": (sys_lines, "", 0),
        "rdma": ("\n@@gids\n" + "\n".join(gids) + "\n@@devinfo-rc 0", "", 0),
    }
    return render_sections(sections)


def render_sections(sections: dict[str, tuple[str, str, int]]) -> str:
    out = []
    for name, (stdout, stderr, rc) in sections.items():
        out += [f"{SECTION} {name}", stdout, f"{SECTION} {name}.err", stderr, f"{SECTION} {name}.rc {rc}"]
    return "\n".join(out) + "\n"
