"""The one test double per seam (issue 37 item 5): `RecordingConn` stands in for a node's `NodeConnection`
(records every command and write, answers by command prefix or computes the answer; `local_shell` runs them on
this machine), `recording_session` builds the real `Session` over them. Unit tests of pure logic use these; a
path's real test runs in the lab against a real sshd."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import StepFailed
from sparkdeploy.runtime.remote import CommandResult
from sparkdeploy.runtime.session import Session


class RecordingConn:
    """A NodeConnection that records ("run", command) and ("put", path, mode) in `calls`.

    outputs: command prefix -> (exit code, stdout), the first match answers; else `answer(command, stdin)` when
    given (a computed answer: a clock, or `local_shell`: the command run here), else (0, `stdout`).
    fail_on: a command (or `put PATH`) containing it raises StepFailed(`failure`); hook sees every command text;
    lost: what NodeConnection.lost says (the node went away mid-run)."""

    def __init__(
        self,
        node: Node,
        outputs: dict[str, tuple[int, str]] | None = None,
        *,
        stdout: str = "",
        fail_on: str | None = None,
        quoted: bool = False,
        failure: str = "exited 1",
        hook: Callable[[str], None] | None = None,
        lost: bool = False,
        answer: Callable[[str, str | None], CommandResult] | None = None,
    ) -> None:
        self.node = node
        self.outputs = outputs or {}
        self.stdout = stdout
        self.fail_on = fail_on
        self.quoted = quoted  # record the command quoted as NodeConnection sends it (shlex.join)
        self.failure = failure
        self.hook = hook
        self.lost = lost
        self.answer = answer
        self.calls: list[tuple[Any, ...]] = []

    @property
    def commands(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "run"]

    def _check(self, text: str) -> None:
        if self.hook:
            self.hook(text)
        if self.fail_on and self.fail_on in text:
            raise StepFailed(f"{self.node.name}: `{text}` {self.failure}")

    def run(
        self,
        argv: list[str] | str,
        *,
        check: bool = True,
        timeout: float | None = None,
        stdin: str | None = None,
        force: bool = False,
    ) -> CommandResult:
        text = argv if isinstance(argv, str) else (shlex.join(argv) if self.quoted else " ".join(argv))
        self.calls.append(("run", text))
        self._check(text)
        for prefix, (code, out) in self.outputs.items():
            if text.startswith(prefix):
                return CommandResult(self.node.name, text, code, out, "")
        if self.answer is not None:
            return self.answer(text, stdin)
        return CommandResult(self.node.name, text, 0, self.stdout, "")

    def put(self, content: str | bytes, path: str, mode: int = 0o644) -> None:
        self.calls.append(("put", path, mode))
        self._check(f"put {path}")

    def idle(self, wait: float) -> bool:
        return True

    def open(self) -> Any:
        raise AssertionError("a recording connection never opens a real one")

    def close(self) -> None:
        pass


def local_shell(node: Node, home: Path) -> RecordingConn:
    """A node whose commands run on this machine through a shell, as over SSH, with `home` as its $HOME."""

    def answer(command: str, stdin: str | None) -> CommandResult:
        env = dict(os.environ, HOME=str(home))
        p = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True, env=env, timeout=120)
        return CommandResult(node.name, command, p.returncode, p.stdout, p.stderr)

    return RecordingConn(node, quoted=True, answer=answer)


def recording_session(inventory: Inventory, **per_node: RecordingConn) -> Session:
    """The real Session over a RecordingConn per node (`per_node`: a node's own, by name)."""
    conns: dict[str, Any] = {n.name: per_node.get(n.name) or RecordingConn(n) for n in inventory.nodes}
    return Session(inventory, conns)
