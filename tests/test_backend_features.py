"""Issue 18, render time: a serving flag the chosen backend's HTTP server would ignore is refused, naming the
flag and the backend, with the fix; the flags the torchrun launcher honours (tools, reasoning) pass."""

from __future__ import annotations

from sparkdeploy.recipes.backend_features import FRONTEND_FLAGS, refused_flags, serving_backends
from sparkdeploy.topologies import lint
from tests.conftest import REPO

CHAT_TEMPLATE = (
    '--set=vllm.extra_args=["--enable-auto-tool-choice","--tool-call-parser","qwen3_coder",'
    '"--chat-template","/t.jinja"]'
)


def test_torchrun_refuses_only_what_its_launcher_ignores():
    args = [
        "M",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "glm47",
        "--reasoning-parser",
        "glm45",
        "--response-role=bot",
        "--chat-template",
        "t.jinja",
        "-tp",
        "2",
    ]
    assert refused_flags(args, "torchrun") == ["--response-role", "--chat-template"]
    assert refused_flags(args, "ray") == [] and refused_flags(args, "native") == [] and refused_flags(args, None) == []
    assert serving_backends(["--chat-template", "t"]) == ["ray", "native"]
    assert serving_backends(["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]) == [
        "torchrun",
        "ray",
        "native",
    ]


def test_frontend_flags_are_flags_of_the_pinned_vllm():
    import json

    spec = json.loads((REPO / "images/vllm-node/vllm-args-0.32.0.json").read_text())["flags"]
    assert sorted(FRONTEND_FLAGS - set(spec)) == []


def test_dry_run_and_lint_name_the_flag_and_the_backend(cli, inventory_file, tmp_path):
    code, out, err = cli("run-recipe", "qwen3-coder-30b-int4", "--dry-run", "-i", str(inventory_file), CHAT_TEMPLATE)
    assert code == 2 and "Traceback" not in err
    assert "--chat-template is not honoured by the torchrun backend" in err and "use --backend ray or native" in err
    code, out, err = cli(
        "run-recipe", "qwen3-coder-30b-int4", "--dry-run", "-i", str(inventory_file), "-b", "ray", CHAT_TEMPLATE
    )
    assert code == 0, err
    # the shipped recipe as it is: torchrun serves its tool-call flags
    code, out, err = cli("run-recipe", "qwen3-coder-30b-int4", "--dry-run", "-i", str(inventory_file))
    assert code == 0 and "--tool-call-parser qwen3_coder" in out, err

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    text = (REPO / "recipes/qwen3-coder-30b-int4.yaml").read_text()
    (recipes / "qwen3-coder-30b-int4.yaml").write_text(
        text.replace(
            "extra_args: [--enable-auto-tool-choice", "extra_args: [--response-role, bot, --enable-auto-tool-choice"
        )
    )
    rows = {
        (r["topology"], r["backend"]): r for r in lint.lint_all(str(recipes)) if r["recipe"] == "qwen3-coder-30b-int4"
    }
    assert not rows[("cluster", "torchrun")]["ok"]
    assert any(
        "--response-role is not honoured by the torchrun backend" in p
        for p in rows[("cluster", "torchrun")]["problems"]
    )
    assert rows[("cluster", "ray")]["ok"] and rows[("cluster", "native")]["ok"] and rows[("solo", None)]["ok"]


def test_advise_names_a_backend_that_serves_the_recipes_flags(tmp_path):
    from sparkdeploy.bench.advisor import advise

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    text = (REPO / "recipes/qwen3-coder-30b-int4.yaml").read_text()
    (recipes / "coder-template.yaml").write_text(
        text.replace("name: qwen3-coder-30b-int4", "name: coder-template").replace(
            "extra_args: [--enable-auto-tool-choice",
            "extra_args: [--chat-template, /t.jinja, --enable-auto-tool-choice",
        )
    )
    shipped = advise(1, recipe="qwen3-coder-30b-int4").to_json()
    assert shipped["recommendation"]["topology"] == "cluster"  # the seeds: cluster wins decode at c1
    assert shipped["recommendation"]["backend"] is None and "--backend" not in shipped["command"]  # torchrun serves it
    a = advise(1, recipe="coder-template", recipes_dir=str(recipes)).to_json()
    assert a["recommendation"]["topology"] == "cluster" and a["recommendation"]["backend"] == "ray"
    assert a["command"].endswith("--backend ray")
    assert any("torchrun does not honour --chat-template" in n for n in a["notes"])
