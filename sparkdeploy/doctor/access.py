"""access.*: SSH reachable with a known host key; the SSH user runs docker without sudo; the state dir is the
SSH user's. All three are preflight checks of `up` too (doctor/registry.py).

`access.ssh` is the connection itself (doctor: runner.connect, one per node, host keys checked by
sparkdeploy.runtime.remote: an unknown key is refused with its fingerprint, a changed key is a hard failure; up's
preflight: whether the node's facts could be read).
"""

from __future__ import annotations

from sparkdeploy.checks import Result, fail, ok
from sparkdeploy.config.inventory import Node

from .check_context import CheckContext

__all__ = ["docker_without_sudo", "ssh", "state_dir"]


def ssh(run: CheckContext, node: Node) -> Result:
    return run.ssh_check(node)


def docker_without_sudo(run: CheckContext, node: Node) -> Result:
    """From the facts `docker` (docker version as the SSH user) and `user` (id -un, id -Gn)."""
    f = run.node_facts(node)
    # `up`'s preflight reads the set STATE, without `user`: the inventory's user names it there, no groups
    user, groups = (f.user, f.groups) if f.has("user") else ("", [])
    name = user or node.ssh.user or "USER"
    text = f.docker_error
    expected = f"{name} runs docker without sudo"
    fix = f"sudo usermod -aG docker {name}, then log in again (or restart sshd sessions)"
    if f.docker_ok:
        return ok(f"{name} runs docker (server {f.docker_version})", expected)
    if "not found" in text:
        return fail("docker is not installed", expected, "install Docker (DGX OS ships it): sudo apt install docker-ce")
    if "permission denied" in text.lower():
        return fail(
            f"{name}: permission denied on the Docker socket (groups: {' '.join(groups) or '-'})", expected, fix
        )
    if name == "root" or "docker" in groups:
        return ok(f"{name} is in group docker (the engine does not answer: see engine.running)", expected)
    return fail(
        f"{name} is not in group docker and the engine does not answer ({text or 'no answer'})",
        expected,
        "start Docker on the node and let the SSH user run it without sudo "
        f"(sudo usermod -aG docker {name}, then log in again)",
    )


def state_dir(run: CheckContext, node: Node) -> Result:
    """A path in a state dir the SSH user does not own: files there cannot be replaced. Docker's daemon makes
    a missing bind-mount source as root, so a container restarted after its folder was removed leaves one. Every
    folder of ours is looked at: the state dir and a stack's `<state_dir>-NAME` (the `state_dirs` fact)."""
    f = run.node_facts(node)
    user = node.ssh.user or "$USER"  # ssh.user is validated as a plain user name (names.py: user)
    base = run.inventory.cluster.state_dir  # type: ignore[union-attr]  # checks run only with an inventory
    expected = "the state dirs and their entries are the SSH user's"
    # `up`'s preflight reads the set STATE, without `state_dirs`: there the state dir's own fact speaks
    folders = sorted(f.state_dirs.values(), key=lambda d: d.name) if f.has("state_dirs") else []
    foreign = [(d.name, d.foreign) for d in folders if d.foreign]
    if not foreign and f.state_dir_foreign:
        foreign = [(base, f.state_dir_foreign)]
    if foreign:
        name, path = foreign[0]
        return fail(
            f"{path} is not owned by the SSH user {user} (often root: Docker creates a missing bind-mount folder "
            f"as root); sparkdeploy cannot replace files there",
            expected,
            f"on {node.name}: sudo chown -R {user}: ~/{name}",
        )
    if not folders:
        return ok(f"~/{base} not made yet", expected)
    stack = [d.name for d in folders if d.name != base]
    listed = ", ".join(f"~/{d.name}" for d in folders)
    return ok(f"{listed} {'are' if len(folders) > 1 else 'is'} {user}'s" + (" (a stack's)" if stack else ""), expected)
