"""benchmarks/nccl_probe_vs_nccl_tests.py's comparison, from the raw output of real runs on four H200s of one host
(docs/figures/nccl-probe-issue42/run3-4xH200): reading them again gives the committed tables, figure for figure."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "docs" / "figures" / "nccl-probe-issue42" / "run3-4xH200"


def _bench():
    spec = importlib.util.spec_from_file_location("nccl_bench", REPO / "benchmarks" / "nccl_probe_vs_nccl_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _again(bench, tmp_path, name):
    run = tmp_path / name
    shutil.copytree(RUN / name, run)
    (run / "comparison.txt").unlink()
    code = bench.main(["--from-dir", str(run)])
    assert (run / "comparison.txt").read_text() == (RUN / name / "comparison.txt").read_text()
    return code


def test_from_dir_reproduces_the_committed_comparisons(tmp_path, capsys):
    bench = _bench()
    assert _again(bench, tmp_path, "g2") == 0  # two GPUs: every goal met
    out = capsys.readouterr().out
    assert "goal: time within 15% of nccl-tests -t N -g 1, 8 B to 1 MiB: MET (18 rows, worst 13.1% off)" in out
    assert _again(bench, tmp_path, "g4") == 1  # four GPUs: the smallest sizes miss, and the note says why
    out = capsys.readouterr().out
    assert "goal: busbw within 3% of nccl-tests -t N -g 1 at >= 128 MiB: MET" in out
    assert "the 8 rows that miss the time goal: the C twin (a process per GPU) is within 3.6% of nccl-tests" in out


def _table(time_us, busbw, sizes=(8, 4096, 2**20, 2**27)):
    return "\n".join(
        f"{size:>12} {size // 4:>13}     float     sum      -1 {time_us + 5:>8.2f} 0.0 {busbw:>7.2f}      0 "
        f"{time_us:>8.2f} 0.0 {busbw:>7.2f}      0"
        for size in sizes
    )


def _probe(time_us, busbw, eager_us=10.5, graph_us=6.0):
    return {
        "ok": True,
        "sweep_method": "nccl-direct",
        "rows": [{"size": s, "time_us": time_us, "busbw": busbw, "host_max_us": 9.0} for s in (8, 4096, 2**20, 2**27)],
        "lat4k": {
            "rows": [
                {"id": "eager nccl-direct", "mode": "eager", "us": eager_us, "method": "m"},
                {"id": "graph nccl-direct", "mode": "graph", "us": graph_us, "method": "m"},
            ]
        },
    }


def test_goals_follow_the_medians_over_the_rounds():
    bench = _bench()
    meta = {"probe_rc": [0, 0, 0], "probe_wall_s": [9.0, 9.5, 9.1], "probe_timeout_s": 240, "teardown_s": [0.4] * 3}
    texts = {
        "threads": [_table(10.0, 100.0), _table(10.2, 100.0), _table(30.0, 50.0)],  # a slow round: the median holds
        "graph": [_table(6.1, 0.0, sizes=(4096,))] * 3,
        "cref": ["0 0 8 10.0 9.0\n1 0 8 10.4 8.0\n"] * 3,
    }
    probes = [_probe(11.0, 101.0), _probe(11.4, 101.0), _probe(50.0, 10.0)]
    rows, goals = bench.compare(texts, probes, meta)
    met = {g["goal"].split(" within")[0]: g["ok"] for g in goals}
    assert met == {
        "time": True,  # 11.4 / 10.2
        "busbw": True,  # 101 / 100
        "eager 4 KiB (NCCL direct)": True,  # 10.5 / 10.2
        "4 KiB in a CUDA graph": True,  # 6.0 / 6.1
        "every probe run exits cleanly after graph capture": True,
    }
    assert rows[0]["cref"] == 10.2 and rows[0]["cref_host_max"] == 9.0
    _, goals = bench.compare(
        texts, [_probe(12.0, 96.0, eager_us=12.0, graph_us=7.1)] * 3, dict(meta, teardown_s=[0.4, None, 0.4])
    )
    assert not any(g["ok"] for g in goals)  # 1.18, 0.96, 1.18, 1.16; a teardown not reported
    assert "not reported" in goals[-1]["detail"]
    _, goals = bench.compare({}, probes, meta)
    assert not any(g["ok"] for g in goals[:4])  # no reference, no goal met


def test_c_twin_lines_read_as_the_probes_figures():
    bench = _bench()
    text = (
        "# a comment\n0 0 8 10.0 9.0\n1 0 8 12.0 11.0\n0 1 8 20.0 1.0\n1 1 8 22.0 3.0\n0 2 8 1.0 1.0\n1 2 8 3.0 2.0\n"
    )
    # per cycle: the ranks' mean time (11, 21, 2) and the slowest rank's host time (11, 3, 2); medians over cycles
    assert bench.mp_ref_figures(text) == {8: {"time_us": 11.0, "host_max_us": 3.0}}
    assert bench.mp_ref_figure([text, text.replace("10.0", "30.0")], 8, "time_us") == 16.0
