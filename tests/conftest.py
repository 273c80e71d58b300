"""Shared fixtures. Tests that need the lab are marked `lab` (see tests/lab/)."""

from __future__ import annotations

from tests.support.environment import stop_unless_collectable

stop_unless_collectable()  # before anything else is imported: one line when this venv cannot run the suite

import json  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402

from sparkdeploy.cli.common import run_cli  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# No process a test starts outlives it, none outlives the suite; pytest is their subreaper (issue 44).
pytest_plugins = ["tests.support.processes", "tests.support.module_times"]

TWO_NODES = {
    "cluster": {"name": "test", "default_recipe": "openai-gpt-oss-120b", "secrets_file": "secrets.env"},
    "nodes": [
        {
            "name": "spark1",
            "role": "head",
            "mgmt_ip": "192.0.2.1",
            "fabric_ip": "198.51.100.1/24",
            "fabric_ifaces": ["enp1s0f1np1"],
            "hcas": ["rocep1s0f1", "roceP2p1s0f1"],
            "gid_index": 3,
            "ssh": {"user": "spark", "key": "id_test"},
        },
        {
            "name": "spark2",
            "role": "worker",
            "mgmt_ip": "192.0.2.2",
            "fabric_ip": "198.51.100.2/24",
            "fabric_ifaces": ["enp1s0f1np1"],
            "hcas": ["rocep1s0f1", "roceP2p1s0f1"],
            "gid_index": 3,
            "ssh": {"user": "spark", "key": "id_test"},
        },
    ],
}
SECRET_HF = "hf_SECRETtokenVALUE123"
SECRET_KEY = "sk-SECRETmasterKEY456"


def pytest_configure(config):
    """The suite's own history folder (sparkdeploy.deploy.history): every `up` a test runs, in-process or as a
    subprocess (which inherits the environment), records there, never in the developer's or CI's state."""
    import os
    import tempfile

    from sparkdeploy.deploy.history import HISTORY_ENV

    if not os.environ.get(HISTORY_ENV):
        os.environ[HISTORY_ENV] = tempfile.mkdtemp(prefix="sparkdeploy-test-history-")


def pytest_collection_finish(session):
    """Every test module is imported now: stop at once if any module came from outside the venv or the repo."""
    from tests.support.environment import problems

    found = problems()
    if found:
        pytest.exit("the test environment is not the project's own:\n  " + "\n  ".join(found), returncode=3)


@pytest.fixture
def write_inventory(tmp_path):
    """Write an inventory (dict or YAML text) next to a 0600 secrets file; return its path."""

    def write(data=None, name="inventory.yaml", secrets=True) -> Path:
        path = tmp_path / name
        if isinstance(data, str):
            path.write_text(textwrap.dedent(data))
        else:
            path.write_text(yaml.safe_dump(data if data is not None else TWO_NODES, sort_keys=False))
        if secrets:
            s = tmp_path / "secrets.env"
            s.write_text(f"HF_TOKEN={SECRET_HF}\nLITELLM_MASTER_KEY={SECRET_KEY}\n")
            s.chmod(0o600)
        return path

    return write


@pytest.fixture
def inventory_file(write_inventory) -> Path:
    return write_inventory()


@pytest.fixture
def refusing_inventory(write_inventory) -> Path:
    """TWO_NODES at two of this machine's own addresses, on a port nothing listens on: nodes that refuse SSH at
    once, for a test of what a run says when the nodes are down. Answered in seconds (CONNECT_ATTEMPTS' backoff),
    not the ~30 s a TEST-NET address that drops packets takes. Without two such addresses, TWO_NODES as it is."""
    data = json.loads(json.dumps(TWO_NODES))
    try:  # iproute2's `ip`; a machine without it keeps the slow addresses
        ip = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True)
    except OSError:
        return write_inventory(data)
    own = [line.split()[3].split("/")[0] for line in ip.stdout.splitlines() if len(line.split()) > 3]
    if ip.returncode == 0 and len(own) >= 2:
        with socket.socket() as probe:  # a port free now on every address: nothing listens on it
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        for node, address in zip(data["nodes"], own, strict=False):
            node["mgmt_ip"], node["ssh"]["port"] = address, port
    return write_inventory(data)


@pytest.fixture
def cli(capsys):
    """Run a sparkdeploy command in-process with the real error contract; return (code, stdout, stderr)."""

    def invoke(*args: str, command=None):
        from sparkdeploy.cli.main import cli as main_cli

        code = run_cli(command or main_cli, list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    return invoke


@pytest.fixture(scope="session")
def lab():
    """The ONE shared lab of the session (the default lab, as `sparkdeploy lab up` makes it), for every folder's
    lab tests. `lab up` is idempotent: it reuses a lab already up and never makes a second one."""
    from sparkdeploy.lab import LabSpec, up
    from tests.lab.conftest import Lab, ensure_engine

    ensure_engine()
    return Lab(up(LabSpec()))
