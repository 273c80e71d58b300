"""Sweeps: resume after an interruption, report failures cleanly. Deploy and bench are faked (pure logic);
the real llama-benchy runs are in test_bench_runner.py and test_bench_sim.py."""

from __future__ import annotations

import json

import pytest

from sparkdeploy.bench.benchy import BenchSettings, Endpoint
from sparkdeploy.bench.store import BenchResult, save_result, stored
from sparkdeploy.bench.sweep import PlainReporter, estimate_cell_s, make_plan, parse_levels, parse_topologies, run_sweep
from sparkdeploy.errors import ConfigError, StepFailed
from tests.bench.conftest import make_results

LEVELS = [1, 2, 4, 8, 16, 32, 64]
RECIPE = "openai-gpt-oss-120b-bench"
REF = {(r.variant, r.concurrency): r for r in make_results(variants=("solo", "cluster", "2xsolo-shuffle"))}


class Fake:
    """A fake deploy and bench: records calls, can be told to fail or be interrupted at one cell."""

    def __init__(self, out, interrupt_at=None, fail_bench_at=None, fail_deploy=None, failed_requests_at=None):
        self.out, self.interrupt_at, self.fail_bench_at, self.fail_deploy = (
            out,
            interrupt_at,
            fail_bench_at,
            fail_deploy,
        )
        self.failed_requests_at = failed_requests_at
        self.deploys, self.benched = [], []

    def deploy(self, topology, routing):
        self.deploys.append(topology)
        if topology == self.fail_deploy:
            raise StepFailed("preflight failed on spark2")
        if topology == "crash":
            raise RuntimeError("docker API: 500 Server Error\nmore lines")
        return Endpoint(
            "http://192.0.2.1:8000/v1",
            "openai/gpt-oss-120b",
            "sk-x",
            {"recipe": RECIPE, "topology": topology, "routing": routing},
        )

    def bench(self, endpoint, c, progress):
        cell = (endpoint.variant, c)
        if cell == self.interrupt_at:
            progress(3, c * 3)
            raise KeyboardInterrupt
        if cell == self.fail_bench_at:
            raise StepFailed(f"llama-benchy failed at c{c}")
        progress(c * 3, c * 3)
        self.benched.append(cell)
        ref = REF[cell]
        md = dict(ref.metadata, **endpoint.metadata)
        failed = 4 if cell == self.failed_requests_at else 0
        md.update(
            runs=3,
            failed_requests=failed,
            requests=c * 3,
            request_errors=["[Errno 104] Connection reset by peer"] if failed else [],
        )
        r = BenchResult(RECIPE, endpoint.variant, 1024, 128, c, ref.metrics, md)
        save_result(r, self.out)
        return r


def plan_for(out, topologies="solo,cluster,2xsolo"):
    return make_plan(RECIPE, parse_topologies(topologies), LEVELS, BenchSettings(runs=3), out, "simple-shuffle")


def test_interrupted_sweep_reports_cleanly_then_resumes(tmp_path):
    out = tmp_path / "sweep"
    lines = []
    fake = Fake(out, interrupt_at=("cluster", 16))
    summary = run_sweep(plan_for(out), fake.deploy, fake.bench, PlainReporter(lines.append))
    assert summary.status == "interrupted"
    assert summary.interrupted_at == {"variant": "cluster", "concurrency": 16}
    assert len(summary.measured) == 7 + 4 and len(summary.remaining) == 3 + 7
    assert "sweep interrupted during cluster c16" in lines[-1] and "Run the same command again to resume" in lines[-1]
    # nothing half-written: only finished cells are files, no temp files
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 11 and not any(".tmp" in f for f in files)
    assert stored(out, RECIPE, "cluster", 1024, 128, 8, 3) and not stored(out, RECIPE, "cluster", 1024, 128, 16, 3)

    # the same command again: solo is not deployed again, cluster resumes at c16
    fake2 = Fake(out)
    summary2 = run_sweep(plan_for(out), fake2.deploy, fake2.bench, PlainReporter(lines.append))
    assert summary2.status == "complete"
    assert fake2.deploys == ["cluster", "2xsolo"]
    assert fake2.benched == [("cluster", 16), ("cluster", 32), ("cluster", 64)] + [
        ("2xsolo-shuffle", c) for c in LEVELS
    ]
    assert len(summary2.skipped) == 11 and summary2.remaining == []
    assert any("[Solo] stored already: c1, c2, c4, c8, c16, c32, c64" in line for line in lines)

    # a third run has nothing to do and deploys nothing
    fake3 = Fake(out)
    summary3 = run_sweep(plan_for(out), fake3.deploy, fake3.bench, PlainReporter(lines.append))
    assert summary3.status == "complete" and fake3.deploys == [] and fake3.benched == []


def test_failures_are_reported_and_other_topologies_continue(tmp_path):
    out = tmp_path / "sweep"
    lines = []
    fake = Fake(out, fail_deploy="cluster", fail_bench_at=("2xsolo-shuffle", 32))
    summary = run_sweep(plan_for(out), fake.deploy, fake.bench, PlainReporter(lines.append))
    assert summary.status == "failed"
    assert [(f["variant"], f["concurrency"], f["step"]) for f in summary.failures] == [
        ("cluster", None, "deploy"),
        ("2xsolo-shuffle", 32, "bench"),
    ]
    assert len(summary.measured) == 7 + 5
    assert any("FAILED: deploy failed: preflight failed on spark2" in line for line in lines)
    assert "finished with 2 failure(s)" in lines[-1]


def test_failed_requests_fail_the_sweep_and_are_measured_again(tmp_path):
    out = tmp_path / "sweep"
    lines = []
    fake = Fake(out, failed_requests_at=("2xsolo-shuffle", 64))
    summary = run_sweep(plan_for(out), fake.deploy, fake.bench, PlainReporter(lines.append))
    assert summary.status == "failed"
    assert summary.failures == [
        {
            "variant": "2xsolo-shuffle",
            "concurrency": 64,
            "step": "requests",
            "error": "4 of 192 requests failed (first: [Errno 104] Connection reset by peer); "
            "the level is measured again on the next run",
        }
    ]
    assert summary.remaining == [{"variant": "2xsolo-shuffle", "concurrency": 64}]
    assert any("[Shuffle] c64: FAILED: 4 of 192 requests failed" in line for line in lines)
    fake2 = Fake(out)
    summary2 = run_sweep(plan_for(out), fake2.deploy, fake2.bench, PlainReporter(lines.append))
    assert summary2.status == "complete" and fake2.deploys == ["2xsolo"] and fake2.benched == [("2xsolo-shuffle", 64)]


def test_an_unexpected_deploy_error_is_reported_without_a_traceback(tmp_path):
    out = tmp_path / "sweep"
    lines = []
    fake = Fake(out, fail_deploy="solo")
    fake.fail_deploy = None
    deploy = lambda t, r: fake.deploy("crash" if t == "solo" else t, r)  # noqa: E731
    summary = run_sweep(plan_for(out, "solo,cluster"), deploy, fake.bench, PlainReporter(lines.append))
    assert summary.status == "failed" and summary.failures[0]["error"] == "RuntimeError: docker API: 500 Server Error"
    assert len(summary.measured) == 7  # cluster went on


def test_results_with_failed_requests_or_fewer_runs_are_measured_again(tmp_path):
    out = tmp_path / "sweep"
    r = make_results(variants=("solo",))[0]
    r.metadata.update(failed_requests=2, runs=3)
    save_result(r, out)
    assert stored(out, r.recipe, "solo", 1024, 128, r.concurrency, 3) is None
    r.metadata.update(failed_requests=0, runs=1)
    save_result(r, out)
    assert stored(out, r.recipe, "solo", 1024, 128, r.concurrency, 3) is None
    assert stored(out, r.recipe, "solo", 1024, 128, r.concurrency, 1) is not None


def test_parsing_and_estimates():
    assert [s.text for s in parse_topologies("solo, cluster,2xsolo,2xsolo:least-busy")] == [
        "solo",
        "cluster",
        "2xsolo",
        "2xsolo:least-busy",
    ]
    with pytest.raises(ConfigError):
        parse_topologies("solo,tp4")
    with pytest.raises(ConfigError):
        parse_topologies("cluster:least-busy")
    with pytest.raises(ConfigError):  # the same column twice
        make_plan(
            RECIPE, parse_topologies("2xsolo,2xsolo:simple-shuffle"), LEVELS, BenchSettings(), "x", "simple-shuffle"
        )
    assert parse_levels("64,1,2,2") == [1, 2, 64]
    with pytest.raises(ConfigError):
        parse_levels("1,two")
    # reference-based estimate of one level: (3 runs + warmup) x (TTFT + 128 x c / decode) + start-up
    est = estimate_cell_s("solo", 64, BenchSettings(runs=3))
    assert est == pytest.approx(4 * (10.874 + 128 * 64 / 315.2) + 8, rel=1e-6)


def test_sweep_cli_interrupted_then_resumed(tmp_path, cli, inventory_file, bench_data, monkeypatch):
    """The command: exit 130 with a clean message when interrupted, then the same command completes and writes
    the report (deploy and llama-benchy replaced by the fakes)."""
    from sparkdeploy.bench import benchy as runner
    from sparkdeploy.bench import deploy_link

    tok, corpus = bench_data
    out = tmp_path / "out"
    fake = Fake(out, interrupt_at=("2xsolo-shuffle", 4))

    def deploy(self, topology, routing):  # what deploy would bring up (rendered), without deploying
        fake.deploy(topology, routing)
        return deploy_link.endpoint_of(str(inventory_file), RECIPE, topology, sets=self.sets_for(routing))

    monkeypatch.setattr(deploy_link.Deployer, "__call__", deploy)
    monkeypatch.setattr(runner, "run_cell", lambda ep, s, c, o, on_progress=None: fake.bench(ep, c, on_progress))
    args = (
        "bench",
        "sweep",
        "--recipe",
        RECIPE,
        "--inventory",
        str(inventory_file),
        "--out",
        str(out),
        "--tokenizer",
        str(tok),
        "--corpus",
        str(corpus),
        "--plain",
    )
    code, stdout, err = cli(*args)
    assert code == 130, err
    assert "sweep interrupted during 2xsolo-shuffle c4" in err and "Traceback" not in err
    assert (out / "report.md").is_file()  # a partial report of what is stored
    fake.interrupt_at = None
    code, stdout, err = cli(*args, "--json")
    assert code == 0, err
    data = json.loads(stdout)
    assert data["status"] == "complete" and len(data["skipped_stored"]) == 16 and len(data["measured"]) == 5
    assert data["agreement"][0]["decode_and_ttft"]["pct"] == 100.0
    assert (out / "decode.png").is_file() and (out / "ttft.png").is_file()
    # a result of another image is measured again, never mixed into the sweep
    path = out / "openai-gpt-oss-120b-bench__cluster__pp1024-tg128__c8.json"
    data = json.loads(path.read_text())
    data["metadata"]["image"] = "sparkdeploy/vllm-node-mxfp4:000000000000"
    path.write_text(json.dumps(data))
    fake.benched.clear()
    code, stdout, err = cli(*args)
    assert code == 0, err
    assert fake.benched == [("cluster", 8)]


def test_live_display_shows_topology_level_and_eta(tmp_path):
    from io import StringIO

    from rich.console import Console

    from sparkdeploy.bench.sweep import RichReporter

    buf = StringIO()
    console = Console(file=buf, force_terminal=True, width=160, color_system=None)
    out = tmp_path / "sweep"
    fake = Fake(out, interrupt_at=("cluster", 4))
    reporter = RichReporter(console)
    seen = []
    orig = reporter.cell_progress

    def spy(variant, c, done, total):
        orig(variant, c, done, total)
        seen.append(reporter.progress.tasks[0].fields["detail"])

    reporter.cell_progress = spy
    summary = run_sweep(plan_for(out, "solo,cluster"), fake.deploy, fake.bench, reporter)
    text = buf.getvalue()
    assert summary.status == "interrupted"
    assert "Cluster TP=2 c4: requests 3/12" in seen and "Solo c64: requests 192/192" in seen
    assert "ETA" in text and "sweep openai-gpt-oss-120b-bench" in text
    assert "[Solo] c1: decode 57.5 ± " in text and "sweep interrupted during cluster c4" in text
    solo_c1 = next(line for line in text.splitlines() if "[Solo] c1: decode" in line)
    assert solo_c1.rstrip().endswith("[SIMULATED] (0s)"), solo_c1  # the fake's results are from vllm-sim
