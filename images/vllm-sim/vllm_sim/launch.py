"""The simulator as the engine of the torchrun launcher (images/launcher/serve_torchrun.py).

Same contract as sparklaunch.adapters.vllm_engine.build: parse the `vllm serve` arguments, build this
rank's engine replica, return it with the serving options. The backend is forced to external_launcher
(the launcher is what makes that backend servable); tp x pp must equal the ranks torchrun started.
"""

from __future__ import annotations

from sparklaunch.protocol import ServeOptions

from .adapter import SimAdapter
from .config import ConfigError, from_namespace
from .flags import parse_serve_args


def build_for_torchrun(argv: list[str], rank: int, world_size: int) -> tuple[SimAdapter, ServeOptions]:
    ns = parse_serve_args(argv)
    ns.distributed_executor_backend = "external_launcher"
    try:
        cfg = from_namespace(ns)
        if cfg.world_size != world_size:
            raise ConfigError(
                f"tensor_parallel_size x pipeline_parallel_size = {cfg.world_size}, but torchrun "
                f"started {world_size} ranks (--nnodes x --nproc-per-node)"
            )
        adapter = SimAdapter(cfg)
    except ConfigError as e:
        raise SystemExit(f"ValueError: {e}") from None

    def extra_routes():
        from .cli import sim_routes

        return sim_routes(cfg, adapter, "torchrun")

    adapter.extra_routes = extra_routes  # type: ignore[attr-defined]
    opts = ServeOptions(
        host=cfg.host,
        port=cfg.port,
        served_model_names=cfg.served_model_names,
        api_keys=cfg.api_keys,
        stream_interval=cfg.stream_interval,
        tp=cfg.tp,
        pp=cfg.pp,
    )
    return adapter, opts
