#!/usr/bin/env python3
"""Four Sparks against two, in one run: `doctor` and an idempotent `up` on the four-node lab vs the two-node lab
(goal: four nodes <= 1.5x two), and the SIMULATED topology comparison on four nodes.

    # needs `lab up` and `lab up --nodes 4 --name lab4`:
    python benchmarks/four_nodes.py times   [--runs 5] [--topology 2xsolo]
    python benchmarks/four_nodes.py predict [--out DIR]                      # no lab: vllm-sim's GB10 model

times: for each lab, the deployment is brought up once (not timed), then the two labs alternate: a full
`doctor --json` (no --nccl) and an idempotent `up --json` (0 changed, or the script fails), each the real CLI
in a fresh process. Prints the medians and the ratios.

predict: cluster TP=4, replicas of TP=2 (two engines) and one engine per node (4xsolo) at c1..c64, with
vllm-sim's virtual-time predictor (the model calibrated on the seeds' two Sparks; TP=4 adds the ring
all-reduce cost derived in docs/multinode.md). Everything it prints is SIMULATED. With --out it writes the
points as bench results, so `sparkdeploy advise --results DIR --concurrency N` says which wins where.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from idempotent_up import sd_timed  # noqa: E402 - the CLI timed, waiting out another run's lock

GOAL_RATIO = 1.5
RECIPE = "openai-gpt-oss-120b"
LEVELS = [1, 2, 4, 8, 16, 32, 64]


def times(opts) -> int:
    from sparkdeploy.lab.spec import LabSpec

    labs = {"two nodes": str(LabSpec().inventory_path), "four nodes": opts.four}
    for name, inv in labs.items():
        if not Path(inv).is_file():
            raise SystemExit(f"{name}: no lab inventory at {inv} (sparkdeploy lab up [--nodes 4 --name lab4])")
    up_args = ["--recipe", RECIPE, "-t", opts.topology, "--timeout", "300", "--json"]
    for name, inv in labs.items():
        r, _ = sd_timed("up", "-i", inv, *up_args)
        if r.returncode != 0:
            raise SystemExit(f"{name}: up failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        sd_timed("doctor", "-i", inv, "--recipe", RECIPE, "-t", opts.topology, "--json")  # warm-up
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(opts.runs):
        for name, inv in labs.items():
            r, s = sd_timed("doctor", "-i", inv, "--recipe", RECIPE, "-t", opts.topology, "--json")
            if not r.stdout.strip().startswith("{"):
                raise SystemExit(f"{name}: doctor printed no JSON:\n{r.stderr[-2000:]}")
            samples.setdefault(("doctor", name), []).append(s)
            r, s = sd_timed("up", "-i", inv, *up_args)
            if r.returncode != 0 or json.loads(r.stdout)["changed"] != 0:
                raise SystemExit(f"{name}: the idempotent up changed something or failed:\n{r.stdout[-2000:]}")
            samples.setdefault(("up", name), []).append(s)
    print(f"four vs two lab nodes ({opts.topology}, {RECIPE} on vllm-sim), {opts.runs} alternating runs each:")
    worst = 0.0
    for what in ("doctor", "up"):
        two, four = (statistics.median(samples[(what, n)]) for n in labs)
        ratio = four / two
        worst = max(worst, ratio)
        label = "doctor (no --nccl)" if what == "doctor" else "idempotent up"
        print(
            f"  {label:<20} two {two:.2f} s, four {four:.2f} s (medians): {ratio:.2f}x (goal <= {GOAL_RATIO}x) "
            f"{'OK' if ratio <= GOAL_RATIO else 'MISSED'}"
        )
    if opts.down:
        for inv in labs.values():
            sd_timed("down", "-i", inv)
    return 0 if worst <= GOAL_RATIO else 1


def predict(opts) -> int:
    sys.path[:0] = [str(REPO / "images" / "vllm-sim"), str(REPO / "images" / "launcher")]
    import yaml

    from vllm_sim.catalog import DATA_DIR
    from vllm_sim.config import from_namespace
    from vllm_sim.flags import parse_serve_args
    from vllm_sim.predict import DIRECT_SPACING_S, PROXY_SPACING_S, with_tp
    from vllm_sim.predict import predict as run

    t = yaml.safe_load((DATA_DIR / "calibration-targets.yaml").read_text())
    cfg = from_namespace(parse_serve_args([t["model"], *t["serve_args"]]), env={})
    direct, proxied = DIRECT_SPACING_S, PROXY_SPACING_S  # as the calibration: straight to vLLM / behind LiteLLM
    layouts = {  # variant: (points, engines, nodes per engine)
        "cluster": (run(with_tp(cfg, 4), LEVELS, spacing_s=direct), 1, 4),
        "replicas": (run(with_tp(cfg, 2), LEVELS, engines=2, runs=opts.runs, spacing_s=proxied), 2, 2),
        "2xsolo-shuffle": (run(cfg, LEVELS, engines=4, runs=opts.runs, spacing_s=proxied), 4, 1),
    }
    names = {"cluster": "cluster TP=4", "replicas": "replicas 2xTP=2", "2xsolo-shuffle": "4xsolo"}
    print(f"SIMULATED: vllm-sim's GB10 model, {t['model']}, pp{t.get('pp', 1024)}/tg{t.get('tg', 128)}, four nodes")
    for metric, unit, best in (("decode_tps", "t/s", max), ("prefill_tps", "t/s", max), ("ttft_ms", "ms", min)):
        print(f"\n{metric} ({unit})")
        print(f"  {'c':>3} " + "".join(f"{names[v]:>17}" for v in layouts) + "   winner")
        for i, c in enumerate(LEVELS):
            vals = {v: getattr(pts[0][i], metric) for v, pts in layouts.items()}
            win = best(vals, key=vals.get)
            print(f"  {c:>3} " + "".join(f"{vals[v]:>17.1f}" for v in layouts) + f"   {names[win]}")
    if opts.out:
        from sparkdeploy.bench.store import BenchResult, Stat, save_result

        out = Path(opts.out)
        out.mkdir(parents=True, exist_ok=True)
        nodes = [{"name": f"spark{i}", "role": "head" if i == 1 else "worker"} for i in range(1, 5)]
        for variant, (pts, engines, _per) in layouts.items():
            for p in pts:
                metrics = {
                    "decode_tps": Stat(p.decode_tps),
                    "prefill_tps": Stat(p.prefill_tps),
                    "ttft_ms": Stat(p.ttft_ms),
                }
                md = {
                    "simulated": True,
                    "source": "benchmarks/four_nodes.py predict (SIMULATED)",
                    "topology": variant.split("-")[0],
                    "nodes": nodes,
                    "backends": [f"engine{i}" for i in range(engines)] if engines > 1 else [],
                }
                save_result(
                    BenchResult(RECIPE, variant, t.get("pp", 1024), t.get("tg", 128), p.concurrency, metrics, md), out
                )
        print(
            f"\nwrote {len(LEVELS) * len(layouts)} SIMULATED results to {out}: "
            f"sparkdeploy advise --results {out} --recipe {RECIPE} --concurrency N"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("times", help="doctor and idempotent up: four lab nodes vs two")
    a.add_argument("--four", default=None, help="the four-node lab's inventory (default: lab4's)")
    a.add_argument("--topology", default="2xsolo", choices=["cluster", "2xsolo", "replicas"])
    a.add_argument("--runs", type=int, default=5)
    a.add_argument("--down", action="store_true", help="take both deployments down at the end")
    b = sub.add_parser("predict", help="SIMULATED: cluster TP=4 vs replicas of TP=2 vs 4xsolo")
    b.add_argument("--runs", type=int, default=30, help="random proxy draws per level (LiteLLM simple-shuffle)")
    b.add_argument("--out", default=None, help="write the points as bench results here (for `advise`)")
    opts = ap.parse_args()
    if opts.mode == "times":
        if opts.four is None:
            from sparkdeploy.lab.spec import LabSpec

            opts.four = str(LabSpec(name="lab4").inventory_path)
        return times(opts)
    return predict(opts)


if __name__ == "__main__":
    raise SystemExit(main())
