"""SSH keys of a lab: one client key, one host key per node, and the known_hosts file that pins them.

Host keys are made here on the host, not by the node's openssh package, so the known_hosts file can be
written before any node answers and host-key checking stays ON for everything that talks to the lab (the
same code path as real Sparks, and the way to test that an unknown or changed key is refused). Keys are kept
between runs: a node recreated from the same lab state presents the same key. The node containers keep a
copy (see nodes.install_keys), and a `lab up` run with another state folder adopts the running lab's keys
instead of replacing its nodes: several people or test sessions on one engine share one lab. They are generated with
`cryptography` (already a paramiko dependency) so no ssh-keygen is needed on the host.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

CLIENT_KEY = "lab_ed25519"
KNOWN_HOSTS = "known_hosts"


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public: str  # "ssh-ed25519 AAAA... comment"

    @property
    def private(self) -> bytes:
        return self.private_path.read_bytes()

    @property
    def fingerprint(self) -> str:
        """SHA256 fingerprint as ssh-keygen -l prints it."""
        blob = base64.b64decode(self.public.split()[1])
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _write_private(path: Path, data: bytes) -> None:
    """Create the file 0600 from the start (never world-readable, not even for a moment)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def ensure_keypair(path: Path, comment: str) -> KeyPair:
    """Load the ed25519 key at `path` (and path.pub), creating both when missing."""
    pub_path = path.with_name(path.name + ".pub")
    if path.is_file() and pub_path.is_file():
        os.chmod(path, 0o600)
        return KeyPair(path, pub_path.read_text().strip())
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    line = f"{public.decode()} {comment}"
    _write_private(path, private)
    pub_path.write_text(line + "\n")
    return KeyPair(path, line)


def store_keypair(path: Path, private: bytes, public: str) -> None:
    """Write a key pair (adopted from a running lab) unless the same one is already there."""
    pub_path = path.with_name(path.name + ".pub")
    if path.is_file() and pub_path.is_file() and pub_path.read_text().strip() == public.strip():
        return
    _write_private(path, private)
    pub_path.write_text(public.strip() + "\n")


def client_key_path(directory: Path) -> Path:
    return directory / CLIENT_KEY


def host_key_path(directory: Path, node: str) -> Path:
    return directory / "hostkeys" / f"{node}_ed25519"


def client_key(directory: Path) -> KeyPair:
    return ensure_keypair(client_key_path(directory), "sparkdeploy-lab-client")


def host_key(directory: Path, node: str) -> KeyPair:
    return ensure_keypair(host_key_path(directory, node), f"root@{node}")


def known_hosts_line(ip: str, key: KeyPair, port: int = 22) -> str:
    host = ip if port == 22 else f"[{ip}]:{port}"
    keytype, blob = key.public.split()[:2]
    return f"{host} {keytype} {blob}"


def write_known_hosts(directory: Path, entries: list[tuple[str, KeyPair]]) -> Path:
    """IP-keyed known_hosts for the lab's nodes only (written whole each time: the lab owns this file)."""
    path = directory / KNOWN_HOSTS
    text = "".join(known_hosts_line(ip, key) + "\n" for ip, key in entries)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
