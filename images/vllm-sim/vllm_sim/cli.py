"""The `vllm` command of the vllm-sim image: `vllm serve MODEL [vLLM 0.32 options]`, `vllm --version`.

Modes, chosen from the arguments exactly as vLLM chooses them:
- solo: one process, one simulated GPU;
- native multi-node (`--nnodes N --node-rank R --master-addr A [--master-port P] [--headless]`): every
  node runs a process; they meet in a real gloo rendezvous; node 0 serves HTTP (healthy only once all
  ranks joined), the others are headless workers stepping in lockstep;
- ray (`--distributed-executor-backend ray`): joins the running Ray cluster and drives a worker actor on
  another node every step (ray_exec.py);
- external_launcher (torchrun): only under /opt/sparkdeploy/launcher/serve_torchrun.py, as in vLLM.
"""

from __future__ import annotations

import logging
import sys

from aiohttp import web

from sparklaunch.control import GlooControl, LocalControl, RankFailure
from sparklaunch.server import run_head, run_worker, setup_logging

from . import __version__, faults
from .adapter import SimAdapter
from .config import ConfigError, ServeConfig, from_namespace
from .flags import parse_serve_args
from .tokenizer import CORPUS_FILE, TOKENIZER_DIR

log = logging.getLogger("vllm_sim")
SUBCOMMANDS = ("chat", "complete", "serve", "bench", "collect-env", "run-batch")
BANNER = "vllm-sim {v}: SIMULATED vLLM 0.32.0 engine (no GPU, no model weights; output text is placeholder)"


def sim_routes(cfg: ServeConfig, adapter: SimAdapter, mode: str) -> list[web.RouteDef]:
    """Sim-only endpoints: the prompt corpus (llama-benchy --book-url) and what is being simulated."""

    async def corpus(request: web.Request) -> web.FileResponse:
        return web.FileResponse(CORPUS_FILE, headers={"Content-Type": "text/plain; charset=utf-8"})

    async def info(request: web.Request) -> web.Response:
        e = adapter.engine
        return web.json_response(
            {
                "simulated": True,
                "vllm_sim_version": __version__,
                "mode": mode,
                "model": cfg.model,
                "model_profile": e.model.name,
                "profile_known": e.model.known,
                "hardware": e.hw.name,
                "tp": cfg.tp,
                "pp": cfg.pp,
                "nnodes": cfg.nnodes,
                "graph_mode": cfg.graph_mode,
                "allreduce_split": cfg.allreduce_split,
                "plan": e.plan.__dict__,
                "time_scale": cfg.time_scale,
                "steps": e.steps,
                "simulated_seconds": round(adapter.simulated_seconds, 3),
                "tokenizer_dir": str(TOKENIZER_DIR),
                "corpus_file": str(CORPUS_FILE),
            }
        )

    return [web.get("/sim/corpus.txt", corpus), web.get("/sim/info", info)]


def make_control(cfg: ServeConfig):
    if cfg.mode == "native":
        return GlooControl(
            cfg.node_rank,
            cfg.nnodes,
            f"tcp://{cfg.master_addr}:{cfg.master_port}",
            cfg.collective_timeout_s,
            cfg.rendezvous_timeout_s,
        )
    if cfg.mode == "ray":
        from .ray_exec import RayControl

        control = RayControl(cfg)
        control.start()  # fail at start-up, as vLLM does, when the Ray cluster cannot host the ranks
        return control
    return LocalControl()


def run(cfg: ServeConfig) -> int:
    rank = cfg.node_rank if cfg.mode == "native" else None
    setup_logging(rank=rank)
    log.warning(BANNER.format(v=__version__))
    faults.install()  # SIGUSR1: a real OOM kill under a cgroup memory limit (lab tests)
    adapter = SimAdapter(cfg)  # its engine logs the model's sim profile and the resolved plan
    try:
        control = make_control(cfg)
    except RankFailure as e:
        log.error("%s", e)
        return 1
    if cfg.mode == "native" and cfg.node_rank > 0:
        if not cfg.headless:
            log.warning("node_rank %d runs no API server (as with --headless)", cfg.node_rank)
        return run_worker(adapter, control)
    return run_head(
        adapter,
        control,
        cfg.host,
        cfg.port,
        stream_interval=cfg.stream_interval,
        api_keys=cfg.api_keys,
        extra_routes=sim_routes(cfg, adapter, cfg.mode),
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: vllm [-v] {" + ",".join(SUBCOMMANDS) + "} ...\n\n" + BANNER.format(v=__version__))
        return 0 if argv else 2
    if argv[0] in ("-v", "--version"):
        print("0.32.0")
        return 0
    if argv[0] != "serve":
        print("usage: vllm [-h] [-v] {" + ",".join(SUBCOMMANDS) + "} ...", file=sys.stderr)
        choices = ", ".join(repr(c) for c in SUBCOMMANDS)
        print(f"vllm: error: argument subparser: invalid choice: {argv[0]!r} (choose from {choices})", file=sys.stderr)
        return 2
    ns = parse_serve_args(argv[1:])
    try:
        cfg = from_namespace(ns)
        if cfg.mode == "torchrun":
            raise ConfigError(
                "distributed_executor_backend=external_launcher needs torchrun and the lockstep "
                "launcher: torchrun ... /opt/sparkdeploy/launcher/serve_torchrun.py MODEL [options]"
            )
        return run(cfg)
    except ConfigError as e:
        print(f"ValueError: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
