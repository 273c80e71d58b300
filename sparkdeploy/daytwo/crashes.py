"""Why sparkdeploy's containers stopped: restarts, the last exit (OOM kill, signal, exit code), health.

Read as the registered fact `crashes` (facts/catalog.py: one read-only command): `docker inspect` of our
containers (label io.sparkdeploy.managed) for their state, and the engine's recent `die` and `oom` events,
because a container that its restart policy brought back shows `running` again and no longer says how it died.
Only the fields named there are read: never Config.Env (the secrets of `--env-file secrets.env`).

Used by `status` (a column per container) and by doctor's `engine.crashes` (one-line diagnosis + fix).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sparkdeploy import healthcheck
from sparkdeploy.facts import FactArgs, gather, health_probes, parse_time
from sparkdeploy.facts.catalog import CRASH_HISTORY_S, CRASH_SECTION, crash_records
from sparkdeploy.facts.node import CrashRecords
from sparkdeploy.facts.parsers import Section

if TYPE_CHECKING:
    from sparkdeploy.runtime.remote import NodeConnection

HISTORY_S = CRASH_HISTORY_S  # how far back the engine's events are read (it keeps the last 256 in memory)
READ_TIMEOUT_S = 20
SECTION = CRASH_SECTION


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class Exit:
    """One exit of a container: when, with which code, and whether the kernel's OOM killer caused it."""

    at: datetime | None
    code: int | None
    oom: bool = False
    by_docker: bool = False  # docker stop / kill / restart asked for it: not a crash

    @property
    def reason(self) -> str:
        if self.by_docker:
            return f"stopped by Docker (docker stop/kill/restart, exit {self.code})"
        if self.oom:
            return f"OOM-killed (exit {self.code if self.code is not None else 137})"
        if self.code is None:
            return "exited (code unknown)"
        if self.code == 0:
            return "exited cleanly (exit 0)"
        if self.code > 128:
            return f"killed by {_signal_name(self.code - 128)} (exit {self.code})"
        return f"exit code {self.code}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat() if self.at else None,
            "code": self.code,
            "oom_killed": self.oom,
            "by_docker": self.by_docker,
            "reason": self.reason,
        }


@dataclass
class ContainerHistory:
    name: str
    role: str
    status: str
    running: bool
    restarts: int
    started_at: datetime | None
    last_exit: Exit | None
    exits: list[Exit] = field(default_factory=list)  # recent exits (events), oldest first
    health: str | None = None  # Docker's healthcheck status, when the container declares one
    failing_since: datetime | None = None
    error: str = ""

    def exits_within(self, seconds: float, now: datetime) -> list[Exit]:
        """The crashes (exits Docker did not ask for) of the last `seconds`."""
        return [
            e for e in self.exits if e.at is not None and not e.by_docker and (now - e.at).total_seconds() <= seconds
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "restarts": self.restarts,
            "last_exit": self.last_exit.as_dict() if self.last_exit else None,
            "recent_exits": len(self.exits),
            "oom_kills": sum(1 for e in self.exits if e.oom),
            "docker_health": self.health,
            "health_failing_since": self.failing_since.isoformat() if self.failing_since else None,
            "error": self.error or None,
        }


@dataclass
class NodeHistory:
    now: datetime
    containers: dict[str, ContainerHistory] = field(default_factory=dict)


def _nano_time(value: Any) -> datetime | None:  # a JSON value: any type, a wrong one is None
    try:
        return datetime.fromtimestamp(int(value) / 1e9, tz=UTC)
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


KILL_TO_DIE_S = 30  # docker stop waits 10 s (by default) between its signal and SIGKILL


def _exits_from_events(events: list[dict[str, Any]]) -> dict[str, list[Exit]]:
    """Container ID -> its `die` events, oldest first. A die right after an `oom` of the same container is an
    OOM kill; right after a `kill` event, Docker itself stopped it (docker stop/kill/restart/rm -f). Keyed by
    ID: every `up` makes new containers under the same names, and the old ones' ends are not the new ones'."""
    per: dict[str, list[Exit]] = {}
    pending: dict[tuple[str, str], datetime] = {}
    for e in sorted(events, key=lambda e: _int(e.get("time")) or 0):
        cid, at, action = str(e.get("id") or ""), _nano_time(e.get("time")), e.get("action")
        if action in ("oom", "kill") and at is not None:
            pending[(cid, action)] = at
        elif action == "die":
            oom_at, kill_at = pending.pop((cid, "oom"), None), pending.pop((cid, "kill"), None)
            oom = oom_at is not None and at is not None and (at - oom_at).total_seconds() < 60
            by_docker = (
                not oom and kill_at is not None and at is not None and (at - kill_at).total_seconds() < KILL_TO_DIE_S
            )
            per.setdefault(cid, []).append(Exit(at, _int(e.get("code")), oom, by_docker))
    return per


def _failing_since(health: dict[str, Any] | None) -> datetime | None:
    """The first failed probe of the current streak (healthcheck.failing_since: the health log keeps only the
    last 5 probes, so their start alone would move forward at every look)."""
    if not isinstance(health, dict):
        return None
    log = [p for p in health.get("Log") or [] if isinstance(p, dict)]
    return healthcheck.failing_since(health_probes(log), _int(health.get("FailingStreak")) or 0)


def parse(text: str) -> NodeHistory:
    """The crashes fact's output -> NodeHistory (pure: unit-tested without a node)."""
    return history_of(crash_records(Section(text, "", 0)))


def history_of(records: CrashRecords) -> NodeHistory:
    """The crashes fact (facts/catalog.py: CRASHES) -> each container's history (pure)."""
    now = parse_time(records.now) or datetime.now(UTC)
    history = NodeHistory(now)
    exits = _exits_from_events(records.events)
    for d in records.inspect:
        name = str(d.get("name") or "").lstrip("/")
        state: Any = d.get("state") if isinstance(d.get("state"), dict) else {}
        running = bool(state.get("Running"))
        finished = parse_time(str(state.get("FinishedAt") or ""))
        recent = exits.get(str(d.get("id") or ""), [])
        last = recent[-1] if recent else None
        if not running and finished is not None:
            # Stopped now: inspect's state is the last exit (and says OOM even when the events are gone).
            last = Exit(
                finished,
                _int(state.get("ExitCode")),
                bool(state.get("OOMKilled")) or bool(last and last.oom),
                bool(last and last.by_docker),
            )
        elif last is None and finished is not None:  # restarted long ago: the code is no longer known
            last = Exit(finished, None, bool(state.get("OOMKilled")))
        health = state.get("Health") if isinstance(state.get("Health"), dict) else None
        history.containers[name] = ContainerHistory(
            name=name,
            role=str(d.get("role") or ""),
            status=str(state.get("Status") or ""),
            running=running,
            restarts=_int(d.get("restarts")) or 0,
            started_at=parse_time(str(state.get("StartedAt") or "")),
            last_exit=last,
            exits=recent,
            health=health.get("Status") if health else None,
            failing_since=_failing_since(health),
            error=str(state.get("Error") or ""),
        )
    return history


def read(conn: NodeConnection) -> NodeHistory:
    """Read one node's container history over its SSH connection: the crashes fact (read-only)."""
    facts = gather(conn, "crashes", FactArgs(), timeout=READ_TIMEOUT_S)
    return history_of(facts.crashes if facts.has("crashes") and facts.crashes is not None else CrashRecords())


def ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "?"
    s = max(0, int((now - when).total_seconds()))
    if s < 120:
        return f"{s}s ago"
    if s < 7200:
        return f"{s // 60}m ago"
    if s < 172800:
        return f"{s // 3600}h ago"
    return f"{s // 86400}d ago"


def summary(c: ContainerHistory, now: datetime) -> str:
    """One short cell for `status`: restarts, last exit and health, e.g. `2 restarts; OOM-killed (exit 137) 3m ago`."""
    parts = []
    if c.restarts:
        parts.append(f"{c.restarts} restart{'s' if c.restarts != 1 else ''}")
    if c.last_exit is not None:
        parts.append(f"{c.last_exit.reason} {ago(c.last_exit.at, now)}")
    if c.health == "unhealthy":
        since = c.failing_since.strftime("%H:%M:%S UTC, ") if c.failing_since is not None else ""
        parts.append(f"health failing since {since}{ago(c.failing_since, now)}")
    if c.error:
        parts.append(c.error)
    return "; ".join(parts) or "-"
