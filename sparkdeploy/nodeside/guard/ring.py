"""The black box: a ring of recent samples and events on the node's disk, synced, bounded, readable after a crash.

The file is SLOTS fixed slots of SLOT bytes; record n goes to slot n % SLOTS, so the file never grows past
SLOTS x SLOT (1800 x 1 KiB: 30 minutes of one-second samples and their events, 1.8 MB). A slot is one JSON
object padded with spaces to SLOT-1 bytes and a newline: a torn write spoils one slot, never the ring, and the
reader skips what does not parse. Every record carries its sequence number, so the reader orders the slots
without trusting the file's position of the newest one.

Durability: samples are fdatasync'd at most every `sync_s` (1 s by default: a power-off loses at most the last
second; one 1 KiB write and one fdatasync a second cost ~0.1% of a core and a few MB a day of writes), events
(a line crossed, an engine stopped, a kernel message about OOM, Xid or AER) are synced at once.

`crash_points()` finds where the record stops and starts again: a new boot id (reboot, power-off) or a gap much
longer than the sampling interval that ends in the guard's start event (the guard, its container or the
Docker engine was killed). `postmortem` shows the minutes before the last one.
"""

import itertools
import json
import os
import threading
import time
from typing import Any

SLOT = 1024
SLOTS = 1800
FILE = "ring.jsonl"
GAP_S = 10.0  # a silence this long between two records is a gap (the guard writes one a second)


def _fit(record):
    """The record as one slot's bytes (kernel messages shortened until it fits)."""
    while True:
        data = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
        if len(data) < SLOT:
            return data + b" " * (SLOT - 1 - len(data)) + b"\n"
        msg = record.get("msg", "")
        if len(msg) > 40:
            record = dict(record, msg=msg[: len(msg) // 2] + "...")
        elif record.get("kmsg"):
            record = dict(record, kmsg=record["kmsg"][:-1])
        else:
            record = {k: record[k] for k in ("seq", "t", "boot", "kind") if k in record}


def read_records(data: bytes) -> list[dict[str, Any]]:
    """The records in a ring file's bytes, oldest first."""
    out = []
    for start in range(0, len(data), SLOT):
        chunk = data[start : start + SLOT].strip()
        if not chunk:
            continue
        try:
            record = json.loads(chunk)
        except ValueError:
            continue  # a torn or empty slot
        if isinstance(record, dict) and isinstance(record.get("seq"), int):
            out.append(record)
    out.sort(key=lambda r: r["seq"])
    return out


class Ring:
    def __init__(self, folder, sync_s=1.0, slots=SLOTS):
        self.path = os.path.join(folder, FILE)
        self.sync_s, self.slots = sync_s, slots
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(self.fd).st_size
        existing = read_records(os.pread(self.fd, size, 0)) if size else []
        self.previous = existing[-1] if existing else None  # the last record before this start
        self.seq = existing[-1]["seq"] + 1 if existing else 0
        self.synced_at = 0.0
        self.syncs = 0
        self.lock = threading.Lock()

    def write(self, record, sync=False):
        with self.lock:  # the guard's loop and its watcher's thread both record
            record = dict(record, seq=self.seq)
            os.pwrite(self.fd, _fit(record), (self.seq % self.slots) * SLOT)
            self.seq += 1
            now = time.monotonic()
            if sync or now - self.synced_at >= self.sync_s:
                os.fdatasync(self.fd)
                self.synced_at = now
                self.syncs += 1

    def close(self):
        os.fdatasync(self.fd)
        os.close(self.fd)


def crash_points(records: list[dict[str, Any]], boot_time: float = 0.0, gap_s: float = GAP_S) -> list[dict[str, Any]]:
    """Where the record broke off, oldest first: [{kind, last, resumed}] with `last` the last record before the
    break and `resumed` the first after it (None: the ring ends before the node's current boot, so the guard has
    not run since)."""
    points: list[dict[str, Any]] = []
    for before, after in itertools.pairwise(records):
        if before.get("boot") and after.get("boot") and before["boot"] != after["boot"]:
            points.append({"kind": "reboot or power-off", "last": before, "resumed": after})
        elif after.get("t", 0) - before.get("t", 0) > gap_s and before.get("ev") != "exit":  # exit: stopped cleanly
            why = "guard restarted" if after.get("ev") == "start" else "gap"
            points.append({"kind": why, "last": before, "resumed": after})
    if records and boot_time and records[-1].get("t", 0) < boot_time:
        points.append({"kind": "reboot or power-off (guard not running since)", "last": records[-1], "resumed": None})
    return points


def window(records: list[dict[str, Any]], end_t: float, minutes: float) -> list[dict[str, Any]]:
    """The records of the `minutes` before end_t (inclusive)."""
    return [r for r in records if end_t - minutes * 60 <= r.get("t", 0) <= end_t]
