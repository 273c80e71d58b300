"""The lab's inventory.yaml and secrets.env, in the format of docs/CONVENTIONS.md.

The inventory is built as data and written with yaml.safe_dump (never a text template), so any value is
quoted correctly. Paths in it are relative to the inventory file, so the lab folder can move. secrets.env
holds random stand-in secrets, created 0600 once and then kept, so a second `lab up` changes nothing.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import yaml

from sparkdeploy.lab.hub import endpoint as hub_endpoint
from sparkdeploy.lab.spec import ROCE_V2_GID_INDEX, LabSpec
from sparkdeploy.lab.ssh_keys import CLIENT_KEY, KNOWN_HOSTS

SECRETS_FILE = "secrets.env"


def inventory_data(spec: LabSpec) -> dict[str, Any]:
    nodes = []
    for i, node in enumerate(spec.node_specs()):
        nodes.append(
            {
                "name": node.name,
                "role": "head" if i == 0 else "worker",
                "mgmt_ip": node.mgmt_ip,
                "fabric_ip": node.fabric_cidr,
                "fabric_ifaces": [spec.fabric_iface],
                "hcas": list(spec.hcas),
                "gid_index": ROCE_V2_GID_INDEX,
                "ssh": {"user": "spark", "port": 22, "key": CLIENT_KEY},
            }
        )
    return {
        "cluster": {
            "name": spec.name,
            "default_recipe": "openai-gpt-oss-120b",
            "secrets_file": SECRETS_FILE,
            "known_hosts": KNOWN_HOSTS,
            "image_override": "vllm-sim",
            "hf_endpoint": hub_endpoint(spec),
        },
        "nodes": nodes,
    }


def write_inventory(spec: LabSpec) -> Path:
    path = spec.inventory_path
    header = (
        f"# sparkdeploy lab '{spec.name}': written by `sparkdeploy lab up`; rewritten on every run.\n"
        "# The GPUs and RDMA devices of these nodes are SIMULATED (image_override: vllm-sim).\n"
    )
    text = header + yaml.safe_dump(inventory_data(spec), sort_keys=False)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def ensure_secrets(spec: LabSpec) -> Path:
    """Random lab secrets (HF_TOKEN, LITELLM_MASTER_KEY), 0600 from creation, kept once written."""
    path = spec.directory / SECRETS_FILE
    if path.is_file():
        os.chmod(path, 0o600)
        return path
    text = (
        "# sparkdeploy lab secrets: random stand-ins, not real credentials.\n"
        f"HF_TOKEN=hf_lab{secrets.token_hex(16)}\n"
        f"LITELLM_MASTER_KEY=sk-{secrets.token_hex(24)}\n"
    )
    fd = os.open(path.with_name(path.name + ".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(path.with_name(path.name + ".tmp"), path)
    return path
