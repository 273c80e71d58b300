"""`images push NAME --from spark1`: an image built on spark1 goes to spark2 node to node over the fabric.

Proof that nothing passes through this machine: the bytes on the nodes' management and fabric interfaces
(read in the node containers) during the push, and the bytes this machine received on the orchestrating
SSH channel. A re-push after a small change sends only the changed layer."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from sparkdeploy.images.push import push_image
from tests.images.conftest import interface_bytes

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
NAME = "push-from-test"


@pytest.fixture
def images_dir(tmp_path, monkeypatch):
    from sparkdeploy.images import definitions

    root = tmp_path / "images"
    shutil.copytree(REPO / "images" / "debian-base", root / "debian-base")
    folder = root / NAME
    folder.mkdir()
    (folder / "manifest.yaml").write_text(
        f"name: {NAME}\ndescription: test\nbase: debian-base\nbuild_needs: {{arch: x86_64, disk_gb: 1}}\n"
    )
    (folder / "Dockerfile").write_text(
        "ARG BASE\nFROM ${BASE}\nRUN head -c 8000000 /dev/urandom > /big.bin\nCOPY small.bin /small.bin\n"
    )
    (folder / "small.bin").write_bytes(random.Random(1).randbytes(300_000))
    monkeypatch.setattr("sparkdeploy.paths.images_dir", lambda: root)
    definitions.clear_cache()
    yield root
    definitions.clear_cache()


def test_push_from_node_goes_over_the_fabric_and_resends_only_the_changed_layer(lab, images_dir, cli):
    from sparkdeploy.images.definitions import clear_cache, load_definition

    a, b = lab.nodes[0], lab.nodes[1]
    inv = str(lab.spec.inventory_path)
    tags = []
    try:
        code, out, err = cli("images", "build", NAME, "--on", a.name, "-i", inv)
        assert code == 0, err
        tag = load_definition(NAME).tag
        tags.append(tag)
        lab.ssh(b, f"docker image rm {tag} >/dev/null 2>&1; true", check=False)

        code, out, err = cli("images", "push", NAME, "--from", a.name, "--dry-run", "-i", inv)
        assert code == 0, err
        assert (
            f"chain over the fabric: {a.name} ({a.fabric_ip.split('/')[0]}) -> {b.name} ({b.fabric_ip.split('/')[0]})"
        ) in out, out
        assert f"{b.name} ({b.fabric_ip.split('/')[0]}): lacks" in out
        assert f"layers read on {a.name} from its layer store (sudo -n)" in out  # the lab user has it
        assert "none (only " in out, out  # a few MB: compressing would not pay
        # the sample auto-compression reads for larger pushes, on the real layer store: random, ~1.0
        from sparkdeploy.config.inventory import load_inventory
        from sparkdeploy.images.push_from import _sample_ratio, plan_from
        from sparkdeploy.runtime.remote import NodeConnection

        inventory = load_inventory(inv)
        plan, _ = plan_from(NAME, inventory, inventory.nodes[0], inventory.nodes[1:], dry_run=True)
        with NodeConnection(inventory.nodes[0], inventory) as source:
            assert _sample_ratio(source, plan) > 0.9

        before = {n.name: interface_bytes(lab, n) for n in (a, b)}
        code, out, err = cli("images", "push", NAME, "--from", a.name, "--json", "-i", inv)
        assert code == 0, out + err
        report = json.loads(out)
        after = {n.name: interface_bytes(lab, n) for n in (a, b)}
        row = report["nodes"][0]
        assert row["node"] == b.name and row["action"] == "sent" and row["ok"]
        assert row["bytes_sent"] > 7_000_000  # the random 8 MB layer (zstd cannot shrink it) at least
        delta = {n: {k: after[n][k] - before[n][k] for k in after[n]} for n in after}
        assert delta[b.name]["fabric"] >= row["bytes_sent"], delta  # it came over the fabric...
        assert delta[b.name]["mgmt"] < 0.05 * row["bytes_sent"], delta  # ...and not over the management LAN
        assert delta[a.name]["mgmt"] < 0.05 * row["bytes_sent"], delta
        assert report["bytes_through_this_machine"] < 64_000  # progress and result lines only
        ids = {n.name: lab.ssh(n, f"docker image inspect --format '{{{{.Id}}}}' {tag}").stdout.strip() for n in (a, b)}
        assert ids[a.name] == ids[b.name]

        # a small change: only the top layer is built anew on spark1, and only it travels
        (images_dir / NAME / "small.bin").write_bytes(random.Random(2).randbytes(300_000))
        clear_cache()
        code, out, err = cli("images", "build", NAME, "--on", a.name, "-i", inv)
        assert code == 0, err
        tag2 = load_definition(NAME).tag
        tags.append(tag2)
        assert tag2 != tag
        code, out, err = cli("images", "push", NAME, "--from", a.name, "--json", "-i", inv)
        assert code == 0, out + err
        row = json.loads(out)["nodes"][0]
        assert row["action"] == "sent" and row["layers_sent"] == 1, row
        assert row["bytes_sent"] < 1_000_000, row
        # and once there, a push again sends nothing
        code, out, err = cli("images", "push", NAME, "--from", a.name, "--json", "-i", inv)
        assert code == 0 and json.loads(out)["nodes"][0]["action"] == "present"
    finally:
        for n in (a, b):
            lab.ssh(n, f"docker image rm {' '.join(tags)} >/dev/null 2>&1; true", check=False)


def _image_id(lab, node, ref: str) -> str | None:
    result = lab.ssh(node, f"docker image inspect --format '{{{{.Id}}}}' {ref}", check=False)
    return result.stdout.strip() if result.returncode == 0 else None


REPORT_WITHIN_S = 30  # a cut is reported within this (the push takes ~3 s), not after the 600 s stall timeout


def _push_reported_in_time(lab, source_spec, *args, **kw):
    """push_from_node(*args, **kw), failing the test when it has not returned within REPORT_WITHIN_S. Then
    the stuck stream source on the node (the spark user's nodeside `push-source CONFIG`) is killed, by PID, so the push
    returns before the test fails."""
    from concurrent.futures import ThreadPoolExecutor, TimeoutError

    from sparkdeploy.images.push_from import push_from_node

    pool = ThreadPoolExecutor(1)
    future = pool.submit(push_from_node, *args, **kw)
    try:
        return future.result(timeout=REPORT_WITHIN_S)
    except TimeoutError:
        stuck = lab.docker_exec(source_spec, "ps", "-o", "pid=,stat=,args=", "-u", "spark,root", check=False).stdout
        stuck = "\n".join(line[:110] for line in stuck.splitlines() if "python3 -" in line or "zstd" in line)
        pids = lab.docker_exec(
            source_spec, "pgrep", "-u", "spark", "-f", "sparkdeploy-nodeside.* push-source ", check=False
        ).stdout.split()
        if pids:
            lab.docker_exec(source_spec, "kill", *pids, check=False)
        future.result(timeout=60)
        pytest.fail(
            f"the push still waited {REPORT_WITHIN_S} s after its stream was cut; on {source_spec.name}:\n{stuck}"
        )
    finally:
        pool.shutdown(wait=False)


@pytest.mark.parametrize("compression", ["none", "zstd"])  # both paths of the source (auto picks either)
def test_push_from_cut_midway_moves_no_tag_and_the_next_push_sends_only_the_rest(
    lab, lab_inventory, test_images, compression
):
    """spark1 holds `moving` = big (base + 3, 2, 1 and 24 MB random layers), spark2 holds `moving` = the base
    only: spark2 lacks 4 layers, sent as 4 loads (batch_bytes=1). spark1's fabric link is slowed (tc) so the
    stream is still flowing when spark2's relay (the python3 that receives and loads) is killed, by PID, once
    8 MB have arrived: the first loads have finished, the one of the 24 MB layer is cut."""
    from types import SimpleNamespace

    import docker

    from sparkdeploy.images.push_from import push_from_node
    from tests.images.conftest import CutAfter, remove_from_nodes

    a, b = lab.nodes[:2]
    spark1, spark2 = lab_inventory.nodes[:2]
    moving = f"{test_images.repo}:moving"
    ids = test_images.ids
    remove_from_nodes(
        SimpleNamespace(nodes=[b], ssh=lab.ssh),  # spark2 only: spark1 keeps what it has
        [moving, test_images.v1, test_images.v2, test_images.big, ids["v1"], ids["v2"], ids["big"]],
    )
    client = docker.from_env()
    base_id = client.images.get(test_images.base).id
    client.images.get(test_images.base).tag(*moving.rsplit(":", 1))
    assert push_image(moving, lab_inventory, nodes=[spark2])[0].ok
    client.images.get(test_images.big).tag(*moving.rsplit(":", 1))
    assert push_image(moving, lab_inventory, nodes=[spark1])[0].ok
    assert _image_id(lab, b, moving) == base_id and _image_id(lab, a, moving) == ids["big"]

    def kill_relay():
        pids = lab.docker_exec(
            b, "pgrep", "-u", "spark", "-f", "sparkdeploy-nodeside.* relay ", check=False
        ).stdout.split()
        assert pids, f"no relay running on {b.name}"
        lab.docker_exec(b, "kill", "-9", *pids)

    iface = lab.spec.fabric_iface
    lab.docker_exec(
        a, "tc", "qdisc", "replace", "dev", iface, "root", "tbf", "rate", "40mbit", "burst", "64kb", "latency", "400ms"
    )
    try:
        cutter = CutAfter(8_000_000, kill_relay)
        plan, outcomes, _ = _push_reported_in_time(
            lab, a, moving, lab_inventory, spark1, [spark2], progress=cutter, compression=compression, batch_bytes=1
        )
    finally:
        lab.docker_exec(a, "tc", "qdisc", "del", "dev", iface, "root", check=False)
    assert cutter.done, "the stream ended before 8 MB arrived: nothing was cut"
    whole = plan.plans[spark2.name]
    assert whole.layers_sent == 4, whole
    assert plan.compression == compression, plan.compression
    (cut,) = outcomes
    assert not cut.ok
    message = str(cut.error)
    assert message.startswith(f"{spark2.name}: push of {moving} from {spark1.name} failed, no tag moved:"), message
    assert "\n" not in message and "Traceback" not in message, message
    assert _image_id(lab, b, moving) == base_id  # the tag did not move...
    assert _image_id(lab, b, ids["big"]) is None  # ...and the new image ID is not there at all

    plan, outcomes, _ = push_from_node(moving, lab_inventory, spark1, [spark2], compression=compression, batch_bytes=1)
    (done,) = outcomes
    assert done.ok, done.error
    assert done.value.action == "sent"
    assert 1 <= done.value.layers_sent < 4, done.value  # the loads that finished were kept...
    assert done.value.raw_bytes < whole.estimate - 3_000_000, (done.value, whole.estimate)  # (3 MB: load 1)
    assert _image_id(lab, b, moving) == ids["big"]
