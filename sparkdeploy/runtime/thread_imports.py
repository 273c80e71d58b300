"""Import on the main thread what sparkdeploy's worker threads would otherwise import lazily.

CPython 3.11 can fail with "SystemError: AST constructor recursion depth mismatch" when two threads compile
modules from source at the same time (python/cpython#106905). Every first import compiles when bytecode is not
written (PYTHONDONTWRITEBYTECODE=1, a read-only install), so a doctor check or a per-node step that imports a
module inside its thread can crash at random. The fix is structural: before any pool starts, `preload()` imports
everything the threads use; tests/doctor and tests/deploy run the commands under an audit hook that fails on
any module first imported off the main thread (tests/support/offthread_imports.py).
"""

from __future__ import annotations

import importlib
import threading

# Imported lazily by code that runs on worker threads (remote.NodeConnection, doctor checks, push), and the
# modules those libraries themselves import on first use (found with the audit harness above).
MODULES = (
    "encodings.idna",  # socket.getaddrinfo on a str host
    "stringprep",  # by encodings.idna
    "pwd",  # paramiko/fabric look up the local user
    "fabric",
    "invoke",
    "paramiko",
)

_done = False
_lock = threading.Lock()


def preload() -> None:
    """Idempotent and cheap after the first call; call it on the main thread before starting threads."""
    global _done
    if _done:
        return
    with _lock:
        if _done:
            return
        for name in MODULES:
            importlib.import_module(name)
        _done = True
