"""Predict llama-benchy's figures for a topology by running the engine in virtual time.

Why: a real calibration run (benchmarks/calibrate_sim.py) takes tens of minutes of wall time; fitting
the timing parameters needs thousands of evaluations. This module replays llama-benchy's method
(pp/tg per request, c concurrent requests started together, one warm-up, metrics as in its
results.py) against SimEngine instances on a virtual clock, in milliseconds of CPU. The real
calibration then checks the fitted parameters through the real HTTP stack, proxy and client.

Arrival model: the c requests of a run reach the engine `spacing_s` apart (the HTTP stack handles
them one after another); an idle engine waits `batch_window_s` before its first step, as the adapter
does. 2xsolo assigns each request to one of two engines at random (LiteLLM simple-shuffle) and
averages over `runs` draws, as the seeds' 50 runs per level did.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from sparklaunch.protocol import GenRequest

from .catalog import Catalog
from .config import ServeConfig
from .engine import SimEngine

# The request spacing the calibration fitted with (benchmarks/calibrate_sim.py): straight to an engine, and
# behind the LiteLLM proxy (which hands requests on one after another).
DIRECT_SPACING_S = 0.001
PROXY_SPACING_S = 0.004


@dataclass(frozen=True)
class Point:
    concurrency: int
    decode_tps: float  # llama-benchy tg t/s (total over the run window)
    prefill_tps: float  # llama-benchy pp t/s (total)
    ttft_ms: float  # llama-benchy e2e_ttft mean


@dataclass
class _Req:
    engine: int
    arrival: float
    start: float = 0.0
    first: float | None = None
    last: float | None = None
    tokens: int = 0


def _run_once(
    make_engine: Callable[[], SimEngine],
    engines: int,
    concurrency: int,
    pp: int,
    tg: int,
    spacing_s: float,
    window_s: float,
    latency_s: float,
    rng: random.Random,
) -> Point:
    pool = [make_engine() for _ in range(engines)]
    reqs = [
        _Req(engine=rng.randrange(engines) if engines > 1 else 0, arrival=latency_s + i * spacing_s)
        for i in range(concurrency)
    ]
    for e_idx, engine in enumerate(pool):
        mine = [(i, r) for i, r in enumerate(reqs) if r.engine == e_idx]
        if not mine:
            continue
        clock = mine[0][1].arrival + window_s
        pending = list(mine)
        while pending or engine.has_unfinished():
            if not engine.has_unfinished() and pending and pending[0][1].arrival > clock:
                clock = pending[0][1].arrival + window_s
            while pending and pending[0][1].arrival <= clock:
                i, r = pending.pop(0)
                engine.add_request(GenRequest(str(i), [0] * pp, tg))
            deltas, seconds = engine.step()
            clock += seconds
            for d in deltas:
                r = reqs[int(d.request_id)]
                r.tokens += len(d.token_ids)
                if r.first is None:
                    r.first = clock
                r.last = clock
    # llama-benchy's batch metrics (results.py): windows over all requests of the run
    first = [r.first for r in reqs]
    last = [r.last for r in reqs]
    if concurrency == 1:
        r = reqs[0]
        prefill = pp / max(1e-9, r.first - r.start - latency_s)
        decode = (r.tokens - 1) / max(1e-9, r.last - r.first)
    else:
        prefill = concurrency * pp / (max(first) - min(r.start for r in reqs))
        decode = sum(r.tokens - 1 for r in reqs) / (max(last) - min(first))
    ttft = statistics.mean(r.first - r.start for r in reqs) * 1000
    return Point(concurrency, decode, prefill, ttft)


def predict(
    cfg: ServeConfig,
    concurrencies: list[int],
    *,
    engines: int = 1,
    pp: int = 1024,
    tg: int = 128,
    runs: int = 1,
    spacing_s: float = 0.001,
    latency_s: float = 0.002,
    seed: int = 0,
    catalog: Catalog | None = None,
) -> list[Point]:
    """Mean llama-benchy figures per concurrency for `engines` identical engines built from `cfg`."""
    rng = random.Random(seed)
    template = SimEngine(cfg, catalog)
    window = template.hw.fitted.get("batch_window_ms", 0.0) / 1000.0

    def make() -> SimEngine:
        return SimEngine(cfg, template.catalog, template.tokenizer)

    out = []
    for c in concurrencies:
        n = runs if engines > 1 else 1  # one engine is deterministic: one run is the mean
        pts = [_run_once(make, engines, c, pp, tg, spacing_s, window, latency_s, rng) for _ in range(n)]
        out.append(
            Point(
                c,
                statistics.mean(p.decode_tps for p in pts),
                statistics.mean(p.prefill_tps for p in pts),
                statistics.mean(p.ttft_ms for p in pts),
            )
        )
    return out


def with_tp(cfg: ServeConfig, tp: int) -> ServeConfig:
    return replace(cfg, tp=tp, nnodes=tp if tp > 1 else 1)
