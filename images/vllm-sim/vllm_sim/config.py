"""The serve configuration the simulator acts on, with vLLM's defaults and start-up checks.

Parsing (flags.py) only knows which flags exist; this module turns the ones that change behaviour into
typed fields and refuses configurations real vLLM would refuse at start-up (exit 1, one `ValueError:`
line), such as weights that do not fit, a KV cache too small for one max-length sequence, or more GPUs
than the topology has. Sim-only knobs come from VLLM_SIM_* environment variables so the command line
stays exactly vLLM's.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

from sparklaunch.chat import ChatFeatures

GIB = 1024**3
DEFAULT_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"


class ConfigError(ValueError):
    """A configuration vLLM would refuse at start-up."""


@dataclass
class ServeConfig:
    model: str
    served_model_names: list[str]
    host: str = "0.0.0.0"
    port: int = 8000
    api_keys: list[str] = field(default_factory=list)
    tp: int = 1
    pp: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    enable_chunked_prefill: bool = True
    quantization: str | None = None
    load_format: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False
    compilation_config: dict[str, Any] = field(default_factory=dict)
    speculative_config: dict[str, Any] = field(default_factory=dict)  # SIMULATED drafts (vllm_sim/speculative.py)
    optimization_level: int | None = None
    distributed_executor_backend: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    headless: bool = False
    stream_interval: int = 1
    mxfp4_layers: frozenset[str] = frozenset()
    mxfp4_backend: str | None = None
    chat: ChatFeatures = field(default_factory=ChatFeatures)  # tool-call / reasoning parsers
    # sim-only (environment)
    hardware: str = "gb10"
    time_scale: float = 1.0
    gpus_per_node: int = 1
    collective_timeout_s: float = 30.0
    rendezvous_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if isinstance(self.chat, dict):  # a config shipped to a Ray actor as plain fields
            self.chat = ChatFeatures(**self.chat)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def graph_mode(self) -> str:
        """eager | piecewise | full | full_and_piecewise, as vLLM resolves it."""
        if self.enforce_eager or self.optimization_level == 0:
            return "eager"
        mode = str(self.compilation_config.get("cudagraph_mode") or DEFAULT_CUDAGRAPH_MODE).upper()
        return {"NONE": "eager", "PIECEWISE": "piecewise", "FULL": "full", "FULL_DECODE_ONLY": "full"}.get(
            mode, "full_and_piecewise"
        )

    @property
    def allreduce_split(self) -> bool:
        """vllm::all_reduce listed as a splitting op: all-reduces run eagerly between graph pieces."""
        return "vllm::all_reduce" in (self.compilation_config.get("splitting_ops") or [])

    @property
    def mode(self) -> str:
        """solo | native | ray | torchrun: how the ranks of this engine are wired together."""
        if self.distributed_executor_backend == "ray":
            return "ray"
        if self.distributed_executor_backend == "external_launcher":
            return "torchrun"
        if self.nnodes > 1:
            return "native"
        return "solo"


def from_namespace(ns: argparse.Namespace, env: dict[str, str] | None = None) -> ServeConfig:
    env = dict(os.environ if env is None else env)
    get = lambda name, default=None: getattr(ns, name, default)  # noqa: E731
    model = get("model_tag")
    if not model:
        raise ConfigError("a model is required: vllm serve MODEL [options]")
    names = get("served_model_name") or [model]
    layers = get("mxfp4_layers")
    cfg = ServeConfig(
        model=model,
        served_model_names=list(names),
        host=get("host") or "0.0.0.0",
        port=get("port", 8000),
        api_keys=list(get("api_key") or []) or ([env["VLLM_API_KEY"]] if env.get("VLLM_API_KEY") else []),
        tp=get("tensor_parallel_size", 1),
        pp=get("pipeline_parallel_size", 1),
        gpu_memory_utilization=get("gpu_memory_utilization", 0.9),
        max_model_len=get("max_model_len"),
        kv_cache_dtype=get("kv_cache_dtype", "auto"),
        enforce_eager=bool(get("enforce_eager", False)),
        max_num_batched_tokens=get("max_num_batched_tokens"),
        max_num_seqs=get("max_num_seqs"),
        enable_chunked_prefill=bool(get("enable_chunked_prefill", True)),
        quantization=get("quantization"),
        load_format=get("load_format", "auto"),
        dtype=get("dtype", "auto"),
        trust_remote_code=bool(get("trust_remote_code", False)),
        compilation_config=dict(get("compilation_config") or {}),
        speculative_config=dict(get("speculative_config") or {}),
        optimization_level=get("optimization_level"),
        distributed_executor_backend=get("distributed_executor_backend"),
        nnodes=get("nnodes", 1),
        node_rank=get("node_rank", 0),
        master_addr=get("master_addr") or "127.0.0.1",
        master_port=get("master_port") or 29501,
        headless=bool(get("headless", False)),
        stream_interval=get("stream_interval", 1),
        mxfp4_layers=frozenset(x.strip() for x in layers.split(",") if x.strip()) if layers else frozenset(),
        mxfp4_backend=get("mxfp4_backend"),
        chat=ChatFeatures.from_namespace(ns),
        hardware=env.get("VLLM_SIM_HARDWARE", "gb10"),
        time_scale=float(env.get("VLLM_SIM_TIME_SCALE", "1.0")),
        gpus_per_node=int(env.get("VLLM_SIM_GPUS_PER_NODE", "1")),
        collective_timeout_s=float(env.get("VLLM_SIM_COLLECTIVE_TIMEOUT_S", "30")),
        rendezvous_timeout_s=float(env.get("VLLM_SIM_RENDEZVOUS_TIMEOUT_S", "900")),
    )
    check_topology(cfg)
    return cfg


def check_topology(cfg: ServeConfig) -> None:
    """Refuse what vLLM refuses before it loads anything."""
    if cfg.chat.enable_auto_tool_choice and not cfg.chat.tool_call_parser:
        raise ConfigError("--enable-auto-tool-choice requires --tool-call-parser")
    if not 0.0 < cfg.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"GPU memory utilization must be within (0, 1]. Got {cfg.gpu_memory_utilization}.")
    if cfg.stream_interval < 1:
        raise ConfigError("stream_interval must be >= 1")
    if cfg.nnodes < 1 or not 0 <= cfg.node_rank < cfg.nnodes:
        raise ConfigError(f"node_rank {cfg.node_rank} must be in [0, nnodes={cfg.nnodes})")
    if cfg.headless and cfg.nnodes > 1 and cfg.node_rank == 0:
        raise ConfigError("--headless is for the worker nodes (node_rank > 0); node 0 serves the API")
    if cfg.mode == "native":
        available = cfg.nnodes * cfg.gpus_per_node
        if cfg.world_size != available:
            raise ConfigError(
                f"World size ({cfg.world_size} = tensor_parallel_size x pipeline_parallel_size) must equal "
                f"the GPUs of --nnodes {cfg.nnodes} x {cfg.gpus_per_node} GPU(s) per node ({available})."
            )
    elif cfg.mode == "solo" and cfg.world_size > cfg.gpus_per_node:
        raise ConfigError(
            f"The number of required GPUs ({cfg.world_size}) exceeds the total number of available GPUs "
            f"in the placement group / node ({cfg.gpus_per_node}). A GB10 node has one GPU: use --nnodes "
            "with --node-rank/--master-addr, --distributed-executor-backend ray, or the torchrun launcher."
        )
