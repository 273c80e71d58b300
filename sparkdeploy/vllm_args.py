"""The `vllm serve` command line for a resolved recipe, checked against the vLLM the image pins.

The accepted flags come from `images/*/vllm-args-<version>.json`, dumped from that vLLM release's own
argument parser (scripts/dump_vllm_args.py), plus the `extra_flags` a patched image declares. So a recipe
that uses `--mxfp4-layers` with an image that does not declare it is rejected before anything runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sparkdeploy import paths
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.recipes import ResolvedRecipe


@dataclass(frozen=True)
class Distributed:
    """How this process takes part in a multi-node engine (None fields: single node)."""

    tensor_parallel: int = 1
    executor_backend: str | None = None  # ray | external_launcher
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    headless: bool = False


def compilation_config(resolved: ResolvedRecipe, image: ImageDefinition) -> dict | None:
    comp = resolved.recipe.vllm.compilation
    config: dict = {}
    if comp.cudagraph_mode:
        config["cudagraph_mode"] = comp.cudagraph_mode
    if comp.eager_allreduce:
        # An explicit splitting_ops list replaces vLLM's defaults (the attention ops), so keep them and add
        # the all-reduce: graphs are cut around it and NCCL runs eagerly between graph pieces.
        defaults = list(image.compilation_defaults.get("splitting_ops", []))
        if not defaults:
            raise ConfigError(Problem(f"images/{image.name}/manifest.yaml", "compilation_defaults.splitting_ops",
                                      "unknown for this image, so the eager all-reduce cannot keep the defaults",
                                      "record vLLM's default splitting_ops for the pinned version"))
        config["splitting_ops"] = defaults + [op for op in ["vllm::all_reduce"] if op not in defaults]
        config.setdefault("cudagraph_mode", "PIECEWISE")
    config.update(comp.extra)
    return config or None


def _opt(flag: str, value) -> list[str]:
    """`--flag value`, or `--flag=value` when the value starts with '-' so no parser can take it for a flag."""
    text = str(value)
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


def serve_args(resolved: ResolvedRecipe, image: ImageDefinition, port: int, dist: Distributed = Distributed()) -> list[str]:
    """Arguments after `vllm serve` (the model first)."""
    r = resolved.recipe
    v = r.vllm
    args: list[str] = [r.model, *_opt("--served-model-name", r.public_name), "--host", "0.0.0.0",
                       "--port", str(port)]
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
    if dist.executor_backend:
        args += ["--distributed-executor-backend", dist.executor_backend]
    if dist.nnodes:
        args += ["--nnodes", str(dist.nnodes), "--node-rank", str(dist.node_rank),
                 "--master-addr", str(dist.master_addr), "--master-port", str(dist.master_port)]
    if dist.headless:
        args.append("--headless")
    args += list(v.extra_args)
    return args


# -- validation against the pinned vLLM's parser ---------------------------------------------------------

@lru_cache(maxsize=None)
def flag_spec(version: str) -> dict:
    matches = sorted(paths.images_dir().glob(f"*/vllm-args-{version}.json"))
    if not matches:
        raise ConfigError(Problem("images/", f"vllm-args-{version}.json", f"no argument list for vLLM {version}",
                                  "dump it with scripts/dump_vllm_args.py"))
    return json.loads(Path(matches[0]).read_text())


def check_args(args: list[str], image: ImageDefinition, recipe_file: str) -> None:
    """Every flag must exist in the pinned vLLM or be declared by the image; choices must be valid."""
    version = image.vllm_version
    if not version:
        raise ConfigError(Problem(f"images/{image.name}/manifest.yaml", "vllm_version", "missing",
                                  "pin the vLLM version the image carries"))
    spec = flag_spec(version)["flags"]
    extra = set(image.extra_flags)
    problems = []
    i = 1  # args[0] is the model
    while i < len(args):
        token = args[i]
        if not token.startswith("-"):
            i += 1
            continue
        flag, eq, inline = token.partition("=")
        if flag in extra:
            i += 1 if eq else 2
            continue
        info = spec.get(flag)
        if info is None:
            owner = [d for d in _images_declaring(flag)]
            if owner:
                fix = f"use an image that declares it ({', '.join(owner)}), or drop it"
                msg = f"{flag} is understood only by a patched image, not by {image.name}"
            else:
                fix = "check the flag name against `vllm serve --help` of that version"
                msg = f"{flag} is not a vLLM {version} flag"
            problems.append(Problem(recipe_file, "vllm", msg, fix))
            i += 1
            continue
        takes_value = info.get("takes_value", True)
        value = inline if eq else (args[i + 1] if takes_value and i + 1 < len(args) else None)
        # Some values are checked by vLLM after argparse (load formats, quantizations, executor backends):
        # the dump records those sets too.
        choices = info.get("choices") or flag_spec(version).get("value_sets", {}).get(flag)
        if takes_value and choices and value is not None and value not in [str(c) for c in choices]:
            problems.append(Problem(recipe_file, "vllm", f"{flag} {value!r} is not one of vLLM {version}'s choices",
                                    f"use one of {', '.join(map(str, choices))}"))
        i += 1 if (eq or not takes_value) else 2
    if problems:
        raise ConfigError(problems)


def check_env(env: dict[str, str], image: ImageDefinition) -> list[str]:
    """Warnings for VLLM_* variables the pinned vLLM does not know (they are silently ignored)."""
    if not image.vllm_version:
        return []
    known = set(flag_spec(image.vllm_version).get("environment_variables", []))
    return [f"env {name} is not an environment variable of vLLM {image.vllm_version}: it has no effect unless "
            f"the image's own patches read it" for name in sorted(env) if name.startswith("VLLM_") and name not in known]


def _images_declaring(flag: str) -> list[str]:
    from sparkdeploy.images.definitions import definition_names, load_definition

    return [n for n in definition_names() if flag in load_definition(n).extra_flags]
