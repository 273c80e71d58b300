#!/usr/bin/env python3
"""Build-time proof that a serving image carries the vLLM whose CLI sparkdeploy validates against.

sparkdeploy checks every rendered `vllm serve` flag against the image's own images/<image>/vllm-args-<version>.json,
dumped from the vLLM sources the image pins (scripts/dump_vllm_args.py; for a fork, derived by
scripts/derive_fork_args.py). That is only worth something if the image really runs those sources, so the
Dockerfiles run this script after installing vLLM (shared by vllm-node and vllm-node-mxfp4 through
`include: [../vllm-check]`) and the build fails on:
- a vLLM version other than the pinned one (the `+g<sha>`/`+cu1xx` local suffix of a source build is ignored);
- a torch other than the base image's (pip replacing NVIDIA's GB10-ready torch with a PyPI wheel);
- any difference between the installed parser's option strings and the JSON, except the flags the JSON lists
  as `unverified_flags` (a fork's flags that could not be proven either way where the JSON was made) and the
  declared extra flags, which must be present;
- a missing launcher, Ray or fastsafetensors.
`--record-only` reports the same problems but exits 0 (an owner refreshing the JSON from a built image).
Every run writes the installed parser's option strings to /opt/sparkdeploy/vllm-option-strings.txt.

There is no GPU during `docker build`, so the parser is built with the CPU platform forced, the same way
the JSON was produced (vLLM's config dataclasses need a platform to compute their defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ["VLLM_TARGET_DEVICE"] = "cpu"  # before the first `import vllm`


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--args-json", type=Path, required=True)
    ap.add_argument("--expect-version", required=True)
    ap.add_argument("--torch-version", help="torch.__version__ of the base image, before vLLM was installed")
    ap.add_argument("--extra-flag", action="append", default=[], help="a flag only this image has")
    ap.add_argument("--require-file", action="append", default=[], type=Path)
    ap.add_argument("--record-only", action="store_true", help="report problems but exit 0")
    ap.add_argument("--option-strings-out", type=Path, default=Path("/opt/sparkdeploy/vllm-option-strings.txt"))
    args = ap.parse_args()
    problems: list[str] = []

    import torch
    import vllm

    public = vllm.__version__.split("+", 1)[0]  # 0.1.dev12777+g045293d82 -> 0.1.dev12777
    if public != args.expect_version:
        problems.append(f"vLLM {vllm.__version__} is installed, the image pins {args.expect_version}")
    if args.torch_version and torch.__version__ != args.torch_version:
        problems.append(f"torch changed from the base image's {args.torch_version} to {torch.__version__}")

    import vllm.platforms as platforms

    if getattr(platforms, "_current_platform", None) is None:
        # Releases before the 0.2x line (and forks of them) choose the CPU platform only for a `+cpu` build,
        # whatever VLLM_TARGET_DEVICE says; a build has no GPU, so set the choice where vllm.platforms caches it.
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()
    try:  # where `vllm serve` builds its parser: launchers/ since the 0.2x releases, openai/ before
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    real = {opt for action in parser._actions for opt in action.option_strings}
    if args.option_strings_out.parent.is_dir():
        args.option_strings_out.write_text("".join(f"{o}\n" for o in sorted(real)))
    spec = json.loads(args.args_json.read_text())
    if spec.get("vllm_version") != args.expect_version:
        problems.append(f"{args.args_json} describes vLLM {spec.get('vllm_version')}, not {args.expect_version}")
    expected = set(spec["flags"])
    extra = set(args.extra_flag)
    unproven = set(spec.get("unverified_flags", []))
    missing = sorted(expected - real)
    unexpected = sorted(real - expected - extra - unproven)
    absent_extra = sorted(extra - real)
    if missing:
        problems.append(f"flags in {args.args_json.name} that this vLLM lacks: {' '.join(missing)}")
    if unexpected:
        problems.append(f"flags this vLLM has that {args.args_json.name} lacks: {' '.join(unexpected)}")
    if absent_extra:
        problems.append(f"declared extra flags this vLLM does not accept: {' '.join(absent_extra)}")

    for module in ("ray", "fastsafetensors"):
        try:
            __import__(module)
        except Exception as exc:  # noqa: BLE001 - any import failure means the image is unusable for that backend
            problems.append(f"cannot import {module}: {exc}")
    for path in args.require_file:
        if not path.is_file():
            problems.append(f"{path} is missing")

    if problems:
        print("image check FAILED:" if not args.record_only else "image check (record only) found:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        if not args.record_only:
            print(
                "  If the image is right and the JSON is wrong, rebuild with --build-arg CHECK=--record-only and "
                "refresh the JSON from the image (docs/images.md, 'Refreshing a flag dump').",
                file=sys.stderr,
            )
        return 0 if args.record_only else 1
    print(
        f"image check ok: vLLM {vllm.__version__}, torch {torch.__version__}, {len(real)} option strings"
        + (f", extra {' '.join(sorted(extra))}" if extra else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
