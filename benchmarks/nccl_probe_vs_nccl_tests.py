#!/usr/bin/env python3
"""doctor --nccl's all-reduce probe side by side with nccl-tests' all_reduce_perf, on one GPU machine.

On a host with N GPUs (torch with CUDA; nvcc and make for the build), with the nccl-tests source in DIR:

    python3 benchmarks/nccl_probe_vs_nccl_tests.py --nccl-tests-src DIR --gpus N --out OUTDIR

  1. builds all_reduce_perf (MPI=0) against the NCCL torch ships (the nvidia-nccl wheel's include/ and lib/),
  2. runs --rounds rounds, one after the other, each of them all of these (interleaved, so a slow spell of the
     shared host falls on both tools alike, not on whichever ran during it), with that same libnccl first on
     LD_LIBRARY_PATH:
       - `all_reduce_perf -b 8 -e MAX -f 2 -n ITERS -N REPEATS -t N -g 1`: one thread per GPU, the reference
         (the probe's shape: one launching thread per GPU),
       - the probe under torchrun, one process per GPU, same sizes, --iters ITERS --repeats REPEATS,
       - the same nccl-tests with `-g N` (one thread drives every GPU: shown, not judged),
       - the same nccl-tests with `-C 1` up to 1 MiB (nccl-tests' host time per call: what queueing one call costs
         from C, beside the probe's host column),
       - `-b 4K -e 4K -G 20 -n 20 -t N -g 1` (CUDA graph: the reference of the probe's graph row),
  3. with --diagnose, once after the rounds: the probe with --line-up barrier (torch.distributed.barrier before
     each timed run, the old way) and one nccl-tests and one probe run with NCCL_DEBUG=INFO (channels, transports),
  4. prints the table: per size, each tool's median over the rounds of its per-round median (nccl-tests -N
     cycles, the probe's --repeats cycles), their ratio, the host figures, and the issue's goals (time within 15%
     from 8 B to 1 MiB; busbw within 3% at >= 128 MiB; the eager 4 KiB row within 15% of nccl-tests' 4 KiB time;
     the graph row within 15% of nccl-tests -G; every probe run exits cleanly), each against -t N -g 1.

Raw outputs (one file per tool and round, meta.json, comparison.txt) go to OUTDIR; `--from-dir OUTDIR` prints
the comparison again from them (no GPU needed). NVLink multicast stays off in every child (NCCL_NVLS_ENABLE=0
and friends), as shared GPU hosts require. Exit 0 when every goal is met, 1 when one is missed, 2 when a step
could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sparkdeploy.doctor.nccl_table import median_at, parse_nccl_table  # noqa: E402 - stdlib only, runs beside torch

PROBE = ROOT / "sparkdeploy" / "doctor" / "probe" / "allreduce_probe.py"
MP_REF = ROOT / "benchmarks" / "nccl_mp_ref.cu"
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
BUSBW_TOLERANCE = 0.03  # at >= 128 MiB
TIME_TOLERANCE = 0.15  # 8 B .. 1 MiB, the eager 4 KiB row and the graph row
BIG = 128 * 2**20
SMALL_MAX = 2**20
GRAPH_LAUNCHES = 20
GRAPH_CALLS = 20  # the probe's --graph-calls default
TOOLS = ("threads", "probe", "cref", "eager", "cputime", "graph")  # the order within a round
FILES = {  # per round: NAME.rN.txt (the probe also writes probe.rN.json)
    "threads": "nccl-tests-threads",
    "probe": "probe",
    "cref": "nccl-mp-ref",
    "eager": "nccl-tests-eager",
    "cputime": "nccl-tests-cputime",
    "graph": "nccl-tests-graph",
}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    for suffix, m in (("K", 2**10), ("M", 2**20), ("G", 2**30)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * m)
    return int(text)


def human(n: int) -> str:
    for unit, m in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def parse_cpus(text: str) -> set[int]:
    """A CPU list as taskset -c takes it: 0-7,16."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def child_env(nccl_lib: str | None = None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "VERSION"), **extra, **MULTICAST_OFF}
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


def nccl_link(build_dir: Path, nccl_home: str) -> Path:
    """A linker folder for the wheel's NCCL: it ships libnccl.so.2 only, the link needs libnccl.so."""
    linkdir = build_dir / "nccl-link"
    (linkdir / "lib").mkdir(parents=True, exist_ok=True)
    target = linkdir / "lib" / "libnccl.so"
    if not target.exists():
        target.symlink_to(next((Path(nccl_home) / "lib").glob("libnccl.so*")))
    if not (linkdir / "include").exists():
        (linkdir / "include").symlink_to(Path(nccl_home) / "include")
    return linkdir


def build_mp_ref(build_dir: Path, nccl_home: str) -> Path | None:
    """benchmarks/nccl_mp_ref.cu: the probe's loop in C, one process per GPU (None when nvcc fails: the rest runs)."""
    linkdir, binary = nccl_link(build_dir, nccl_home), build_dir / "nccl_mp_ref"
    argv = ["nvcc", "-O2", "-o", str(binary), str(MP_REF), f"-I{linkdir}/include", f"-L{linkdir}/lib", "-lnccl"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0 or not binary.exists():
        print(f"nccl_probe_vs_nccl_tests: nccl_mp_ref build failed: {proc.stderr[-1500:]}", file=sys.stderr)
        return None
    return binary


def build(src: Path, build_dir: Path, nccl_home: str, log: Path) -> Path:
    """all_reduce_perf against the wheel's NCCL."""
    linkdir = nccl_link(build_dir, nccl_home)
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
    seconds = time.monotonic() - started
    print(f"# {time.strftime('%H:%M:%S')} {path.name}: exit {code} in {seconds:.1f} s", flush=True)
    if code != 0:
        print("\n".join(out.splitlines()[-40:]), flush=True)
    return code, seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def commands(args, binary: Path | None, out: Path) -> dict[str, list[str]]:
    """Each tool's command line (the probe's, as its first round runs it)."""
    nt = [str(binary), "-f", "2", "-n", str(args.iters), "-N", str(args.repeats)]
    one_per_gpu = ["-t", str(args.gpus), "-g", "1"]
    sweep = ["-b", "8", "-e", str(args.max_bytes)]
    return {
        "threads": [*nt, *sweep, *one_per_gpu],
        "eager": [*nt, *sweep, "-g", str(args.gpus)],
        "cputime": [*nt, "-b", "8", "-e", str(min(SMALL_MAX, args.max_bytes)), *one_per_gpu, "-C", "1"],
        "graph": [
            str(binary),
            *("-b", "4096", "-e", "4096", "-G", str(GRAPH_LAUNCHES), "-n", str(GRAPH_CALLS)),
            *("-N", str(args.repeats), *one_per_gpu),
        ],
        "probe": probe_command(args, args.max_bytes, out / "probe.r1.json"),
    }


def probe_command(args, max_bytes: int, json_path: Path, *extra: str) -> list[str]:
    return [
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
        str(max_bytes),
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
        str(json_path),
        *extra,
    ]


def measure(args, out: Path) -> dict:
    meta: dict = {
        "gpus": args.gpus,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "iters": args.iters,
        "max_bytes": args.max_bytes,
        "probe_timeout_s": args.probe_timeout,
        "env": MULTICAST_OFF,
        "probe_rc": [],
        "probe_wall_s": [],
    }
    if args.cpus:  # every tool, and each of its threads and processes, on these CPUs alone (they inherit it)
        os.sched_setaffinity(0, parse_cpus(args.cpus))
        meta["cpus"] = args.cpus
    nccl_lib, binary, mp_ref = None, None, None
    started = time.monotonic()
    try:
        home, version = (args.nccl_home, None) if args.nccl_home else torch_nccl_home()
        meta.update(nccl_home=home, torch_nccl=version)
        nccl_lib = str(Path(home) / "lib")  # nccl-tests runs on torch's libnccl, built or given
        build_dir = Path(args.build_dir).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        if args.nccl_tests_bin:
            binary = Path(args.nccl_tests_bin)
        else:
            binary = build(Path(args.nccl_tests_src).resolve(), build_dir, home, build_dir / "build.log")
        mp_ref = build_mp_ref(build_dir, home) if shutil.which("nvcc") else None
    except (SystemExit, AttributeError, RuntimeError) as exc:  # the probe still runs: its figures stand alone
        meta["build_error"] = str(exc)
        binary = Path(args.nccl_tests_bin) if args.nccl_tests_bin else None
        print(f"nccl_probe_vs_nccl_tests: {exc}", file=sys.stderr, flush=True)
    meta["build_s"] = round(time.monotonic() - started, 1)
    env = child_env(nccl_lib)
    argvs = commands(args, binary, out)
    argvs["cref"] = [
        str(mp_ref),
        str(args.gpus),
        "8",
        str(min(SMALL_MAX, args.max_bytes)),
        str(args.max_bytes),
        str(args.iters),
        str(args.repeats),
    ]
    meta["commands"] = argvs
    for r in range(1, args.rounds + 1):
        for key in TOOLS:
            path = out / f"{FILES[key]}.r{r}.txt"
            if key == "probe":
                argv = probe_command(args, args.max_bytes, out / f"probe.r{r}.json")
                code, seconds = run_to(path, argv, env, args.probe_timeout + 60)
                meta["probe_rc"].append(code)
                meta["probe_wall_s"].append(round(seconds, 2))
                if code != 0:
                    break
            elif key == "cref" and mp_ref is None:
                continue
            elif binary is None:
                path.write_text(f"# not run: {meta['build_error']}\n")
            else:
                meta[f"{key}_rc"] = max(meta.get(f"{key}_rc", 0), run_to(path, argvs[key], env, 180)[0])
        (out / "meta.json").write_text(json.dumps(meta, indent=1))  # after every round: a cut-off run still reads
        if meta["probe_rc"][-1] != 0:  # the next rounds' probes would fail alike
            print(f"nccl_probe_vs_nccl_tests: the probe failed in round {r}: no more rounds", file=sys.stderr)
            break
    if args.diagnose and meta["probe_rc"][-1] == 0:
        diagnose(args, binary, out, nccl_lib, meta)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def diagnose(args, binary: Path | None, out: Path, nccl_lib: str | None, meta: dict) -> None:
    """Once, after the rounds: the probe lined up the old way (torch.distributed.barrier), and a run of each tool
    with NCCL's INFO log (each process's log in nccl-debug/)."""
    small = str(min(SMALL_MAX, args.max_bytes))
    env = child_env(nccl_lib)
    argv = probe_command(args, int(small), out / "probe-barrier.json", "--line-up", "barrier")
    meta["diagnose"] = {"probe_barrier": argv, "probe_barrier_rc": run_to(out / "probe-barrier.txt", argv, env, 300)[0]}
    logs = out / "nccl-debug"
    logs.mkdir(exist_ok=True)
    debug = child_env(
        nccl_lib, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV,TUNING", NCCL_DEBUG_FILE=f"{logs}/%h.%p.log"
    )
    if binary is not None:
        argv = [str(binary), "-b", "8", "-e", small, "-f", "2", "-n", str(args.iters), "-N", "1", "-t", str(args.gpus)]
        meta["diagnose"]["nccl_tests_debug_rc"] = run_to(out / "nccl-tests-debug.txt", [*argv, "-g", "1"], debug, 120)[
            0
        ]
    argv = probe_command(args, int(small), out / "probe-debug.json")
    meta["diagnose"]["probe_debug_rc"] = run_to(out / "probe-debug.txt", argv, debug, 300)[0]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def rounds_of(out: Path, key: str) -> list[Path]:
    return sorted(out.glob(f"{FILES[key]}.r*.txt"), key=lambda p: int(p.name.rsplit(".r", 1)[1].split(".")[0]))


def reference(texts: list[str], size: int, field: str) -> float | None:
    """nccl-tests' figure: the median over the rounds of each round's median over its -N cycles (in place)."""
    return median([median_at(parse_nccl_table(t, group="in-place"), size, field) for t in texts])


def mp_ref_figures(text: str) -> dict[int, dict]:
    """nccl_mp_ref's lines (RANK CYCLE SIZE TIME_US HOST_US), per size: the median over the cycles of the ranks'
    mean time and of the slowest rank's host time (as the probe's figures)."""
    runs: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and all(x.isdigit() for x in parts[:3]):
            runs.setdefault((int(parts[1]), int(parts[2])), []).append((float(parts[3]), float(parts[4])))
    cycles: dict[int, list[tuple[float, float]]] = {}
    for (_cycle, size), ranks in runs.items():
        cycles.setdefault(size, []).append((statistics.mean(t for t, _ in ranks), max(h for _, h in ranks)))
    return {
        size: {"time_us": statistics.median(t for t, _ in v), "host_max_us": statistics.median(h for _, h in v)}
        for size, v in cycles.items()
    }


def mp_ref_figure(texts: list[str], size: int, field: str) -> float | None:
    return median([mp_ref_figures(t).get(size, {}).get(field) for t in texts])


def probe_figure(probes: list[dict], size: int, field: str) -> float | None:
    return median([next((r.get(field) for r in p.get("rows", []) if r["size"] == size), None) for p in probes])


def latency_figure(probes: list[dict], key: str, field: str = "us") -> float | None:
    rows = [next((r for r in (p.get("lat4k") or {}).get("rows", []) if r["id"] == key), None) for p in probes]
    return median([r.get(field) for r in rows if r])


def compare(texts: dict[str, list[str]], probes: list[dict], meta: dict) -> tuple[list[dict], list[dict]]:
    """Rows of the side-by-side table and the goals. texts: nccl-tests outputs by tool, one per round; probes: the
    probe's JSON results, one per round. Every goal is judged against nccl-tests -t N -g 1."""
    rows: list[dict] = []
    sizes = sorted({r["size"] for p in probes for r in p.get("rows", [])})

    def add(what: str, ref: float | None, value: float | None, goal: str, tolerance: float | None, **info):
        r = ratio(value, ref)
        ok = (r is not None and abs(r - 1) <= tolerance) if tolerance is not None else None
        rows.append({"what": what, "ref": ref, "probe": value, "ratio": r, "goal": goal, "ok": ok, **info})

    for size in sizes:
        if size <= SMALL_MAX:
            add(
                f"{human(size)} time (us)",
                reference(texts.get("threads", []), size, "time_us"),
                probe_figure(probes, size, "time_us"),
                "time",
                TIME_TOLERANCE,
                eager=reference(texts.get("eager", []), size, "time_us"),
                nt_host=reference(texts.get("cputime", []), size, "time_us"),
                probe_host=probe_figure(probes, size, "host_us"),
                probe_host_max=probe_figure(probes, size, "host_max_us"),
                skew=probe_figure(probes, size, "start_skew_us"),
                cref=mp_ref_figure(texts.get("cref", []), size, "time_us"),
                cref_host_max=mp_ref_figure(texts.get("cref", []), size, "host_max_us"),
            )
        else:
            big = size >= BIG
            add(
                f"{human(size)} busbw (GB/s)",
                reference(texts.get("threads", []), size, "busbw"),
                probe_figure(probes, size, "busbw"),
                "busbw" if big else "",
                BUSBW_TOLERANCE if big else None,
                eager=reference(texts.get("eager", []), size, "busbw"),
            )
    lat_keys = sorted({r["id"] for p in probes for r in (p.get("lat4k") or {}).get("rows", [])}, key=lat_order)
    for key in lat_keys:
        graph = key.startswith("graph")
        goal = "graph" if graph else "eager" if key == "eager nccl-direct" else ""
        add(
            f"4 KiB {key} (us)",
            reference(texts.get("graph" if graph else "threads", []), 4096, "time_us"),
            latency_figure(probes, key),
            goal,
            TIME_TOLERANCE if goal else None,
            eager=None if graph else reference(texts.get("eager", []), 4096, "time_us"),
            nt_host=None if graph else reference(texts.get("cputime", []), 4096, "time_us"),
            probe_host=latency_figure(probes, key, "host_us"),
            probe_host_max=latency_figure(probes, key, "host_max_us"),
            cref=None if graph else mp_ref_figure(texts.get("cref", []), 4096, "time_us"),
            cref_host_max=None if graph else mp_ref_figure(texts.get("cref", []), 4096, "host_max_us"),
        )
    goals = []
    names = {
        "time": f"time within {TIME_TOLERANCE:.0%} of nccl-tests -t N -g 1, 8 B to 1 MiB",
        "busbw": f"busbw within {BUSBW_TOLERANCE:.0%} of nccl-tests -t N -g 1 at >= 128 MiB",
        "eager": f"eager 4 KiB (NCCL direct) within {TIME_TOLERANCE:.0%} of nccl-tests -t N -g 1's 4 KiB time",
        "graph": f"4 KiB in a CUDA graph within {TIME_TOLERANCE:.0%} of nccl-tests -G {GRAPH_LAUNCHES} -t N -g 1",
    }
    for key, name in names.items():
        group = [r for r in rows if r["goal"] == key]
        judged = [r for r in group if r["ratio"] is not None]
        goals.append(
            {
                "goal": name,
                "ok": bool(judged) and len(judged) == len(group) and all(r["ok"] for r in judged),
                "rows": len(judged),
                "worst": max((abs(r["ratio"] - 1) for r in judged), default=None),
            }
        )
    codes, walls = meta.get("probe_rc") or [], meta.get("probe_wall_s") or []
    teardowns = meta.get("teardown_s") or []
    limit = meta.get("probe_timeout_s") or 0
    goals.append(
        {
            "goal": f"every probe run exits cleanly after graph capture within --timeout {limit:g} s",
            "ok": bool(codes)
            and all(c == 0 for c in codes)
            and len(probes) == len(codes)
            and all(p.get("ok") is True for p in probes)
            and len(teardowns) == len(codes)
            and None not in teardowns
            and all(w <= limit for w in walls),
            "rows": len(codes),
            "worst": None,
            "detail": f"exit {codes}, wall {walls} s, teardown "
            + ", ".join("not reported" if t is None else f"{t:.2f}" for t in teardowns)
            + " s",
        }
    )
    return rows, goals


def lat_order(key: str) -> int:
    order = ["eager nccl-direct", "eager nccl-vllm", "eager torch.distributed", "graph nccl-direct"]
    return order.index(key) if key in order else len(order)


def render(rows: list[dict], goals: list[dict], probes: list[dict], meta: dict) -> str:
    first = probes[0] if probes else {}
    direct = first.get("nccl_direct") or {}
    argvs = meta.get("commands") or {}

    def cmd(key):
        argv = argvs.get(key) or []
        return " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv))

    def fmt(v):
        return "" if v is None else f"{v:.2f}"

    floors = [p.get("python_floor_us") for p in probes]
    floor = median(floors)
    probe_argv = argvs.get("probe") or []
    lines = [
        (
            f"# probe sweep method: {first.get('sweep_method')}, line-up {first.get('line_up')}; NCCL direct: "
            f"{direct.get('library')} (NCCL {direct.get('version')}); torch NCCL "
            f"{', '.join(first.get('nccl_versions', []))}; device {((first.get('ranks') or [{}])[0]).get('device')}"
        ),
        f"# -t N: {cmd('threads')}   (the reference)",
        f"# -g N: {cmd('eager')}",
        f"# host: {cmd('cputime')}   (nccl-tests' host time per call)",
        f"# graph: {cmd('graph')}",
        f"# C, a process per GPU: {cmd('cref')}   (the probe's loop in C: benchmarks/nccl_mp_ref.cu)",
        f"# probe: torchrun {' '.join(Path(a).name if a.endswith('.py') else a for a in probe_argv[3:])}",
        (
            f"# {meta.get('rounds', 1)} rounds, one after the other, each tool once a round; a figure is the median "
            "over the rounds of each round's median (nccl-tests -N, the probe's --repeats cycles); in-place columns"
        ),
        (
            f"# python floor: {fmt(floor) or 'n/a'} us per call (median; per round: "
            f"{', '.join(fmt(f) or 'n/a' for f in floors)}): the probe's loop calling a C function that does nothing"
        ),
        "# host (us per call): the time to queue one call; nccl-tests -C 1 prints its thread 0's, the probe the ranks'"
        " mean and its slowest rank's (host-bound, the slowest rank sets the pace)"
        + (f"; every tool on CPUs {meta['cpus']}" if meta.get("cpus") else ""),
        "",
        (
            "| what | nccl-tests -t N | probe | ratio | goal | C, a process per GPU | probe / C | nccl-tests -g N "
            "| host: nccl-tests -C 1 | host: probe, mean | host: probe, slowest rank | host: C, slowest rank "
            "| start skew (us) |"
        ),
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mark = "" if r["ok"] is None else "ok" if r["ok"] else "MISSED"
        lines.append(
            f"| {r['what']} | {fmt(r['ref'])} | {fmt(r['probe'])} | {fmt(r['ratio'])} | {mark} | {fmt(r.get('cref'))} "
            f"| {fmt(ratio(r['probe'], r.get('cref')))} | {fmt(r.get('eager'))} | {fmt(r.get('nt_host'))} "
            f"| {fmt(r.get('probe_host'))} | {fmt(r.get('probe_host_max'))} | {fmt(r.get('cref_host_max'))} "
            f"| {fmt(r.get('skew'))} |"
        )
    lines.append("")
    for g in goals:
        worst = f", worst {g['worst']:.1%} off" if g.get("worst") is not None else ""
        lines.append(
            f"goal: {g['goal']}: {'MET' if g['ok'] else 'MISSED'} ({g['rows']} rows{worst})"
            + (f"; {g['detail']}" if g.get("detail") else "")
        )
    lines += floor_note(rows, floor)
    lines += diagnosis(meta, meta.get("out"))
    return "\n".join(lines)


def floor_note(rows: list[dict], floor: float | None) -> list[str]:
    """Where the time goal misses and the C twin ran: how far the C twin (the probe's loop in C, a process per GPU)
    is from nccl-tests there, and what the probe's slowest rank pays per call beyond it: Python's launch cost."""
    missed = [r for r in rows if r["goal"] == "time" and r["ok"] is False and r.get("cref") and r.get("cref_host_max")]
    if not missed:
        return []
    twin = max(abs(r["cref"] / r["ref"] - 1) for r in missed)
    host = statistics.median(r["probe_host_max"] - r["cref_host_max"] for r in missed if r.get("probe_host_max"))
    time_gap = statistics.median(r["probe"] - r["cref"] for r in missed)
    stub = f"{floor:.2f}" if floor is not None else "n/a"
    note = (
        f"# the {len(missed)} rows that miss the time goal: the C twin (a process per GPU) is within {twin:.1%} of "
        f"nccl-tests there; the probe's slowest rank takes {host:.2f} us more per call to queue than the C twin's "
        f"(median), and the probe's time is {time_gap:.2f} us more: Python's launch cost per call, measured against "
        f"the C twin (the ctypes call alone, the python floor, is {stub} us of it)"
    )
    return ["", note]


def diagnosis(meta: dict, out: str | None) -> list[str]:
    """The --diagnose runs' figures: the probe lined up by torch.distributed.barrier, beside the rounds'."""
    if not out or not (Path(out) / "probe-barrier.json").exists():
        return []
    barrier = json.loads((Path(out) / "probe-barrier.json").read_text())
    lines = ["", "# diagnose: the probe with --line-up barrier (torch.distributed.barrier before each timed run)"]
    for r in barrier.get("rows", []):
        if r["size"] in (8, 4096, 65536, SMALL_MAX):
            skew = f", start skew {r['start_skew_us']:.1f} us" if r.get("start_skew_us") is not None else ""
            lines.append(
                f"#  {human(r['size'])}: {r['time_us']:.2f} us, host {r['host_us']:.2f} us (slowest rank "
                f"{r.get('host_max_us', 0.0):.2f}){skew}"
            )
    return lines


def report(out: Path) -> int:
    meta = json.loads((out / "meta.json").read_text())
    meta["out"] = str(out)
    texts = {key: [p.read_text() for p in rounds_of(out, key)] for key in FILES if key != "probe"}
    probes, teardowns = [], []
    for path in rounds_of(out, "probe"):
        teardowns.append(parse_nccl_table(path.read_text()).get("teardown_s"))
        result = path.with_suffix(".json")
        probes.append(json.loads(result.read_text()) if result.exists() else {})
    meta["teardown_s"] = teardowns
    rows, goals = compare(texts, probes, meta)
    text = render(rows, goals, probes, meta)
    (out / "comparison.txt").write_text(text + "\n")
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
    p.add_argument("--rounds", type=int, default=5, help="rounds, each running every tool once; medians over them")
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="cycles per run, both tools (nccl-tests -N; the probe's --repeats); each run's median goes in",
    )
    p.add_argument("--backend", default="nccl", help="the probe's backend (gloo: a CPU dry run of the plumbing)")
    p.add_argument(
        "--cpus", help="run every tool on these CPUs only (as taskset -c: 0-7); default: wherever the OS puts them"
    )
    p.add_argument("--probe-timeout", type=float, default=240)
    p.add_argument(
        "--diagnose",
        action="store_true",
        help="after the rounds: the probe lined up by a barrier, and one run of each tool with NCCL_DEBUG=INFO",
    )
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
