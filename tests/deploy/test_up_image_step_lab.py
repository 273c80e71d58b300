"""`up`'s image step in the lab (issue 37 item 2): a node lacking the deployment's image gets it from a node that has
it, over the fabric, and then only that node is read again; the plan applied is made over what it now holds.

`up` runs in this process so that a spy can count the reads of the nodes' state; the reads, the push and
everything else are the real ones, over the lab's sshd and Docker engines.
"""

from __future__ import annotations

import pytest

from sparkdeploy.deploy import up as up_pipeline
from sparkdeploy.deploy.progress import Reporter
from sparkdeploy.topologies.context import load_deployment
from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab

RECIPE = "openai-gpt-oss-120b"
TOPOLOGY = "2xsolo"  # one engine on each node: both need the engine's image
GATE_TIMEOUT_S = 240.0


def _image_id(lab, node, ref: str) -> str | None:
    r = lab.ssh(node, f"docker image inspect --format '{{{{.Id}}}}' {ref}", check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def test_a_missing_image_is_pushed_from_a_node_then_only_that_node_is_read_again(lab, monkeypatch):
    inv = str(lab.spec.inventory_path)
    spark1, spark2 = lab.nodes[0], lab.nodes[1]
    r = sd("down", "-i", inv)
    assert r.returncode == 0, failure(r)
    ref = load_deployment(inv, RECIPE, TOPOLOGY).image_tag
    want = _image_id(lab, spark1, ref)
    assert want, f"{ref} is not on {spark1.name}"
    reads: list[tuple[str, list[str]]] = []
    real = up_pipeline.gather_facts

    def spy(session, nodes, *a, **k):  # records, then reads for real
        reads.append((k.get("what", "state"), [n.name for n in nodes]))
        return real(session, nodes, *a, **k)

    monkeypatch.setattr(up_pipeline, "gather_facts", spy)
    try:
        lab.ssh(spark2, f"docker image rm {ref} >/dev/null", check=True)  # untagged: its layers may stay
        assert _image_id(lab, spark2, ref) is None
        result = up_pipeline.deploy(
            recipe=RECIPE, topology=TOPOLOGY, inventory=inv, timeout=GATE_TIMEOUT_S, reporter=Reporter()
        )
        assert result.ok
        [pushed] = result.pushed or [None]
        assert pushed is not None and pushed["image"] == ref and pushed["from"] == spark1.name, result.pushed
        assert [(n["node"], n["ok"]) for n in pushed["nodes"]] == [(spark2.name, True)], pushed
        assert _image_id(lab, spark2, ref) == want  # spark1's image, under its tag
        state_reads = [names for what, names in reads if what == "state"]
        assert state_reads == [[spark1.name, spark2.name], [spark2.name]], reads  # every node once, then spark2
        started = {s["node"] for s in result.steps if s["step"] == "start-container" and s["status"] == "changed"}
        assert spark2.name in started
    finally:
        if _image_id(lab, spark2, ref) is None:  # leave the shared lab as it was: the image on every node
            sd("images", "push", ref, "--from", spark1.name, "--to", spark2.name, "-i", inv)
        sd("down", "-i", inv)
