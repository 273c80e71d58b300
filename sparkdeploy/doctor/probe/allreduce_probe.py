#!/usr/bin/env python3
"""All-reduce probe for sparkdeploy doctor --nccl (imports only torch and the standard library).

Run under torchrun, one process per GPU:
  - across two Sparks (what `sparkdeploy doctor --nccl` does, inside the recipe's image, over the fabric IPs):
      torchrun --nnodes 2 --node-rank R --nproc-per-node 1 --master-addr HEAD_FABRIC_IP --master-port P \
          allreduce_probe.py --backend nccl --json result.json
  - on one host with N GPUs:
      python -m torch.distributed.run --nproc-per-node 2 allreduce_probe.py --backend nccl --json OUT
  - without a GPU (the lab, a laptop): --backend gloo runs the same sweep on CPU tensors (SIMULATED: gloo/CPU
    figures say nothing about a 200 Gb/s RoCE link).

What it measures, printed like nccl-tests (all-reduce, sum, float32, in place):
  size, count, type, time (us), algbw = bytes / time, busbw = algbw * 2(n-1)/n, #wrong (a correctness check
  per size), then the 4 KiB all-reduce latency called eagerly and replayed inside a CUDA graph (NCCL only),
  and their ratio: over CX7 RoCE the seeds measured 18 us eager vs 46 us in a graph, which is what the
  eager all-reduce option of a recipe buys back; over NVLink the graph wins. Measure, don't assume.

Safety: the largest message is capped by free memory (unified memory on GB10: the GPU allocates from the same
pool as the OS), every rank agrees on the cap; an overall --timeout ends the process (exit 124) even if a
collective hangs; the CUDA graph is freed and the device synchronized before the process group is destroyed
(processes that captured NCCL calls in a graph did not exit otherwise).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import threading
import time

FLOAT_BYTES = 4
TEARDOWN_TIMEOUT_S = 60
PHASE = {"name": "start"}
PARTIAL: dict = {}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    for suffix, m in (("K", 2**10), ("M", 2**20), ("G", 2**30)):
        if text.endswith(suffix):
            text, mult = text[:-1], m
            break
    return int(float(text) * mult)


def human(n: int) -> str:
    for unit, m in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", choices=["nccl", "gloo", "auto"], default="auto",
                   help="nccl (GPU) or gloo (CPU); auto: nccl when CUDA is available")
    p.add_argument("--min-bytes", type=parse_size, default=8)
    p.add_argument("--max-bytes", type=parse_size, default=256 * 2**20)
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (fewer for large sizes)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--budget-bytes", type=parse_size, default=None,
                   help="bytes moved per size at most (caps iterations of large sizes); default 4 GiB nccl, "
                        "512 MiB gloo")
    p.add_argument("--lat-iters", type=int, default=200, help="eager 4 KiB calls timed")
    p.add_argument("--graph-calls", type=int, default=100, help="4 KiB all-reduces captured in one CUDA graph")
    p.add_argument("--graph-replays", type=int, default=20)
    p.add_argument("--mem-fraction", type=float, default=0.125,
                   help="largest buffer at most this fraction of free memory (unified memory: keep headroom)")
    p.add_argument("--timeout", type=float, default=300, help="overall seconds before the probe gives up (exit 124)")
    p.add_argument("--json", dest="json_path", default=None, help="write the result here (rank 0)")
    return p


def write_json(path: str, data: dict) -> None:
    """Write the result; as root (the probe's container), give the file to whoever owns its folder (the SSH
    user's state dir on the node), so the probe never leaves a root-owned file there."""
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
    folder = os.stat(os.path.dirname(os.path.abspath(path)))
    if os.geteuid() == 0 and folder.st_uid != 0:
        os.chown(path, folder.st_uid, folder.st_gid)


def watchdog(seconds: float, rank: int, json_path: str | None) -> threading.Timer:
    def fire():
        msg = f"allreduce_probe: overall timeout of {seconds:g} s reached during {PHASE['name']} (rank {rank})"
        print(msg, file=sys.stderr, flush=True)
        if rank == 0 and json_path:
            try:
                write_json(json_path, dict(PARTIAL, ok=False, error=msg))
            except OSError:
                pass
        os._exit(124)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def teardown_watchdog(seconds: float, rank: int) -> threading.Timer:
    def fire():
        print(f"allreduce_probe: teardown did not finish within {seconds:g} s (rank {rank}); the results are "
              "complete, exiting anyway", file=sys.stderr, flush=True)
        os._exit(0)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def mem_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    args = args_parser().parse_args(argv)
    if "RANK" not in os.environ:  # started without torchrun: one process, a local rendezvous
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29599"))
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timer = watchdog(args.timeout, rank, args.json_path)

    PHASE["name"] = "import torch"
    import torch
    import torch.distributed as dist

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        print("allreduce_probe: --backend nccl needs CUDA; this torch sees no GPU (use --backend gloo)", file=sys.stderr)
        return 2
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    PHASE["name"] = "rendezvous"
    timeout = datetime.timedelta(seconds=max(30.0, args.timeout))
    try:
        dist.init_process_group(backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
    except TypeError:  # older torch: no device_id
        dist.init_process_group(backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    nccl_version = None
    if backend == "nccl":
        try:
            v = torch.cuda.nccl.version()
            nccl_version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001
            nccl_version = None
    me = {"rank": rank, "host": socket.gethostname(), "torch": torch.__version__, "nccl": nccl_version,
          "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
          "master_addr": os.environ.get("MASTER_ADDR", "")}
    ranks: list = [None] * world
    dist.all_gather_object(ranks, me)

    # The largest message every rank can afford: a fraction of free memory, the minimum over ranks.
    free = None
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
    avail = mem_available_bytes()
    if avail is not None:
        free = min(free, avail) if free is not None else avail  # unified memory: the OS pool bounds the GPU too
    cap = args.max_bytes
    capped_by = None
    if free is not None and int(free * args.mem_fraction) < cap:
        cap, capped_by = int(free * args.mem_fraction), f"{args.mem_fraction:g} x free memory ({free / 2**30:.1f} GiB)"
    cap_t = torch.tensor([cap], dtype=torch.float64, device=device)
    dist.all_reduce(cap_t, op=dist.ReduceOp.MIN)
    max_bytes = int(cap_t.item())
    if max_bytes < cap:
        capped_by = capped_by or "another rank's free memory"

    sizes = []
    size = max(FLOAT_BYTES, args.min_bytes)
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    budget = args.budget_bytes or (4 * 2**30 if backend == "nccl" else 512 * 2**20)
    factor = 2 * (world - 1) / world  # nccl-tests all-reduce: 0 for one rank (no bus crossed)
    PARTIAL.update(ok=False, backend=backend, world_size=world, ranks=ranks, rows=[], max_bytes=max_bytes,
                   capped_by=capped_by, simulated=backend != "nccl")

    rows = []
    buf_all = torch.empty(max(sizes) // FLOAT_BYTES if sizes else 1, dtype=torch.float32, device=device)
    expected_sum = world * (world + 1) / 2
    for size in sizes:
        PHASE["name"] = f"all-reduce {human(size)}"
        count = size // FLOAT_BYTES
        buf = buf_all[:count]
        # correctness: every rank contributes rank+1; the sum is n(n+1)/2 everywhere
        buf.fill_(float(rank + 1))
        dist.all_reduce(buf)
        sync()
        wrong = int((buf != expected_sum).sum().item())
        iters = max(2, min(args.iters, budget // size))
        warm = max(1, min(args.warmup, iters // 2))
        buf.zero_()
        for _ in range(warm):
            dist.all_reduce(buf)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        sync()
        elapsed = (time.perf_counter() - t0) / iters
        t = torch.tensor([elapsed, float(wrong)], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time, any rank's errors
        elapsed, wrong = float(t[0].item()), int(t[1].item())
        algbw = size / elapsed / 1e9
        rows.append({"size": size, "count": count, "type": "float", "redop": "sum", "root": -1,
                     "time_us": elapsed * 1e6, "algbw": algbw, "busbw": algbw * factor, "wrong": wrong,
                     "iters": iters})
        PARTIAL["rows"] = rows
    del buf_all

    # 4 KiB: eager calls back to back, then the same all-reduce replayed inside a CUDA graph.
    PHASE["name"] = "4 KiB eager latency"
    lat = {"bytes": 4096, "eager_us": None, "graph_us": None, "ratio": None, "graph_calls": args.graph_calls,
           "graph_error": None}
    small = torch.zeros(1024, dtype=torch.float32, device=device)
    for _ in range(20):
        dist.all_reduce(small)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.lat_iters):
        dist.all_reduce(small)
    sync()
    t = torch.tensor([(time.perf_counter() - t0) / args.lat_iters], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    lat["eager_us"] = float(t.item()) * 1e6
    graph = None
    if backend == "nccl":
        PHASE["name"] = "4 KiB CUDA graph latency"
        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(3):
                    dist.all_reduce(small)
            torch.cuda.current_stream(device).wait_stream(side)
            sync()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(args.graph_calls):
                    dist.all_reduce(small)
            graph.replay()
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.graph_replays):
                graph.replay()
            sync()
            t = torch.tensor([(time.perf_counter() - t0) / (args.graph_replays * args.graph_calls)],
                             dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            lat["graph_us"] = float(t.item()) * 1e6
            lat["ratio"] = lat["graph_us"] / lat["eager_us"] if lat["eager_us"] else None
        except Exception as exc:  # noqa: BLE001 - reported, the sweep result still stands
            lat["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            # Free the graph and drain the device BEFORE destroying the process group: processes that captured
            # NCCL calls did not exit otherwise.
            PHASE["name"] = "teardown"
            if graph is not None:
                try:
                    graph.reset()
                except Exception:  # noqa: BLE001
                    pass
                del graph
                graph = None
            sync()
    else:
        lat["graph_error"] = "not applicable: CUDA graphs need the nccl backend on GPUs"

    result = dict(PARTIAL, ok=True, rows=rows, lat4k=lat,
                  peak_busbw=max((r["busbw"] for r in rows), default=0.0),
                  avg_busbw=sum(r["busbw"] for r in rows) / len(rows) if rows else 0.0,
                  nccl_versions=sorted({str(r["nccl"]) for r in ranks}),
                  torch_versions=sorted({r["torch"] for r in ranks}))
    if rank == 0:
        print(format_table(result), flush=True)
        if args.json_path:
            write_json(args.json_path, result)
    # The figures are out: from here on a hang in teardown must not turn them into a failure.
    timer.cancel()
    teardown = teardown_watchdog(TEARDOWN_TIMEOUT_S, rank)
    PHASE["name"] = "destroy_process_group"
    del small
    sync()
    dist.barrier()
    dist.destroy_process_group()
    teardown.cancel()
    return 0


def format_table(result: dict) -> str:
    """nccl-tests layout (in-place columns only); `parse_nccl_table` in sparkdeploy reads it back."""
    sim = " SIMULATED (gloo on CPU: not a measure of the fabric link)" if result.get("simulated") else ""
    lines = [
        f"# sparkdeploy allreduce_probe: backend {result['backend']}, {result['world_size']} ranks{sim}",
        *(f"#  rank {r['rank']}: host {r['host']} device {r['device']} torch {r['torch']} nccl {r['nccl']}"
          for r in result["ranks"]),
        f"#  max message {human(result['max_bytes'])}" + (f" (capped by {result['capped_by']})"
                                                         if result.get("capped_by") else ""),
        "#",
        "#                                                        in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)",
    ]
    for r in result["rows"]:
        lines.append(f"{r['size']:>12} {r['count']:>13} {r['type']:>9} {r['redop']:>7} {r['root']:>7} "
                     f"{r['time_us']:>8.2f} {r['algbw']:>7.2f} {r['busbw']:>7.2f} {r['wrong']:>6}")
    lines.append("# Out of bounds values : 0 OK")
    lines.append(f"# Avg bus bandwidth    : {result.get('avg_busbw', 0.0):.4f}")
    lines.append(f"# Peak bus bandwidth   : {result.get('peak_busbw', 0.0):.4f}")
    lat = result.get("lat4k") or {}
    if lat:
        eager = f"{lat['eager_us']:.1f} us" if lat.get("eager_us") is not None else "n/a"
        graph = f"{lat['graph_us']:.1f} us" if lat.get("graph_us") is not None else "n/a"
        ratio = f"{lat['ratio']:.2f}" if lat.get("ratio") is not None else "n/a"
        lines.append(f"# 4 KiB all-reduce: eager {eager}, CUDA graph {graph} per call "
                     f"({lat.get('graph_calls')} calls per graph), graph/eager {ratio}"
                     + (f" [{lat['graph_error']}]" if lat.get("graph_error") else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
