"""No import circles (#25): the packages' module-level imports form no cycle, those under `if TYPE_CHECKING:`
included (an annotation that needs the other module is a dependency all the same: hiding it there is how the
recipes -> eugr -> vllm_args -> recipes circle once stood), and every module of sparkdeploy imports on its own,
first, in a fresh interpreter (a function-local import can hide a circle that only shows when the other side is
imported first)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# (folder holding the package, package name)
PACKAGES = [
    (REPO, "sparkdeploy"),
    (REPO / "images" / "launcher", "sparklaunch"),
    (REPO / "images" / "vllm-sim", "vllm_sim"),
]


# Runs inside an image, not here: the gateway's auth hook is mounted into the LiteLLM proxy and imports litellm.
IN_IMAGES = {"sparkdeploy.nodeside.gateway.gateway_hook"}


def _modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if "data" in parts[1:2]:  # sparkdeploy/data: build copies
            continue
        out[".".join(parts)] = path
    return out


def _top_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of `known` that `name` imports at module level (under `if TYPE_CHECKING:` too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    stack: list[ast.stmt] = list(ast.parse(path.read_text()).body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If | ast.Try):
            stack += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            stack += [s for h in getattr(node, "handlers", []) for s in h.body]
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            subs = {f"{base}.{a.name}" for a in node.names} & known  # `from pkg import module`: that module
            found |= subs if len(subs) == len(node.names) else {base, *subs}
    return {m for m in found if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    graph: dict[str, set[str]] = {}
    for root, package in PACKAGES:
        modules = _modules(root, package)
        for name, path in modules.items():
            graph[name] = _top_imports(path, name, set(modules))
    assert len(graph) > 100 and graph["sparkdeploy.deploy.apply"], "the walk found the packages and their imports"
    circles = list(_cycles(graph))
    assert circles == [], circles


def test_every_module_imports_first_on_its_own():
    # A package's __main__ runs its program when imported (`python3 -m guard CONFIG`): not a module to import.
    names = [n for n in _modules(REPO, "sparkdeploy") if not n.endswith(".__main__") and n not in IN_IMAGES]
    program = (
        "import importlib, sys\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    for m in [m for m in sys.modules if m == 'sparkdeploy' or m.startswith('sparkdeploy.')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(failed))\n"
    )
    run = subprocess.run([sys.executable, "-c", program, *names], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == ""


def _all_imports(path: Path, name: str) -> set[str]:
    """Every module `name` imports, anywhere in it (function-local and TYPE_CHECKING imports too), as absolute
    names, with `from pkg import x` counted as both pkg and pkg.x."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found |= {base, *(f"{base}.{a.name}" for a in node.names)}
    return found


def test_the_folders_are_stages_no_folder_imports_one_that_imports_it_back():
    """Issue 37: `ls sparkdeploy/` reads the flow. A room is a module at the package root or a top-level folder taken
    whole; no circle between rooms, counting every import (a folder importing a folder that imports it back is a
    circle, even when no two modules of theirs are), so the rooms stack: each stands above all it imports. The root
    keeps at most 15 modules, and no two modules share a name (docs/CONVENTIONS.md, Layout)."""
    package = REPO / "sparkdeploy"
    rooms = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    rooms |= {d.name for d in package.iterdir() if (d / "__init__.py").is_file() and d.name != "data"}
    graph: dict[str, set[str]] = {room: set() for room in rooms}
    for name, path in _modules(REPO, "sparkdeploy").items():
        here = name.split(".")[1] if "." in name else None
        if here not in rooms:
            continue
        for imported in _all_imports(path, name):
            parts = imported.split(".")
            if parts[0] == "sparkdeploy" and len(parts) > 1 and parts[1] in rooms and parts[1] != here:
                graph[here].add(parts[1])
    assert {"deploy", "facts", "runtime", "config"} <= rooms and graph["deploy"], "the walk found the rooms"
    assert _cycles(graph) == []
    assert len(list(package.glob("*.py"))) <= 15, sorted(p.name for p in package.glob("*.py"))
    modules = [p for p in package.rglob("*.py") if p.relative_to(package).parts[0] != "data"]  # data: build copies
    names = [p.name for p in modules if p.name not in ("__init__.py", "__main__.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
