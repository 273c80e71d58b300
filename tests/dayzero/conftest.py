"""The bare lab (`sparkdeploy lab up --bare`): two nodes as a new pair of Sparks arrives, beside the shared lab
on subnets of their own; brought up once per session, taken down at its end (its nodes get configured)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkdeploy.images.build import docker_client
from sparkdeploy.lab import LabSpec, down, up
from sparkdeploy.lab.network import free_subnets

BARE_NAME = "bare-test"


@dataclass
class BareLab:
    spec: LabSpec
    notes: dict

    @property
    def hosts(self) -> list[str]:
        return list(self.notes["hosts"])

    @property
    def password_file(self) -> Path:
        return Path(self.notes["password_file"])

    def container(self, node: str) -> str:
        return self.spec.container_name(node)


@pytest.fixture(scope="session")
def bare_lab():
    from tests.lab.conftest import ensure_engine

    ensure_engine()
    mgmt, fabric = free_subnets(docker_client())
    spec = LabSpec(name=BARE_NAME, mgmt_subnet=mgmt, fabric_subnet=fabric, images=(), bare=True)
    down(spec)  # a leftover from an interrupted session: start from new Sparks
    result = up(spec)
    try:
        yield BareLab(spec, json.loads(Path(result.inventory).read_text()))
    finally:
        down(spec)
