"""serve_torchrun.py's body: one rank of a torchrun-launched serving engine.

    torchrun --nnodes 2 --node-rank R --nproc-per-node 1 --master-addr HEAD --master-port 29500 \
        /opt/sparkdeploy/launcher/serve_torchrun.py MODEL -tp 2 [other vllm serve options]

Every rank joins one gloo group (torchrun's env:// variables), builds the same engine, and steps in
lockstep; rank 0 also serves the OpenAI API on --host/--port. The engine is real vLLM
(external_launcher) in the vllm-node images and the simulator in vllm-sim; SPARKLAUNCH_ENGINE=vllm|sim
forces one. SPARKLAUNCH_COLLECTIVE_TIMEOUT_S (default 30) bounds how long rank 0 waits for a silent rank
before /health turns 503.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys

from .control import GlooControl
from .server import run_head, run_worker, setup_logging

log = logging.getLogger("sparklaunch.torchrun")


def choose_engine(requested: str | None = None) -> str:
    requested = (requested or os.environ.get("SPARKLAUNCH_ENGINE") or "auto").lower()
    if requested in ("vllm", "sim"):
        return requested
    if importlib.util.find_spec("vllm") is not None:
        return "vllm"
    if importlib.util.find_spec("vllm_sim") is not None:
        return "sim"
    raise SystemExit("serve_torchrun.py: neither vllm nor vllm_sim is importable")


def rank_env(env: dict[str, str] | None = None) -> tuple[int, int]:
    env = os.environ if env is None else env
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise SystemExit(f"serve_torchrun.py must be started by torchrun (missing {', '.join(missing)})")
    return int(env["RANK"]), int(env["WORLD_SIZE"])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rank, world = rank_env()
    setup_logging(rank=rank)
    kind = choose_engine()
    if kind == "sim":
        from vllm_sim.launch import build_for_torchrun as build
    else:
        from .adapters.vllm_engine import build
    adapter, opts = build(argv, rank, world)
    timeout = float(os.environ.get("SPARKLAUNCH_COLLECTIVE_TIMEOUT_S", "30"))
    control = GlooControl(rank, world, None, timeout)
    log.info("rank %d/%d: engine=%s tp=%d pp=%d", rank, world, kind, opts.tp, opts.pp)
    if rank != 0:
        return run_worker(adapter, control)
    extra = getattr(adapter, "extra_routes", None)
    return run_head(
        adapter,
        control,
        opts.host,
        opts.port,
        stream_interval=opts.stream_interval,
        api_keys=opts.api_keys,
        extra_routes=extra() if extra else None,
    )
