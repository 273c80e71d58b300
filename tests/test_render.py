"""Rendering safety: hostile values stay inert, undefined variables fail, scripts pass shellcheck,
YAML comes from a serializer. The rendered scripts are executed for real against stand-in `docker` and
`vllm` commands that record the argv they receive."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.topologies import build_deployment, lint
from sparkdeploy.topologies.render import render, shell_join, shell_path, shell_quote
from tests.conftest import SECRET_HF, SECRET_KEY, TWO_NODES

HOSTILE = [
    "; touch PWNED",
    "$(touch PWNED)",
    "`touch PWNED`",
    'it\'s "quoted"',
    "two words",
    "line\nbreak",
    "--help",
    "-rf",
    "$HOME",
    "a|b&c>d<e",
]


def recorder(tmp_path: Path, name: str) -> Path:
    """A stand-in executable that writes the argv it got as JSON, one file per call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / name
    exe.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys, time\n"
        f"out = os.path.join({str(tmp_path)!r}, {name!r} + '-' + str(time.monotonic_ns()) + '.json')\n"
        "json.dump(sys.argv[1:], open(out, 'w'))\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def recorded(tmp_path: Path, name: str) -> list[list[str]]:
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob(f"{name}-*.json"))]


def deployment(topology="solo", backend=None, recipe="openai-gpt-oss-120b", sets=(), inventory=None):
    inv = Inventory.model_validate(inventory or TWO_NODES)
    secrets = Secrets({"HF_TOKEN": SECRET_HF, "LITELLM_MASTER_KEY": SECRET_KEY}, source="test")
    return build_deployment(inv, resolve(recipe, topology, backend, sets), secrets)


# -- filters -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", HOSTILE)
def test_quoted_value_round_trips_through_bash(value):
    out = subprocess.run(["bash", "-c", f"printf '%s' {shell_quote(value)}"], capture_output=True, text=True)
    assert out.stdout == value


def test_shjoin_keeps_each_argument_whole():
    out = subprocess.run(
        ["bash", "-c", f"for a in {shell_join(HOSTILE)}; do printf '%s\\0' \"$a\"; done"],
        capture_output=True,
        text=True,
    )
    assert out.stdout.split("\0")[:-1] == HOSTILE


def test_shell_path_expands_home_only():
    out = subprocess.run(
        ["bash", "-c", f"printf '%s' {shell_path('~/a b/$(x)')}"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": "/home/u"},
    )
    assert out.stdout == "/home/u/a b/$(x)"


def test_none_is_never_quoted_into_a_command():
    with pytest.raises(ValueError):
        shell_quote(None)


def test_undefined_variable_fails_naming_template_and_variable():
    with pytest.raises(ConfigError) as info:
        render("entry-vllm.sh.j2", name="x", headless=False)
    (problem,) = info.value.problems
    assert problem.file.startswith("templates/entry-vllm.sh.j2")
    assert "'args' is undefined" in problem.message


def test_env_file_refuses_a_newline():
    with pytest.raises(ConfigError) as info:
        render(
            "node.env.j2",
            node=Inventory.model_validate(TWO_NODES).head,
            env={"A": "x\nB=y"},
            recipe_name="r",
            topology="solo",
        )
    assert "newline" in str(info.value)


# -- hostile values through a whole deployment, executed ------------------------------------------------


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_recipe_values_are_inert_when_scripts_run(tmp_path, value, monkeypatch):
    # served_model_name is a plain model name now (tests/test_security.py refuses these values there); a newline
    # is refused in any value that reaches a command line, so the value goes in on one line.
    value = value.replace("\n", " ")
    sets = [f"env.HOSTILE={json.dumps(value)}", f"vllm.extra_args={json.dumps(['--mxfp4-layers', value])}"]
    inv = json.loads(json.dumps(TWO_NODES))
    inv["cluster"]["hf_cache"] = "~/hf " + value.replace("\n", " ")
    dep = deployment("solo", sets=sets, inventory=inv)
    nd = dep.nodes[0]
    state = tmp_path / "state"
    state.mkdir()
    for f in nd.files:
        (state / f.name).write_text(f.content)
    bin_dir = recorder(tmp_path, "docker")
    recorder(tmp_path, "vllm")
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home)}
    run = subprocess.run(["bash", str(state / "vllm.run.sh")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    (docker_argv,) = recorded(tmp_path, "docker")
    assert docker_argv[-2:] == ["bash", "/sparkdeploy/vllm.entry.sh"]
    assert f"{home}/hf {value.replace(chr(10), ' ')}:/root/.cache/huggingface" in docker_argv
    assert (home / f"hf {value.replace(chr(10), ' ')}").is_dir()
    # The entry script runs inside the container: run it here against the recording `vllm`.
    run = subprocess.run(["bash", str(state / "vllm.entry.sh")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    (vllm_argv,) = recorded(tmp_path, "vllm")
    assert vllm_argv[:2] == ["serve", "openai/gpt-oss-120b"]
    assert vllm_argv[vllm_argv.index("--host") - 2 : vllm_argv.index("--host")] == [
        "--served-model-name",
        "openai/gpt-oss-120b",
    ]
    assert vllm_argv[-2:] == ["--mxfp4-layers", value]
    assert f"HOSTILE={value.replace(chr(10), ' ')}" in nd.file("node.env").content.splitlines()
    assert not list(tmp_path.rglob("PWNED*")), "a hostile value ran as a command"


# -- shellcheck and serializers over every recipe x topology x backend ----------------------------------


def all_deployments():
    out = []
    for name, _ in sorted(__import__("sparkdeploy.recipes.recipe", fromlist=["x"]).recipe_files().items()):
        recipe = resolve(name).recipe
        for topo, backend in lint.combinations(recipe):
            out.append((name, topo, backend))
    return out


def test_every_rendered_script_passes_shellcheck(tmp_path):
    assert shutil.which("shellcheck"), "shellcheck (Debian package) is installed by scripts/setup.sh"
    count = 0
    for name, topo, backend in all_deployments():
        dep = deployment(topo, backend, recipe=name)
        for nd in dep.nodes:
            for f in nd.files:
                if f.name.endswith(".sh"):
                    path = tmp_path / f"{name}-{topo}-{backend}-{nd.node.name}-{f.name}"
                    path.write_text(f.content)
                    count += 1
    scripts = sorted(str(p) for p in tmp_path.glob("*.sh"))
    result = subprocess.run(
        ["shellcheck", "--severity=style", "--shell=bash", *scripts], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-4000:]
    assert count >= 30


def test_litellm_config_is_yaml_from_a_serializer():
    dep = deployment("2xsolo")
    head = next(nd for nd in dep.nodes if nd.node.role == "head")
    config = yaml.safe_load(head.file("litellm-config.yaml").content)
    assert [m["litellm_params"]["api_base"] for m in config["model_list"]] == [
        "http://192.0.2.1:8000/v1",
        "http://192.0.2.2:8000/v1",
    ]
    assert all(m["litellm_params"]["model"] == "hosted_vllm/openai/gpt-oss-120b" for m in config["model_list"])
    assert config["router_settings"]["routing_strategy"] == "simple-shuffle"
    assert config["general_settings"]["master_key"] == "os.environ/LITELLM_MASTER_KEY"
    assert SECRET_KEY not in head.file("litellm-config.yaml").content


def test_secrets_only_in_the_0600_secrets_file():
    for topo, backend in [("solo", None), ("2xsolo", None), ("cluster", "ray"), ("cluster", "torchrun")]:
        dep = deployment(topo, backend)
        for nd in dep.nodes:
            for f in nd.files:
                has = SECRET_HF in f.content or SECRET_KEY in f.content
                assert has == (f.name == "secrets.env"), f.name
                if f.name == "secrets.env":
                    assert f.mode == 0o600 and f.secret


def test_fabric_env_from_the_inventory():
    dep = deployment("cluster", "ray")
    lines = dep.nodes[1].file("node.env").content.splitlines()
    for expected in [
        "NCCL_SOCKET_IFNAME=enp1s0f1np1",
        "GLOO_SOCKET_IFNAME=enp1s0f1np1",
        "TP_SOCKET_IFNAME=enp1s0f1np1",
        "UCX_NET_DEVICES=enp1s0f1np1",
        "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1",
        "NCCL_IB_DISABLE=0",
        "NCCL_IB_GID_INDEX=3",
        "VLLM_HOST_IP=198.51.100.2",
        "MASTER_ADDR=198.51.100.1",
    ]:
        assert expected in lines
