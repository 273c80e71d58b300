"""What a push reports while it runs: `PushProgress` (hooks, called from worker threads; the base ignores
them all) and `RichPushProgress` (a bar per node on stderr, for the CLI and deploy)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import TaskID


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class PushProgress:
    """What push_image reports while it runs (called from its worker threads). The base class ignores it all."""

    def note(self, text: str) -> None:
        """A line of information (building, compression fallback, ...)."""

    def begin(self, node: str, total: int) -> None:
        """The node will receive about `total` archive bytes (before compression)."""

    def advance(self, node: str, raw: int = 0, wire: int = 0) -> None:
        """`raw` more archive bytes went into the node's stream; `wire` more bytes went over SSH."""

    def loading(self, node: str) -> None:
        """All of the node's archive is sent; its docker load is writing the layers."""

    def end(self, node: str, ok: bool, text: str) -> None:
        """The node is done: pushed, skipped or failed."""


class RichPushProgress(PushProgress):
    """A bar per node (archive bytes, rate, ETA, bytes on the wire) on stderr, for the CLI and deploy."""

    def __init__(self, console: Console | None = None) -> None:
        # rich.progress: about 5 ms more at startup for every importer (`up --help`); only a shown push needs it
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.console = console or Console(stderr=True, highlight=False)
        self.bar = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[wire]}"),
            console=self.console,
            transient=False,
        )
        self.tasks: dict[str, TaskID] = {}
        self.wire: dict[str, int] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> RichPushProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def note(self, text: str) -> None:
        self.bar.console.print(f"[dim]{text}[/dim]", highlight=False)

    def begin(self, node: str, total: int) -> None:
        with self._lock:
            self.wire[node] = 0
            self.tasks[node] = self.bar.add_task(node, total=total or None, wire="")

    def advance(self, node: str, raw: int = 0, wire: int = 0) -> None:
        task = self.tasks.get(node)
        if task is None:
            return
        with self._lock:
            self.wire[node] += wire
            sent = self.wire[node]
        self.bar.update(task, advance=raw, wire=f"sent {human_size(sent)}" if sent else "")

    def loading(self, node: str) -> None:
        task = self.tasks.get(node)
        if task is not None:
            done = next((t.completed for t in self.bar.tasks if t.id == task), 0)
            self.bar.update(task, total=done, description=f"{node} loading")

    def end(self, node: str, ok: bool, text: str) -> None:
        task = self.tasks.get(node)
        if task is not None:
            state = next(t for t in self.bar.tasks if t.id == task)
            done, elapsed = state.completed, state.elapsed or 0.0
            summary = f"sent {human_size(self.wire.get(node, 0))} in {elapsed:.1f} s"
            self.bar.update(
                task, total=done if ok else None, description=node if ok else f"{node} failed", wire=summary
            )
