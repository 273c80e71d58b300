"""spark-arena/sparkrun recipes (format v2) whose `runtime` is sglang or llama-cpp, read as sparkdeploy recipes.

A sparkrun recipe names `model`, `runtime`, `container`, `defaults` (any keys, each a `{placeholder}` of
`command`) and `command` (a shell template; scitrera/sparkrun docs/RECIPES.md). The command is filled from the
defaults (iteratively, as sparkrun does), split as a shell would, and mapped onto the engine's recipe fields;
what sparkdeploy writes itself for each topology (host, port, tensor parallel, multi-node flags) is dropped; every
other flag stays in the engine's extra_args, checked against the engine's own parser when the recipe renders. A
GGUF model (`REPO:QUANT`, llama-server's `-hf` at start) becomes `models pull`'s include of that quant: the file
to serve is named with `--set llamacpp.gguf=FILE`, never downloaded at start.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from sparkdeploy import paths
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.recipes.engines.flagcheck import argparse_match, read_dump
from sparkdeploy.recipes.eugr import Imported

RUNTIMES = {"sglang": "sglang", "llama-cpp": "llamacpp"}
SGLANG_DUMP = "engine-args/sglang-0.5.23-args.json"
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# SGLang options -> the recipe's sglang fields (None: sparkdeploy writes it for the topology: dropped)
SGLANG_FIELDS: dict[str, str | None] = {
    "--model-path": None,
    "--host": None,
    "--port": None,
    "--tp-size": None,
    "--pp-size": None,
    "--nnodes": None,
    "--node-rank": None,
    "--dist-init-addr": None,
    "--enable-metrics": None,
    "--served-model-name": "served_model_name",
    "--mem-fraction-static": "mem_fraction_static",
    "--context-length": "context_length",
    "--max-running-requests": "max_running_requests",
    "--chunked-prefill-size": "chunked_prefill_size",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--quantization": "quantization",
    "--attention-backend": "attention_backend",
    "--tool-call-parser": "tool_call_parser",
    "--reasoning-parser": "reasoning_parser",
    "--trust-remote-code": "trust_remote_code",
}
# llama-server options -> the recipe's llamacpp fields (every alias listed; None: written by sparkdeploy)
LLAMA_FIELDS: dict[str, str | None] = {
    "-hf": None, "--hf-repo": None, "-m": None, "--model": None, "--host": None, "--port": None, "--metrics": None,
    "-a": "served_model_name", "--alias": "served_model_name",
    "-ngl": "n_gpu_layers", "--gpu-layers": "n_gpu_layers", "--n-gpu-layers": "n_gpu_layers",
    "-c": "ctx_size", "--ctx-size": "ctx_size",
    "-np": "parallel", "--parallel": "parallel",
    "-fa": "flash_attn", "--flash-attn": "flash_attn",
    "-ctk": "cache_type_k", "--cache-type-k": "cache_type_k",
    "-ctv": "cache_type_v", "--cache-type-v": "cache_type_v",
    "--reasoning-format": "reasoning_format",
    "--jinja": "jinja", "--no-jinja": "jinja",
}  # fmt: skip
LLAMA_VALUELESS = {"--metrics", "--jinja", "--no-jinja"}


def is_sparkrun(data: Any) -> bool:
    return isinstance(data, dict) and data.get("runtime") in RUNTIMES and "recipe_version" not in data


def _filled(template: str, values: dict[str, Any], source: str) -> str:
    for _ in range(10):  # iterative, as sparkrun's: a value may hold another placeholder
        new = PLACEHOLDER.sub(lambda m: str(values[m[1]]) if m[1] in values else m[0], template)
        if new == template:
            break
        template = new
    left = sorted(set(PLACEHOLDER.findall(template)))
    if left:
        raise ConfigError(
            Problem(source, "command", f"placeholders without a value: {', '.join(left)}", "add them to defaults")
        )
    return template


def _argv(data: dict[str, Any], source: str) -> list[str]:
    command = data.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ConfigError(Problem(source, "command", "missing", "sparkdeploy imports recipes with a command template"))
    values = {**(data.get("defaults") or {}), "model": data.get("model")}
    text = _filled(command, values, source).replace("\\\n", " ")
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ConfigError(Problem(source, "command", f"not a shell command line: {exc}", "fix its quoting")) from None


def _sglang(argv: list[str], source: str, out: dict[str, Any], notes: list[str]) -> None:
    if argv[:3] in (["python3", "-m", "sglang.launch_server"], ["python", "-m", "sglang.launch_server"]):
        argv = argv[3:]
    elif argv[:2] == ["sglang", "serve"]:
        argv = argv[2:]
    else:
        raise ConfigError(
            Problem(
                source, "command", f"{' '.join(argv[:3])!r} is not SGLang's server", "python3 -m sglang.launch_server"
            )
        )
    flags = read_dump(str(paths.images_dir() / SGLANG_DUMP))["flags"]
    settings: dict[str, Any] = {}
    extra: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        flag, _ = argparse_match(name, flags, True)
        takes = bool(flag and flags[flag]["takes_value"])
        value = inline if eq else (argv[i + 1] if takes and i + 1 < len(argv) else None)
        step = 1 if (eq or not takes) else 2
        key = next(
            (SGLANG_FIELDS[f] for f in (flag, *(flags[flag]["aliases"] if flag else [])) if f in SGLANG_FIELDS), "?"
        )
        if flag and key != "?":
            if key is None:
                notes.append(
                    f"{token}{'' if eq or not takes else ' ' + str(value)}: sparkdeploy writes it for the topology"
                )
            elif key == "served_model_name":
                out["served_model_name"] = value
            elif key == "trust_remote_code":
                settings[key] = True
            else:
                settings[key] = _number(value)
        else:
            extra += argv[i : i + step]  # checked against SGLang's parser when the recipe renders
        i += step
    if extra:
        settings["extra_args"] = extra
    out["sglang"] = settings


def _number(value: Any) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except (TypeError, ValueError):
            continue
    return value


def _llamacpp(argv: list[str], model: str, source: str, out: dict[str, Any], notes: list[str]) -> None:
    if not argv or Path(argv[0]).name != "llama-server":
        raise ConfigError(Problem(source, "command", f"{argv[:1]} is not llama-server", "llama-server ..."))
    repo, _, quant = model.partition(":")
    out["model"] = repo
    settings: dict[str, Any] = {"include": [f"*{quant}*"]} if quant else {}
    extra: list[str] = []
    i = 1
    while i < len(argv):
        token = argv[i]
        key = LLAMA_FIELDS.get(token, "?")
        takes = token not in LLAMA_VALUELESS and not (
            key == "?" and (i + 1 >= len(argv) or argv[i + 1].startswith("-"))
        )
        value = argv[i + 1] if takes and i + 1 < len(argv) else None
        step = 2 if takes else 1
        if key == "?":
            extra += argv[i : i + step]
        elif key is None:
            if token in ("-m", "--model"):
                settings["gguf"] = Path(str(value)).name
            notes.append(
                f"{token}{' ' + str(value) if value else ''}: sparkdeploy writes it (the GGUF from models pull)"
            )
        elif key == "served_model_name":
            out["served_model_name"] = value
        elif key == "jinja":
            settings["jinja"] = token == "--jinja"
        else:
            settings[key] = _number(value) if key not in ("flash_attn",) else value
        i += step
    if extra:
        settings["extra_args"] = extra
    out["llamacpp"] = settings


def to_recipe_data(data: dict[str, Any], path: Path) -> Imported:
    source = str(path)
    runtime = RUNTIMES[data["runtime"]]
    model = str(data.get("model") or "")
    meta = data.get("metadata") or {}
    name = str(meta.get("name") or path.stem)
    argv = _argv(data, source)
    max_nodes, min_nodes = data.get("max_nodes"), int(data.get("min_nodes") or 1)
    solo = runtime == "llamacpp" or max_nodes == 1 or data.get("solo_only") or data.get("mode") == "solo"
    cluster_only = min_nodes > 1 or data.get("cluster_only") or data.get("mode") == "cluster"
    topologies = ["solo", "2xsolo"] if solo else (["cluster"] if cluster_only else ["solo", "cluster", "2xsolo"])
    out: dict[str, Any] = {
        "name": re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64],
        "description": str(meta.get("description") or f"imported from sparkrun recipe {path.name}")[:500],
        "model": model,
        "engine": runtime,
        "image": data.get("container"),
        "topologies": topologies,
        "default_topology": topologies[0],
        "fits_one_node": not cluster_only,
    }
    if runtime == "sglang":
        out["cluster_backend"] = "native"
        if cluster_only:
            out["tensor_parallel"] = min_nodes
    notes: list[str] = []
    if runtime == "sglang":
        _sglang(argv, source, out, notes)
    else:
        _llamacpp(argv, model, source, out, notes)
        if "gguf" not in out["llamacpp"]:
            pattern = out["llamacpp"].get("include", ["*"])[0]
            out["llamacpp"]["gguf"] = None  # named with --set (import_recipe refuses it unset, saying how)
            notes.append(
                f"{model}: a quant, not a file: the GGUF named with --set llamacpp.gguf=FILE (the first file of "
                f"the quant; `sparkdeploy models pull {out['model']} --include '{pattern}' --dry-run` lists them)"
            )
    env = {k: str(v) for k, v in (data.get("env") or {}).items() if "$" not in str(v)}
    if env:
        out["env"] = env
    dropped_env = sorted(k for k, v in (data.get("env") or {}).items() if "$" in str(v))
    if dropped_env:
        notes.append(f"env {', '.join(dropped_env)}: taken from this machine by sparkrun; secrets go in secrets.env")
    return Imported(data=out, source=path, eugr_name=name, not_carried=notes, argv=argv, fmt="sparkrun")
