"""Memory: no swap on the model cache's disk (paging there stalls weight loads), and earlyoom in the state you
want (a Spark's GPU shares the 128 GB with the CPU: running out freezes the whole machine; earlyoom kills first)."""

import pytest
from testinfra.host import Host

from sparkdeploy.config.inventory import ClusterSettings

EARLYOOM = "active"  # `systemctl is-active earlyoom`: set "inactive" if you rely on sparkdeploy's memory guard alone


def cache_dir(host: Host, cluster: ClusterSettings) -> str:
    home = host.check_output('printf %s "$HOME"')
    return cluster.hf_cache.replace("~", home, 1)


def existing(host: Host, path: str) -> str:
    while not host.file(path).exists:
        path = path.rsplit("/", 1)[0] or "/"
    return path


def test_no_swap_on_model_cache_disk(host: Host, cluster: ClusterSettings) -> None:
    cache = existing(host, cache_dir(host, cluster))
    cache_dev = host.check_output("stat -c %%d %s", cache)
    cache_src = host.check_output("df --output=source %s | tail -1", cache)
    cache_disk = host.run("lsblk -no PKNAME %s", cache_src).stdout.strip() if cache_src.startswith("/dev/") else ""
    for line in host.file("/proc/swaps").content_string.splitlines()[1:]:
        name, kind = line.split()[:2]
        if kind == "file":
            assert host.check_output("stat -c %%d %s", name) != cache_dev, f"swap file {name} is on {cache}'s disk"
        else:
            disk = host.run("lsblk -no PKNAME %s", name).stdout.strip()
            assert not cache_disk or disk != cache_disk, f"swap {name} is on {cache}'s disk ({cache_disk})"


def test_earlyoom(host: Host) -> None:
    if not host.exists("systemctl") and host.file("/etc/sparkdeploy-lab/node.env").exists:
        pytest.skip("SIMULATED lab node: no systemd, so no earlyoom service to read (a Spark runs it under systemd)")
    state = host.run("systemctl is-active earlyoom").stdout.strip()
    assert state == EARLYOOM, f"earlyoom is {state or 'not installed'}, expected {EARLYOOM}"
