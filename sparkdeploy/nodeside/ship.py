"""How this package reaches a node: built into a zipapp, shipped whole in the command line, run from memory.

`build(bundle)` zips the modules a bundle of programs needs (their relative imports, followed) and a root
__main__.py, deterministically: sorted entries, one fixed timestamp and mode, so the same sources give the same
bytes and hash. zipapp.create_archive would not: it walks the folder in directory order and stamps each entry
with its file's mtime. A bundle, not the whole package: a whole remote command is one argument to the node's
shell, at most ARG_LIMIT bytes, and `models pull`'s copy carries the archive twice (`send | ssh NEXT receive`)
beside the model's manifest.

`argv(PROGRAM, ARGS...)` is `python3 -c BOOT APP PROGRAM ARGS...`: BOOT writes the archive (base64 APP) into a
memory file (memfd: nothing on the node's disk, nothing left behind by a killed program) and runs it as
`python3 app.pyz PROGRAM ARGS` would. In an argument, the program travels wherever a command does (an SSH
exec, `sudo -n`, a peer ssh to the next node) and keeps stdin free for the data. A program that starts another
(the next hop, the store reader as root) ships the archive it runs from: `own()`.
"""

from __future__ import annotations

import base64
import io
import json
import re
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent
NAME = "nodeside"  # the package's name inside the archive (its modules import each other relatively)
PROGRAMS = {
    "models": "models",
    "hub-client": "hub_client",
    "push-source": "source",
    "relay": "relay",
    "store-reader": "store_reader",
    "netguard": "netguard",
    "image-versions": "image_versions",
    "reach": "reach",
}
# The programs shipped together: `images push --from`'s source starts the others from its own archive.
BUNDLES = {
    "models": ("models",),
    "hub": ("hub_client",),
    "push": ("source", "relay", "store_reader"),
    "network": ("netguard",),  # `setup network`: applied under a node-side rollback timer
    "image": ("image_versions",),  # doctor's image.torch_nccl, run inside the engine image
    "reach": ("reach",),  # `images build`'s internet check, from the node
}
ALWAYS = ("__init__", "__main__", "ship")  # what runs a program of any bundle
STAMP = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
ROOT_MAIN = "import sys\nfrom nodeside.__main__ import main\nsys.exit(main(sys.argv[1:]))\n"
BOOT = (
    "import base64,os,runpy,sys\n"
    "fd=os.memfd_create('sparkdeploy-nodeside')\n"
    "with open(fd,'wb',closefd=False) as f: f.write(base64.b64decode(sys.argv[1]))\n"
    "sys.argv[:2]=['/proc/self/fd/%d'%fd]\n"
    "runpy.run_path(sys.argv[0],run_name='__main__')\n"
)
ARG_LIMIT = 128 * 1024  # Linux's MAX_ARG_STRLEN: the longest one argument (a remote command) may be


# `from .x import y` / `from . import x, y` on one line (how this package imports itself; a module missing from an
# archive fails tests/test_nodeside.py, which runs every archive). Read as text, not with ast: archives are built
# on worker threads, and CPython 3.11 can fail two AST constructions at once ("AST constructor recursion depth
# mismatch", python/cpython#106905: seen in the demo, two nodes' `models status` at once).
RELATIVE_IMPORT = re.compile(r"^from \.(\w*) import (.+)$", re.M)


def relative_imports(module: str, package: Path = PACKAGE) -> set[str]:
    """The package's modules `module` imports (`from .x import y`, `from . import x`)."""
    found = set()
    for name, names in RELATIVE_IMPORT.findall((package / f"{module}.py").read_text()):
        found |= {name} if name else {n.strip().split(" as ")[0] for n in names.split(",")}
    return found


def bundle_modules(bundle: str, package: Path = PACKAGE) -> list[str]:
    """The modules an archive of `bundle` carries: its programs, what runs them, and all they import."""
    todo, seen = [*BUNDLES[bundle], *ALWAYS], set()
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += sorted(relative_imports(module, package))
    return sorted(seen)


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, STAMP)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def build(bundle: str, package: Path = PACKAGE) -> bytes:
    """The zipapp of `bundle`: its modules under NAME/, and the root __main__.py that runs NAME.__main__."""
    files = {f"{NAME}/{m}.py": (package / f"{m}.py").read_bytes() for m in bundle_modules(bundle, package)}
    files["__main__.py"] = ROOT_MAIN.encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name in sorted(files):
            z.writestr(_entry(name), files[name], compresslevel=9)
    return out.getvalue()


_archives: dict[str, str] = {}
_archives_lock = threading.Lock()


def archive(bundle: str) -> str:
    """The zipapp of `bundle` built here, base64 (what argv carries); built once, by whichever thread asks first."""
    with _archives_lock:
        if bundle not in _archives:
            _archives[bundle] = base64.b64encode(build(bundle)).decode()
        return _archives[bundle]


def bundle_of(program: str) -> str:
    return next(b for b, modules in BUNDLES.items() if PROGRAMS[program] in modules)


def own() -> str:
    """The archive this program runs from, base64 (run as a zipapp, sys.argv[0] is the archive)."""
    with open(sys.argv[0], "rb") as f:
        return base64.b64encode(f.read()).decode()


def encode(cfg: Any) -> str:
    """A program's config as one argument: base64 JSON needs no quoting through any number of shells."""
    return base64.b64encode(json.dumps(cfg, separators=(",", ":")).encode()).decode()


def decode(text: str) -> Any:
    return json.loads(base64.b64decode(text))


def argv(program: str, *args: str, app: str | None = None, python: str = "python3") -> list[str]:
    """The command that runs `program` from the archive `app` (base64; its bundle built here when None)."""
    return [python, "-c", BOOT, archive(bundle_of(program)) if app is None else app, program, *args]
