"""Debian's real netplan (netplan.io) on a rendered file: `netplan generate --root-dir` into a scratch root.

On this machine when netplan is installed; otherwise in a throw-away container of the bare lab node image
(images/lab-node-bare: Debian's netplan.io from the Debian mirror), the file passed on stdin (no mount)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from sparkdeploy.images.build import docker_client, ensure_image

SCRIPT = (
    "set -e; r=$(mktemp -d); mkdir -p $r/etc/netplan; cat > $r/etc/netplan/40-sparkdeploy-fabric.yaml; "
    "chmod 600 $r/etc/netplan/40-sparkdeploy-fabric.yaml; netplan generate --root-dir $r; "
    'for f in $(find $r/run -type f | sort); do echo "== ${f#$r}"; cat "$f"; done'
)


@cache
def _image() -> str:
    return ensure_image("lab-node-bare", docker_client())


def generate(text: str) -> subprocess.CompletedProcess:
    """netplan generate on `text`; stdout lists each generated file (`== PATH`) and its content."""
    if shutil.which("netplan"):
        with tempfile.TemporaryDirectory() as tmp:
            return subprocess.run(
                ["bash", "-c", SCRIPT.replace("$(mktemp -d)", tmp)],
                input=text,
                capture_output=True,
                text=True,
                timeout=60,
            )
    return subprocess.run(
        ["docker", "run", "-i", "--rm", "--network", "none", "--entrypoint", "bash", _image(), "-c", SCRIPT],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
    )


def files(out: str) -> dict[str, str]:
    found: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("== "):
            current = line[3:]
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return {Path(k).name: "\n".join(v) for k, v in found.items()}
