#!/usr/bin/env python3
"""A dead rank to the first answer again, in the lab (issue 43), and the watcher's own cost.

1. For each backend (torchrun, ray): a cluster deployment of openai-gpt-oss-120b on the lab's two nodes (vllm-sim:
   the engine is SIMULATED; its ranks, gloo or Ray, Docker and the watchers are real). Each run SIGKILLs the
   worker's rank process inside its container (the container stays) and times, from the kill (this machine's
   clock; the lab's nodes share it):
   - noticed: the endpoint stops answering (the head's engine found its rank dead);
   - decided: the watcher's decision to restart the group (a lost rank seen, or `--unhealthy-s` of failed health
     checks);
   - stop phase: from the decision to rank 0 started again (every rank stopped first: rank 0 waits for the
     others' watchers to say so);
   - start phase: from rank 0 started to its /health answering (the others follow within a second);
   - healthy: rank 0's /health answers again (the watcher's record);
   - answered: the first chat completion through the endpoint.
   Each kill comes once Docker's own health check says rank 0 is healthy (it served a while). Baseline: the same
   with the watcher off, `sparkdeploy up` run by hand 12 s after the endpoint stopped answering (before issue 43
   nothing restarted the group: `up` found no difference and waited out its health gate). The ratio printed is
   the watcher's median time to an answer over the by-hand one's.
2. The watcher's cost: the guard container's process (utime + stime, VmRSS) over --seconds on each node of a
   serving cluster, with the watcher on and off (goal, as the guard's: < 1% of a core, < 50 MB).

    python benchmarks/watch_restart.py [--inventory lab] [--runs 3] [--seconds 60] [--unhealthy-s 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.lab import LabSpec
from sparkdeploy.runtime.session import Session

RECIPE, MODEL = "openai-gpt-oss-120b", "openai/gpt-oss-120b"
CLI = [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()"]
RANK = {"torchrun": "u /opt/sparkdeploy/launcher/serve_torchrun.py", "ray": "ray::SimRank"}
GOAL_CPU_PCT, GOAL_RSS_MB = 1.0, 50.0
HEAD = ""  # the lab node container of the head


def sd(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"sparkdeploy {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def node_sh(inventory: str, node: str, command: str) -> str:
    inv = load_inventory(inventory)
    with Session.open(inv) as session:
        return session.conn(node).run(["bash", "-c", command], timeout=60).stdout


def up(inventory: str, backend: str, watch: bool, unhealthy_s: float) -> str:
    sets = [f"guard.watch.enabled={'true' if watch else 'false'}", f"guard.watch.unhealthy_s={unhealthy_s}"]
    sets += ["guard.watch.backoff_s=1", "guard.watch.max_restarts=100", "guard.watch.stop_wait_s=20"]
    args = ["up", "--recipe", RECIPE, "-t", "cluster", "-b", backend, "-i", inventory, "--no-fabric-gate"]
    r = sd(*args, "--timeout", "240", "--json", *[x for s in sets for x in ("--set", s)])
    return json.loads(r.stdout)["endpoint"]


def answers(endpoint: str) -> bool:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        return requests.post(f"{endpoint}/chat/completions", json=body, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def until(pred, limit: float = 300.0) -> float:
    t0 = time.time()
    while not pred():
        if time.time() - t0 > limit:
            sys.exit("timed out")
        time.sleep(0.1)
    return time.time()


def docker_healthy(lab_node: str) -> bool:
    """Docker's own health check of rank 0 says healthy: it has served for a while (a rank dies on an engine
    that served, not one second after its first answer: before its first passing probe Docker counts nothing)."""
    cmd = ["docker", "exec", lab_node, "docker", "inspect", "--format", "{{.State.Health.Status}}", "sparkdeploy-vllm"]
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip() == "healthy"


def kill_rank(lab_node: str, backend: str) -> float:
    cmd = ["docker", "exec", lab_node, "docker", "exec", "sparkdeploy-vllm", "pkill", "-9", "-f", RANK[backend]]
    subprocess.run(cmd, check=True, capture_output=True)
    return time.time()


def decision(inventory: str) -> dict:
    """Rank 0's watcher's current decision (its /watch, on the lab's fabric network, which this machine reaches)."""
    inv = load_inventory(inventory)
    data = requests.get(f"http://{inv.head.fabric_address}:{inv.cluster.guard.watch.port}/watch", timeout=5).json()
    (group,) = [g for g in data["groups"].values() if g.get("rank") == 0]
    return group.get("decision") or {}


def run_watched(inventory: str, worker: str, backend: str) -> dict[str, float]:
    endpoint = up(inventory, backend, True, ARGS.unhealthy_s)
    until(lambda: answers(endpoint) and docker_healthy(HEAD))
    before = decision(inventory).get("gen")
    t0 = kill_rank(worker, backend)
    noticed = until(lambda: not answers(endpoint))
    answered = until(lambda: answers(endpoint))
    until(lambda: decision(inventory).get("gen") != before and decision(inventory).get("phase") == "done", 60)
    d = decision(inventory)
    return {
        "noticed": noticed - t0,
        "decided": d["at"] - t0,
        "healthy": d["done_at"] - t0,
        "answered": answered - t0,
        "stop phase": d["start_at"] - d["at"],
        "start phase": d["done_at"] - d["start_at"],
    }


def run_by_hand(inventory: str, worker: str, backend: str) -> dict[str, float]:
    endpoint = up(inventory, backend, False, ARGS.unhealthy_s)
    until(lambda: answers(endpoint) and docker_healthy(HEAD))
    t0 = kill_rank(worker, backend)
    noticed = until(lambda: not answers(endpoint))
    time.sleep(12)  # Docker's health check marks rank 0 unhealthy after 3 failed probes, 5 s apart: `up` sees it
    t_up = time.time()
    up(inventory, backend, False, ARGS.unhealthy_s)
    answered = until(lambda: answers(endpoint))
    return {"noticed": noticed - t0, "up": answered - t_up, "answered": answered - t0}


def cost(inventory: str, node: str, seconds: float) -> tuple[float, float]:
    """(CPU % of one core, RSS MB) of the guard's process (with its watcher's threads) over `seconds`."""
    read = "docker exec sparkdeploy-guard cat /proc/1/stat; docker exec sparkdeploy-guard grep VmRSS /proc/1/status"
    tick = int(node_sh(inventory, node, "getconf CLK_TCK"))

    def sample() -> tuple[float, float, float]:
        out = node_sh(inventory, node, read).splitlines()
        fields = out[0].rsplit(")", 1)[1].split()
        return time.monotonic(), (int(fields[11]) + int(fields[12])) / tick, int(out[1].split()[1]) / 1024

    t0, cpu0, _ = sample()
    time.sleep(seconds)
    t1, cpu1, rss = sample()
    return 100 * (cpu1 - cpu0) / (t1 - t0), rss


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    inventory = str(load_inventory(ARGS.inventory).path)
    global HEAD
    lab_worker = LabSpec().container_name(load_inventory(inventory).workers[0].name)  # the lab node's container
    HEAD = LabSpec().container_name(load_inventory(inventory).head.name)
    print(f"lab: {inventory}; engine SIMULATED (vllm-sim); watcher unhealthy_s {ARGS.unhealthy_s:g}; runs {ARGS.runs}")
    for backend in ARGS.backends.split(","):
        watched = [run_watched(inventory, lab_worker, backend) for _ in range(ARGS.runs)]
        by_hand = [run_by_hand(inventory, lab_worker, backend) for _ in range(ARGS.runs)]
        parts = ("noticed", "decided", "stop phase", "start phase", "healthy", "answered")
        print(f"\n{backend}: rank killed -> (median of {ARGS.runs} runs, seconds from the kill unless a phase)")
        for key in parts:
            print(f"  watcher  {key:<12} {median(watched, key):6.1f}   runs: {[round(r[key], 1) for r in watched]}")
        for key in ("noticed", "up", "answered"):
            print(f"  by hand  {key:<12} {median(by_hand, key):6.1f}   runs: {[round(r[key], 1) for r in by_hand]}")
        ratio = median(watched, "answered") / median(by_hand, "answered")
        print(f"  ratio (watcher / `up` by hand, to the first answer): {ratio:.2f}")
    print(f"\nthe guard's process over {ARGS.seconds:g} s on a serving cluster (torchrun), watcher on and off:")
    inv = load_inventory(inventory)
    for watch in (True, False):
        up(inventory, "torchrun", watch, ARGS.unhealthy_s)
        time.sleep(5)
        for node in inv.nodes:
            cpu, rss = cost(inventory, node.name, ARGS.seconds)
            print(
                f"  watcher {'on ' if watch else 'off'} {node.name} ({node.role}): CPU {cpu:.2f}% of a core "
                f"(goal {GOAL_CPU_PCT:g}%: {cpu / GOAL_CPU_PCT:.2f}), RSS {rss:.1f} MB "
                f"(goal {GOAL_RSS_MB:g} MB: {rss / GOAL_RSS_MB:.2f})"
            )
    if ARGS.down:
        sd("down", "-i", inventory)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default="lab")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--unhealthy-s", type=float, default=3.0)
    parser.add_argument("--backends", default="torchrun,ray")
    parser.add_argument("--down", action="store_true", help="`sparkdeploy down` at the end")
    ARGS = parser.parse_args()
    main()
