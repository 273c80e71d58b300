"""`sparkdeploy lab up --bare`: lab nodes as a new pair of Sparks arrives (images/lab-node-bare).

Password login only (a random password per lab, kept 0600 in the lab folder and handed to the node in a
root-only file: `sparkdeploy init --password-file` and `setup ssh --password-file` read it), sudo asking for
that password, the fabric link up with no address at MTU 1500, the link's interface named differently on
every other node (enp1s0f1np1 / enP2p1s0f1np1: the same port's two names), Debian's netplan.io installed.
No inventory and no known_hosts are written: `sparkdeploy init` makes them, as on real Sparks. The engine
images are not preloaded (`up` pushes what it needs). GPU, RDMA and link speed stay SIMULATED.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from sparkdeploy import paths
from sparkdeploy.lab.spec import LabSpec

PASSWORD_FILE = "node-password"  # in the lab folder, 0600
PASSWORD_IN_NODE = "etc/sparkdeploy-lab/spark-password"  # relative to /, read and removed by lab-bare-init
NOTES_FILE = paths.BARE_NOTES
USER = "spark"


def password_path(spec: LabSpec) -> Path:
    return spec.directory / PASSWORD_FILE


def password(spec: LabSpec) -> str:
    """The bare nodes' password: made once (0600 from creation), then kept."""
    path = password_path(spec)
    if path.is_file():
        os.chmod(path, 0o600)
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    value = secrets.token_urlsafe(18)
    fd = os.open(path.with_name(path.name + ".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    os.replace(path.with_name(path.name + ".tmp"), path)
    return value


def dayzero_commands(hosts: list[str], user: str = USER) -> list[str]:
    """The README's five day-zero commands ("From two new Sparks") for these nodes: what `lab up --bare` prints
    (tests/test_docs.py checks that the README says the same)."""
    return [
        f"sparkdeploy init --hosts {','.join(hosts)} --user {user} --ask-password",
        "sparkdeploy setup ssh --ask-password --grant-sudo",
        "sparkdeploy setup network",
        "sparkdeploy doctor",
        "run-recipe openai-gpt-oss-120b",
    ]


def write_notes(spec: LabSpec, hub_endpoint: str) -> Path:
    """What a test or a person needs to start day zero on the bare lab (no secret in it: the password's path)."""
    path = spec.directory / NOTES_FILE
    data = {
        "hosts": [n.mgmt_ip for n in spec.node_specs()],
        "user": USER,
        "password_file": str(password_path(spec)),
        "fabric_subnet": spec.fabric_subnet,
        "fabric_ifaces": {n.name: spec.fabric_iface_for(n.name) for n in spec.node_specs()},
        "simulated": ["gpu", "rdma", "link-speed", "networkd"],
        # what `init` adds to the inventory it writes for these hosts: the SIMULATED engine, its model hub, its
        # secrets (dayzero/init.py reads these notes; the fabric subnet above is its default there)
        "lab_cluster": {
            "image_override": "vllm-sim",
            "hf_endpoint": hub_endpoint,
            "secrets_file": str(spec.directory / "secrets.env"),
        },
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
