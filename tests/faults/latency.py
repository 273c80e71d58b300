"""Added latency on a lab node's management interface, for the slow-LAN fault and benchmarks/slow_lan_up.py.

`tc qdisc ... netem delay` where the kernel has netem; otherwise (the development and CI VMs' kernels are built
without sch_netem) the same delay from nfq_delay.py behind an iptables NFQUEUE rule. Either way every packet the
node sends on that interface (its sshd's, its engines' HTTP answers) waits DELAY_MS: the round trip from this
machine grows by that much.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).with_name("nfq_delay.py")
QUEUE = 17
PIDFILE = "/run/sparkdeploy-nfq-delay.pid"


def _exec(container: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", container, *argv], capture_output=True, text=True, check=check, timeout=60)


def mgmt_iface(container: str, ip: str) -> str:
    for line in _exec(container, "ip", "-o", "-4", "addr", "show").stdout.splitlines():
        if f" {ip}/" in line:
            return line.split()[1]
    raise RuntimeError(f"{container}: no interface holds {ip}")


def add_delay(container: str, iface: str, delay_ms: int) -> str:
    """Delay what the node sends on iface; returns how ("netem" or "nfqueue")."""
    if (
        _exec(
            container, "tc", "qdisc", "add", "dev", iface, "root", "netem", "delay", f"{delay_ms}ms", check=False
        ).returncode
        == 0
    ):
        return "netem"
    subprocess.run(["docker", "cp", str(SCRIPT), f"{container}:/var/tmp/nfq_delay.py"], check=True, capture_output=True)
    _exec(
        container,
        "sh",
        "-c",
        f"python3 /var/tmp/nfq_delay.py {int(delay_ms)} {QUEUE} >/dev/null 2>&1 & echo $! > {PIDFILE}",
    )
    _exec(
        container,
        "iptables",
        "-t",
        "mangle",
        "-I",
        "POSTROUTING",
        "-o",
        iface,
        "-j",
        "NFQUEUE",
        "--queue-num",
        str(QUEUE),
        "--queue-bypass",
    )
    return "nfqueue"


def remove_delay(container: str, iface: str) -> None:
    _exec(container, "tc", "qdisc", "del", "dev", iface, "root", check=False)
    _exec(
        container,
        "iptables",
        "-t",
        "mangle",
        "-D",
        "POSTROUTING",
        "-o",
        iface,
        "-j",
        "NFQUEUE",
        "--queue-num",
        str(QUEUE),
        "--queue-bypass",
        check=False,
    )
    _exec(container, "sh", "-c", f"[ -f {PIDFILE} ] && kill $(cat {PIDFILE}); rm -f {PIDFILE}; true", check=False)
