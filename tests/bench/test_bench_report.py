"""Reports from stored results: the tables, charts and Markdown hold the stored numbers (parsed back)."""

from __future__ import annotations

import json
import re

import pytest

from sparkdeploy.bench.report import read_chart_data, write_report
from sparkdeploy.bench.store import Stat, load_results, save_result, variant_label
from tests.bench.conftest import make_results

HEADINGS = {
    "decode_tps": "### Decode throughput",
    "prefill_tps": "### Prefill throughput",
    "ttft_ms": "### Time to first token",
}


def parse_md_table(md: str, heading: str) -> tuple[list[str], dict[int, dict[str, str]]]:
    """The table under a heading: column names and {concurrency: {column: cell text}}."""
    lines = md.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(heading))
    while not lines[i].startswith("|"):
        i += 1
    head = [c.strip() for c in lines[i].strip("|").split("|")]
    rows = {}
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[int(cells[0].lstrip("c"))] = dict(zip(head, cells, strict=False))
    return head, rows


def num(text: str) -> tuple[float, float | None]:
    mean, _, std = text.partition("±")
    return float(mean.replace(",", "")), (float(std.replace(",", "")) if std.strip() else None)


def mermaid_blocks(md: str) -> list[str]:
    return re.findall(r"```mermaid\n(.*?)```", md, re.S)


def test_report_files_hold_the_stored_numbers(stored_results, tmp_path, cli):
    out = tmp_path / "report"
    code, stdout, stderr = cli("bench", "report", str(stored_results), "--out", str(out), "--json")
    assert code == 0, stderr
    data = json.loads(stdout)
    results, _ = load_results([stored_results])
    assert len(results) == 21
    md = (out / "report.md").read_text()
    assert (
        json.loads((out / "report.json").read_text())["groups"][0]["tables"].keys()
        == data["groups"][0]["tables"].keys()
    )
    for metric, heading in HEADINGS.items():
        head, rows = parse_md_table(md, heading)
        assert head == ["Concurrency [SIMULATED]", "Solo", "Cluster TP=2", "Shuffle", "Winner"]  # lab results
        assert sorted(rows) == [1, 2, 4, 8, 16, 32, 64]
        for r in results:
            mean, std = num(rows[r.concurrency][variant_label(r.variant)])
            st = r.metrics[metric]
            tol = 0.051 if metric == "decode_tps" else 0.51
            assert mean == pytest.approx(st.mean, abs=tol)
            assert std == pytest.approx(st.std, abs=tol)
        # the chart: a PNG whose text chunk holds the plotted numbers
        png = out / {"decode_tps": "decode.png", "prefill_tps": "prefill.png", "ttft_ms": "ttft.png"}[metric]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        chart = read_chart_data(png)
        assert chart["metric"] == metric and chart["concurrency"] == [1, 2, 4, 8, 16, 32, 64]
        for r in results:
            assert chart["series"][r.variant][str(r.concurrency)] == pytest.approx(r.metrics[metric].mean)
        # JSON tables
        jrows = {row["concurrency"]: row for row in data["groups"][0]["tables"][metric]["rows"]}
        for r in results:
            assert jrows[r.concurrency]["cells"][r.variant]["mean"] == pytest.approx(r.metrics[metric].mean)
    # mermaid: one xychart per metric, every series with its numbers
    blocks = mermaid_blocks(md)
    assert len(blocks) == 3 and all("xychart-beta" in b for b in blocks)
    decode = blocks[0]
    cluster_line = next(line for line in decode.splitlines() if line.strip().startswith('line "Cluster TP=2"'))
    values = [float(x) for x in cluster_line.split("[")[1].rstrip("]").split(",")]
    expected = [
        r.metrics["decode_tps"].mean for r in sorted(results, key=lambda r: r.concurrency) if r.variant == "cluster"
    ]
    assert values == pytest.approx(expected, abs=0.051)
    assert "Simulated" in md  # results from a simulated engine say so


def test_winner_column_and_margin(stored_results, tmp_path):
    results, _ = load_results([stored_results])
    write_report(results, tmp_path)
    md = (tmp_path / "report.md").read_text()
    _, decode = parse_md_table(md, HEADINGS["decode_tps"])
    _, ttft = parse_md_table(md, HEADINGS["ttft_ms"])
    # seeds' means among Solo / Cluster / Shuffle: margin over the runner-up
    assert decode[1]["Winner"] == "Cluster (+20%)"  # 69.0 vs 57.7
    assert decode[8]["Winner"] == "Cluster (+30%)"  # 231.0 vs 177.5
    assert decode[64]["Winner"] == "Shuffle (+20%)"  # 567.9 vs 471.8
    assert ttft[1]["Winner"] == "Cluster (-32%)"  # 251 vs 369
    assert ttft[8]["Winner"] == "Shuffle (-1%) ~"  # 1005 vs 1020: inside one stdev
    assert ttft[64]["Winner"] == "Shuffle (-38%)"  # 4940 vs 8032


def test_agreement_with_the_reference(tmp_path):
    d = tmp_path / "r"
    # the same numbers as the seeds: every winner agrees
    for r in make_results():
        save_result(r, d)
    data = write_report(load_results([d])[0], tmp_path / "a")
    a = data["groups"][0]["agreement"]
    assert a["decode_and_ttft"] == {"agree": 14, "cells": 14, "pct": 100.0}
    # solo made fast at c1 and c2 decode: two decode cells disagree
    d2 = tmp_path / "r2"
    for r in make_results(scale={("solo", 1, "decode_tps"): 2.0, ("solo", 2, "decode_tps"): 2.0}):
        save_result(r, d2)
    data = write_report(load_results([d2])[0], tmp_path / "b")
    a = data["groups"][0]["agreement"]
    assert a["metrics"]["decode_tps"]["agree"] == 5 and a["metrics"]["decode_tps"]["cells"] == 7
    assert a["decode_and_ttft"]["pct"] == pytest.approx(100 * 12 / 14, abs=0.1)
    md = (tmp_path / "b" / "report.md").read_text()
    assert "| Decode throughput | c1 | Solo (+67%) | Cluster (+20%) | Cluster (+20%) | **no** |" in md


def test_load_results_skips_foreign_and_broken_files_and_keeps_the_newer_duplicate(stored_results, tmp_path):
    (stored_results / "notes.json").write_text('{"hello": 1}')  # not ours: ignored silently
    (stored_results / "broken.json").write_text("{")
    dup_dir = tmp_path / "older"
    r = make_results()[0]
    r.metadata["date"] = "2020-01-01T00:00:00+00:00"
    r.metrics["decode_tps"].mean = 1.0
    save_result(r, dup_dir)
    results, skipped = load_results([stored_results, dup_dir])
    assert len(results) == 21
    assert any("broken.json" in s and "unreadable" in s for s in skipped)
    assert any("kept the newer" in s for s in skipped)
    kept = next(x for x in results if x.key == r.key)
    assert kept.metrics["decode_tps"].mean != 1.0


def test_report_of_nothing_is_a_clean_error(tmp_path, cli):
    code, _out, err = cli("bench", "report", str(tmp_path))
    assert code == 2 and "no benchmark results" in err and "Traceback" not in err


def test_report_text_output(stored_results, cli):
    code, out, err = cli("bench", "report", str(stored_results), "--no-charts")
    assert code == 0, err
    assert "Cluster (+20%)" in out and "winners agree with the reference in 14/14" in out
    assert not (stored_results / "decode.png").exists()


def test_a_report_of_several_folders_goes_where_the_user_says(stored_results, tmp_path, cli):
    """Issue 30: `bench report D1 D2` wrote the joint report into D1, among D1's own results."""
    other = tmp_path / "other"
    other.mkdir()
    before = sorted(p.name for p in stored_results.iterdir())
    code, _out, err = cli("bench", "report", str(stored_results), str(other), "--no-charts")
    assert code == 2 and "--out" in err and "several result folders" in err, err
    assert sorted(p.name for p in stored_results.iterdir()) == before  # nothing written into D1
    joint = tmp_path / "joint"
    code, _out, err = cli("bench", "report", str(stored_results), str(other), "--no-charts", "--out", str(joint))
    assert code == 0, err
    assert (joint / "report.md").is_file() and sorted(p.name for p in stored_results.iterdir()) == before


def test_a_shared_cell_without_a_mean_is_left_out_of_the_agreement(tmp_path):
    """llama-benchy sometimes leaves a metric out: that cell has no winner to compare (it raised AttributeError)."""
    d = tmp_path / "r"
    for r in make_results(variants=("solo", "cluster")):
        if r.variant == "solo" and r.concurrency in (1, 2):
            r.metrics["prefill_tps"] = Stat(None, None, [])
        save_result(r, d)
    data = write_report(load_results([d])[0], tmp_path / "out", charts=False)
    cells = data["groups"][0]["agreement"]["metrics"]["prefill_tps"]["cells"]
    assert cells == 5  # 7 shared levels less the two without solo's prefill


def test_the_report_names_each_columns_engine_and_its_version(tmp_path, cli):
    """Issue 38: the report's Engine column says SGLang 0.5.23 for an SGLang result (vLLM for older results)."""
    d = tmp_path / "results"
    for r in make_results():
        if r.variant == "solo":
            r.metadata.update(engine="sglang", engine_title="SGLang", engine_version="0.5.23", vllm_version=None)
        save_result(r, d)
    out = tmp_path / "report"
    code, _, stderr = cli("bench", "report", str(d), "--out", str(out))
    assert code == 0, stderr
    md = (out / "report.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "| Engine |" in md and "| vLLM |" not in md
    assert "| SGLang 0.5.23 |" in rows["Solo"] and "| vLLM 0.32.0 |" in rows["Cluster TP=2"], rows
