"""`recipes list` and `recipes search` (issue 27, item 3): model, size, fits-one-node, topologies, parsers."""

from __future__ import annotations

import json

import yaml

from sparkdeploy.recipes import catalogue
from sparkdeploy.recipes.recipe import recipe_files
from tests.conftest import REPO


def test_every_shipped_recipe_is_a_row_with_its_parsers(cli):
    code, out, err = cli("recipes", "list", "--json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)}
    assert set(rows) == set(recipe_files())
    for name, r in rows.items():
        data = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
        assert r["engine"] == data.get("engine", "vllm")
        args = [str(a) for a in (data.get("vllm") or {}).get("extra_args") or []]
        tool = args[args.index("--tool-call-parser") + 1] if "--tool-call-parser" in args else None
        if r["engine"] == "sglang":  # its own field, no argv to read
            tool = data["sglang"].get("tool_call_parser")
        elif r["engine"] == "llamacpp":  # --jinja: the model's chat template parses tool calls
            tool = "jinja" if data["llamacpp"].get("jinja", True) else None
        assert (r["model"], r["weights_gb"], r["tool_call_parser"]) == (data["model"], data.get("weights_gb"), tool)
        assert r["topologies"] == data["topologies"] and r["fits_one_node"] == data.get("fits_one_node", True)
    gpt = rows["openai-gpt-oss-120b"]
    assert (gpt["tool_call_parser"], gpt["reasoning_parser"], gpt["auto_tool_choice"]) == (
        "openai",
        "openai_gptoss",
        True,
    )
    assert rows["openai-gpt-oss-120b-bench"]["tool_call_parser"] is None


def test_table_shows_the_columns(cli):
    code, out, _ = cli("recipes", "list")
    assert code == 0
    for col in ("engine", "model", "weights", "one node", "topologies", "tool parser", "reasoning"):
        assert col in out
    assert "openai_gptoss" in out and "65 GB" in out


def test_search_matches_every_word_case_insensitively(cli):
    names = {r["name"] for r in catalogue.search("QWEN coder")}
    assert "qwen3-coder-30b-int4" in names and "openai-gpt-oss-120b" not in names
    assert {r["name"] for r in catalogue.search("openai_gptoss")} >= {"openai-gpt-oss-120b"}
    assert {r["name"] for r in catalogue.search("gpt-oss BENCH")} == {"openai-gpt-oss-120b-bench"}
    code, out, _ = cli("recipes", "search", "glm47", "--json")
    assert code == 0 and all(r["tool_call_parser"] == "glm47" for r in json.loads(out)) and json.loads(out)
    code, out, _ = cli("recipes", "search", "no-such-model-anywhere")
    assert code == 1 and "no recipe matches" in out


def test_a_broken_file_is_a_row_with_its_problem(cli, tmp_path):
    (tmp_path / "broken.yaml").write_text("name: broken\n")
    code, out, _ = cli("recipes", "list", "--json", "--recipes-dir", str(tmp_path))
    assert code == 0
    broken = next(r for r in json.loads(out) if r["name"] == "broken")
    assert broken["problems"] and "description" in " ".join(broken["problems"])


def test_flag_value_reads_both_spellings():
    assert catalogue.flag_value(["--tool-call-parser", "a", "--tool-call-parser=b"], "--tool-call-parser") == "b"
    assert catalogue.flag_value(["--tool-call-parser", "a", "--tool-call-parser", "b"], "--tool-call-parser") == "b"
    assert catalogue.flag_value(["--x"], "--tool-call-parser") is None
