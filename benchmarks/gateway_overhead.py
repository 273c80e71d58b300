#!/usr/bin/env python3
"""What the stack gateway costs, and what `up --stack` costs to add one deployment (issue 28), in the lab.

Engines are vllm-sim: a SIMULATED engine (no GPU math, modelled timings); the gateway is the real LiteLLM proxy
(the image `up --stack` runs, its auth hook included). Both paths are asked from this machine with the same
async HTTP client (aiohttp, keep-alive), the same request (a chat completion of --max-tokens tokens):
- c1: --requests sequential requests, alternating direct (the engine's own port) and through the gateway:
  p50 and p99 latency of each, and the gateway's added latency (goal: at most 5 ms at p50);
- c64: 64 requests in flight, --c64-requests in all, direct then through the gateway (twice each,
  alternating): requests per second, and the share the gateway loses (goal: at most 5 %);
- `up --stack`: adding a third deployment to a running stack of two, against bringing the three up from
  nothing (after `down`), each as the CLI a user runs.

    python benchmarks/gateway_overhead.py [--inventory lab] [--requests 300] [--c64-requests 1920] [--no-up]
        [--also NAME=URL ...] [--cpu N]

--cpu N also reads the gateway container's CPU time (its cgroup, over SSH on the head node) around N requests at
c8, in 4 rounds: the gateway's CPU per request, median, steadier than wall-clock figures on a busy machine.

--also adds another gateway (e.g. a variant of its config started by hand on another port, same master key) to
the same alternation: an A/B of a gateway change within one run, on the same engine and the same machine load.

Needs the lab (`sparkdeploy lab up`) and its secrets file (the gateway's master key). Leaves the stack of
two deployments up; `sparkdeploy down -i lab` removes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.config.secrets import load_secrets
from sparkdeploy.deploy.stack.file import GATEWAY_WORKERS_MAX
from sparkdeploy.runtime.session import Session

CLI = [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()"]
TWO = """deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.25}
  - {name: coder, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark2], memory: 0.3}
"""
THIRD = "  - {name: big, recipe: openai-gpt-oss-120b, topology: solo, nodes: [spark1], memory: 0.6, port: 8002}\n"
MODEL = "glm-4.7-flash"
GOAL_P50_MS, GOAL_LOST = 5.0, 0.05


def sd_timed(*args: str) -> float:
    t0 = time.monotonic()
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"sparkdeploy {' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return seconds


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one(client: aiohttp.ClientSession, url: str, headers: dict, max_tokens: int) -> float:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    t0 = time.perf_counter()
    async with client.post(f"{url}/chat/completions", json=body, headers=headers) as r:
        data = await r.json(content_type=None)
        seconds = time.perf_counter() - t0
        if r.status != 200 or not data.get("usage", {}).get("completion_tokens"):
            raise SystemExit(f"{url}: HTTP {r.status}: {str(data)[:300]}")
    return seconds


async def c1(paths: dict[str, tuple[str, dict]], n: int, max_tokens: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in paths}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
        for url, headers in paths.values():  # warm: connections, the router's first request
            for _ in range(5):
                await one(client, url, headers, max_tokens)
        for _ in range(n):
            for name, (url, headers) in paths.items():
                out[name].append(await one(client, url, headers, max_tokens))
    return out


# the gateway container's CPU time in µs, from its own cgroup: v2 (a Spark) or v1 (the lab's nested engine)
CPU_USAGE = (
    "docker exec sparkdeploy-gateway-litellm sh -c "
    '\'if [ -f /sys/fs/cgroup/cpu.stat ]; then sed -n "s/^usage_usec //p" /sys/fs/cgroup/cpu.stat; '
    "else echo $(( $(cat /sys/fs/cgroup/cpuacct/cpuacct.usage) / 1000 )); fi'"
)


async def drain(
    client: aiohttp.ClientSession, url: str, headers: dict, total: int, max_tokens: int, concurrency: int
) -> None:
    """`total` requests, `concurrency` of them in flight at any time."""
    left = total

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one(client, url, headers, max_tokens)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def in_flight(url: str, headers: dict, total: int, max_tokens: int, concurrency: int) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as client:
        await drain(client, url, headers, total, max_tokens, concurrency)


def cpu_per_request(inv, url: str, headers: dict, n: int, max_tokens: int) -> list[float]:
    """The gateway's CPU ms per request, 4 rounds of n requests at c8 (the supervisor process and health checks
    included: what the node pays)."""
    out = []
    with Session.open(inv) as session:
        conn = session.conn(inv.head)

        def usage() -> int:
            return int(conn.run(["bash", "-c", CPU_USAGE], timeout=60).stdout.strip())

        asyncio.run(in_flight(url, headers, 40, max_tokens, 8))  # warm
        for _ in range(4):
            before = usage()
            asyncio.run(in_flight(url, headers, n, max_tokens, 8))
            out.append((usage() - before) / n / 1000)
    return out


async def c64(url: str, headers: dict, total: int, max_tokens: int) -> float:
    """Requests per second with 64 in flight."""
    connector = aiohttp.TCPConnector(limit=80)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300), connector=connector) as client:
        await asyncio.gather(*(one(client, url, headers, max_tokens) for _ in range(64)))  # warm
        t0 = time.perf_counter()
        await drain(client, url, headers, total, max_tokens, 64)
        return total / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inventory", "-i", default="lab")
    ap.add_argument("--requests", type=int, default=300, help="c1: requests per path")
    ap.add_argument("--c64-requests", type=int, default=1920, help="c64: requests per run (2 runs per path)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--no-up", action="store_true", help="skip the `up --stack` figure")
    ap.add_argument(
        "--workers", default="auto", help="the gateway's num_workers (stack file gateway:): a number, or auto"
    )
    ap.add_argument("--running", action="store_true", help="measure the stack that runs: no `up` at all")
    ap.add_argument("--cpu", type=int, default=0, metavar="N", help="also the gateway's CPU per request (N at c8)")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=URL", help="another gateway (…/v1) to A/B")
    args = ap.parse_args()

    inv = load_inventory(args.inventory)
    key = load_secrets(inv.local_path(inv.cluster.secrets_file)).get("LITELLM_MASTER_KEY")
    head = inv.head
    work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    two, three = work / "two.yaml", work / "three.yaml"
    workers = int(args.workers) if args.workers.isdigit() else "auto"
    gateway = f"gateway: {{num_workers: {workers}}}\n"
    two.write_text(TWO + gateway)
    three.write_text(TWO + THIRD + gateway)
    up = {}
    if not args.no_up and not args.running:
        sd_timed("down", "-i", args.inventory)
        up["whole"] = sd_timed("up", "--stack", str(three), "-i", args.inventory, "--timeout", "300")
        sd_timed("up", "--stack", str(two), "-i", args.inventory, "--timeout", "300")  # the third goes
        up["add"] = sd_timed("up", "--stack", str(three), "-i", args.inventory, "--timeout", "300")
        up["again"] = sd_timed("up", "--stack", str(three), "-i", args.inventory, "--timeout", "300")
        sd_timed("up", "--stack", str(two), "-i", args.inventory, "--timeout", "300")
    elif not args.running:
        sd_timed("up", "--stack", str(two), "-i", args.inventory, "--timeout", "300")

    paths = {
        "direct": (f"http://{head.url_host}:8000/v1", {}),
        "gateway": (f"http://{head.url_host}:4000/v1", {"Authorization": f"Bearer {key}"}),
    }
    for extra in args.also:
        name, _, url = extra.partition("=")
        paths[name] = (url, {"Authorization": f"Bearer {key}"})
    lat = asyncio.run(c1(paths, args.requests, args.max_tokens))
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(2):
        for name, (url, headers) in paths.items():
            rates[name].append(asyncio.run(c64(url, headers, args.c64_requests, args.max_tokens)))

    cpu = cpu_per_request(inv, *paths["gateway"], args.cpu, args.max_tokens) if args.cpu else []
    p50 = {k: statistics.median(v) * 1000 for k, v in lat.items()}
    p99 = {k: pct(v, 0.99) * 1000 for k, v in lat.items()}
    rps = {k: statistics.mean(v) for k, v in rates.items()}
    added50, added99 = p50["gateway"] - p50["direct"], p99["gateway"] - p99["direct"]
    lost = 1 - rps["gateway"] / rps["direct"]
    print(
        f"SIMULATED engine (vllm-sim, {MODEL}, {args.max_tokens} tokens per request); gateway: real LiteLLM, "
        f"num_workers {args.workers} (auto: the head node's CPUs, at most {GATEWAY_WORKERS_MAX}; "
        f"this machine has {os.cpu_count()})"
    )
    print("| path | c1 p50 | c1 p99 | c64 requests/s (2 runs) |")
    print("|---|---|---|---|")
    for k in paths:
        runs = ", ".join(f"{r:.1f}" for r in rates[k])
        print(f"| {k} | {p50[k]:.1f} ms | {p99[k]:.1f} ms | {rps[k]:.1f} ({runs}) |")
    ok50, ok_lost = added50 <= GOAL_P50_MS, lost <= GOAL_LOST
    print(
        f"gateway added: p50 {added50:+.1f} ms (goal <= {GOAL_P50_MS:g} ms: {'met' if ok50 else 'MISSED'}), "
        f"p99 {added99:+.1f} ms; c64 throughput lost {lost:.1%} (goal <= {GOAL_LOST:.0%}: "
        f"{'met' if ok_lost else 'MISSED'}); ratio gateway/direct requests/s {rps['gateway'] / rps['direct']:.3f}"
    )
    if up:
        print(
            f"up --stack: three deployments from nothing {up['whole']:.1f} s; adding the third to a running stack "
            f"of two {up['add']:.1f} s (ratio {up['add'] / up['whole']:.2f}); a second up, nothing to change, "
            f"{up['again']:.1f} s"
        )
    for name in paths:
        if name not in ("direct", "gateway"):
            print(
                f"{name}: added p50 {p50[name] - p50['direct']:+.1f} ms, p99 {p99[name] - p99['direct']:+.1f} ms; c64 "
                f"lost {1 - rps[name] / rps['direct']:.1%}; against the gateway: p50 {p50[name] - p50['gateway']:+.1f} "
                f"ms, requests/s ratio {rps[name] / rps['gateway']:.3f}"
            )
    if cpu:
        rounds = ", ".join(f"{c:.2f}" for c in cpu)
        median = statistics.median(cpu)
        print(f"gateway CPU per request (c8, {args.cpu} requests x 4): median {median:.2f} ms ({rounds})")
    print(json.dumps({"p50_ms": p50, "p99_ms": p99, "rps": rates, "up_s": up, "cpu_ms": cpu}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
