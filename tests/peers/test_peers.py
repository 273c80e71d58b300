"""peers.py's pure parts: the peer ssh command line, the chain, and the authorized_keys/known_hosts edits.
The real thing (node to node over the lab's fabric, host key checked) is tests/peers/test_peers_lab.py."""

from __future__ import annotations

import shlex

from sparkdeploy.config.inventory import Node
from sparkdeploy.runtime.peers import (
    authorized_line,
    known_hosts_host,
    peer_ssh_argv,
    transfer_plan,
    with_authorized,
    with_known_host,
)


def node(name: str, i: int, port: int | None = None, user: str | None = "spark") -> Node:
    return Node(
        name=name,
        role="head" if i == 1 else "worker",
        mgmt_ip=f"10.0.0.{i}",
        fabric_ip=f"192.168.100.{i}/24",
        fabric_ifaces=["eth1"],
        ssh={"user": user, "port": port},
    )


def test_peer_ssh_checks_host_keys_uses_only_the_peer_key_and_the_fabric_addresses():
    a, b = node("a", 1), node("b", 2, port=2222)
    argv = peer_ssh_argv(a, b, ["docker", "load", "-q"])
    joined = " ".join(argv)
    for option in (
        "StrictHostKeyChecking=yes",
        "UserKnownHostsFile=~/.ssh/known_hosts_sparkdeploy",
        "GlobalKnownHostsFile=/dev/null",
        "BatchMode=yes",
        "IdentitiesOnly=yes",
    ):
        assert option in argv, option
    assert argv[argv.index("-i") + 1] == "~/.ssh/sparkdeploy_peer"
    assert argv[argv.index("-b") + 1] == "192.168.100.1"  # leaves from the sender's fabric address
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "spark"
    assert argv[-2] == "192.168.100.2" and "10.0.0.2" not in joined
    assert shlex.split(argv[-1]) == ["docker", "load", "-q"]


def test_remote_values_stay_quoted_through_both_shells():
    a, b = node("a", 1), node("b", 2)
    hostile = "x; touch /tmp/PWNED $(id) 'q'"
    argv = peer_ssh_argv(a, b, ["echo", hostile])
    # the source's shell splits the joined line back into argv; ssh hands the last part to the target's shell
    assert shlex.split(shlex.join(argv)) == argv
    assert shlex.split(argv[-1]) == ["echo", hostile]


def test_known_hosts_name_carries_the_port_when_not_22():
    assert known_hosts_host(node("a", 1)) == "192.168.100.1"
    assert known_hosts_host(node("a", 1, port=2200)) == "[192.168.100.1]:2200"


def test_transfer_plan_is_a_chain_where_the_source_sends_once_whatever_n():
    nodes = [node(f"n{i}", i) for i in range(1, 9)]
    for n in range(1, 8):
        edges = transfer_plan(nodes[0], nodes[1 : n + 1])
        assert [(s.name, t.name) for s, t in edges] == [(nodes[i].name, nodes[i + 1].name) for i in range(n)]
        senders = [s.name for s, _ in edges]
        assert senders.count("n1") == 1  # the source's link carries each byte once
        assert sorted(t.name for _, t in edges) == sorted(x.name for x in nodes[1 : n + 1])  # each target once
    # the source among the targets, or a node twice, is left out
    assert [(s.name, t.name) for s, t in transfer_plan(nodes[0], [nodes[0], nodes[1], nodes[1]])] == [("n1", "n2")]
    assert transfer_plan(nodes[0], []) == []


def test_authorized_line_restricts_the_key_to_the_senders_fabric_address():
    line = authorized_line("ssh-ed25519 AAAAC3Nz sparkdeploy-peer@a", node("a", 1))
    assert line == 'restrict,from="192.168.100.1" ssh-ed25519 AAAAC3Nz sparkdeploy-peer@a'


def test_authorized_keys_edit_is_idempotent_and_keeps_other_keys():
    others = "ssh-ed25519 OTHERKEY me@laptop\n# a comment\n"
    line = authorized_line("ssh-ed25519 PEERKEY sparkdeploy-peer@a", node("a", 1))
    once = with_authorized(others, line)
    assert once == others + line + "\n"
    assert with_authorized(once, line) is None  # second run: nothing to do
    moved = authorized_line("ssh-ed25519 PEERKEY sparkdeploy-peer@a", node("a", 7))  # fabric IP changed
    twice = with_authorized(once, moved)
    assert twice.count("PEERKEY") == 1 and moved in twice and "OTHERKEY" in twice


def test_known_hosts_edit_replaces_a_stale_key_and_is_idempotent():
    text = "192.168.100.2 ssh-ed25519 OLD\n192.168.100.3 ssh-ed25519 THIRD\n"
    new = with_known_host(text, "192.168.100.2", ["ssh-ed25519 NEW", "ssh-rsa RSA"])
    assert "OLD" not in new and "192.168.100.2 ssh-ed25519 NEW" in new and "THIRD" in new
    assert with_known_host(new, "192.168.100.2", ["ssh-rsa RSA", "ssh-ed25519 NEW"]) is None
    assert with_known_host("", "[192.168.100.2]:2222", ["ssh-ed25519 K"]) == "[192.168.100.2]:2222 ssh-ed25519 K\n"


def test_a_key_without_comment_replaces_only_itself():
    others = "ssh-ed25519 OTHERKEY\nssh-ed25519 THIRD me@x\n"
    line = authorized_line("ssh-ed25519 PEERKEY", node("a", 1))
    new = with_authorized(others, line)
    assert "OTHERKEY" in new and "THIRD" in new and line in new
    assert with_authorized(new, line) is None
