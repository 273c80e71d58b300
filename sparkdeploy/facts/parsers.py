"""Parsers for what the node tools print: pure functions, unit-tested against real and stand-in output.

The facts of facts/catalog.py parse their sections with these (doctor's checks read the typed results).

Each parser accepts the real tool's output (nvidia-smi, ibv_devinfo, show_gids, ip -j, ping, ethtool, df)
and the lab stand-ins' (images/lab-node/files/standins.py), which print the same formats plus a SIMULATED
marker where a parser of the real output does not look.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field

SECTION = "@@sparkdeploy-facts@@"  # a section header line of the facts script (facts/script.py)
NA_VALUES = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]"}


# -- the gather protocol: one bash script per node and group, its output split into sections --------------


@dataclass
class Section:
    out: str = ""
    err: str = ""
    rc: int | None = None


def parse_sections(text: str) -> dict[str, Section]:
    """Split `@@sparkdeploy-facts@@ NAME` / `... NAME.err` / `... NAME.rc N` blocks (facts/script.py's `sec`)."""
    sections: dict[str, Section] = {}
    current: tuple[str, str] | None = None
    buf: list[str] = []

    def flush() -> None:
        if current is None:
            return
        name, part = current
        sec = sections.setdefault(name, Section())
        text = "\n".join(buf).strip("\n")
        if part == "out":
            sec.out = text
        elif part == "err":
            sec.err = text

    for line in text.splitlines():
        if line.startswith(SECTION + " "):
            flush()
            buf = []
            words = line[len(SECTION) + 1 :].split()
            if not words:
                current = None
                continue
            name = words[0]
            if name.endswith(".rc"):
                sec = sections.setdefault(name[:-3], Section())
                try:
                    sec.rc = int(words[1])
                except (IndexError, ValueError):
                    sec.rc = None
                current = None
            elif name.endswith(".err"):
                current = (name[:-4], "err")
            else:
                current = (name, "out")
                sections.setdefault(name, Section())
        elif current is not None:
            buf.append(line)
    flush()
    return sections


# -- nvidia-smi ----------------------------------------------------------------------------------------------


def parse_nvidia_smi_csv(text: str, fields: list[str]) -> list[dict[str, str | None]]:
    """`nvidia-smi --query-gpu=F1,F2 --format=csv,noheader,nounits`: one dict per GPU; N/A values are None.

    Lines that do not have one cell per field (warnings, the lab's SIMULATED note if it ever landed on stdout)
    are ignored. A header line (when `noheader` was not given) is skipped.
    """
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            continue
        if cells[0].split(" [")[0] == fields[0]:
            continue  # a header
        rows.append({f: (None if c.lower() in NA_VALUES else c) for f, c in zip(fields, cells, strict=False)})
    return rows


def number(value: object) -> float | None:
    """'122570', '41', '4.63 W', '[N/A]' -> float or None."""
    if value is None:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", str(value))
    return float(m.group(1)) if m else None


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {name: bytes}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+):\s+(\d+)(?:\s+kB)?", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (1024 if line.rstrip().endswith("kB") else 1)
    return out


# -- RDMA ----------------------------------------------------------------------------------------------------


@dataclass
class RdmaPort:
    port: int
    state: str = ""  # PORT_ACTIVE, PORT_DOWN, ...
    active_mtu: int | None = None
    max_mtu: int | None = None
    link_layer: str = ""


@dataclass
class RdmaDevice:
    name: str
    board_id: str = ""
    fw_ver: str = ""
    ports: dict[int, RdmaPort] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return any(p.state.startswith("PORT_ACTIVE") for p in self.ports.values())

    @property
    def simulated(self) -> bool:
        return "SIMULATED" in self.board_id


def parse_ibv_devinfo(text: str) -> dict[str, RdmaDevice]:
    """`ibv_devinfo` (all devices) -> {hca_id: RdmaDevice}."""
    devices: dict[str, RdmaDevice] = {}
    dev: RdmaDevice | None = None
    port: RdmaPort | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or ":" not in line:
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "hca_id":
            dev = devices.setdefault(value, RdmaDevice(value))
            port = None
        elif dev is None:
            continue
        elif key == "port":
            try:
                port = dev.ports.setdefault(int(value), RdmaPort(int(value)))
            except ValueError:
                port = None
        elif key == "board_id":
            dev.board_id = value
        elif key == "fw_ver":
            dev.fw_ver = value
        elif port is not None:
            if key == "state":
                port.state = value.split()[0]
            elif key in ("active_mtu", "max_mtu"):
                m = re.match(r"(\d+)", value)
                setattr(port, key, int(m.group(1)) if m else None)
            elif key == "link_layer":
                port.link_layer = value
    return devices


@dataclass(frozen=True)
class GidEntry:
    dev: str
    port: int
    index: int
    gid: str
    ipv4: str
    version: str  # v1 | v2
    netdev: str


def _ipv4_of_gid(gid: str) -> str:
    try:
        addr = ipaddress.IPv6Address(gid)
    except ValueError:
        return ""
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else ""


def parse_show_gids(text: str) -> list[GidEntry]:
    """`show_gids` (Mellanox/DOCA script, or our sysfs fallback in the same format) -> GID table entries."""
    out = []
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) < 6 or tokens[0] in ("DEV", "---") or not tokens[2].isdigit():
            continue
        if len(tokens) >= 7:
            dev, port, index, gid, ipv4, ver, netdev = tokens[:7]
        else:
            dev, port, index, gid, ver, netdev = tokens[:6]
            ipv4 = ""
        if ver.lower() not in ("v1", "v2"):
            continue
        try:
            out.append(GidEntry(dev, int(port), int(index), gid, ipv4 or _ipv4_of_gid(gid), ver.lower(), netdev))
        except ValueError:
            continue
    return out


def rocev2_gid_index(entries: list[GidEntry], dev: str, ipv4: str) -> int | None:
    for e in entries:
        if e.dev == dev and e.version == "v2" and e.ipv4 == ipv4:
            return e.index
    return None


# -- ip, ethtool, ping, df -----------------------------------------------------------------------------------


@dataclass
class Link:
    name: str
    mtu: int | None
    operstate: str
    flags: list[str]
    addresses: list[str] = field(default_factory=list)  # "ip/prefix"

    @property
    def up(self) -> bool:
        return "UP" in self.flags and self.operstate in ("UP", "UNKNOWN") and "NO-CARRIER" not in self.flags


def parse_ip_json(text: str) -> dict[str, Link]:
    """`ip -j link show` or `ip -j addr show` -> {ifname: Link}."""
    try:
        data = json.loads(text or "[]")
    except ValueError:
        return {}
    links = {}
    for entry in data if isinstance(data, list) else []:
        name = entry.get("ifname")
        if not name:
            continue
        addrs = [f"{a['local']}/{a.get('prefixlen', '')}" for a in entry.get("addr_info", []) if a.get("local")]
        links[name] = Link(name, entry.get("mtu"), str(entry.get("operstate", "")), list(entry.get("flags", [])), addrs)
    return links


def parse_max_mtu(text: str) -> dict[str, int]:
    """`ip -d -j link show`: interface -> the largest MTU it takes (max_mtu; absent where the driver says none)."""
    try:
        rows = json.loads(text) if text.strip() else []
    except ValueError:
        return {}
    return {
        str(r["ifname"]): int(r["max_mtu"])
        for r in (rows if isinstance(rows, list) else [])
        if isinstance(r, dict) and r.get("ifname") and isinstance(r.get("max_mtu"), int)
    }


def parse_rdma_link(text: str) -> tuple[dict[str, str], bool]:
    """`rdma -j link show`: RDMA device -> its netdev, and whether the lab's stand-in answered (SIMULATED)."""
    try:
        rows = json.loads(text) if text.strip() else []
    except ValueError:
        return {}, False
    found: dict[str, str] = {}
    simulated = False
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("ifname") and row.get("netdev"):
            found[str(row["ifname"])] = str(row["netdev"])
            simulated = simulated or bool(row.get("simulated"))
    return found, simulated


def parse_ethtool_speed(text: str) -> int | None:
    """`ethtool IFACE` -> link speed in Mb/s (None when unknown, e.g. link down)."""
    m = re.search(r"^\s*Speed:\s*(\d+)\s*Mb/s", text, re.M)
    return int(m.group(1)) if m else None


@dataclass
class PingResult:
    transmitted: int = 0
    received: int = 0
    errors: int = 0
    rtt_avg_ms: float | None = None
    local_error: str = ""  # e.g. "message too long, mtu=1500"
    frag_needed_mtu: int | None = None  # an ICMP "Frag needed" reply names the path MTU

    @property
    def ok(self) -> bool:
        return self.received > 0


def parse_ping(text: str) -> PingResult:
    r = PingResult()
    m = re.search(r"(\d+) packets transmitted, (\d+) (?:packets )?received(?:, \+(\d+) errors)?", text)
    if m:
        r.transmitted, r.received = int(m.group(1)), int(m.group(2))
        r.errors = int(m.group(3) or 0)
    m = re.search(r"= [\d.]+/([\d.]+)/", text)
    if m:
        r.rtt_avg_ms = float(m.group(1))
    m = re.search(r"local error: (.+)", text)
    if m:
        r.local_error = m.group(1).strip()
    m = re.search(r"Frag needed and DF set \(mtu = (\d+)\)", text)
    if m:
        r.frag_needed_mtu = int(m.group(1))
    return r


def parse_df(text: str) -> dict[str, int | str] | None:
    """`df -PB1 PATH` -> {size, used, avail, mount} in bytes (last line)."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("Filesystem")]
    if not lines:
        return None
    parts = lines[-1].split()
    if len(parts) < 6:
        return None
    try:
        return {"size": int(parts[1]), "used": int(parts[2]), "avail": int(parts[3]), "mount": parts[5]}
    except ValueError:
        return None


def parse_env_lines(text: str) -> dict[str, str]:
    """A Docker --env-file (our rendered node.env): KEY=VALUE lines, comments and blanks skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value
    return out


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:4])


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"
