#!/usr/bin/env python3
"""Dump the real `vllm serve` argument parser of an installed vLLM as data.

sparkdeploy renders vLLM command lines; tests check them against this file instead of
against a hand-written flag list, so a flag that the pinned vLLM does not know fails in CI,
not on a Spark at 2 a.m.

Run it with a Python that has the pinned vLLM installed (a throwaway venv outside the repo;
docs/vllm-version.md says exactly how to make one on a CPU-only machine):

    VLLM_TARGET_DEVICE=cpu /tmp/vllm032/venv/bin/python scripts/dump_vllm_args.py \
        --expect-version 0.32.0 --out images/vllm-node/vllm-args-0.32.0.json

`--check` compares instead of writing (exit 1 on a difference). `--parse FILE` instead parses every argv of
FILE (a JSON mapping of name -> the arguments after `vllm serve`) with that real parser, the dict options'
JSON validated as vLLM validates it (--compilation-config into its CompilationConfig), and the parser names
checked against its registries as the server does at start; one line per argv, exit 1 on any refusal
(tests/test_eugr_argv.py runs it on what sparkdeploy renders for the eugr recipes):

    VLLM_TARGET_DEVICE=cpu /tmp/vllm032/venv/bin/python scripts/dump_vllm_args.py --parse argv.json

The output is deterministic (sorted keys, no timestamps, no object reprs): rerunning it
against the same wheel gives a byte-identical file.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import sys
from pathlib import Path
from typing import Any, get_args

# vLLM picks its platform at import time. Without a GPU it falls back to
# "UnspecifiedPlatform", which is enough for some imports but not all; forcing the CPU
# platform (vllm/platforms/__init__.py: cpu_platform_plugin reads VLLM_TARGET_DEVICE) is the
# documented way to build the parser on a machine with no accelerator. It must be set
# before the first `import vllm`.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

# Where `vllm serve` builds its parser: vllm.entrypoints.launchers.cli_args since the 0.2x releases,
# vllm.entrypoints.openai.cli_args before (0.13/0.14 and the forks based on them).
PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")


def parser_module() -> str:
    import importlib.util

    for name in PARSER_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except ModuleNotFoundError:
            continue
    raise SystemExit(f"no vLLM parser module found (tried {', '.join(PARSER_MODULES)})")


def parser_call() -> str:
    return f"{parser_module()}.make_arg_parser(vllm.utils.argparse_utils.FlexibleArgumentParser())"


def _jsonable(value: Any) -> Any:
    """Choices can be str, int, enum members: keep them JSON-friendly and stable."""
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _choices(action: argparse.Action) -> list[Any] | None:
    if action.choices is None:
        return None
    values = [_jsonable(c) for c in action.choices]
    if isinstance(action.choices, (set, frozenset)):  # no stable order of its own
        values = sorted(values, key=str)
    return values


def _takes_value(action: argparse.Action) -> bool:
    # store_true/store_false/BooleanOptionalAction/help/version have nargs == 0.
    # nargs "?" (e.g. flags that work bare or with a value) still *accepts* a value.
    return action.nargs != 0


def _nargs(action: argparse.Action) -> Any:
    return action.nargs if isinstance(action.nargs, (str, int)) or action.nargs is None else str(action.nargs)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return importlib.import_module(parser_module()).make_arg_parser(FlexibleArgumentParser())


def dump_flags(parser: argparse.ArgumentParser) -> tuple[dict[str, Any], list[str]]:
    flags: dict[str, Any] = {}
    positionals: list[str] = []
    for action in parser._actions:  # argparse has no public walk
        if not action.option_strings:
            positionals.append(action.dest)
            continue
        # BooleanOptionalAction registers "--x" and "--no-x" on one action: they are
        # opposites, not aliases, so record the pairing explicitly.
        negative = {
            o
            for o in action.option_strings
            if isinstance(action, argparse.BooleanOptionalAction) and o.startswith("--no-")
        }
        for opt in action.option_strings:
            if opt in flags:
                raise SystemExit(f"option string {opt} registered twice")
            same_side = [o for o in action.option_strings if (o in negative) == (opt in negative)]
            entry: dict[str, Any] = {
                "dest": action.dest,
                "takes_value": _takes_value(action),
                "nargs": _nargs(action),
                "choices": _choices(action),
                "aliases": sorted(o for o in same_side if o != opt),
            }
            if negative:
                other = sorted(o for o in action.option_strings if (o in negative) != (opt in negative))
                entry["negated_by" if opt not in negative else "negates"] = other
            flags[opt] = entry
    return dict(sorted(flags.items())), positionals


def value_sets() -> dict[str, list[str]]:
    """Values that vLLM validates *after* argparse (argparse `choices` is None for them)."""
    from vllm.config.parallel import DistributedExecutorBackend
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.model_executor.model_loader import LoadFormats
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    return {
        # vllm/entrypoints/launchers/launcher.py validate_api_server_args: the registered parsers (eager and
        # lazy), checked when the server starts; a --reasoning-parser-plugin / --tool-parser-plugin file can
        # register more names before that
        "--reasoning-parser": sorted(ReasoningParserManager.list_registered()),
        "--tool-call-parser": sorted(ToolParserManager.list_registered()),
        # vllm/config/parallel.py: DistributedExecutorBackend Literal (an Executor subclass
        # is also accepted from Python, which is why argparse has no choices here)
        "--distributed-executor-backend": sorted(get_args(DistributedExecutorBackend)),
        # vllm/model_executor/model_loader/__init__.py: LoadFormats Literal
        "--load-format": sorted(get_args(LoadFormats)),
        # vllm/model_executor/layers/quantization/__init__.py: QUANTIZATION_METHODS
        "--quantization": sorted(QUANTIZATION_METHODS),
    }


def compilation_defaults() -> dict[str, Any]:
    """The splitting ops vLLM uses when `splitting_ops` is left unset.

    An explicit `splitting_ops` list in --compilation-config REPLACES this list (it is only
    filled in when the field is None), so an eager all-reduce must be `defaults +
    ["vllm::all_reduce"]`. We compute it with vLLM's own code instead of copying a list:
    CompilationConfig.set_splitting_ops_for_v1 under the default optimization level (-O2:
    mode VLLM_COMPILE, use_inductor_graph_partition False, fuse_attn_quant False).
    """
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode
    from vllm.config.vllm import OPTIMIZATION_LEVEL_TO_CONFIG, VllmConfig

    level = VllmConfig.__dataclass_fields__["optimization_level"].default
    level_cfg = OPTIMIZATION_LEVEL_TO_CONFIG[level]["compilation_config"]
    cfg = CompilationConfig(mode=CompilationMode.VLLM_COMPILE)
    cfg.use_inductor_graph_partition = level_cfg["use_inductor_graph_partition"]
    fuse_attn_quant = level_cfg["pass_config"]["fuse_attn_quant"]
    assert fuse_attn_quant is False, "default level fuses attn+quant: splitting ops differ"
    cfg.pass_config.fuse_attn_quant = False
    cfg.set_splitting_ops_for_v1(all2all_backend="allgather_reducescatter")
    return {
        "optimization_level": f"O{int(level)}",
        "cudagraph_mode": level_cfg["cudagraph_mode"].name,
        "splitting_ops": list(cfg.splitting_ops or []),
    }


def environment_variables() -> list[str]:
    """VLLM_* variables this release knows. Others only get a warning at startup
    (vllm/platforms/interface.py: validate_environ), so a misspelt or retired one silently does nothing."""
    import vllm.envs as envs

    return sorted(envs.environment_variables)


def wheel_provenance() -> str:
    """Which wheel the installed vLLM came from (pip's direct_url.json, if present)."""
    from importlib.metadata import distribution

    dist = distribution("vllm")
    raw = dist.read_text("direct_url.json")
    if not raw:
        return "vllm from an index (no direct_url.json)"
    info = json.loads(raw)
    name = info.get("url", "").rsplit("/", 1)[-1]
    digest = info.get("archive_info", {}).get("hashes", {}).get("sha256") or info.get("archive_info", {}).get(
        "hash", ""
    )
    return f"{name} sha256:{digest.removeprefix('sha256=')}"


def force_cpu_platform() -> None:
    """Releases before the 0.2x line (0.13, 0.14 and forks of them) choose the CPU platform only for a `+cpu`
    build of vLLM, whatever VLLM_TARGET_DEVICE says: set it where vllm.platforms caches its choice, before
    anything asks (newer releases pick the same CpuPlatform from the variable)."""
    import vllm.platforms as platforms

    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu" and getattr(platforms, "_current_platform", None) is None:
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()


def build_document(expect_version: str | None) -> dict[str, Any]:
    import torch
    import vllm

    force_cpu_platform()
    from vllm.platforms import current_platform

    version = vllm.__version__
    if expect_version and version != expect_version:
        raise SystemExit(f"installed vLLM is {version}, expected {expect_version}")
    parser = build_parser()
    flags, positionals = dump_flags(parser)
    source = (
        f"{parser_call()} from vLLM {version} ({wheel_provenance()}), installed with "
        f"`pip install --no-deps` into a throwaway venv with torch {torch.__version__} and "
        f"only the packages the parser import needs; platform forced to "
        f"{type(current_platform).__name__} via VLLM_TARGET_DEVICE=cpu; "
        "written by scripts/dump_vllm_args.py (see docs/vllm-version.md)"
    )
    return {
        "vllm_version": version,
        "source": source,
        "positionals": positionals,
        # FlexibleArgumentParser rewrites some argv forms before argparse sees them
        # (vllm/utils/argparse_utils.py, FlexibleArgumentParser.parse_args):
        "preprocessing": {
            "-O<x>, -O=<x>, -O <n>": "--optimization-level <x> (levels 0-3; the spaced form only for 0-3); "
            "-O is no longer a --compilation-config shorthand",
            "--a_b": "--a-b (underscores in flag names become dashes)",
            "--x.y.z V": '--x \'{"y": {"z": V}}\' (dotted keys into a JSON dict argument)',
            "--x.y+ A,B": "list [A, B]; repeated occurrences on one command line are concatenated, "
            "but the result still REPLACES the default of x.y",
        },
        "value_sets": value_sets(),
        "compilation_defaults": compilation_defaults(),
        "environment_variables": environment_variables(),
        "flags": flags,
    }


def parse_all(path: Path) -> int:
    """Parse each argv of the JSON mapping at `path` with vLLM's own `vllm serve` parser: 0 when all parse."""
    import contextlib
    import io

    force_cpu_platform()
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    registries = {
        "reasoning_parser": ("reasoning_parser_plugin", ReasoningParserManager.list_registered()),
        "tool_call_parser": ("tool_parser_plugin", ToolParserManager.list_registered()),
    }
    failures = 0
    for name, args in json.loads(path.read_text()).items():
        parser = build_parser()
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(list(args))
        except SystemExit:
            failures += 1
            lines = err.getvalue().strip().splitlines() or ["exit"]
            print(f"FAIL {name}: {next((x for x in lines if 'error:' in x), lines[-1])}")
            continue
        bad = [
            f"{dest} {getattr(ns, dest)!r} is not registered"
            for dest, (plugin, known) in registries.items()
            if getattr(ns, dest, None) and not getattr(ns, plugin, None) and getattr(ns, dest) not in known
        ]
        if bad:
            failures += 1
            print(f"FAIL {name}: {'; '.join(bad)}")
            continue
        print(f"ok   {name}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parse", type=Path, help="parse each argv of this JSON mapping (name -> argv) and report")
    ap.add_argument("--out", type=Path, help="write the JSON here (default: stdout)")
    ap.add_argument("--expect-version", default=None, help="fail unless vllm.__version__ is this")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing")
    ap.add_argument("--source-ref", help="for a fork: owner/repo@commit8, said in every lint message")
    args = ap.parse_args(argv)
    if args.parse is not None:
        return parse_all(args.parse)

    doc = build_document(args.expect_version)
    if args.source_ref:
        doc = {
            "vllm_version": doc["vllm_version"],
            "source_ref": args.source_ref,
            **{k: v for k, v in doc.items() if k != "vllm_version"},
        }
    text = json.dumps(doc, indent=1, sort_keys=False, ensure_ascii=True) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} differs from the installed vLLM's parser", file=sys.stderr)
            return 1
        print(f"{args.out} matches vLLM {doc['vllm_version']} ({len(doc['flags'])} option strings)")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}: vLLM {doc['vllm_version']}, {len(doc['flags'])} option strings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
