#!/usr/bin/env python3
"""Build-time proof that a serving image carries the vLLM whose CLI sparkdeploy validates against.

sparkdeploy checks every rendered `vllm serve` flag against images/vllm-node/vllm-args-<version>.json,
dumped from the real vLLM release (scripts/dump_vllm_args.py). That is only worth something if the image
really runs that release, so the Dockerfile runs this script after installing vLLM and the build fails on:
- a vLLM version other than the pinned one (the `+cu1xx` local suffix of a source build is ignored);
- a torch other than the base image's (pip replacing NVIDIA's GB10-ready torch with a PyPI wheel);
- any difference between the installed parser's option strings and the JSON, except the image's declared
  extra flags, which must be present (the MXFP4 image: --mxfp4-layers, --mxfp4-backend);
- a missing launcher, Ray or fastsafetensors.

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
    args = ap.parse_args()
    problems: list[str] = []

    import torch
    import vllm

    public = vllm.__version__.split("+", 1)[0]
    if public != args.expect_version:
        problems.append(f"vLLM {vllm.__version__} is installed, the image pins {args.expect_version}")
    if args.torch_version and torch.__version__ != args.torch_version:
        problems.append(f"torch changed from the base image's {args.torch_version} to {torch.__version__}")

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    real = {opt for action in parser._actions for opt in action.option_strings}  # noqa: SLF001
    spec = json.loads(args.args_json.read_text())
    if spec.get("vllm_version") != args.expect_version:
        problems.append(f"{args.args_json} describes vLLM {spec.get('vllm_version')}, not {args.expect_version}")
    expected = set(spec["flags"])
    extra = set(args.extra_flag)
    missing = sorted(expected - real)
    unexpected = sorted(real - expected - extra)
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
        except Exception as exc:  # any import failure means the image is unusable for that backend
            problems.append(f"cannot import {module}: {exc}")
    for path in args.require_file:
        if not path.is_file():
            problems.append(f"{path} is missing")

    if problems:
        print("image check FAILED:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"image check ok: vLLM {vllm.__version__}, torch {torch.__version__}, {len(real)} option strings"
          + (f", extra {' '.join(sorted(extra))}" if extra else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
