"""Real sshd on each node: key auth only, host keys pinned by the lab's known_hosts."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.lab


def test_ssh_with_lab_key_and_strict_host_key_checking(lab):
    for node in lab.nodes:
        out = lab.ssh(node, "hostname; id -un; id -Gn").stdout.split()
        assert out[0] == node.name
        assert out[1] == "spark"
        assert "docker" in out[2:]


def test_ssh_refused_with_empty_known_hosts(lab, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    for node in lab.nodes:
        result = lab.ssh(node, "true", check=False, known_hosts=empty)
        assert result.returncode == 255
        assert "Host key verification failed" in result.stderr


def test_ssh_refused_with_wrong_host_key(lab, tmp_path):
    """A known_hosts entry for the IP with another node's key: a changed key is a hard failure."""
    a, b = lab.nodes[0], lab.nodes[-1]
    assert a != b, "the lab has two nodes"
    lines = {line.split()[0]: line.split(None, 1)[1] for line in lab.known_hosts.read_text().splitlines()}
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{a.mgmt_ip} {lines[b.mgmt_ip]}\n")
    result = lab.ssh(a, "true", check=False, known_hosts=wrong)
    assert result.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr


def test_no_password_or_root_login(lab):
    node = lab.nodes[0]
    root = lab.ssh(node, "true", check=False, user="root")
    assert root.returncode == 255 and "Permission denied" in root.stderr
    password = subprocess.run(
        [
            "ssh",
            "-o",
            f"UserKnownHostsFile={lab.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "PubkeyAuthentication=no",
            "-o",
            "PreferredAuthentications=password,keyboard-interactive",
            f"spark@{node.mgmt_ip}",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert password.returncode == 255
    assert "Permission denied (publickey)" in password.stderr  # the only method the server offers


def test_key_files_are_private(lab):
    assert lab.key.stat().st_mode & 0o077 == 0
    for node in lab.nodes:
        assert (lab.spec.directory / "hostkeys" / f"{node.name}_ed25519").stat().st_mode & 0o077 == 0
    assert (lab.spec.directory / "secrets.env").stat().st_mode & 0o077 == 0
