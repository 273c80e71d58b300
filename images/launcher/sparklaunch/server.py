"""Run rank 0's HTTP server around a driver (shared by vllm_sim and serve_torchrun.py)."""

from __future__ import annotations

import logging

from aiohttp import web

from .api import OpenAIServer
from .driver import EngineDriver

log = logging.getLogger("sparklaunch.server")


def serve_http(driver: EngineDriver, host: str, port: int, *, api_keys: list[str] | None = None,
               extra_routes: list[web.RouteDef] | None = None) -> None:
    """Blocks until SIGINT/SIGTERM; the engine loop starts with the app and stops with it."""
    server = OpenAIServer(driver, api_keys=api_keys)
    app = server.app(extra_routes)
    log.info("serving %s on http://%s:%d (health: /health)", ", ".join(driver.adapter.served_model_names), host, port)
    web.run_app(app, host=host, port=port, access_log=None, print=None, handle_signals=True, shutdown_timeout=5.0)


def setup_logging(level: str = "INFO", rank: int | None = None) -> None:
    tag = f" rank{rank}" if rank is not None else ""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format=f"%(levelname)s %(asctime)s{tag} [%(name)s] %(message)s", datefmt="%m-%d %H:%M:%S")
