"""What `init` reads on a new node, in ONE command: a constant bash script and a parser.

The node's GPU (nvidia-smi), its machine-id and hostname, every interface with its addresses, MTU and state
(`ip -j addr`), the RDMA devices and the network interface each belongs to (/sys/class/infiniband/*/device/net,
else `rdma -j link`), the link speed of each ConnectX-7 port (ethtool) and the GID table (show_gids, else
sysfs). A DGX Spark's ConnectX-7 shows each physical port twice, once per PCIe half (enp1s0f1np1 and
enP2p1s0f1np1, RDMA devices rocep1s0f1 and roceP2p1s0f1): the two names are grouped into one Port here.

These facts belong with doctor's in sparkdeploy/facts/ once that package exists (see the report of issue 26);
the parsers are doctor's (doctor/parsers.py), reused.

In the lab the GPU, the RDMA devices and the link speed come from stand-ins that say SIMULATED; a node's
facts list what was simulated, and `init` prints it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from sparkdeploy.facts.parsers import (
    SECTION,
    Section,
    parse_ethtool_speed,
    parse_ip_json,
    parse_show_gids,
    rocev2_gid_index,
)

# `sec NAME CMD...`: CMD's stdout, stderr and exit code as sections (doctor/parsers.parse_sections reads them).
PRELUDE = (
    "sec() { local n=$1 t rc; shift; t=$(mktemp); printf '\\n%s %s\\n' '" + SECTION + '\' "$n"; "$@" 2>"$t"; '
    "rc=$?; printf '\\n%s %s.err\\n' '" + SECTION + '\' "$n"; cat "$t"; rm -f "$t"; '
    "printf '\\n%s %s.rc %s\\n' '" + SECTION + '\' "$n" "$rc"; }\n'
)

SCRIPT = (
    PRELUDE
    + r"""
export PATH="$PATH:/usr/sbin:/sbin"
sec machine_id cat /etc/machine-id
sec hostname hostname
sec gpu nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
sec addr ip -j addr show
sec links ip -d -j link show
rdma_sys() {
  for d in /sys/class/infiniband/*; do
    [ -d "$d" ] || continue
    for n in "$d"/device/net/*; do [ -e "$n" ] && echo "${d##*/} ${n##*/}"; done
  done
}
sec rdma_sys rdma_sys
sec rdma_link rdma -j link show
gids() {
  if command -v show_gids >/dev/null 2>&1; then show_gids; return; fi
  for d in /sys/class/infiniband/*; do
    [ -d "$d" ] || continue; dev=${d##*/}
    for p in "$d"/ports/*; do port=${p##*/}
      for g in "$p"/gids/*; do idx=${g##*/}; gid=$(cat "$g" 2>/dev/null) || continue
        case "$gid" in 0000:0000:0000:0000:0000:0000:0000:0000|"") continue;; esac
        typ=$(cat "$p/gid_attrs/types/$idx" 2>/dev/null); ndev=$(cat "$p/gid_attrs/ndevs/$idx" 2>/dev/null)
        case "$typ" in *v2*) ver=v2;; *) ver=v1;; esac
        echo "$dev $port $idx $gid $ver ${ndev:--}"
      done
    done
  done
}
sec gids gids
for n in /sys/class/net/en*; do [ -e "$n" ] && sec "ethtool:${n##*/}" ethtool "${n##*/}"; done
true
"""
)
TIMEOUT_S = 60
GB10 = "GB10"

# en[P<domain>]p<bus>s<slot>f<function>[np<port>]: the PCI domain is what differs between a port's two names.
PORT_NAME = re.compile(r"^en(?:P(?P<domain>\d+))?(?P<key>p\d+s\d+f\d+)(?:np\d+)?$")
HCA_NAME = re.compile(r"^roce(?:P(?P<domain>\d+))?(?P<key>p\d+s\d+f\d+)$")


@dataclass
class Port:
    """One physical ConnectX-7 port: its interface names and RDMA devices (domain 0's first)."""

    key: str  # the PCI bus/slot/function both names share, e.g. p1s0f1
    names: list[str] = field(default_factory=list)
    hcas: list[str] = field(default_factory=list)
    up: bool = False
    speed_mbps: int | None = None
    mtu: int | None = None
    addresses: list[str] = field(default_factory=list)  # IPv4 "ip/prefix" on any of its names
    address_iface: str = ""  # the name that holds the first address
    gid_index: int | None = None  # RoCE v2 GID of its first IPv4 address on its first HCA

    @property
    def name(self) -> str:
        return self.names[0]

    def to_json(self) -> dict:
        return {
            "port": self.key,
            "names": self.names,
            "hcas": self.hcas,
            "up": self.up,
            "speed_mbps": self.speed_mbps,
            "mtu": self.mtu,
            "addresses": self.addresses,
            "gid_index": self.gid_index,
        }


@dataclass
class NodeFacts:
    host: str  # the management address we connected to
    host_key: str = ""  # its SSH host key fingerprint
    hostname: str = ""
    machine_id: str = ""
    gpus: list[str] = field(default_factory=list)
    gpu_error: str = ""
    driver: str = ""
    ports: list[Port] = field(default_factory=list)
    mgmt_iface: str = ""  # the interface holding `host`
    addresses: dict[str, list[str]] = field(default_factory=dict)  # every interface's IPv4 "ip/prefix"
    simulated: list[str] = field(default_factory=list)  # gpu, rdma, link-speed: stand-ins answered
    max_mtu: dict[str, int] = field(default_factory=dict)  # the largest MTU each interface takes

    @property
    def gb10(self) -> bool:
        return any(GB10 in g for g in self.gpus)

    @property
    def up_ports(self) -> list[Port]:
        return [p for p in self.ports if p.up]

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "host_key": self.host_key,
            "hostname": self.hostname,
            "machine_id": self.machine_id,
            "gpus": self.gpus,
            "gpu_error": self.gpu_error,
            "driver": self.driver,
            "mgmt_iface": self.mgmt_iface,
            "ports": [p.to_json() for p in self.ports],
            "simulated": self.simulated,
        }


def _port_key(name: str) -> tuple[str, int] | None:
    m = PORT_NAME.match(name)
    return (m.group("key"), int(m.group("domain") or 0)) if m else None


def _hca_order(hca: str) -> tuple[int, str]:
    m = HCA_NAME.match(hca)
    return (int(m.group("domain") or 0) if m else 0, hca)


def _max_mtu(sec: Section | None) -> dict[str, int]:
    try:
        rows = json.loads(sec.out) if sec is not None and sec.rc == 0 and sec.out.strip() else []
    except ValueError:
        return {}
    return {
        str(r["ifname"]): int(r["max_mtu"])
        for r in rows
        if isinstance(r, dict) and r.get("ifname") and isinstance(r.get("max_mtu"), int)
    }


def _hca_netdevs(secs: dict[str, Section]) -> tuple[dict[str, str], bool]:
    """{hca: netdev} from sysfs, else from `rdma -j link` (the lab's stand-in: simulated)."""
    found: dict[str, str] = {}
    sys_sec = secs.get("rdma_sys")
    for line in (sys_sec.out if sys_sec else "").splitlines():
        words = line.split()
        if len(words) == 2:
            found[words[0]] = words[1]
    if found:
        return found, False
    link = secs.get("rdma_link")
    simulated = False
    try:
        rows = json.loads(link.out) if link and link.rc == 0 and link.out.strip() else []
    except ValueError:
        rows = []
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("ifname") and row.get("netdev"):
            found[str(row["ifname"])] = str(row["netdev"])
            simulated = simulated or bool(row.get("simulated"))
    return found, simulated


def parse(host: str, secs: dict[str, Section], host_key: str = "") -> NodeFacts:
    """The sections of SCRIPT's output -> NodeFacts. Pure: tested on real and stand-in output."""
    f = NodeFacts(host=host, host_key=host_key)
    mid = secs.get("machine_id")
    f.machine_id = mid.out.strip() if mid and mid.rc == 0 else ""
    name = secs.get("hostname")
    f.hostname = name.out.strip().splitlines()[0] if name and name.out.strip() else ""
    gpu = secs.get("gpu")
    if gpu is None or gpu.rc != 0:
        f.gpu_error = "nvidia-smi not found" if gpu and gpu.rc == 127 else ((gpu.err or gpu.out).strip() if gpu else "")
        f.gpu_error = f.gpu_error.splitlines()[-1] if f.gpu_error else "nvidia-smi failed"
    else:
        for line in gpu.out.splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) == 2 and cells[0]:
                f.gpus.append(cells[0])
                f.driver = cells[1]
        if "SIMULATED" in gpu.err + gpu.out:
            f.simulated.append("gpu")
    links = parse_ip_json(secs["addr"].out) if "addr" in secs else {}
    for ifname, link in links.items():
        v4 = [a for a in link.addresses if ":" not in a]
        f.addresses[ifname] = v4
        if any(a.split("/")[0] == host for a in v4):
            f.mgmt_iface = ifname
    f.max_mtu = _max_mtu(secs.get("links"))
    hca_net, rdma_simulated = _hca_netdevs(secs)
    if rdma_simulated:
        f.simulated.append("rdma")
    # A CX7 port: an interface some RDMA device belongs to, and its twin (same bus/slot/function, other domain).
    rdma_keys = {k[0] for k in map(_port_key, hca_net.values()) if k}
    names: dict[str, list[tuple[int, str]]] = {}
    for ifname in sorted(set(links) | set(hca_net.values())):
        found = _port_key(ifname)
        if found is not None and (ifname in hca_net.values() or found[0] in rdma_keys):
            names.setdefault(found[0], []).append((found[1], ifname))
    ports: dict[str, Port] = {}
    gids = parse_show_gids(secs["gids"].out) if "gids" in secs else []
    for pci in sorted(names):
        port = ports.setdefault(pci, Port(pci))
        port.names = [n for _, n in sorted(names[pci])]
        port.hcas = sorted((h for h, n in hca_net.items() if n in port.names), key=_hca_order)
        for ifname in port.names:
            if ifname not in links:
                continue
            link = links[ifname]
            port.up = port.up or link.up
            port.mtu = port.mtu or link.mtu
            v4 = [a for a in link.addresses if ":" not in a and a not in port.addresses]
            if v4 and not port.addresses:
                port.address_iface = ifname
            port.addresses += v4
            sec = secs.get(f"ethtool:{ifname}")
            speed = parse_ethtool_speed(sec.out) if sec else None
            if speed and (port.speed_mbps is None or speed > port.speed_mbps):
                port.speed_mbps = speed
            if sec and "SIMULATED" in sec.out and "link-speed" not in f.simulated:
                f.simulated.append("link-speed")
        if port.addresses and port.hcas:
            port.gid_index = rocev2_gid_index(gids, port.hcas[0], port.addresses[0].split("/")[0])
    f.ports = list(ports.values())
    return f
