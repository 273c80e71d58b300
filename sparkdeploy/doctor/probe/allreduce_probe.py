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
  per size). With NCCL the sweep calls ncclAllReduce directly (ctypes on the libnccl torch loaded: the path
  vLLM's own communicator takes) and times it as nccl-tests does: back-to-back launches on one stream, time to
  completion / iterations, the ranks' mean; the median of --repeats such runs. Then the 4 KiB all-reduce
  latency, one row per path, each naming its method: eager through NCCL directly (vLLM's eager all-reduce
  between graph pieces), the same in vLLM's call shape (a new output tensor per call), eager through
  torch.distributed (for comparison: its per-call launch path costs more), and replayed inside a CUDA graph
  (captured as nccl-tests -G does). graph/eager is what a recipe's eager all-reduce buys or costs: over CX7
  RoCE the seeds measured 18 us eager vs 46 us in a graph; over NVLink the graph wins. Measure, don't assume.

Safety: the largest message is capped by free memory (unified memory on GB10: the GPU allocates from the same
pool as the OS), every rank agrees on the cap; an overall --timeout ends the process (exit 124) even if a
collective hangs; the CUDA graph is freed and the device synchronized before the process group is destroyed
(processes that captured NCCL calls in a graph did not exit otherwise), and the teardown itself is bounded by
what is left of --timeout; rank 0 prints `# teardown: clean in X s` once everything is destroyed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import functools
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
    p.add_argument(
        "--backend",
        choices=["nccl", "gloo", "auto"],
        default="auto",
        help="nccl (GPU) or gloo (CPU); auto: nccl when CUDA is available",
    )
    p.add_argument("--min-bytes", type=parse_size, default=8)
    p.add_argument("--max-bytes", type=parse_size, default=256 * 2**20)
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (fewer for large sizes)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs of --iters per size and per latency row; the median is reported",
    )
    p.add_argument(
        "--budget-bytes",
        type=parse_size,
        default=None,
        help="bytes moved per size at most (caps iterations of large sizes); default 4 GiB nccl, 512 MiB gloo",
    )
    p.add_argument("--lat-iters", type=int, default=200, help="eager 4 KiB calls timed")
    p.add_argument(
        "--graph-calls",
        type=int,
        default=20,
        help="4 KiB all-reduces captured in one CUDA graph (nccl-tests -G: its -n, 20)",
    )
    p.add_argument("--graph-replays", type=int, default=20, help="graph launches timed (nccl-tests -G N)")
    p.add_argument(
        "--method",
        choices=["auto", "nccl-direct", "torch"],
        default="auto",
        help="how the sweep calls NCCL: nccl-direct (ctypes on torch's libnccl, vLLM's path), torch "
        "(torch.distributed); auto: nccl-direct when it binds, else torch",
    )
    p.add_argument("--nccl-library", default=None, help="libnccl to call directly; default: the one torch has loaded")
    p.add_argument(
        "--mem-fraction",
        type=float,
        default=0.125,
        help="largest buffer at most this fraction of free memory (unified memory: keep headroom)",
    )
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

    # Rank 0 goes first: it writes the partial result, and torchrun ends the other ranks once it exits. A rank
    # that fired first would have torchrun kill rank 0 before it could write anything.
    timer = threading.Timer(seconds if rank == 0 else seconds + 2.0, fire)
    timer.daemon = True
    timer.start()
    return timer


def teardown_watchdog(seconds: float, rank: int) -> threading.Timer:
    def fire():
        print(
            f"allreduce_probe: teardown did not finish within {seconds:g} s (rank {rank}); the results are "
            "complete, exiting anyway",
            file=sys.stderr,
            flush=True,
        )
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


class NcclDirect:
    """NCCL called directly through ctypes on the libnccl that torch has loaded: the path vLLM's own communicator
    (PyNcclCommunicator) takes for its all-reduce, eager or captured in a CUDA graph. No torch.distributed work
    objects, no per-call bookkeeping: what is left per call is a Python call into libnccl, as in vLLM."""

    FLOAT32, SUM = 7, 0  # ncclFloat32, ncclSum (nccl.h enums, stable since NCCL 2.0)

    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_byte * 128)]  # NCCL_UNIQUE_ID_BYTES

    def __init__(self, path: str):
        self.path = path
        lib = ctypes.CDLL(path)
        vp, i = ctypes.c_void_p, ctypes.c_int
        signatures = {
            "ncclGetErrorString": (ctypes.c_char_p, [i]),
            "ncclGetVersion": (i, [ctypes.POINTER(i)]),
            "ncclGetUniqueId": (i, [ctypes.POINTER(self.UniqueId)]),
            "ncclCommInitRank": (i, [ctypes.POINTER(vp), i, self.UniqueId, i]),
            "ncclAllReduce": (i, [vp, vp, ctypes.c_size_t, i, i, vp, vp]),
            "ncclCommDestroy": (i, [vp]),
        }
        for name, (restype, argtypes) in signatures.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        self.lib = lib
        self._all_reduce = lib.ncclAllReduce
        # A second handle's ncclAllReduce without argtypes: given ctypes values, it converts nothing per call
        # (the timed loops' launcher; the checked one above is for everything else).
        self._raw_all_reduce = ctypes.CDLL(path).ncclAllReduce
        self._raw_all_reduce.restype = i

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            text = (self.lib.ncclGetErrorString(rc) or b"").decode(errors="replace")
            raise RuntimeError(f"{what}: NCCL error {rc}: {text}")

    def version(self) -> str:
        v = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        code = v.value  # 2.9 and later: major*10000 + minor*100 + patch
        return (
            f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
            if code >= 10000
            else f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
        )

    def unique_id(self) -> bytes:
        uid = self.UniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))

    def init_rank(self, world: int, uid: bytes, rank: int) -> ctypes.c_void_p:
        u = self.UniqueId()
        ctypes.memmove(ctypes.addressof(u), uid, ctypes.sizeof(u))
        comm = ctypes.c_void_p()
        self.check(self.lib.ncclCommInitRank(ctypes.byref(comm), world, u, rank), "ncclCommInitRank")
        return comm

    def all_reduce(self, comm, send: int, recv: int, count: int, stream: int) -> None:
        rc = self._all_reduce(send, recv, count, self.FLOAT32, self.SUM, comm, stream)
        if rc:
            self.check(rc, "ncclAllReduce")

    def launcher(self, comm, send: int, recv: int, count: int, stream: int):
        """One all-reduce with every argument converted once: a call then costs what calling libnccl from
        Python costs, nothing more (nccl-tests' loop calls NCCL from C). Returns NCCL's result code."""
        vp = ctypes.c_void_p
        return functools.partial(
            self._raw_all_reduce,
            vp(send),
            vp(recv),
            ctypes.c_size_t(count),
            ctypes.c_int(self.FLOAT32),
            ctypes.c_int(self.SUM),
            comm,
            vp(stream),
        )

    def destroy(self, comm) -> None:
        self.check(self.lib.ncclCommDestroy(comm), "ncclCommDestroy")


def nccl_library(explicit: str | None) -> str:
    """The libnccl to bind: --nccl-library, else the one this process (torch) has mapped, else the nvidia-nccl
    wheel's beside torch, else the loader's choice. Binding the mapped one keeps one NCCL in the process."""
    if explicit:
        return explicit
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if os.path.basename(path).startswith("libnccl.so"):
                    return path
    except OSError:
        pass
    for entry in sys.path:
        candidate = os.path.join(entry, "nvidia", "nccl", "lib", "libnccl.so.2")
        if os.path.exists(candidate):
            return candidate
    return "libnccl.so.2"


METHODS = {
    "nccl-direct": "ncclAllReduce through ctypes on torch's libnccl, back-to-back launches on one stream, "
    "time to completion / iterations (nccl-tests' method)",
    "torch.distributed": "torch.distributed.all_reduce back to back, time to completion / iterations",
    "eager nccl-direct": "ncclAllReduce through ctypes, in place, arguments converted once, launched from "
    "Python one by one back to back (the NCCL call vLLM's communicator makes, nothing else)",
    "eager nccl-vllm": "the same call in vLLM's PyNcclCommunicator shape: out of place into a new tensor per call "
    "(torch.empty_like), pointers read per call, stream looked up once",
    "eager torch.distributed": "torch.distributed.all_reduce in place, launched from Python one by one",
    "graph nccl-direct": "ncclAllReduce in place, {calls} calls captured in one CUDA graph (thread-local capture), "
    "the graph launched {replays} times back to back, time / (calls x launches) "
    "(nccl-tests -G {replays} -n {calls})",
}


def main(argv: list[str] | None = None) -> int:
    args = args_parser().parse_args(argv)
    started = time.monotonic()
    if "RANK" not in os.environ:  # started without torchrun: one process, a local rendezvous
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=os.environ.get("MASTER_PORT", "29599"),
        )
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
        print(
            "allreduce_probe: --backend nccl needs CUDA; this torch sees no GPU (use --backend gloo)", file=sys.stderr
        )
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

    def mean_over_ranks(seconds: float) -> float:
        """nccl-tests reports the ranks' average time."""
        t = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return float(t.item()) / world

    nccl_version = None
    if backend == "nccl":
        try:
            v = torch.cuda.nccl.version()
            nccl_version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - a torch built without NCCL raises RuntimeError/AttributeError: no version
            nccl_version = None
    me = {
        "rank": rank,
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "nccl": nccl_version,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "master_addr": os.environ.get("MASTER_ADDR", ""),
    }
    ranks: list = [None] * world
    dist.all_gather_object(ranks, me)

    # NCCL called directly (vLLM's path): one communicator of our own beside torch's, as vLLM has.
    PHASE["name"] = "NCCL direct: communicator"
    direct, comm = None, None
    direct_info: dict = {"library": None, "version": None, "error": None}
    if backend == "nccl" and args.method in ("auto", "nccl-direct"):
        try:
            direct = NcclDirect(nccl_library(args.nccl_library))
            direct_info.update(library=direct.path, version=direct.version())
        except Exception as exc:  # noqa: BLE001 - every rank reaches the same verdict below
            direct_info["error"] = f"{type(exc).__name__}: {exc}"[:300]
            direct = None
        states: list = [None] * world
        dist.all_gather_object(states, direct is not None)
        if all(states):
            holder = [direct.unique_id() if rank == 0 else None]  # type: ignore[union-attr]  # every rank has one: all(states)
            dist.broadcast_object_list(holder, src=0)
            comm = direct.init_rank(world, holder[0], rank)  # type: ignore[arg-type, union-attr]  # every rank has one: all(states); rank 0 broadcast the id
        else:
            direct_info["error"] = direct_info["error"] or "another rank could not bind libnccl"
            direct = None
        if args.method == "nccl-direct" and direct is None:
            print(f"allreduce_probe: --method nccl-direct: {direct_info['error']}", file=sys.stderr)
            return 2
    sweep_method = "nccl-direct" if direct is not None else "torch.distributed"
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None

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
    PARTIAL.update(
        ok=False,
        backend=backend,
        world_size=world,
        ranks=ranks,
        rows=[],
        max_bytes=max_bytes,
        capped_by=capped_by,
        simulated=backend != "nccl",
        sweep_method=sweep_method,
        nccl_direct=direct_info,
    )

    def in_place(buf):
        """One in-place all-reduce of buf, launched the sweep's way."""
        if direct is not None:
            return direct.launcher(comm, buf.data_ptr(), buf.data_ptr(), buf.numel(), stream.cuda_stream)
        return lambda: dist.all_reduce(buf)

    def per_call(launch, iters: int) -> float:
        """Seconds per call: iters launches back to back, then wait for the device (nccl-tests' BenchTime).
        The barrier is drained on the device first, so every rank starts its clock at about the same moment."""
        sync()
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        codes = [launch() for _ in range(iters)]
        sync()
        elapsed = time.perf_counter() - t0
        failed = next((c for c in codes if c), 0)  # launchers that return NCCL's code; the others return None
        if failed and direct is not None:
            direct.check(failed, "ncclAllReduce")
        return mean_over_ranks(elapsed / iters)

    def median_per_call(launch, iters: int) -> float:
        """The median of --repeats timed runs: one run of a few microsecond calls is at the mercy of the host."""
        runs = sorted(per_call(launch, iters) for _ in range(max(1, args.repeats)))
        return runs[len(runs) // 2]

    on_stream = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    rows = []
    lat = {
        "bytes": 4096,
        "eager_us": None,
        "eager_method": None,
        "graph_us": None,
        "graph_method": None,
        "ratio": None,
        "graph_calls": args.graph_calls,
        "graph_replays": args.graph_replays,
        "graph_error": None,
        "rows": [],
    }
    graph = None
    with on_stream:
        buf = launch = None
        buf_all = torch.empty(max(sizes) // FLOAT_BYTES if sizes else 1, dtype=torch.float32, device=device)
        expected_sum = world * (world + 1) / 2
        for size in sizes:
            PHASE["name"] = f"all-reduce {human(size)}"
            count = size // FLOAT_BYTES
            buf = buf_all[:count]
            launch = in_place(buf)
            # correctness: every rank contributes rank+1; the sum is n(n+1)/2 everywhere
            buf.fill_(float(rank + 1))
            launch()
            sync()
            wrong = int((buf != expected_sum).sum().item())
            iters = max(2, min(args.iters, budget // size))
            for _ in range(max(1, min(args.warmup, iters // 2))):
                launch()
            elapsed = median_per_call(launch, iters)
            w = torch.tensor([float(wrong)], dtype=torch.float64, device=device)
            dist.all_reduce(w, op=dist.ReduceOp.MAX)  # any rank's errors
            algbw = size / elapsed / 1e9
            rows.append(
                {
                    "size": size,
                    "count": count,
                    "type": "float",
                    "redop": "sum",
                    "root": -1,
                    "time_us": elapsed * 1e6,
                    "algbw": algbw,
                    "busbw": algbw * factor,
                    "wrong": int(w.item()),
                    "iters": iters,
                    "repeats": max(1, args.repeats),
                }
            )
            PARTIAL["rows"] = rows
        del buf_all, buf, launch

        # 4 KiB, the size of a decode step's all-reduce: each path vLLM could take, one row each.
        small = torch.zeros(1024, dtype=torch.float32, device=device)

        def latency_row(key: str, launch, iters: int, calls: int | None = None) -> float:
            for _ in range(20):
                launch()
            us = median_per_call(launch, iters) * 1e6 / (calls or 1)
            mode, path = key.split(" ", 1)
            lat["rows"].append(
                {
                    "id": key,
                    "mode": mode,
                    "path": path,
                    "us": us,
                    "method": METHODS[key].format(calls=args.graph_calls, replays=args.graph_replays),
                }
            )
            return us

        if direct is not None:
            PHASE["name"] = "4 KiB eager latency (NCCL direct)"

            lat["eager_us"] = latency_row("eager nccl-direct", in_place(small), args.lat_iters)
            lat["eager_method"] = "eager nccl-direct"
            vllm_stream = stream.cuda_stream  # type: ignore[union-attr]  # a CUDA device on this path: a stream

            def eager_vllm():
                out = torch.empty_like(small)
                direct.all_reduce(comm, small.data_ptr(), out.data_ptr(), small.numel(), vllm_stream)

            latency_row("eager nccl-vllm", eager_vllm, args.lat_iters)
        PHASE["name"] = "4 KiB eager latency (torch.distributed)"
        torch_us = latency_row("eager torch.distributed", lambda: dist.all_reduce(small), args.lat_iters)
        if lat["eager_us"] is None:
            lat["eager_us"], lat["eager_method"] = torch_us, "eager torch.distributed"

        if direct is not None:
            PHASE["name"] = "4 KiB CUDA graph latency (NCCL direct)"
            try:
                graph = torch.cuda.CUDAGraph()
                try:  # nccl-tests captures thread-locally: NCCL may allocate during capture
                    capture = torch.cuda.graph(graph, capture_error_mode="thread_local")
                except TypeError:
                    capture = torch.cuda.graph(graph)
                with capture:
                    s = torch.cuda.current_stream(device).cuda_stream
                    captured = direct.launcher(comm, small.data_ptr(), small.data_ptr(), small.numel(), s)
                    for _ in range(args.graph_calls):
                        direct.check(captured(), "ncclAllReduce (capture)")
                lat["graph_us"] = latency_row(
                    "graph nccl-direct", graph.replay, args.graph_replays, calls=args.graph_calls
                )
                lat["graph_method"] = "graph nccl-direct"
                lat["ratio"] = lat["graph_us"] / lat["eager_us"] if lat["eager_us"] else None
            except Exception as exc:  # noqa: BLE001 - reported, the sweep result still stands
                lat["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
            finally:
                # Free the graph and drain the device BEFORE any communicator goes: processes that captured
                # NCCL calls did not exit otherwise.
                PHASE["name"] = "teardown: CUDA graph"
                if graph is not None:
                    try:
                        graph.reset()
                    except Exception:  # noqa: BLE001 - teardown: a graph that failed to capture may not reset
                        pass
                    graph = None
                sync()
        elif backend == "nccl":
            lat["graph_error"] = f"not measured: NCCL could not be called directly ({direct_info['error']})"
        else:
            lat["graph_error"] = "not applicable: CUDA graphs need the nccl backend on GPUs"
        sync()

    result = dict(
        PARTIAL,
        ok=True,
        rows=rows,
        lat4k=lat,
        peak_busbw=max((r["busbw"] for r in rows), default=0.0),
        avg_busbw=sum(r["busbw"] for r in rows) / len(rows) if rows else 0.0,
        nccl_versions=sorted({str(r["nccl"]) for r in ranks}),
        torch_versions=sorted({r["torch"] for r in ranks}),
    )
    if rank == 0:
        print(format_table(result), flush=True)
        if args.json_path:
            write_json(args.json_path, result)
    # The figures are out: from here on a hang in teardown must not turn them into a failure, and the whole
    # run still ends within --timeout.
    timer.cancel()
    left = args.timeout - (time.monotonic() - started)
    teardown = teardown_watchdog(max(5.0, min(TEARDOWN_TIMEOUT_S, left)), rank)
    t0 = time.monotonic()
    PHASE["name"] = "teardown: communicators"
    small = None  # type: ignore[assignment]  # frees the tensor (the closures above share its cell, so `del` would leave them a dangling name)
    sync()
    if comm is not None:
        direct.destroy(comm)  # type: ignore[union-attr]  # a comm comes from direct
    dist.barrier()
    dist.destroy_process_group()
    teardown.cancel()
    if rank == 0:
        print(f"# teardown: clean in {time.monotonic() - t0:.2f} s", flush=True)
    return 0


def format_table(result: dict) -> str:
    """nccl-tests layout (in-place columns only), then one line per 4 KiB latency row with its method;
    `parse_nccl_table` in sparkdeploy reads it back."""
    sim = " SIMULATED (gloo on CPU: not a measure of the fabric link)" if result.get("simulated") else ""
    sweep = result.get("sweep_method") or "torch.distributed"
    direct = result.get("nccl_direct") or {}
    lines = [
        f"# sparkdeploy allreduce_probe: backend {result['backend']}, {result['world_size']} ranks{sim}",
        *(
            f"#  rank {r['rank']}: host {r['host']} device {r['device']} torch {r['torch']} nccl {r['nccl']}"
            for r in result["ranks"]
        ),
        f"#  max message {human(result['max_bytes'])}"
        + (f" (capped by {result['capped_by']})" if result.get("capped_by") else ""),
        f"#  sweep method: {sweep}: {METHODS.get(sweep, '')}",
    ]
    if direct.get("library") or direct.get("error"):
        lines.append(
            f"#  NCCL direct: {direct.get('library')} (NCCL {direct.get('version')})"
            + (f" [{direct['error']}]" if direct.get("error") else "")
        )
    lines += [
        "#",
        "#                                                        in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['size']:>12} {r['count']:>13} {r['type']:>9} {r['redop']:>7} {r['root']:>7} "
            f"{r['time_us']:>8.2f} {r['algbw']:>7.2f} {r['busbw']:>7.2f} {r['wrong']:>6}"
        )
    lines.append("# Out of bounds values : 0 OK")
    lines.append(f"# Avg bus bandwidth    : {result.get('avg_busbw', 0.0):.4f}")
    lines.append(f"# Peak bus bandwidth   : {result.get('peak_busbw', 0.0):.4f}")
    lat = result.get("lat4k") or {}
    if lat:
        lines.append("# 4 KiB all-reduce latency per call (mean of the ranks), one row per path:")
        for row in lat.get("rows", []):
            lines.append(f"#  latency {row['id']:<24} {row['us']:>8.2f} us  {row['method']}")
        eager = f"{lat['eager_us']:.1f} us" if lat.get("eager_us") is not None else "n/a"
        graph = f"{lat['graph_us']:.1f} us" if lat.get("graph_us") is not None else "n/a"
        ratio = f"{lat['ratio']:.2f}" if lat.get("ratio") is not None else "n/a"
        lines.append(
            f"# 4 KiB all-reduce: eager {eager}, CUDA graph {graph} per call "
            f"({lat.get('graph_calls')} calls per graph), graph/eager {ratio}"
            + (f" [{lat['graph_error']}]" if lat.get("graph_error") else "")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
