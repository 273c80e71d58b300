#!/usr/bin/env python3
"""Dump what a vLLM release accepts in `--speculative-config`, and the metrics it reports, as data.

sparkdeploy renders a recipe's `speculative:` as vLLM's `--speculative-config` JSON; the method names and the
option names it may carry are read here from exactly the sources the image pins, never from a hand-written list:

- `methods`: the values of `SpeculativeMethod` in vllm/config/speculative.py (nested Literal aliases expanded),
  and `mtp_aliases`: `MTPModelTypes` (each is rewritten to `mtp` by SpeculativeConfig.__post_init__);
- `options`: the fields of `SpeculativeConfig` (an annotated name in its class body), less those the engine fills
  itself (`SkipValidation[...]`: target_model_config, draft_model_config and the parallel configs);
- `metrics`: the `vllm:spec_decode_*` counter names of vllm/v1/spec_decode/metrics.py.

It reads the source text with `ast` (no import of vLLM, so no GPU and no torch), from an unpacked wheel:

    python3 scripts/dump_vllm_speculative.py --vllm /tmp/vllm032/venv/lib/python3.11/site-packages/vllm \\
        --expect-version 0.32.0 --out images/vllm-node/vllm-speculative-0.32.0.json

`--check` compares instead of writing (exit 1 on a difference). The output is deterministic (sorted, no time).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path


def _literal_values(node: ast.expr, aliases: dict[str, ast.expr]) -> list[str]:
    """The strings of `Literal[...]`, with names of other Literal aliases expanded."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in aliases:
        return _literal_values(aliases[node.id], aliases)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
        inner = node.slice
        items = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        return [v for item in items for v in _literal_values(item, aliases)]
    raise SystemExit(f"unexpected node in a Literal: {ast.dump(node)[:120]}")


def speculative_config(source: str) -> dict[str, list[str]]:
    tree = ast.parse(source)
    aliases = {
        t.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    if "SpeculativeMethod" not in aliases:
        raise SystemExit("no SpeculativeMethod in this speculative.py")
    methods = sorted(set(_literal_values(aliases["SpeculativeMethod"], aliases)))
    mtp = sorted(set(_literal_values(aliases["MTPModelTypes"], aliases))) if "MTPModelTypes" in aliases else []
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig"), None)
    if cls is None:
        raise SystemExit("no class SpeculativeConfig in this speculative.py")
    options, internal = [], []
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            name = item.target.id
            if name.startswith("_"):
                continue
            text = ast.unparse(item.annotation)
            (internal if text.startswith("SkipValidation[") else options).append(name)
    return {"methods": methods, "mtp_aliases": mtp, "options": sorted(options), "engine_filled": sorted(internal)}


def spec_metrics(source: str) -> list[str]:
    return sorted(set(re.findall(r'"(vllm:spec_decode_[a-z_]+)"', source)))


def dump(vllm_dir: Path, version: str) -> dict:
    spec = speculative_config((vllm_dir / "config" / "speculative.py").read_text())
    return {
        "vllm_version": version,
        "source": (
            f"vllm/config/speculative.py (SpeculativeMethod, MTPModelTypes, SpeculativeConfig's fields) and "
            f"vllm/v1/spec_decode/metrics.py of vLLM {version}, read with ast by scripts/dump_vllm_speculative.py"
        ),
        **spec,
        "metrics": spec_metrics((vllm_dir / "v1" / "spec_decode" / "metrics.py").read_text()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", required=True, type=Path, help="the installed vllm package folder")
    ap.add_argument("--expect-version", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args(argv)
    meta = next(args.vllm.parent.glob("vllm-*.dist-info"), None)
    found = meta.name.removeprefix("vllm-").removesuffix(".dist-info") if meta else None
    if found != args.expect_version:
        print(f"the vLLM at {args.vllm} is {found}, not {args.expect_version}", file=sys.stderr)
        return 1
    text = json.dumps(dump(args.vllm, args.expect_version), indent=1, sort_keys=True) + "\n"
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print("same" if same else f"{args.out} differs from the sources")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
