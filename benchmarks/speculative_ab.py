#!/usr/bin/env python3
"""The speculative-decoding A/B's own overhead beyond the runs it makes (issue 39, item 7).

`bench --prompts FILE --speculative off,ngram:4` spends its time in three places: the deploys (a restart of the
deployment per setting, through `up`: excluded here, the engine's start-up is not the A/B's), the runs (the
owner's prompts streamed at each level) and its own work (reading the prompts, the /metrics scrapes before and
after each level, the thread pool, the report and the recommendation). This measures the last against the
second: two real vllm-sim servers on localhost stand in for the two deployed settings (started before the clock,
so `deploy_s` is ~0), `run_ab` runs the prompts against each at the levels given; own_s = total - deploys - runs.
The goal: the A/B's own time under 2% of its runs. Prints the median of REPEATS and the ratio.

    python3 benchmarks/speculative_ab.py [--levels 1,4] [--prompts 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkdeploy.bench import speculative_ab as ab  # noqa: E402 - after the path above
from sparkdeploy.bench.benchy import Endpoint  # noqa: E402 - after the path above

SIM, LAUNCHER = REPO / "images" / "vllm-sim", REPO / "images" / "launcher"
GOAL = 0.02


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_sim(spec: dict | None, log: Path) -> tuple[subprocess.Popen, Endpoint]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SIM), str(LAUNCHER)]))
    args = [sys.executable, "-m", "vllm_sim", "serve", "openai/gpt-oss-120b", "--port", str(port)]
    args += ["--max-model-len", "8192"] + (["--speculative-config", json.dumps(spec)] if spec else [])
    proc = subprocess.Popen(args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, Endpoint(f"http://127.0.0.1:{port}/v1", "openai/gpt-oss-120b")
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"vllm-sim did not start: {log.read_text()[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,4")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    code = (SIM / "vllm_sim" / "engine.py").read_text()
    prompts = [
        {"messages": [{"role": "user", "content": code[i * 700 : i * 700 + 3000]}], "max_tokens": args.tokens}
        for i in range(args.prompts)
    ]
    settings = ab.parse_settings("off,ngram:4")
    with tempfile.TemporaryDirectory() as tmp:
        sims = {
            "off": start_sim(None, Path(tmp) / "off.log"),
            "ngram:4": start_sim({"method": "ngram", "num_speculative_tokens": 4}, Path(tmp) / "ngram.log"),
        }
        try:
            rows = []
            for _ in range(args.repeats):
                r = ab.run_ab("bench", "solo", settings, levels, prompts, lambda s: sims[s.text][1], 300.0)
                rows.append((r.total_s, r.deploy_s, r.runs_s, r.own_s))
                assert not r.failed and all(not lv.failed for row in r.rows.values() for lv in row.values())
        finally:
            for proc, _ in sims.values():
                proc.terminate()
                proc.wait(10)
    total, deploy, runs, own = (statistics.median(col) for col in zip(*rows, strict=True))
    ratio = own / runs
    print(
        f"A/B off,ngram:4 at c{','.join(map(str, levels))}, {args.prompts} prompts x {args.tokens} tokens, "
        f"median of {args.repeats}:"
    )
    print(f"  total {total:.2f} s = deploys {deploy:.3f} s + runs {runs:.2f} s + own {own:.3f} s")
    print(f"  own / runs = {ratio:.2%} (goal < {GOAL:.0%}): {'met' if ratio < GOAL else 'NOT met'}")
    return 0 if ratio < GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
