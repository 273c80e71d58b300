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
    # on-demand members (issue 40): per model, the last request's time (its waiting and in_flight columns, of an
    # older gateway, are no longer read: demand_worker below); read by the nodes' activators through the hook's
    # GET /sparkdeploy/demand
    (
        "CREATE TABLE IF NOT EXISTS demand (model TEXT PRIMARY KEY, waiting INTEGER NOT NULL DEFAULT 0, "
        "in_flight INTEGER NOT NULL DEFAULT 0, last_request REAL)"
    ),
    # the on-demand decisions the gateway's log has a line for (decision_line): one line over every worker
    "CREATE TABLE IF NOT EXISTS decisions (key TEXT PRIMARY KEY, at REAL NOT NULL)",
    # the counts per worker process (demand's own waiting/in_flight columns are no longer written): a worker
    # killed mid-request (the gateway's container killed or restarted, uvicorn respawning a worker) leaves its
    # rows, and demand() counts only the rows of workers alive now, so a dead one's +1 never blocks an idle stop
    (
        "CREATE TABLE IF NOT EXISTS demand_worker (model TEXT NOT NULL, worker TEXT NOT NULL, "
        "waiting INTEGER NOT NULL DEFAULT 0, in_flight INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (model, worker))"
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


def _boot() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _started(pid: int) -> str | None:
    """Process `pid`'s start time (clock ticks since boot, /proc/PID/stat's 22nd field), None when it is gone: with
    the pid and the boot it names one process for good (a pid is reused, a pid and its start time are not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else None


_me: tuple[int, str] | None = None  # (pid, this process's worker id), made once per process


def worker() -> str:
    """This process's id in the demand counts: `BOOT/PID/START`."""
    global _me
    pid = os.getpid()
    if _me is None or _me[0] != pid:  # (a fork after import is another process)
        _me = (pid, f"{_boot()}/{pid}/{_started(pid)}")
    return _me[1]


def alive(worker_id: str) -> bool:
    """Whether the process a worker id names runs now (in this container's pid namespace, where every gateway
    worker runs: a worker of a gateway before a restart is gone, its pid maybe reused by another process)."""
    boot, _, rest = worker_id.partition("/")
    pid, _, started = rest.partition("/")
    return boot == _boot() and pid.isdigit() and _started(int(pid)) == started


def demand_add(model: str, waiting: int = 0, in_flight: int = 0, path: str = DB) -> None:
    """A request for an on-demand model begins (+1) or ends (-1) waiting or in flight, counted for this worker
    process; a beginning is its last request. Counts never go below 0."""
    now = time.time() if waiting > 0 or in_flight > 0 else None
    conn = connect(path)
    conn.execute(
        "INSERT INTO demand (model, last_request) VALUES (?, ?) "
        "ON CONFLICT(model) DO UPDATE SET last_request = coalesce(excluded.last_request, last_request)",
        (model, now),
    )
    conn.execute(
        "INSERT INTO demand_worker (model, worker, waiting, in_flight) VALUES (?, ?, max(0, ?), max(0, ?)) "
        "ON CONFLICT(model, worker) DO UPDATE SET waiting = max(0, waiting + ?), in_flight = max(0, in_flight + ?)",
        (model, worker(), int(waiting), int(in_flight), int(waiting), int(in_flight)),
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
        self._note(True, model)

    def end(self, model: str) -> None:
        self._note(False, model)

    def _note(self, beginning: bool, model: str) -> None:
        with self._cond:
            # the dict is picked under the lock: the writer swaps both for new ones under it, and a note added to
            # the one it took after it wrote that model is lost (a lost end kept a model "in flight" for good, so
            # it was never evicted nor stopped as idle: CI's lab, twice)
            counts = self._begun if beginning else self._ended
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
    """model -> {"waiting", "in_flight", "last_request"} (epoch seconds or None): the counts of the workers alive
    now (a dead worker's rows are dropped here)."""
    conn = connect(path)
    out: dict[str, dict[str, float | int | None]] = {
        m: {"waiting": 0, "in_flight": 0, "last_request": t}
        for m, t in conn.execute("SELECT model, last_request FROM demand").fetchall()
    }
    rows = conn.execute("SELECT model, worker, waiting, in_flight FROM demand_worker").fetchall()
    living = {w: alive(w) for w in {row[1] for row in rows}}
    for model, w, waiting, in_flight in rows:
        if living[w]:
            seen = out.setdefault(model, {"waiting": 0, "in_flight": 0, "last_request": None})
            seen["waiting"] = int(seen["waiting"] or 0) + int(waiting)
            seen["in_flight"] = int(seen["in_flight"] or 0) + int(in_flight)
    dead = [w for w, up in living.items() if not up]
    if dead:
        conn.executemany("DELETE FROM demand_worker WHERE worker = ?", [(w,) for w in dead])
    return out


DECISIONS_KEPT_S = 7 * 24 * 3600  # a decision's row: long enough that no watcher publishes it again meanwhile
LINE_MAX = 600


def decision_line(group: str, record: object, path: str = DB) -> str | None:
    """The gateway log's line for an on-demand decision of `group` that a watcher publishes (`activation` in its
    /watch, nodeside/guard/activate.py's decision; issue 40): the first time any worker sees it, None after (and
    for what is not a decision). Its row keeps it once over every worker and a gateway restart. One line: what
    the watcher says is printed without its control characters, cut at LINE_MAX."""
    if not isinstance(record, dict) or not isinstance(record.get("at"), (int, float)) or not record.get("action"):
        return None
    conn = connect(path)
    at = float(record["at"])
    if conn.execute("INSERT OR IGNORE INTO decisions (key, at) VALUES (?, ?)", (f"{group}@{at!r}", at)).rowcount != 1:
        return None
    conn.execute("DELETE FROM decisions WHERE at < ?", (at - DECISIONS_KEPT_S,))
    parts = [f"on-demand {record['action']} {group}: {record.get('why') or ''}"]
    if record.get("stopped"):
        parts.append(f"stopped for it: {', '.join(str(n) for n in record['stopped'])}")
    text = "; ".join(parts)
    return "".join(c if c.isprintable() else " " for c in text)[:LINE_MAX]


def dump(path: str = DB) -> dict[str, dict[str, int]]:
    if not os.path.exists(path):
        return {}
    rows = connect(path).execute("SELECT key, tokens, requests FROM spend").fetchall()
    return {k: {"tokens": int(t), "requests": int(r)} for k, t, r in rows}


if __name__ == "__main__":
    print(json.dumps(dump(sys.argv[1] if len(sys.argv) > 1 else DB), sort_keys=True))
