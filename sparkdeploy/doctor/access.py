"""access.*: SSH reachable with a known host key; the SSH user runs docker without sudo.

`access.ssh` is the connection itself (runner.connect): one per node, host keys checked by
sparkdeploy.remote (an unknown key is refused with its fingerprint, a changed key is a hard failure).
"""

from __future__ import annotations

from sparkdeploy.inventory import Node

from .model import Result, fail, ok
from .runner import connect
from .session import DoctorRun

__all__ = ["docker_without_sudo", "ssh"]


def ssh(run: DoctorRun, node: Node) -> Result:
    return connect(run, node)


def docker_without_sudo(run: DoctorRun, node: Node) -> Result:
    host = run.session(node).host  # testinfra over our connection
    user = host.user()
    name = user.name
    res = host.run("docker version --format %s", "{{.Server.Version}}")
    groups = user.groups if name and res.rc != 0 else []  # only asked when docker did not answer
    text = (res.stderr or res.stdout).strip()
    expected = f"{name} runs docker without sudo"
    fix = f"sudo usermod -aG docker {name}, then log in again (or restart sshd sessions)"
    if res.rc == 0:
        return ok(f"{name} runs docker (server {res.stdout.strip()})", expected)
    if res.rc == 127 or "not found" in text:
        return fail("docker is not installed", expected, "install Docker (DGX OS ships it): sudo apt install docker-ce")
    if "permission denied" in text.lower():
        return fail(
            f"{name}: permission denied on the Docker socket (groups: {' '.join(groups) or '-'})", expected, fix
        )
    in_group = name == "root" or "docker" in groups
    if in_group:
        return ok(f"{name} is in group docker (the engine does not answer: see engine.running)", expected)
    return fail(f"{name} is not in group docker and the engine does not answer", expected, fix)
