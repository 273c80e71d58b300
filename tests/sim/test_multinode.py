"""Multi-rank serving for real: separate processes on this host joined over 127.0.0.1.

torchrun (the lockstep launcher), vLLM's native --nnodes mode and Ray each: the head answers only once
every rank has joined, serves generations stepped in lockstep, and turns /health 503 when a rank dies
(or hangs past the collective timeout).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.sim.chat_suite import expected_shape, run_suite
from tests.sim.conftest import LAUNCHER_DIR, MODEL, free_port, sim_env, wait_http

ARGS = [MODEL, "--max-model-len", "4096", "--host", "127.0.0.1"]
# issue 18: each backend serves the parsers the shipped recipes name (torchrun: qwen3.5's, native: GLM's)
QWEN_PARSERS = ["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3"]
GLM_PARSERS = ["--enable-auto-tool-choice", "--tool-call-parser", "glm47", "--reasoning-parser", "glm45"]


def generate(base: str, n: int = 6) -> dict:
    r = requests.post(
        base + "/v1/completions", timeout=60, json={"model": MODEL, "prompt": "one two three", "max_tokens": n}
    )
    assert r.status_code == 200, r.text
    return r.json()


def wait_status(url: str, status: int, timeout: float) -> float:
    start = time.monotonic()
    wait_http(url, status, timeout)
    return time.monotonic() - start


@pytest.fixture
def group_spawn(spawn):
    """Processes in their own sessions, so a node's children die with it."""

    def start(args, env, name):
        return spawn(args, env, name, session=True)

    return start


def test_torchrun_lockstep_and_dead_rank(group_spawn):
    port, master = free_port(), free_port()
    env = sim_env(0.05, SPARKLAUNCH_COLLECTIVE_TIMEOUT_S="20")

    def node(rank):
        return group_spawn(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(master),
                str(LAUNCHER_DIR / "serve_torchrun.py"),
                *ARGS,
                "--port",
                str(port),
                "-tp",
                "2",
                *QWEN_PARSERS,
            ],
            env,
            f"torchrun{rank}",
        )

    head, worker = node(0), node(1)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", 200, timeout=90, proc=head.p)
    rank1 = [pid for pid in worker.descendants() if b"serve_torchrun.py" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(rank1) == 1
    info = requests.get(base + "/sim/info", timeout=5).json()
    assert info["mode"] == "torchrun" and info["tp"] == 2
    body = generate(base)
    assert body["choices"][0]["text"].startswith("[simulated by vllm-sim]")
    assert body["usage"]["completion_tokens"] == 6
    assert run_suite(base + "/v1", MODEL) == expected_shape(reasoning=True)
    os.kill(rank1[0], signal.SIGKILL)  # the rank process itself, not its torchrun agent
    assert wait_status(base + "/health", 503, timeout=25) < 25
    r = requests.post(base + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=10)
    assert r.status_code == 503 and "RankFailure" in r.json()["error"]["message"]


def test_torchrun_rejects_tp_not_matching_ranks(group_spawn):
    master = free_port()
    proc = group_spawn(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(master),
            str(LAUNCHER_DIR / "serve_torchrun.py"),
            *ARGS,
            "--port",
            str(free_port()),
            "-tp",
            "2",
        ],
        sim_env(),
        "torchrun-bad",
    )
    assert proc.p.wait(90) != 0
    assert "torchrun started 1 ranks" in proc.log.read_text()


def native(group_spawn, rank, port, master, env, headless=True):
    args = [
        sys.executable,
        "-m",
        "vllm_sim",
        "serve",
        *ARGS,
        "--port",
        str(port),
        "-tp",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master),
        *GLM_PARSERS,
    ]
    if rank and headless:
        args.append("--headless")
    return group_spawn(args, env, f"native{rank}")


def test_native_head_waits_for_every_rank_then_fails_when_one_dies(group_spawn):
    port, master = free_port(), free_port()
    env = sim_env(0.05)
    head = native(group_spawn, 0, port, master, env)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", 503, timeout=60, proc=head.p)  # serving, but not every rank joined
    time.sleep(1.0)
    assert requests.get(base + "/health", timeout=5).status_code == 503
    worker_port = free_port()
    worker = native(group_spawn, 1, worker_port, master, env)
    wait_http(base + "/health", 200, timeout=60, proc=head.p)
    assert generate(base)["usage"]["completion_tokens"] == 6
    info = requests.get(base + "/sim/info", timeout=5).json()
    assert info["mode"] == "native" and info["steps"] >= 6
    assert run_suite(base + "/v1", MODEL) == expected_shape(reasoning=True)
    with pytest.raises(requests.ConnectionError):  # headless: no HTTP on the worker's --port
        requests.get(f"http://127.0.0.1:{worker_port}/health", timeout=2)
    worker.kill()
    assert wait_status(base + "/health", 503, timeout=20) < 20


def test_native_hung_rank_times_out(group_spawn):
    port, master = free_port(), free_port()
    env = sim_env(0.05, VLLM_SIM_COLLECTIVE_TIMEOUT_S="3")
    head = native(group_spawn, 0, port, master, env)
    worker = native(group_spawn, 1, port, master, env)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", 200, timeout=60, proc=head.p)
    worker.signal(signal.SIGSTOP)
    try:
        waited = wait_status(base + "/health", 503, timeout=20)
        assert 2.0 < waited < 15, waited  # the heartbeat's collective waits out the 3 s timeout
    finally:
        worker.signal(signal.SIGCONT)


@pytest.mark.lab  # about a minute on a 2-core machine (two Ray nodes start): runs with the lab suite
def test_ray_worker_actor_on_the_other_node(group_spawn):
    import tempfile

    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    gcs = free_port()
    env = sim_env(0.05, VLLM_SIM_COLLECTIVE_TIMEOUT_S="10", RAY_ADDRESS=f"127.0.0.1:{gcs}")
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--block", "--disable-usage-stats"]
    head_node = group_spawn(
        ["ray", "start", "--head", "--port", str(gcs), "--include-dashboard", "false", "--temp-dir", temp, *common],
        env,
        "ray-head",
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    def ray_nodes(want: int) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert head_node.p.poll() is None, head_node.output()[-3000:]
            out = subprocess.run(
                ["ray", "status", "--address", f"127.0.0.1:{gcs}"], env=env, capture_output=True, text=True
            )
            if out.returncode == 0 and out.stdout.count("node_") >= want:
                return
            time.sleep(1)
        raise AssertionError(f"the Ray cluster did not reach {want} node(s)")

    ray_nodes(1)
    # one node only: the sim refuses to start, as vLLM does when the cluster cannot host the ranks
    lonely = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_sim",
            "serve",
            *ARGS,
            "--port",
            str(port),
            "-tp",
            "2",
            "--distributed-executor-backend",
            "ray",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert lonely.returncode == 1 and "1 alive node(s)" in lonely.stdout + lonely.stderr
    worker_node = group_spawn(["ray", "start", "--address", f"127.0.0.1:{gcs}", *common], env, "ray-worker")
    ray_nodes(2)
    sim = group_spawn(
        [
            sys.executable,
            "-m",
            "vllm_sim",
            "serve",
            *ARGS,
            "--port",
            str(port),
            "-tp",
            "2",
            "--distributed-executor-backend",
            "ray",
        ],
        env,
        "sim-ray",
    )
    wait_http(base + "/health", 200, timeout=90, proc=sim.p)
    assert generate(base)["usage"]["completion_tokens"] == 6
    assert "worker actors on" in sim.log.read_text()
    worker_node.kill()  # the worker node goes away with its actor
    assert wait_status(base + "/health", 503, timeout=30) < 30
    assert head_node.p.poll() is None
    head_node.stop()
    shutil.rmtree(temp, ignore_errors=True)


def _rank(rank: int, port: int, tokens: int, results) -> None:
    import sys as _sys

    _sys.path[:0] = [str(LAUNCHER_DIR)]
    from sparklaunch.control import GlooControl, RankFailure
    from sparklaunch.protocol import Delta, StepInput

    control = GlooControl(rank, 2, f"tcp://127.0.0.1:{port}", timeout_s=10, rendezvous_timeout_s=60)
    control.start()
    fn = lambda inp: [Delta(str(i), [i], "x") for i in range(tokens)]  # noqa: E731
    try:
        if rank == 0:
            control.step(StepInput(), fn)  # the ranks agree: one step passes
            control.step(StepInput(), lambda inp: fn(inp) * 2)
        else:
            control.serve_worker(fn)
        results.put((rank, "no error"))
    except RankFailure as e:
        results.put((rank, str(e)))
    finally:
        control.close()


def test_gloo_control_detects_ranks_out_of_step():
    """Identical inputs must give identical outputs on every rank; the per-step all-reduce checks it."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, 1, results)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=60) for _ in procs)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert "out of step" in got[0] and "out of step" in got[1], got
