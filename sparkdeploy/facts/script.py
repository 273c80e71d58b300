"""What a fact is, and how the facts a caller needs are read from a node in ONE SSH round trip.

A `Fact` pairs a shell `command` with a pure `process` that turns its output (a `Section`: stdout, stderr and
exit code) into a typed value, and a `store` that puts that value into `NodeFacts` (pyinfra's FactBase pairs
`command` and `process` the same way). facts/catalog.py declares every fact once and registers it in FACTS.

`script(facts)` is one constant bash script for the facts asked: each command is a shell function, run in a
background subshell of its own (a node costs one channel and about the slowest command, not their sum),
its output framed as `@@sparkdeploy-facts@@ NAME`, `NAME.err`, `NAME.rc N`. Values (state dir, HF cache,
model folder, fabric interfaces, image references) travel as positional arguments, quoted once by
`NodeConnection.run`. Everything a command runs only looks; the script's one write is its own temporary
folder (mktemp -d), removed before it exits; without one (a full /tmp) the commands run one after another
straight to stdout, their stderr dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .parsers import SECTION, Section

# `sec NAME CMD...`: one command's stdout, stderr and exit code, framed as a Section (parsers.parse_sections);
# without a temporary file (a full /tmp) its stderr is dropped. The one copy: doctor's probe scripts use it too.
SECTION_FUNCTION = (
    r"""sec() { local n=$1 t rc; shift; t=$(mktemp 2>/dev/null) || t=/dev/null; printf '\n%s %s\n' '"""
    + SECTION
    + r"""' "$n"; "$@" 2>"$t"; rc=$?;
  printf '\n%s %s.err\n' '"""
    + SECTION
    + r"""' "$n"; [ "$t" = /dev/null ] || { cat "$t"; rm -f "$t"; }; printf '\n%s %s.rc %s\n' '"""
    + SECTION
    + r"""' "$n" "$rc"; }
"""
)

# $1 state dir (relative to $HOME), $2 HF cache (~/... or absolute), $3 the model's hub folder name,
# $4 the fabric interfaces (comma separated; EVERY_PORT: every en* interface), $5 the programs whose
# `sudo -n -l` is read (comma separated); what follows: the image references to inspect. /usr/sbin and /sbin
# are appended to PATH (ethtool, rdma live there; a non-login SSH shell may not have them).
PRELUDE = (
    r"""
sd="$1"; hf="$2"; model="$3"; ifaces="$4"; progs="$5"; shift 5
export PATH="$PATH:/usr/sbin:/sbin"
dir="$HOME/$sd"
case "$hf" in "~") hf="$HOME";; "~/"*) hf="$HOME/${hf#\~/}";; esac
"""
    + SECTION_FUNCTION
)


# fabric_ifaces=(EVERY_PORT,): ethtool on every en* interface (day zero: the fabric is not chosen yet)
EVERY_PORT = "*"


@dataclass(frozen=True)
class Fact:
    """One fact: `command` (a bash function body; may use $sd $dir $hf $model $ifaces and "$@", the image
    references) and `process`, the pure parser of its Section; `store` puts the value into NodeFacts."""

    name: str
    command: str
    process: Callable[[Section], Any]
    store: Callable[[Any, Any], None]  # (NodeFacts, value)


@dataclass(frozen=True)
class FactArgs:
    state_dir: str = ".sparkdeploy"
    hf_cache: str = "~"
    model_folder: str = ""  # models--org--name: the hub cache folder of the recipe's model
    fabric_ifaces: Sequence[str] = ()
    images: Sequence[str] = ()
    sudo_programs: Sequence[str] = ()  # the programs whose `sudo -n -l` the `sudo` fact reads

    def argv(self) -> list[str]:
        return [
            self.state_dir,
            self.hf_cache,
            self.model_folder,
            ",".join(self.fabric_ifaces),
            ",".join(self.sudo_programs),
            *self.images,
        ]


def _fn(fact: Fact) -> str:
    return f"__f_{fact.name}"


def script(facts: Iterable[Fact]) -> str:
    """The one bash script that reads `facts` (run as `bash -c SCRIPT NAME ARGS...`)."""
    facts = list(facts)
    lines = [PRELUDE]
    for fact in facts:
        lines.append(f"{_fn(fact)}() {{\n{fact.command.strip()}\n}}")
    lines.append("if __d=$(mktemp -d 2>/dev/null); then")
    for i, fact in enumerate(facts):
        lines.append(f'  ( sec {fact.name} {_fn(fact)} "$@" ) >"$__d/{i}" 2>/dev/null &')
    lines.append("  wait")
    lines.append("  cat " + " ".join(f'"$__d/{i}"' for i in range(len(facts))) + ' 2>/dev/null; rm -rf "$__d"')
    lines.append("else")
    for fact in facts:
        lines.append(f'  sec {fact.name} {_fn(fact)} "$@" 2>/dev/null')
    lines.append("fi")
    return "\n".join(lines) + "\n"
