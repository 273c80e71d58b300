"""The speculative-decoding A/B end to end in the shared lab (issue 39, item 5), with small numbers: the owner's
prompts (repetitive code) against `off` and `ngram:4` of qwen3-coder-30b-ngram on one node, each setting
deployed through `up` (vllm-sim: SIMULATED acceptance from the prompt's content, vLLM's metric names), two
levels, the winner written as the recipe's override; then `top` reads the acceptance of what runs, and `up
--metrics` adds Prometheus, which scrapes the same counters (PromQL as vLLM documents it)."""

from __future__ import annotations

import json
import time

import pytest
import requests
import yaml

from sparkdeploy.bench import speculative_ab as ab
from sparkdeploy.bench.deploy_link import current_endpoint, status_json
from sparkdeploy.cli.common import run_cli
from sparkdeploy.cli.main import cli as sparkdeploy_cli
from tests.conftest import REPO

pytestmark = pytest.mark.lab

RECIPE = "qwen3-coder-30b-ngram"
CODE = (REPO / "images" / "vllm-sim" / "vllm_sim" / "engine.py").read_text()


@pytest.fixture(scope="module")
def lab_inventory(lab):
    inventory = str(lab.spec.inventory_path)
    run_cli(sparkdeploy_cli, ["down", "--inventory", inventory])
    yield inventory
    run_cli(sparkdeploy_cli, ["down", "--inventory", inventory])


def test_the_ab_deploys_each_setting_and_recommends_on_the_owners_prompts(lab_inventory, tmp_path, cli):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": CODE[i : i + 3000]}], "max_tokens": 24}) + "\n"
            for i in (0, 1500)
        )
    )
    mine = tmp_path / "my-recipes"
    code, out, err = cli(
        "bench",
        *("--recipe", RECIPE, "--topology", "solo", "--prompts", str(prompts)),
        *("--speculative", "off,ngram:4", "--concurrency", "1,4", "--write-recipe", str(mine)),
        *("--inventory", lab_inventory, "--json"),
    )
    assert code == 0, err[-3000:]
    data = json.loads(out)
    assert data["simulated"] is True and data["topology"] == "solo" and not data["failed"]
    off, ngram = data["results"]["off"], data["results"]["ngram:4"]
    for c in ("1", "4"):
        assert off[c]["failed"] == 0 and ngram[c]["failed"] == 0 and off[c]["decode_tps"] > 0
        assert off[c]["speculative"] is None  # deployed without speculation: no counters
        assert ngram[c]["speculative"]["acceptance_rate"] > 0.3  # SIMULATED: code repeats itself
        assert ngram[c]["speculative"]["accepted_tokens_per_step"] > 1.5
        assert ngram[c]["ratio_to_off"] is not None
    assert "off: up qwen3-coder-30b-ngram -t solo --set speculative=null" in err  # through up, per setting
    bands = data["recommendation"]
    assert [c for b in bands for c in b["levels"]] == [1, 4]
    written = yaml.safe_load((mine / f"{RECIPE}.yaml").read_text())
    assert written["overrides"]["solo"]["speculative"] == (
        None
        if bands[0]["setting"] == "off"
        else {"method": "ngram", "num_speculative_tokens": 4, "options": {"prompt_lookup_max": 4}}
    )
    timing = data["timing"]
    assert timing["deploy_s"] > 0 and timing["runs_s"] > 0 and timing["own_s"] < timing["runs_s"]

    code, out, err = cli("top", "--once", "--json", "--inventory", lab_inventory)  # ngram:4 runs now
    assert code == 0, err
    engine = json.loads(out)["engines"][0]
    assert engine["spec_decode"]["acceptance_rate"] > 0.3 and engine["spec_decode"]["drafts"] > 0

    # Prometheus (`up --metrics`: the same deployment, one more container) scrapes the engine's counters
    code, out, err = cli(
        *("up", "--recipe", RECIPE, "-t", "solo", "--set", "speculative.num_speculative_tokens=4", "--metrics"),
        *("--inventory", lab_inventory, "--json"),
    )
    assert code == 0, err[-3000:]
    endpoint = current_endpoint(lab_inventory)
    prompt = {"messages": [{"role": "user", "content": CODE[:3000]}], "max_tokens": 16}
    assert not ab.stream_chat(endpoint, prompt, 120).error  # traffic after any restart
    url = status_json(lab_inventory)["metrics_url"] + "/api/v1/query"
    query = "vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_draft_tokens_total"
    deadline = time.monotonic() + 60
    while True:
        result = requests.get(url, params={"query": query}, timeout=10).json()["data"]["result"]
        if result and float(result[0]["value"][1]) > 0.3:
            break
        assert time.monotonic() < deadline, result
        time.sleep(2)


def test_the_draft_is_pulled_with_the_model_and_up_checks_it(lab, lab_inventory, tmp_path, cli):
    """Item 2 on real nodes: `models pull RECIPE` fetches the model and its draft (lab/gated-model, 1 MiB), each
    once from the hub and over the fabric to spark2; `up` (HF_HUB_OFFLINE engines) refuses in preflight when the
    draft is missing on one node, naming it and the pull that fixes it; doctor's model.present fails that node's
    draft row with the same fix (--json)."""
    from sparkdeploy.lab.hub_repo import GATED, TINY

    data = yaml.safe_load((REPO / "recipes" / f"{RECIPE}.yaml").read_text())
    data.update(name="tiny-draft", model=TINY, weights_gb=1, topologies=["solo", "2xsolo"])
    data["speculative"] = {"method": "draft_model", "model": GATED, "num_speculative_tokens": 2}
    data.pop("architecture")
    mine = tmp_path / "recipes"
    mine.mkdir()
    (mine / "tiny-draft.yaml").write_text(yaml.safe_dump(data))
    spark1, spark2 = lab.nodes[:2]
    cache = "~/.cache/huggingface"

    def forget_draft() -> None:
        for node in (spark1, spark2):
            lab.ssh(
                node,
                f"rm -rf {cache}/hub/models--lab--gated-model {cache}/sparkdeploy-models/models--lab--gated-model",
            )

    forget_draft()
    try:
        _pull_then_remove_on_spark2(lab, lab_inventory, cli, mine, spark2)
    finally:  # the shared lab as found: `models list` of the other lab tests sees no half-removed draft
        forget_draft()


def _pull_then_remove_on_spark2(lab, lab_inventory, cli, mine, spark2) -> None:
    from sparkdeploy.lab import hub
    from sparkdeploy.lab.hub_repo import GATED, TINY

    served = hub.stats(lab.spec)["repos"].get(GATED, {}).get("bytes", 0)
    code, out, err = cli(
        "models", "pull", "tiny-draft", "--recipes-dir", str(mine), "--inventory", lab_inventory, "--json"
    )
    assert code == 0, err[-2000:]
    pulled = json.loads(out)
    assert pulled["model"] == TINY and [d["model"] for d in pulled["drafts"]] == [GATED]
    draft = pulled["drafts"][0]
    assert draft["nodes"]["spark1"]["action"] == "downloaded"
    assert draft["nodes"]["spark2"]["action"] == "copied" and draft["nodes"]["spark2"]["source"] == "spark1"
    assert hub.stats(lab.spec)["repos"][GATED]["bytes"] - served == draft["size"]  # the hub served it once

    lab.ssh(spark2, "rm -rf ~/.cache/huggingface/hub/models--lab--gated-model")
    up = ("up", "--recipe", "tiny-draft", "-t", "2xsolo", "--recipes-dir", str(mine), "--inventory", lab_inventory)
    code, out, err = cli(*up)
    assert code == 1, out + err
    assert "preflight failed on spark2" in err and GATED in err and "sparkdeploy models pull tiny-draft" in err, err

    # doctor's model check is the same: the draft missing on spark2 fails that node's row, naming the pull
    doc = ("doctor", "--only", "model", "--recipe", "tiny-draft", "-t", "2xsolo", "--recipes-dir", str(mine))
    code, out, err = cli(*doc, "--inventory", lab_inventory, "--json")
    assert code == 1, out + err
    rows = {(r["node"], r["data"]["role"]): r for r in json.loads(out)["results"] if r["check"] == "model.present"}
    assert sorted(rows) == [("spark1", "draft"), ("spark1", "model"), ("spark2", "draft"), ("spark2", "model")]
    bad = rows.pop(("spark2", "draft"))
    assert bad["status"] == "fail" and GATED in bad["measured"] and bad["data"]["state"] != "complete", bad
    assert bad["fix"].startswith(f"sparkdeploy models pull tiny-draft --inventory {lab_inventory}"), bad
    assert all(r["status"] == "pass" and r["data"]["state"] == "complete" for r in rows.values()), rows
