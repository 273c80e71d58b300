"""`python3 app.pyz PROGRAM ARGS` (here also `python -m sparkdeploy.nodeside PROGRAM ARGS`): one program, by name.

Imported by name, not at the top: an archive carries only its bundle's modules (ship.BUNDLES)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

from .ship import PROGRAMS


def carried() -> list[str]:
    """The programs this archive (or this package) carries: the ones whose module is in it."""
    return [p for p, m in PROGRAMS.items() if importlib.util.find_spec(f"{__package__}.{m}") is not None]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in PROGRAMS:
        here = carried()
        for program in here:  # --help proves each program imports with what the archive carries
            importlib.import_module(f"{__package__}.{PROGRAMS[program]}")
        print(f"usage: PROGRAM ARGS...; PROGRAM one of {', '.join(here)}", file=sys.stderr)
        return 0 if argv[:1] in (["--help"], ["-h"]) else 2
    code: int = importlib.import_module(f"{__package__}.{PROGRAMS[argv[0]]}").main(argv[1:])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
