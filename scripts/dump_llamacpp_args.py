#!/usr/bin/env python3
"""Dump the real `llama-server` command line of a llama.cpp build as data: its `--help`, parsed.

The llama.cpp twin of scripts/dump_vllm_args.py: sparkdeploy renders llama-server command lines, and tests check
them against this file instead of a hand-written flag list, so a flag the pinned llama.cpp does not know fails
in CI, not on a Spark. llama.cpp has no Python parser to import; its parser is C++ (common/arg.cpp), so the
data comes from the binary itself:

- `llama-server --help`: every option, printed by common_arg::to_string() as `NAMES [VALUE_HINT [HINT2]]` padded
  to column 40, then the help text, whose last line is `(env: LLAMA_ARG_...)` when the option has a variable;
  sections `----- common params -----`, `sampling params`, `speculative params`, `example-specific params`;
- `llama-server --completion-bash`: the positive names of every option (common_params_print_completion): each must
  be parsed from the help (a self-check: a wrapped or mis-split line fails the dump), and an option's other names
  are its negative forms (common_arg's args_neg: --no-x, -nkvo, -nr), which take no value;
- `llama-server --version`: `version: V (build N, commit C)` (common/build-info.cpp.in); the build number names
  the fixture (`bN`, llama.cpp's release tag).

Every option is registered whatever the backend (GPU-only ones such as -ngl only warn at run time on a CPU
build: common/arg.cpp), so the CPU build of images/llamacpp-cpu gives the GB10 build's flags too. The JSON
holds no help text (defaults such as thread counts can differ per build); the raw help is written beside it.

    python3 scripts/dump_llamacpp_args.py --image sparkdeploy/llamacpp-cpu:TAG --expect-version b11434 \
        --out-dir tests/fixtures                  # writes -help.txt there, -args.json to images/engine-args
    python3 scripts/dump_llamacpp_args.py --image sparkdeploy/llamacpp:TAG --gpus --check --out-dir tests/fixtures
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
VERSION = re.compile(r"version: (\S+) \(build (\d+), commit ([^)]*)\)")
OPTS = re.compile(r'^\s*opts="([^"]*)"', re.M)


def split_head(line: str) -> tuple[str, str]:
    """(names and value hints, first help line) of an option's first line."""
    if len(line) > HELP_COLUMN and line[HELP_COLUMN - 3 : HELP_COLUMN] == "   " and line[HELP_COLUMN] != " ":
        return line[:HELP_COLUMN].rstrip(), line[HELP_COLUMN:].strip()
    return line.rstrip(), ""  # a head longer than 37 characters: the help starts on the next line


def choices_of(hint: str) -> list[str] | None:
    """`{none,layer,row}`, `[on|off|auto]` and `<0|1>` list their values; other hints (N, FNAME, ...) do not."""
    m = re.fullmatch(r"\{([^{}]+)\}|\[([^\[\]]+)\]|<([^<>]*\|[^<>]*)>", hint)
    if not m:
        return None
    values = [v.strip() for v in re.split(r"[,|]", m.group(1) or m.group(2) or m.group(3))]
    return values if all(re.fullmatch(r"[A-Za-z0-9_.+-]+", v) for v in values) else None


def names_and_hint(head: str) -> tuple[list[str], str]:
    """`-m,    --model FNAME` -> (["-m", "--model"], "FNAME"): names are joined by commas, the value hint follows
    the last one after a space and may itself hold commas and spaces (`<tensor name pattern>=<buffer type>,...`)."""
    names: list[str] = []
    rest = head
    while m := re.match(r"(-[^\s,]+)(,\s*)?", rest):
        names.append(m.group(1))
        rest = rest[m.end() :]
        if not m.group(2):
            break
    return names, rest.strip()


def value_count(hint: str) -> int:
    """How many argv elements an option reads: 0 without a hint, 2 for `START END` (common_arg's value_hint_2, as
    --control-vector-layer-range), else 1 (a hint with spaces, such as `<tensor name pattern>=...`, is one value)."""
    if not hint:
        return 0
    parts = hint.split(" ")
    return len(parts) if len(parts) > 1 and all(re.fullmatch(r"[A-Z][A-Z0-9_]*", p) for p in parts) else 1


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
            names, hint = names_and_hint(head)
            current = {"names": names, "hint": hint, "help": [first_help] if first_help else [], "section": section}
            options.append(current)
        elif current is not None and raw.startswith(" " * HELP_COLUMN):
            current["help"].append(raw.strip())
        elif raw.strip():
            current = None  # usage text, server notes: not an option
    for opt in options:
        env = ENV.search(" ".join(opt["help"]))
        opt["env"] = env.group(1) if env else None
    return options


def flags_of(options: list[dict[str, Any]], positives: set[str]) -> dict[str, Any]:
    """Per option string: aliases, value, env, section. `positives` are the names --completion-bash lists (each
    option's `args`); an option's other names are its `args_neg` (--no-x, -nkvo, -nr), which take no value."""
    flags: dict[str, Any] = {}
    for opt in options:
        names, hint = opt["names"], opt["hint"]
        values = value_count(hint)
        takes_value = values > 0
        negatives = {n for n in names if n not in positives}
        if negatives and (takes_value or negatives == set(names)):
            raise SystemExit(f"{', '.join(sorted(negatives))}: not in --completion-bash: the --help parse is wrong")
        for name in names:
            if name in flags:
                raise SystemExit(f"option {name} appears twice in --help: the parser is wrong")
            side = [n for n in names if (n in negatives) == (name in negatives)]
            entry: dict[str, Any] = {
                "aliases": sorted(n for n in side if n != name),
                "takes_value": takes_value,
                "value_hint": hint or None,
                "values": values,
                "choices": choices_of(hint) if values == 1 else None,
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


def build_document(help_text: str, completion_text: str, version_text: str, source: str) -> dict[str, Any]:
    m = VERSION.search(version_text)
    if not m:
        raise SystemExit(f"no `version: V (build N, commit C)` in --version output: {version_text.strip()[:200]!r}")
    options = parse_help(help_text)
    positives = completion_names(completion_text)
    flags = flags_of(options, set(positives))
    missing = sorted(set(positives) - set(flags))
    if missing:  # a parser self-check: a wrapped or mis-split head loses names
        raise SystemExit(f"in --completion-bash but not parsed from --help: {', '.join(missing)}")
    sections: list[str] = []
    for opt in options:
        if opt["section"] not in sections:
            sections.append(opt["section"])
    return {
        "engine": "llama.cpp",
        "binary": "llama-server",
        "llamacpp_version": f"b{m.group(2)}",
        "library_version": m.group(1),
        "build_commit": m.group(3),
        "source": source,
        "parsing": {
            "names": "an option's names are aliases (-m, --model); its negative forms (--no-x, -nkvo) are "
            "opposites (negates / negated_by), never aliases",
            "values": "takes_value options read the next argv element (llama.cpp has no --flag=value form); "
            "values > 1 means that many elements",
            "underscores": "a --long_name is read as --long-name (common_params_parse_ex replaces _ by -)",
            "env": "each option's LLAMA_ARG_* variable sets it too; for --x/--no-x pairs LLAMA_ARG_NO_* also",
        },
        "sections": sections,
        "flags": flags,
    }


def run_image(image: str, gpus: bool = False) -> tuple[str, str, str]:
    def out(*args: str) -> str:
        argv = ["docker", "run", "--rm", *(["--gpus", "all"] if gpus else []), image, "llama-server", *args]
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(
                f"llama-server {' '.join(args)} in {image} exited {r.returncode}: {r.stderr.strip()[-500:]}"
            )
        return r.stdout + ("" if args[0] != "--version" else r.stderr)

    return out("--help"), out("--completion-bash"), out("--version")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", help="a Docker image with llama-server on PATH (docker run --rm IMAGE llama-server ...)")
    ap.add_argument("--gpus", action="store_true", help="docker run --gpus all (a CUDA build needs libcuda to start)")
    ap.add_argument("--help-file", type=Path, help="saved `llama-server --help` output (instead of --image)")
    ap.add_argument("--completion-file", type=Path, help="saved `llama-server --completion-bash` output")
    ap.add_argument("--version-file", type=Path, help="saved `llama-server --version` output (stdout and stderr)")
    ap.add_argument("--out-dir", type=Path, required=True, help="where llama-server-<version>-help.txt goes")
    ap.add_argument(
        "--args-dir",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "images" / "engine-args",
        help="where llama-server-<version>-args.json goes (default images/engine-args: shipped, the engine's check)",
    )
    ap.add_argument("--expect-version", help="fail unless the build is this one (b11434)")
    ap.add_argument("--check", action="store_true", help="compare the flags with the fixture instead of writing")
    args = ap.parse_args(argv)

    if args.image:
        help_text, completion_text, version_text = run_image(args.image, args.gpus)
        repo = args.image.rsplit(":", 1)[0] if ":" in args.image.rsplit("/", 1)[-1] else args.image
        source = f"`llama-server --help`, `--completion-bash` and `--version` run in an image {repo}"
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
    json_path = args.args_dir / f"llama-server-{version}-args.json"
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
