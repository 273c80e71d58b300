"""Figures of a simulated engine are never shown unlabelled (issue 24): `bench` (which finds out by itself, from
the engine, whether it is simulated), `bench sweep`, `bench report`'s tables and charts, and `top`. The engine
is the real simulator (vllm-sim from the checkout), alone and behind the project's real LiteLLM proxy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkdeploy.bench.benchy import BenchSettings, Endpoint
from sparkdeploy.bench.deploy_link import url_endpoint
from sparkdeploy.bench.report import build_table, chart_figure, read_chart_data
from sparkdeploy.bench.store import METRICS, read_result, save_result
from sparkdeploy.bench.sweep import PlainReporter, make_plan, parse_topologies, run_sweep
from sparkdeploy.simulated import LABEL
from tests.bench.bench_fakes import FakeOpenAI
from tests.bench.conftest import PROXY_KEY, PROXY_MODEL, SIM_KEY, SIM_MODEL, free_port, make_results

TITLES = tuple(m.title for m in METRICS.values())


# ---------------------------------------------------------------- bench --endpoint asks the engine


def test_bench_endpoint_finds_out_that_the_simulator_is_simulated(sim, tmp_path, monkeypatch, cli):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # llama-benchy's corpus cache stays in the test
    monkeypatch.delenv("SPARKDEPLOY_BENCH_TOKENIZER", raising=False)
    monkeypatch.delenv("SPARKDEPLOY_BENCH_CORPUS", raising=False)
    monkeypatch.setenv("SPARKDEPLOY_API_KEY", SIM_KEY)
    code, out, err = cli(
        "bench",
        "--endpoint",
        sim,
        "--model",
        SIM_MODEL,
        "-c",
        "1,2",
        "--runs",
        "1",
        "--pp",
        "64",
        "--tg",
        "8",
        "--out",
        str(tmp_path / "out"),
        "--json",
    )  # no --simulated: it asks
    assert code == 0, err
    data = json.loads(out)
    assert data["simulated"] is True and "X-Simulated-By" in data["simulated_evidence"], data
    assert f"{LABEL}: vllm-sim stands in for the GPU" in err
    lines = [line for line in err.splitlines() if line.startswith(("c1: decode", "c2: decode"))]
    assert len(lines) == 2 and all("t/s, TTFT" in x and f"ms [{LABEL}] -> " in x for x in lines), err
    for r in data["results"]:
        md = read_result(Path(r["file"])).metadata
        assert md["simulated"] is True and md["coherence_checked"] is False and md["vllm_version"] == "0.32.0"
        assert SIM_KEY not in json.dumps(md)


def test_the_simulator_behind_litellm_is_found_out_too(proxy):
    """A proxy has no /version: one chat completion of one token, whose headers LiteLLM passes on."""
    ep = url_endpoint(proxy, PROXY_MODEL, PROXY_KEY, {"topology": "2xsolo"})
    assert ep.metadata["simulated"] is True, ep.metadata
    assert "chat completion" in ep.metadata["simulated_evidence"] and ep.metadata["vllm_version"] is None


def test_an_engine_without_the_marker_is_not_labelled():
    with FakeOpenAI(model="m") as real:  # answers like an engine, says nothing about simulation
        ep = url_endpoint(real.base_url, "m", None, {})
        assert ep.metadata["simulated"] is False and "no simulator marker" in ep.metadata["simulated_evidence"]
        assert real.requests == 1  # the one-token completion
        forced = url_endpoint(real.base_url, "m", None, {}, mark_simulated=True)  # `bench --simulated`
        assert forced.metadata["simulated"] is True and forced.metadata["simulated_evidence"] == "--simulated"
    gone = url_endpoint(f"http://127.0.0.1:{free_port()}/v1", "m", None, {})
    assert gone.metadata["simulated"] is None and "no answer" in gone.metadata["simulated_evidence"]


# ---------------------------------------------------------------- bench report: tables and charts


def _store(d: Path, simulated: bool, max_c: int = 64) -> Path:
    for r in make_results():
        if r.concurrency <= max_c:
            r.metadata["simulated"] = simulated
            save_result(r, d)
    return d


@pytest.mark.parametrize("simulated", [True, False])
def test_report_tables_and_charts_say_simulated(tmp_path, cli, simulated):
    results = _store(tmp_path / "results", simulated, max_c=8)
    code, out, err = cli("bench", "report", str(results), "--out", str(tmp_path / "report"))
    assert code == 0, err
    titles = [line for line in out.splitlines() if line.startswith(TITLES)]
    assert len(titles) == 3
    if simulated:
        assert all(t.endswith(f"[{LABEL}]") for t in titles), titles
        assert out.splitlines()[0].endswith(f"{LABEL}: vllm-sim stands in for the GPU: not hardware measurements")
    else:
        assert LABEL not in out
    for png in ("decode.png", "prefill.png", "ttft.png"):
        data = read_chart_data(tmp_path / "report" / png)
        assert data["simulated"] is simulated
        # c1..c8 measured, the reference's dashed lines go on to c64: every level with a point has its tick
        assert data["concurrency"] == [1, 2, 4, 8] and data["ticks"] == [1, 2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize("simulated", [True, False])
def test_chart_says_simulated_on_the_picture_and_labels_every_plotted_level(simulated):
    import matplotlib.pyplot as plt

    from sparkdeploy.bench.seeds import seed_reference

    measured = [r for r in make_results() if r.concurrency <= 8]
    ref = build_table("decode_tps", seed_reference().results)
    fig, _data = chart_figure(build_table("decode_tps", measured), "decode", ref, simulated=simulated)
    try:
        (ax,) = fig.axes
        words = [t.get_text() for t in fig.texts + ax.texts]
        assert any(LABEL in w for w in words) is simulated, words
        assert (LABEL in ax.get_title()) is simulated  # the chart's own title too
        assert [t.get_text() for t in ax.get_xticklabels()] == ["c1", "c2", "c4", "c8", "c16", "c32", "c64"]
        lo, hi = ax.get_xlim()
        assert lo < 1 and hi > 64  # no point sits past the labelled axis
    finally:
        plt.close(fig)


@pytest.mark.parametrize("simulated", [True, False])
def test_every_format_of_the_report_says_simulated_beside_every_figure(tmp_path, cli, simulated):
    """Issue 36 item 8: report.md said SIMULATED only in its top banner. Now every heading, table header, mermaid
    title and image text of the Markdown, every group and table of the JSON, every row of the CSV and the PNG's
    own title say it (and a real engine's say nothing of the kind)."""
    import csv

    from PIL import Image

    results = _store(tmp_path / "results", simulated, max_c=8)
    out = tmp_path / "report"
    code, _out, err = cli("bench", "report", str(results), "--out", str(out))
    assert code == 0, err
    md = (out / "report.md").read_text().splitlines()
    labelled = [
        *(x for x in md if x.startswith(("## ", "### "))),
        *(x for x in md if x.strip().startswith("title ")),  # mermaid chart titles
        *(x for x in md if x.startswith(("| Concurrency", "| Metric"))),  # table headers
        *(x for x in md if x.startswith("![")),  # the PNGs' texts
    ]
    assert len(labelled) >= 3 + 3 + 3 + 3 + 1, labelled
    assert all((LABEL in x) is simulated for x in labelled if not x.startswith("# ")), labelled
    data = json.loads((out / "report.json").read_text())
    assert data["simulated"] is simulated
    for g in data["groups"]:
        assert g["simulated"] is simulated and (g["label"] == LABEL) is simulated
        for t in g["tables"].values():
            assert t["simulated"] is simulated and (LABEL in t["title"]) is simulated
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert len(rows) == 3 * 4 * 3  # 3 metrics x 4 levels (c1..c8) x 3 columns
    assert all(r["simulated"] == (LABEL if simulated else "") for r in rows)
    for png in ("decode.png", "prefill.png", "ttft.png"):
        with Image.open(out / png) as img:
            assert (LABEL in img.text["Title"]) is simulated  # type: ignore[attr-defined]


# ---------------------------------------------------------------- bench and bench sweep


def test_figures_line_is_labelled_and_survives_a_metric_llama_benchy_did_not_report():
    from sparkdeploy.bench.report import figures_line
    from sparkdeploy.bench.store import Stat

    m = {"decode_tps": Stat(12.34, 0.5), "ttft_ms": Stat(40.2)}  # no pp_throughput: a prefill too short to time
    assert figures_line(m, True) == f"decode 12.3 ± 0.5 t/s, prefill - t/s, TTFT 40 ms [{LABEL}]"
    assert figures_line(m, False) == "decode 12.3 ± 0.5 t/s, prefill - t/s, TTFT 40 ms"


@pytest.mark.parametrize("simulated", [True, False])
def test_sweep_lines_say_simulated_beside_the_figures(tmp_path, simulated):
    out = tmp_path / "sweep"
    ref = {(r.variant, r.concurrency): r for r in make_results()}

    def deploy(topology, routing):
        return Endpoint(
            "http://192.0.2.1:8000/v1",
            SIM_MODEL,
            None,
            {"recipe": "openai-gpt-oss-120b-bench", "topology": topology, "simulated": simulated},
        )

    def bench(endpoint, c, progress):
        r = ref[(endpoint.variant, c)]
        md = dict(r.metadata, **endpoint.metadata, runs=3, failed_requests=0)
        res = type(r)(r.recipe, endpoint.variant, r.pp, r.tg, c, r.metrics, md)
        save_result(res, out)
        return res

    lines: list[str] = []
    plan = make_plan("openai-gpt-oss-120b-bench", parse_topologies("solo"), [1, 2], BenchSettings(runs=3), out)
    summary = run_sweep(plan, deploy, bench, PlainReporter(lines.append))
    assert summary.status == "complete"
    figures = [x for x in lines if "decode" in x and "TTFT" in x]
    deployed = [x for x in lines if x.startswith("deployed solo")]
    assert len(figures) == 2 and len(deployed) == 1
    if simulated:
        assert all(f"ms [{LABEL}] (" in x for x in figures) and f"{LABEL} engine" in deployed[0], lines
    else:
        assert not any(LABEL in x for x in lines), lines


# ---------------------------------------------------------------- top


def test_top_reads_the_simulators_marker_and_labels_its_rows(sim):
    from io import StringIO

    from rich.console import Console

    from sparkdeploy.cli.top_cmd import render_table
    from sparkdeploy.daytwo import top

    target = top.Target("spark1", "sparkdeploy-vllm", "engine", sim[: -len("/v1")] + "/metrics")
    mon = top.Monitor([target], since_start=True)
    mon.sample()
    mon.sample()
    snap = mon.snapshot()
    assert snap["simulated"] is True and snap["engines"][0]["simulated"] is True, snap
    real = {**snap, "simulated": False, "engines": [dict(snap["engines"][0], simulated=False)]}
    for s, labelled in ((snap, True), (real, False)):
        buf = StringIO()
        Console(file=buf, width=200, color_system=None).print(render_table(s, "sparkdeploy top"))
        lines = buf.getvalue().splitlines()
        i = next(n for n, line in enumerate(lines) if "spark1" in line)
        assert "sparkdeploy-vllm" in lines[i] and (f"│ {LABEL} " in lines[i + 1]) is labelled, lines
        assert (lines[0].rstrip() == f"{LABEL}: vllm-sim stands in for the GPU: not hardware measurements") is labelled
