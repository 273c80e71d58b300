"""Inputs that were accepted and are now refused with one line and a fix (issue 24, item 6).

Each case runs `render --out` through the CLI in-process (the error contract): exit 2, exactly one error line
naming the file and the field, with "(fix: ...)", and nothing written (no --out folder, no local state).
"""

from __future__ import annotations

import copy

import pytest

from sparkdeploy.recipes.recipe import MAX_NUM_SEQS, MAX_TOKENS
from tests.conftest import REPO, TWO_NODES

RECIPE = "openai-gpt-oss-120b"


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    folder = tmp_path / "state"
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(folder))
    return folder


def refused(cli, tmp_path, state, *args: str) -> str:
    """Render, expect the one-line refusal; return that line."""
    out = tmp_path / "out"
    code, stdout, err = cli("render", RECIPE, *args, "--out", str(out))
    assert code == 2, err
    assert "Traceback" not in err and stdout == "", (stdout, err)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "(fix: " in lines[0], err
    assert not out.exists(), "render wrote files for a refused input"
    assert not state.exists(), "render wrote local state for a refused input"
    return lines[0]


def inventory(write_inventory, cluster=None, node0=None, nodes=None):
    data = copy.deepcopy(TWO_NODES)
    data["cluster"].update(cluster or {})
    data["nodes"][0].update(node0 or {})
    if nodes is not None:
        data["nodes"] = data["nodes"][:nodes]
    return write_inventory(data)


@pytest.mark.parametrize(
    "value",
    ["~/hf\nexec evil", "/data/hf\r", "/data/\x1b[2Jhf", "/data/hf\x00"],
    ids=["newline", "carriage return", "escape", "NUL"],
)
def test_a_control_character_in_hf_cache_is_refused(cli, write_inventory, tmp_path, state, value):
    path = inventory(write_inventory, cluster={"hf_cache": value})
    line = refused(cli, tmp_path, state, "-t", "solo", "-i", str(path))
    assert line.startswith(f"error: {path}: cluster.hf_cache: holds a newline or another control character")
    assert "fix: write it on one line" in line


@pytest.mark.parametrize(
    "address, what",
    [
        ("0.0.0.0", "the unspecified address"),
        ("255.255.255.255", "the broadcast address"),
        ("224.0.0.251", "a multicast address"),
        ("240.0.0.1", "in the reserved range 240.0.0.0/4"),
        ("::", "the unspecified address"),
        ("ff02::1", "a multicast address"),
    ],
)
def test_an_address_no_machine_has_is_refused_as_mgmt_ip(cli, write_inventory, tmp_path, state, address, what):
    path = inventory(write_inventory, node0={"mgmt_ip": address})
    line = refused(cli, tmp_path, state, "-t", "solo", "-i", str(path))
    assert line.startswith(f"error: {path}: nodes[0].mgmt_ip: {address} is {what}") and "not one machine's" in line
    assert "fix: write the node's own IP address in mgmt_ip" in line


@pytest.mark.parametrize(
    "address, what",
    [
        ("0.0.0.0/24", "is the unspecified address"),
        ("255.255.255.255/32", "is the broadcast address"),
        ("198.51.100.255/24", "is the broadcast address of 198.51.100.0/24"),
        ("198.51.100.0/24", "is the network address of 198.51.100.0/24"),
    ],
)
def test_the_same_rule_holds_for_fabric_ip(cli, write_inventory, tmp_path, state, address, what):
    path = inventory(write_inventory, node0={"fabric_ip": address}, nodes=1)
    line = refused(cli, tmp_path, state, "-t", "solo", "-i", str(path))
    assert line.startswith(f"error: {path}: nodes[0].fabric_ip: {address.split('/')[0]} {what}"), line
    assert "(fix: write the node" in line


def test_loopback_is_refused_where_other_nodes_must_reach_the_node(cli, write_inventory, tmp_path, state):
    path = inventory(write_inventory, node0={"mgmt_ip": "127.0.0.1"})
    line = refused(cli, tmp_path, state, "-t", "solo", "-i", str(path))
    assert line.startswith(
        f"error: {path}: nodes[0].mgmt_ip: 127.0.0.1 is a loopback address: the other nodes cannot reach spark1 there"
    ), line


def test_loopback_and_link_local_stay_accepted_on_one_node(cli, write_inventory, tmp_path):
    """sparkdeploy run on the Spark itself (127.0.0.1), a direct cable on link-local addresses."""
    path = inventory(write_inventory, node0={"mgmt_ip": "127.0.0.1", "fabric_ip": "169.254.10.1/16"}, nodes=1)
    code, _, err = cli("render", RECIPE, "-t", "solo", "-i", str(path), "--out", str(tmp_path / "out"))
    assert code == 0, err


def test_2xsolo_on_one_node_is_refused_by_its_registration(cli, write_inventory, tmp_path, state):
    path = inventory(write_inventory, nodes=1)
    line = refused(cli, tmp_path, state, "-t", "2xsolo", "-i", str(path))
    assert line == (
        f"error: {path}: nodes: the 2xsolo topology needs at least 2 nodes, this inventory has 1 "
        "(fix: add the second Spark or use --topology solo)"
    )


def test_a_31_digit_max_model_len_is_refused_with_the_bound(cli, inventory_file, tmp_path, state):
    line = refused(
        cli,
        tmp_path,
        state,
        "-t",
        "solo",
        "-i",
        str(inventory_file),
        "--set",
        "vllm.max_model_len=1000000000000000000000000000000",
    )
    recipe = REPO / "recipes" / f"{RECIPE}.yaml"
    assert line.startswith(f"error: {recipe} (with --set): vllm.max_model_len: "), line
    assert f"less than or equal to {MAX_TOKENS}" in line and line.endswith(f"(fix: give at most {MAX_TOKENS})")


@pytest.mark.parametrize("field, bound", [("max_num_seqs", MAX_NUM_SEQS), ("max_num_batched_tokens", MAX_TOKENS)])
def test_the_other_integer_fields_have_their_bound(cli, inventory_file, tmp_path, state, field, bound):
    line = refused(cli, tmp_path, state, "-t", "solo", "-i", str(inventory_file), "--set", f"vllm.{field}={bound + 1}")
    assert f"vllm.{field}: " in line and line.endswith(f"(fix: give at most {bound})"), line


def test_a_bool_for_max_num_seqs_in_a_recipe_file_is_refused(cli, inventory_file, tmp_path, state):
    folder = tmp_path / "recipes"
    folder.mkdir()
    text = (REPO / "recipes" / f"{RECIPE}.yaml").read_text().replace("\nvllm:\n", "\nvllm:\n  max_num_seqs: true\n")
    assert "  max_num_seqs: true\n" in text
    (folder / f"{RECIPE}.yaml").write_text(text)
    line = refused(cli, tmp_path, state, "-t", "solo", "-i", str(inventory_file), "--recipes-dir", str(folder))
    assert line.startswith(
        f"error: {folder / RECIPE}.yaml: vllm.max_num_seqs: Input should be a valid integer (got True)"
    ), line
    assert line.endswith("(fix: give a whole number without quotes or a decimal point, e.g. 4096)")


@pytest.mark.parametrize("value", ["true", "4.0", "'12'"])
def test_a_port_is_a_whole_number_as_written(cli, write_inventory, tmp_path, state, value):
    path = inventory(write_inventory, cluster={"vllm_port": {"true": True, "4.0": 4.0, "'12'": "12"}[value]})
    line = refused(cli, tmp_path, state, "-t", "solo", "-i", str(path))
    assert f"{path}: cluster.vllm_port: Input should be a valid integer" in line and "fix: give a whole number" in line


@pytest.mark.parametrize(
    "setting, fix",
    [
        ("vllm.gpu_memory_utilization=true", "give a number without quotes, e.g. 0.7"),
        ("litellm.timeout=.inf", "give a finite number, e.g. 600"),
        ("vllm.enforce_eager=maybe", "give true or false"),
        ("description=5", "give text; quote it"),
        ("vllm.extra_args=x", "give a list, e.g. [a, b]"),
        ("vllm=3", "give a mapping (key: value)"),
        ("default_topology=x", "use one of 'solo', 'cluster', '2xsolo' or 'replicas'"),
        ("vllm.gpu_memory_utilization=0.99", "give at most 0.95"),
        ("litellm.num_retries=-1", "give 0 or more"),
        ("topologies=[]", "give at least 1 item(s)"),
    ],
)
def test_every_pydantic_error_has_a_fix(cli, inventory_file, tmp_path, state, setting, fix):
    line = refused(cli, tmp_path, state, "-t", "solo", "-i", str(inventory_file), "--set", setting)
    field = setting.split("=")[0]
    assert f" (with --set): {field}: " in line and f"(fix: {fix}" in line, line
    assert "instance of" not in line  # pydantic's class names stay out of the message
