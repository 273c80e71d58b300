"""Security and robustness (issue 19): hostile or mistaken input is one line and exit 2, secrets never escape.

Every test here drives the real CLI in-process (the error contract of `sparkdeploy`), real files and sockets;
nothing is mocked. tests/lab/test_security_lab.py covers what needs a node.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import Secrets, load_secrets
from sparkdeploy.config.userfile import parse_yaml
from sparkdeploy.deploy import health
from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.topologies import build_deployment
from tests.conftest import REPO, SECRET_HF, SECRET_KEY, TWO_NODES

RECIPE = REPO / "recipes" / "openai-gpt-oss-120b.yaml"


def one_error(code: int, err: str, *needles: str) -> None:
    """Exit 2, no traceback, every line an `error:` line, each needle somewhere in it."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if not line.startswith("warning:")]
    assert lines and all(line.startswith("error: ") for line in lines), err
    for needle in needles:
        assert needle in err, err


def recipe_dir(tmp_path: Path, text: str, name: str = "openai-gpt-oss-120b") -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(text)
    return folder


# -- secrets: render --with-secrets ----------------------------------------------------------------------


def test_render_with_secrets_writes_0600_files_into_a_private_folder(cli, inventory_file, tmp_path):
    out = tmp_path / "out"
    code, _, err = cli(
        "render", "openai-gpt-oss-120b", "-t", "2xsolo", "-i", str(inventory_file), "--out", str(out), "--with-secrets"
    )
    assert code == 0, err
    assert (out.stat().st_mode & 0o777) == 0o700
    for node in ("spark1", "spark2"):
        secret = out / node / "secrets.env"
        assert (secret.stat().st_mode & 0o777) == 0o600 and SECRET_KEY in secret.read_text()
    assert not list(out.rglob("*.tmp"))


def test_render_never_writes_through_a_symlink(cli, inventory_file, tmp_path):
    out = tmp_path / "out"
    (out / "spark1").mkdir(parents=True, mode=0o700)
    out.chmod(0o700)
    stolen = tmp_path / "stolen"
    (out / "spark1" / "secrets.env").symlink_to(stolen)
    code, _, err = cli(
        "render", "openai-gpt-oss-120b", "-t", "solo", "-i", str(inventory_file), "--out", str(out), "--with-secrets"
    )
    assert code == 0, err
    assert not stolen.exists(), "the secret was written through the planted symlink"
    assert not (out / "spark1" / "secrets.env").is_symlink()


def test_render_with_secrets_refuses_a_folder_others_can_write(cli, inventory_file, tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    out.chmod(0o777)  # as another user's pre-created /tmp folder would be
    code, _, err = cli("render", "openai-gpt-oss-120b", "-i", str(inventory_file), "--out", str(out), "--with-secrets")
    one_error(code, err, str(out), "written by others", "chmod 700")
    assert not list(out.rglob("secrets.env"))


def test_render_refuses_an_out_symlink_for_secrets(cli, inventory_file, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    code, _, err = cli(
        "render", "openai-gpt-oss-120b", "-i", str(inventory_file), "--out", str(tmp_path / "link"), "--with-secrets"
    )
    one_error(code, err, "symlink")


@pytest.mark.parametrize("out", ["/proc/forbidden", "/proc/forbidden/deeper"])
def test_render_to_an_uncreatable_folder_is_one_line(cli, inventory_file, out):
    code, _, err = cli("render", "openai-gpt-oss-120b", "-i", str(inventory_file), "--out", out)
    one_error(code, err, out, "cannot create the folder")


def test_render_to_a_file_is_one_line(cli, inventory_file, tmp_path):
    target = tmp_path / "afile"
    target.write_text("x")
    code, _, err = cli("render", "openai-gpt-oss-120b", "-i", str(inventory_file), "--out", str(target))
    assert code == 2 and "Traceback" not in err


# -- secrets: the config hash is keyed ---------------------------------------------------------------------


def _hash_of(secret: str) -> str:
    inv = Inventory.model_validate(TWO_NODES)
    dep = build_deployment(
        inv,
        resolve("openai-gpt-oss-120b", "2xsolo"),
        Secrets({"HF_TOKEN": SECRET_HF, "LITELLM_MASTER_KEY": secret}, source="t"),
    )
    return dep.nodes[0].containers[0].config_hash


def test_config_hash_changes_with_a_secret_but_cannot_be_recomputed_without_the_key(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "a"))
    first, again, other = _hash_of("sk-weak"), _hash_of("sk-weak"), _hash_of("sk-other")
    assert first == again and first != other  # a changed secret still restarts the container
    key_files = list((tmp_path / "a" / "keys").glob("*.key"))
    assert len(key_files) == 1 and (key_files[0].stat().st_mode & 0o777) == 0o600
    # Someone who reads the hash (dry run, Docker label) has no key: their guess gives another hash.
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "b"))
    assert _hash_of("sk-weak") != first


def test_dry_run_json_hash_does_not_reveal_the_master_key(cli, write_inventory, tmp_path, monkeypatch):
    """The audit's attack: hash candidate keys the way the dry run does and compare with its config hash."""
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "state"))
    path = write_inventory()
    (tmp_path / "secrets.env").write_text(f"HF_TOKEN={SECRET_HF}\nLITELLM_MASTER_KEY=sk-letmein\n")
    code, out, err = cli("run-recipe", "openai-gpt-oss-120b", "-t", "2xsolo", "--dry-run", "--json", "-i", str(path))
    assert code == 0, err
    shown = {c["config_hash"] for n in json.loads(out)["nodes"] for c in n["containers"]}
    # The attacker's machine has its own (different) key, so no dictionary word reproduces the hash.
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "attacker"))
    for word in ("sk-password", "sk-admin", "sk-letmein", "sk-secret", "sk-1234", "sk-master"):
        assert _hash_of(word) not in shown


# -- secrets: files and errors -----------------------------------------------------------------------------


def test_secrets_file_given_as_inventory_is_not_echoed(cli, tmp_path):
    path = tmp_path / "secrets.env"
    path.write_text(f"HF_TOKEN={SECRET_HF}\nLITELLM_MASTER_KEY: {SECRET_KEY}: x\n")
    code, out, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(path))
    assert code == 2 and "Traceback" not in err
    assert SECRET_HF not in out + err and SECRET_KEY not in out + err


def test_missing_secrets_file_warns_in_a_dry_run_and_stops_up(cli, write_inventory, tmp_path):
    path = write_inventory(secrets=False)
    code, out, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(path))
    assert code == 0 and "secrets.env (cluster.secrets_file) does not exist" in out + err
    code, _, err = cli("run-recipe", "openai-gpt-oss-120b", "-i", str(path))  # refused before anything connects
    one_error(code, err, str(tmp_path / "secrets.env"), "does not exist", "chmod 600")


@pytest.mark.parametrize("case", ["folder", "fifo", "not-utf8"])
def test_bad_secrets_file_is_one_line_naming_it(cli, write_inventory, tmp_path, case):
    path = write_inventory(secrets=False)
    secrets = tmp_path / "secrets.env"
    if case == "folder":
        secrets.mkdir()
    elif case == "fifo":  # reading it would wait forever for a writer
        os.mkfifo(secrets)
    elif case == "not-utf8":
        secrets.write_bytes(b"HF_TOKEN=\xff\xfe\n")
    code, _, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(path))
    one_error(code, err, str(secrets))


# -- YAML: one loader for every user file ------------------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=False)
)


def test_alias_bomb_recipe_is_refused_quickly(cli, inventory_file, tmp_path):
    folder = recipe_dir(tmp_path, RECIPE.read_text() + "\n" + "x_bomb:\n  " + BOMB.replace("\n", "\n  "))
    t0 = time.monotonic()
    code, _, err = cli(
        "run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(inventory_file), "--recipes-dir", str(folder)
    )
    one_error(code, err, "aliases")
    assert time.monotonic() - t0 < 5


def test_alias_bomb_inventory_and_set_value_are_refused(cli, write_inventory, inventory_file):
    path = write_inventory(yaml.safe_dump(TWO_NODES) + "x: " + "&a [1, 1]\ny: *a\n", name="bomb.yaml")
    code, _, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(path))
    one_error(code, err, "aliases")
    code, _, err = cli(
        "run-recipe",
        "openai-gpt-oss-120b",
        "--dry-run",
        "-i",
        str(inventory_file),
        "--set",
        "vllm.extra_args=[&a --x, *a]",
    )
    one_error(code, err, "aliases")


def test_deep_yaml_is_one_line(cli, write_inventory):
    path = write_inventory("x: " + "[" * 5000 + "]" * 5000 + "\n", name="deep.yaml")
    code, _, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(path))
    one_error(code, err, "nested")


def test_duplicate_keys_are_refused(cli, inventory_file, tmp_path):
    folder = recipe_dir(tmp_path, RECIPE.read_text() + "model: evil/other-model\n")
    code, _, err = cli(
        "run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(inventory_file), "--recipes-dir", str(folder)
    )
    one_error(code, err, "duplicate key 'model'", "first on line")


def test_long_values_and_huge_set_keys_are_refused(cli, inventory_file):
    code, _, err = cli(
        "run-recipe",
        "openai-gpt-oss-120b",
        "--dry-run",
        "-i",
        str(inventory_file),
        "--set",
        ".".join(["a"] * 3000) + "=1",
    )
    one_error(code, err, "--set")
    assert len(err) < 400
    code, _, err = cli(
        "run-recipe",
        "openai-gpt-oss-120b",
        "--dry-run",
        "-i",
        str(inventory_file),
        "--set",
        "description=" + "d" * 5000,
    )
    one_error(code, err)


@pytest.mark.parametrize("which", ["inventory", "recipe"])
def test_non_utf8_files_are_one_line(cli, inventory_file, write_inventory, tmp_path, which):
    if which == "inventory":
        path = write_inventory(name="latin1.yaml")
        path.write_bytes(path.read_bytes() + "# caf\xe9\n".encode("latin-1"))
        code, _, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(path))
    else:
        folder = tmp_path / "recipes"
        folder.mkdir()
        (folder / "openai-gpt-oss-120b.yaml").write_bytes(RECIPE.read_bytes() + b"# caf\xe9\n")
        code, _, err = cli(
            "run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(inventory_file), "--recipes-dir", str(folder)
        )
    one_error(code, err, "not UTF-8")


def test_yaml_errors_name_line_and_column_never_the_text():
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: b\nLITELLM_MASTER_KEY: sk-x: y\n", "f.yaml")
    assert "line 2" in str(info.value) and "sk-x" not in str(info.value)


# -- recipe values that reached output or paths ---------------------------------------------------------------


@pytest.mark.parametrize(
    "sets",
    [
        "image=../../../etc",
        "image=/etc",
        "served_model_name=a\nb",
        "served_model_name=a\x1b[2Jb",
        "served_model_name=two words",
        "model=../../x",
    ],
)
def test_names_that_could_escape_are_refused(cli, inventory_file, sets):
    code, _out, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(inventory_file), "--set", sets)
    one_error(code, err)
    assert "\x1b" not in err.replace("\x1b[31m", "").replace("\x1b[0m", "")


def test_rich_markup_in_recipes_is_shown_as_written(cli, tmp_path):
    text = RECIPE.read_text().replace("description: ", "description: '[/x] [bold]x' # ", 1)
    folder = recipe_dir(
        tmp_path,
        text.replace("model: openai/gpt-oss-120b", "model: '[red]a'", 1).replace("'[red]a'", "openai/gpt-oss-120b"),
    )
    code, out, err = cli("recipes", "show", "openai-gpt-oss-120b", "--recipes-dir", str(folder), "--set", "env.A=[/x]")
    assert code == 0, err
    assert "[/x]" in out
    code, out, err = cli("recipes", "list", "--recipes-dir", str(folder))
    assert code == 0 and "Traceback" not in err


def test_secret_bearing_vllm_flags_are_refused(cli, inventory_file):
    for args in ('["--api-key","x"]', '["--hf-token=hf_abcdefgh"]'):
        code, out, err = cli(
            "run-recipe",
            "openai-gpt-oss-120b",
            "--dry-run",
            "-i",
            str(inventory_file),
            "--set",
            f"vllm.extra_args={args}",
        )
        one_error(code, err, "secrets file")
        assert "hf_abcdefgh" not in out + err


def test_recipes_dir_that_does_not_exist(cli, inventory_file):
    code, _, err = cli(
        "run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(inventory_file), "--recipes-dir", "/nonexistent"
    )
    one_error(code, err, "/nonexistent", "not a folder")


def test_backend_with_a_non_cluster_topology_warns(cli, inventory_file):
    code, out, err = cli(
        "run-recipe", "openai-gpt-oss-120b", "-t", "solo", "--backend", "ray", "--dry-run", "-i", str(inventory_file)
    )
    assert code == 0 and "warning: --backend ray applies to the cluster topology only" in out + err


# -- inventory -------------------------------------------------------------------------------------------------


def test_every_inventory_problem_is_reported(cli, write_inventory):
    data = json.loads(json.dumps(TWO_NODES))
    data["nodes"][1]["role"] = "head"
    data["nodes"][1]["mgmt_ip"] = data["nodes"][0]["mgmt_ip"]
    code, _, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(write_inventory(data)))
    one_error(code, err, "2 nodes have role head", "share the management IP")


def test_cross_node_problems_are_reported_with_field_errors(cli, write_inventory):
    data = json.loads(json.dumps(TWO_NODES))
    data["nodes"][0]["fabric_ip"] = "not-an-ip"
    data["nodes"][1]["role"] = "head"
    data["nodes"][1]["mgmt_ip"] = data["nodes"][0]["mgmt_ip"]
    code, _, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(write_inventory(data)))
    one_error(code, err, "fabric_ip", "2 nodes have role head", "share the management IP")
    assert len(err.strip().splitlines()) == 3


@pytest.mark.parametrize(
    "field,value",
    [
        ("ssh.user", "x; rm -rf ~"),
        ("ssh.user", "-oProxyCommand=x"),
        ("cluster.name", "../../etc"),
        ("cluster.name", "a" * 200),
    ],
)
def test_inventory_names_are_validated(cli, write_inventory, field, value):
    data = json.loads(json.dumps(TWO_NODES))
    if field == "ssh.user":
        data["nodes"][0]["ssh"]["user"] = value
    else:
        data["cluster"]["name"] = value
    code, _, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(write_inventory(data)))
    one_error(code, err, field.split(".")[-1])


def test_ipv6_management_addresses_are_bracketed_in_urls(cli, write_inventory):
    data = json.loads(json.dumps(TWO_NODES))
    data["nodes"][0]["mgmt_ip"], data["nodes"][1]["mgmt_ip"] = "2001:db8::1", "2001:db8::2"
    code, out, err = cli(
        "run-recipe", "openai-gpt-oss-120b", "-t", "2xsolo", "--dry-run", "--json", "-i", str(write_inventory(data))
    )
    assert code == 0, err
    dep = json.loads(out)
    assert dep["endpoint"] == "http://[2001:db8::1]:4000/v1"


# -- health gate --------------------------------------------------------------------------------------------------


class _Server:
    """A real TCP server on 127.0.0.1 that answers every connection with `handler(conn)`."""

    def __init__(self, handler):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.handler = handler
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            conn.recv(65536)
            self.handler(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.sock.close()


def _drip(conn):
    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000:
        conn.sendall(bytes([byte]))
        time.sleep(0.5)


def test_a_dripping_server_cannot_stretch_the_deadline():
    server = _Server(_drip)
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            health.http_get(f"http://127.0.0.1:{server.port}/health", time.monotonic() + 2.0)
        assert time.monotonic() - t0 < 3.5
    finally:
        server.close()


@pytest.mark.parametrize(
    "answer,why",
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "BadStatusLine"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + b'{"choices": [{}], "usage": [1, 2]}'.ljust(40), "token"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 18\r\n\r\n" + b'{"choices": "yes"}', "no choices"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n" + b"[1,2]", "no choices"),
    ],
)
def test_malformed_answers_are_not_healthy_yet_with_the_reason(answer, why):
    server = _Server(lambda conn: conn.sendall(answer))
    try:
        probe = health.Probe("p", f"http://127.0.0.1:{server.port}/v1/chat/completions", "completion")
        health._try(probe, "m", None, time.monotonic() + 5)
        assert why in probe.detail
        if why != "token":
            assert not probe.ok
    finally:
        server.close()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "1e12"])
def test_gate_timeout_must_be_finite(cli, inventory_file, value):
    code, _, err = cli("run-recipe", "openai-gpt-oss-120b", "-i", str(inventory_file), "--timeout", value)
    assert code == 2 and "Traceback" not in err and "--timeout" in err


# -- LiteLLM check without starting site ------------------------------------------------------------------------


def test_litellm_check_reads_metadata_without_running_a_planted_pth(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_dir = next((venv / "lib").glob("python3*/site-packages"))
    dist = site_dir / "litellm-1.82.8.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: litellm\nVersion: 1.82.8\n")
    marker = tmp_path / "PTH-RAN"
    (site_dir / "litellm_init.pth").write_text(f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n")
    script = REPO / "images" / "litellm-proxy" / "check_litellm.py"
    for line in (REPO / "images" / "litellm-proxy" / "entrypoint.sh").read_text().splitlines() + (
        REPO / "images" / "litellm-proxy" / "Dockerfile"
    ).read_text().splitlines():
        if "check_litellm.py" in line and "/opt/litellm/bin/python" in line:
            assert "python -S -I " in line, line
    result = subprocess.run([str(venv / "bin" / "python"), "-S", "-I", str(script)], capture_output=True, text=True)
    assert result.returncode == 1
    assert "1.82.8 is a compromised release" in result.stderr and "litellm_init.pth" in result.stderr
    assert not marker.exists(), "the planted .pth ran before the refusal"
    # The old way (site started) runs it: the test above can fail.
    subprocess.run([str(venv / "bin" / "python"), "-c", "pass"], check=True)
    assert marker.exists()


def test_secrets_never_in_repr():
    assert SECRET_HF not in repr(load_secrets(None, {"HF_TOKEN": SECRET_HF}))
