"""Stopping on SIGINT (Ctrl-C) or SIGTERM: one mechanism for every command.

`handling()` (cli/common.run_cli wraps every command in it) installs one handler for both signals:
- The first signal raises KeyboardInterrupt in the main thread, wherever it waits (a connect, a wait for the
  nodes' threads, a sleep, a socket read), so `with` blocks and `finally` clauses run: a live display gives the
  terminal back, locks are released. Inside `graceful()` (`Interrupt` below: `up` and `down` while steps change
  nodes) the first signal only calls the run's `notify`, so the steps under way finish; the second raises.
  `immediate()` marks a part of such a run with nothing under way to finish (the health gate): there the first
  signal raises too.
- STOP is set, for loops on other threads; a second signal also sets STOPPING: no new remote command starts.
- The exit code says which signal ended the run: 128 + its number (130 for SIGINT, 143 for SIGTERM).
- A thread blocked in an SSH read or a connect is abandoned, never waited for: `in_threads` waits in short steps
  and joins nothing once stopped, and run_cli ends the process with `exit_now` (a normal exit joins every pool
  thread, however long its read stalls).
A signal ignored when the process started stays ignored: `nohup`, or `cmd &` in a script (whose shell starts the
job with SIGINT ignored), asks for exactly that.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP = threading.Event()  # a stop signal arrived: loops on every thread end
STOPPING = threading.Event()  # a second one: no new remote command from any thread (remote.NodeConnection)
WAKE_S = 0.1  # how often a wait for threads wakes: a signal is handled within it


class _State:
    def __init__(self) -> None:
        self.depth = 0
        self.previous: dict[int, Any] = {}
        self.received: int | None = None
        self.notify: list[Callable[[int], None]] = []  # graceful() sections, innermost last
        self.immediate = 0


_state = _State()


def _handler(signum: int, frame: FrameType | None) -> None:
    first = _state.received is None
    if first:
        _state.received = signum
    STOP.set()
    if first and _state.notify and not _state.immediate:
        _state.notify[-1](signum)
        return
    if not first:
        STOPPING.set()
    raise KeyboardInterrupt


@contextmanager
def handling() -> Iterator[None]:
    """The handler for SIGINT and SIGTERM while the block runs (re-entrant; only the main thread can install it).
    The outermost block is one run: no signal received, STOP and STOPPING clear, when it starts and ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outermost = _state.depth == 0
    if outermost:
        _fresh()
        for sig in SIGNALS:
            old = signal.getsignal(sig)
            if old is not signal.SIG_IGN:  # inherited from whoever started us (nohup, `cmd &`): theirs to say
                _state.previous[sig] = signal.signal(sig, _handler)
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        if outermost:
            for installed, old in _state.previous.items():
                signal.signal(installed, old)
            _state.previous.clear()
            _fresh()


def _fresh() -> None:
    _state.received = None
    STOP.clear()
    STOPPING.clear()


@contextmanager
def graceful(notify: Callable[[int], None]) -> Iterator[None]:
    """Within the block the first signal calls notify(signum) instead of raising (the caller finishes what is
    under way, then stops); the second raises at once."""
    with handling():
        _state.notify.append(notify)
        try:
            yield
        finally:
            _state.notify.remove(notify)


@contextmanager
def immediate() -> Iterator[None]:
    """Within a graceful() block: a part with nothing under way to finish, where the first signal raises at once.
    A signal that arrived before the block raises on entry."""
    _state.immediate += 1
    try:
        if _state.received is not None:
            raise KeyboardInterrupt
        yield
    finally:
        _state.immediate -= 1


def received() -> int | None:
    """The signal that stopped this run, if one did."""
    return _state.received


def exit_code() -> int:
    """128 + the signal's number; 130 (SIGINT's) for a KeyboardInterrupt that no signal of ours raised."""
    return 128 + (_state.received or signal.SIGINT)


def name(signum: int | None = None) -> str:
    """What the user did, for a message: Ctrl-C (SIGINT) or SIGTERM."""
    signum = signum or _state.received or signal.SIGINT
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def exit_now(code: int) -> None:
    """End the process without joining threads still blocked in a read (their results are not wanted)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, a closed file: nothing more can be said there
            pass
    os._exit(code)


def in_threads(items: list[T], fn: Callable[[T], R], max_workers: int | None = None) -> list[R]:
    """[fn(item) for item in items], one thread each (at most max_workers), in order. The wait wakes every
    WAKE_S, so a signal is handled at once; on any exception there (a stop) the threads still running are
    abandoned, not joined. fn's own exceptions are re-raised here: catch them inside fn to keep going."""
    if not items:
        return []
    pool = ThreadPoolExecutor(max_workers=max_workers or len(items))
    try:
        futures = [pool.submit(fn, item) for item in items]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=WAKE_S)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [f.result() for f in futures]


class Interrupt:
    """First stop signal (Ctrl-C, SIGTERM): set `event` (steps under way finish, the rest are skipped, temp files
    are cleaned). Second: KeyboardInterrupt at once. `immediate()`: a part with nothing under way to finish, where
    the first signal raises at once (`handling` above: the one handler of every command)."""

    def __init__(self, say: Callable[[str], None] | None = None):
        self.event = threading.Event()
        self._section: AbstractContextManager[None] | None = None
        self._say = say or (lambda m: print(m, file=sys.stderr, flush=True))

    def _notify(self, signum: int) -> None:
        self.event.set()
        self._say(
            f"interrupted ({name(signum)}): finishing the commands under way, then cleaning up "
            f"({name(signum)} again to stop at once)"
        )

    def __enter__(self) -> Interrupt:
        self._section = graceful(self._notify)
        self._section.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        section, self._section = self._section, None
        if section is not None:
            section.__exit__(None, None, None)

    def immediate(self) -> AbstractContextManager[None]:
        return immediate()

    @property
    def set(self) -> bool:
        return self.event.is_set()
