"""Fixtures for the simulator and launcher tests: import paths, free ports, sim servers in subprocesses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.processes import descendants, kill, kill_tree

REPO = Path(__file__).resolve().parents[2]
SIM_DIR = REPO / "images" / "vllm-sim"
LAUNCHER_DIR = REPO / "images" / "launcher"
for p in (str(SIM_DIR), str(LAUNCHER_DIR)):
    if p not in sys.path:
        sys.path.insert(0, p)

MODEL = "openai/gpt-oss-120b"
SEED_ARGS = [
    "--max-model-len",
    "4096",
    "--gpu-memory-utilization",
    "0.7",
    "--enforce-eager",
    "--kv-cache-dtype",
    "fp8",
    "--mxfp4-layers",
    "moe,qkv,o,lm_head",
    "--max-num-batched-tokens",
    "32768",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sim_env(time_scale: float = 0.05, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SIM_DIR), str(LAUNCHER_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["VLLM_SIM_TIME_SCALE"] = str(time_scale)
    env.update(extra)
    return env


def wait_http(url: str, status: int = 200, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} while waiting for {url}")
        try:
            last = requests.get(url, timeout=2).status_code
            if last == status:
                return
        except requests.RequestException as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer {status} within {timeout}s (last: {last})")


class Proc:
    """A child process with its output in a file; stopped by pid at teardown. With session=True it leads
    its own session, and stop()/kill() reach its children too (torchrun's workers, ray's daemons)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, session: bool = False):
        self.log = log
        self.session = session
        self._fh = open(log, "wb")
        self.p = subprocess.Popen(
            args, env=env, stdout=self._fh, stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=session
        )

    def output(self) -> str:
        self._fh.flush()
        return self.log.read_text(errors="replace")

    def descendants(self) -> list[int]:
        """Child processes, recursively (torchrun starts its workers in sessions of their own)."""
        return sorted(pid for pid, _ in descendants(self.p.pid))

    def signal(self, sig: int) -> None:
        try:
            if self.session:
                os.killpg(self.p.pid, sig)
            else:
                self.p.send_signal(sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the process and everything it started."""
        kill_tree(self.p.pid)
        self.p.wait(10)

    def stop(self, timeout: float = 10.0) -> int | None:
        family = descendants(self.p.pid)
        if self.p.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        kill_tree(self.p.pid)
        kill(family)  # children that outlived their parent
        self.p.wait(timeout)
        self._fh.close()
        return self.p.returncode


@pytest.fixture
def spawn(tmp_path):
    procs: list[Proc] = []

    def start(args: list[str], env: dict[str, str] | None = None, name: str = "proc", session: bool = False) -> Proc:
        proc = Proc(args, env or sim_env(), tmp_path / f"{name}-{len(procs)}.log", session)
        procs.append(proc)
        return proc

    yield start
    for proc in reversed(procs):
        proc.stop()


@pytest.fixture
def sim_server(spawn):
    """Start `python -m vllm_sim serve` on a free port; returns (base_url, proc)."""

    def start(*extra: str, model: str = MODEL, time_scale: float = 0.05, env_extra: dict | None = None):
        port = free_port()
        args = [sys.executable, "-m", "vllm_sim", "serve", model, "--port", str(port), "--host", "127.0.0.1", *extra]
        proc = spawn(args, sim_env(time_scale, **(env_extra or {})), name="sim")
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/health", proc=proc.p)
        return base, proc

    return start
