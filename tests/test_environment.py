"""The suite runs in the project's own venv; a module from the system interpreter is caught (see conftest)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import types
from pathlib import Path

from tests.support.environment import REPO, outsiders, problems


def test_this_session_runs_in_the_projects_venv():
    assert sys.prefix != sys.base_prefix, "not in a venv"
    assert Path(sys.prefix).resolve() == (REPO / ".venv").resolve(), f"venv is {sys.prefix}, not the repo's .venv"
    assert problems() == []


def test_a_module_from_the_system_site_packages_is_named():
    base_site = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})["purelib"]
    fake = types.ModuleType("planted")
    fake.__file__ = str(Path(base_site) / "planted" / "__init__.py")
    ok = types.ModuleType("ours")
    ok.__file__ = str(REPO / "sparkdeploy" / "__init__.py")
    stdlib = types.ModuleType("json_like")
    stdlib.__file__ = sysconfig.get_paths(vars={"base": sys.base_prefix})["stdlib"] + "/json/__init__.py"
    assert outsiders({"planted": fake, "ours": ok, "json_like": stdlib}) == [f"planted: {Path(fake.__file__).resolve()}"]


def test_a_module_from_anywhere_else_is_named(tmp_path):
    elsewhere = types.ModuleType("elsewhere")
    elsewhere.__file__ = str(tmp_path / "elsewhere.py")
    assert outsiders({"elsewhere": elsewhere}) == [f"elsewhere: {(tmp_path / 'elsewhere.py').resolve()}"]


def test_the_system_interpreter_is_refused(tmp_path):
    """The same check, run by the base interpreter (no venv): it names the fix."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); from tests.support.environment import problems; print(problems())"
    out = subprocess.run([sys._base_executable, "-I", "-c", code, str(REPO)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "scripts/test.sh" in out.stdout and "system interpreter" in out.stdout
