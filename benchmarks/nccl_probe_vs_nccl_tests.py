#!/usr/bin/env python3
"""doctor --nccl's all-reduce probe side by side with nccl-tests' all_reduce_perf, on one GPU machine, one run.

On a host with N GPUs (torch with CUDA; nvcc and make for the build), with the nccl-tests source in DIR:

    python3 benchmarks/nccl_probe_vs_nccl_tests.py --nccl-tests-src DIR --out OUTDIR

  1. builds all_reduce_perf (MPI=0) against the NCCL torch ships (the nvidia-nccl wheel's include/ and lib/),
  2. runs `all_reduce_perf -b 8 -e MAX -f 2` twice, `-g N` (one thread drives every GPU: the issue's command) and
     `-t N -g 1` (one thread per GPU: the probe's shape), and `-b 4K -e 4K -G 20 -t N -g 1` (CUDA graph, nccl-tests'
     -G mode), with that same libnccl first on LD_LIBRARY_PATH,
  3. runs the probe under torchrun, one process per GPU, same sizes,
  4. prints the table: nccl-tests' in-place time/busbw, the probe's (each the median of --repeats runs: nccl-tests
     -N, the probe's --repeats), their ratio, and the issue's goals
     (busbw within 3% at >= 128 MiB; time within 15% from 8 B to 1 MiB; the probe's eager 4 KiB latency
     within 15% of nccl-tests' 4 KiB in-place time), plus how the probe ended (exit code, teardown).

Raw outputs (nccl-tests-eager.txt, nccl-tests-graph.txt, probe.txt, probe.json, meta.json, comparison.txt) go
to OUTDIR; `--from-dir OUTDIR` prints the comparison again from them (no GPU needed). NVLink multicast stays
off in every child (NCCL_NVLS_ENABLE=0 and friends), as shared GPU hosts require. Exit 0 when every goal is
met, 1 when one is missed, 2 when a step could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sparkdeploy.doctor.nccl_table import median_at, parse_nccl_table  # noqa: E402 - stdlib only, runs beside torch

PROBE = ROOT / "sparkdeploy" / "doctor" / "probe" / "allreduce_probe.py"
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
BUSBW_TOLERANCE = 0.03  # at >= 128 MiB
TIME_TOLERANCE = 0.15  # 8 B .. 1 MiB, and the eager 4 KiB latency against nccl-tests' 4 KiB in-place time
BIG = 128 * 2**20
SMALL_MAX = 2**20
GRAPH_LAUNCHES = 20
GRAPH_CALLS = 20  # the probe's --graph-calls default
FILES = {
    "eager": "nccl-tests-eager.txt",
    "threads": "nccl-tests-eager-threads.txt",
    "graph": "nccl-tests-graph.txt",
    "probe": "probe.txt",
    "probe_json": "probe.json",
    "meta": "meta.json",
    "comparison": "comparison.txt",
}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    for suffix, m in (("K", 2**10), ("M", 2**20), ("G", 2**30)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * m)
    return int(text)


def child_env(nccl_lib: str | None = None) -> dict[str, str]:
    env = dict(os.environ, **MULTICAST_OFF, NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "VERSION"))
    if nccl_lib:
        env["LD_LIBRARY_PATH"] = nccl_lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def torch_nccl_home() -> tuple[str, str]:
    """(the folder holding include/ and lib/ of the libnccl torch has loaded, torch's NCCL version)."""
    import torch

    v = torch.cuda.nccl.version()  # loads libnccl if torch has not yet
    version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    with open("/proc/self/maps") as fh:
        mapped = [line.split()[-1] for line in fh if "libnccl.so" in line]
    if mapped:
        home = Path(mapped[0]).resolve().parents[1]
        if (home / "include" / "nccl.h").exists():
            return str(home), version
        raise SystemExit(f"torch loads {mapped[0]} but {home}/include/nccl.h is missing: pass --nccl-home")
    raise SystemExit("torch has no libnccl mapped: pass --nccl-home (include/ and lib/)")


def build(src: Path, build_dir: Path, nccl_home: str, log: Path) -> Path:
    """all_reduce_perf against the wheel's NCCL. The wheel ships libnccl.so.2 only: a linker folder with a
    libnccl.so link is made beside the build."""
    linkdir = build_dir / "nccl-link"
    (linkdir / "lib").mkdir(parents=True, exist_ok=True)
    target = linkdir / "lib" / "libnccl.so"
    if not target.exists():
        target.symlink_to(next((Path(nccl_home) / "lib").glob("libnccl.so*")))
    if not (linkdir / "include").exists():
        (linkdir / "include").symlink_to(Path(nccl_home) / "include")
    binary = build_dir / "all_reduce_perf"
    argv = [
        "make",
        "-C",
        str(src / "src"),
        f"-j{os.cpu_count() or 4}",
        "MPI=0",
        f"NCCL_HOME={linkdir}",
        f"BUILDDIR={build_dir}",
        "NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90",
        "os.build",
        str(binary),
    ]
    cuda_home = os.environ.get("CUDA_HOME") or (
        str(Path(shutil.which("nvcc")).resolve().parents[1]) if shutil.which("nvcc") else "/usr/local/cuda"
    )
    argv.append(f"CUDA_HOME={cuda_home}")
    with log.open("w") as fh:
        rc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not binary.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"nccl-tests build failed (exit {rc}); the end of {log}:\n{tail}")
    return binary


def run_to(path: Path, argv: list[str], env: dict, timeout: float) -> tuple[int, float]:
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        code, out = proc.returncode, proc.stdout + ("\n" + proc.stderr if proc.stderr else "")
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout or b""
        code, out = 124, partial.decode(errors="replace") if isinstance(partial, bytes) else partial
    path.write_text(out)
    print(out, flush=True)
    return code, time.monotonic() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args, out: Path) -> dict:
    meta: dict = {
        "gpus": args.gpus,
        "repeats": args.repeats,
        "iters": args.iters,
        "max_bytes": args.max_bytes,
        "probe_timeout_s": args.probe_timeout,
        "env": MULTICAST_OFF,
    }
    nccl_lib = None
    if args.nccl_tests_bin:
        binary = Path(args.nccl_tests_bin)
    else:
        started = time.monotonic()
        try:
            home, version = (args.nccl_home, None) if args.nccl_home else torch_nccl_home()
            meta.update(nccl_home=home, torch_nccl=version)
            nccl_lib = str(Path(home) / "lib")
            build_dir = Path(args.build_dir).resolve()
            build_dir.mkdir(parents=True, exist_ok=True)
            binary = build(Path(args.nccl_tests_src).resolve(), build_dir, home, build_dir / "build.log")
        except SystemExit as exc:  # the probe still runs: its figures are worth having on their own
            meta["build_error"], binary = str(exc), None
            print(f"nccl_probe_vs_nccl_tests: {exc}", file=sys.stderr, flush=True)
        meta["build_s"] = round(time.monotonic() - started, 1)
    env = child_env(nccl_lib)
    sweep = ["-b", "8", "-e", str(args.max_bytes), "-f", "2", "-n", str(args.iters), "-N", str(args.repeats)]
    meta["nccl_tests_eager"] = [str(binary), *sweep, "-g", str(args.gpus)]  # one thread drives every GPU
    meta["nccl_tests_threads"] = [str(binary), *sweep, "-t", str(args.gpus), "-g", "1"]  # one thread per GPU
    meta["nccl_tests_graph"] = [
        str(binary),
        "-b",
        "4096",
        "-e",
        "4096",
        "-G",
        str(GRAPH_LAUNCHES),
        "-n",
        str(GRAPH_CALLS),
        "-N",
        str(args.repeats),
        "-t",
        str(args.gpus),
        "-g",
        "1",
    ]
    for key, timeout in (("eager", 300), ("threads", 300), ("graph", 120)):
        if binary is None:
            (out / FILES[key]).write_text(f"# not run: {meta['build_error']}\n")
            continue
        meta[f"nccl_tests_{key}_rc"], _ = run_to(out / FILES[key], meta[f"nccl_tests_{key}"], env, timeout)
    probe = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(args.gpus),
        "--master-port",
        str(free_port()),
        str(PROBE),
        "--backend",
        args.backend,
        "--max-bytes",
        str(args.max_bytes),
        "--iters",
        str(args.iters),
        "--repeats",
        str(args.repeats),
        "--budget-bytes",
        str(64 * 2**30),
        "--graph-calls",
        str(GRAPH_CALLS),
        "--graph-replays",
        str(GRAPH_LAUNCHES),
        "--timeout",
        str(args.probe_timeout),
        "--json",
        str(out / FILES["probe_json"]),
    ]
    meta["probe"] = probe
    meta["probe_rc"], meta["probe_wall_s"] = run_to(out / FILES["probe"], probe, env, args.probe_timeout + 60)
    meta["probe_wall_s"] = round(meta["probe_wall_s"], 2)
    (out / FILES["meta"]).write_text(json.dumps(meta, indent=1))
    return meta


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


REFS = {
    "g": "nccl-tests -g N (one thread drives every GPU: the issue's command)",
    "t": "nccl-tests -t N -g 1 (one thread per GPU: the probe's shape, one process per GPU)",
}


def compare(texts: dict[str, str], probe: dict, meta: dict) -> tuple[list[dict], list[dict]]:
    """Rows of the side-by-side table and the goals. texts: nccl-tests outputs by key (g, t, graph); every row
    holds the value of each reference and the probe's ratio to it; every goal is judged against each reference."""
    refs = {k: parse_nccl_table(texts.get(k, ""), group="in-place") for k in REFS}
    graph_ref = parse_nccl_table(texts.get("graph", ""), group="in-place")
    method = probe.get("sweep_method", "?")
    rows: list[dict] = []

    def add(what, field, value, size, goal, tolerance, row_method, ref_tables=None):
        ref_tables = ref_tables or refs
        vals = {k: median_at(t, size, field) for k, t in ref_tables.items()}
        ratios = {k: ratio(value, v) for k, v in vals.items()}
        oks = {
            k: (r is not None and abs(r - 1) <= tolerance) if tolerance is not None else None for k, r in ratios.items()
        }
        rows.append(
            {
                "what": what,
                "refs": vals,
                "probe": value,
                "ratios": ratios,
                "goal": goal,
                "ok": oks,
                "method": row_method,
            }
        )

    for p in probe.get("rows", []):
        size = p["size"]
        if size <= SMALL_MAX:
            add(f"{human(size)} time (us)", "time_us", p["time_us"], size, "time", TIME_TOLERANCE, method)
        else:
            big = size >= BIG
            add(
                f"{human(size)} busbw (GB/s)",
                "busbw",
                p["busbw"],
                size,
                "busbw" if big else "",
                BUSBW_TOLERANCE if big else None,
                method,
            )
    for lat in (probe.get("lat4k") or {}).get("rows", []):
        graph = lat["mode"] == "graph"
        headline = lat["id"] == "eager nccl-direct"
        add(
            f"4 KiB {lat['id']} (us)",
            "time_us",
            lat["us"],
            4096,
            "eager" if headline else "",
            TIME_TOLERANCE if headline else None,
            lat["method"],
            {"t": graph_ref} if graph else None,
        )
    goals = []
    names = {
        "time": f"time within {TIME_TOLERANCE:.0%} of nccl-tests, 8 B to 1 MiB",
        "busbw": f"busbw within {BUSBW_TOLERANCE:.0%} of nccl-tests at >= 128 MiB",
        "eager": f"eager 4 KiB (NCCL direct) within {TIME_TOLERANCE:.0%} of nccl-tests' 4 KiB in-place time",
    }
    for key, name in names.items():
        group = [r for r in rows if r["goal"] == key]
        for ref in REFS:
            judged = [r for r in group if r["ratios"].get(ref) is not None]
            worst = max((abs(r["ratios"][ref] - 1) for r in judged), default=None)
            goals.append(
                {
                    "goal": f"{name} [{'-g N' if ref == 'g' else '-t N -g 1'}]",
                    "ok": bool(judged) and len(judged) == len(group) and all(r["ok"][ref] for r in judged),
                    "rows": len(judged),
                    "worst": worst,
                }
            )
    end_ok = meta.get("probe_rc") == 0 and probe.get("ok") is True
    teardown = meta.get("teardown_s")
    wall, limit = meta.get("probe_wall_s") or 0, meta.get("probe_timeout_s") or 0
    goals.append(
        {
            "goal": f"probe exits cleanly after graph capture within --timeout {limit:g} s",
            "ok": end_ok and teardown is not None and wall <= limit,
            "rows": 1,
            "worst": None,
            "detail": f"exit {meta.get('probe_rc')}, wall {wall} s, teardown "
            + (f"clean in {teardown:.2f} s" if teardown is not None else "not reported"),
        }
    )
    return rows, goals


def human(n: int) -> str:
    for unit, m in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def render(rows: list[dict], goals: list[dict], probe: dict, meta: dict) -> str:
    direct = probe.get("nccl_direct") or {}

    def cmd(key):
        argv = meta.get(f"nccl_tests_{key}") or []
        return " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv))

    def fmt(v):
        return "n/a" if v is None else f"{v:.2f}"

    lines = [
        (
            f"# probe sweep method: {probe.get('sweep_method')}; NCCL direct: {direct.get('library')} "
            f"(NCCL {direct.get('version')}); torch NCCL {', '.join(probe.get('nccl_versions', []))}"
        ),
        f"# -g N: {cmd('eager')}",
        f"# -t N: {cmd('threads')}",
        f"# graph: {cmd('graph')} (4 KiB graph row)",
        (
            f"# in-place columns of nccl-tests; medians of {meta.get('repeats', 1)} runs each; "
            "ratio = probe / nccl-tests"
        ),
        "",
        "| what | nccl-tests -g N | nccl-tests -t N | probe | ratio (-g) | ratio (-t) | goal | method |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        marks = " ".join(f"{k}:{'ok' if v else 'MISSED'}" for k, v in r["ok"].items() if v is not None)
        lines.append(
            f"| {r['what']} | {fmt(r['refs'].get('g'))} | {fmt(r['refs'].get('t'))} | {fmt(r['probe'])} | "
            f"{fmt(r['ratios'].get('g'))} | {fmt(r['ratios'].get('t'))} | {marks} | {r['method']} |"
        )
    lines.append("")
    for g in goals:
        worst = f", worst {g['worst']:.1%} off" if g.get("worst") is not None else ""
        lines.append(
            f"goal: {g['goal']}: {'MET' if g['ok'] else 'MISSED'} ({g['rows']} rows{worst})"
            + (f"; {g['detail']}" if g.get("detail") else "")
        )
    return "\n".join(lines)


def report(out: Path) -> int:
    meta = json.loads((out / FILES["meta"]).read_text())
    probe_text = (out / FILES["probe"]).read_text()
    probe = json.loads((out / FILES["probe_json"]).read_text()) if (out / FILES["probe_json"]).exists() else {}
    meta["teardown_s"] = parse_nccl_table(probe_text).get("teardown_s")
    texts = {
        k: (out / FILES[f]).read_text()
        for k, f in (("g", "eager"), ("t", "threads"), ("graph", "graph"))
        if (out / FILES[f]).exists()
    }
    rows, goals = compare(texts, probe, meta)
    text = render(rows, goals, probe, meta)
    (out / FILES["comparison"]).write_text(text + "\n")
    print(text)
    return 0 if all(g["ok"] for g in goals) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nccl-tests-src", help="nccl-tests source tree (NVIDIA/nccl-tests)")
    p.add_argument("--nccl-tests-bin", help="an all_reduce_perf already built (skips the build)")
    p.add_argument("--nccl-home", help="NCCL include/ and lib/ (default: the nvidia-nccl wheel torch uses)")
    p.add_argument("--build-dir", default="build-nccl-tests")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--max-bytes", type=parse_size, default=2**30)
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size, both tools (nccl-tests -n)")
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="runs per size, both tools (nccl-tests -N; the probe's --repeats); medians are compared",
    )
    p.add_argument("--backend", default="nccl", help="the probe's backend (gloo: a CPU dry run of the plumbing)")
    p.add_argument("--probe-timeout", type=float, default=300)
    p.add_argument("--out", default="nccl-compare", help="folder for the raw outputs")
    p.add_argument("--from-dir", help="print the comparison from a folder of raw outputs (no GPU)")
    args = p.parse_args(argv)
    if args.from_dir:
        return report(Path(args.from_dir))
    if not (args.nccl_tests_src or args.nccl_tests_bin):
        p.error("--nccl-tests-src or --nccl-tests-bin is needed (or --from-dir)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        measure(args, out)
    except SystemExit as exc:
        print(f"nccl_probe_vs_nccl_tests: {exc}", file=sys.stderr)
        return 2
    return report(out)


if __name__ == "__main__":
    sys.exit(main())
