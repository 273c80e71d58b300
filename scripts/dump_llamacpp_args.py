#!/usr/bin/env python3
"""Dump the real `llama-server` command line of a llama.cpp build as data: its `--help`, parsed.

The llama.cpp twin of scripts/dump_vllm_args.py: sparkdeploy renders llama-server command lines, and tests check
them against this file instead of a hand-written flag list, so a flag the pinned llama.cpp does not know fails
in CI, not on a Spark. llama.cpp has no Python parser to import; its parser is C++ (common/arg.cpp), so the
data comes from the binary itself:

- `llama-server --help`: every option, printed by common_arg::to_string() as `NAMES [VALUE_HINT [HINT2]]` padded
  to column 40, then the help text, whose last line is `(env: LLAMA_ARG_...)` when the option has a variable;
  sections `----- common params -----`, `sampling params`, `speculative params`, `example-specific params`;
- `llama-server --completion-bash`: the positive names of every option (common_params_print_completion), which
  must equal the names parsed from the help (a parser self-check: a wrapped or mis-split line fails the dump);
- `llama-server --version`: `version: N (COMMIT)`, the build number that names the fixture (`bN`).

Every option is registered whatever the backend (GPU-only ones such as -ngl only warn at run time on a CPU
build: common/arg.cpp), so the CPU build of images/llamacpp-cpu gives the GB10 build's flags too. The JSON
holds no help text (defaults such as thread counts can differ per build); the raw help is written beside it.

    python3 scripts/dump_llamacpp_args.py --image sparkdeploy/llamacpp-cpu:TAG --expect-version b11434 \
        --out-dir tests/fixtures                  # writes llama-server-b11434-args.json and -help.txt
    python3 scripts/dump_llamacpp_args.py --image sparkdeploy/llamacpp:TAG --check --out-dir tests/fixtures
    python3 scripts/dump_llamacpp_args.py --help-file H --completion-file C --version-file V ...   # no Docker

`--check` compares the flags with the fixture instead of writing (exit 1 with the differences). Deterministic:
the same binary gives byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

HELP_COLUMN = 40  # common_arg::to_string: n_leading_spaces
SECTION = re.compile(r"^----- (.+) -----$")
ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")
VERSION = re.compile(r"version: (\d+) \(([^)]*)\)")
OPTS = re.compile(r'^\s*opts="([^"]*)"', re.M)


def is_negative(name: str) -> bool:
    return name.startswith(("--no-", "-no-"))


def split_head(line: str) -> tuple[str, str]:
    """(names and value hints, first help line) of an option's first line."""
    if len(line) > HELP_COLUMN and line[HELP_COLUMN - 3 : HELP_COLUMN] == "   " and line[HELP_COLUMN] != " ":
        return line[:HELP_COLUMN].rstrip(), line[HELP_COLUMN:].strip()
    return line.rstrip(), ""  # a head longer than 37 characters: the help starts on the next line


def choices_of(hint: str) -> list[str] | None:
    """`{none,layer,row}` and `[on|off|auto]` list their values; other hints (N, FNAME, ...) do not."""
    m = re.fullmatch(r"\{([^{}]+)\}|\[([^\[\]]+)\]", hint)
    if not m:
        return None
    body = m.group(1) or m.group(2)
    values = re.split(r"[,|]", body)
    return values if all(re.fullmatch(r"[A-Za-z0-9_.+-]+", v) for v in values) else None


def parse_help(text: str) -> list[dict[str, Any]]:
    """The options of `--help`, in order: names, value hints, env variable, section."""
    options: list[dict[str, Any]] = []
    section = ""
    current: dict[str, Any] | None = None
    for raw in text.splitlines():
        m = SECTION.match(raw.strip())
        if m:
            section, current = m.group(1), None
            continue
        if raw.startswith("-"):
            head, first_help = split_head(raw)
            tokens = [t for t in re.split(r",\s*|\s+", head) if t]
            names = []
            while tokens and tokens[0].startswith("-") and len(tokens[0]) > 1:
                names.append(tokens.pop(0))
            current = {"names": names, "hints": tokens, "help": [first_help] if first_help else [], "section": section}
            options.append(current)
        elif current is not None and raw.startswith(" " * HELP_COLUMN):
            current["help"].append(raw.strip())
        elif raw.strip():
            current = None  # usage text, server notes: not an option
    for opt in options:
        env = ENV.search(" ".join(opt["help"]))
        opt["env"] = env.group(1) if env else None
    return options


def flags_of(options: list[dict[str, Any]]) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    for opt in options:
        names, hints = opt["names"], opt["hints"]
        takes_value = bool(hints)
        # --x / --no-x pairs live on one option (common_arg's args_neg) and only for options without a value
        negatives = {n for n in names if is_negative(n)} if not takes_value else set()
        if negatives == set(names):
            negatives = set()  # an option whose every name is --no-...: it is the positive form itself
        for name in names:
            if name in flags:
                raise SystemExit(f"option {name} appears twice in --help: the parser is wrong")
            side = [n for n in names if (n in negatives) == (name in negatives)]
            entry: dict[str, Any] = {
                "aliases": sorted(n for n in side if n != name),
                "takes_value": takes_value,
                "value_hint": " ".join(hints) or None,
                "values": len(hints),
                "choices": choices_of(hints[0]) if len(hints) == 1 else None,
                "env": opt["env"],
                "section": opt["section"],
            }
            if negatives:
                other = sorted(n for n in names if (n in negatives) != (name in negatives))
                entry["negates" if name in negatives else "negated_by"] = other
            flags[name] = entry
    return dict(sorted(flags.items()))


def completion_names(text: str) -> list[str]:
    m = OPTS.search(text)
    if not m:
        raise SystemExit('no opts="..." line in --completion-bash output')
    return m.group(1).split()


def self_check(flags: dict[str, Any], completion: list[str]) -> list[str]:
    """The names --completion-bash lists (every option's positive names) against those parsed from --help."""
    positives = {n for n, f in flags.items() if "negates" not in f}
    problems = [f"{n}: in --completion-bash, not parsed from --help" for n in sorted(set(completion) - positives)]
    problems += [f"{n}: parsed from --help, not in --completion-bash" for n in sorted(positives - set(completion))]
    return problems


def build_document(help_text: str, completion_text: str, version_text: str, source: str) -> dict[str, Any]:
    m = VERSION.search(version_text)
    if not m:
        raise SystemExit(f"no `version: N (COMMIT)` in --version output: {version_text.strip()[:200]!r}")
    options = parse_help(help_text)
    flags = flags_of(options)
    problems = self_check(flags, completion_names(completion_text))
    if problems:
        raise SystemExit("the --help parse disagrees with --completion-bash:\n  " + "\n  ".join(problems))
    sections: list[str] = []
    for opt in options:
        if opt["section"] not in sections:
            sections.append(opt["section"])
    return {
        "engine": "llama.cpp",
        "binary": "llama-server",
        "llamacpp_version": f"b{m.group(1)}",
        "build_commit": m.group(2),
        "source": source,
        "parsing": {
            "names": "an option's names are aliases (-m, --model); --x and --no-x on one option are opposites "
            "(negates / negated_by), never aliases",
            "values": "takes_value options read the next argv element (llama.cpp has no --flag=value form); "
            "values > 1 means that many elements",
            "underscores": "a --long_name is read as --long-name (common_params_parse_ex replaces _ by -)",
            "env": "each option's LLAMA_ARG_* variable sets it too; for --x/--no-x pairs LLAMA_ARG_NO_* also",
        },
        "sections": sections,
        "flags": flags,
    }


def run_image(image: str) -> tuple[str, str, str]:
    def out(*args: str) -> str:
        r = subprocess.run(["docker", "run", "--rm", image, "llama-server", *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(
                f"llama-server {' '.join(args)} in {image} exited {r.returncode}: {r.stderr.strip()[-500:]}"
            )
        return r.stdout + ("" if args[0] != "--version" else r.stderr)

    return out("--help"), out("--completion-bash"), out("--version")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", help="a Docker image with llama-server on PATH (docker run --rm IMAGE llama-server ...)")
    ap.add_argument("--help-file", type=Path, help="saved `llama-server --help` output (instead of --image)")
    ap.add_argument("--completion-file", type=Path, help="saved `llama-server --completion-bash` output")
    ap.add_argument("--version-file", type=Path, help="saved `llama-server --version` output (stdout and stderr)")
    ap.add_argument(
        "--out-dir", type=Path, required=True, help="where llama-server-<version>-args.json and -help.txt go"
    )
    ap.add_argument("--expect-version", help="fail unless the build is this one (b11434)")
    ap.add_argument("--check", action="store_true", help="compare the flags with the fixture instead of writing")
    args = ap.parse_args(argv)

    if args.image:
        help_text, completion_text, version_text = run_image(args.image)
        source = f"`llama-server --help`, `--completion-bash` and `--version` run in image {args.image}"
    elif args.help_file and args.completion_file and args.version_file:
        help_text, completion_text = args.help_file.read_text(), args.completion_file.read_text()
        version_text = args.version_file.read_text()
        source = f"saved `llama-server --help` ({args.help_file.name}), `--completion-bash` and `--version` output"
    else:
        ap.error("give --image, or all of --help-file, --completion-file and --version-file")
    source += "; parsed by scripts/dump_llamacpp_args.py (docs/engines-research/llamacpp.md)"
    doc = build_document(help_text, completion_text, version_text, source)
    version = doc["llamacpp_version"]
    if args.expect_version and version != args.expect_version:
        raise SystemExit(f"the build is llama.cpp {version}, expected {args.expect_version}")
    json_path = args.out_dir / f"llama-server-{version}-args.json"
    help_path = args.out_dir / f"llama-server-{version}-help.txt"
    if args.check:
        if not json_path.is_file():
            print(f"{json_path}: missing (no fixture for llama.cpp {version})", file=sys.stderr)
            return 1
        want = json.loads(json_path.read_text())["flags"]
        got = doc["flags"]
        diff = [f"{n}: only in the fixture" for n in sorted(set(want) - set(got))]
        diff += [f"{n}: only in this build" for n in sorted(set(got) - set(want))]
        diff += [f"{n}: differs ({want[n]} vs {got[n]})" for n in sorted(set(want) & set(got)) if want[n] != got[n]]
        if diff:
            print(f"{json_path} differs from this build:\n  " + "\n  ".join(diff), file=sys.stderr)
            return 1
        print(f"{json_path} matches this build ({len(got)} option strings)")
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=1, ensure_ascii=True) + "\n")
    help_path.write_text(help_text)
    print(f"wrote {json_path} ({len(doc['flags'])} option strings) and {help_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
