#!/usr/bin/env python3
"""Calibrate vllm-sim against the seeds' gpt-oss-120b tables and write docs/calibration.md.

Runs the three topologies of seeds 000-002 on this machine, every process real, only the GPU simulated:
- solo: one sim (`python -m vllm_sim serve ...`);
- cluster-tp2: two sim processes in vLLM's native multi-node mode (`-tp 2 --nnodes 2`, a real gloo group
  on 127.0.0.1, lockstep every step) or under the torchrun launcher (--tp2-backend torchrun);
- 2xsolo-shuffle: two sims behind a real LiteLLM proxy (`hosted_vllm/`, simple-shuffle);
then llama-benchy 0.4.0 (pp1024/tg128, the seeds' method) at each concurrency, and prints/writes the
side-by-side table: seed, measured, error %. Exit status 1 when a point is outside the tolerance (25%).

    python benchmarks/calibrate_sim.py                 # full: c1..c64, 3 runs (5 for 2xsolo), ~20 min
    python benchmarks/calibrate_sim.py --quick         # lower cost: c1,c8,c64, 1 run, no doc written
    python benchmarks/calibrate_sim.py --predict       # no servers: the virtual-time predictor only (s)
    python benchmarks/calibrate_sim.py --fit           # refit the `fitted` parameters with the predictor (~15 min)

The sims stream several tokens per SSE chunk behind the proxy (--stream-interval, default 4) so that the
proxy on a 2-core machine is not the bottleneck at c64; llama-benchy then times tokens by interpolating
between chunks, which is exact for evenly spaced tokens. Needs: llama-benchy==0.4.0, litellm[proxy]
(for 2xsolo), torch (for tp2), scipy (for --fit).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
SIM_DIR, LAUNCHER_DIR = REPO / "images" / "vllm-sim", REPO / "images" / "launcher"
sys.path[:0] = [str(SIM_DIR), str(LAUNCHER_DIR)]

from vllm_sim.catalog import DATA_DIR, default_catalog  # noqa: E402
from vllm_sim.config import from_namespace  # noqa: E402
from vllm_sim.flags import parse_serve_args  # noqa: E402
from vllm_sim.predict import DIRECT_SPACING_S, PROXY_SPACING_S, predict, with_tp  # noqa: E402
from vllm_sim.tokenizer import CORPUS_FILE, TOKENIZER_DIR  # noqa: E402

TARGETS = DATA_DIR / "calibration-targets.yaml"
DOC = REPO / "docs" / "calibration.md"
METRICS = ("decode", "prefill", "ttft")
TOPOLOGIES = ("solo", "cluster-tp2", "2xsolo-shuffle", "solo-proxy")
# solo-proxy: one sim behind the same LiteLLM proxy as 2xsolo; compared with the solo seeds (the seeds sent
# every topology through LiteLLM) and with direct solo, it shows whether the proxy on this machine limits c64.
SEED_COLUMN = {"solo-proxy": "solo"}
FIT_HW = (
    "bw_efficiency",
    "prefill_tflops",
    "tp_compute_efficiency",
    "launch_us_per_layer_eager",
    "per_seq_us",
    "distributed_step_us",
    "batch_window_ms",
)
FIT_MODEL = ("routing_exponent", "routing_knee_tokens")


def load_targets() -> dict:
    return yaml.safe_load(TARGETS.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], logdir: Path):
        self.name = name
        self.log = logdir / f"{name}.log"
        self._fh = open(self.log, "wb")
        self.p = subprocess.Popen(
            argv, env=env, stdout=self._fh, stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=True
        )

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self._fh.close()


def sim_env(time_scale: float) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SIM_DIR), str(LAUNCHER_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["VLLM_SIM_TIME_SCALE"] = str(time_scale)
    return env


def wait_ok(url: str, procs: list[Proc], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.p.poll() is not None:
                raise RuntimeError(f"{p.name} exited ({p.p.returncode}); see {p.log}:\n{p.log.read_text()[-2000:]}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not healthy after {timeout}s")


class Topology:
    """Starts the servers of one topology; `base_url` is what llama-benchy talks to."""

    def __init__(
        self,
        name: str,
        targets: dict,
        logdir: Path,
        time_scale: float,
        tp2_backend: str,
        stream_interval: int,
        proxy_workers: int = 1,
    ):
        self.name, self.t, self.logdir, self.scale = name, targets, logdir, time_scale
        self.tp2_backend, self.stream_interval, self.proxy_workers = tp2_backend, stream_interval, proxy_workers
        self.procs: list[Proc] = []
        self.sim_urls: list[str] = []
        self.base_url = ""

    def _sim_args(self, port: int) -> list[str]:
        return [self.t["model"], "--host", "127.0.0.1", "--port", str(port), *self.t["serve_args"]]

    def start(self) -> Topology:
        env = sim_env(self.scale)
        py = sys.executable
        if self.name in ("solo", "solo-proxy"):
            port = free_port()
            extra = ["--stream-interval", str(self.stream_interval)] if self.name == "solo-proxy" else []
            self.procs.append(
                Proc("sim", [py, "-m", "vllm_sim", "serve", *self._sim_args(port), *extra], env, self.logdir)
            )
            self.sim_urls = [f"http://127.0.0.1:{port}"]
        elif self.name == "cluster-tp2":
            port, master = free_port(), free_port()
            if self.tp2_backend == "native":
                for rank in (0, 1):
                    extra = [
                        "-tp",
                        "2",
                        "--nnodes",
                        "2",
                        "--node-rank",
                        str(rank),
                        "--master-addr",
                        "127.0.0.1",
                        "--master-port",
                        str(master),
                    ] + (["--headless"] if rank else [])
                    self.procs.append(
                        Proc(
                            f"sim-rank{rank}",
                            [py, "-m", "vllm_sim", "serve", *self._sim_args(port), *extra],
                            env,
                            self.logdir,
                        )
                    )
            else:
                launcher = str(LAUNCHER_DIR / "serve_torchrun.py")
                for rank in (0, 1):
                    argv = [
                        py,
                        "-m",
                        "torch.distributed.run",
                        "--nnodes",
                        "2",
                        "--node-rank",
                        str(rank),
                        "--nproc-per-node",
                        "1",
                        "--master-addr",
                        "127.0.0.1",
                        "--master-port",
                        str(master),
                        launcher,
                        *self._sim_args(port),
                        "-tp",
                        "2",
                    ]
                    self.procs.append(Proc(f"torchrun-node{rank}", argv, env, self.logdir))
            self.sim_urls = [f"http://127.0.0.1:{port}"]
        else:
            ports = [free_port(), free_port()]
            for i, port in enumerate(ports):
                self.procs.append(
                    Proc(
                        f"sim{i}",
                        [
                            py,
                            "-m",
                            "vllm_sim",
                            "serve",
                            *self._sim_args(port),
                            "--stream-interval",
                            str(self.stream_interval),
                        ],
                        env,
                        self.logdir,
                    )
                )
            self.sim_urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url in self.sim_urls:
            wait_ok(url + "/health", self.procs)
        self.base_url = self.sim_urls[0]
        if self.name in ("2xsolo-shuffle", "solo-proxy"):
            self.base_url = self._start_proxy()
        return self

    def _start_proxy(self) -> str:
        # The project's own LiteLLM venv (scripts/setup.sh), never whatever `litellm` is on PATH.
        litellm = os.environ.get(
            "SPARKDEPLOY_LITELLM", str(Path(__file__).resolve().parent.parent / ".venv-litellm/bin/litellm")
        )
        if not os.access(litellm, os.X_OK):
            raise RuntimeError(
                f"{litellm} is missing: run scripts/setup.sh (it makes .venv-litellm) and source scripts/venv.sh"
            )
        model = self.t["model"]
        config = {
            "model_list": [
                {
                    "model_name": model,
                    "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": f"{url}/v1", "api_key": "EMPTY"},
                    "model_info": {"id": f"sim{i}"},
                }
                for i, url in enumerate(self.sim_urls)
            ],
            "router_settings": {
                "routing_strategy": "simple-shuffle",
                "num_retries": 2,
                "timeout": 600,
                "allowed_fails": 3,
                "cooldown_time": 30,
            },
        }
        cfg = self.logdir / "litellm.yaml"
        cfg.write_text(yaml.safe_dump(config))
        port = free_port()
        env = dict(os.environ, LITELLM_LOG="ERROR")
        self.procs.append(
            Proc(
                "litellm",
                [
                    litellm,
                    "--config",
                    str(cfg),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--num_workers",
                    str(self.proxy_workers),
                    # as templates/entry-litellm.sh.j2: a busy machine must not
                    # kill workers still importing LiteLLM
                    "--timeout_worker_healthcheck",
                    "60",
                ],
                env,
                self.logdir,
            )
        )
        wait_ok(f"http://127.0.0.1:{port}/health/liveliness", self.procs)
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


# ------------------------------------------------------------------------------------------ llama-benchy


def book_url() -> str:
    """llama-benchy fetches --book-url with requests (no file://) unless its cache has the URL's md5: reuse
    the bench feature's cache seeding so the corpus file is read offline."""
    from sparkdeploy.bench.benchy import corpus_book_url

    return corpus_book_url(CORPUS_FILE)


def run_benchy(base_url: str, model: str, concurrency: list[int], runs: int, pp: int, tg: int, out: Path) -> dict:
    argv = [sys.executable, "-m", "llama_benchy"]  # this interpreter's (the project's venv), never another on PATH
    argv += [
        "--base-url",
        base_url + "/v1",
        "--model",
        model,
        "--tokenizer",
        str(TOKENIZER_DIR),
        "--book-url",
        book_url(),
        "--pp",
        str(pp),
        "--tg",
        str(tg),
        "--runs",
        str(runs),
        "--concurrency",
        *map(str, concurrency),
        "--skip-coherence",
        "--format",
        "json",
        "--save-result",
        str(out),
    ]
    log = out.with_suffix(".log")
    with open(log, "wb") as fh:
        rc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=str(out.parent)).returncode
    if rc != 0 or not out.is_file():
        raise RuntimeError(f"llama-benchy failed ({rc}); see {log}:\n{log.read_text()[-2000:]}")
    data = json.loads(out.read_text())
    return {
        b["concurrency"]: {
            "decode": b["tg_throughput"]["mean"],
            "prefill": b["pp_throughput"]["mean"],
            "ttft": b["e2e_ttft"]["mean"],
        }
        for b in data["benchmarks"]
    }


# ------------------------------------------------------------------------------------------ predictor / fit


def seed_config():
    t = load_targets()
    return t, from_namespace(parse_serve_args([t["model"], *t["serve_args"]]), env={})


def predicted(catalog=None, runs: int = 50) -> dict[str, dict[int, dict[str, float]]]:
    t, cfg = seed_config()
    cs = t["concurrency"]
    pts = {
        "solo": predict(cfg, cs, catalog=catalog, spacing_s=DIRECT_SPACING_S),
        "cluster-tp2": predict(with_tp(cfg, 2), cs, catalog=catalog, spacing_s=DIRECT_SPACING_S),
        "2xsolo-shuffle": predict(cfg, cs, engines=2, runs=runs, catalog=catalog, spacing_s=PROXY_SPACING_S),
    }
    return {
        k: {p.concurrency: {"decode": p.decode_tps, "prefill": p.prefill_tps, "ttft": p.ttft_ms} for p in v}
        for k, v in pts.items()
    }


def catalog_with(values: dict[str, float], model: str):
    base = default_catalog()
    hw = base.hardware["gb10"]
    fitted = dict(hw.fitted)
    fitted.update({k: values[k] for k in FIT_HW})
    models = copy.deepcopy(base.models)
    models[model]["fitted"].update({k: values[k] for k in FIT_MODEL})
    return dataclasses.replace(base, hardware={"gb10": dataclasses.replace(hw, fitted=fitted)}, models=models)


def fit(maxiter: int = 400) -> dict[str, float]:
    """Nelder-Mead on mean squared log error plus half the worst squared log error (keeps outliers in)."""
    import numpy as np
    from scipy.optimize import minimize

    t = load_targets()
    names = FIT_HW + FIT_MODEL
    hw, md = default_catalog().hardware["gb10"].fitted, default_catalog().model(t["model"]).fitted
    x0 = [hw[k] for k in FIT_HW] + [md[k] for k in FIT_MODEL]

    def loss(x):
        if min(x) <= 0:
            return 1e9
        errs = np.array(
            [
                e
                for _, _, _, e in errors(
                    t, predicted(catalog_with(dict(zip(names, x, strict=False)), t["model"]), runs=10)
                )
            ]
        )
        return float(np.mean(errs**2) + 0.5 * np.max(np.abs(errs)) ** 2)

    r = minimize(
        loss, x0, method="Nelder-Mead", options={"maxiter": maxiter, "xatol": 1e-3, "fatol": 1e-5, "adaptive": True}
    )
    return dict(zip(names, (float(v) for v in r.x), strict=False))


def cap_scan(caps=(32, 36, 40, 44, 48, 52, 56, None)) -> list[tuple[int | None, float]]:
    """Worst predicted error for each single-engine admission cap (None: no cap), other values as configured.
    `max_running_seqs` is an integer step function of the load, so it is scanned, not fitted."""
    t = load_targets()
    base = default_catalog()
    out = []
    for cap in caps:
        models = copy.deepcopy(base.models)
        models[t["model"]]["fitted"]["max_running_seqs"] = cap
        out.append((cap, worst_error(t, predicted(dataclasses.replace(base, models=models), runs=20))))
    return out


# ------------------------------------------------------------------------------------------ report


def errors(t: dict, measured: dict) -> list[tuple[str, str, int, float]]:
    """(topology, metric, concurrency, log error) for every point measured."""
    out = []
    for topo, points in measured.items():
        seeds = t["topologies"][SEED_COLUMN.get(topo, topo)]
        for c, vals in points.items():
            i = t["concurrency"].index(c)
            for m in METRICS:
                out.append((topo, m, c, math.log(vals[m] / seeds[m][i])))
    return out


def table(t: dict, topo: str, points: dict[int, dict[str, float]]) -> list[str]:
    seeds = t["topologies"][SEED_COLUMN.get(topo, topo)]
    rows = [
        "| c | decode seed | decode sim | err | prefill seed | prefill sim | err | TTFT seed (ms) | TTFT sim | err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(points):
        i = t["concurrency"].index(c)
        cells = [f"c{c}"]
        for m, fmt in (("decode", "{:.1f}"), ("prefill", "{:.0f}"), ("ttft", "{:.0f}")):
            s, v = seeds[m][i], points[c][m]
            cells += [fmt.format(s), fmt.format(v), f"{(v / s - 1) * 100:+.0f}%"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def summary(t: dict, measured: dict) -> list[str]:
    rows = ["| topology | max |err| decode | prefill | TTFT |", "|---|---|---|---|"]
    for topo in measured:
        worst = {
            m: max((abs(math.exp(e) - 1) for tp, mm, _, e in errors(t, {topo: measured[topo]}) if mm == m), default=0)
            for m in METRICS
        }
        rows.append(
            f"| {topo} | {worst['decode'] * 100:.0f}% | {worst['prefill'] * 100:.0f}% | {worst['ttft'] * 100:.0f}% |"
        )
    return rows


def worst_error(t: dict, measured: dict) -> float:
    return max((abs(math.exp(e) - 1) for *_, e in errors(t, measured)), default=0.0)


def print_report(t: dict, measured: dict, title: str) -> None:
    print(f"\n## {title}")
    for topo, pts in measured.items():
        print(f"\n### {topo}\n" + "\n".join(table(t, topo, pts)))
    print("\n" + "\n".join(summary(t, measured)))
    print(f"\nworst point: {worst_error(t, measured) * 100:.1f}% (tolerance {t['tolerance'] * 100:.0f}%)")


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="c1,c8,c64, one run each, no doc (the lower-cost mode)")
    ap.add_argument("--predict", action="store_true", help="virtual-time predictor only, no servers")
    ap.add_argument("--fit", action="store_true", help="refit the fitted parameters with the predictor; print them")
    ap.add_argument("--concurrency", type=int, nargs="+", help="override the concurrency levels")
    ap.add_argument("--runs", type=int, help="llama-benchy --runs (default 3; 5 for 2xsolo)")
    ap.add_argument("--topologies", nargs="+", choices=TOPOLOGIES, default=list(TOPOLOGIES))
    ap.add_argument("--tp2-backend", choices=("native", "torchrun"), default="native")
    ap.add_argument("--stream-interval", type=int, default=4, help="tokens per SSE chunk of the sims behind the proxy")
    ap.add_argument(
        "--proxy-workers",
        type=int,
        default=2,
        help="LiteLLM --num_workers (2: one per core here, so the proxy keeps up at c64)",
    )
    ap.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="run the sims this much faster than real time and scale the figures back (<1: cheaper, "
        "but client/proxy overheads weigh more)",
    )
    ap.add_argument(
        "--write-doc",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write docs/calibration.md (default: yes for a full run)",
    )
    ap.add_argument("--tolerance", type=float, help="override the targets' tolerance (0.25) for the exit status")
    ap.add_argument("--keep-logs", action="store_true")
    args = ap.parse_args(argv)
    t = load_targets()
    if args.tolerance is not None:
        t["tolerance"] = args.tolerance

    if args.fit:
        values = fit()
        print("fitted values (put them into images/vllm-sim/vllm_sim/data/models.yaml):")
        print(json.dumps({k: round(v, 4) for k, v in values.items()}, indent=1))
        print_report(t, predicted(catalog_with(values, t["model"])), "predicted with these values")
        print("\nmax_running_seqs scan (configured continuous values):")
        for cap, worst in cap_scan():
            print(f"  {cap}: worst point {worst * 100:.1f}%")
        return 0
    if args.predict:
        measured = predicted()
        print_report(t, measured, "virtual-time prediction (50 shuffle draws), current models.yaml")
        return 0 if worst_error(t, measured) <= t["tolerance"] else 1

    concurrency = args.concurrency or ([1, 8, 64] if args.quick else t["concurrency"])
    logdir = Path(tempfile.mkdtemp(prefix="calibrate-sim-"))
    measured: dict[str, dict[int, dict[str, float]]] = {}
    started = time.time()
    load_before = os.getloadavg()
    for name in args.topologies:
        runs = args.runs or (1 if args.quick else (5 if name.endswith("proxy") or name.startswith("2x") else 3))
        print(f"[{time.strftime('%H:%M:%S')}] {name}: starting servers", flush=True)
        topo = Topology(name, t, logdir, args.time_scale, args.tp2_backend, args.stream_interval, args.proxy_workers)
        try:
            topo.start()
            print(f"[{time.strftime('%H:%M:%S')}] {name}: llama-benchy c{concurrency} x {runs} runs", flush=True)
            raw = run_benchy(topo.base_url, t["model"], concurrency, runs, t["pp"], t["tg"], logdir / f"{name}.json")
        finally:
            topo.stop()
        s = args.time_scale
        measured[name] = {
            c: {"decode": v["decode"] * s, "prefill": v["prefill"] * s, "ttft": v["ttft"] / s} for c, v in raw.items()
        }
        print("\n".join(table(t, name, measured[name])), flush=True)
    elapsed = time.time() - started
    load_after = os.getloadavg()
    print_report(t, measured, "measured through the real stack")
    write = args.write_doc if args.write_doc is not None else not args.quick
    if write:
        write_doc(t, measured, args, concurrency, elapsed, (load_before, load_after))
        print(f"\nwrote {DOC.relative_to(REPO)}")
    if not args.keep_logs:
        shutil.rmtree(logdir, ignore_errors=True)
    else:
        print(f"logs in {logdir}")
    return 0 if worst_error(t, measured) <= t["tolerance"] else 1


def fitted_rows() -> list[str]:
    cat = default_catalog()
    t = load_targets()
    rows = ["| parameter | value | stands in for |", "|---|---|---|"]
    notes = {
        "bw_efficiency": "share of 273 GB/s that weight and KV streaming reaches",
        "prefill_tflops": "effective throughput of batched-token math (MoE GEMMs, attention), per GPU",
        "tp_compute_efficiency": "how well TP=2 splits that math (imbalance, extra kernels)",
        "launch_us_per_layer_eager": "Python + kernel-launch cost per layer and step with --enforce-eager",
        "launch_us_per_layer_graph": "the same with CUDA graphs (not exercised by the seeds: a guess)",
        "per_seq_us": "per running sequence and step (sampling, scheduling, detokenizing)",
        "batch_window_ms": "an idle engine waits this long for simultaneous arrivals to coalesce",
        "distributed_step_us": "per-step cost of a multi-GPU executor (RPC, broadcast)",
    }
    for k, v in cat.hardware["gb10"].fitted.items():
        rows.append(f"| gb10.{k} | {v:g} | {notes.get(k, '')} |")
    m = cat.model(t["model"]).fitted
    rows.append(
        f"| {t['model']}.routing_knee_tokens | {m['routing_knee_tokens']:g} | up to this many tokens of a "
        "step route to experts independently |"
    )
    rows.append(
        f"| {t['model']}.routing_exponent | {m['routing_exponent']:g} | past the knee, independent routings "
        "grow as tokens^exponent: tokens of one batch share experts |"
    )
    rows.append(
        f"| {t['model']}.max_running_seqs | {m['max_running_seqs']} | admission cap of one engine: the seeds' "
        "c64 plateau of solo and cluster (see below) |"
    )
    return rows


def proxy_check(measured: dict) -> list[str]:
    """Direct solo vs the same sim behind the proxy: the proxy's and client's share of the figures."""
    if "solo" not in measured or "solo-proxy" not in measured:
        return []
    rows = [
        "## Proxy check",
        "",
        "Same sim, direct vs behind the proxy (difference of the proxied figure, in %):",
        "",
        "| c | decode | prefill | TTFT |",
        "|---|---|---|---|",
    ]
    for c in sorted(set(measured["solo"]) & set(measured["solo-proxy"])):
        d, p = measured["solo"][c], measured["solo-proxy"][c]
        rows.append(f"| c{c} | " + " | ".join(f"{(p[m] / d[m] - 1) * 100:+.0f}%" for m in METRICS) + " |")
    return rows + [
        "",
        "Were the proxy (or the client, which both runs share) the bottleneck, the proxied figures",
        "would fall behind most at c64. At low concurrency another effect shows: the proxy hands on a",
        "run's simultaneous requests one after another, so fewer of them share the first prefill step.",
        "",
    ]


def render_doc(t, measured, args, concurrency, elapsed, loads) -> str:
    runs = args.runs or "3 (5 for 2xsolo-shuffle and solo-proxy)"
    scan = cap_scan()
    lines = [
        "# vllm-sim calibration",
        "",
        "Generated by `python benchmarks/calibrate_sim.py` (do not edit by hand; rerun it). The simulated engine",
        "is calibrated against the gpt-oss-120b tables of seeds 000-002 (two DGX Sparks, vLLM with",
        "`--enforce-eager --mxfp4-layers moe,qkv,o,lm_head --kv-cache-dtype fp8`, gpu_memory_utilization 0.70,",
        "max_model_len 4096, max_num_batched_tokens 32768; llama-benchy pp1024/tg128, 50 runs per level).",
        "Targets: `images/vllm-sim/vllm_sim/data/calibration-targets.yaml`; parameters:",
        "`images/vllm-sim/vllm_sim/data/models.yaml`.",
        "",
        "## How it was measured",
        "",
        "Every process is real; only the GPU is simulated (each step sleeps the time the model computes).",
        "",
        "- **solo**: one `python -m vllm_sim serve` process.",
        "- **cluster-tp2**: two sim processes, "
        + (
            "in vLLM's native multi-node mode (`-tp 2 --nnodes 2`)"
            if args.tp2_backend == "native"
            else "under the torchrun launcher"
        )
        + ": a real",
        "  gloo group on 127.0.0.1, rank 0 broadcasts each step's new requests, both ranks step in lockstep and",
        "  meet in an all-reduce every step.",
        "- **2xsolo-shuffle**: two sims behind a real LiteLLM proxy (litellm 1.100.5, `hosted_vllm/`, simple-shuffle,",
        (
            f"  {args.proxy_workers} worker(s)); the sims send {args.stream_interval} tokens per SSE chunk "
            "(`--stream-interval`)."
        ),
        f"- llama-benchy 0.4.0, pp1024 tg128, concurrency {' '.join(f'c{c}' for c in concurrency)}, --runs {runs},",
        "  `--skip-coherence` (the sim's text is placeholder), the sim's tokenizer and corpus (offline).",
        "  The seeds used 50 runs per level: with 3-5 runs, 2xsolo's random routing adds a few % of noise at c2-c8.",
        f"- This machine: {os.cpu_count()} cores, shared with other work: load average {loads[0][0]:.1f} before,",
        f"  {loads[1][0]:.1f} after; the run took {elapsed / 60:.0f} min.",
        "",
        "The seeds sent solo and cluster traffic through LiteLLM too; here they go direct, as the calibration",
        "targets the engines. **solo-proxy** (one sim behind the same proxy, compared with the same solo seeds)",
        "checks what the proxy and the client cost on this machine; see *Proxy check* below.",
        "",
        "## Result",
        "",
        *summary(t, measured),
        "",
        f"Worst point: {worst_error(t, measured) * 100:.1f}% (tolerance {t['tolerance'] * 100:.0f}%).",
        "",
    ]
    for topo, pts in measured.items():
        lines += [f"### {topo}", "", *table(t, topo, pts), ""]
    lines += proxy_check(measured)
    lines += [
        "## The timing model (vllm_sim/timing.py, scheduler.py)",
        "",
        "The engine advances in steps, scheduled like vLLM V1: running sequences first (decode = 1 token,",
        "unfinished prefill = next chunk), then waiting ones in arrival order while the token budget",
        "(`max_num_batched_tokens`), `max_num_seqs` and KV blocks last; longer prompts are chunked; KV",
        "exhaustion preempts the newest sequence. A step's duration is the sum of:",
        "",
        "- launch: layers x per-layer launch cost (eager vs CUDA graphs);",
        "- memory: (dense weights + layers x distinct experts routed to x expert bytes) / TP + KV read by the",
        "  decodes, over 273 GB/s x efficiency. Distinct experts grow with the batch's tokens (independent up to a",
        "  knee of about 2 tokens, then sublinearly: tokens of a batch share experts);",
        "  a 1024-token prefill reads every expert, a decode of 1 token 4 of 128;",
        "- compute: 2 x active params x tokens (+ attention) / (effective FLOP/s x TP x TP efficiency);",
        "- communication (TP > 1): (2 x layers + 1) all-reduces, each 18 us eager or 46 us inside a CUDA graph",
        "  (seed 004; `vllm::all_reduce` in `splitting_ops` makes it eager + 5 us), plus bytes / 23.7 GB/s,",
        "  plus a per-step executor cost;",
        "- per-sequence cost x sequences in the step.",
        "",
        "Memory at start-up follows vLLM: weights must fit in gpu_memory_utilization x 119.7 GiB, the rest minus",
        "activations is KV cache (fp8: 1 byte per element), which must hold one max_model_len sequence.",
        "",
        "## Fitted parameters",
        "",
        "The continuous values were fitted with `calibrate_sim.py --fit` (Nelder-Mead on the virtual-time",
        "predictor, vllm_sim/predict.py, which replays llama-benchy's method on the same engine code; loss: mean",
        "squared log error + half the worst); `max_running_seqs` is an integer, chosen by a scan (below).",
        "Architecture numbers (layers, experts, parameter counts, bandwidth, all-reduce latencies) are not fitted.",
        "",
        *fitted_rows(),
        "",
        "Scan of `max_running_seqs` (predicted worst point over all 63 seed points, other values as above):",
        "",
        "| max_running_seqs | " + " | ".join("none" if c is None else str(c) for c, _ in scan) + " |",
        "|---|" + "---|" * len(scan),
        "| worst point | " + " | ".join(f"{w * 100:.0f}%" for _, w in scan) + " |",
        "",
        "**The c64 plateau.** In the seeds, solo and cluster stop scaling between c32 and c64 (decode flat, prefill",
        "t/s down 2.3-2.5x, TTFT x2.2) while each 2xsolo backend, at about 32 requests, keeps scaling. Token",
        "budget queueing alone (32768 / 1024 = 32 prefills a step, seed 001's explanation) predicts only a second",
        "prefill step, not the collapse; seed 002 blames memory pressure; the real cause is not known. The sim",
        "reproduces it with a fitted admission cap per engine (`max_running_seqs`, applied like a lower",
        "`--max-num-seqs`): requests past it wait until others finish. It is a stand-in, not a mechanism.",
        "",
        "## Limits",
        "",
        "- One model calibrated (gpt-oss-120b, eager mode, fp8 KV, pp1024/tg128). Other models in models.yaml use",
        "  the same hardware numbers and uncalibrated routing; CUDA-graph timings are not covered by the seeds.",
        "- Prefix caching, speculative decoding, sampling cost differences and context depth are not modeled.",
        "- Lower-cost mode: `--quick` (c1, c8, c64; one run; about 4 minutes, run by hand or before a release: it is a",
        "  sweep, kept out of CI), or `--time-scale 0.5`, which runs twice as",
        "  fast and rescales the figures (client and proxy overheads then weigh twice as much).",
        "",
    ]
    return "\n".join(lines)


def write_doc(t, measured, args, concurrency, elapsed, loads) -> None:
    DOC.write_text(render_doc(t, measured, args, concurrency, elapsed, loads), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
