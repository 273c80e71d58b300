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
