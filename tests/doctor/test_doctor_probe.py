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


class RecordingNccl:
    """NcclDirect's calling surface with ncclAllReduce replaced by a C-callable recorder (a unit test of the timing
    logic without a GPU: the real path is measured in docs/benchmarks.md)."""

    FLOAT32, SUM = 7, 0

    def __init__(self):
        import ctypes

        from sparkdeploy.doctor.probe.allreduce_probe import NcclDirect

        self.calls: list[tuple[int, int, int]] = []
        vp = ctypes.c_void_p

        def record(send, recv, count, dtype, op, comm, stream):
            self.calls.append((send or 0, count, stream or 0))
            assert send == recv and (dtype, op) == (self.FLOAT32, self.SUM)
            return 0

        proto = ctypes.CFUNCTYPE(ctypes.c_int, vp, vp, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, vp, vp)
        self.raw_all_reduce = proto(record)
        self.call_args = NcclDirect.call_args.__get__(self)
        self.launcher = NcclDirect.launcher.__get__(self)

    def check(self, rc, what):
        assert rc == 0, what

    def all_reduce(self, comm, send, recv, count, stream):
        self.calls.append((send, count, stream))


class Stream:
    cuda_stream = 0x5000

    def __init__(self):
        self.waits = 0

    def synchronize(self):
        self.waits += 1


def test_measure_times_nccl_direct_as_nccl_tests_does():
    """Each timed run is lined up by one all-reduce of the size at the first slot, then --iters launches at the
    next size-long slot each (nccl-tests' shift), then the stream's wait; --repeats cycles over the whole sweep;
    each row carries the ranks' host time per call and a python floor comes out."""
    import ctypes

    import torch
    import torch.distributed as dist

    from sparkdeploy.doctor.probe import allreduce_probe as probe

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        args = probe.args_parser().parse_args(["--iters", "4", "--warmup", "1", "--repeats", "2", "--lat-iters", "3"])
        direct, stream = RecordingNccl(), Stream()
        measure = probe.Measure(
            args, torch, dist, torch.device("cpu"), 0, 1, direct, ctypes.c_void_p(0), stream, same_host=True
        )
        sizes = [8, 16, 32]
        rows = measure.sweep(sizes, 2**30, 0.0)
        assert [r["size"] for r in rows] == sizes and all(r["repeats"] == 2 and r["wrong"] == 0 for r in rows)
        assert all(r["time_us"] >= r["host_us"] > 0 and r["host_ranks_us"] == [r["host_us"]] for r in rows)
        calls = direct.calls
        # per size: the correctness call and one warm-up; then per cycle and size: the line-up and 4 timed calls
        assert len(calls) == len(sizes) * 2 + 2 * len(sizes) * 5 and {c[2] for c in calls} == {0x5000}
        base = min(c[0] for c in calls)
        cycle = calls[len(sizes) * 2 :][: len(sizes) * 5]
        for k, size in enumerate(sizes):
            run = cycle[5 * k : 5 * k + 5]
            steps = 32 // size
            assert [c[0] - base for c in run] == [0] + [size * (i % steps) for i in range(4)]
            assert {c[1] for c in run} == {size // 4}
        assert stream.waits >= 2 * len(sizes) * 2  # each timed run: the line-up's wait and the run's own
        lat = {"eager_us": None, "graph_us": None, "graph_error": None, "rows": []}
        direct.calls.clear()
        measure.latency(lat)
        assert [r["id"] for r in lat["rows"]] == ["eager nccl-direct", "eager nccl-vllm", "eager torch.distributed"]
        assert lat["eager_method"] == "eager nccl-direct" and lat["graph_error"]  # no CUDA graphs on a CPU
        assert measure.floor() > 0
    finally:
        dist.destroy_process_group()
