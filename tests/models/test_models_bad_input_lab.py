"""`models pull` bad input through the real CLI (a subprocess: exit code, stderr) against the lab hub.

An unknown model and a gated model without a token stop before anything is fetched, exit 2, one `error:` line
naming the model and the fix; a node whose hf_cache has no room (a real 16 MB tmpfs mounted over it in the node
container) stops the pull before the first byte on any node: exit 1, one line naming the node, its free space
and the fix, and the hub serves no byte and no node's cache changes. (The unknown revision is in
test_models_lab.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from sparkdeploy.lab import hub
from sparkdeploy.lab.hub_repo import GATED, TINY

pytestmark = pytest.mark.lab

CACHE = "~/.cache/huggingface"
REPO_DIR = f"{CACHE}/hub/models--lab--tiny-model"
RECORD_DIR = f"{CACHE}/sparkdeploy-models/models--lab--tiny-model"


def pull(inventory, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}  # the secrets file alone decides
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from sparkdeploy.cli.main import main; main()",
            "models",
            "pull",
            *args,
            "--inventory",
            str(inventory),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def the_error_line(run: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in run.stderr, run.stderr
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, run.stdout + run.stderr
    return lines[0]


def served(lab, repo: str) -> int:
    return hub.stats(lab.spec)["repos"].get(repo, {}).get("bytes", 0)


def cache_listing(lab, node) -> str:
    """Every path in the node's hf_cache with its size and mtime: any write, even undone, shows."""
    return lab.ssh(
        node, f"if [ -d {CACHE} ]; then cd {CACHE} && find . -printf '%p %s %T@\\n' | sort; else echo no hf cache; fi"
    ).stdout


@pytest.fixture
def inventory_without_token(lab, tmp_path):
    """The lab inventory with a secrets file that has no HF_TOKEN (its other paths made absolute)."""
    data = yaml.safe_load(lab.spec.inventory_path.read_text())
    here = lab.spec.inventory_path.parent
    secrets = tmp_path / "secrets.env"
    lines = [
        ln for ln in (here / data["cluster"]["secrets_file"]).read_text().splitlines() if not ln.startswith("HF_TOKEN=")
    ]
    secrets.write_text("\n".join(lines) + "\n")
    secrets.chmod(0o600)
    data["cluster"].update(secrets_file=str(secrets), known_hosts=str(here / data["cluster"]["known_hosts"]))
    for node in data["nodes"]:
        node["ssh"]["key"] = str(here / node["ssh"]["key"])
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_unknown_model_and_gated_model_without_a_token_are_one_line_each(lab, inventory_without_token):
    inv = lab.spec.inventory_path
    unknown = pull(inv, "lab/no-such-model")
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    line = the_error_line(unknown)
    assert "lab/no-such-model" in line and "no such model" in line and "fix:" in line, line

    gated = pull(inventory_without_token, GATED)
    assert gated.returncode == 2, gated.stdout + gated.stderr
    line = the_error_line(gated)
    assert GATED in line and "no HF_TOKEN is set" in line and "fix:" in line and "HF_TOKEN line" in line, line


def test_a_node_without_room_stops_the_pull_before_any_byte_on_any_node(lab):
    spark1, spark2 = lab.nodes[:2]
    # Both need the model: spark1 would download it (and has no hf cache at all: the refused pull must not
    # leave even the folder it makes for the hub client's mount), spark2 receive it (its cache is a tmpfs).
    lab.ssh(spark1, f"rm -rf {CACHE}")
    lab.ssh(spark2, f"rm -rf {REPO_DIR} {RECORD_DIR}; mkdir -p {CACHE}")
    home, uid, gid = lab.ssh(spark2, "echo $HOME; id -u; id -g").stdout.split()
    small = f"{home}/.cache/huggingface"
    lab.docker_exec(spark2, "mount", "-t", "tmpfs", "-o", f"size=16m,uid={uid},gid={gid},mode=755", "tmpfs", small)
    try:
        before = {n.name: cache_listing(lab, n) for n in (spark1, spark2)}
        hub_before = served(lab, TINY)
        run = pull(lab.spec.inventory_path, TINY)
        after = {n.name: cache_listing(lab, n) for n in (spark1, spark2)}
        blocks, block_size = lab.docker_exec(spark2, "stat", "-f", "-c", "%a %S", small).stdout.split()
    finally:
        lab.docker_exec(spark2, "umount", small)
    assert run.returncode == 1, run.stdout + run.stderr
    line = the_error_line(run)
    assert line.startswith("error: spark2: ") and "spark1" not in line, line
    free = int(blocks) * int(block_size)  # what statvfs says is free for the user: what the line must name
    assert f"has {free / 1e6:.1f} MB free" in line, (free, line)
    assert "fix: free space there, or set cluster.hf_cache to a larger disk" in line, line
    assert "Nothing was downloaded or copied" in line, line
    assert after == before  # nothing written on any node, not even a partial file or an empty folder
    assert served(lab, TINY) == hub_before  # and the hub served no byte of the model
