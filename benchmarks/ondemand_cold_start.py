#!/usr/bin/env python3
"""The parts of an on-demand member's cold start (issue 40), in the lab, as the node-side activator will run them.

`up --stack` prepares the member (files, image, model, its engine container created, not started: docs/stack.md);
then, --rounds times, on the member's node over SSH: `docker start` of that container (the container start),
its engine's /health until 200 (the engine load and the first health answer: vllm-sim's load is SIMULATED, a
modelled delay, not a GB10's), the first token of a streamed chat completion asked of the engine directly, and
`docker stop` (the idle stop: its memory freed). Medians of the rounds.

First, --rounds times, THROUGH THE GATEWAY (the path an owner's request takes): wait until the member is stopped
(its node's activator stops it after its idle timeout, 10 s here), then a streamed chat completion to the gateway
with the master key: the gateway holds it, the activator (polling once a second) starts the engine, the hook
routes it once the watcher says `ok` (polled once a second), and the time to its first token is the cold start an
owner sees. No preflight part: a cold start runs none (`up --stack` did; the activator's budget check is a read of
the node's containers).

    python benchmarks/ondemand_cold_start.py [--inventory lab] [--rounds 3] [--before DIR] [--idle-s 30]

--before DIR: a checkout of an earlier tree (e.g. `git archive COMMIT | tar -x -C DIR`): its `up --stack` (its
gateway hook, its guard and watcher) is measured first, the same rounds through the gateway, then this tree's;
printed side by side with the ratio. After each tree's rounds, with the member stopped and nothing asked, the CPU
the guard (the member's node) and the gateway (the head) use over --idle-s seconds (their cgroups): the idle
cost, which shorter polls while a request is held must not raise.

On a DGX Spark (the owner's command; the engine's real load time): the same script with -i YOUR_INVENTORY and a
stack file naming your recipe: --stack FILE --member NAME.

Needs the lab (`sparkdeploy lab up`). Leaves nothing running: it ends with `sparkdeploy down`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.config.secrets import load_secrets
from sparkdeploy.deploy.stack.file import load_stack
from sparkdeploy.runtime.session import Session

ROOT = str(Path(__file__).resolve().parents[1])
CLI = [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()"]
STACK = """deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.45}
  - {name: coder, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark1], memory: 0.45, port: 8001,
     on_demand: true, idle_timeout: 10s}
"""


def sd(*args: str, tree: str | None = None) -> tuple[float, str]:
    """The CLI of this checkout, or of `tree` (python -c imports sparkdeploy from its working directory first)."""
    t0 = time.monotonic()
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900, cwd=tree or ROOT)
    if r.returncode != 0:
        raise SystemExit(f"sparkdeploy {' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return time.monotonic() - t0, r.stdout


def healthy(url: str, deadline: float) -> float:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic()
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url}: not healthy in time")


def first_token(base: str, model: str) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    req = urllib.request.Request(
        f"{base}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            if line.startswith(b"data: ") and b'"content"' in line:
                return time.monotonic()
    raise SystemExit("no token in the stream")


def stopped(conn, container: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        out = conn.run(["docker", "inspect", "--format", "{{.State.Running}}", container], timeout=30).stdout
        if out.strip() == "false":
            return
        time.sleep(1)
    raise SystemExit(f"{container}: not stopped as idle in time")


def gateway_first_token(endpoint: str, key: str, model: str) -> float:
    """Seconds from sending a streamed request to the gateway to its first token."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    req = urllib.request.Request(f"{endpoint}/chat/completions", json.dumps(body).encode(), headers)
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            if line.startswith(b"data: ") and b'"content"' in line:
                return time.monotonic() - t0
    raise SystemExit("no token in the gateway's stream")


# a container's CPU time in µs, from its own cgroup: v2 (a Spark) or v1 (the lab's nested engine)
CPU_USAGE = (
    "docker exec {name} sh -c "
    '\'if [ -f /sys/fs/cgroup/cpu.stat ]; then sed -n "s/^usage_usec //p" /sys/fs/cgroup/cpu.stat; '
    "else echo $(( $(cat /sys/fs/cgroup/cpuacct/cpuacct.usage) / 1000 )); fi'"
)
GUARD, GATEWAY = "sparkdeploy-guard", "sparkdeploy-gateway-litellm"


def idle_cpu(conns: dict[str, Any], seconds: float) -> dict[str, float]:
    """{container: % of one core} over `seconds`, conns: container -> its node's connection."""

    def usage(name: str) -> int:
        return int(conns[name].run(["bash", "-c", CPU_USAGE.format(name=name)], timeout=60).stdout.strip())

    before = {name: usage(name) for name in conns}
    t0 = time.monotonic()
    time.sleep(seconds)
    after = {name: usage(name) for name in conns}
    wall = time.monotonic() - t0
    return {name: (after[name] - before[name]) / 1e6 / wall * 100 for name in conns}


def through_gateway(args: argparse.Namespace, path: Path, tree: str | None, inv: Any, key: str) -> dict[str, Any]:
    """`up --stack` from `tree` (None: this checkout), then the rounds through the gateway and the idle CPU:
    {"up_s", "through" (seconds to the first token, per round), "cpu" (% of a core idle), "node", "container"}."""
    up_s, out = sd("up", "--stack", str(path), "-i", args.inventory, "--timeout", "300", "--json", tree=tree)
    unit = next(u for u in json.loads(out)["units"] if u["deployment"] == args.member)
    step = next(u for u in unit["steps"] if u["step"] in ("create-container", "start-container"))
    node_name, container = step["node"], step["target"]
    model = load_stack_members(path, args.inventory)[args.member][1]
    endpoint = load_stack(str(path), args.inventory).endpoint
    through: list[float] = []
    with Session.open(inv) as session:
        conn = session.conns[node_name]
        for _ in range(args.rounds):
            stopped(conn, container, time.monotonic() + 120)  # cold: created, or stopped as idle
            # and cold as the gateway sees it: its poller asks the watcher once a second when nothing is held (a
            # request in that second is sent to the stopped engine: a 500, docs/benchmarks.md)
            time.sleep(1.5)
            through.append(gateway_first_token(endpoint, key, model))
        stopped(conn, container, time.monotonic() + 120)
        cpu = idle_cpu({GUARD: conn, GATEWAY: session.conns[inv.head.name]}, args.idle_s) if args.idle_s else {}
    return {"up_s": up_s, "through": through, "cpu": cpu, "node": node_name, "container": container}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inventory", "-i", default="lab")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stack", help="a stack file (default: the lab's chat + on-demand coder)")
    ap.add_argument("--member", default="coder", help="the on-demand member to start")
    ap.add_argument("--before", metavar="DIR", help="an earlier tree's checkout, measured first (its up --stack)")
    ap.add_argument("--idle-s", type=float, default=30.0, help="the idle CPU's window (0: not measured)")
    args = ap.parse_args()
    inv = load_inventory(args.inventory)
    path = Path(args.stack) if args.stack else Path(tempfile.mkdtemp(prefix="ondemand-bench-")) / "stack.yaml"
    if not args.stack:
        path.write_text(STACK)
    key = load_secrets(inv.local_path(inv.cluster.secrets_file)).get("LITELLM_MASTER_KEY") or ""
    sd("down", "-i", args.inventory)
    trees = {**({f"before ({args.before})": args.before} if args.before else {}), "this tree": None}
    runs = {label: through_gateway(args, path, tree, inv, key) for label, tree in trees.items()}
    mine = runs["this tree"]
    node_name, container = mine["node"], mine["container"]
    node = next(n for n in inv.nodes if n.name == node_name)
    port, model = load_stack_members(path, args.inventory)[args.member]
    base = f"http://{node.url_host}:{port}"
    rows: dict[str, list[float]] = {"container start": [], "engine load + health": [], "first token": [], "stop": []}
    with Session.open(inv) as session:
        conn = session.conns[node_name]
        for _ in range(args.rounds):
            t0 = time.monotonic()
            conn.run(["docker", "start", container], timeout=120)
            t1 = time.monotonic()
            t2 = healthy(f"{base}/health", t1 + 600)
            t3 = first_token(base, model)
            conn.run(["docker", "stop", container], timeout=120)
            t4 = time.monotonic()
            for name, seconds in zip(rows, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                rows[name].append(seconds)
    sd("down", "-i", args.inventory)
    print(f"lab: {args.inventory}; engine SIMULATED (vllm-sim: its load time is modelled, not a GB10's)")
    first = next(iter(runs))
    print(
        f"up --stack preparing {args.member} (and starting the always-on members), {first}: {runs[first]['up_s']:.1f} s"
    )
    print(f"{'part':24} {'median s':>9}  rounds")
    for name, values in rows.items():
        print(f"{name:24} {statistics.median(values):9.2f}  {', '.join(f'{v:.2f}' for v in values)}")
    total = [sum(v) for v in zip(*(rows[k] for k in list(rows)[:3]), strict=True)]
    print(
        f"{'start to first token':24} {statistics.median(total):9.2f}  (direct to the engine, not through the gateway)"
    )
    for label, run in runs.items():
        cpu = ", ".join(f"{name} {pct:.2f} %" for name, pct in run["cpu"].items())
        print(
            f"cold start to first token through the gateway, {label}: median {statistics.median(run['through']):.2f} s "
            f"({', '.join(f'{v:.2f}' for v in run['through'])}); idle CPU over {args.idle_s:g} s: "
            f"{cpu or 'not measured'}"
        )
    if args.before:
        ratio = statistics.median(mine["through"]) / statistics.median(runs[first]["through"])
        print(f"ratio this tree / before: {ratio:.2f}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


def load_stack_members(path: Path, inventory: str) -> dict[str, tuple[int, str]]:
    """member -> (its engine port, its model), as `up --stack` resolves them."""
    s = load_stack(str(path), inventory)
    return {m.name: (m.port, m.model) for m in s.members}


if __name__ == "__main__":
    raise SystemExit(main())
