"""Where the test session's modules come from: the project's own venv, the repo, or the interpreter's stdlib.

A package present in the system interpreter (or the user's site) must never be what makes a test pass: the
suite runs from `.venv` (scripts/test.sh makes it), and `outsiders()` names every loaded module that resolved
anywhere else. tests/conftest.py runs it once collection has imported every test module, and stops the run.

Before that, when tests/conftest.py is first imported (before any test module), `stop_unless_collectable()`
stops a run that cannot collect: the system interpreter, or a venv without the test set of requirements-test.txt
(what `scripts/setup.sh --runtime`, run by scripts/demo.sh, leaves: without this one line, every test module that
imports torch, ray or requests fails on its own ModuleNotFoundError). Standard library only: it runs first.
"""

from __future__ import annotations

import re
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_REQUIREMENTS = REPO / "requirements-test.txt"  # scripts/setup.sh installs it (the default, test profile)
RUNTIME_REQUIREMENTS = REPO / "requirements.txt"  # scripts/setup.sh --runtime installs only this one
SYSTEM_INTERPRETER = (
    "the tests run in the system interpreter ({}), not the project's venv: run "
    "`bash scripts/test.sh` (or `source scripts/venv.sh` after `bash scripts/setup.sh`)"
)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)")


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
        return [SYSTEM_INTERPRETER.format(sys.executable)]
    return [f"module from outside the venv and the repo: {line}" for line in outsiders()]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """Package -> pinned version of each `name==version` line of a pip requirements file and of the files it
    includes (-r); hash and option lines are skipped."""
    found: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            found.update(pins(path.parent / line.split(None, 1)[1].strip()))
        elif m := _PIN.match(line):
            found[_canonical(m[1])] = m[2]
    return found


def installed_versions() -> dict[str, str]:
    """Package -> version of every distribution this interpreter can import (its venv, here)."""
    from importlib.metadata import distributions

    return {_canonical(d.metadata["Name"]): d.version for d in distributions() if d.metadata["Name"]}


def unmet(wanted: dict[str, str], installed: dict[str, str]) -> list[str]:
    """`name` for each pinned package not installed, `name A (pinned B)` for one installed at another version."""
    return [
        name if name not in installed else f"{name} {installed[name]} (pinned {version})"
        for name, version in sorted(wanted.items())
        if installed.get(name) != version
    ]


def lacking_test_set(
    installed: dict[str, str],
    test_requirements: Path = TEST_REQUIREMENTS,
    runtime_requirements: Path = RUNTIME_REQUIREMENTS,
) -> str | None:
    """One line naming the pinned test packages the venv lacks, with the fix; None when it has them all."""
    lacking = unmet(pins(test_requirements), installed)
    if not lacking:
        return None
    shown = ", ".join(lacking[:5]) + (f" and {len(lacking) - 5} more" if len(lacking) > 5 else "")
    why = (
        "it holds only what sparkdeploy needs to run (`scripts/setup.sh --runtime`, as scripts/demo.sh does)"
        if not unmet(pins(runtime_requirements), installed)
        else "it is not the set the requirements pin"
    )
    return (
        f"the project's venv ({sys.prefix}) lacks the test packages of {test_requirements.name}: {shown}; "
        f"{why}: run `bash scripts/setup.sh`, then `source scripts/venv.sh`"
    )


def stop_unless_collectable() -> None:
    """Called first thing by tests/conftest.py: stop the run with one line (no traceback, exit 3) when the
    suite cannot be collected here. SystemExit, not pytest.exit: pytest turns any Exception raised while a
    conftest loads into a traceback."""
    if sys.prefix == sys.base_prefix:
        line = SYSTEM_INTERPRETER.format(sys.executable)
    else:
        line = lacking_test_set(installed_versions())
    if line:
        sys.stderr.write(f"ERROR: {line}\n")
        raise SystemExit(3)
