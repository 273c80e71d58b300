"""One shared lab per test session (the default lab, as `sparkdeploy lab up` makes it).

`lab up` is idempotent, so the fixture also reuses a lab a developer or another test session already brought
up; tests never take it down. Faults that can leave a node broken use `scratch_lab` (a second lab on its own
subnets, taken down at the end of the session), and `lab down` a lab of its own (test_lifecycle.py). The
fault matrix of `up` (tests/faults/) does inject into the shared lab, one case at a time, and puts every node
back (links up, engine unpaused, disk freed, delay removed) and re-runs `up` to healthy before the next case.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkdeploy.lab import LabSpec, UpResult, down, up
from sparkdeploy.lab.spec import NodeSpec
from sparkdeploy.lab.ssh_keys import CLIENT_KEY, KNOWN_HOSTS
from tests.support.processes import outliving

REPO = Path(__file__).resolve().parents[2]


def ensure_engine() -> None:
    probe = subprocess.run(["docker", "info"], capture_output=True) if shutil.which("docker") else None
    if probe is None or probe.returncode != 0:
        with outliving():  # the engine it may start serves the whole suite, and later runs (tests/support/processes)
            subprocess.run(["bash", str(REPO / ".ci" / "start-docker.sh")], check=True)


@dataclass
class Lab:
    result: UpResult

    @property
    def spec(self) -> LabSpec:
        return self.result.spec

    @property
    def nodes(self) -> list[NodeSpec]:
        return self.spec.node_specs()

    @property
    def key(self) -> Path:
        return self.spec.directory / CLIENT_KEY

    @property
    def known_hosts(self) -> Path:
        return self.spec.directory / KNOWN_HOSTS

    def ssh_argv(self, node: NodeSpec, known_hosts: Path | None = None, user: str = "spark") -> list[str]:
        return [
            "ssh",
            "-i",
            str(self.key),
            "-o",
            f"UserKnownHostsFile={known_hosts or self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=10",
            f"{user}@{node.mgmt_ip}",
        ]

    def ssh(self, node: NodeSpec, command: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run `command` on the node over real SSH, as the inventory's user, host-key checking on."""
        result = subprocess.run(self.ssh_argv(node, **kw) + [command], capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(
                f"ssh {node.name} {command!r} exit {result.returncode}:\n{result.stdout}\n{result.stderr}"
            )
        return result

    def docker_exec(self, node: NodeSpec, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """As root inside the node container, from the host (fault injection), not through SSH."""
        result = subprocess.run(
            ["docker", "exec", self.spec.container_name(node.name), *argv], capture_output=True, text=True, timeout=120
        )
        if check and result.returncode != 0:
            raise AssertionError(f"docker exec {node.name} {argv} exit {result.returncode}: {result.stderr}")
        return result


def side_lab_spec(name: str, nodes: int, state_dir: Path) -> LabSpec:
    """A lab beside the shared one: its own name, state folder and two subnets nobody uses right now.
    A leftover of an interrupted session with that name is taken down first."""
    import docker

    from sparkdeploy.lab.network import free_subnets

    down(LabSpec(name=name, state_dir=state_dir))
    mgmt, fabric = free_subnets(docker.from_env())
    return LabSpec(name=name, nodes=nodes, mgmt_subnet=mgmt, fabric_subnet=fabric, images=(), state_dir=state_dir)


@pytest.fixture(scope="session")
def side_spec():
    """side_spec(name, nodes, state_dir) -> LabSpec (see side_lab_spec)."""
    return side_lab_spec


@pytest.fixture(scope="session")
def scratch_lab(tmp_path_factory) -> Lab:
    """Two nodes nobody else uses, for tests that break things on purpose."""
    ensure_engine()
    spec = side_lab_spec("labscratch", 2, tmp_path_factory.mktemp("labscratch"))
    yield Lab(up(spec))
    down(spec)
