#!/usr/bin/env python3
"""Regenerate (or check) requirements.txt: litellm[proxy] and every dependency, pinned and hashed.

Why a lock with hashes: LiteLLM 1.82.7/1.82.8 were a supply-chain compromise, so the proxy image installs
exactly the files recorded here (`pip install --no-index --require-hashes`), never whatever the index
serves on build day.

The image runs Debian bookworm's python3 (CPython 3.11, glibc 2.36) on linux/amd64 and linux/arm64, so
we resolve for exactly that target with pip's own resolver (`pip install --dry-run --report`), once per
architecture and once per wheel-tag preference order (a glibc-2.36 host prefers the newest manylinux tag;
the ascending order gives the most conservative file). pip's --python-version/--platform only select
wheels: environment markers are still evaluated against the interpreter running pip, so this script
re-evaluates every marker for the real target (CPython 3.11.2, the machine of each architecture) and adds
what the target needs but the host does not (redis needs async-timeout below Python 3.11.3, and bookworm
has 3.11.2); it refuses to write a lock that holds a package the target would not install. Every resolution must give the same name==version
set; the hashes of all files chosen are recorded, so `pip download -r requirements.txt` succeeds on an
x86-64 or arm64 build host whichever file its pip prefers, and fails loudly on a file nobody reviewed.

    python3.11 images/litellm-proxy/lock_requirements.py            # rewrite requirements.txt
    python3.11 images/litellm-proxy/lock_requirements.py --check    # exit 1 if it would change
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TOP = "litellm[proxy]==1.100.5"
# The proxy's /metrics (callbacks: [prometheus], read by `sparkdeploy top` and Prometheus) imports
# prometheus_client, which litellm[proxy] does not depend on.
EXTRA = ("prometheus-client==0.26.0",)
BANNED = {"1.82.7", "1.82.8"}  # the compromised releases; never lockable
PYTHON = ("3.11", "cp311")  # Debian bookworm's python3
PYTHON_FULL = "3.11.2"  # bookworm's python3 package (3.11.2-1+b1): markers compare the full version
GLIBC_MAX = 36  # bookworm: glibc 2.36, so no manylinux_2_37+ wheel may be chosen
HERE = Path(__file__).resolve().parent
OUT = HERE / "requirements.txt"


def platforms(arch: str, descending: bool) -> list[str]:
    """Wheel platform tags the target accepts, in pip's order of preference.

    pip ranks a file by the earliest of its tags in this list, so the order decides which file of a
    version it picks: newest-first is what pip on a glibc-2.36 host does natively, oldest-first the most
    conservative choice. The legacy aliases sit next to the glibc version they stand for.
    """
    first = 5 if arch == "x86_64" else 17  # aarch64 manylinux starts at glibc 2.17
    aliases = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = []
    for v in range(first, GLIBC_MAX + 1):
        tags.append(f"manylinux_2_{v}_{arch}")
        if v in aliases:
            tags.append(f"{aliases[v]}_{arch}")
    return list(reversed(tags)) if descending else tags


def target_env(arch: str) -> dict[str, str]:
    try:
        from packaging.markers import default_environment
    except ImportError:  # pip vendors the same library
        from pip._vendor.packaging.markers import default_environment

    env = dict(default_environment())
    env.update(python_version=PYTHON[0], python_full_version=PYTHON_FULL, implementation_version=PYTHON_FULL,
               implementation_name="cpython", platform_python_implementation="CPython",
               platform_machine=arch, sys_platform="linux", platform_system="Linux", os_name="posix")
    return env


def _pip_report(requirement_args: list[str], arch: str, descending: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="litellm-lock-") as tmp:
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                "--report", str(report), "--target", str(Path(tmp) / "t"), "--only-binary=:all:",
                "--python-version", PYTHON[0], "--implementation", "cp",
                "--abi", PYTHON[1], "--abi", "abi3", "--abi", "none"]
        for tag in platforms(arch, descending):
            argv += ["--platform", tag]
        result = subprocess.run(argv + requirement_args, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"pip could not resolve for {arch}:\n{result.stderr[-3000:]}")
        return json.loads(report.read_text())


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _target_closure(install: list[dict], env: dict[str, str]) -> tuple[set[str], list[str]]:
    """(names the target needs, requirements the target needs that pip did not resolve), markers for env."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement

    by_name = {_norm(i["metadata"]["name"]): i for i in install}
    tops = [Requirement(text) for text in (TOP, *EXTRA)]
    todo = [(_norm(top.name), set(top.extras)) for top in tops]
    seen: dict[str, set[str]] = {}
    missing = []
    while todo:
        name, extras = todo.pop()
        if name in seen and extras <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | extras
        item = by_name.get(name)
        if item is None:
            continue
        for text in item["metadata"].get("requires_dist") or []:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate(dict(env, extra=e)) for e in [""] + sorted(seen[name])):
                continue
            dep = _norm(req.name)
            if dep not in by_name:
                missing.append(str(Requirement(f"{req.name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}{req.specifier}")))
            todo.append((dep, set(req.extras)))
    return set(seen), sorted(set(missing))


def resolve(requirement_args: list[str], arch: str, descending: bool) -> dict[str, tuple[str, str, str]]:
    """{normalized name: (name, version, sha256)} as pip would install on the target."""
    env = target_env(arch)
    extra: list[str] = []
    for _ in range(10):  # add target-only requirements until nothing is missing
        install = _pip_report(requirement_args + extra, arch, descending)["install"]
        needed, missing = _target_closure(install, env)
        if not missing:
            break
        extra = sorted(set(extra) | set(missing))
    else:
        sys.exit(f"markers for {arch} did not settle: {extra}")
    surplus = sorted({_norm(i["metadata"]["name"]) for i in install} - needed)
    if surplus:
        sys.exit(f"pip resolved packages that CPython {PYTHON_FULL} on {arch} would not install: {surplus}")
    out = {}
    for item in install:
        meta = item["metadata"]
        sha = item["download_info"]["archive_info"]["hashes"]["sha256"]
        out[_norm(meta["name"])] = (meta["name"], meta["version"], sha)
    return out


def render(resolutions: list[dict[str, tuple[str, str, str]]]) -> str:
    first = resolutions[0]
    for other in resolutions[1:]:
        a = {k: v[1] for k, v in first.items()}
        b = {k: v[1] for k, v in other.items()}
        if a != b:
            diff = sorted(set(a.items()) ^ set(b.items()))
            sys.exit(f"the architectures resolve differently, refusing to write one lock: {diff}")
    if first["litellm"][1] in BANNED:
        sys.exit(f"litellm {first['litellm'][1]} is a compromised release")
    lines = [
        "# GENERATED by images/litellm-proxy/lock_requirements.py: do not edit by hand.",
        f"# Top-level requirements: {', '.join((TOP, *EXTRA))}. Target: CPython {PYTHON[0]} (Debian bookworm), glibc <= 2.{GLIBC_MAX},",
        "# linux/amd64 and linux/arm64, wheels only. Each hash is a file pip chose for one of those targets.",
        "# LiteLLM 1.82.7 and 1.82.8 (compromised) must never appear here: the tests and the image build check.",
    ]
    for key in sorted(first):
        name, version, _ = first[key]
        hashes = sorted({res[key][2] for res in resolutions})
        spec = "litellm[proxy]" if key == "litellm" else name
        lines.append(f"{spec}=={version} \\")
        lines += [f"    --hash=sha256:{h}" + (" \\" if i < len(hashes) - 1 else "") for i, h in enumerate(hashes)]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with requirements.txt instead of writing")
    args = ap.parse_args()
    resolutions = [resolve([TOP, *EXTRA], arch, desc) for arch in ("x86_64", "aarch64") for desc in (True, False)]
    text = render(resolutions)
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is out of date: rerun {Path(__file__).name}", file=sys.stderr)
            return 1
        print(f"{OUT} is up to date ({text.count('==')} pins)")
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({text.count('==')} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
