"""Registry images in the lab, against a real registry (Debian's docker-registry, sparkdeploy/lab/registry_server.py):
pulled once, digest checked, on every node with one image ID; then `up` serves a recipe naming the reference,
`history` records it, and `rollback` brings an earlier deployment back (or names what is missing).

The image is the lab's vllm-sim with a label of this session (a new image ID over the same layers), published
into the lab registry from the first node, so no node holds it before the test.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import yaml

from sparkdeploy.images.build import docker_client
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.lab import registry_server as lab_registry
from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab

REPO_PATH = "lab/vllm-sim"
GATE_TIMEOUT = "240"


@pytest.fixture(scope="module")
def published(lab):
    """(reference pinned with its digest, the tag-only reference): published to the lab registry just now."""
    client = docker_client()
    lab_registry.ensure(client, lab.spec)
    tag = f"t{secrets.token_hex(4)}"
    pinned = lab_registry.publish(client, lab.spec, load_definition("vllm-sim").tag, REPO_PATH, tag, tag)
    return pinned, pinned.split("@", 1)[0]


def _image(lab, node, ref: str) -> tuple[str, list[str]] | None:
    r = lab.docker_exec(
        node, "docker", "image", "inspect", "--format", "{{.Id}} {{json .RepoDigests}}", ref, check=False
    )
    if r.returncode != 0:
        return None
    image_id, digests = r.stdout.strip().split(" ", 1)
    return image_id, json.loads(digests)


def _nodes_state(lab) -> dict[str, list[str]]:
    # `docker image ls` orders images made in the same second arbitrarily: compare each node's set of IDs.
    return {
        n.name: sorted(lab.docker_exec(n, "docker", "image", "ls", "-q", "--no-trunc").stdout.split())
        for n in lab.nodes
    }


def test_a_registry_image_is_pulled_once_and_reaches_every_node(lab, published):
    pinned, tagged = published
    inv = str(lab.spec.inventory_path)
    client = docker_client()
    before = lab_registry.manifest_clients(client, lab.spec, REPO_PATH)
    r = sd("images", "pull", pinned, "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    result = json.loads(r.stdout)
    digest = pinned.split("@", 1)[1]
    assert result["digest"] == digest and result["pulled"] and result["node"] == lab.nodes[0].name
    assert result["simulated"] and result["vllm_version"] == "0.32.0"  # read from the image itself
    # pulled once: the registry served its manifest to one client, the puller, and only the puller's engine
    # has a RepoDigest for it (the others loaded it from the chain over the fabric)
    served = lab_registry.manifest_clients(client, lab.spec, REPO_PATH)[len(before) :]
    assert served == [lab.nodes[0].mgmt_ip], served
    held = {n.name: _image(lab, n, tagged) for n in lab.nodes}
    assert all(held.values()), held
    assert len({h[0] for h in held.values() if h}) == 1  # one image ID on every node (N nodes)
    assert [n for n, h in held.items() if h and h[1]] == [lab.nodes[0].name]
    assert sorted(p["node"] for p in result["pushed"]) == sorted(n.name for n in lab.nodes[1:])
    # a second pull finds it everywhere: nothing is sent
    r = sd("images", "pull", pinned, "-i", inv, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["pushed"] == [], failure(r)


def test_registry_bad_input_is_one_line_and_changes_nothing(lab, published):
    pinned, tagged = published
    inv = str(lab.spec.inventory_path)
    images_before = _nodes_state(lab)
    wrong = tagged + "@sha256:" + "0" * 64
    r = sd("images", "pull", wrong, "-i", inv)
    assert r.returncode == 1 and "the digest does not match, refused" in r.stderr, failure(r)
    assert len([x for x in r.stderr.splitlines() if x.startswith("error:")]) == 1
    unreachable = f"{lab_registry.address(lab.spec).split(':')[0][:-1]}7:5000/lab/none:1"  # MGMT .7: nobody
    r = sd("images", "pull", unreachable, "-i", inv, timeout=120)
    assert r.returncode == 1 and "cannot reach the registry" in r.stderr, failure(r)
    assert len([x for x in r.stderr.splitlines() if x.startswith("error:")]) == 1 and "Traceback" not in r.stderr
    assert _nodes_state(lab) == images_before  # refused before anything changed
    r = sd("images", "pull", tagged, "-i", inv)  # no digest: a warning names the digest it resolved
    assert r.returncode == 0, failure(r)
    assert f"names no digest: it resolved to {pinned.split('@', 1)[1]}" in r.stderr.replace("\n", "")


def _recipe(folder: Path, name: str, image: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "name": name,
        "description": "a registry image in the lab",
        "model": "lab/tiny-model",
        "image": image,
        "topologies": ["solo", "2xsolo"],
        "default_topology": "solo",
        "vllm": {"max_model_len": 4096, "max_num_seqs": 16},
    }
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return str(folder / f"{name}.yaml")


def _running_hash(lab) -> str:
    r = lab.ssh(
        lab.nodes[0],
        "docker inspect --format '{{index .Config.Labels \"io.sparkdeploy.config-hash\"}}' sparkdeploy-vllm",
    )
    return r.stdout.strip()


def _up(*args: str) -> dict:
    r = sd("up", *args, "--timeout", GATE_TIMEOUT, "--json")
    assert r.returncode == 0, failure(r)
    return json.loads(r.stdout)


def test_up_serves_a_registry_image_and_rollback_brings_the_earlier_config_back(lab, published, tmp_path):
    pinned, tagged = published
    inv = str(lab.spec.inventory_path)
    recipe = _recipe(tmp_path / "recipes", "registry-sim", pinned)
    r = sd("models", "pull", "lab/tiny-model", "-i", inv)  # the lab hub's tiny model: a commit to record
    assert r.returncode == 0, failure(r)
    a = _up("-r", recipe, "-i", inv)
    assert a["ok"] and a["image"] == tagged
    hash_a = _running_hash(lab)
    b = _up("-r", recipe, "-i", inv, "--set", "vllm.max_num_seqs=8")  # a changed setting: a new config hash
    assert _running_hash(lab) != hash_a
    _up("-r", recipe, "-i", inv, "--set", "vllm.max_num_seqs=4")  # A is not the one before the newest now
    r = sd("history", "--json")
    records = {rec["id"]: rec for rec in json.loads(r.stdout)}
    assert records[a["history_id"]]["image_digest"] == pinned.split("@", 1)[1]
    assert records[b["history_id"]]["sets"] == ["vllm.max_num_seqs=8"]
    assert records[a["history_id"]]["vllm_version"] == "0.32.0" and records[a["history_id"]]["drivers"]
    assert len(records[a["history_id"]]["model_commit"] or "") == 40 and records[a["history_id"]]["simulated"]

    r = sd("rollback", str(a["history_id"]), "-i", inv, "--timeout", GATE_TIMEOUT, "--json")
    assert r.returncode == 0, failure(r)
    assert json.loads(r.stdout)["rolled_back_to"] == a["history_id"]
    assert _running_hash(lab) == hash_a  # A's configuration runs again

    # an image that is gone: the rollback names it and the command that brings it back, and changes nothing
    other = _recipe(tmp_path / "recipes", "definition-sim", "vllm-node")  # the lab runs vllm-sim for it
    _up("-r", other, "-i", inv)
    hash_other = _running_hash(lab)
    gone = lab.nodes[0]  # solo ran there; the other deployment now runs vllm-sim there, not this image
    lab.docker_exec(gone, "docker", "image", "rm", tagged)
    r = sd("rollback", str(a["history_id"]), "-i", inv)
    assert r.returncode == 1, failure(r)
    text = r.stderr.replace("\n", "")
    assert f"{gone.name}: image {tagged}" in text and "is gone" in text
    assert f"sparkdeploy images pull {pinned} --on {gone.name}" in text
    assert _running_hash(lab) == hash_other
