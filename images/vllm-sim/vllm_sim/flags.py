"""`vllm serve` argument parsing that accepts exactly what vLLM 0.32 accepts.

The flag list is data: data/vllm-args.json is a copy of the dump of vLLM 0.32's real parser
(images/vllm-node/vllm-args-0.32.0.json; a test keeps the two equal), plus data/extra-flags.json for
the patched images the sim stands in for. Rendering a recipe against the sim therefore fails on the
same typos the GPU images would reject, with the same `vllm serve: error: ...` line and exit code 2.

vLLM's FlexibleArgumentParser rewrites some spellings before argparse sees them; the same rewriting is
reimplemented here from the dump's `preprocessing` notes: `-O<n>`, `--a_b`, `--x.y V` and `--x.y+ A,B`.
Only the flags the simulator interprets get a type; every other flag is accepted and ignored.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

DATA_DIR = Path(__file__).resolve().parent / "data"
ARGS_FILE = DATA_DIR / "vllm-args.json"
EXTRA_FILE = DATA_DIR / "extra-flags.json"


def human_readable_int(value: str) -> int:
    """vLLM's 1k / 1K style: lower-case suffix decimal (k=1000), upper-case binary (K=1024)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", value.strip())
    if not m:
        raise ValueError(value)
    number, suffix = m.groups()
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[
        suffix
    ]
    result = float(number) * scale
    if (suffix == "" and "." in number) or result != int(result):
        raise ValueError(value)
    return int(result)


def max_model_len(value: str) -> int | None:
    if value.strip().lower() in ("auto", "-1"):
        return None
    return human_readable_int(value)


def json_object(value: str) -> dict[str, Any]:
    data = json.loads(value)
    if not isinstance(data, dict):
        raise ValueError(value)
    return data


def optimization_level(value: str) -> int:
    level = int(value)
    if level not in (0, 1, 2, 3):
        raise ValueError(value)
    return level


# Types for the flags the simulator reads (by dest). Names mirror vLLM's messages ("invalid int value").
TYPES: dict[str, Callable[[str], Any]] = {
    "port": int,
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "data_parallel_size": int,
    "max_num_seqs": int,
    "nnodes": int,
    "node_rank": int,
    "master_port": int,
    "stream_interval": int,
    "gpu_memory_utilization": float,
    "max_num_batched_tokens": human_readable_int,
    "max_model_len": max_model_len,
    "compilation_config": json_object,
    "speculative_config": json_object,
    "optimization_level": optimization_level,
}
TYPE_NAMES = {
    int: "int",
    float: "float",
    human_readable_int: "human_readable_int",
    max_model_len: "human_readable_int_or_auto",
    json_object: "parse_dataclass",
    optimization_level: "optimization_level",
}


PLUGINS = {"reasoning_parser": "reasoning_parser_plugin", "tool_call_parser": "tool_parser_plugin"}


class VllmArgumentParser(argparse.ArgumentParser):
    """argparse with vLLM's error wording; `value_sets` are checked after parsing (vLLM checks them in
    its config classes, the sim reports them like parser errors so a bad recipe fails fast)."""

    value_sets: ClassVar[dict[str, list[str]]] = {}

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns = super().parse_args(preprocess(list(args or [])), namespace)
        for flag, allowed in self.value_sets.items():
            dest = flag.lstrip("-").replace("-", "_")
            value = getattr(ns, dest, None)
            if getattr(ns, PLUGINS.get(dest, ""), None):  # a plugin file may register more parser names
                continue
            if value is not None and value not in allowed:
                self.error(
                    f"argument {flag}: invalid choice: {value!r} (choose from "
                    + ", ".join(repr(a) for a in allowed)
                    + ")"
                )
        return ns


def preprocess(args: list[str]) -> list[str]:
    """FlexibleArgumentParser's rewriting: --model to positional, -O<n>, underscores, dotted JSON keys."""
    if "--model" in args or any(a.startswith("--model=") for a in args):
        i = next(i for i, a in enumerate(args) if a == "--model" or a.startswith("--model="))
        if args[i] == "--model":
            model, rest = args[i + 1 : i + 2], args[:i] + args[i + 2 :]
        else:
            model, rest = [args[i].split("=", 1)[1]], args[:i] + args[i + 1 :]
        args = model + rest

    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            out.append("--" + head.replace("_", "-") + dot + tail + eq + value)
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(arg)

    merged: dict[str, dict[str, Any]] = {}
    result: list[str] = []
    skip = False
    for i, arg in enumerate(out):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if not (arg.startswith("-") and "." in name):
            result.append(arg)
            continue
        if "=" in arg:
            name, value = arg.split("=", 1)
        elif i + 1 < len(out):
            value, skip = out[i + 1], True
        else:
            result.append(arg)  # let argparse report the missing value
            continue
        if name.endswith("+"):
            name, parsed = name[:-1], value.split(",")
        else:
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError:
                try:
                    parsed = human_readable_int(value)
                except ValueError:
                    parsed = value
        flag, *keys = name.split(".")
        node = merged.setdefault(flag, {})
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if isinstance(parsed, list) and isinstance(node.get(keys[-1]), list):
            node[keys[-1]] += parsed
        else:
            node[keys[-1]] = parsed
    for flag, value in merged.items():
        result += [flag, json.dumps(value)]
    return result


def _typed(dest: str, fn: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(value: str) -> Any:
        try:
            return fn(value)
        except (ValueError, TypeError, json.JSONDecodeError):
            raise argparse.ArgumentTypeError(f"invalid {TYPE_NAMES.get(fn, 'value')} value: {value!r}") from None

    convert.__name__ = TYPE_NAMES.get(fn, dest)
    return convert


@lru_cache(maxsize=4)
def load_spec(args_file: Path = ARGS_FILE, extra_file: Path = EXTRA_FILE) -> dict[str, Any]:
    spec = json.loads(Path(args_file).read_text(encoding="utf-8"))
    extra = json.loads(Path(extra_file).read_text(encoding="utf-8"))["flags"]
    flags = dict(spec["flags"])
    for flag, entry in extra.items():
        flags.setdefault(flag, entry)
    return {**spec, "flags": flags}


def build_parser(spec: dict[str, Any] | None = None) -> VllmArgumentParser:
    spec = spec or load_spec()
    parser = VllmArgumentParser(prog="vllm serve", description="Start the (simulated) vLLM OpenAI-compatible server.")
    parser.value_sets = dict(spec.get("value_sets", {}))
    parser.add_argument("model_tag", nargs="?", default=None, help="the model (Hugging Face id or path)")
    done: set[str] = set()
    for flag, entry in spec["flags"].items():
        if flag in done or flag in ("-h", "--help"):
            continue
        names = [flag] + [a for a in entry.get("aliases", []) if a in spec["flags"] or a.startswith("-")]
        done.update(names)
        dest = entry["dest"]
        kwargs: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS}
        if not entry.get("takes_value"):
            kwargs["action"] = "store_false" if entry.get("negates") else "store_true"
        else:
            if entry.get("nargs") not in (None, 0):
                kwargs["nargs"] = entry["nargs"]
            if entry.get("choices"):
                kwargs["choices"] = entry["choices"]
            if dest in TYPES:
                kwargs["type"] = _typed(dest, TYPES[dest])
        parser.add_argument(*names, **kwargs)
    return parser


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    """Parse the arguments after `vllm serve`; exits 2 with vLLM's message on anything vLLM rejects."""
    return build_parser().parse_args(argv)
