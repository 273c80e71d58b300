#!/usr/bin/env python3
"""Dump the real `python -m sglang.launch_server` argument parser of an installed SGLang as data.

The SGLang twin of scripts/dump_vllm_args.py: sparkdeploy will render SGLang command lines, and tests check
them against this file instead of a hand-written flag list. SGLang builds its CLI at run time from msgspec
fields across sglang/srt/arg_groups/fields/*.py (arg_groups/arg_utils.py: add_cli_args_from_dataclass), plus
a few flags added by hand in ServerArgs.add_cli_args (srt/server_args.py:350-444); reading server_args.py
as text finds almost none of them, so this script imports SGLang and walks the parser it builds.

Which parser: `python -m sglang.launch_server` (and `sglang serve`) call
`sglang.srt.server_args.prepare_server_args(argv)` (launch_server.py:81), which makes
`argparse.ArgumentParser(prog="sglang serve")`, calls `ServerArgs.add_cli_args` and then `parse_args`
(server_args.py:668-698). The script calls prepare_server_args itself and takes the parser at the moment
its parse_args is called, so the dump is that exact object (prog, allow_abbrev and all), not a copy made
here.

The pinned release (x86-64 is the only cp311 wheel on PyPI; the Python files are the same on arm64):

    sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl  39,063,923 bytes
    sha256 00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937

The smallest install that builds the parser on a CPU-only machine (a throwaway venv outside the repo;
1.4 GB on disk, 0.75 GB of it torch, 65 packages; found by iterating on ImportError; 230 s on the loaded dev box):

    python3.11 -m venv /work/venvs/sglang
    /work/venvs/sglang/bin/pip download --no-deps sglang==0.5.23 -d /work/venvs/dl
    /work/venvs/sglang/bin/pip install --no-deps /work/venvs/dl/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
    /work/venvs/sglang/bin/pip install torch==2.13.0 msgspec numpy orjson psutil pybase64 requests \
        packaging pillow starlette pydantic pyzmq tqdm IPython aiohttp huggingface_hub
    /work/venvs/sglang/bin/python scripts/dump_sglang_args.py --expect-version 0.5.23 \
        --out images/engine-args/sglang-0.5.23-args.json --help-out tests/fixtures/sglang-0.5.23-help.txt

(`--check` compares instead of writing, exit 1 on a difference.) SGLang 0.5.23 itself requires
torch==2.14.1 with CUDA 13 kernels (flashinfer, sglang-kernel, deep-gemm, ...: several GB); none of those
is imported while the parser is built, and the CPU torch 2.13.0 on this machine's disk is enough for the
import (pip warns about the pin; the parser does not read torch's version).

What is stubbed, and why: `triton` only. sglang/srt/utils/common.py:91 does a bare `import triton` (reached
through `import sglang`, sglang/__init__.py:21), and triton is a GPU compiler: its wheel unpacks to ~1 GB
(bundled CUDA tools) for an import whose names are not used while the parser is built. When triton is
not installed, the script puts an empty module named `triton` in sys.modules before importing SGLang; the
stub raises on any attribute read, so if a future release touches triton while building its parser this
script fails loudly instead of dumping something wrong. With the real triton installed no stub is made; a
dump made both ways gave byte-identical JSON and help text (checked for 0.5.23). The document records the
stubbed modules under "stubbed_modules".

The output is deterministic (sorted keys, no timestamps, no object reprs; SGLANG_* variables that change
the parser are cleared; the help is rendered at 100 columns with PYTHONHASHSEED=0, the script re-executing
itself to set it, since one flag's choices are a set): rerunning it against the same wheel gives a
byte-identical file.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import enum
import importlib.util
import io
import json
import os
import re
import runpy
import sys
import types
import warnings
from pathlib import Path
from typing import Any

# SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE adds a "token_oracle" choice to --sampling-backend
# (server_args.py:356-358): the dump is of the parser an ordinary launch gets.
PARSER_ENV = ("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE",)
HELP_COLUMNS = "100"  # argparse wraps help to $COLUMNS


class _StubModule(types.ModuleType):
    """A stand-in for a GPU-only module the parser import names but never uses."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise RuntimeError(
            f"{self.__name__}.{name} was read while SGLang built its parser: {self.__name__} is stubbed by "
            "scripts/dump_sglang_args.py; install the real package into the venv and rerun"
        )


def stub_gpu_only_modules() -> list[str]:
    """Install the stubs the docstring lists, only where the real package is absent. Before `import sglang`."""
    stubbed = []
    for name in ("triton",):
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = _StubModule(name)
            stubbed.append(name)
    return stubbed


def _jsonable(value: Any) -> Any:
    """Defaults and choices can be str, int, float, enum members, lists, dicts: keep them JSON-friendly."""
    if isinstance(value, enum.Enum):
        return _jsonable(value.value) if isinstance(value.value, (str, int, float)) else value.name
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=str)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return str(value)


def _choices(action: argparse.Action) -> list[Any] | None:
    if action.choices is None:
        return None
    values = [_jsonable(c) for c in action.choices]
    if isinstance(action.choices, (set, frozenset)):  # no stable order of its own
        values = sorted(values, key=str)
    return values


def _type_name(action: argparse.Action) -> str | None:
    """`str`, `int`, `float`, or the name of SGLang's own converter (json_list_type, ...)."""
    kind = action.type
    if kind is None:
        return None
    return getattr(kind, "__name__", None) or type(kind).__name__


def _nargs(action: argparse.Action) -> Any:
    return action.nargs if isinstance(action.nargs, (str, int)) or action.nargs is None else str(action.nargs)


def _default(action: argparse.Action) -> Any:
    if action.default is argparse.SUPPRESS:
        return "==SUPPRESS=="
    return _jsonable(action.default)


def _action_kind(action: argparse.Action) -> str:
    """argparse's registry name (store, store_true, ...) or the class name of a custom action."""
    cls = type(action)
    if cls.__module__ == "argparse":
        return {
            "_StoreAction": "store",
            "_StoreTrueAction": "store_true",
            "_StoreFalseAction": "store_false",
            "_StoreConstAction": "store_const",
            "_AppendAction": "append",
            "_CountAction": "count",
            "_HelpAction": "help",
            "_VersionAction": "version",
            "BooleanOptionalAction": "boolean_optional",
        }.get(cls.__name__, cls.__name__)
    return cls.__name__


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


def build_parser() -> argparse.ArgumentParser:
    """The parser prepare_server_args builds, taken when it calls parse_args (nothing is parsed)."""
    from sglang.srt import server_args

    real = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *_a: Any, **_k: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign,assignment]
    try:
        server_args.prepare_server_args(["--model-path", "unused"])
    except _Captured as got:
        return got.parser
    finally:
        argparse.ArgumentParser.parse_args = real  # type: ignore[method-assign]
    raise SystemExit("prepare_server_args returned without calling parse_args: the launcher changed")


def dump_flags(parser: argparse.ArgumentParser) -> tuple[dict[str, Any], list[str]]:
    flags: dict[str, Any] = {}
    positionals: list[str] = []
    for action in parser._actions:  # argparse has no public walk
        if not action.option_strings:
            positionals.append(action.dest)
            continue
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
                "action": _action_kind(action),
                "takes_value": action.nargs != 0,
                "nargs": _nargs(action),
                "type": _type_name(action),
                "choices": _choices(action),
                "default": _default(action),
                "required": bool(action.required),
                "aliases": sorted(o for o in same_side if o != opt),
            }
            if action.help == argparse.SUPPRESS:
                entry["hidden"] = True  # accepted, but not shown by --help
            new_flag = getattr(action, "new_flag", None)
            if "Deprecated" in type(action).__name__ or (action.help or "").startswith("(Deprecated"):
                entry["deprecated"] = new_flag or True
            if negative:
                other = sorted(o for o in action.option_strings if (o in negative) != (opt in negative))
                entry["negated_by" if opt not in negative else "negates"] = other
            flags[opt] = entry
    return dict(sorted(flags.items())), positionals


def value_sets() -> dict[str, Any]:
    """Values SGLang checks after argparse (argparse `choices` is None for them)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import _RESERVED_ALIASES

    return {
        # speculative/spec_info.py: SpeculativeAlgorithm.from_string upper-cases the name, takes a member or
        # a reserved alias (NEXTN -> EAGLE, spec_registry.py:183), else a plugin-registered name; NONE is
        # what "no flag" becomes, not a value to pass.
        "--speculative-algorithm": {
            "case_insensitive": True,
            "values": sorted({a.name for a in SpeculativeAlgorithm if a.name != "NONE"} | set(_RESERVED_ALIASES)),
        },
    }


def environment_variables() -> list[str]:
    """SGLANG_* (and other) variables this release reads through sglang.srt.environ.Envs."""
    from sglang.srt.environ import EnvField, Envs

    return sorted(v.name for v in vars(Envs).values() if isinstance(v, EnvField))


METRIC_NAME = re.compile(r"^sglang:[a-z0-9_]+$")
EXPOSED_SUFFIXES = {
    # What /metrics shows for each kind. SGLang serves its metrics through prometheus_client's
    # MultiProcessCollector (srt/utils/common.py:2843-2853), which writes no "_created" series; a Counter's
    # name loses and regains "_total".
    "Counter": ["_total"],
    "Gauge": [""],
    "Histogram": ["_bucket", "_count", "_sum"],
    "Summary": ["_count", "_sum"],
}


def _literal_strings(node: ast.AST | None) -> list[str]:
    """String constants in a labelnames expression ([*labels.keys(), "phase"] -> ["phase"])."""
    if node is None:
        return []
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _doc(node: ast.AST | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr | ast.BinOp):
        return "".join(_literal_strings(node))
    return ""


def metrics(package_dir: Path) -> list[dict[str, Any]]:
    """Every Prometheus metric the LLM server (sglang/srt) defines, read from its source with `ast`.

    The collectors build their metrics in __init__ methods that need a running server (labels from the
    served model, ranks), so the names are read where they are written: a call whose `name=` (or first
    argument) is a string "sglang:<name>". The diffusion server (sglang/multimodal_gen) is left out."""
    found: dict[str, dict[str, Any]] = {}
    root = package_dir / "srt"
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            name_node = kw.get("name") or (node.args[0] if node.args else None)
            if not (isinstance(name_node, ast.Constant) and isinstance(name_node.value, str)):
                continue
            name = name_node.value
            if not METRIC_NAME.match(name):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            kind = next((k for k in EXPOSED_SUFFIXES if k in called), called)
            doc_node = kw.get("documentation") or (node.args[1] if len(node.args) > 1 else None)
            base = name.removesuffix("_total") if kind == "Counter" else name
            entry = {
                "name": name,
                "kind": kind,
                "exposed": [base + sfx for sfx in EXPOSED_SUFFIXES.get(kind, [""])],
                "documentation": _doc(doc_node),
                "extra_labels": _literal_strings(kw.get("labelnames")),
                "source": f"sglang/{path.relative_to(package_dir).as_posix()}:{node.lineno}",
            }
            if name in found and found[name]["kind"] != kind:
                raise SystemExit(f"metric {name} defined as {found[name]['kind']} and {kind}")
            found.setdefault(name, entry)
    return sorted(found.values(), key=lambda m: m["name"])


def wheel_provenance() -> str:
    """Which wheel the installed SGLang came from (pip's direct_url.json, if present)."""
    from importlib.metadata import distribution

    raw = distribution("sglang").read_text("direct_url.json")
    if not raw:
        return "sglang from an index (no direct_url.json)"
    info = json.loads(raw)
    name = info.get("url", "").rsplit("/", 1)[-1]
    archive = info.get("archive_info", {})
    digest = archive.get("hashes", {}).get("sha256") or archive.get("hash", "")
    if not digest:
        return name
    return f"{name} sha256:{digest.removeprefix('sha256=')}"


def help_text() -> str:
    """What `python -m sglang.launch_server --help` prints: the module run as __main__ in this process."""
    saved_argv = sys.argv
    out = io.StringIO()
    sys.argv = ["python -m sglang.launch_server", "--help"]
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # launch_server warns that `sglang serve` is preferred
            try:
                runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=False)
            except SystemExit as done:
                if done.code not in (0, None):
                    raise SystemExit(f"--help exited {done.code}") from None
    finally:
        sys.argv = saved_argv
    return out.getvalue()


def build_document(expect_version: str | None, stubbed: list[str]) -> dict[str, Any]:
    import sglang
    import torch
    from sglang.srt.platforms import current_platform

    version = sglang.__version__
    if expect_version and version != expect_version:
        raise SystemExit(f"installed SGLang is {version}, expected {expect_version}")
    parser = build_parser()
    flags, positionals = dump_flags(parser)
    source = (
        f"sglang.srt.server_args.prepare_server_args's parser from SGLang {version} ({wheel_provenance()}), "
        f"installed with `pip install --no-deps` into a throwaway venv with torch {torch.__version__} and only "
        f"the packages the parser import needs; stubbed: {', '.join(stubbed) or 'nothing'}; platform "
        f"{type(current_platform).__name__}; written by scripts/dump_sglang_args.py"
    )
    return {
        "sglang_version": version,
        "source": source,
        "stubbed_modules": stubbed,
        "prog": parser.prog,
        # argparse's default: a unique prefix of a long flag is accepted (--mem-frac 0.8 works); a renderer
        # should still write full names, and a checker must not treat a prefix as unknown without this.
        "allow_abbrev": parser.allow_abbrev,
        "positionals": positionals,
        # prepare_server_args reads --config FILE.yaml and merges it into argv before parsing
        # (server_args.py:682-688, utils/server_args_config_parser.py).
        "preprocessing": {
            "--config FILE": "YAML options merged into argv before argparse; command-line flags win",
        },
        "value_sets": value_sets(),
        "environment_variables": environment_variables(),
        "flags": flags,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the JSON here (default: stdout)")
    ap.add_argument("--help-out", type=Path, help="also write `python -m sglang.launch_server --help` here")
    ap.add_argument("--metrics-out", type=Path, help="also write the Prometheus metrics SGLang defines here")
    ap.add_argument("--expect-version", default=None, help="fail unless sglang.__version__ is this")
    ap.add_argument("--check", action="store_true", help="compare with the output files instead of writing")
    args = ap.parse_args(argv)

    if os.environ.get("PYTHONHASHSEED") != "0" and argv is None:
        # --sampling-backend's choices are a set (server_args.py:354): its order in --help follows string
        # hashing, so the help text is only reproducible with a fixed seed, which must be set at start-up.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    for name in PARSER_ENV:
        os.environ.pop(name, None)
    os.environ["COLUMNS"] = HELP_COLUMNS
    stubbed = stub_gpu_only_modules()
    doc = build_document(args.expect_version, stubbed)
    text = json.dumps(doc, indent=1, sort_keys=False, ensure_ascii=True) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    outputs: list[tuple[Path, str]] = [(args.out, text)]
    if args.help_out is not None:
        outputs.append((args.help_out, help_text()))
    if args.metrics_out is not None:
        import sglang

        found = {"sglang_version": doc["sglang_version"], "metrics": metrics(Path(sglang.__file__).parent)}
        outputs.append((args.metrics_out, json.dumps(found, indent=1, ensure_ascii=True) + "\n"))
    if args.check:
        bad = [str(p) for p, t in outputs if (p.read_text() if p.exists() else "") != t]
        if bad:
            print(f"{', '.join(bad)} differ(s) from the installed SGLang", file=sys.stderr)
            return 1
        print(f"{args.out} matches SGLang {doc['sglang_version']} ({len(doc['flags'])} option strings)")
        return 0
    for path, content in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    written = ", ".join(str(p) for p, _ in outputs)
    print(f"wrote {written}: SGLang {doc['sglang_version']}, {len(doc['flags'])} option strings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
