"""The suite runs in the project's own venv; a module from the system interpreter is caught (see conftest)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import types
from pathlib import Path

from tests.support.environment import (
    REPO,
    RUNTIME_REQUIREMENTS,
    TEST_REQUIREMENTS,
    installed_versions,
    lacking_test_set,
    outsiders,
    pins,
    problems,
)


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
    assert outsiders({"planted": fake, "ours": ok, "json_like": stdlib}) == [
        f"planted: {Path(fake.__file__).resolve()}"
    ]


def test_a_module_from_anywhere_else_is_named(tmp_path):
    elsewhere = types.ModuleType("elsewhere")
    elsewhere.__file__ = str(tmp_path / "elsewhere.py")
    assert outsiders({"elsewhere": elsewhere}) == [f"elsewhere: {(tmp_path / 'elsewhere.py').resolve()}"]


def test_the_system_interpreter_is_refused(tmp_path):
    """The same check, run by the base interpreter (no venv): it names the fix."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from tests.support.environment import problems; print(problems())"
    )
    out = subprocess.run(
        [sys._base_executable, "-I", "-c", code, str(REPO)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "scripts/test.sh" in out.stdout and "system interpreter" in out.stdout


# -- a venv set up to run sparkdeploy only (scripts/setup.sh --runtime, as scripts/demo.sh does) ------------------


def test_pins_are_read_through_includes_and_hash_lines(tmp_path):
    (tmp_path / "base.txt").write_text("# runtime\nclick==8.5.1 \\\n    --hash=sha256:ab\nPyYAML==6.0.3  # why\n")
    (tmp_path / "test.txt").write_text(
        "-r base.txt\npytest==9.0.3\ntorch==2.13.0+cpu ; sys_platform == 'linux'\n"
        "huggingface_hub[cli]==2.4.0\n--extra-index-url https://example\n"
    )
    assert pins(tmp_path / "test.txt") == {
        "click": "8.5.1",
        "pyyaml": "6.0.3",
        "pytest": "9.0.3",
        "torch": "2.13.0+cpu",
        "huggingface-hub": "2.4.0",
    }
    # the project's own files: the test set includes the runtime set
    runtime, test = pins(RUNTIME_REQUIREMENTS), pins(TEST_REQUIREMENTS)
    assert runtime and runtime.items() <= test.items() and "torch" in test and "torch" not in runtime


def test_a_venv_without_the_test_set_is_named_in_one_line(tmp_path):
    (tmp_path / "requirements.txt").write_text("click==8.5.1\n")
    (tmp_path / "requirements-test.txt").write_text("-r requirements.txt\ntorch==2.13.0+cpu\nray==2.60.0\n")
    files = (tmp_path / "requirements-test.txt", tmp_path / "requirements.txt")
    assert lacking_test_set({"click": "8.5.1", "torch": "2.13.0+cpu", "ray": "2.60.0"}, *files) is None

    line = lacking_test_set({"click": "8.5.1"}, *files)  # what setup.sh --runtime leaves
    assert "\n" not in line
    assert line.endswith("run `bash scripts/setup.sh`, then `source scripts/venv.sh`"), line
    assert "requirements-test.txt: ray, torch;" in line and "scripts/setup.sh --runtime" in line, line

    line = lacking_test_set({"click": "8.4.0", "torch": "2.12.0", "ray": "2.60.0"}, *files)
    assert "click 8.4.0 (pinned 8.5.1), torch 2.12.0 (pinned 2.13.0+cpu);" in line, line
    assert "--runtime" not in line and "run `bash scripts/setup.sh`" in line, line
    # this session's own venv holds the whole test set
    assert lacking_test_set(installed_versions()) is None


def _runtime_closure(names: set[str]) -> set[str]:
    """The distributions `names` need, recursively (what pip installs for them), by this venv's metadata."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _runtime_only_venv(root: Path) -> Path:
    """A venv holding what `scripts/setup.sh --runtime` installs, nothing more: this venv's distributions that
    requirements.txt needs (and sparkdeploy, editable), linked into a fresh `python -m venv --without-pip`."""
    from importlib.metadata import distributions

    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    keep = _runtime_closure(set(pins(RUNTIME_REQUIREMENTS)) | {"sparkdeploy"})
    site = Path(sysconfig.get_paths()["purelib"])
    target = Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"])
    dropped: set[str] = set()
    for dist in distributions():
        if dist.metadata["Name"].lower().replace("_", "-") in keep:
            continue
        dropped.update(Path(str(f)).parts[0] for f in dist.files or [])
    for entry in site.iterdir():
        if entry.name not in dropped and entry.name != "__pycache__":
            (target / entry.name).symlink_to(entry)
    return root / "bin" / "python"


def test_pytest_in_a_runtime_only_venv_stops_with_one_line(tmp_path):
    """The README's test command after `bash scripts/demo.sh`: one line with the fix, not one
    ModuleNotFoundError per test module."""
    python = _runtime_only_venv(tmp_path / "venv")
    lacking = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, timeout=60)
    assert "No module named 'torch'" in lacking.stderr  # the venv is what demo.sh leaves: no test packages
    # test_launcher imports aiohttp (a test package) at module level: without the guard, a collection error
    run = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not lab", "tests/sim/test_launcher.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert run.returncode == 3, run.stdout + run.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"ERROR: the project's venv ({tmp_path / 'venv'}) lacks the test packages of requirements-test.txt: "
    ), lines
    assert "scripts/setup.sh --runtime" in lines[0], lines
    assert lines[0].endswith("run `bash scripts/setup.sh`, then `source scripts/venv.sh`"), lines
