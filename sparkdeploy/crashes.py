"""Why sparkdeploy's containers stopped: restarts, the last exit (OOM kill, signal, exit code), health.

Read over the node's SSH connection in one read-only command: `docker inspect` of our containers (label
io.sparkdeploy.managed) for their state, and the engine's recent `die` and `oom` events, because a container
that its restart policy brought back shows `running` again and no longer says how it died. Only the fields
named here are read: never Config.Env (the secrets of `--env-file secrets.env`).

Used by `status` (a column per container) and by doctor's `engine.crashes` (one-line diagnosis + fix).
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sparkdeploy.deployment import LABEL_PREFIX, MANAGED_LABEL
from sparkdeploy.facts import parse_time

HISTORY_S = 24 * 3600  # how far back the engine's events are read (it keeps the last 256 in memory)
READ_TIMEOUT_S = 20
SECTION = "@@sparkdeploy-crashes@@"

_HEALTH = ('{{with .State.Health}}{"status":{{json .Status}},"streak":{{json .FailingStreak}},"log":['
           '{{range $i, $e := .Log}}{{if $i}},{{end}}{"start":{{json $e.Start}},"code":{{json $e.ExitCode}}}'
           '{{end}}]}{{else}}null{{end}}')
_INSPECT = ('{"name":{{json .Name}},"status":{{json .State.Status}},"running":{{json .State.Running}},'
            '"oom":{{json .State.OOMKilled}},"code":{{json .State.ExitCode}},"error":{{json .State.Error}},'
            '"started":{{json .State.StartedAt}},"finished":{{json .State.FinishedAt}},'
            '"restarts":{{json .RestartCount}},"role":{{json (index .Config.Labels "' + LABEL_PREFIX + '.role")}},'
            '"health":' + _HEALTH + '}')
_EVENT = ('{"action":{{json .Action}},"time":{{json .TimeNano}},"name":{{json (index .Actor.Attributes "name")}},'
          '"code":{{json (index .Actor.Attributes "exitCode")}}}')

# $1 the managed label, $2 seconds of history. Read-only.
SCRIPT = r"""
label="$1"; since=$(( $(date +%s) - $2 ))
printf '%s inspect\n' '""" + SECTION + r"""'
ids=$(docker ps -aq --no-trunc --filter "label=$label=true" 2>/dev/null)
[ -n "$ids" ] && docker inspect --format '""" + _INSPECT.replace("'", "'\\''") + r"""' $ids 2>/dev/null
printf '%s events\n' '""" + SECTION + r"""'
docker events --since "$since" --until "$(date +%s)" --filter type=container --filter "label=$label=true" \
  --filter event=die --filter event=oom --format '""" + _EVENT.replace("'", "'\\''") + r"""' 2>/dev/null
printf '%s now\n' '""" + SECTION + r"""'
date -u +%Y-%m-%dT%H:%M:%SZ
"""


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

    @property
    def reason(self) -> str:
        if self.oom:
            return f"OOM-killed (exit {self.code if self.code is not None else 137})"
        if self.code is None:
            return "exited (code unknown)"
        if self.code == 0:
            return "exited cleanly (exit 0)"
        if self.code > 128:
            return f"killed by {_signal_name(self.code - 128)} (exit {self.code})"
        return f"exit code {self.code}"

    def as_dict(self) -> dict:
        return {"at": self.at.isoformat() if self.at else None, "code": self.code, "oom_killed": self.oom,
                "reason": self.reason}


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
        return [e for e in self.exits if e.at is not None and (now - e.at).total_seconds() <= seconds]

    def as_dict(self) -> dict:
        return {"restarts": self.restarts, "last_exit": self.last_exit.as_dict() if self.last_exit else None,
                "recent_exits": len(self.exits), "oom_kills": sum(1 for e in self.exits if e.oom),
                "docker_health": self.health,
                "health_failing_since": self.failing_since.isoformat() if self.failing_since else None,
                "error": self.error or None}


@dataclass
class NodeHistory:
    now: datetime
    containers: dict[str, ContainerHistory] = field(default_factory=dict)


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith(SECTION + " "):
            name = line[len(SECTION) + 1:].strip()
            out[name] = []
        elif name is not None and line.strip():
            out[name].append(line.strip())
    return out


def _json_lines(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def _nano_time(value) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(value) / 1e9, tz=timezone.utc)
    except (TypeError, ValueError):
        return None


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _exits_from_events(events: list[dict]) -> dict[str, list[Exit]]:
    """`die` events, each marked OOM when the engine reported an `oom` of that container just before it."""
    per: dict[str, list[Exit]] = {}
    pending_oom: dict[str, datetime] = {}
    for e in sorted(events, key=lambda e: _int(e.get("time")) or 0):
        name, at = str(e.get("name") or ""), _nano_time(e.get("time"))
        if e.get("action") == "oom" and at is not None:
            pending_oom[name] = at
        elif e.get("action") == "die":
            oom_at = pending_oom.pop(name, None)
            oom = oom_at is not None and at is not None and (at - oom_at).total_seconds() < 60
            per.setdefault(name, []).append(Exit(at, _int(e.get("code")), oom))
    return per


def _failing_since(health: dict | None) -> datetime | None:
    """The start of the unbroken run of failed probes at the end of Docker's health log (last 5 probes)."""
    if not isinstance(health, dict) or not health.get("streak"):
        return None
    since = None
    for probe in reversed(health.get("log") or []):
        if probe.get("code") == 0:
            break
        since = parse_time(str(probe.get("start") or "")) or since
    return since


def parse(text: str) -> NodeHistory:
    """The script's output -> NodeHistory (pure: unit-tested without a node)."""
    sec = _sections(text)
    now = parse_time((sec.get("now") or [""])[0]) or datetime.now(timezone.utc)
    history = NodeHistory(now)
    exits = _exits_from_events(_json_lines(sec.get("events", [])))
    for d in _json_lines(sec.get("inspect", [])):
        name = str(d.get("name") or "").lstrip("/")
        running = bool(d.get("running"))
        finished = parse_time(str(d.get("finished") or ""))
        recent = exits.get(name, [])
        last = recent[-1] if recent else None
        if not running and finished is not None:
            # Stopped now: inspect's state is the last exit (and says OOM even when the events are gone).
            last = Exit(finished, _int(d.get("code")), bool(d.get("oom")) or bool(last and last.oom))
        elif last is None and finished is not None:
            last = Exit(finished, None, bool(d.get("oom")))  # restarted long ago: the code is no longer known
        health = d.get("health") if isinstance(d.get("health"), dict) else None
        history.containers[name] = ContainerHistory(
            name=name, role=str(d.get("role") or ""), status=str(d.get("status") or ""), running=running,
            restarts=_int(d.get("restarts")) or 0, started_at=parse_time(str(d.get("started") or "")),
            last_exit=last, exits=recent, health=health.get("status") if health else None,
            failing_since=_failing_since(health), error=str(d.get("error") or ""))
    return history


def read(conn, history_s: int = HISTORY_S) -> NodeHistory:
    """Read one node's container history over its SSH connection (read-only)."""
    result = conn.run(["bash", "-c", SCRIPT, "sparkdeploy-crashes", MANAGED_LABEL, str(int(history_s))],
                      check=False, timeout=READ_TIMEOUT_S)
    return parse(result.stdout)


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
        parts.append(f"health failing since {ago(c.failing_since, now)}")
    if c.error:
        parts.append(c.error)
    return "; ".join(parts) or "-"
