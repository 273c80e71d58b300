#!/usr/bin/env python3
"""The gateway hook's warm overhead, today's against the hook before on-demand members (issue 40 item 4), as a
PAIRED, interleaved A/B in one run: same engines, same machine load, same client.

A: the stack's gateway as `up --stack` runs it (port 4000, today's gateway_hook.py and gateway_spend.py).
B: a second gateway container on the head node (port --b-port, default 4100): the same image, config, master key
and workers, with the hook and spend files of --base (default: the commit before issue 40's first merge), and
its own routes.json in which the on-demand member's engine is an ordinary route (that hook knows no on-demand).

Two models, each asked --rounds times, and in each round: c1, --c1 requests per path, alternating direct
(the engine's own port), A and B request by request; then c64 (64 in flight, --c64 requests per path), the
three paths taking turns, --segment requests each, their order rotated every round. Per round: the p50 each
gateway adds over direct, and its c64 requests/s over direct's; printed as medians over the rounds, with the
load average, and whether today's hook meets the gateway's goals (<= 5 ms added at p50, <= 5 % lost at c64)
and what it adds over the old one.
- always-on: chat (glm-4.7-flash), routed by both hooks as before;
- on-demand, warm: coder (qwen3-coder-30b), `on_demand: true` for A (warmed by a first request, the hook's
  on-demand path: the in-flight count around every request), an always-on route for B.

    python benchmarks/gateway_hook_ab.py [-i lab] [--rounds 3] [--c1 30] [--c64 384] [--segment 128] [--running]
        [--keep] [--base COMMIT] [--same-routes]

--same-routes gives B A's routes.json unchanged, for a --base whose hook knows on-demand members (an A/B of a change
to the on-demand path itself).

The engines are vllm-sim: SIMULATED (no GPU math, modelled timings); the gateways are the real LiteLLM proxy.
Needs the lab (`sparkdeploy lab up`). Leaves the stack up (`sparkdeploy down -i lab` removes it) and removes
gateway B and its state dir (unless --keep).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.config.secrets import load_secrets
from sparkdeploy.runtime.session import Session
from sparkdeploy.topologies.running_stack import GATEWAY, state_dir_of

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()"]
BASE = "5f2cf51"  # main before the merge of f40 (0e4f7e2^1): the hook before on-demand members
STACK = """deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.45}
  - {name: coder, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark2], memory: 0.45, port: 8001,
     on_demand: true, idle_timeout: 2h}
"""
MODELS = {"always-on": ("glm-4.7-flash", 8000, "spark1"), "on-demand warm": ("qwen3-coder-30b", 8001, "spark2")}
CONTAINER, B_CONTAINER = "sparkdeploy-gateway-litellm", "sparkdeploy-gateway-litellm-ab"
GOAL_P50_MS, GOAL_LOST = 5.0, 0.05
HOOK_FILES = ("sparkdeploy/nodeside/gateway/gateway_hook.py", "sparkdeploy/nodeside/gateway/gateway_spend.py")


def sd(*args: str) -> None:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"sparkdeploy {' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


async def one(client: aiohttp.ClientSession, url: str, headers: dict, model: str, max_tokens: int) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    for attempt in range(2):
        t0 = time.perf_counter()
        try:
            async with client.post(f"{url}/chat/completions", json=body, headers=headers) as r:
                data = await r.json(content_type=None)
                seconds = time.perf_counter() - t0
                if r.status != 200 or not data.get("usage", {}).get("completion_tokens"):
                    raise SystemExit(f"{url} ({model}): HTTP {r.status}: {str(data)[:300]}")
                return seconds
        except aiohttp.ServerDisconnectedError:  # a kept-alive connection the server closed while idle (5 s)
            if attempt:
                raise
    raise AssertionError("unreachable")


async def c1(paths: dict[str, tuple[str, dict]], model: str, n: int, max_tokens: int) -> dict[str, float]:
    """p50 seconds of each path, n requests each, alternating request by request."""
    out: dict[str, list[float]] = {name: [] for name in paths}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as client:
        for url, headers in paths.values():  # warm: connections, the router's first request
            for _ in range(3):
                await one(client, url, headers, model, max_tokens)
        for _ in range(n):
            for name, (url, headers) in paths.items():
                out[name].append(await one(client, url, headers, model, max_tokens))
    return {name: statistics.median(v) for name, v in out.items()}


async def c64(
    paths: dict[str, tuple[str, dict]], model: str, total: int, seg: int, max_tokens: int
) -> dict[str, float]:
    """Requests per second of each path with 64 in flight: `total` requests each, in segments of `seg` taken in
    turn (path by path, segment by segment), so that a change of the machine's load falls on every path alike."""
    clients = {
        n: aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600), connector=aiohttp.TCPConnector(limit=80))
        for n in paths
    }
    spent, done = dict.fromkeys(paths, 0.0), dict.fromkeys(paths, 0)
    try:
        for n, (url, headers) in paths.items():  # warm: 64 connections each
            await asyncio.gather(*(one(clients[n], url, headers, model, max_tokens) for _ in range(64)))
        while min(done.values()) < total:
            for n, (url, headers) in paths.items():
                left = seg

                async def worker(
                    client: aiohttp.ClientSession = clients[n], url: str = url, headers: dict = headers
                ) -> None:
                    nonlocal left
                    while left > 0:
                        left -= 1
                        await one(client, url, headers, model, max_tokens)

                t0 = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(64)))
                spent[n] += time.perf_counter() - t0
                done[n] += seg
    finally:
        for client in clients.values():
            await client.close()
    return {n: done[n] / spent[n] for n in paths}


def healthy(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url}: not healthy within {seconds:g} s")


def start_b(conn, state: str, base: str, port: int, same_routes: bool) -> None:
    """Gateway B beside A: a copy of A's state dir with the base's hook files, its own port, container name, spend
    file and routes.json (every engine an ordinary route), no sparkdeploy labels (nothing of sparkdeploy's adopts
    or removes it)."""
    b = f"{state}-ab"
    routes = json.loads(conn.run(["cat", f"{state}/routes.json"], timeout=60).stdout)
    if not same_routes:
        for od in (routes.pop("on_demand", None) or {}).values():
            routes.setdefault("model_list", []).extend(od.get("model_list") or [])
        routes.pop("unavailable", None)
    script = (
        f"docker rm -f {B_CONTAINER} >/dev/null 2>&1 || true; rm -rf {shlex.quote(b)} && "
        f"cp -a {shlex.quote(state)} {shlex.quote(b)} && rm -rf {shlex.quote(b)}/spend && cd {shlex.quote(b)} && "
        f"sed -i 's/--port [^ ]*/--port {port}/' litellm.entry.sh && "
        f"sed -i -e '/--label /d' -e 's/--name {CONTAINER}/--name {B_CONTAINER}/' litellm.run.sh"
    )
    conn.run(["bash", "-c", script], timeout=120)
    for rel in HOOK_FILES:
        text = subprocess.run(["git", "show", f"{base}:{rel}"], cwd=ROOT, capture_output=True, text=True, check=True)
        conn.put(text.stdout, f"{b}/{Path(rel).name}")
    conn.put(json.dumps(routes, sort_keys=True), f"{b}/routes.json")
    conn.run(["bash", "-c", f"cd {shlex.quote(b)} && ./litellm.run.sh >/dev/null"], timeout=120)


def rounds(paths: dict[str, tuple[str, dict]], model: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """Per round: A's and B's p50 added (ms) and c64 ratio to direct."""
    got: dict[str, list[float]] = {"A p50+": [], "B p50+": [], "A c64": [], "B c64": []}
    names = list(paths)
    for i in range(args.rounds):
        order = names[i % 3 :] + names[: i % 3]  # rotated: no path always first
        p50 = asyncio.run(c1({n: paths[n] for n in order}, model, args.c1, args.max_tokens))
        rps = asyncio.run(c64({n: paths[n] for n in order}, model, args.c64, args.segment, args.max_tokens))
        for g in ("A", "B"):
            got[f"{g} p50+"].append((p50[g] - p50["direct"]) * 1000)
            got[f"{g} c64"].append(rps[g] / rps["direct"])
        print(
            f"  round {i + 1}: added p50 A {got['A p50+'][-1]:+.1f} ms, B {got['B p50+'][-1]:+.1f} ms; c64 ratio "
            f"A {got['A c64'][-1]:.3f}, B {got['B c64'][-1]:.3f} (direct {rps['direct']:.1f} req/s); load {load()}",
            flush=True,
        )
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inventory", "-i", default="lab")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--c1", type=int, default=30, help="c1 requests per path per round")
    ap.add_argument("--c64", type=int, default=384, help="c64 requests per path per round")
    ap.add_argument("--segment", type=int, default=128, help="c64: requests per path before the next path's turn")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--base", default=BASE, help="the commit whose hook is B (default: before on-demand)")
    ap.add_argument("--b-port", type=int, default=4100)
    ap.add_argument("--running", action="store_true", help="the stack runs already (this script's STACK)")
    ap.add_argument("--keep", action="store_true", help="leave gateway B running")
    ap.add_argument("--same-routes", action="store_true", help="B gets A's routes.json as it is")
    args = ap.parse_args()

    inv = load_inventory(args.inventory)
    key = load_secrets(inv.local_path(inv.cluster.secrets_file)).get("LITELLM_MASTER_KEY")
    if not args.running:
        stack = Path(tempfile.mkdtemp(prefix="hook-ab-")) / "stack.yaml"
        stack.write_text(STACK)
        sd("up", "--stack", str(stack), "-i", args.inventory, "--timeout", "300")
    head = inv.head
    auth = {"Authorization": f"Bearer {key}"}
    a_url, b_url = f"http://{head.url_host}:4000/v1", f"http://{head.url_host}:{args.b_port}/v1"
    with Session.open(inv) as session:
        conn = session.conn(head)
        start_b(conn, state_dir_of(inv, GATEWAY), args.base, args.b_port, args.same_routes)
        try:
            healthy(f"http://{head.url_host}:{args.b_port}/health/liveliness", 300)
            # the on-demand member warm: a first request through A starts it (held until its watcher says ok)
            asyncio.run(c1({"A": (a_url, auth)}, MODELS["on-demand warm"][0], 1, args.max_tokens))
            print(
                f"SIMULATED engines (vllm-sim); gateways: real LiteLLM; A = this tree's hook, "
                f"B = the hook of {args.base}; "
                f"{args.rounds} rounds x (c1 {args.c1} per path, c64 {args.c64} per path), {args.max_tokens} tokens; "
                f"{os.cpu_count()} CPUs here; load average at the start {load()}",
                flush=True,
            )
            results = {}
            for label, (model, port, node) in MODELS.items():
                url = f"http://{inv.node(node).url_host}:{port}/v1"
                print(f"{label} ({model}):", flush=True)
                paths = {"direct": (url, {}), "A": (a_url, auth), "B": (b_url, auth)}
                results[label] = rounds(paths, model, args)
        finally:
            if not args.keep:  # gateway B and its state dir (else `down` finds a dir it did not write)
                conn.run(["docker", "rm", "-f", B_CONTAINER], timeout=120, check=False)
                conn.run(["rm", "-rf", f"{state_dir_of(inv, GATEWAY)}-ab"], timeout=120, check=False)
    print(f"load average at the end {load()}")
    print("| model | A added p50 | B added p50 | A - B | A c64 ratio | B c64 ratio | A / B | goals (A) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, got in results.items():
        m = {k: statistics.median(v) for k, v in got.items()}
        diff = statistics.median(a - b for a, b in zip(got["A p50+"], got["B p50+"], strict=True))
        ratio = statistics.median(a / b for a, b in zip(got["A c64"], got["B c64"], strict=True))
        ok50, ok64 = m["A p50+"] <= GOAL_P50_MS, 1 - m["A c64"] <= GOAL_LOST
        goals = f"p50 {'met' if ok50 else 'MISSED'}, c64 {'met' if ok64 else 'MISSED'}"
        print(
            f"| {label} | {m['A p50+']:+.1f} ms | {m['B p50+']:+.1f} ms | {diff:+.1f} ms | {m['A c64']:.3f} | "
            f"{m['B c64']:.3f} | {ratio:.3f} | {goals} |"
        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
