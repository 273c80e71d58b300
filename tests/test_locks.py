"""Every install resolves nothing: the locks are complete, and the one install command takes exactly their files.

The failure this guards against (issue 24): on a new machine, the venv's bundled pip (23.2) installed
.venv-litellm from a complete hashed lock without `--no-deps`, resolved fastapi-sso's `pydantic[email]`
against the index, took a pydantic released that week, found no hash for it and stopped setup. The last test
rebuilds that situation offline (a local index serving a newer pydantic than the lock pins) and runs the
project's install command under a new venv's own pip.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("lock", REPO / "scripts" / "lock.py")
lock = importlib.util.module_from_spec(spec)
sys.modules["lock"] = lock  # dataclasses look their module up while the class is built
spec.loader.exec_module(lock)


@pytest.mark.parametrize("name", sorted(lock.LOCKS))
def test_every_lock_is_complete_and_current(name):
    assert lock.check(lock.LOCKS[name]) == []


def _copy(name: str, tmp_path: Path) -> tuple[lock.Lock, Path]:
    entry = lock.LOCKS[name]
    for rel in (entry.output, entry.deps_file, entry.source):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    return entry, tmp_path


def _drop_pin(path: Path, name: str) -> None:
    text = re.sub(rf"(?m)^{re.escape(name)}==\S+ \\\n(?:    --hash=\S+ \\\n)*    --hash=\S+\n", "", path.read_text())
    assert name not in text.split("\n", 4)[-1]
    path.write_text(text)


def test_a_lock_missing_a_dependency_of_an_extra_is_named(tmp_path):
    # pydantic's `email` extra (asked for by fastapi-sso) needs email-validator: the pin that makes the lock complete.
    entry, root = _copy("litellm-proxy", tmp_path)
    _drop_pin(root / entry.output, "email-validator")
    problems = lock.check(entry, root)
    assert problems, "an incomplete lock passed"
    assert any("email-validator" in p and "which is not locked" in p and "pydantic==" in p for p in problems), problems
    assert all("fix:" in p for p in problems)


def test_a_pin_that_does_not_satisfy_its_requirer_is_named(tmp_path):
    entry, root = _copy("runtime", tmp_path)
    path = root / entry.output
    path.write_text(re.sub(r"(?m)^pydantic[-_]core==\S+", "pydantic-core==0.0.1", path.read_text()))
    deps = json.loads((root / entry.deps_file).read_text())
    deps["packages"]["pydantic-core"]["version"] = "0.0.1"
    (root / entry.deps_file).write_text(json.dumps(deps))
    problems = lock.check(entry, root)
    assert any("pydantic==" in p and "but the lock pins 0.0.1" in p for p in problems), problems


def test_an_unhashed_or_compromised_pin_is_refused(tmp_path):
    entry, root = _copy("litellm-proxy", tmp_path)
    path = root / entry.output
    text = path.read_text()
    path.write_text(re.sub(r"(?m)^(litellm\[proxy\])==1\.100\.5", r"\1==1.82.8", text))
    deps = json.loads((root / entry.deps_file).read_text())
    deps["packages"]["litellm"]["version"] = "1.82.8"
    (root / entry.deps_file).write_text(json.dumps(deps))
    assert any("1.82.8 is a compromised release" in p for p in lock.check(entry, root))
    path.write_text(text + "six==1.16.0\n")
    assert any("six==1.16.0 has no --hash" in p for p in lock.check(entry, root))


def test_a_changed_source_needs_a_new_lock(tmp_path):
    entry, root = _copy("vllm-sim", tmp_path)
    (root / entry.source).write_text((root / entry.source).read_text() + "six==1.16.0\n")
    assert any("changed since the lock was made" in p for p in lock.check(entry, root))


def test_prune_drops_what_a_removed_requirement_alone_needed_and_moves_nothing_else(tmp_path):
    entry, root = _copy("runtime", tmp_path)
    source = root / entry.source
    before, _ = lock.read_pins(root / entry.output)
    source.write_text(re.sub(r"(?m)^rich==.*\n", "", source.read_text()))
    assert lock.check(entry, root), "a changed .in must make the old lock stale"
    lock.prune(entry, root)
    assert lock.check(entry, root) == []
    after, _ = lock.read_pins(root / entry.output)
    gone = {p.name for p in before} - {p.name for p in after}
    assert {"rich", "markdown-it-py", "mdurl"} <= gone and "paramiko" not in gone  # rich's own closure only
    assert {(p.name, p.version, p.hashes) for p in after} <= {(p.name, p.version, p.hashes) for p in before}
    assert "rich==13.9.4" not in json.loads((root / entry.deps_file).read_text())["top"]


def test_prune_refuses_a_requirement_the_lock_does_not_hold(tmp_path):
    entry, root = _copy("runtime", tmp_path)
    (root / entry.source).write_text((root / entry.source).read_text() + "six==1.16.0\n")
    text = (root / entry.output).read_text()
    with pytest.raises(SystemExit, match=r"six.*which is not locked"):
        lock.prune(entry, root)
    assert (root / entry.output).read_text() == text  # nothing written


def test_every_pip_run_on_a_lock_is_strict():
    """The places that run pip on a lock: setup.sh (through lock.py install), the builder's download, the images."""
    assert {"--require-hashes", "--no-deps"} <= set(lock.install_argv("python", "x.txt"))
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "scripts/lock.py install" in setup
    assert not re.search(r"pip install[^\n]*-r ", setup), "setup.sh must install locks through scripts/lock.py"
    build = (REPO / "sparkdeploy" / "images" / "build.py").read_text()
    assert '"--no-deps"' in build and '"--require-hashes"' in build
    for name in ("litellm-proxy", "vllm-sim"):
        dockerfile = (REPO / "images" / name / "Dockerfile").read_text()
        install = re.search(r"pip install[^\n]*(?:\\\n[^\n]*)*", dockerfile).group(0)
        assert "--no-deps" in install and "--require-hashes" in install and "--no-index" in install, name


# -- the incident, offline -----------------------------------------------------------------------------------


def _wheel(directory: Path, name: str, version: str, requires: list[str] = (), extras: dict | None = None) -> Path:
    """A minimal pure-Python wheel, enough for pip to resolve and install it."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    for extra, reqs in (extras or {}).items():
        meta.append(f"Provides-Extra: {extra}")
        meta += [f'Requires-Dist: {r} ; extra == "{extra}"' for r in reqs]
    files = {
        f"{name.replace('-', '_')}_mod.py": b"",
        f"{dist}.dist-info/METADATA": ("\n".join(meta) + "\n").encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    target = directory / name / f"{dist}-py3-none-any.whl"
    target.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    target.write_bytes(buf.getvalue())
    return target


def _index(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """A PEP 503 index serving what the lock pins, plus a pydantic released after the lock was made."""
    simple = tmp_path / "simple"
    wheels = {
        "fastapi-sso": _wheel(simple, "fastapi-sso", "0.23.0", ["pydantic[email]>=1.8.0"]),
        "pydantic": _wheel(simple, "pydantic", "2.14.3", extras={"email": ["email-validator>=2.0.0"]}),
        "pydantic-new": _wheel(simple, "pydantic", "2.14.4", extras={"email": ["email-validator>=2.0.0"]}),
        "email-validator": _wheel(simple, "email-validator", "2.3.0"),
    }
    for project in {p.parent for p in wheels.values()}:
        links = "".join(f'<a href="{w.name}">{w.name}</a>\n' for w in sorted(project.glob("*.whl")))
        (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return simple, wheels


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def bundled_pip_venv(tmp_path_factory) -> Path:
    """A new venv with the pip its Python bundles: what a new machine has when setup.sh runs."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "venv", str(venv)], check=True)
    return venv


def _pip_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def test_the_install_command_takes_the_lock_and_resolves_nothing(tmp_path, bundled_pip_venv):
    simple, wheels = _index(tmp_path)
    lock_file = tmp_path / "requirements.txt"
    lock_file.write_text(
        "".join(
            f"{name}=={version} --hash=sha256:{_sha(wheels[key])}\n"
            for key, name, version in (
                ("fastapi-sso", "fastapi-sso", "0.23.0"),
                ("pydantic", "pydantic", "2.14.3"),
                ("email-validator", "email-validator", "2.3.0"),
            )
        )
    )
    python = str(bundled_pip_venv / "bin" / "python")
    index = ["--index-url", simple.as_uri()]
    target = tmp_path / "site"
    # 085fd96's command: a hashed lock without --no-deps. pip resolves pydantic[email] against the index.
    old = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--only-binary=:all:",
            "--require-hashes",
            "--target",
            str(target),
            *index,
            "-r",
            str(lock_file),
        ],
        capture_output=True,
        text=True,
        env=_pip_env(),
    )
    assert old.returncode != 0 and "must have their versions pinned with ==" in old.stderr, old.stderr[-800:]
    assert "pydantic-2.14.4" in old.stderr
    # The project's command: exactly the lock's files.
    argv = lock.install_argv(python, str(lock_file)) + ["--target", str(target), *index]
    new = subprocess.run(argv, capture_output=True, text=True, env=_pip_env())
    assert new.returncode == 0, new.stderr[-1500:]
    installed = sorted(p.name for p in target.glob("*.dist-info"))
    assert installed == ["email_validator-2.3.0.dist-info", "fastapi_sso-0.23.0.dist-info", "pydantic-2.14.3.dist-info"]


def test_make_keep_hands_pip_every_current_pin_as_a_constraint(monkeypatch):
    """Pure logic (pip itself is not run here; `make --keep litellm-proxy` added httptools with no pin moved):
    with keep, pip's resolver gets the lock's pins as constraints, so it can add but never move one."""
    seen = []

    def fake_run(argv, **_kw):
        held = argv[argv.index("--constraint") + 1] if "--constraint" in argv else None
        seen.append(Path(held).read_text() if held else None)
        Path(argv[argv.index("--report") + 1]).write_text(json.dumps({"install": []}))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(lock.subprocess, "run", fake_run)
    entry = lock.LOCKS["litellm-proxy"]
    pins = [f"{p.name}=={p.version}" for p in lock.read_pins(REPO / entry.output)[0]]
    lock._resolve(entry, ["httptools==0.7.1"], "x86_64", True, pins)
    lock._resolve(entry, ["httptools==0.7.1"], "x86_64", True)
    assert seen[0] is not None and seen[0].splitlines() == pins and "litellm==1.100.5" in pins
    assert seen[1] is None
