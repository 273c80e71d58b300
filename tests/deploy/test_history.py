"""History and rollback without the lab: the record file, `history`, and bad input (the lab test runs up A, up B,
rollback to A, and a rollback whose image is gone: tests/deploy/test_history_lab.py)."""

from __future__ import annotations

import json
import shutil

import paramiko
import pytest
import yaml

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.deploy import history
from sparkdeploy.errors import ConfigError, StepFailed
from tests.conftest import TWO_NODES


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "state"))
    monkeypatch.setenv(history.HISTORY_ENV, str(tmp_path / "state" / "history"))
    return tmp_path / "state"


def _write(records):
    path = history.history_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "{cut line\n")


def _rec(i, **kw):
    return dict(
        {
            "id": i,
            "time": f"2026-11-25T16:0{i}:00+00:00",
            "recipe": "r",
            "recipe_hash": f"{i:064x}",
            "recipe_text": "name: r\n",
            "sets": [],
            "topology": "solo",
            "backend": None,
            "image": "vllm-sim",
            "image_tag": "sparkdeploy/vllm-sim:0123",
            "image_id": "sha256:" + "ab" * 32,
            "nodes": ["spark1"],
        },
        **kw,
    )


def test_records_read_back_in_order_and_a_cut_line_is_skipped(state):
    _write([_rec(1), _rec(2), _rec(3)])
    assert [r["id"] for r in history.read_records()] == [1, 2, 3]
    assert history.find(None)["id"] == 2  # no ID: the one before the newest
    assert history.find("1")["id"] == 1


def test_history_lists_newest_first(cli, state):
    _write([_rec(1), _rec(2, sets=["vllm.max_num_seqs=64"])])
    code, out, err = cli("history", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [r["id"] for r in data] == [2, 1] and "recipe_text" not in data[0]
    code, out, err = cli("history")
    assert code == 0 and "--set" in out and out.index("16:02") < out.index("16:01")


def test_an_unknown_id_is_exit_2_and_nothing_to_roll_back_is_exit_1(cli, state):
    _write([_rec(1)])
    with pytest.raises(ConfigError):
        history.find("7")
    code, _out, err = cli("rollback", "7")
    assert code == 2 and "no deployment '7' in the history" in err and "one of 1" in err
    with pytest.raises(StepFailed):
        history.find(None)
    code, _out, err = cli("rollback")
    assert code == 1 and "nothing to roll back to" in err and "Traceback" not in err


def test_the_recipe_hash_covers_the_text_and_the_sets():
    a = history.recipe_hash("name: r\n", [])
    assert a != history.recipe_hash("name: r\n", ["vllm.max_num_seqs=64"]) and a != history.recipe_hash("name: s\n", [])
    assert a == history.recipe_hash("name: r\n", [])


# -- per cluster (issue 43 item 5) -------------------------------------------------------------------------------


def _key_line(host):
    key = paramiko.ECDSAKey.generate()
    return f"{host} {key.get_name()} {key.get_base64()}\n"


def _cluster(folder, name="home", ips=("192.0.2.1", "192.0.2.2"), keys=True):
    """An inventory of two nodes in `folder`, with their host keys pinned in its known_hosts (keys=True)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = json.loads(json.dumps(TWO_NODES))
    data["cluster"]["name"] = name
    data["cluster"]["known_hosts"] = "known_hosts"
    for node, ip in zip(data["nodes"], ips, strict=True):
        node["mgmt_ip"] = ip
    (folder / "known_hosts").write_text("".join(_key_line(ip) for ip in ips) if keys else "")
    (folder / "inventory.yaml").write_text(yaml.safe_dump(data))
    (folder / "secrets.env").write_text("HF_TOKEN=x\n")
    (folder / "secrets.env").chmod(0o600)
    return folder / "inventory.yaml"


@pytest.fixture
def home(tmp_path, monkeypatch):
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no system known_hosts of the developer's


def test_a_cluster_is_its_pinned_host_keys_else_its_name_and_addresses(tmp_path, home):
    a = _cluster(tmp_path / "a")
    ident = history.cluster_identity(load_inventory(a))
    assert ident.startswith("hostkeys-")
    # a copy of the inventory elsewhere (same known_hosts content), or the cluster renamed: the same cluster
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "a", copy)
    data = yaml.safe_load((copy / "inventory.yaml").read_text())
    data["cluster"]["name"] = "renamed"
    (copy / "inventory.yaml").write_text(yaml.safe_dump(data))
    assert history.cluster_identity(load_inventory(copy / "inventory.yaml")) == ident
    # the same addresses and name but other machines (other host keys): another cluster
    assert history.cluster_identity(load_inventory(_cluster(tmp_path / "b"))) != ident
    # no key pinned: the name and the addresses
    c = load_inventory(_cluster(tmp_path / "c", keys=False))
    assert history.cluster_identity(c) == f"name-{c.cluster_id}"


def test_records_store_the_absolute_inventory_and_the_cluster(tmp_path, home, state, monkeypatch):
    from tests.deploy.deploy_helpers import make_deployment

    dep = make_deployment("solo")
    dep.inventory = load_inventory(_cluster(tmp_path / "a"))
    (tmp_path / "r.yaml").write_text("name: r\n")
    dep.recipe.source = tmp_path / "r.yaml"
    blank = {"image_id": "", "driver": ""}
    monkeypatch.setattr(history, "_node_facts", lambda _c, nodes, _t: {n.name: blank for n in nodes})
    monkeypatch.chdir(tmp_path / "a")
    rec = history.record_deployment(dep, {}, [], "inventory.yaml")
    assert rec["inventory"] == str(tmp_path / "a" / "inventory.yaml")  # absolute, whatever was typed
    assert rec["cluster"] == history.cluster_identity(dep.inventory) and rec["cluster_name"] == "home"
    assert history.read_records()[-1]["cluster"] == rec["cluster"]


def test_history_filters_by_inventory_and_rollback_refuses_another_cluster_in_one_line(cli, tmp_path, home, state):
    a, b = _cluster(tmp_path / "a"), _cluster(tmp_path / "b", name="other", ips=("192.0.2.7", "192.0.2.8"))
    ca, cb = (history.cluster_identity(load_inventory(x)) for x in (a, b))
    _write(
        [
            _rec(1, cluster=ca, cluster_name="home", inventory=str(a)),
            _rec(2, cluster=ca, cluster_name="home", inventory=str(a)),
            _rec(3, cluster=cb, cluster_name="other", inventory=str(b)),
        ]
    )
    code, out, err = cli("history", "-i", str(a), "--json")
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)] == [2, 1]
    code, out, err = cli("history", "-i", str(b), "--json")
    assert [r["id"] for r in json.loads(out)] == [3]
    code, out, _ = cli("history")
    assert "other" in out and "home" in out  # without -i: every cluster, named
    # a record of cluster b rolled back with a's inventory: one line, exit 2, nothing tried
    code, out, err = cli("rollback", "3", "-i", str(a))
    assert code == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "deployment 3 ran on another cluster (other" in lines[0] and str(b) in lines[0], err
    # no ID: the one before the newest OF THIS CLUSTER (2 is a's newest, so 1), not record 2 of the whole file
    assert history.find(None, ca)["id"] == 1
    for cluster in (cb, None):  # None: the newest record's cluster (b), which has one record
        with pytest.raises(StepFailed, match="holds 1 deployment"):
            history.find(None, cluster)


def test_a_record_reads_the_image_id_and_driver_as_registered_facts():
    """Node state only through facts/ (issue 37 item 4): the record's image ID and GPU driver come from the one
    facts script (the set HISTORY), fed here a real lab node's output (tests/facts/samples/lab-node-doctor.txt)."""
    from pathlib import Path

    from sparkdeploy.facts.catalog import HISTORY
    from tests.deploy.deploy_helpers import make_deployment
    from tests.support.doubles import RecordingConn

    sample = (Path(__file__).parent.parent / "facts" / "samples" / "lab-node-doctor.txt").read_text()
    sim = "sparkdeploy/vllm-sim:3cba9f084bdb"
    node = make_deployment("solo").inventory.nodes[0]
    conn = RecordingConn(node, {"bash -c": (0, sample)})
    read = history._node_facts({node.name: conn}, [node], sim)
    assert read == {node.name: {"image_id": sample.split(f"{sim} ")[1].split()[0], "driver": "580.95.05"}}
    [command] = conn.commands
    assert all(f"__f_{name}()" in command for name in HISTORY) and "__f_inspect()" not in command
