"""Host keys on every hop, the pinned known_hosts first, the cluster lock, and a second Ctrl-C (issue 19).

Real Fabric/paramiko objects, real known_hosts files, real signals; the connections themselves are exercised
against the lab's sshd in tests/lab/test_security_lab.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import paramiko
import pytest

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.errors import StepFailed
from sparkdeploy.runtime.locks import cluster_lock, lock_path
from sparkdeploy.runtime.remote import REKEY_BYTES, HostKeyError, NodeConnection, NodeTransport, _RejectUnknown
from tests.conftest import REPO, TWO_NODES
from tests.support.processes import spawn


def _inventory(tmp_path: Path, known_hosts: str = "pinned_hosts") -> Inventory:
    data = json.loads(json.dumps(TWO_NODES))
    data["cluster"]["known_hosts"] = known_hosts
    inv = Inventory.model_validate(data)
    inv.path = tmp_path / "inventory.yaml"
    return inv


def _key_line(host: str) -> tuple[str, paramiko.PKey]:
    key = paramiko.ECDSAKey.generate()
    return f"{host} {key.get_name()} {key.get_base64()}\n", key


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    return home


def test_pinned_known_hosts_wins_and_a_conflict_names_both_files(tmp_path, home):
    pinned_line, pinned = _key_line("192.0.2.1")
    system_line, _ = _key_line("192.0.2.1")
    (tmp_path / "pinned_hosts").write_text(pinned_line)
    (home / ".ssh" / "known_hosts").write_text(system_line)
    inv = _inventory(tmp_path)
    with pytest.raises(HostKeyError) as info:
        NodeConnection(inv.nodes[0], inv)._fabric()
    text = str(info.value)
    assert str(tmp_path / "pinned_hosts") in text and str(home / ".ssh" / "known_hosts") in text
    # No conflict: the pinned key is what the client trusts for that host, the system file fills in the rest.
    other_line, other = _key_line("192.0.2.2")
    (home / ".ssh" / "known_hosts").write_text(other_line)
    conn = NodeConnection(inv.nodes[0], inv)._fabric()
    assert conn.client.get_host_keys().lookup("192.0.2.1")[pinned.get_name()] == pinned
    conn2 = NodeConnection(inv.nodes[1], inv)._fabric()
    assert conn2.client.get_host_keys().lookup("192.0.2.2")[other.get_name()] == other


def test_proxyjump_hops_get_the_reject_policy_and_the_pinned_keys(tmp_path, home):
    pinned_line, pinned = _key_line("198.51.100.9")
    (tmp_path / "pinned_hosts").write_text(pinned_line)
    (home / ".ssh" / "config").write_text(
        textwrap.dedent("""
        Host 192.0.2.*
            ProxyJump jump@198.51.100.9
    """)
    )
    inv = _inventory(tmp_path)
    conn = NodeConnection(inv.nodes[0], inv)._fabric()
    assert conn.gateway is not None and not isinstance(conn.gateway, str), "ssh config was not read"
    hop = conn.gateway
    assert isinstance(hop.client._policy, _RejectUnknown), "the jump host would auto-add an unknown key"
    assert hop.client.get_host_keys().lookup("198.51.100.9")[pinned.get_name()] == pinned


def test_connections_offer_aes_gcm_first_and_re_key_at_the_aes_limit(tmp_path, home):
    """The cipher is chosen at the first key exchange (GCM when the node offers it), never by a re-key of our own
    mid-run (tests/images/test_push_lab.py shows why); every cipher offered has 128-bit blocks, for which the
    node's sshd re-keys every 64 GiB, before our backstop at twice that."""
    inv = _inventory(tmp_path)
    assert NodeConnection(inv.nodes[0], inv)._fabric().connect_kwargs["transport_factory"] is NodeTransport
    offered = NodeTransport._preferred_ciphers
    assert offered[:2] == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
    assert all(c.startswith("aes") for c in offered) and "3des-cbc" not in offered
    a, b = socket.socketpair()
    try:
        transport = NodeTransport(a)
        assert transport.packetizer.REKEY_BYTES == REKEY_BYTES == 2 * (1 << 36)  # twice OpenSSH's 64 GiB
        assert paramiko.Transport(b).packetizer.REKEY_BYTES == 1 << 29  # paramiko's own, which this replaces
    finally:
        a.close()
        b.close()


def test_cluster_lock_is_keyed_by_the_nodes_not_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "state"))
    a, b = _inventory(tmp_path), _inventory(tmp_path)
    b.path = tmp_path / "copy" / "inventory.yaml"  # a copy of the same inventory elsewhere
    assert lock_path(a) == lock_path(b)
    assert lock_path(a).parent == tmp_path / "state" / "locks"
    # Another process holding it: refused (flock is per open file, so a second process shows it for real).
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from sparkdeploy.runtime.locks import cluster_lock
        from sparkdeploy.config.inventory import Inventory
        import json
        inv = Inventory.model_validate(json.loads({json.dumps(json.dumps(TWO_NODES))}))
        with cluster_lock(inv):
            print("held", flush=True)
            time.sleep(30)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SPARKDEPLOY_STATE": str(tmp_path / "state")},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StepFailed) as info:
            with cluster_lock(b):
                pass
        assert "another sparkdeploy run" in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    with cluster_lock(b):
        pass


def test_second_ctrl_c_stops_at_once_and_starts_no_new_remote_command(tmp_path):
    """A run with a step under way on two 'nodes' (threads): the first Ctrl-C lets it finish, the second
    exits at once; no thread starts a new remote command afterwards (NodeConnection.run refuses)."""
    script = textwrap.dedent(f"""
        import sys, time, threading
        sys.path.insert(0, {str(REPO)!r})
        from sparkdeploy.runtime.interrupts import Interrupt
        from sparkdeploy.cli.common import run_cli
        from sparkdeploy.config.inventory import Inventory
        from sparkdeploy.runtime.remote import NodeConnection, on_nodes
        import click, json
        inv = Inventory.model_validate(json.loads({json.dumps(json.dumps(TWO_NODES))}))

        def step(node):
            time.sleep(3)  # a command under way
            try:
                NodeConnection(node, inv).run(["true"])  # the next command: must not start
            except Exception as exc:
                open({str(tmp_path / "refused")!r} + node.name, "w").write(str(exc))

        @click.command()
        def main():
            with Interrupt():
                print("started", flush=True)
                on_nodes(inv.nodes, step)

        sys.exit(run_cli(main, []))
    """)
    # spawn: SIGINT at its default in the child, however the suite was started (issue 44)
    proc = spawn([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=10)
    assert time.monotonic() - t0 < 1.5, "the second Ctrl-C did not stop at once"
    assert proc.returncode == 130
    assert "Traceback" not in proc.stderr.read()


def test_after_a_second_ctrl_c_no_remote_command_starts(tmp_path):
    from sparkdeploy.runtime import remote

    inv = _inventory(tmp_path)
    remote.STOPPING.set()
    try:
        t0 = time.monotonic()
        with pytest.raises(StepFailed, match="stopped"):
            NodeConnection(inv.nodes[0], inv).run(["true"])  # 192.0.2.1 is unroutable: connecting would hang
        with pytest.raises(StepFailed, match="stopped"):
            NodeConnection(inv.nodes[0], inv).put("x", "/tmp/x")
        assert time.monotonic() - t0 < 1
    finally:
        remote.STOPPING.clear()
