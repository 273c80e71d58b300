"""Run a sparkdeploy command in this interpreter and record every module first imported off the main thread.

    python -B tests/support/offthread_imports.py RESULT.json -- doctor --inventory lab

CPython 3.11 can fail with "SystemError: AST constructor recursion depth mismatch" when threads compile modules
from source at the same time (python/cpython#106905; every import compiles when bytecode writing is off). So
sparkdeploy's worker threads must find what they need already imported: this harness makes the rule testable
without waiting for the race. The "import" audit event fires only for modules not yet in sys.modules.
"""

from __future__ import annotations

import json
import sys
import threading


def main() -> int:
    out_path, sep, *argv = sys.argv[1:]
    assert sep == "--", "usage: offthread_imports.py RESULT.json -- SPARKDEPLOY-ARGS..."
    imports: list[dict] = []

    def hook(event: str, args: tuple) -> None:
        if event == "import" and threading.current_thread() is not threading.main_thread():
            imports.append({"module": args[0], "thread": threading.current_thread().name})

    sys.addaudithook(hook)
    from sparkdeploy.cli.main import main as sparkdeploy_main

    sys.argv = ["sparkdeploy", *argv]
    try:
        code = sparkdeploy_main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    with open(out_path, "w") as f:
        json.dump({"exit": code or 0, "imports": imports}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
