"""Where the test session's modules come from: the project's own venv, the repo, or the interpreter's stdlib.

A package present in the system interpreter (or the user's site) must never be what makes a test pass: the
suite runs from `.venv` (scripts/test.sh makes it), and `outsiders()` names every loaded module that resolved
anywhere else. tests/conftest.py runs it once collection has imported every test module, and stops the run.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def allowed_roots() -> list[Path]:
    """The venv (its site-packages and scripts), the repo, and the base interpreter's stdlib (never its
    site-packages: the stdlib folder holds site-packages inside it, so that one is excluded by `outsiders`)."""
    roots = [Path(sys.prefix), REPO]
    for key in ("stdlib", "platstdlib"):
        roots.append(Path(sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})[key]))
    return [r.resolve() for r in roots]


def forbidden_roots() -> list[Path]:
    """Site folders of the base interpreter and the user: what a venv exists to keep out."""
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    roots = [Path(paths["purelib"]), Path(paths["platlib"])]
    import site

    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if user:
        roots.append(Path(user))
    venv = Path(sys.prefix).resolve()
    return [r.resolve() for r in roots if not r.resolve().is_relative_to(venv)]


def module_file(module) -> Path | None:
    path = getattr(module, "__file__", None)
    if not path:  # built-in or namespace package: nothing on disk to check
        return None
    return Path(path).resolve()


def outsiders(modules: dict | None = None) -> list[str]:
    """`name: path` for every module that resolved outside the venv, the repo and the stdlib."""
    modules = dict(sys.modules if modules is None else modules)
    allowed, forbidden = allowed_roots(), forbidden_roots()
    bad = []
    for name, module in sorted(modules.items()):
        path = module_file(module)
        if path is None:
            continue
        if any(path.is_relative_to(f) for f in forbidden) or not any(path.is_relative_to(a) for a in allowed):
            bad.append(f"{name}: {path}")
    return bad


def problems() -> list[str]:
    """Why this interpreter cannot run the suite honestly (empty when it can)."""
    if sys.prefix == sys.base_prefix:
        return [f"the tests run in the system interpreter ({sys.executable}), not the project's venv: "
                "run `bash scripts/test.sh` (or `source scripts/venv.sh` after `bash scripts/setup.sh`)"]
    return [f"module from outside the venv and the repo: {line}" for line in outsiders()]
