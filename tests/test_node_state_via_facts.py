"""Node state only through facts/, node programs only as nodeside/ modules (issue 37 item 4), enforced.

The rule, read from the code (an AST scan, no import): outside facts/ (the one fact layer), runtime/ (the
connections themselves), nodeside/ (what runs on the nodes) and lab/ (the virtual cluster, built through the
Docker SDK), no module
  - runs a program of its own on a node: a `.run([...])` whose command is a shell given a script (`sh -c`,
    `bash -c`, `bash -s`) or `python3 -c`;
  - holds a program in a string: a multi-line string that is Python source or holds a heredoc (`<<`).
Today's exceptions are listed below, each with why it is one: a command that changes the node (a step, not a
read), a probe that measures between nodes (CONVENTIONS.md: not a fact), or a read still to move into facts/
(issue 37 item 4's backlog: the list only shrinks; an entry that no longer matches fails too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "sparkdeploy"
EXEMPT_FOLDERS = ("facts", "runtime", "nodeside", "lab", "data")
SHELLS = ("sh", "bash")

CHANGES = "changes the node: a step, not a read"
PROBE = "measures between nodes or from the node outward: a probe, not a fact"
TO_MOVE = "reads node state with its own script: to move into facts/ (issue 37 item 4, left)"

ALLOWED = {
    ("deploy/apply.py", "run", "one"): CHANGES,  # the `clean` step: our temp files in the state dir
    ("deploy/apply.py", "run", "_create_container"): CHANGES,  # an on-demand member's `docker create` (issue 40)
    ("images/push.py", "run", "_finalize"): CHANGES,
    ("images/push.py", "run", "_tag_existing"): CHANGES,
    ("dayzero/network_setup.py", "run", "one"): PROBE,  # ping over the fabric at the jumbo MTU
    ("daytwo/crashes.py", "run", "read"): TO_MOVE,
    ("doctor/doctor_run.py", "run", "script"): PROBE,  # network_checks' don't-fragment ping (facts' `sec` helper)
    ("images/inventory_images.py", "run", "read_node_images"): TO_MOVE,
    ("images/push_from.py", "run", "_store_readable"): TO_MOVE,
    ("models/pull.py", "run", "_client_argv"): TO_MOVE,  # id -u / -g, which cache folders exist
}


def _const(node: ast.AST) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _runs_a_program(call: ast.Call) -> bool:
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "run" and call.args):
        return False
    argv = call.args[0]
    if not isinstance(argv, ast.List | ast.Tuple) or len(argv.elts) < 2:
        return False
    words = [_const(e) for e in argv.elts]
    shell = words[0] in SHELLS and words[1] in ("-c", "-s")
    python = any(w == "python3" for w in words) and "-c" in words
    return shell or python


def _is_program_text(value: object) -> bool:
    if not isinstance(value, str) or "\n" not in value.strip():
        return False
    python = "import " in value and ("print(" in value or "def " in value or "try:" in value)
    return python or "<<" in value


class _Scan(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module, self.where, self.hits = module, ["<module>"], set()

    def _enter(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _enter  # ast.NodeVisitor's names

    def visit_Assign(self, node: ast.Assign) -> None:
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if names and any(_is_program_text(_const(n)) for n in ast.walk(node.value)):
            self.hits.add((self.module, "string", names[0]))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if _runs_a_program(node):
            self.hits.add((self.module, "run", self.where[-1]))
        self.generic_visit(node)


def _hits() -> set[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.split("/")[0] in EXEMPT_FOLDERS:
            continue
        scan = _Scan(module)
        scan.visit(ast.parse(path.read_text(), str(path)))
        found |= scan.hits
    return found


def test_no_module_outside_facts_runs_its_own_read_or_holds_a_program_in_a_string():
    new = sorted(_hits() - set(ALLOWED))
    assert not new, (
        "node state is read through sparkdeploy/facts/ (a Fact in facts/catalog.py, a set in its readers' list) "
        f"and node programs live in sparkdeploy/nodeside/: {new}"
    )


def test_the_exceptions_only_shrink():
    stale = sorted(set(ALLOWED) - _hits())
    assert not stale, f"these no longer run their own program: take them off ALLOWED: {stale}"


def test_the_scan_sees_a_read_script_and_a_program_in_a_string():
    code = (
        "SCRIPT = 'docker ps'\n"
        "PY = '''import json\\nprint(json.dumps({}))\\n'''\n"
        "def read(conn):\n"
        "    return conn.run(['sh', '-c', SCRIPT], check=False)\n"
        "def versions(session, ref):\n"
        "    return session.run(['docker', 'run', ref, 'python3', '-c', PY])\n"
    )
    scan = _Scan("x.py")
    scan.visit(ast.parse(code))
    assert scan.hits == {("x.py", "run", "read"), ("x.py", "run", "versions"), ("x.py", "string", "PY")}


def test_the_section_framing_is_written_once():
    """facts/script.py's `sec` (a command's stdout, stderr and exit code, framed) is the one copy: doctor's probe
    scripts are prefixed with it, never with a copy of their own."""
    owners = sorted(
        path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py") if "sec() {" in path.read_text()
    )
    assert owners == ["facts/script.py"]
