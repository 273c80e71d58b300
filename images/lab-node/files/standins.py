#!/usr/bin/python3
"""SIMULATED hardware tools of a sparkdeploy lab node (a virtual DGX Spark with no GPU and no RDMA NIC).

One file, installed under several names (nvidia-smi, ibv_devinfo, ibv_devices, rdma, show_gids, ethtool):
the name it is called by picks the tool. Everything that can be real is read from the node at run time, so
faults injected into the real parts show up here as on a Spark: the fabric interface's address gives the
RoCEv2 GID, its MTU gives the RDMA active_mtu, its link state gives PORT_ACTIVE / PORT_DOWN.

Every output is marked SIMULATED where a parser of the real output does not look: a banner on nvidia-smi's
table, `board_id` of ibv_devinfo, header lines, a trailing "(SIMULATED)" on rdma lines, `"simulated": true`
in JSON, and on stderr for nvidia-smi's CSV queries (so `--format=csv,noheader` stays one clean line per GPU).

Node facts come from /etc/sparkdeploy-lab/node.env (written by lab-node-init from the container's
environment); /etc/sparkdeploy-lab/gpu.json may override GPU values for fault injection, e.g.
{"temperature.gpu": 95, "memory.used": 120000}.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import uuid

NODE_ENV = "/etc/sparkdeploy-lab/node.env"
GPU_OVERRIDES = "/etc/sparkdeploy-lab/gpu.json"
MARK = "SIMULATED (sparkdeploy lab stand-in: no such hardware on this node)"
LINK_SPEED_MBPS = 200000  # one ConnectX-7 QSFP port of a DGX Spark
DRIVER_VERSION = "580.95.05"
CUDA_VERSION = "13.0"


def node_env() -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        with open(NODE_ENV) as fh:
            for line in fh:
                key, sep, value = line.strip().partition("=")
                if sep:
                    values[key] = value
    except OSError:
        pass
    return values


def fabric_iface() -> str:
    return node_env().get("SPARKDEPLOY_LAB_FABRIC_IFACE") or "eth1"


def hcas() -> list[str]:
    return [h for h in node_env().get("SPARKDEPLOY_LAB_HCAS", "rocep1s0f1,roceP2p1s0f1").split(",") if h]


def read_sys(iface: str, name: str, default: str = "") -> str:
    try:
        with open(f"/sys/class/net/{iface}/{name}") as fh:
            return fh.read().strip()
    except OSError:
        return default


def ipv4_addresses(iface: str) -> list[str]:
    ip = shutil.which("ip") or "/usr/sbin/ip"
    try:
        out = subprocess.run(
            [ip, "-j", "-4", "addr", "show", "dev", iface], capture_output=True, text=True, check=False
        ).stdout
        return [a["local"] for entry in json.loads(out or "[]") for a in entry.get("addr_info", [])]
    except (OSError, ValueError, KeyError):
        return []


def link_up(iface: str) -> bool:
    return read_sys(iface, "operstate") == "up"


def guid(hca: str) -> str:
    """A node GUID per HCA made from the interface MAC (EUI-64, as mlx5 does); the twin differs in byte 0."""
    mac = [int(x, 16) for x in read_sys(fabric_iface(), "address", "00:00:00:00:00:00").split(":")]
    twin = hcas().index(hca) if hca in hcas() else 0
    return f"{mac[0] ^ (twin << 4):02x}{mac[1]:02x}{mac[2]:02x}fffe{mac[3]:02x}{mac[4]:02x}{mac[5]:02x}"


def fmt_guid(raw: str) -> str:
    return ":".join(raw[i : i + 4] for i in range(0, 16, 4))


# -- nvidia-smi ------------------------------------------------------------------------------------------


def gpu_values() -> dict[str, object]:
    host = os.uname().nodename
    values: dict[str, object] = {
        "index": 0,
        "name": "NVIDIA GB10",
        "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{host}.sparkdeploy-lab")),
        "driver_version": DRIVER_VERSION,
        "pci.bus_id": "0000000F:01:00.0",
        "memory.total": 122570,  # MiB: ~128 GB of unified LPDDR5x shared by CPU and GPU
        "memory.used": 0,
        "temperature.gpu": 41,
        "utilization.gpu": 0,
        "power.draw": 4.63,
        "compute_cap": "12.1",
        "count": 1,
        "persistence_mode": "Enabled",
        "pstate": "P8",
    }
    try:
        with open(GPU_OVERRIDES) as fh:
            values.update(json.load(fh))
    except (OSError, ValueError):
        pass
    values["memory.free"] = int(values["memory.total"]) - int(values["memory.used"])
    return values


UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB", "utilization.gpu": "%", "power.draw": "W"}


def nvidia_smi(args: list[str]) -> int:
    values = gpu_values()
    query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "csv")
    if query is None and "--query-gpu" in args:
        query = args[args.index("--query-gpu") + 1]
    if query is not None:
        return nvidia_smi_query(values, query, fmt)
    if "-L" in args or "--list-gpus" in args:
        print(f"GPU 0: {values['name']} (UUID: {values['uuid']}) [SIMULATED]")
        return 0
    if "--version" in args:
        print(
            f"NVIDIA-SMI version  : {DRIVER_VERSION} (SIMULATED)\nDRIVER version      : {DRIVER_VERSION}\n"
            f"CUDA Version        : {CUDA_VERSION}"
        )
        return 0
    if args and args[0] not in ("-q", "--query"):
        print(f"nvidia-smi (SIMULATED): unsupported arguments: {' '.join(args)}", file=sys.stderr)
        return 2
    if args:
        print(
            f"{MARK}\n\nAttached GPUs : 1\nGPU {values['pci.bus_id']}\n    Product Name : {values['name']}\n"
            f"    GPU UUID : {values['uuid']}\n    Driver Version : {values['driver_version']}\n"
            f"    FB Memory Usage\n        Total : {values['memory.total']} MiB\n"
            f"        Used : {values['memory.used']} MiB\n    Temperature\n"
            f"        GPU Current Temp : {values['temperature.gpu']} C"
        )
        return 0
    print(table(values))
    return 0


def nvidia_smi_query(values: dict[str, object], query: str, fmt: str) -> int:
    fields = [f.strip() for f in query.split(",") if f.strip()]
    unknown = [f for f in fields if f not in values]
    if unknown:
        print(f'Field "{unknown[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    options = {o.strip() for o in fmt.split(",")}
    if "csv" not in options:
        print(f"nvidia-smi (SIMULATED): only --format=csv is simulated, not {fmt}", file=sys.stderr)
        return 2
    units = "nounits" not in options
    if "noheader" not in options:
        print(", ".join(f"{f} [{UNITS[f]}]" if f in UNITS else f for f in fields))
    cells = []
    for f in fields:
        value = values[f]
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        cells.append(f"{text} {UNITS[f]}" if units and f in UNITS else text)
    print(", ".join(cells))
    print(f"nvidia-smi: {MARK}", file=sys.stderr)
    return 0


def _row(*cells: tuple[str, int]) -> str:
    """One table row: each (text, width) cell right-aligned in its column, as nvidia-smi draws it."""
    return "|" + "|".join(text.rjust(width)[:width] for text, width in cells) + "|"


def table(v: dict[str, object]) -> str:
    now = datetime.datetime.now().strftime("%a %b %d %H:%M:%S %Y")
    widths = (41, 24, 22)
    rule = "+" + "+".join("-" * w for w in widths) + "+"
    power = f"{round(float(v['power.draw']))}W /  N/A  "
    return "\n".join(
        [
            f"{now}       ",
            f"*** {MARK} ***",
            "+" + "-" * 89 + "+",
            "| "
            + f"NVIDIA-SMI {DRIVER_VERSION}".ljust(30)
            + f"Driver Version: {DRIVER_VERSION}".ljust(31)
            + f"CUDA Version: {CUDA_VERSION}".ljust(26)
            + " |",
            rule,
            "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
            "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
            "|" + "+".join("=" * w for w in widths) + "|",
            _row((f"   0  {v['name']}".ljust(37) + "On  ", 41), (f"{v['pci.bus_id']} Off ", 24), ("N/A ", 22)),
            _row(
                (f" N/A   {v['temperature.gpu']}C    {v['pstate']}".ljust(30) + power, 41),
                (f"{v['memory.used']}MiB / {v['memory.total']}MiB ", 24),
                (f"{v['utilization.gpu']}%      Default ", 22),
            ),
            rule,
            "",
            "+" + "-" * 89 + "+",
            "| " + "Processes: none (SIMULATED GPU)".ljust(88) + "|",
            "+" + "-" * 89 + "+",
        ]
    )


# -- RDMA ------------------------------------------------------------------------------------------------


def rdma_mtu(mtu: int) -> str:
    """RoCE's active MTU is the largest IB MTU that fits the Ethernet MTU (4096 needs jumbo frames)."""
    for size, code in ((4096, 5), (2048, 4), (1024, 3), (512, 2)):
        if mtu >= size + 96:  # RoCE headers
            return f"{size} ({code})"
    return "256 (1)"


def ibv_devinfo(args: list[str]) -> int:
    iface = fabric_iface()
    wanted = args[args.index("-d") + 1] if "-d" in args else None
    if "-l" in args:
        print(f"{len(hcas())} HCAs found:")
        for hca in hcas():
            print(f"\t{hca}")
        return 0
    up = link_up(iface)
    mtu = int(read_sys(iface, "mtu", "1500") or 1500)
    for hca in hcas():
        if wanted and hca != wanted:
            continue
        print(
            f"hca_id:\t{hca}\n\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t28.45.1200\n"
            f"\tnode_guid:\t\t\t{fmt_guid(guid(hca))}\n\tsys_image_guid:\t\t\t{fmt_guid(guid(hca))}\n"
            f"\tvendor_id:\t\t\t0x02c9\n\tvendor_part_id:\t\t\t4129\n\thw_ver:\t\t\t\t0x0\n"
            f"\tboard_id:\t\t\tSIMULATED_SPARKDEPLOY_LAB\n\tphys_port_cnt:\t\t\t1\n"
            f"\t\tport:\t1\n"
            f"\t\t\tstate:\t\t\t{'PORT_ACTIVE (4)' if up else 'PORT_DOWN (1)'}\n"
            f"\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tactive_mtu:\t\t{rdma_mtu(mtu)}\n"
            f"\t\t\tsm_lid:\t\t\t0\n\t\t\tport_lid:\t\t0\n\t\t\tport_lmc:\t\t0x00\n"
            f"\t\t\tlink_layer:\t\tEthernet\n"
        )
    if wanted and wanted not in hcas():
        print(f"IB device '{wanted}' wasn't found", file=sys.stderr)
        return 255
    return 0


def ibv_devices(args: list[str]) -> int:
    print("    device          \t   node GUID   (SIMULATED)")
    print("    ------          \t----------------")
    for hca in hcas():
        print(f"    {hca:<16}\t{guid(hca)}")
    return 0


def rdma(args: list[str]) -> int:
    as_json = "-j" in args or "-json" in args
    args = [a for a in args if not a.startswith("-")]
    obj = args[0] if args else "link"
    iface = fabric_iface()
    up = link_up(iface)
    rows = []
    for index, hca in enumerate(hcas()):
        if obj == "link":
            rows.append(
                {
                    "ifindex": index,
                    "ifname": hca,
                    "port": 1,
                    "state": "ACTIVE" if up else "DOWN",
                    "physical_state": "LINK_UP" if up else "DISABLED",
                    "netdev": iface,
                }
            )
        elif obj == "dev":
            rows.append(
                {
                    "ifindex": index,
                    "ifname": hca,
                    "node_type": "ca",
                    "fw": "28.45.1200",
                    "node_guid": fmt_guid(guid(hca)),
                    "sys_image_guid": fmt_guid(guid(hca)),
                }
            )
        else:
            print(f'rdma (SIMULATED): object "{obj}" is not simulated (link, dev are)', file=sys.stderr)
            return 1
    if as_json:
        print(json.dumps([dict(r, simulated=True) for r in rows]))
        return 0
    for r in rows:
        if obj == "link":
            print(
                f"link {r['ifname']}/1 state {r['state']} physical_state {r['physical_state']} "
                f"netdev {r['netdev']} (SIMULATED)"
            )
        else:
            print(
                f"{r['ifindex']}: {r['ifname']}: node_type ca fw {r['fw']} node_guid {r['node_guid']} "
                f"sys_image_guid {r['sys_image_guid']} (SIMULATED)"
            )
    return 0


def show_gids(args: list[str]) -> int:
    """GIDs as mlx5 fills the table: link-local v1/v2 from the MAC, then v1/v2 per IPv4 address."""
    iface = fabric_iface()
    mac = read_sys(iface, "address", "00:00:00:00:00:00").split(":")
    eui = [int(mac[0], 16) ^ 2] + [int(x, 16) for x in mac[1:3]] + [0xFF, 0xFE] + [int(x, 16) for x in mac[3:]]
    link_local = "fe80:0000:0000:0000:" + ":".join(f"{eui[i]:02x}{eui[i + 1]:02x}" for i in range(0, 8, 2))
    entries = [(link_local, "", "v1"), (link_local, "", "v2")]
    for addr in ipv4_addresses(iface):
        mapped = ipaddress.IPv6Address(f"::ffff:{addr}").exploded
        entries += [(mapped, addr, "v1"), (mapped, addr, "v2")]
    print("DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV\t(SIMULATED)")
    print("---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---")
    count = 0
    for hca in hcas():
        if args and args[0] != hca:
            continue
        for index, (gid, ipv4, ver) in enumerate(entries):
            print(f"{hca}\t1\t{index}\t{gid}\t{ipv4:<15}\t{ver}\t{iface}")
            count += 1
    print(f"n_gids_found={count}")
    return 0


# -- ethtool ---------------------------------------------------------------------------------------------


def ethtool(args: list[str]) -> int:
    """The real ethtool, except the fabric link's speed: a veth reports 10000Mb/s, a CX7 port 200000Mb/s."""
    real = "/usr/sbin/ethtool"
    if len(args) != 1 or args[0] != fabric_iface():
        os.execv(real, [real] + args)
    result = subprocess.run([real] + args, capture_output=True, text=True)
    sys.stderr.write(result.stderr)
    for line in result.stdout.splitlines():
        if line.strip().startswith("Speed:"):
            line = f"\tSpeed: {LINK_SPEED_MBPS}Mb/s (SIMULATED: the lab link underneath is a veth)"
        elif line.strip().startswith("Port:"):
            line = "\tPort: Direct Attach Copper"
        print(line)
    return result.returncode


TOOLS = {
    "nvidia-smi": nvidia_smi,
    "ibv_devinfo": ibv_devinfo,
    "ibv_devices": ibv_devices,
    "rdma": rdma,
    "show_gids": show_gids,
    "ethtool": ethtool,
}


def main() -> int:
    name = os.path.basename(sys.argv[0])
    tool = TOOLS.get(name)
    if tool is None:
        print(f"standins.py: call me as one of {', '.join(TOOLS)}", file=sys.stderr)
        return 2
    return tool(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
