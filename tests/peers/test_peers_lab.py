"""Node to node over the lab's fabric network with the peer key: host keys really checked, key bound to the
sender's fabric address, setup idempotent."""

from __future__ import annotations

import pytest

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.runtime.peers import PEER_KNOWN_HOSTS, ensure_peer_trust, known_hosts_host, peer_ssh_argv
from sparkdeploy.runtime.remote import NodeConnection

pytestmark = pytest.mark.lab

WRONG_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GZG6"


def test_node_to_node_ssh_over_the_fabric_with_host_keys_checked(lab):
    inv = load_inventory(str(lab.spec.inventory_path))
    a, b = inv.nodes[0], inv.nodes[1]
    known = PEER_KNOWN_HOSTS.replace("~", "$HOME")
    lab.ssh(lab.nodes[0], f"sed -i '/^{b.fabric_address} /d' {known} 2>/dev/null; true")  # a fresh start for b

    dry = ensure_peer_trust(inv, a, [b], dry_run=True)
    assert any(f"would pin {b.name}'s host keys under its fabric address {b.fabric_address}" in c for c in dry), dry
    first = ensure_peer_trust(inv, a, [b])
    assert any("pinned" in c for c in first), first
    assert ensure_peer_trust(inv, a, [b]) == []  # idempotent: the second run changes nothing

    with NodeConnection(a, inv) as conn:
        run = conn.run(peer_ssh_argv(a, b, ["sh", "-c", 'echo "$SSH_CONNECTION"; hostname']), check=False)
        assert run.ok, run.stderr
        client_ip, _, server_ip, _ = run.stdout.split("\n")[0].split()
        assert (client_ip, server_ip) == (a.fabric_address, b.fabric_address)  # both ends on the fabric
        assert run.stdout.split("\n")[1] == lab.ssh(lab.nodes[1], "hostname").stdout.strip()

        # The peer key logs in only from the sender's fabric address: from its management address it is refused.
        mgmt = conn.run(
            [
                "ssh",
                "-T",
                "-i",
                "~/.ssh/sparkdeploy_peer",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "ConnectTimeout=10",
                f"spark@{b.mgmt_ip}",
                "true",
            ],
            check=False,
        )
        assert mgmt.exit_code == 255 and "Permission denied" in mgmt.stderr, mgmt.stderr

        # A wrong host key pinned for b: the peer ssh refuses to connect, and runs nothing.
        host = known_hosts_host(b)
        conn.run(
            [
                "sh",
                "-c",
                (
                    f'sed -i "/^{host} /d" "$HOME/.ssh/known_hosts_sparkdeploy" && '
                    f'echo "{host} {WRONG_KEY}" >> "$HOME/.ssh/known_hosts_sparkdeploy"'
                ),
            ]
        )
        bad = conn.run(peer_ssh_argv(a, b, ["touch", "/tmp/peer-ran"]), check=False)
        assert bad.exit_code == 255 and "Host key verification failed" in bad.stderr, bad.stderr
        assert lab.ssh(lab.nodes[1], "test -e /tmp/peer-ran", check=False).returncode != 0

        # ensure_peer_trust puts back the key it read over this machine's verified connection
        repaired = ensure_peer_trust(inv, a, [b])
        assert [c for c in repaired if "pinned" in c], repaired
        assert conn.run(peer_ssh_argv(a, b, ["true"]), check=False).ok
