#!/usr/bin/env python3
"""What counting a warm on-demand request in flight adds to it (issue 40 item 4), on this machine, no lab: the
gateway hook's two ways, on one asyncio loop over a real sqlite file (WAL, as gateway_spend opens it):
- before (a159364): `await asyncio.to_thread(demand_add, model, in_flight=1)` before the request and the same
  with -1 after it: two writes the request waits for;
- now: `InFlight.begin(model)` / `.end(model)`: noted in memory, written by the worker's writer thread, merged.
Per request, the time the request spends in the counting (its own latency added), at c1 and with 64 requests
in flight (each "request" holds for --hold-ms, as an engine's answer would); medians over --rounds rounds, the
two ways alternating; and the writes each way made. The load average is printed: a busy machine slows both.

    python benchmarks/ondemand_in_flight.py [--requests 400] [--rounds 5] [--hold-ms 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkdeploy.nodeside.gateway import gateway_spend


async def request_before(path: str, hold: float) -> float:
    t0 = time.perf_counter()
    await asyncio.to_thread(gateway_spend.demand_add, "m", in_flight=1, path=path)
    t1 = time.perf_counter()
    await asyncio.sleep(hold)
    t2 = time.perf_counter()
    await asyncio.to_thread(gateway_spend.demand_add, "m", in_flight=-1, path=path)
    return (t1 - t0) + (time.perf_counter() - t2)


async def request_now(counts: gateway_spend.InFlight, hold: float) -> float:
    t0 = time.perf_counter()
    counts.begin("m")
    t1 = time.perf_counter()
    await asyncio.sleep(hold)
    t2 = time.perf_counter()
    counts.end("m")
    return (t1 - t0) + (time.perf_counter() - t2)


async def run(way: str, path: str, n: int, concurrency: int, hold: float, writes: list[int]) -> float:
    """The median seconds a request spends counting itself, n requests, `concurrency` in flight."""
    spent: list[float] = []
    calls = 0

    def counted(model: str, in_flight: int, path: str) -> None:
        nonlocal calls
        calls += 1
        gateway_spend.demand_add(model, in_flight=in_flight, path=path)

    counts = gateway_spend.InFlight(path, counted)
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            one = request_before(path, hold) if way == "before" else request_now(counts, hold)
            spent.append(await one)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if way == "now":
        deadline = time.monotonic() + 10
        while gateway_spend.demand(path).get("m", {}).get("in_flight") and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the writer thread catches up
        writes.append(calls)
    else:
        writes.append(2 * n)
    return statistics.median(spent)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hold-ms", type=float, default=5.0)
    args = ap.parse_args()
    path = str(Path(tempfile.mkdtemp(prefix="in-flight-")) / "spend.sqlite")
    gateway_spend.demand_add("m", path=path)  # the file and its tables
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load}; {args.requests} requests x {args.rounds} rounds per case")
    print("| in flight | before: 2 awaited writes | now: noted, written by a thread | ratio | writes before / now |")
    print("|---|---|---|---|---|")
    for concurrency in (1, 64):
        got: dict[str, list[float]] = {"before": [], "now": []}
        writes: dict[str, list[int]] = {"before": [], "now": []}
        for _ in range(args.rounds):
            for way in ("before", "now"):
                seconds = asyncio.run(run(way, path, args.requests, concurrency, args.hold_ms / 1000, writes[way]))
                got[way].append(seconds)
        before, now = statistics.median(got["before"]) * 1e6, statistics.median(got["now"]) * 1e6
        print(
            f"| c{concurrency} | {before:.0f} µs | {now:.1f} µs | {now / before:.4f} | "
            f"{statistics.median(writes['before']):.0f} / {statistics.median(writes['now']):.0f} |"
        )
    print(f"load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
