"""The `vllm serve` command line for a resolved recipe (the vLLM engine's render step: recipes/engines/vllm.py).

What that line may say is checked against the CLI of the vLLM the image pins by images/vllm_cli.py (the
topologies call both); this module only writes the line.
"""

from __future__ import annotations

import json
from typing import Any

from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.recipes import speculative
from sparkdeploy.recipes.engines.interface import ONE_NODE, Distributed
from sparkdeploy.recipes.recipe import ResolvedRecipe

__all__ = ["Distributed", "compilation_config", "serve_args"]


def compilation_config(resolved: ResolvedRecipe, image: ImageDefinition) -> dict[str, Any] | None:
    comp = resolved.recipe.vllm.compilation
    config: dict[str, Any] = {}
    if comp.cudagraph_mode:
        config["cudagraph_mode"] = comp.cudagraph_mode
    if comp.eager_allreduce:
        # An explicit splitting_ops list replaces vLLM's defaults (the attention ops), so keep them and add
        # the all-reduce: graphs are cut around it and NCCL runs eagerly between graph pieces.
        defaults = list(image.compilation_defaults.get("splitting_ops", []))
        if not defaults:
            raise ConfigError(
                Problem(
                    f"images/{image.name}/manifest.yaml",
                    "compilation_defaults.splitting_ops",
                    "unknown for this image, so the eager all-reduce cannot keep the defaults",
                    "record vLLM's default splitting_ops for the pinned version",
                )
            )
        config["splitting_ops"] = defaults + [op for op in ["vllm::all_reduce"] if op not in defaults]
        config.setdefault("cudagraph_mode", "PIECEWISE")
    config.update(comp.extra)
    return config or None


def _opt(flag: str, value: object) -> list[str]:
    """`--flag value`, or `--flag=value` when the value starts with '-' so no parser can take it for a flag."""
    text = str(value)
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


def serve_args(resolved: ResolvedRecipe, image: ImageDefinition, port: int, dist: Distributed = ONE_NODE) -> list[str]:
    """Arguments after `vllm serve` (the model first)."""
    r = resolved.recipe
    v = r.vllm
    args: list[str] = [r.model, *_opt("--served-model-name", r.public_name), "--host", "0.0.0.0", "--port", str(port)]
    args += ["--gpu-memory-utilization", f"{v.gpu_memory_utilization:g}"]
    if v.max_model_len:
        args += ["--max-model-len", str(v.max_model_len)]
    if v.kv_cache_dtype:
        args += _opt("--kv-cache-dtype", v.kv_cache_dtype)
    if v.enforce_eager:
        args.append("--enforce-eager")
    if v.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(v.max_num_batched_tokens)]
    if v.max_num_seqs:
        args += ["--max-num-seqs", str(v.max_num_seqs)]
    if v.quantization:
        args += _opt("--quantization", v.quantization)
    if v.load_format:
        args += _opt("--load-format", v.load_format)
    if v.dtype:
        args += _opt("--dtype", v.dtype)
    if v.trust_remote_code:
        args.append("--trust-remote-code")
    comp = compilation_config(resolved, image)
    if comp:
        args += ["--compilation-config", json.dumps(comp, separators=(",", ":"))]
    if dist.tensor_parallel > 1:
        args += ["--tensor-parallel-size", str(dist.tensor_parallel)]
    if dist.pipeline_parallel > 1:
        args += ["--pipeline-parallel-size", str(dist.pipeline_parallel)]
    if dist.executor_backend:
        args += ["--distributed-executor-backend", dist.executor_backend]
    if dist.nnodes:
        args += [
            "--nnodes",
            str(dist.nnodes),
            "--node-rank",
            str(dist.node_rank),
            "--master-addr",
            str(dist.master_addr),
            "--master-port",
            str(dist.master_port),
        ]
    if dist.headless:
        args.append("--headless")
    args += speculative.serve_flag(resolved, image, dist.tensor_parallel)
    args += list(v.extra_args)
    return args
