"""The stack gateway's routes without nodes (deploy/stack/routes.py): what routes.json says after a deployment
leaves, is taken out or comes back, the one write that changes it, and how long after a write the gateway's hook
routes by it; `down`'s last line computed from the facts read after a real removal in the lab (samples), and its
`--keys` (the gateway's keys and spend go only when asked). The gateway's side is tests/deploy/test_stack_lab.py."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from sparkdeploy.config.inventory import Node
from sparkdeploy.deploy import down
from sparkdeploy.deploy.plan import GATEWAY_KEPT, StepKind, plan_removal
from sparkdeploy.deploy.stack import routes as gateway_routes
from sparkdeploy.deploy.stack import units
from sparkdeploy.deploy.stack.routes import Gateway, Routes, group
from sparkdeploy.facts import FileFact, NodeFacts, StateDirFact, parse
from tests.conftest import TWO_NODES

SAMPLES = Path(__file__).resolve().parents[1] / "facts" / "samples"
HOOK = units.HOOK_SOURCE


def three() -> Routes:
    return Routes(
        {
            "chat": group("chat", "glm-4.7-flash", ["http://10.0.0.1:8000/v1"]),
            "coder": group("coder", "qwen3-coder-30b", ["http://10.0.0.1:8001/v1", "http://10.0.0.2:8001/v1"]),
            "flash": group("flash", "glm-4.7-flash-int4", ["http://10.0.0.1:8002/v1"]),
        }
    )


def test_a_deployment_that_leaves_is_no_longer_routed_nor_a_model_of_the_stack():
    routes = three().taken_out("flash", "restarting").without(["flash"])
    assert routes.served() == routes.models() == ["glm-4.7-flash", "qwen3-coder-30b"]
    assert routes.out == {}  # its out mark left with it
    assert {e["model_name"] for e in routes.model_list()} == {"glm-4.7-flash", "qwen3-coder-30b"}
    assert json.loads(routes.text())["unavailable"] == {}


def test_taken_out_and_put_back_a_group_or_one_engine():
    out = three().taken_out("coder", "its group restarts (spark2's rank died)")
    assert out.served() == ["glm-4.7-flash", "glm-4.7-flash-int4"] and "qwen3-coder-30b" in out.models()
    assert out.unavailable() == {
        "qwen3-coder-30b": "deployment coder is out of the gateway: its group restarts (spark2's rank died)"
    }
    back = out.put_back("coder")
    assert back.served() == three().served() and back.text() == three().text()

    one = three().taken_out("coder-1", "does not answer /health")  # one engine of two: the model stays routed
    assert "qwen3-coder-30b" in one.served() and one.unavailable() == {}
    apis = [e["litellm_params"]["api_base"] for e in one.model_list() if e["model_name"] == "qwen3-coder-30b"]
    assert apis == ["http://10.0.0.1:8001/v1"]
    both = one.taken_out("coder-0", "does not answer /health")
    assert "qwen3-coder-30b" not in both.served()
    assert "coder-0: does not answer /health" in both.unavailable()["qwen3-coder-30b"]


def test_routes_json_is_deterministic_and_read_back():
    routes = three().taken_out("chat", "why")
    assert routes.text() == three().taken_out("chat", "why").text()
    data = json.loads(routes.text())
    assert gateway_routes.parse(data) == routes
    assert [e["model_info"]["id"] for e in data["model_list"]] == ["coder-0", "coder-1", "flash-0"]
    assert gateway_routes.parse({"model_list": []}) is None and gateway_routes.parse(None) is None


def test_the_write_is_one_step_and_no_change_when_the_node_has_it():
    head = Node.model_validate(TWO_NODES["nodes"][0])
    routes = three().without(["flash"])
    spec_sha = gateway_routes.plan_write(
        Gateway(head, ".sparkdeploy-gateway", NodeFacts("spark1", home="/home/spark")), routes, "x"
    ).steps[0]
    assert (spec_sha.kind, spec_sha.target, spec_sha.change) == (StepKind.WRITE, "routes.json", True)
    assert spec_sha.file is not None and json.loads(spec_sha.file.content)["groups"].keys() == {"chat", "coder"}
    have = NodeFacts("spark1", home="/home/spark", files={"routes.json": FileFact("routes.json", 0o644, "")})
    have.files["routes.json"].sha256 = spec_sha.file.sha256
    again = gateway_routes.plan_write(Gateway(head, ".sparkdeploy-gateway", have), routes, "x")
    assert [s.change for s in again.steps] == [False]


def test_settling_waits_for_every_gateway_worker_to_look_at_the_file_again():
    """The hook looks at routes.json at most every CHECK_S: SETTLE_S after a write no worker routes by the old."""
    tree = ast.parse(HOOK.read_text())
    check = next(
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and getattr(n.targets[0], "id", "") == "CHECK_S"
        and isinstance(n.value, ast.Constant)
    )
    assert gateway_routes.SETTLE_S >= 2 * check
    routes_name = next(
        n.value.args[1].value
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "ROUTES"
    )
    assert routes_name == gateway_routes.ROUTES_FILE


def test_downs_last_line_names_what_still_runs_and_why():
    f = parse("spark1", (SAMPLES / "lab-stack-down.txt").read_text())
    line = down.what_is_left({"spark1": f, "spark2": NodeFacts("spark2")}, ".sparkdeploy", "flash")
    assert line == (
        "Left on spark1: chat, gateway, guard still run (only flash was asked to go; `sparkdeploy down` removes the "
        "rest). Nothing of sparkdeploy's is left on spark2."
    )


def test_downs_last_line_says_the_gateways_keys_are_kept_and_how_to_remove_them():
    f = parse("spark1", (SAMPLES / "lab-after-down-keys-kept.txt").read_text())
    line = down.what_is_left({"spark1": f}, ".sparkdeploy", None)
    assert "Left on spark1: ~/.sparkdeploy-gateway keeps the gateway's keys and spend counts (keys.json, spend)" in line
    assert "on purpose" in line and "`sparkdeploy down --keys` removes them" in line
    assert "Nothing of" not in line


def test_a_folder_of_ours_left_with_files_or_without_its_containers_is_named():
    f = NodeFacts("spark2")
    f.state_dirs = {
        ".sparkdeploy": StateDirFact(".sparkdeploy", 0o700, "", ["notes.txt"]),
        ".sparkdeploy-coder": StateDirFact(".sparkdeploy-coder", 0o700, "", ["manifest.json", "node.env"]),
        ".sparkdeploy-x.y": StateDirFact(".sparkdeploy-x.y", 0o700, "", ["a"]),  # not a name of ours
    }
    line = down.what_is_left({"spark2": f}, ".sparkdeploy", None)
    assert "~/.sparkdeploy stays: it holds what sparkdeploy did not write (notes.txt)" in line
    assert "~/.sparkdeploy-coder holds the files of coder, which runs no container" in line
    assert "`sparkdeploy down --deployment coder` removes them" in line and "x.y" not in line


def test_keys_and_spend_go_only_with_down_keys():
    node = Node.model_validate(TWO_NODES["nodes"][0])
    f = NodeFacts("spark1", home="/home/spark", state_dir_mode=0o700)
    f.files = {"keys.json": FileFact("keys.json", 0o600)}
    f.other_entries = ["spend"]
    kept = plan_removal(node, f, ".sparkdeploy-gateway", "ours")
    assert [(s.kind, s.change) for s in kept.steps] == [(StepKind.RMDIR, False)]
    assert "keys.json" in kept.steps[0].reason
    gone = plan_removal(node, f, ".sparkdeploy-gateway", "ours", GATEWAY_KEPT)
    assert [(s.kind, s.target, s.change) for s in gone.steps] == [
        (StepKind.REMOVE_FILE, "keys.json", True),
        (StepKind.REMOVE_FOLDER, "spend", True),
        (StepKind.RMDIR, "/home/spark/.sparkdeploy-gateway", True),
    ]


def test_down_keys_with_another_deployment_is_refused_before_connecting(cli, inventory_file):
    code, out, err = cli("down", "--keys", "--deployment", "chat", "-i", str(inventory_file))
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--keys" in lines[0] and "down --deployment gateway --keys" in lines[0]


def test_a_gateway_folder_with_spend_counts_of_no_key_goes_with_down():
    """`up --stack` makes spend/ whether or not a key was ever made: without keys.json it counts no key, so `down`
    removes it (and the folder) instead of calling it kept keys."""
    from sparkdeploy.config.inventory import Inventory
    from sparkdeploy.deploy.stack import converge as stack

    inv = Inventory.model_validate(TWO_NODES)
    f = NodeFacts("spark1", home="/home/spark", state_dir_mode=0o700, other_entries=["spend"])
    f.state_dirs = {".sparkdeploy-gateway": StateDirFact(".sparkdeploy-gateway", 0o700, "", ["spend"])}
    assert stack._state_dirs_on(inv, {"spark1": f}, keys=False) == {"gateway"}
    also = stack._also("gateway", {"spark1": f}, inv.nodes[0], keys=False)
    steps = plan_removal(inv.nodes[0], f, ".sparkdeploy-gateway", "ours", also).steps
    assert [(s.kind, s.target, s.change) for s in steps] == [
        (StepKind.REMOVE_FOLDER, "spend", True),
        (StepKind.RMDIR, "/home/spark/.sparkdeploy-gateway", True),
    ]
    assert down.what_is_left({"spark1": f}, ".sparkdeploy", None).startswith(
        "Left on spark1: ~/.sparkdeploy-gateway stays"
    )
    f.files = {"keys.json": FileFact("keys.json", 0o600)}
    f.state_dirs[".sparkdeploy-gateway"].entries = ["keys.json", "spend"]
    assert stack._state_dirs_on(inv, {"spark1": f}, keys=False) == set()  # kept: its keys
    assert stack._also("gateway", {"spark1": f}, inv.nodes[0], keys=False) is None
