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
  per size), and host (us): what queueing one call cost the slowest rank's host. With NCCL the sweep calls
  ncclAllReduce directly (ctypes on the libnccl torch loaded: the path vLLM's own communicator takes) and times
  it as nccl-tests' BenchTime does: one all-reduce of the size, waited for (it lines the ranks up within
  microseconds: the collective is the barrier), then the clock, --iters launches back to back on one stream (each
  at the next offset of the buffer, as nccl-tests shifts them), the wait for the stream, the clock; time /
  iterations, the ranks' mean. --repeats cycles over the whole sweep (nccl-tests -N); each size reports its
  median. The launches are queued from C (itertools.starmap over argument tuples converted once), so what Python
  adds per call is ctypes' own call and what it does to NCCL's host work: the probe measures the first, its floor
  (the same loop calling a C function that does nothing), and prints it above the table (the whole, measured
  against the same loop in C, benchmarks/nccl_mp_ref.cu, is in docs/benchmarks.md); a row whose time is its host
  time is bound by the host, not the link: at the smallest sizes, mostly.
  Then the 4 KiB all-reduce latency, one row per path, each naming its method: eager through NCCL directly
  (vLLM's eager all-reduce between graph pieces), the same in vLLM's call shape (a new output tensor per call),
  eager through torch.distributed (for comparison: its per-call launch path costs more), and replayed inside a
  CUDA graph (captured as nccl-tests -G does). graph/eager is what a recipe's eager all-reduce buys or costs: over
  CX7 RoCE the seeds measured 18 us eager vs 46 us in a graph; over NVLink the graph wins. Measure, don't assume.

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
import itertools
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: torch is imported in main, after the watchdog starts
    import torch

    # One all-reduce's arguments in their C types (NcclDirect.call_args).
    CallArgs = tuple[
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p
    ]
    # One timed run (Measure.timed): seconds per call, each rank's host seconds per call, the ranks' start skew.
    Sample = tuple[float, list[float], float | None]
    # One size of the sweep: size, count, iterations, its timed loop, its line-up, wrong elements.
    Plan = tuple[int, int, int, Callable[[], list[Any]], Callable[[], None], int]

FLOAT_BYTES = 4
TEARDOWN_TIMEOUT_S = 60
PHASE = {"name": "start"}
PARTIAL: dict[str, Any] = {}
# torchrun's environment for a probe started without it: one process, a local rendezvous (its port: MASTER_PORT
# where set, else 29599).
SINGLE_PROCESS = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}


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
        help="cycles over the whole sweep (nccl-tests -N) and timed runs per latency row; medians are reported",
    )
    p.add_argument(
        "--line-up",
        choices=["auto", "collective", "barrier"],
        default="auto",
        help="how the ranks are lined up before each timed run: collective (nccl-tests' BenchTime: one\n"
        "all-reduce of the size on the timed communicator, waited for), barrier (torch.distributed.barrier,\n"
        "then a device sync); auto: collective when NCCL is called directly",
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


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write the result; as root (the probe's container), give the file to whoever owns its folder (the SSH
    user's state dir on the node), so the probe never leaves a root-owned file there."""
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
    folder = os.stat(os.path.dirname(os.path.abspath(path)))
    if os.geteuid() == 0 and folder.st_uid != 0:
        os.chown(path, folder.st_uid, folder.st_gid)


def watchdog(seconds: float, rank: int, json_path: str | None) -> threading.Timer:
    def fire() -> None:
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
    def fire() -> None:
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
        self.raw_all_reduce = ctypes.CDLL(path).ncclAllReduce
        self.raw_all_reduce.restype = i

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

    def all_reduce(self, comm: ctypes.c_void_p, send: int, recv: int, count: int, stream: int) -> None:
        rc = self._all_reduce(send, recv, count, self.FLOAT32, self.SUM, comm, stream)
        if rc:
            self.check(rc, "ncclAllReduce")

    def call_args(self, comm: ctypes.c_void_p, send: int, recv: int, count: int, stream: int) -> CallArgs:
        """The arguments of one float32 sum all-reduce, each converted to its C type once: raw_all_reduce called
        with them converts nothing more (nccl-tests' loop calls NCCL from C; this is as close as Python gets)."""
        vp = ctypes.c_void_p
        return (
            vp(send),
            vp(recv),
            ctypes.c_size_t(count),
            ctypes.c_int(self.FLOAT32),
            ctypes.c_int(self.SUM),
            comm,
            vp(stream),
        )

    def launcher(self, comm: ctypes.c_void_p, send: int, recv: int, count: int, stream: int) -> Callable[[], int]:
        """One all-reduce, arguments converted once; returns NCCL's result code."""
        return functools.partial(self.raw_all_reduce, *self.call_args(comm, send, recv, count, stream))

    def destroy(self, comm: ctypes.c_void_p) -> None:
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


def launch_loop(fn: Callable[..., Any], arglist: list[CallArgs]) -> Callable[[], list[Any]]:
    """Every call queued back to back from C: itertools.starmap calls fn on each prebuilt argument tuple, so no
    Python frame runs per call; the result codes come back as a list."""
    return lambda: list(itertools.starmap(fn, arglist))


def python_call_floor(args: CallArgs, calls: int = 2000, runs: int = 5) -> float | None:
    """Seconds per call that the timed loop itself costs: the same loop (launch_loop) calling, through ctypes and
    with the same arguments, a C function that does nothing with them (libc's labs). No launch from Python can
    cost less; what a row's host time has beyond it is NCCL's own host work, which nccl-tests pays too."""
    try:
        stub = ctypes.CDLL(None).labs
    except (OSError, AttributeError):
        return None
    stub.restype = ctypes.c_int
    loop = launch_loop(stub, list(itertools.repeat(args, calls)))
    loop()  # warm
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        loop()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def medians(samples: list[Sample]) -> dict[str, Any]:
    """One figure per field over timed runs (Measure.timed's tuples): the median of each."""
    skews = [s[2] for s in samples]
    return {
        "s": statistics.median(s[0] for s in samples),
        "host_s": statistics.median(statistics.mean(s[1]) for s in samples),
        "host_max_s": statistics.median(max(s[1]) for s in samples),
        "host_min_s": statistics.median(min(s[1]) for s in samples),
        "host_ranks_s": [statistics.median(s[1][r] for s in samples) for r in range(len(samples[0][1]))],
        "skew_s": None if None in skews else statistics.median(skews),  # type: ignore[type-var]  # no None left
    }


LINE_UP = {
    "collective": "before each, one all-reduce of the size on the timed communicator, waited for (nccl-tests' "
    "BenchTime); the clock runs from the first launch to the stream's end",
    "barrier": "before each, torch.distributed.barrier between device syncs; the clock runs from the first launch "
    "to the stream's end",
}
METHODS = {
    "nccl-direct": "ncclAllReduce through ctypes on torch's libnccl, launches queued back to back from C "
    "(itertools.starmap) on one stream, each at the next slot of the buffer, time to completion / iterations "
    "(nccl-tests' method)",
    "torch.distributed": "torch.distributed.all_reduce back to back, time to completion / iterations",
    "eager nccl-direct": "ncclAllReduce through ctypes, in place, arguments converted once, launches queued "
    "back to back from C (itertools.starmap) (the NCCL call vLLM's communicator makes, nothing else)",
    "eager nccl-vllm": "the same call in vLLM's PyNcclCommunicator shape: out of place into a new tensor per call "
    "(torch.empty_like), pointers read per call, stream looked up once",
    "eager torch.distributed": "torch.distributed.all_reduce in place, launched from Python one by one",
    "graph nccl-direct": "ncclAllReduce in place, {calls} calls captured in one CUDA graph (thread-local capture), "
    "the graph launched {replays} times back to back, time / (calls x launches) "
    "(nccl-tests -G {replays} -n {calls})",
}


def torch_loop(dist: ModuleType, buf: torch.Tensor, n: int) -> list[Any]:
    """n in-place all-reduces through torch.distributed (the sweep without NCCL direct: gloo, or no libnccl)."""
    return [dist.all_reduce(buf) for _ in range(n)]


def sweep_row(plan: Plan, m: dict[str, Any], factor: float, cycles: int) -> dict[str, Any]:
    size, count, iters, _loop, _line_up, wrong = plan
    algbw = size / m["s"] / 1e9
    return {
        "size": size,
        "count": count,
        "type": "float",
        "redop": "sum",
        "root": -1,
        "time_us": m["s"] * 1e6,
        "algbw": algbw,
        "busbw": algbw * factor,
        "wrong": wrong,
        "host_us": m["host_s"] * 1e6,
        "host_max_us": m["host_max_s"] * 1e6,
        "host_min_us": m["host_min_s"] * 1e6,
        "host_ranks_us": [h * 1e6 for h in m["host_ranks_s"]],
        "start_skew_us": m["skew_s"] * 1e6 if m["skew_s"] is not None else None,
        "iters": iters,
        "repeats": cycles,
    }


class Measure:
    """The probe's timed runs, each as nccl-tests' BenchTime times one: line the ranks up, start the clock, queue
    the launches back to back, wait for the stream, stop the clock; per call, the ranks' mean. Each run also keeps
    the host's share (the clock when the last launch was queued) and, with every rank on one host (one clock), how
    far apart the ranks started."""

    def __init__(
        self,
        args: argparse.Namespace,
        torch: ModuleType,
        dist: ModuleType,
        device: torch.device,
        rank: int,
        world: int,
        direct: NcclDirect | None,
        comm: ctypes.c_void_p | None,
        stream: torch.cuda.Stream | None,
        same_host: bool,
    ) -> None:
        self.args, self.torch, self.dist, self.device = args, torch, dist, device
        self.rank, self.world, self.same_host = rank, world, same_host
        self.direct, self.comm, self.stream = direct, comm, stream
        self.collective = direct is not None and args.line_up != "barrier"
        self.line_up_method = "collective" if self.collective else "barrier"

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def wait(self) -> Callable[[], None]:
        """What ends a timed run: the stream's work done (nccl-tests polls its stream); the device, without one."""
        return self.stream.synchronize if self.stream is not None else self.sync

    def cuda_stream(self) -> int:
        """The timed stream's handle, for NCCL direct (which runs on GPUs only, so with a stream)."""
        if self.stream is None:
            raise RuntimeError("NCCL direct without a CUDA stream")
        return int(self.stream.cuda_stream)

    def communicator(self) -> ctypes.c_void_p:
        """Our NCCL communicator, for NCCL direct (bound with it: bind_nccl)."""
        if self.comm is None:
            raise RuntimeError("NCCL direct without a communicator")
        return self.comm

    def barrier(self) -> None:
        self.sync()
        self.dist.barrier()
        self.sync()

    def line_up(self, call: CallArgs | None) -> Callable[[], None]:
        """Before each timed run. collective: one all-reduce with these arguments on the timed communicator, waited
        for (nccl-tests' BenchTime does the same before its clock): every rank leaves it within microseconds of the
        others, the launch path warm. barrier: torch.distributed.barrier between device syncs."""
        if not self.collective or call is None or self.direct is None:  # collective: with NCCL direct only
            return self.barrier
        fn, wait = self.direct.raw_all_reduce, self.wait()

        def collective() -> None:
            self.check_codes([fn(*call)])
            wait()

        return collective

    def check_codes(self, codes: list[Any]) -> None:
        failed = next((c for c in codes if isinstance(c, int) and c), 0)  # NCCL's codes; torch's calls give None
        if failed and self.direct is not None:
            self.direct.check(failed, "ncclAllReduce")

    def timed(self, loop: Callable[[], list[Any]], iters: int, line_up: Callable[[], None]) -> Sample:
        """One timed run, per call: (seconds, each rank's host seconds to queue it, the start skew between the
        ranks). Host-bound, the slowest rank sets the pace."""
        wait = self.wait()
        line_up()
        t0 = time.perf_counter()
        codes = loop()
        t1 = time.perf_counter()
        wait()
        t2 = time.perf_counter()
        self.check_codes(codes)
        torch, dist = self.torch, self.dist
        mean = torch.tensor([(t2 - t0) / iters], dtype=torch.float64, device=self.device)
        dist.all_reduce(mean)  # nccl-tests reports the ranks' average time
        hosts = [torch.zeros(1, dtype=torch.float64, device=self.device) for _ in range(self.world)]
        dist.all_gather(hosts, torch.tensor([(t1 - t0) / iters], dtype=torch.float64, device=self.device))
        starts = torch.tensor([t0, -t0], dtype=torch.float64, device=self.device)
        dist.all_reduce(starts, op=dist.ReduceOp.MAX)  # the last start, and minus the first one
        last, first = starts.tolist()
        return (
            float(mean.item()) / self.world,
            [float(h.item()) for h in hosts],
            last + first if self.same_host else None,
        )

    def sweep(self, sizes: list[int], budget: int, factor: float) -> list[dict[str, Any]]:
        """Every size checked and warmed once, then --repeats cycles over the whole sweep (nccl-tests -N): a slow
        moment of the host lands in one cycle of every size, not in every cycle of one size."""
        torch, dist, args, direct = self.torch, self.dist, self.args, self.direct
        buf_all = torch.empty(max(sizes) // FLOAT_BYTES, dtype=torch.float32, device=self.device)
        expected_sum = self.world * (self.world + 1) / 2
        plans: list[Plan] = []
        for size in sizes:
            PHASE["name"] = f"all-reduce {human(size)}"
            count = size // FLOAT_BYTES
            iters = max(2, min(args.iters, budget // size))
            warm = max(1, min(args.warmup, iters // 2))
            buf = buf_all[:count]
            if direct is not None:
                # as nccl-tests, each iteration at the next size-long slot of the buffer (slot 0 is buf)
                steps, base, s = max(1, max(sizes) // size), buf_all.data_ptr(), self.cuda_stream()
                slots = [base + size * (i % steps) for i in range(iters)]
                calls = [direct.call_args(self.communicator(), p, p, count, s) for p in slots]
                loop, warm_loop = (
                    launch_loop(direct.raw_all_reduce, calls),
                    launch_loop(direct.raw_all_reduce, calls[:warm]),
                )
                once = launch_loop(direct.raw_all_reduce, calls[:1])
                line_up = self.line_up(calls[0])
            else:
                loop = functools.partial(torch_loop, dist, buf, iters)
                warm_loop = functools.partial(torch_loop, dist, buf, warm)
                once = functools.partial(torch_loop, dist, buf, 1)
                line_up = self.barrier
            # correctness: every rank contributes rank+1; the sum is n(n+1)/2 everywhere
            buf.fill_(float(self.rank + 1))
            self.check_codes(once())
            self.sync()
            w = torch.tensor([float((buf != expected_sum).sum().item())], dtype=torch.float64, device=self.device)
            dist.all_reduce(w, op=dist.ReduceOp.MAX)  # any rank's errors
            self.check_codes(warm_loop())
            plans.append((size, count, iters, loop, line_up, int(w.item())))
        samples: dict[int, list[Sample]] = {size: [] for size in sizes}
        rows: list[dict[str, Any]] = []
        for cycle in range(max(1, args.repeats)):
            for size, _count, iters, loop, line_up, _wrong in plans:
                PHASE["name"] = f"all-reduce {human(size)}, cycle {cycle + 1}"
                samples[size].append(self.timed(loop, iters, line_up))
            rows = [sweep_row(plan, medians(samples[plan[0]]), factor, cycle + 1) for plan in plans]
            PARTIAL["rows"] = rows
        self.sync()
        return rows

    def latency(self, lat: dict[str, Any]) -> None:
        """4 KiB, the size of a decode step's all-reduce: each path vLLM could take, one row each, into lat."""
        torch, dist, args, direct = self.torch, self.dist, self.args, self.direct
        small = torch.zeros(1024, dtype=torch.float32, device=self.device)
        call = (
            direct.call_args(self.communicator(), small.data_ptr(), small.data_ptr(), 1024, self.cuda_stream())
            if direct
            else None
        )
        line_up = self.line_up(call)

        def row(key: str, loop: Callable[[], Any], iters: int, calls: int = 1) -> float:
            loop()  # warm
            m = medians([self.timed(loop, iters, line_up) for _ in range(max(1, args.repeats))])
            mode, path = key.split(" ", 1)
            lat["rows"].append(
                {
                    "id": key,
                    "mode": mode,
                    "path": path,
                    "us": m["s"] * 1e6 / calls,
                    "host_us": m["host_s"] * 1e6 / calls,
                    "host_max_us": m["host_max_s"] * 1e6 / calls,
                    "method": METHODS[key].format(calls=args.graph_calls, replays=args.graph_replays),
                }
            )
            return float(m["s"] * 1e6 / calls)

        if direct is not None and call is not None:
            PHASE["name"] = "4 KiB eager latency (NCCL direct)"
            fn, n = direct.raw_all_reduce, args.lat_iters
            lat["eager_us"] = row("eager nccl-direct", launch_loop(fn, [call] * n), n)
            lat["eager_method"] = "eager nccl-direct"
            vllm_stream, comm = self.cuda_stream(), self.communicator()

            def eager_vllm() -> None:
                out = torch.empty_like(small)
                direct.all_reduce(comm, small.data_ptr(), out.data_ptr(), small.numel(), vllm_stream)

            # one Python call per all-reduce, as vLLM makes it: the list holds their Nones
            row("eager nccl-vllm", lambda: [eager_vllm() for _ in range(n)], n)  # type: ignore[func-returns-value]
        PHASE["name"] = "4 KiB eager latency (torch.distributed)"
        torch_us = row(
            "eager torch.distributed", functools.partial(torch_loop, dist, small, args.lat_iters), args.lat_iters
        )
        if lat["eager_us"] is None:
            lat["eager_us"], lat["eager_method"] = torch_us, "eager torch.distributed"
        if direct is None:
            lat["graph_error"] = (
                f"not measured: NCCL could not be called directly ({PARTIAL['nccl_direct']['error']})"
                if self.device.type == "cuda"
                else "not applicable: CUDA graphs need the nccl backend on GPUs"
            )
            return
        self.graph_latency(lat, direct, small, row)

    def graph_latency(
        self, lat: dict[str, Any], direct: NcclDirect, small: torch.Tensor, row: Callable[..., float]
    ) -> None:
        """The 4 KiB all-reduce replayed inside a CUDA graph (captured as nccl-tests -G does) into lat, or why not;
        the graph freed and the device drained after, before any communicator goes."""
        torch, args = self.torch, self.args
        PHASE["name"] = "4 KiB CUDA graph latency (NCCL direct)"
        graph = None
        try:
            graph = torch.cuda.CUDAGraph()
            try:  # nccl-tests captures thread-locally: NCCL may allocate during capture
                capture = torch.cuda.graph(graph, capture_error_mode="thread_local")
            except TypeError:
                capture = torch.cuda.graph(graph)
            with capture:
                s = torch.cuda.current_stream(self.device).cuda_stream
                captured = direct.launcher(self.communicator(), small.data_ptr(), small.data_ptr(), small.numel(), s)
                for _ in range(args.graph_calls):
                    direct.check(captured(), "ncclAllReduce (capture)")
            replays = args.graph_replays
            lat["graph_us"] = row(
                "graph nccl-direct", lambda: [graph.replay() for _ in range(replays)], replays, args.graph_calls
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
            self.sync()

    def floor(self) -> float | None:
        """Python's own cost per call of the timed loop (python_call_floor), the ranks' mean; None without NCCL
        direct (the torch.distributed loop has no such floor to show)."""
        if self.direct is None:
            return None
        vp = ctypes.c_void_p
        args = (vp(0), vp(0), ctypes.c_size_t(1024), ctypes.c_int(7), ctypes.c_int(0), self.communicator(), vp(0))
        local = python_call_floor(args)
        t = self.torch.tensor([local if local is not None else -1.0], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN)  # any rank without a figure: none
        if t.item() < 0:
            return None
        t.fill_(local)  # every rank has one: the minimum was not negative
        self.dist.all_reduce(t)
        return float(t.item()) / self.world


def main(argv: list[str] | None = None) -> int:
    args = args_parser().parse_args(argv)
    started = time.monotonic()
    if "RANK" not in os.environ:  # started without torchrun: one process, a local rendezvous
        os.environ.update(SINGLE_PROCESS, MASTER_PORT=os.environ.get("MASTER_PORT", "29599"))
    rank = int(os.environ.get("RANK", "0"))
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
    rank, world = rendezvous(args, dist, backend, device)
    ranks = rank_facts(torch, dist, backend, device, rank, world)

    # NCCL called directly (vLLM's path): one communicator of our own beside torch's, as vLLM has.
    PHASE["name"] = "NCCL direct: communicator"
    direct, comm, direct_info = None, None, {"library": None, "version": None, "error": None}
    if backend == "nccl" and args.method in ("auto", "nccl-direct"):
        direct, comm = bind_nccl(args, dist, rank, world, direct_info)
        if args.method == "nccl-direct" and direct is None:
            print(f"allreduce_probe: --method nccl-direct: {direct_info['error']}", file=sys.stderr)
            return 2
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None  # type: ignore[no-untyped-call]  # torch leaves Stream.__new__ unannotated
    measure = Measure(
        args, torch, dist, device, rank, world, direct, comm, stream, same_host=len({r["host"] for r in ranks}) == 1
    )

    max_bytes, capped_by = largest_message(args, torch, dist, device)
    sizes = doubling(max(FLOAT_BYTES, args.min_bytes), max_bytes)
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
        sweep_method="nccl-direct" if direct is not None else "torch.distributed",
        line_up=measure.line_up_method,
        nccl_direct=direct_info,
    )
    lat = latency_record(args)
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        rows = measure.sweep(sizes, budget, factor) if sizes else []
        measure.latency(lat)
        PHASE["name"] = "python floor"
        floor = measure.floor()
        measure.sync()

    result = finished(rows, lat, floor, ranks)
    if rank == 0:
        print(format_table(result), flush=True)
        if args.json_path:
            write_json(args.json_path, result)
    # The figures are out: from here on a hang in teardown must not turn them into a failure, and the whole
    # run still ends within --timeout.
    timer.cancel()
    teardown(args.timeout - (time.monotonic() - started), rank, measure, dist)
    return 0


def doubling(first: int, last: int) -> list[int]:
    """The sweep's sizes: `first`, doubled while it is at most `last`."""
    sizes = []
    size = first
    while size <= last:
        sizes.append(size)
        size *= 2
    return sizes


def finished(
    rows: list[dict[str, Any]], lat: dict[str, Any], floor: float | None, ranks: list[dict[str, Any]]
) -> dict[str, Any]:
    """The whole result: what PARTIAL holds, the sweep's rows and their summary, the latency, the Python floor."""
    return dict(
        PARTIAL,
        ok=True,
        rows=rows,
        lat4k=lat,
        python_floor_us=floor * 1e6 if floor is not None else None,
        peak_busbw=max((r["busbw"] for r in rows), default=0.0),
        avg_busbw=sum(r["busbw"] for r in rows) / len(rows) if rows else 0.0,
        nccl_versions=sorted({str(r["nccl"]) for r in ranks}),
        torch_versions=sorted({r["torch"] for r in ranks}),
    )


def rendezvous(args: argparse.Namespace, dist: ModuleType, backend: str, device: torch.device) -> tuple[int, int]:
    """The process group (torchrun's environment), bounded by --timeout; returns (rank, world size)."""
    PHASE["name"] = "rendezvous"
    timeout = datetime.timedelta(seconds=max(30.0, args.timeout))
    try:
        dist.init_process_group(backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
    except TypeError:  # older torch: no device_id
        dist.init_process_group(backend, timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def rank_facts(
    torch: ModuleType, dist: ModuleType, backend: str, device: torch.device, rank: int, world: int
) -> list[dict[str, Any]]:
    """Every rank's host, device, torch and NCCL versions and rendezvous address, gathered on every rank."""
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
    ranks: list[dict[str, Any]] = [{}] * world
    dist.all_gather_object(ranks, me)
    return ranks


def bind_nccl(
    args: argparse.Namespace, dist: ModuleType, rank: int, world: int, info: dict[str, Any]
) -> tuple[NcclDirect | None, ctypes.c_void_p | None]:
    """NCCL bound directly and a communicator of our own, where every rank could bind it (else none: every rank
    reaches the same verdict); `info` gets the library, its version and why it did not bind."""
    direct: NcclDirect | None = None
    try:
        direct = NcclDirect(nccl_library(args.nccl_library))
        info.update(library=direct.path, version=direct.version())
    except Exception as exc:  # noqa: BLE001 - every rank reaches the same verdict below
        info["error"] = f"{type(exc).__name__}: {exc}"[:300]
        direct = None
    states: list[bool] = [False] * world
    dist.all_gather_object(states, direct is not None)
    if direct is None or not all(states):
        info["error"] = info["error"] or "another rank could not bind libnccl"
        return None, None
    holder = [direct.unique_id() if rank == 0 else b""]
    dist.broadcast_object_list(holder, src=0)
    return direct, direct.init_rank(world, holder[0], rank)


def latency_record(args: argparse.Namespace) -> dict[str, Any]:
    """The 4 KiB latency's part of the result, before Measure.latency fills it in."""
    return {
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


def teardown(left_s: float, rank: int, measure: Measure, dist: ModuleType) -> None:
    """Our communicator, then torch's process group, bounded by what is left of --timeout (at least 5 s, at most
    TEARDOWN_TIMEOUT_S); rank 0 says how long it took."""
    guard = teardown_watchdog(max(5.0, min(TEARDOWN_TIMEOUT_S, left_s)), rank)
    t0 = time.monotonic()
    PHASE["name"] = "teardown: communicators"
    measure.sync()
    if measure.direct is not None and measure.comm is not None:
        measure.direct.destroy(measure.comm)
    dist.barrier()
    dist.destroy_process_group()
    guard.cancel()
    if rank == 0:
        print(f"# teardown: clean in {time.monotonic() - t0:.2f} s", flush=True)


def largest_message(
    args: argparse.Namespace, torch: ModuleType, dist: ModuleType, device: torch.device
) -> tuple[int, str | None]:
    """The largest message every rank can afford: a fraction of free memory, the minimum over ranks."""
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
    return max_bytes, capped_by


def format_table(result: dict[str, Any]) -> str:
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
    if result.get("line_up"):
        lines.append(f"#  timed runs: {LINE_UP[result['line_up']]}")
    floor = result.get("python_floor_us")
    lines.append(
        "#  host: what queueing one call cost the slowest rank's host (Python and NCCL's host work); a row whose"
        " time is its host time is bound by the host"
        + (
            f"; python floor {floor:.2f} us per call (the same loop calling a C function that does nothing)"
            if floor is not None
            else ""
        )
    )
    lines += [
        "#",
        "#                                                        in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     host",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)",
    ]
    for r in result["rows"]:
        host = f" {r.get('host_max_us', r.get('host_us')):>8.2f}" if r.get("host_us") is not None else ""
        lines.append(
            f"{r['size']:>12} {r['count']:>13} {r['type']:>9} {r['redop']:>7} {r['root']:>7} "
            f"{r['time_us']:>8.2f} {r['algbw']:>7.2f} {r['busbw']:>7.2f} {r['wrong']:>6}{host}"
        )
    lines.append("# Out of bounds values : 0 OK")
    lines.append(f"# Avg bus bandwidth    : {result.get('avg_busbw', 0.0):.4f}")
    lines.append(f"# Peak bus bandwidth   : {result.get('peak_busbw', 0.0):.4f}")
    lat = result.get("lat4k") or {}
    if lat:
        lines.append("# 4 KiB all-reduce latency per call (mean of the ranks), one row per path:")
        for row in lat.get("rows", []):
            host = (
                f"host {row.get('host_max_us', row.get('host_us')):>6.2f} us  "
                if row.get("host_us") is not None
                else ""
            )
            lines.append(f"#  latency {row['id']:<24} {row['us']:>8.2f} us  {host}{row['method']}")
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
