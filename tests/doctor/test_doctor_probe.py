"""The all-reduce probe script for real: torchrun, two processes, gloo on CPU (the path the lab uses).

The NCCL path needs GPUs: `python -m torch.distributed.run --nproc-per-node 2
sparkdeploy/doctor/probe/allreduce_probe.py --backend nccl --json OUT` on a host with two.
"""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkdeploy.doctor.nccl_probe import PROBE, parse_nccl_table

STDLIB = set(sys.stdlib_module_names)


def test_probe_imports_only_torch_and_the_standard_library():
    tree = ast.parse(PROBE.read_text())
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.level == 0:
            names.add(n.module.split(".")[0])
    assert names - STDLIB == {"torch"}, names - STDLIB


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path: Path, *extra: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            str(PROBE),
            "--backend",
            "gloo",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    return proc, time.monotonic() - started


def test_probe_gloo_two_ranks(tmp_path):
    out = tmp_path / "result.json"
    proc, _ = _torchrun(tmp_path, "--max-bytes", "1M", "--lat-iters", "20", "--json", str(out), "--timeout", "200")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ok"] and result["backend"] == "gloo" and result["world_size"] == 2 and result["simulated"]
    sizes = [r["size"] for r in result["rows"]]
    assert sizes[0] == 8 and sizes[-1] == 2**20 and all(b == 2 * a for a, b in itertools.pairwise(sizes))
    assert all(r["wrong"] == 0 for r in result["rows"])
    for r in result["rows"]:
        assert r["busbw"] == pytest.approx(r["algbw"])  # n = 2: busbw = algbw x 2(n-1)/n
        assert r["algbw"] == pytest.approx(r["size"] / (r["time_us"] / 1e6) / 1e9, rel=1e-6)
    assert result["lat4k"]["eager_us"] > 0 and result["lat4k"]["graph_us"] is None
    assert "not applicable" in result["lat4k"]["graph_error"]
    # what rank 0 prints parses back to the same figures
    parsed = parse_nccl_table(proc.stdout)
    assert [r["size"] for r in parsed["rows"]] == sizes
    assert "SIMULATED" in proc.stdout


def test_probe_overall_timeout_ends_it(tmp_path):
    out = tmp_path / "result.json"
    # far too short for a 256 MiB sweep on CPU: the watchdog must end the ranks, exit 124, and say where
    proc, seconds = _torchrun(tmp_path, "--timeout", "4", "--json", str(out), timeout=120)
    assert proc.returncode != 0, proc.stdout[-1500:]
    assert "overall timeout of 4 s reached" in proc.stderr, proc.stderr[-3000:]
    assert seconds < 60
    assert json.loads(out.read_text())["ok"] is False
