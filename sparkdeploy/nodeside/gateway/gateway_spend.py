"""What each gateway key has spent, in tokens, and its requests of the last minute: the store behind
`keys create --max-budget` and `--rpm` (issue 28).

Shipped beside gateway_hook.py into the gateway's state dir and run inside the gateway container (standard
library only; sparkdeploy never imports it). The unit is tokens, prompt + completion, as each answer's `usage`
counts them: self-hosted models have no price, and LiteLLM's USD budgets need its database (see deploy/stack/keys.py).

One sqlite file in WAL mode on the gateway's writable state volume (`spend/` in its state dir on the head
node): it survives a gateway restart, and every proxy worker (a process each) adds to and reads the same
counts. The key is the sha256 of the token, as in keys.json; a revoked key's row stays and is never matched
again (a new token is a new hash).

    python3 gateway_spend.py [DB]   # the counts as JSON {sha256: {"tokens": N, "requests": N}}: `keys list`
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable

DB = os.environ.get("SPARKDEPLOY_SPEND_DB", "/sparkdeploy-spend/spend.sqlite")
SCHEMA = (
    (
        "CREATE TABLE IF NOT EXISTS spend (key TEXT PRIMARY KEY, tokens INTEGER NOT NULL, "
        "requests INTEGER NOT NULL, updated REAL NOT NULL)"
    ),
    # one row per request of a key with an rpm, for a minute: every worker counts the same requests
    "CREATE TABLE IF NOT EXISTS hits (key TEXT NOT NULL, at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS hits_key_at ON hits (key, at)",
    # on-demand members (issue 40): per model, requests held for its start, requests in flight, the last request's
    # time; read by the nodes' activators through the hook's GET /sparkdeploy/demand
    (
        "CREATE TABLE IF NOT EXISTS demand (model TEXT PRIMARY KEY, waiting INTEGER NOT NULL DEFAULT 0, "
        "in_flight INTEGER NOT NULL DEFAULT 0, last_request REAL)"
    ),
)
WINDOW_S = 60.0


_local = threading.local()


def connect(path: str = DB) -> sqlite3.Connection:
    """This thread's connection to `path`, opened once (a request's budget check costs one SELECT, not an open)."""
    conns: dict[str, sqlite3.Connection] = _local.__dict__.setdefault("conns", {})
    if path in conns:
        return conns[path]
    conn = sqlite3.connect(path, timeout=5.0, isolation_level=None)
    # WAL: readers (every request of a budgeted key) never wait for the writer; NORMAL: a commit is not an fsync
    # (a crash of the whole node may lose the last few counts, never corrupt the file).
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    for statement in SCHEMA:
        conn.execute(statement)
    conns[path] = conn
    return conn


def add(key: str, tokens: int, path: str = DB) -> None:
    connect(path).execute(
        "INSERT INTO spend (key, tokens, requests, updated) VALUES (?, ?, 1, ?) ON CONFLICT(key) DO UPDATE "
        "SET tokens = tokens + excluded.tokens, requests = requests + 1, updated = excluded.updated",
        (key, max(0, int(tokens)), time.time()),
    )


def spent(key: str, path: str = DB) -> int:
    row = connect(path).execute("SELECT tokens FROM spend WHERE key = ?", (key,)).fetchone()
    return int(row[0]) if row else 0


def take(key: str, rpm: int, now: float | None = None, path: str = DB) -> int | None:
    """Count one request of `key` against its `rpm` (requests in the last WINDOW_S seconds, over every worker):
    None when it may go on (and it is counted), else how many it made in the window (it is not counted)."""
    now = time.time() if now is None else now
    conn = connect(path)
    conn.execute("BEGIN IMMEDIATE")  # count and add in one write transaction: two workers never both see room
    try:
        conn.execute("DELETE FROM hits WHERE key = ? AND at <= ?", (key, now - WINDOW_S))
        (seen,) = conn.execute("SELECT COUNT(*) FROM hits WHERE key = ?", (key,)).fetchone()
        if seen >= rpm:
            return int(seen)
        conn.execute("INSERT INTO hits (key, at) VALUES (?, ?)", (key, now))
        return None
    finally:
        conn.execute("COMMIT")


def demand_add(model: str, waiting: int = 0, in_flight: int = 0, path: str = DB) -> None:
    """A request for an on-demand model begins (+1) or ends (-1) waiting or in flight; a beginning is its last
    request. Counts never go below 0 (a worker killed mid-request leaves its +1: the next gateway start clears)."""
    now = time.time() if waiting > 0 or in_flight > 0 else None
    connect(path).execute(
        "INSERT INTO demand (model, waiting, in_flight, last_request) VALUES (?, max(0, ?), max(0, ?), ?) "
        "ON CONFLICT(model) DO UPDATE SET waiting = max(0, waiting + ?), in_flight = max(0, in_flight + ?), "
        "last_request = coalesce(excluded.last_request, last_request)",
        (model, int(waiting), int(in_flight), now, int(waiting), int(in_flight)),
    )


class InFlight:
    """Requests in flight per on-demand model, counted without waiting (issue 40: the warm path's cost): `begin`
    and `end` only note the change (a dict update under a lock, on the proxy's event loop); this worker's writer
    thread, started on the first, adds the noted changes to the demand table as `demand_add` does, merged per
    model and pass: the beginnings in one write (which sets the last request's time), then the ends in another.
    Under load a pass carries many requests; alone, a request's two writes happen beside it, not before and
    after it. The activator (docs/stack.md) sees a count a write later (milliseconds, against its look of a
    second). A failed write is noted again and tried on the next pass."""

    def __init__(self, path: str = DB, write: Callable[..., None] | None = None) -> None:
        self.path = path
        self.write = write or demand_add
        self._cond = threading.Condition()
        self._begun: dict[str, int] = {}
        self._ended: dict[str, int] = {}
        self._thread: threading.Thread | None = None

    def begin(self, model: str) -> None:
        self._note(self._begun, model)

    def end(self, model: str) -> None:
        self._note(self._ended, model)

    def _note(self, counts: dict[str, int], model: str) -> None:
        with self._cond:
            counts[model] = counts.get(model, 0) + 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gateway-in-flight", daemon=True)
                self._thread.start()
            self._cond.notify()

    def flush(self) -> int:
        """Write what is noted now; the number of writes."""
        with self._cond:
            begun, ended = self._begun, self._ended
            self._begun, self._ended = {}, {}
        writes = 0
        try:
            for model in sorted(set(begun) | set(ended)):
                for counts, sign in ((begun, 1), (ended, -1)):  # a request's beginning before its end
                    if counts.get(model):
                        self.write(model, in_flight=sign * counts[model], path=self.path)
                        del counts[model]
                        writes += 1
        except sqlite3.Error:  # locked past its timeout, or the disk: what is not written is noted again
            with self._cond:
                for mine, left in ((self._begun, begun), (self._ended, ended)):
                    for m, n in left.items():
                        mine[m] = mine.get(m, 0) + n
            raise
        return writes

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._begun and not self._ended:
                    self._cond.wait()
            try:
                self.flush()
            except sqlite3.Error:
                time.sleep(0.5)


def demand(path: str = DB) -> dict[str, dict[str, float | int | None]]:
    """model -> {"waiting", "in_flight", "last_request"} (epoch seconds or None)."""
    rows = connect(path).execute("SELECT model, waiting, in_flight, last_request FROM demand").fetchall()
    return {m: {"waiting": int(w), "in_flight": int(f), "last_request": t} for m, w, f, t in rows}


def dump(path: str = DB) -> dict[str, dict[str, int]]:
    if not os.path.exists(path):
        return {}
    rows = connect(path).execute("SELECT key, tokens, requests FROM spend").fetchall()
    return {k: {"tokens": int(t), "requests": int(r)} for k, t, r in rows}


if __name__ == "__main__":
    print(json.dumps(dump(sys.argv[1] if len(sys.argv) > 1 else DB), sort_keys=True))
