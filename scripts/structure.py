"""Structure figures of the sparkdeploy package (docs/structure.md, issue 37): read from the code's own syntax trees.

    python3 scripts/structure.py            # the figures
    python3 scripts/structure.py --list     # and what each counts (the names, the long functions, the circles)
    python3 scripts/structure.py --json

- root modules: `sparkdeploy/*.py` (`__init__.py` included);
- module names that repeat within the package (`plan.py` in two folders), `__init__.py`/`__main__.py` left out;
- functions (and methods) over 80 lines, from `def` to their last line, decorators left out;
- import circles between rooms, where a room is a module at the package root or a top-level folder of the package
  taken whole (a folder that imports a folder that imports it back IS a circle). With no circle, every import runs
  down: the rooms can be stacked so that each stands above all it imports.
Standard library only; nothing of the package is imported (it runs on a tree that does not import).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "sparkdeploy"
LONG = 80
SKIP = {"data"}  # sparkdeploy/data: build copies (setup.py)


def package_files(pkg: Path) -> list[Path]:
    return sorted(p for p in pkg.rglob("*.py") if p.relative_to(pkg).parts[0] not in SKIP)


def module_name(pkg: Path, path: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def long_functions(path: Path, tree: ast.Module) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > LONG:
                    out.append((name, lines))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def imported_modules(tree: ast.Module, current: str, is_package: bool) -> set[str]:
    """The modules of the package this one imports (absolute names; `from x import name` counts as x and x.name)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = current.split(".") if is_package else current.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in out if m == PACKAGE or m.startswith(PACKAGE + ".")}


def room_of(module: str, rooms: set[str]) -> str | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return parts[1] if parts[1] in rooms else None


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one room (Tarjan), or a room importing itself is not counted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


def measure(root: Path) -> dict[str, object]:
    pkg = root / PACKAGE
    files = package_files(pkg)
    root_modules = sorted(p.name for p in pkg.glob("*.py"))
    names = Counter(p.name for p in files if p.name not in ("__init__.py", "__main__.py"))
    repeated = {
        n: sorted(str(p.relative_to(root)) for p in files if p.name == n) for n, c in sorted(names.items()) if c > 1
    }
    rooms = {p.stem for p in pkg.glob("*.py") if p.name != "__init__.py"}
    rooms |= {d.name for d in pkg.iterdir() if d.is_dir() and (d / "__init__.py").exists() and d.name not in SKIP}
    edges: dict[str, set[str]] = {r: set() for r in rooms}
    longs: list[tuple[str, int]] = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = str(path.relative_to(root))
        longs += [(f"{rel}:{name}", n) for name, n in long_functions(path, tree)]
        current = module_name(pkg, path)
        here = room_of(current, rooms)
        if here is None:
            continue
        for mod in imported_modules(tree, current, path.name == "__init__.py"):
            there = room_of(mod, rooms)
            if there is not None and there != here:
                edges[here].add(there)
    longs.sort(key=lambda x: -x[1])
    return {
        "root_modules": len(root_modules),
        "root_module_names": root_modules,
        "repeated_names": len(repeated),
        "repeated": repeated,
        "functions_over_80_lines": len(longs),
        "long_functions": [f"{name} {n}" for name, n in longs],
        "rooms": len(rooms),
        "import_edges_between_rooms": sum(len(v) for v in edges.values()),
        "circles": len(circles(edges)),
        "circle_rooms": circles(edges),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this script's)")
    ap.add_argument("--list", action="store_true", help="also print what each figure counts")
    ap.add_argument("--json", action="store_true", help="everything as JSON")
    a = ap.parse_args(argv)
    m = measure(a.root)
    if a.json:
        print(json.dumps(m, indent=2))
        return 0
    print(f"modules at the package root     {m['root_modules']}")
    print(f"module names that repeat        {m['repeated_names']}")
    print(f"functions over {LONG} lines         {m['functions_over_80_lines']}")
    print(f"rooms (root modules + folders)  {m['rooms']}")
    print(f"imports between rooms           {m['import_edges_between_rooms']}")
    print(f"import circles between rooms    {m['circles']}")
    if a.list:
        print("\nroot modules: " + " ".join(m["root_module_names"]))  # type: ignore[arg-type]
        print("\nrepeated names:")
        for name, paths in m["repeated"].items():  # type: ignore[attr-defined]
            print(f"  {name}: {' '.join(paths)}")
        print(f"\nfunctions over {LONG} lines:")
        for line in m["long_functions"]:  # type: ignore[attr-defined]
            print(f"  {line}")
        for comp in m["circle_rooms"]:  # type: ignore[attr-defined]
            print(f"circle: {' <-> '.join(comp)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
