#!/usr/bin/env python3
"""Refuse a compromised LiteLLM: run at image build time and at every container start.

LiteLLM 1.82.7 shipped a payload in proxy_server.py and 1.82.8 also installed `litellm_init.pth`, which
Python executes at every interpreter start (site.py runs `import` lines of .pth files). Both were pulled
from PyPI; this check makes sure neither can slip into the image through a cache, a mirror or a rebuild.

    python -S -I check_litellm.py [--expect VERSION]
exit 0: fine; exit 1: refused (the reason on stderr).

Run it with -S -I: the check must not start the interpreter's site, which is what runs a planted .pth before
any refusal could. It reads the installed version from the dist-info metadata on disk, importing nothing.
"""

from __future__ import annotations

import argparse
import site
import sys
from importlib.metadata import distributions
from pathlib import Path

BANNED = {"1.82.7", "1.82.8"}
PTH = "litellm_init.pth"
# Where a .pth could run from: this interpreter's site dirs plus the system Python trees of the image.
EXTRA_ROOTS = ["/usr/lib", "/usr/local/lib", "/opt"]


def site_dirs() -> list[Path]:
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()] + [p for p in sys.path if p]
    # Under -S, site has not switched to a venv: find the venv of this interpreter ourselves.
    venv = Path(sys.executable).parent.parent
    if (venv / "pyvenv.cfg").is_file():
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        dirs += [str(venv / "lib" / version / "site-packages"), str(venv / "lib64" / version / "site-packages")]
    return [Path(d) for d in dict.fromkeys(dirs) if Path(d).is_dir()]


def installed_litellm() -> list[str]:
    """Versions of every litellm dist-info in the site dirs (metadata only: nothing is imported)."""
    found = distributions(name="litellm", path=[str(d) for d in site_dirs()])
    return sorted({d.version for d in found if d.version})


def find_pth() -> list[Path]:
    hits = {d / PTH for d in site_dirs() if (d / PTH).exists()}
    for root in EXTRA_ROOTS:
        base = Path(root)
        if base.is_dir():
            # python*/site-packages and python3/dist-packages only: cheap, and that is where .pth files run.
            for pattern in (
                f"python*/site-packages/{PTH}",
                f"python*/dist-packages/{PTH}",
                f"*/lib/python*/site-packages/{PTH}",
            ):
                hits.update(base.glob(pattern))
    return sorted(hits)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--expect", help="fail unless this exact LiteLLM version is installed")
    args = ap.parse_args()
    problems = []
    versions = installed_litellm()
    if not versions:
        problems.append("litellm is not installed in this interpreter")
    for found in versions:
        if found in BANNED:
            problems.append(f"LiteLLM {found} is a compromised release (1.82.7 / 1.82.8)")
        if args.expect and found != args.expect:
            problems.append(f"LiteLLM {found} is installed, {args.expect} was pinned")
    for path in find_pth():
        problems.append(f"{path} exists (the LiteLLM 1.82.8 compromise runs it at every Python start)")
    if problems:
        for p in problems:
            print(f"refused: {p}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
