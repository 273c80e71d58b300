#!/usr/bin/env python3
"""The memory budget's estimate against what the engine reserved, per node, in the lab (issue #29 item 5).

SIMULATED: the lab's engine is vllm-sim. It holds no weights and allocates no KV cache; it runs vLLM's start-up
arithmetic with its own numbers (vllm_sim/engine.py plan_engine: the hardware profile's memory, weights from
the model's parameter counts and quantization, a peak from max_num_batched_tokens, KV bytes per token from
its models.yaml profile) and reports it as vLLM does: the log lines "Available KV cache memory: X GiB" and
"GPU KV cache size: N tokens", and /metrics `vllm:cache_config_info` (num_gpu_blocks, block_size) plus the
sim-only `vllm_sim:memory_plan_bytes`. For each engine node of a deployment this prints:

- the budget's estimate (sparkdeploy/recipes/budget.py, through `recipes fit -i`, from the node's live facts):
  weights share, peak, util x total, KV room (= util x total - weights - peak), KV per token, tokens;
- what the engine reports it reserved: util x total, weights, peak, available KV memory, GPU KV cache tokens
  (from its start-up log; KV memory = blocks x block size x bytes per token);
- the engine container's real memory (`docker stats --no-stream` on the node);
- the ratios budget / engine for util x total, weights, KV memory and KV tokens.

What it proves: the budget's arithmetic (util x total, what is left for the KV cache after weights and
peak, tokens of KV) agrees or not with an independent implementation of vLLM's start-up arithmetic, on the
lab's real deployments (solo and cluster, the per-node share the topology gives each node). What it does not
prove: anything about a GB10. The sim's weights, peak and KV bytes per token are its own model's, not a
measurement, and the container's memory is the simulator's Python process, not a reservation. On a Spark,
vLLM's own log lines give the real figures (docs/memory-budget.md).

    python benchmarks/fit_vs_reserved.py [--recipe openai-gpt-oss-120b] [--topologies solo,cluster] [--down]
Needs the lab up (`sparkdeploy lab up`; SPARKDEPLOY_LAB_INSTANCE etc. as for the lab tests).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.recipes import budget
from sparkdeploy.runtime.session import Session
from sparkdeploy.topologies.base import SERVING_CONTAINER
from sparkdeploy.topologies.fit import fit

CLI = [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()"]
GIB = 1 << 30
# the sim's start-up lines (vllm_sim/engine.py); the first is vLLM's own format, the others vLLM's lines
PLAN_RE = re.compile(
    r"max_model_len=(?P<len>\d+).*KV cache (?P<kvgib>[\d.]+) GiB \((?P<blocks>\d+) blocks\), weights (?P<w>[\d.]+) GiB"
)
KV_MEM_RE = re.compile(r"Available KV cache memory: (?P<gib>[\d.]+) GiB")
KV_TOK_RE = re.compile(r"GPU KV cache size: (?P<tok>[\d,]+) tokens")
METRIC_RE = re.compile(r'vllm_sim:memory_plan_bytes\{[^}]*part="(?P<part>\w+)"\} (?P<v>[\d.e+]+)')


def sd(*args: str) -> None:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"sparkdeploy {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def engine_view(session: Session, node: str) -> dict:
    """What the node's engine containers hold (docker stats) and report (start-up log, /metrics)."""
    script = (
        "for c in $(docker ps --format '{{.Names}}' | grep '^sparkdeploy-' | grep -v guard); do "
        "echo \"== $c $(docker stats --no-stream --format '{{.MemUsage}}' $c)\"; "
        "docker logs $c 2>&1 | grep -E 'KV cache|GPU KV' | tail -4; done; "
        f'docker exec {SERVING_CONTAINER} python3 -c "import urllib.request as u; '
        "print(u.urlopen('http://127.0.0.1:8000/metrics', timeout=5).read().decode())\" 2>/dev/null "
        "| grep '^vllm_sim:memory_plan_bytes' || true"
    )
    out = session.conn(node).run(["bash", "-c", script], timeout=60).stdout
    view: dict = {"containers": {}, "metrics": {}}
    for line in out.splitlines():
        if line.startswith("== "):
            _, name, *usage = line.split()
            view["containers"][name] = " ".join(usage).split(" / ")[0]
        elif m := PLAN_RE.search(line):
            view["blocks"], view["weights"] = int(m["blocks"]), float(m["w"]) * GIB
        elif m := KV_MEM_RE.search(line):
            view["kv_bytes"] = float(m["gib"]) * GIB
        elif m := KV_TOK_RE.search(line):
            view["kv_tokens"] = int(m["tok"].replace(",", ""))
        elif m := METRIC_RE.search(line):
            view["metrics"][m["part"]] = float(m["v"])
    return view


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def g(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="openai-gpt-oss-120b")
    ap.add_argument("--topologies", default="solo,cluster")
    ap.add_argument("--inventory", default="lab")
    ap.add_argument("--down", action="store_true", help="remove the deployment at the end")
    args = ap.parse_args()
    print("SIMULATED: vllm-sim holds no weights and allocates no KV cache; see this script's docstring")
    hdr = (
        f"{'topology':8} {'node':8} {'':7} {'util*total':>10} {'weights':>8} {'peak':>6} {'KV GiB':>7} "
        f"{'KV B/tok':>8} {'KV tokens':>10} {'container':>10}"
    )
    try:
        for topology in args.topologies.split(","):
            sd("up", "-i", args.inventory, "-r", args.recipe, "-t", topology, "--timeout", "300")
            report = fit(args.recipe, topology, inventory=args.inventory)
            print(f"\n{args.recipe} {topology}: budget (budget.py, `recipes fit -i`) vs engine (vllm-sim, SIMULATED)")
            print(hdr)
            with Session.open(load_inventory(args.inventory)) as session:
                for b in report.budgets:
                    e = engine_view(session, b.node)
                    m = e["metrics"]
                    room, per = b.kv_room, b.kv_per_token
                    b_tokens = None if room is None or not per else room // per
                    e_per = m.get("kv_per_token")
                    e_reserve = m.get("reserve")
                    e_peak = m.get("peak")
                    e_weights = m.get("weights", e.get("weights"))
                    containers = ", ".join(f"{k.removeprefix('sparkdeploy-')} {v}" for k, v in e["containers"].items())
                    print(
                        f"{topology:8} {b.node:8} {'budget':7} {g(b.reserve):>10} {g(b.weights):>8} {g(b.peak):>6} "
                        f"{g(room):>7} {per or '-':>8} {b_tokens or '-':>10}"
                    )
                    if "kv_tokens" not in e:
                        print(
                            f"{topology:8} {b.node:8} the engine reports no KV cache here "
                            f"({containers or 'no engine container'}): a Ray worker; the engine's start-up "
                            "lines are in the head's log"
                        )
                        continue
                    print(
                        f"{'':8} {'':8} {'engine':7} {g(e_reserve):>10} {g(e_weights):>8} {g(e_peak):>6} "
                        f"{g(e.get('kv_bytes')):>7} {int(e_per) if e_per else '-':>8} {e.get('kv_tokens', '-'):>10} "
                        f"{containers}"
                    )
                    print(
                        f"{'':8} {'':8} {'ratio':7} {ratio(b.reserve, e_reserve):>10} "
                        f"{ratio(b.weights, e_weights):>8} {ratio(b.peak, e_peak):>6} "
                        f"{ratio(room, e.get('kv_bytes')):>7} {ratio(per, e_per):>8} "
                        f"{ratio(b_tokens, e.get('kv_tokens')):>10}"
                    )
                    if b.simulated:
                        print(f"{'':17} budget total {budget.gib(b.total)} from {b.source}")
    finally:
        if args.down:
            sd("down", "-i", args.inventory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
