"""The commands of the recipe engine, run in-process with the real error contract."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import REPO, SECRET_HF, SECRET_KEY


def test_dry_run_of_the_example_inventory(cli):
    code, out, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "--inventory", str(REPO / "inventory.yaml"))
    assert code == 0, err
    assert (
        "DRY RUN" in out and "== spark1 192.168.1.101 (head) ==" in out and "== spark2 192.168.1.102 (worker) ==" in out
    )
    assert "--distributed-executor-backend ray" in out


def test_dry_run_masks_secrets(cli, inventory_file):
    for topo in ("solo", "cluster", "2xsolo"):
        code, out, err = cli("run-recipe", "openai-gpt-oss-120b", "-t", topo, "--dry-run", "-i", str(inventory_file))
        assert code == 0, err
        assert SECRET_HF not in out + err and SECRET_KEY not in out + err
        assert "HF_TOKEN=********" in out
    code, out, _ = cli(
        "run-recipe", "openai-gpt-oss-120b", "-t", "2xsolo", "--dry-run", "--json", "-i", str(inventory_file)
    )
    assert code == 0 and SECRET_KEY not in out
    data = json.loads(out)
    assert data["topology"] == "2xsolo" and len(data["nodes"]) == 2
    assert data["endpoint"] == "http://192.0.2.1:4000/v1"


def test_secret_from_the_environment_is_masked_too(cli, inventory_file, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_FROMenvironment999")
    code, out, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(inventory_file))
    assert code == 0 and "hf_FROMenvironment999" not in out + err


def test_unknown_recipe_exit_2_with_suggestions(cli, inventory_file):
    code, _out, err = cli("run-recipe", "gpt-oss-120b", "--dry-run", "-i", str(inventory_file))
    assert code == 2
    assert "did you mean " in err and " openai-gpt-oss-120b," in err and "Traceback" not in err


def test_bad_inventory_exit_2_one_line_per_problem(cli, write_inventory):
    path = write_inventory("""
        nodes:
          - {name: a, role: head, mgmt_ip: spark1.local, fabric_ip: 10.0.0.1/24, fabric_ifaces: [x]}
          - {name: b, mgmt_ip: host-b, fabric_ip: 10.0.1.2/24, fabric_ifaces: [x]}
    """)
    code, _out, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(path))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"error: {path}: nodes[") for line in lines)
    assert "mDNS" in lines[0] and "not an IP address" in lines[1]


def test_refused_topology_exit_2(cli, inventory_file):
    code, _out, err = cli("run-recipe", "llama-3.3-70b-instruct", "-t", "solo", "--dry-run", "-i", str(inventory_file))
    assert code == 2 and "use --topology cluster" in err


def test_recipes_list_show_lint(cli):
    code, out, _ = cli("recipes", "list", "--json")
    assert code == 0 and {r["name"] for r in json.loads(out)} >= {"openai-gpt-oss-120b", "llama-3.3-70b-instruct"}
    code, out, _ = cli(
        "recipes", "show", "openai-gpt-oss-120b", "-t", "2xsolo", "--set", "vllm.max_num_seqs=8", "--json"
    )
    rows = {r["key"]: r for r in json.loads(out)["values"]}
    assert rows["vllm.max_num_seqs"] == {"key": "vllm.max_num_seqs", "value": 8, "source": "--set"}
    assert rows["vllm.max_model_len"]["source"] == "openai-gpt-oss-120b.yaml"
    code, out, err = cli("recipes", "lint")
    assert code == 0, out + err
    assert "combinations render" in out


def test_recipes_lint_fails_on_a_broken_recipe(cli, tmp_path):
    (tmp_path / "broken.yaml").write_text(
        "name: broken\ndescription: x\nmodel: m/m\nimage: vllm-node\ntopologies: [solo]\ndefault_topology: solo\n"
        "vllm: {extra_args: [--mxfp4-layers, moe]}\n"
    )
    code, out, _ = cli("recipes", "lint", "--recipes-dir", str(tmp_path))
    assert code == 1 and "FAIL broken / solo" in out and "--mxfp4-layers" in out


def test_render_writes_files_with_their_modes(cli, inventory_file, tmp_path):
    out_dir = tmp_path / "out"
    code, _out, err = cli(
        "render", "openai-gpt-oss-120b", "-t", "2xsolo", "-i", str(inventory_file), "--out", str(out_dir)
    )
    assert code == 0, err
    secrets = out_dir / "spark1" / "secrets.env"
    assert oct(secrets.stat().st_mode & 0o777) == "0o600"
    assert SECRET_KEY not in secrets.read_text() and "LITELLM_MASTER_KEY=********" in secrets.read_text()
    assert (out_dir / "spark1" / "litellm-config.yaml").is_file()
    assert not (out_dir / "spark2" / "litellm-config.yaml").exists()


def test_console_scripts_installed_and_help_teaches():
    for exe, words in (("sparkdeploy", "Exit codes"), ("run-recipe", "Examples")):
        result = subprocess.run([exe, "--help"], capture_output=True, text=True)
        assert result.returncode == 0 and words in result.stdout


def test_no_traceback_from_the_console_script(tmp_path):
    result = subprocess.run(
        ["run-recipe", "nope", "--dry-run", "-i", str(tmp_path / "missing.yaml")], capture_output=True, text=True
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr and "cannot read" in result.stderr


def test_run_recipe_takes_the_health_gate_timeout_like_up(cli, inventory_file):
    from sparkdeploy.cli.run_recipe import run_recipe

    for command in (run_recipe, None):
        args = ("openai-gpt-oss-120b",) if command else ("up", "-r", "openai-gpt-oss-120b")
        code, _out, err = cli(*args, "--timeout", "0", "-i", str(inventory_file), command=command)
        assert code == 2 and "--timeout" in err
    code, out, err = cli(
        "openai-gpt-oss-120b", "--timeout", "30", "--dry-run", "-i", str(inventory_file), command=run_recipe
    )  # a dry run connects to nothing
    assert code == 0 and "DRY RUN" in out, err


def test_run_recipe_takes_exactly_ups_options():
    """`run-recipe NAME` is `sparkdeploy up --recipe NAME`: every option of up but --recipe (the argument here),
    the same names, flags, types and defaults (sparkdeploy.cli.common.up_options defines them once). Only the
    --dry-run help differs: run-recipe's dry run connects to nothing."""
    import click

    from sparkdeploy.cli.run_recipe import run_recipe
    from sparkdeploy.cli.up_cmd import up

    def options(command):
        out = {}
        for p in command.params:
            if isinstance(p, click.Option):
                info = p.to_info_dict()
                if p.name == "dry_run":
                    info.pop("help")
                out[p.name] = info
        return out

    ups = options(up)
    assert ups.pop("recipe")["opts"] == ["--recipe", "-r"]
    assert ups.pop("stack")["opts"] == ["--stack"]  # up only: several deployments (deploy/stack/converge.py)
    assert options(run_recipe) == ups
    assert list(options(run_recipe)) == list(ups)  # the same order in --help
    assert [p.name for p in run_recipe.params if isinstance(p, click.Argument)] == ["recipe"]
    assert {"pull_model", "metrics", "timeout", "node", "tp"} <= set(ups)


@pytest.mark.parametrize(
    "argv",
    [["run-recipe", "-h"], ["run-recipe", "--help"], ["sparkdeploy", "run-recipe", "-h"], ["sparkdeploy", "up", "-h"]],
)
def test_run_recipe_and_up_take_dash_h(argv):
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode == 0 and "--pull-model" in result.stdout and "--metrics" in result.stdout, result.stderr


def test_run_recipe_passes_metrics_and_pull_model_on(cli, inventory_file, monkeypatch):
    from sparkdeploy.cli import up_cmd
    from sparkdeploy.cli.run_recipe import run_recipe

    code, out, err = cli(
        "openai-gpt-oss-120b", "--dry-run", "--metrics", "-i", str(inventory_file), command=run_recipe
    )  # the dry run renders what --metrics adds: Prometheus on the head
    assert code == 0 and "prometheus" in out.lower(), err
    code, out, err = cli("openai-gpt-oss-120b", "--dry-run", "-i", str(inventory_file), command=run_recipe)
    assert code == 0 and "prometheus" not in out.lower(), err
    seen = {}
    monkeypatch.setattr(up_cmd, "deploy", lambda **kw: seen.update(kw))  # what reaches deploy (parsing only)
    code, _out, err = cli(
        "openai-gpt-oss-120b", "--pull-model", "--no-metrics", "-i", str(inventory_file), command=run_recipe
    )
    assert code == 0, err
    assert seen["pull_model"] is True and seen["metrics"] is False and seen["recipe"] == "openai-gpt-oss-120b"
