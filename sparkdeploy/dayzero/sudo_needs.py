"""The commands sparkdeploy runs on a node through `sudo -n`: the one list `setup ssh` checks and names.

Everything else runs as the SSH user (docker through its group). A new use of `sudo -n` on a node is one line
here, so `setup ssh` checks it and the sudoers line it prints stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SudoNeed:
    command: str  # the program, found on the node with `command -v`
    why: str


NEEDS: tuple[SudoNeed, ...] = (
    SudoNeed(
        "python3",
        "images push --from reads the source node's layer store (nodeside/store_reader.py); setup network writes "
        "and applies /etc/netplan under a rollback timer (nodeside/netguard.py)",
    ),
)


def commands() -> list[str]:
    return [n.command for n in NEEDS]


def why(command: str) -> str:
    return next((n.why for n in NEEDS if n.command == command), "")


def sudoers_line(user: str, paths: list[str]) -> str:
    """The drop-in line that grants exactly these programs (the fix `setup ssh` prints)."""
    return f"{user} ALL=(root) NOPASSWD: {', '.join(paths)}"
