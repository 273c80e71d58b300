"""The sweep end to end in the shared lab (deploy each topology, llama-benchy against it, report), kept
short: one level (c4: several requests batched at once), one run. The full sweep is `sparkdeploy bench sweep`
(docs/bench/README.md), not a test."""

from __future__ import annotations

import json

import pytest

from sparkdeploy.bench.store import load_results
from sparkdeploy.cli.common import run_cli
from sparkdeploy.cli.main import cli as sparkdeploy_cli

pytestmark = pytest.mark.lab
RECIPE = "openai-gpt-oss-120b-bench"
TOPOLOGIES = "solo,cluster,2xsolo"  # tests/deploy/test_every_recipe_lab.py counts on these deployments


@pytest.fixture(scope="module")
def lab_inventory(lab):
    """The shared session lab, nothing deployed."""
    inventory = str(lab.spec.inventory_path)
    run_cli(sparkdeploy_cli, ["down", "--inventory", inventory])
    yield inventory
    run_cli(sparkdeploy_cli, ["down", "--inventory", inventory])


def _sweep(cli, inventory: str, out) -> tuple[int, str, str]:
    """The short sweep: the three topologies at c4, one run, stored under out."""
    return cli(
        "bench",
        "sweep",
        *("--recipe", RECIPE, "--topologies", TOPOLOGIES, "--concurrency", "4", "--runs", "1"),
        *("--inventory", inventory, "--out", str(out), "--plain", "--json"),
    )


def test_short_sweep_of_three_topologies(lab_inventory, tmp_path, cli, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # llama-benchy's corpus cache
    out = tmp_path / "sweep"
    code, stdout, err = _sweep(cli, lab_inventory, out)
    assert code == 0, err
    data = json.loads(stdout)
    assert data["status"] == "complete" and len(data["measured"]) == 3
    results, skipped = load_results([out])
    assert len(results) == 3 and not skipped
    for r in results:
        md = r.metadata
        assert md["simulated"] is True and md["image_definition"] == "vllm-sim"
        assert md["image_id"].startswith("sha256:") and md["failed_requests"] == 0 and md["requests"] == r.concurrency
        assert r.metrics["decode_tps"].mean > 0 and r.metrics["ttft_ms"].mean > 0
    by = {(r.variant, r.concurrency): r for r in results}
    assert (
        by[("cluster", 4)].metadata["backend"] == "ray"
        and by[("2xsolo-shuffle", 4)].metadata["routing"] == "simple-shuffle"
    )
    assert by[("2xsolo-shuffle", 4)].metadata["endpoint"].endswith(":4000/v1")  # through the LiteLLM proxy
    md = (out / "report.md").read_text()
    assert "| Solo | solo |" in md and "| Cluster TP=2 | cluster | ray |" in md and "Simulated" in md
    # the same command again: everything stored, nothing deployed
    code, stdout, err = _sweep(cli, lab_inventory, out)
    assert code == 0, err
    again = json.loads(stdout)
    assert again["measured"] == [] and len(again["skipped_stored"]) == 3 and "deploying" not in err
