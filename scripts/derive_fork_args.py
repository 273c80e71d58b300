#!/usr/bin/env python3
"""The `vllm serve` CLI of a vLLM fork, from the dumps of the two upstream releases around its base.

A fork whose full source cannot be installed here (christopherowen/vllm: no snapshot, no Git access from
this machine) still has a knowable CLI: it is upstream vLLM main at the fork's base plus the fork's own
changes. This script takes
  - two real dumps (scripts/dump_vllm_args.py) of the upstream releases that bracket the fork's base,
  - the fork's delta file (images/<image>/fork-cli.yaml): the flags the fork adds, and for each flag that
    appeared or vanished between the two releases whether the fork's own arg_utils.py has it,
and writes the fork's flag set. A flag in both releases is in the fork; a flag in only one of them is in
the fork only if the delta file says the fork's source was seen to have it; any other such flag is listed
under `unverified_flags` (recipes may not use it; the image build tolerates it either way). Choices and
value sets are those both releases accept. The image's build then proves the result against the fork's
real parser (images/vllm-check/check_image.py) before anything is served.

    python3 scripts/derive_fork_args.py --low /tmp/fork-args/vllm-args-0.13.0.json \\
        --high /tmp/fork-args/vllm-args-0.14.0.json --delta images/vllm-node-mxfp4/fork-cli.yaml \\
        --out images/vllm-node-mxfp4/vllm-args-0.1.dev12777.json           # --check to compare only
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml


def _base(flag: str) -> str:
    """`--no-x` follows `--x` (BooleanOptionalAction registers both on one action)."""
    return "--" + flag[len("--no-") :] if flag.startswith("--no-") else flag


def _common_choices(a, b):
    if a is None or b is None:
        return a if b is None else b if a is None else None
    keep = set(map(str, a))
    return [c for c in b if str(c) in keep]


def derive(low: dict, high: dict, delta: dict) -> dict:
    seen = set(delta.get("seen_in_fork", []))
    absent = set(delta.get("absent_from_fork", []))
    added = delta.get("added", {})
    flags: dict[str, dict] = {}
    unverified: list[str] = []
    for flag in sorted(set(low["flags"]) | set(high["flags"])):
        in_low, in_high = flag in low["flags"], flag in high["flags"]
        if _base(flag) in absent:
            continue
        if in_low and in_high:
            entry = dict(high["flags"][flag])
            entry["choices"] = _common_choices(low["flags"][flag]["choices"], high["flags"][flag]["choices"])
        elif _base(flag) in seen:
            entry = dict((high if in_high else low)["flags"][flag])
        else:
            unverified.append(flag)
            continue
        flags[flag] = entry
    for flag, entry in added.items():
        if flag in flags:
            raise SystemExit(f"{flag} is listed as added by the fork but upstream already has it")
        flags[flag] = dict(entry)
    present = set(flags)
    for entry in flags.values():  # aliases point only at flags that exist
        entry["aliases"] = sorted(a for a in entry.get("aliases", []) if a in present)
    value_sets = {
        k: [v for v in high["value_sets"][k] if v in set(low["value_sets"].get(k, []))]
        for k in high.get("value_sets", {})
    }
    env = (
        set(low["environment_variables"]) & set(high["environment_variables"]) | set(delta.get("env_added", []))
    ) - set(delta.get("env_removed", []))
    comp = high["compilation_defaults"] if low.get("compilation_defaults") == high.get("compilation_defaults") else None
    fork = delta["fork"]
    return {
        "vllm_version": fork["version"],
        "source_ref": f"{fork['repo'].removeprefix('https://github.com/').removesuffix('.git')}@{fork['commit'][:8]}",
        "source": (
            f"derived by scripts/derive_fork_args.py: the fork {fork['repo']}@{fork['commit']} is upstream vLLM "
            f"main between {low['vllm_version']} and {high['vllm_version']} plus its own changes "
            f"({delta['evidence']}); flags in both releases' real parsers (dumped by scripts/dump_vllm_args.py "
            f"from the PyPI wheels) plus the fork's additions, minus what the fork's arg_utils.py lacks; "
            "proven against the fork's real parser when the image is built (images/vllm-check/check_image.py)"
        ),
        "positionals": high["positionals"],
        "preprocessing": high["preprocessing"],
        "value_sets": value_sets,
        "compilation_defaults": comp,
        "environment_variables": sorted(env),
        "unverified_flags": sorted(unverified),
        "flags": dict(sorted(flags.items())),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--low", type=Path, required=True, help="dump of the release before the fork's base")
    ap.add_argument("--high", type=Path, required=True, help="dump of the release after the fork's base")
    ap.add_argument("--delta", type=Path, required=True, help="the fork's fork-cli.yaml")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing")
    args = ap.parse_args(argv)
    doc = derive(
        json.loads(args.low.read_text()), json.loads(args.high.read_text()), yaml.safe_load(args.delta.read_text())
    )
    text = json.dumps(doc, indent=1, ensure_ascii=True) + "\n"
    if args.check:
        if not args.out.is_file() or args.out.read_text() != text:
            print(f"{args.out} differs from what the dumps and {args.delta} give", file=sys.stderr)
            return 1
        print(f"{args.out} matches ({len(doc['flags'])} option strings, {len(doc['unverified_flags'])} unverified)")
        return 0
    args.out.write_text(text)
    print(
        f"wrote {args.out}: {doc['source_ref']}, {len(doc['flags'])} option strings, "
        f"{len(doc['unverified_flags'])} unverified"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
