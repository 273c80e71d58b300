"""Gateway keys without nodes: each bad input is one line and exit 2 before anything is read or written (a bad
--max-budget, --rpm or name; a name in use and a model no deployment serves, from the store and the manifest),
the budget's unit, and the token counts of gateway_spend.py on a real sqlite file shared by processes. The
gateway's side (the hook enforcing them in LiteLLM) is tests/deploy/test_stack_lab.py's keys test."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from sparkdeploy.deploy.stack import file as sf
from sparkdeploy.deploy.stack import keys
from sparkdeploy.deploy.stack import units as su
from sparkdeploy.errors import ConfigError
from sparkdeploy.nodeside.gateway import gateway_spend

TWO = """
deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.25}
  - {name: coder, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark2], memory: 0.3}
"""


@pytest.mark.parametrize(("text", "tokens"), [("50", 50), ("200k", 200_000), ("1.5M", 1_500_000), (" 2G ", 2 * 10**9)])
def test_a_budget_is_tokens_with_an_optional_k_m_g(text, tokens):
    assert keys.parse_budget(text) == tokens


@pytest.mark.parametrize("text", ["0", "-5", "abc", "", "1e3", "5 USD", "0.0004k", "9" * 20])
def test_a_bad_budget_is_one_problem_naming_the_flag_and_the_unit(text):
    with pytest.raises(ConfigError) as exc:
        keys.parse_budget(text)
    (problem,) = exc.value.problems
    assert "--max-budget" in str(problem) and "tokens" in str(problem)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["bob", "--max-budget", "0"], "is not a budget in tokens"),
        (["bob", "--max-budget", "ten"], "is not a budget in tokens"),
        (["bob", "--rpm", "0"], "is not a rate"),
        (["bad name"], "not a key name"),
    ],
)
def test_cli_refuses_bad_key_input_with_one_line_and_exit_2_before_connecting(cli, inventory_file, args, expected):
    # the test inventory's nodes are not reachable: reaching them would fail otherwise (exit 1)
    code, out, err = cli("keys", "create", *args, "-i", str(inventory_file))
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in err, err
    assert "sk-sd-" not in out + err


def test_a_name_in_use_and_models_no_deployment_serves_are_one_line_each():
    existing = [{"name": "alice", "sha256": "0" * 64}]
    problems = [str(p) for p in keys.check_new("alice", ["coder", "nope", "glm"], ["glm", "coder"], existing)]
    assert len(problems) == 2, problems
    assert "no deployment serves nope" in problems[0] and "served: glm, coder" in problems[0]
    assert "a key of that name exists" in problems[1]
    assert keys.check_new("bob", ["glm"], ["glm", "coder"], existing) == []
    assert "served: none" in str(keys.check_new("bob", ["glm"], [], [])[0])


def test_spend_is_counted_per_key_across_threads_and_processes_and_kept(tmp_path):
    db = str(tmp_path / "spend.sqlite")

    def worker() -> None:
        for _ in range(50):
            gateway_spend.add("a" * 64, 3, db)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    # another process writes at the same time, as a second proxy worker would
    other = subprocess.Popen(
        [sys.executable, "-c", f"import gateway_spend as g\nfor _ in range(50): g.add('b' * 64, 7, {db!r})"],
        cwd=str(tmp_path.parent),
        env={"PYTHONPATH": str(gateway_spend.__file__).rsplit("/", 1)[0]},
    )
    for t in threads:
        t.join()
    assert other.wait(timeout=60) == 0
    assert gateway_spend.spent("a" * 64, db) == 4 * 50 * 3
    assert gateway_spend.spent("c" * 64, db) == 0
    # what `keys list` runs inside the gateway: a fresh process reads the same counts
    r = subprocess.run([sys.executable, gateway_spend.__file__, db], capture_output=True, text=True, check=True)
    assert json.loads(r.stdout) == {
        "a" * 64: {"tokens": 600, "requests": 200},
        "b" * 64: {"tokens": 350, "requests": 50},
    }
    assert (
        subprocess.run(
            [sys.executable, gateway_spend.__file__, str(tmp_path / "none.sqlite")], capture_output=True, text=True
        ).stdout.strip()
        == "{}"
    )


def test_rpm_is_counted_over_every_worker_and_its_window_slides(tmp_path):
    """Several proxy workers (processes) share one rpm count: 3 processes asking 10 times each against an rpm of
    7 get exactly 7 requests through."""
    db = str(tmp_path / "spend.sqlite")
    script = f"import gateway_spend as g\nprint(sum(g.take('k' * 64, 7, path={db!r}) is None for _ in range(10)))"
    env = {"PYTHONPATH": str(gateway_spend.__file__).rsplit("/", 1)[0]}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env) for _ in range(3)
    ]
    allowed = sum(int(p.communicate(timeout=60)[0]) for p in procs)
    assert allowed == 7
    assert gateway_spend.take("k" * 64, 7, path=db) == 7  # refused, and the refusal is not counted
    assert gateway_spend.take("z" * 64, 7, path=db) is None  # another key has its own count
    # a minute later the window is empty again
    later = time.time() + gateway_spend.WINDOW_S + 1
    assert gateway_spend.take("k" * 64, 7, now=later, path=db) is None
    assert gateway_spend.take("k" * 64, 1, now=later, path=db) == 1


def test_the_gateway_counts_spend_on_its_own_volume_with_the_hooks_tracker(tmp_path, inventory_file):
    path = tmp_path / "stack.yaml"
    path.write_text(textwrap.dedent(TWO))
    s = sf.load_stack(str(path), str(inventory_file))
    sf.build(s, sf.budget(s, {n.name: 128 * 1024 for n in s.inventory.nodes}))
    config = su.gateway_config()
    (callback,) = config["litellm_settings"]["callbacks"]
    module, _, name = callback.partition(".")
    # the callback and the auth hook LiteLLM loads exist in the hook file shipped beside the config
    hook = ast.parse(su.HOOK_SOURCE.read_text(encoding="utf-8"))
    defined = {t.id for n in hook.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    defined |= {n.name for n in hook.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert module == "gateway_hook" and name in defined
    assert config["general_settings"]["custom_auth"].split(".")[1] in defined
    node = su.gateway_node(s)
    assert {"gateway_hook.py", "gateway_spend.py"} <= {f.name for f in node.files}
    run = next(f.content for f in node.files if f.name == "litellm.run.sh")
    sub, target = su.SPEND_VOLUME
    assert f'"$here/"{sub}:{target}' in run and f'mkdir -p "$here/"{sub}' in run
    assert keys.SPEND_DB.startswith(target + "/") and gateway_spend.DB == keys.SPEND_DB
