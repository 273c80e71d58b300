"""The programs shipped to the nodes (sparkdeploy/nodeside/) as the modules they are: standard library only,
importing nothing of sparkdeploy but each other, built into archives that run here exactly as on a node. A
rename inside the package breaks here, not on a node."""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import json
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

from sparkdeploy.nodeside import ship

PACKAGE = Path(ship.__file__).resolve().parent
# what a node's python3 lacks but one program's runtime has: the hub client runs in the engine image
NOT_STDLIB = {"hub_client.py": {"huggingface_hub"}, "image_versions.py": {"torch"}}  # in the engine image


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(top-level names of absolute imports, package modules of relative ones) anywhere in the module."""
    absolute, relative = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            absolute |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            absolute.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 1, f"{path.name}: only `from .x import y` inside the package"
            relative |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return absolute, relative


def test_the_package_imports_only_the_standard_library_and_itself():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    for path in sorted(PACKAGE.glob("*.py")):
        absolute, relative = _imports(path)
        assert "sparkdeploy" not in absolute, path.name
        outside = absolute - set(sys.stdlib_module_names) - {"__future__"} - NOT_STDLIB.get(path.name, set())
        assert not outside, f"{path.name} imports {outside}: not on a node's python3"
        assert relative <= modules, f"{path.name} imports {relative - modules}, not in the package"
    assert set(ship.PROGRAMS.values()) <= modules
    assert {m for ms in ship.BUNDLES.values() for m in ms} == set(ship.PROGRAMS.values())


def test_the_archive_is_deterministic_and_carries_its_bundle_only():
    for bundle in ship.BUNDLES:
        first, again = ship.build(bundle), ship.build(bundle)
        assert hashlib.sha256(first).digest() == hashlib.sha256(again).digest()
        assert base64.b64decode(ship.archive(bundle)) == first
    names = zipfile.ZipFile(io.BytesIO(ship.build("models"))).namelist()
    assert names == sorted(names) and "__main__.py" in names and "nodeside/models.py" in names
    assert "nodeside/relay.py" not in names and "nodeside/hub_client.py" not in names


def test_the_textual_import_reader_agrees_with_the_ast_one():
    """ship reads the package's relative imports as text (archives are built on worker threads, where two AST
    constructions at once can fail on CPython 3.11); it must find what the AST finds, module by module."""
    for path in sorted(PACKAGE.glob("*.py")):
        assert ship.relative_imports(path.stem) == _imports(path)[1], path.name


def test_archives_built_by_many_threads_at_once_are_one_build(monkeypatch):
    """The demo failed once with "AST constructor recursion depth mismatch": two nodes' `models status` built
    the archive at the same time. No AST is built now, and each archive is built once, whichever thread asks."""
    import threading

    monkeypatch.setattr(ast, "parse", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ast.parse")))
    monkeypatch.setattr(ship, "_archives", {})
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(ship.archive("models"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len(set(got)) == 1


def test_each_archive_runs_as_a_zipapp_and_imports_its_programs(tmp_path):
    for bundle, modules in ship.BUNDLES.items():
        app = tmp_path / f"{bundle}.pyz"
        app.write_bytes(ship.build(bundle))
        run = subprocess.run([sys.executable, str(app), "--help"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        carried = {p for p, m in ship.PROGRAMS.items() if m in modules}
        assert run.stderr.strip().endswith(", ".join(p for p in ship.PROGRAMS if p in carried)), run.stderr


def test_a_program_runs_from_memory_as_shipped(tmp_path):
    """The exact command a node runs (through a shell, as over SSH), doing a real small operation."""
    argv = ship.argv("models", "status", str(tmp_path), python=sys.executable)
    run = subprocess.run(["sh", "-c", shlex.join(argv)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert '"models": []' in run.stdout


def test_a_remote_command_stays_well_under_the_one_argument_limit():
    """`models pull`'s copy runs `send | ssh NEXT receive` as one command: two archives and the manifest."""
    send = ship.argv("models", "send", "~/.cache/huggingface", "org/model", "{}")
    receive = ship.argv("models", "receive", "~/.cache/huggingface", "org/model")
    pipeline = shlex.join(send) + " | " + shlex.join(["ssh", "10.0.0.2", shlex.join(receive)])
    assert len(shlex.join(["bash", "-o", "pipefail", "-c", pipeline])) < ship.ARG_LIMIT // 4
    assert len(shlex.join(ship.argv("push-source", "x" * 1000))) < ship.ARG_LIMIT // 2


def test_image_versions_runs_from_its_archive_and_says_what_the_image_lacks():
    """doctor's image.torch_nccl: the program shipped whole, run here as in an image without torch or vLLM."""
    run = subprocess.run(ship.argv("image-versions", python=sys.executable), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    line = next(x for x in run.stdout.splitlines() if x.startswith("@@versions@@"))
    found = json.loads(line[len("@@versions@@") :])
    assert set(found) >= {"torch", "vllm"}
    if found["torch"] is None:
        assert found["torch_error"].startswith(("ModuleNotFoundError", "ImportError"))


def test_reach_says_an_address_that_does_not_answer_and_exits_1():
    """`images build`'s internet check, run from its archive as on a node: a closed port is no answer."""
    run = subprocess.run(
        ship.argv("reach", "http://127.0.0.1:9/", python=sys.executable), capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1 and run.stdout.startswith("URLError"), (run.stdout, run.stderr)
