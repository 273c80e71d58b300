#!/usr/bin/env python3
"""The project's hashed locks: make them, prove them complete, and install or download from them.

Every Python package the project installs comes from one of the locks below: a `.txt` of exact pins, each with
the sha256 of every file a target may pick, made from a `.in` of top-level requirements. Nothing is ever
resolved against the index at install time: pip runs with `--require-hashes --no-deps`. That matters because
pip 23.2 (the one `python3 -m venv` bundles) resolves a dependency named with an extra (fastapi-sso's
`pydantic[email]`) against the index even when the lock pins it, takes the newest release, finds no hash for
it and fails, on the day that release appears. With `--no-deps` pip installs exactly the lines of the lock, so
the lock must be complete: `check` proves that every requirement of every locked package (extras included,
markers evaluated for the lock's target) is itself locked at a version that satisfies it. It reads only the
committed files (the lock and the `.deps.json` beside it, which records each package's own requirements as
the index published them), so the proof does not depend on what the index serves that day.

    python3 scripts/lock.py make [NAME ...]     # resolve each .in for its targets; write .txt and .deps.json
    python3 scripts/lock.py make --keep NAME    # after adding a requirement to a .in: resolve only what is new,
                                                # every pin already in the lock held where it is (constraints)
    python3 scripts/lock.py check [NAME ...]    # exit 1, one line per problem, if a lock is incomplete
    python3 scripts/lock.py prune [NAME ...]    # after taking requirements out of a .in: drop what nothing
                                                # needs any more, resolving nothing (no other pin moves)
    python3 scripts/lock.py install PYTHON NAME # install a lock into the venv of PYTHON (setup.sh)

Standard library only (plus the `packaging` that pip vendors), so setup.sh can run it before any venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

try:  # pip vendors the same library; the system interpreter always has pip
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pragma: no cover - depends on the interpreter
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent

# The only way the project runs pip on a lock: exact files, no resolution, wheels only.
STRICT = ("--require-hashes", "--no-deps", "--only-binary=:all:")
# LiteLLM 1.82.7 and 1.82.8 were a supply-chain compromise: no lock may ever hold them.
BANNED = {"litellm": {"1.82.7", "1.82.8"}}


@dataclass(frozen=True)
class Target:
    """Where a lock is installed: the interpreter's version and the machines' architectures."""

    python_full: str  # markers compare the full version (redis needs async-timeout below 3.11.3)
    arches: tuple[str, ...]
    glibc_max: int = 36  # Debian bookworm: no manylinux_2_37+ wheel may be chosen

    @property
    def python(self) -> str:
        return ".".join(self.python_full.split(".")[:2])

    def environment(self, arch: str) -> dict[str, str]:
        env = dict(default_environment())
        env.update(
            python_version=self.python,
            python_full_version=self.python_full,
            implementation_version=self.python_full,
            implementation_name="cpython",
            platform_python_implementation="CPython",
            platform_machine=arch,
            sys_platform="linux",
            platform_system="Linux",
            os_name="posix",
        )
        return env


@dataclass(frozen=True)
class Lock:
    name: str
    source: str  # the .in, relative to the repo
    output: str  # the .txt pip installs from
    target: Target
    notes: tuple[str, ...] = field(default=())

    @property
    def deps_file(self) -> str:
        return self.output.removesuffix(".txt") + ".deps.json"


# Debian bookworm's python3 is 3.11.2: the images' interpreter.
BOOKWORM = Target("3.11.2", ("x86_64", "aarch64"))
# This machine's venvs: the interpreter setup.sh makes them with. The runtime set also installs on an arm64
# machine (a Spark as the control machine); the test set is x86_64 only (its torch is the CPU build).
HOST = Target("3.11.7", ("x86_64", "aarch64"))
HOST_X86 = Target("3.11.7", ("x86_64",))

LOCKS = {
    lock.name: lock
    for lock in (
        Lock(
            "runtime",
            "requirements.in",
            "requirements.txt",
            HOST,
            ("what sparkdeploy needs to run (scripts/setup.sh --runtime), and its editable install's build tools",),
        ),
        Lock(
            "test",
            "requirements-test.in",
            "requirements-test.txt",
            HOST_X86,
            ("the runtime set plus the test and bench tools (scripts/setup.sh)",),
        ),
        Lock(
            "litellm-proxy",
            "images/litellm-proxy/requirements.in",
            "images/litellm-proxy/requirements.txt",
            BOOKWORM,
            ("the proxy image and .venv-litellm (host-side runs of benchmarks/calibrate_sim.py)",),
        ),
        Lock(
            "vllm-sim",
            "images/vllm-sim/requirements.in",
            "images/vllm-sim/requirements.txt",
            Target("3.11.2", ("x86_64",)),
            ("the lab's simulated engine image (linux/amd64)",),
        ),
    )
}


# -- reading a lock ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    extras: frozenset[str]
    version: str
    hashes: tuple[str, ...]
    line: int


PIN_RE = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([A-Za-z0-9,._-]+)\])?==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)$"
)


def read_pins(path: Path) -> tuple[list[Pin], list[str]]:
    """(pins, problems): every logical line of a lock must be `name[extras]==version --hash=sha256:...`."""
    pins, problems = [], []
    physical = path.read_text().splitlines()
    logical: list[tuple[int, str]] = []
    start, buf = 0, ""
    for number, raw in enumerate(physical, 1):
        text = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not buf:
            start = number
        if text.endswith("\\"):
            buf += text[:-1] + " "
            continue
        buf += text
        if buf.strip():
            logical.append((start, " ".join(buf.split())))
        buf = ""
    for number, text in logical:
        m = PIN_RE.match(text)
        if not m:
            problems.append(
                f"{path.name}:{number}: not an exact, hashed pin: {text[:80]}"
                " (fix: regenerate with python3 scripts/lock.py make)"
            )
            continue
        hashes = tuple(re.findall(r"[0-9a-f]{64}", m.group(4)))
        if not hashes:
            problems.append(
                f"{path.name}:{number}: {m.group(1)}=={m.group(3)} has no --hash "
                "(fix: regenerate with python3 scripts/lock.py make)"
            )
        extras = frozenset(canonicalize_name(e) for e in (m.group(2) or "").split(",") if e)
        pins.append(Pin(canonicalize_name(m.group(1)), extras, m.group(3), hashes, number))
    return pins, problems


# -- proving a lock complete ---------------------------------------------------------------------------------


def completeness(lock: Lock, pins: list[Pin], deps: dict) -> list[str]:
    """One line per requirement of the target's closure that the lock does not satisfy (and per surplus pin)."""
    return closure(lock, pins, deps)[1]


def closure(lock: Lock, pins: list[Pin], deps: dict) -> tuple[set[str], list[str]]:
    """(the pins the target needs, one line per problem: a requirement the lock does not satisfy, a surplus pin).

    `deps` is the .deps.json: {"top": [requirement, ...], "packages": {name: {"version", "requires_dist"}}}.
    Walks from the top-level requirements through each package's requires_dist with the extras asked of it,
    evaluating markers for every architecture of the target, as pip would on that machine."""
    out = []
    where = lock.output
    by_name = {p.name: p for p in pins}
    if len(by_name) != len(pins):
        dupes = sorted({p.name for p in pins if sum(q.name == p.name for q in pins) > 1})
        out.append(f"{where}: pinned more than once: {', '.join(dupes)} (fix: regenerate the lock)")
    recorded = {canonicalize_name(k): v for k, v in deps.get("packages", {}).items()}
    for pin in pins:
        meta = recorded.get(pin.name)
        if meta is None or meta.get("version") != pin.version:
            out.append(
                f"{where}: {pin.name}=={pin.version} has no requirements recorded in {Path(lock.deps_file).name}"
                " (fix: regenerate with python3 scripts/lock.py make)"
            )
        if pin.version in BANNED.get(pin.name, ()):
            out.append(f"{where}: {pin.name}=={pin.version} is a compromised release (fix: never lock it)")
    needed: set[str] = set()
    for arch in lock.target.arches:
        env = lock.target.environment(arch)
        todo = [(Requirement(text), f"{Path(lock.source).name} requires") for text in deps.get("top", [])]
        extras_of: dict[str, set[str]] = {}
        while todo:
            req, parent = todo.pop()
            if req.marker and not req.marker.evaluate(dict(env, extra="")):
                continue
            name = canonicalize_name(req.name)
            wanted = {canonicalize_name(e) for e in req.extras}
            pin = by_name.get(name)
            shown = f"{req.name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}{req.specifier}"
            if pin is None:
                out.append(
                    f"{where}: {parent} {shown}, which is not locked ({arch})"
                    " (fix: regenerate with python3 scripts/lock.py make)"
                )
                continue
            if req.specifier and not req.specifier.contains(pin.version, prereleases=True):
                out.append(
                    f"{where}: {parent} {shown}, but the lock pins {pin.version} ({arch})"
                    " (fix: regenerate with python3 scripts/lock.py make)"
                )
            if name in extras_of and wanted <= extras_of[name]:
                continue
            extras_of[name] = extras_of.get(name, set()) | wanted
            needed.add(name)
            meta = recorded.get(name) or {}
            for text in meta.get("requires_dist") or []:
                dep = Requirement(text)
                if dep.marker and not any(
                    dep.marker.evaluate(dict(env, extra=e)) for e in ["", *sorted(extras_of[name])]
                ):
                    continue
                dep.marker = None
                todo.append((dep, f"{pin.name}=={pin.version} requires"))
    for pin in pins:
        if pin.name not in needed:
            out.append(
                f"{where}: {pin.name}=={pin.version} is locked but nothing requires it on "
                f"{'/'.join(lock.target.arches)} (fix: regenerate the lock)"
            )
    return needed, sorted(set(out))


def check(lock: Lock, root: Path = ROOT) -> list[str]:
    path, deps_path = root / lock.output, root / lock.deps_file
    if not path.is_file() or not deps_path.is_file():
        return [
            (
                f"{lock.output}: missing lock or {Path(lock.deps_file).name} "
                f"(fix: python3 scripts/lock.py make {lock.name})"
            )
        ]
    pins, problems = read_pins(path)
    deps = json.loads(deps_path.read_text())
    source = root / lock.source
    if source.is_file() and deps.get("source_sha256") != _sha256(source):
        problems.append(
            f"{lock.output}: {lock.source} changed since the lock was made "
            f"(fix: python3 scripts/lock.py make {lock.name})"
        )
    return problems + completeness(lock, pins, deps)


# -- installing and downloading ------------------------------------------------------------------------------


def install_argv(python: str, lock_file: str) -> list[str]:
    """How a venv installs a lock: exactly its files, nothing resolved."""
    return [
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        *STRICT,
        "-r",
        lock_file,
    ]


# -- making a lock -------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _platforms(arch: str, glibc_max: int, descending: bool) -> list[str]:
    """Wheel platform tags in pip's order of preference: newest-first is what pip on the target does, oldest-first
    the most conservative file; both files' hashes go in the lock."""
    first = 5 if arch == "x86_64" else 17
    aliases = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = []
    for v in range(first, glibc_max + 1):
        tags.append(f"manylinux_2_{v}_{arch}")
        if v in aliases:
            tags.append(f"{aliases[v]}_{arch}")
    tags.append(f"linux_{arch}")
    return list(reversed(tags)) if descending else tags


def _top_requirements(lock: Lock, root: Path = ROOT) -> list[str]:
    """The .in's requirements, `-r other.in` lines followed."""
    out = []
    path = root / lock.source
    for raw in path.read_text().splitlines():
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        if text.startswith("-r "):
            other = Lock("", str((path.parent / text[3:].strip()).relative_to(root)), "", lock.target)
            out += _top_requirements(other, root)
        else:
            out.append(text)
    return out


def _resolve(lock: Lock, tops: list[str], arch: str, descending: bool, keep: list[str] | None = None) -> list[dict]:
    t = lock.target
    with tempfile.TemporaryDirectory(prefix="sparkdeploy-lock-") as tmp:
        report = Path(tmp) / "report.json"
        held = Path(tmp) / "held.txt"  # --keep: the current pins, as constraints (pip may not move them)
        held.write_text("".join(f"{line}\n" for line in keep or []))
        argv = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--report",
            str(report),
            "--target",
            str(Path(tmp) / "t"),
            "--only-binary=:all:",
            "--python-version",
            t.python,
            "--implementation",
            "cp",
            "--abi",
            "cp" + t.python.replace(".", ""),
            "--abi",
            "abi3",
            "--abi",
            "none",
            *(["--constraint", str(held)] if keep else []),
        ]
        for tag in _platforms(arch, t.glibc_max, descending):
            argv += ["--platform", tag]
        result = subprocess.run(argv + tops, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"{lock.name}: pip could not resolve for {arch}:\n{result.stderr[-3000:]}")
        return json.loads(report.read_text())["install"]


def make(lock: Lock, keep: bool = False) -> None:
    """Resolve the .in for every architecture (both wheel preference orders) with pip's own resolver, keep the
    closure the target's markers select, and write the lock and its .deps.json; refuse an incomplete result.
    keep: every pin of the current lock is a constraint, so only a requirement new to the .in is resolved (and
    refused if it would move a pin); without it, every transitive pin is re-resolved against the day's index."""
    tops = _top_requirements(lock)
    held = [f"{p.name}=={p.version}" for p in read_pins(ROOT / lock.output)[0]] if keep else []
    resolutions: list[dict[str, dict]] = []
    extra: list[str] = []
    for arch in lock.target.arches:
        for descending in (True, False):
            for _ in range(10):  # pip evaluates markers for this interpreter: add what the target needs too
                install = _resolve(lock, tops + extra, arch, descending, held)
                found = {canonicalize_name(i["metadata"]["name"]): i for i in install}
                pins = [Pin(n, frozenset(), i["metadata"]["version"], ("0" * 64,), 0) for n, i in found.items()]
                deps = {
                    "top": tops,
                    "packages": {
                        n: {
                            "version": i["metadata"]["version"],
                            "requires_dist": i["metadata"].get("requires_dist") or [],
                        }
                        for n, i in found.items()
                    },
                }
                missing = [line for line in completeness(lock, pins, deps) if "which is not locked" in line]
                if not missing:
                    break
                extra = sorted(set(extra) | {re.search(r"requires (\S+), which", m).group(1) for m in missing})
            resolutions.append(found)
    first = resolutions[0]
    for other in resolutions[1:]:
        a = {k: v["metadata"]["version"] for k, v in first.items()}
        b = {k: v["metadata"]["version"] for k, v in other.items()}
        if a != b:
            sys.exit(
                f"{lock.name}: the targets resolve differently, refusing one lock: "
                f"{sorted(set(a.items()) ^ set(b.items()))}"
            )
    top_extras = {canonicalize_name(Requirement(t).name): sorted(Requirement(t).extras) for t in tops}
    lines = [
        (
            f"# GENERATED by scripts/lock.py from {Path(lock.source).name}: do not edit by hand "
            f"(python3 scripts/lock.py make {lock.name})."
        ),
        f"# For: {'; '.join(lock.notes)}.",
        (
            f"# Target: CPython {lock.target.python_full} on {', '.join(lock.target.arches)} "
            f"(glibc <= 2.{lock.target.glibc_max}), "
            "wheels only; each hash is a file pip chose for one target."
        ),
        f"# Install with `{' '.join(STRICT)}`: nothing is resolved; `scripts/lock.py check` proves it complete.",
    ]
    packages = {}
    for key in sorted(first):
        meta = first[key]["metadata"]
        hashes = sorted({res[key]["download_info"]["archive_info"]["hashes"]["sha256"] for res in resolutions})
        extras = top_extras.get(key)
        spec = f"{meta['name']}[{','.join(extras)}]" if extras else meta["name"]
        lines.append(f"{spec}=={meta['version']} \\")
        lines += [f"    --hash=sha256:{h}" + (" \\" if i < len(hashes) - 1 else "") for i, h in enumerate(hashes)]
        packages[key] = {"version": meta["version"], "requires_dist": meta.get("requires_dist") or []}
    text = "\n".join(lines) + "\n"
    deps = {
        "generated_by": "scripts/lock.py",
        "source": lock.source,
        "source_sha256": _sha256(ROOT / lock.source),
        "top": tops + extra,
        "packages": packages,
    }
    with tempfile.TemporaryDirectory() as tmp:  # prove it before writing it
        scratch = Path(tmp)
        (scratch / lock.output).parent.mkdir(parents=True, exist_ok=True)
        (scratch / lock.output).write_text(text)
        (scratch / lock.deps_file).write_text(json.dumps(deps, indent=1, sort_keys=True) + "\n")
        (scratch / lock.source).parent.mkdir(parents=True, exist_ok=True)
        (scratch / lock.source).write_bytes((ROOT / lock.source).read_bytes())
        problems = check(lock, scratch)
    if problems:
        sys.exit(f"{lock.name}: refusing an incomplete lock:\n  " + "\n  ".join(problems))
    (ROOT / lock.output).write_text(text)
    (ROOT / lock.deps_file).write_text(json.dumps(deps, indent=1, sort_keys=True) + "\n")
    print(f"wrote {lock.output} ({len(packages)} pins) and {Path(lock.deps_file).name}")


def prune(lock: Lock, root: Path = ROOT) -> None:
    """After requirements were only taken out of the .in: drop the pins nothing needs any more, keep every other
    pin with its hashes, and record the new top in the .deps.json. Nothing is resolved, so no other pin moves
    (make would re-resolve every transitive pin against the index of the day); a requirement the lock does not
    already satisfy is refused: that needs make."""
    path, deps_path = root / lock.output, root / lock.deps_file
    pins, problems = read_pins(path)
    old = json.loads(deps_path.read_text())
    deps = dict(old, top=_top_requirements(lock, root), source_sha256=_sha256(root / lock.source))
    needed, _ = closure(lock, pins, deps)
    gone = sorted(p.name for p in pins if p.name not in needed)
    kept_pins = [p for p in pins if p.name in needed]
    deps["packages"] = {k: v for k, v in old["packages"].items() if canonicalize_name(k) in needed}
    problems += closure(lock, kept_pins, deps)[1]
    if problems:
        fix = f"(fix: python3 scripts/lock.py make {lock.name})"
        sys.exit(f"{lock.name}: pruning leaves an incomplete lock {fix}:\n  " + "\n  ".join(problems))
    lines, drop = [], False
    for raw in path.read_text().splitlines():
        if raw and not raw[0].isspace() and not raw.startswith("#"):  # a pin's first line; its hashes follow
            drop = canonicalize_name(re.split(r"[\[=]", raw, maxsplit=1)[0]) in gone
        if not drop:
            lines.append(raw)
    path.write_text("\n".join(lines) + "\n")
    deps_path.write_text(json.dumps(deps, indent=1, sort_keys=True) + "\n")
    problems = check(lock, root)
    if problems:  # cannot happen when the closure above held; the written files are proved all the same
        sys.exit(f"{lock.name}: pruned lock fails check:\n  " + "\n  ".join(problems))
    print(f"pruned {lock.output}: {len(kept_pins)} pins kept, removed {', '.join(gone) or 'nothing'}")


def _named(names: list[str]) -> list[Lock]:
    unknown = [n for n in names if n not in LOCKS]
    if unknown:
        sys.exit(f"unknown lock {', '.join(unknown)} (known: {', '.join(LOCKS)})")
    return [LOCKS[n] for n in names] or list(LOCKS.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make", help="resolve and write locks")
    mk.add_argument("names", nargs="*")
    mk.add_argument("--keep", action="store_true", help="hold every current pin: resolve only what is new")
    sub.add_parser("check", help="prove locks complete from the committed files").add_argument("names", nargs="*")
    sub.add_parser("prune", help="drop the pins the .in no longer needs, resolving nothing").add_argument(
        "names", nargs="*"
    )
    inst = sub.add_parser("install", help="install one lock into a venv, resolving nothing")
    inst.add_argument("python")
    inst.add_argument("name", choices=sorted(LOCKS))
    args = ap.parse_args(argv)
    if args.command == "make":
        for lock in _named(args.names):
            make(lock, keep=args.keep)
        return 0
    if args.command == "prune":
        for lock in _named(args.names):
            prune(lock)
        return 0
    if args.command == "check":
        problems = [p for lock in _named(args.names) for p in check(lock)]
        for line in problems:
            print(line, file=sys.stderr)
        if not problems:
            print(f"complete: {', '.join(lock.name for lock in _named(args.names))}")
        return 1 if problems else 0
    lock = LOCKS[args.name]
    problems = check(lock)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    return subprocess.run(install_argv(args.python, str(ROOT / lock.output)), env=os.environ).returncode


if __name__ == "__main__":
    sys.exit(main())
