"""Run rank 0's HTTP server around a driver (shared by vllm_sim and serve_torchrun.py)."""

from __future__ import annotations

import logging

from aiohttp import web

from .api import OpenAIServer
from .driver import EngineDriver, apply_and_step

log = logging.getLogger("sparklaunch.server")


def serve_http(
    driver: EngineDriver,
    host: str,
    port: int,
    *,
    api_keys: list[str] | None = None,
    extra_routes: list[web.RouteDef] | None = None,
) -> None:
    """Blocks until SIGINT/SIGTERM; the engine loop starts with the app and stops with it."""
    server = OpenAIServer(driver, api_keys=api_keys)
    app = server.app(extra_routes)
    log.info("serving %s on http://%s:%d (health: /health)", ", ".join(driver.adapter.served_model_names), host, port)
    web.run_app(app, host=host, port=port, access_log=None, print=None, handle_signals=True, shutdown_timeout=5.0)


def run_head(
    adapter,
    control,
    host: str,
    port: int,
    *,
    stream_interval: int = 1,
    api_keys: list[str] | None = None,
    extra_routes: list[web.RouteDef] | None = None,
) -> int:
    """Rank 0: the engine loop and the HTTP server; exit status 1 if the engine died."""
    driver = EngineDriver(adapter, control, stream_interval=stream_interval)
    serve_http(driver, host, port, api_keys=api_keys, extra_routes=extra_routes)
    return 0 if driver.dead_reason is None else 1


def run_worker(adapter, control) -> int:
    """Ranks > 0: join, then step in lockstep with rank 0 until it orders a shutdown (no HTTP)."""
    control.start()
    try:
        control.serve_worker(lambda inp: apply_and_step(adapter, inp))
    finally:
        control.close()
    return 0


def setup_logging(level: str = "INFO", rank: int | None = None) -> None:
    tag = f" rank{rank}" if rank is not None else ""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(levelname)s %(asctime)s{tag} [%(name)s] %(message)s",
        datefmt="%m-%d %H:%M:%S",
    )
