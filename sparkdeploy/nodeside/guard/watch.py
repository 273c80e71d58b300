"""The watcher: the memory guard's sibling in the same process (its own thread), one per node. It keeps the node's
engines serving without a command: an engine that stops answering its health check, or a multi-node engine that
lost a rank, is restarted as a whole group, with backoff; after `max_restarts` restarts in `window_s` it gives
up, stops the group (its memory freed, restart policy `no`) and says so with the last error.

Groups (one engine: a cluster's ranks, a replica of `replicas`, a solo or 2xsolo engine alone) are read from the
labels `up` puts on each engine container (sparkdeploy/topologies/base.py): the group's name, the container's
rank, its health port (rank 0), and every rank's watcher address (`IP:PORT` on the fabric, in rank order).

Coordination across nodes, one decider per group: the watcher on rank 0's node decides, the others follow. Every
watcher answers GET /watch on its node's fabric address (read-only JSON: each group's ranks as its Docker engine
sees them, and the decisions of the groups it heads). Rank 0's watcher reads the other ranks' containers from
their watchers (a rank that exited after another rank's current run began: groups.lost_rank) and probes its
engine's /health itself. To restart, it publishes a decision (a generation number, `restart`, phase `stop`),
stops its own rank, waits until every other rank's watcher says it stopped its rank for that generation (or
`stop_wait_s`), starts its rank, publishes phase `start`; the others then start theirs (a Ray head or a torchrun
or vLLM master first, its workers joining it). Success is /health answering 200 again within `start_s`. Giving up
is the decision `stop`: every rank stops with restart policy `no`. Nothing here accepts a command from the
network: a watcher only reads its peers' JSON and acts on its own node's Docker engine.

Hands off: a rank the memory guard stopped (restart policy `no`, or this node's guard holding) is never started
again here (`sparkdeploy up` does that once the pressure is gone); the rest of its group is stopped instead, so it
does not hold memory serving nothing. A new container (made by `up`) starts the group's record afresh.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import activate
from .dockerapi import DockerError
from .groups import SLACK_S, docker_time, lost_rank
from .ondemand import NoRoom, NotYet

if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable
    from typing import TypeGuard

    from .dockerapi import Docker

    Json = dict[str, Any]  # a JSON object: a container's inspect, a group's record, a peer's view

GROUP = "io.sparkdeploy.group"
RANK = "io.sparkdeploy.rank"
WATCHERS = "io.sparkdeploy.group-watchers"  # NODE@IP:PORT of each rank's watcher, rank order, space separated
HEALTH_PORT = "io.sparkdeploy.health-port"
DEPLOYMENT = "io.sparkdeploy.deployment"
FILE = "watch.json"
PEER_TIMEOUT_S = 1.0
PROBE_TIMEOUT_S = 2.0
# GET /watch?look=1 (the gateway's hook, while it holds a request for an on-demand group: issue 40): the next look
# now rather than at its second, but never sooner than this after the last one began (a read that asks for a look,
# not a command: what the look does still comes from the gateway's demand and this node's Docker engine)
LOOK_SOON_S = 0.2
# An on-demand member's stop (idle, evicted) is published this long before its engine stops: the gateway's
# poller (WATCH_S = 1 s, its watcher asked within 0.5 s) takes it out of the routes first and holds new requests
# for its next start, so none is sent to an engine that is going (a 500); one that slipped in is waited for.
WITHDRAW_S = 2.0
WITHDRAW_MAX_S = 120.0  # ... at most this long: a request in flight past it is cut by the stop
HISTORY = 20  # restarts kept per group

DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "every_s": 1.0,  # one look a second
    "unhealthy_s": 30.0,  # a serving engine failing its health check this long: restart the group
    "start_s": 1800.0,  # an engine not healthy this long after its (re)start: a failure (a big model loads ~20 min)
    "max_restarts": 3,  # restarts in window_s before giving up
    "window_s": 3600.0,
    "backoff_s": 30.0,  # wait after a restart that did not bring the group back; doubles for each further one
    "stop_wait_s": 60.0,  # how long rank 0 waits for the other ranks to stop theirs
    "grace_s": 10,  # docker stop: SIGTERM, then SIGKILL after this
}


def clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t)) if t else "?"


def http_json(url: str, timeout: float) -> object:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read(1 << 20))


def probe(port: str | int, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """(ok, detail) of GET /health on this node (the watcher runs on the host's network)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{int(port)}/health", timeout=timeout) as resp:
            return resp.status == 200, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return False, f"{exc.__class__.__name__}: {str(getattr(exc, 'reason', exc))[:120]}"


def rank_state(info: Json) -> Json:
    """What a rank's container is, as its peers need it (from `docker inspect`)."""
    state = info.get("State") or {}
    policy = ((info.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or ""
    return {
        "id": info.get("Id", "")[:12],
        "created": docker_time(info.get("Created")),
        "status": state.get("Status", ""),
        "running": bool(state.get("Running")),
        "started": docker_time(state.get("StartedAt")),
        "finished": docker_time(state.get("FinishedAt")),
        "exit_code": state.get("ExitCode"),
        "restarts": info.get("RestartCount", 0),
        "policy": policy,
    }


def node_of(watchers: list[str], i: int) -> str:
    """Rank i's node name (from NODE@IP:PORT)."""
    return watchers[i].partition("@")[0] if i < len(watchers) else f"rank {i}"


def held(rank: Json | None) -> TypeGuard[Json]:
    """Stopped on purpose (the memory guard, or a watcher that gave up): restart policy `no`, not running."""
    return rank is not None and rank.get("policy") == "no" and not rank.get("running")


def held_while_serving(ranks: list[Json | None]) -> int | None:
    """The first rank stopped on purpose after another rank's current run began (that one still running), or
    None. A stopped container older than the others' runs is a view from before `up` made them: not counted."""
    for i, r in enumerate(ranks):
        if not held(r) or r.get("finished") is None:
            continue
        for other in ranks:
            if other is not r and other and other.get("running") and (other.get("started") or 0) < r["finished"]:
                return i
    return None


def running_on(
    gid: str, node: str | None, here: set[str], watchers: list[str], peers: dict[int, Json | None]
) -> dict[str, set[str]] | str:
    """node -> the deployments whose engine runs there, for this node (`here`) and each other rank's node of group
    `gid` (its watcher's view); or the name of a node whose watcher does not answer, or has not looked yet (its
    view does not list the group's rank there) (str)."""
    seen: dict[str, set[str]] = {node: set(here)} if node else {}
    for i, view in sorted(peers.items()):
        if view is None or gid not in (view.get("groups") or {}):
            return node_of(watchers, i)
        seen[node_of(watchers, i)] = {
            str(e.get("deployment") or other.rpartition(":")[0])
            for other, e in (view.get("groups") or {}).items()
            if isinstance(e, dict) and (e.get("container") or {}).get("running")
        }
    return seen


@dataclass
class Look:
    """One look of rank 0's watcher at its group: what each step of its decision reads."""

    gid: str
    g: Json  # the group's record (saved)
    t: Json  # this run's memory of it (`live`: healthy once, started)
    info: Json  # rank 0's container (inspect)
    watchers: list[str]  # NODE@IP:PORT, rank order
    peers: dict[int, Json | None]  # the other ranks' watchers' views (None: no answer)
    ranks: list[Json | None]  # each rank's container state
    health_port: str | None
    now: float


class Watcher:
    live: dict[str, dict[str, Any]]  # group -> what is not worth saving (this run's probes)
    error: str | None  # the last tick's failure, shown in status
    server: http.server.ThreadingHTTPServer | None  # the peers' endpoint, once serving
    here: dict[str, str]  # the on-demand deployments led from this node -> their group
    others_here: set[str]  # the deployments with a rank here, led from another node

    def __init__(
        self,
        cfg: dict[str, Any] | None,
        docker: Docker,
        node: str | None,
        folder: str,
        guard_state: Callable[[], str] = lambda: "ok",
        say: Callable[[str], None] = print,
    ) -> None:
        self.cfg: Json = dict(DEFAULTS, **{k: v for k, v in (cfg or {}).items() if v is not None})
        self.docker, self.node, self.folder = docker, node, folder
        self.guard_state, self.say = guard_state, say
        self.path = os.path.join(folder, FILE)
        self.saved = self._load()
        self.saved.setdefault("instance", os.urandom(6).hex())  # this record's identity (a new one after `down`)
        self.saved.setdefault("groups", {})
        self.live = {}  # group -> what is not worth saving (this run's probes)
        self.view: Json = {"node": node, "instance": self.saved["instance"], "groups": {}}
        self.lock = threading.Lock()
        self.error = None
        self.server = None
        self.demand: Json | None = (
            None  # the gateway's on-demand demand this look (activate.py), None: none or no answer
        )
        self.here, self.others_here = {}, set()
        self.soon = threading.Event()  # a look asked for (GET /watch?look=1): the wait before the next look cut

    # -- state on disk ---------------------------------------------------------------------------------------
    def _load(self) -> Json:
        try:
            with open(self.path) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.saved, f, sort_keys=True)
        os.replace(tmp, self.path)

    # -- the peers' endpoint ----------------------------------------------------------------------------------
    def serve(self, address: str, port: int) -> None:
        watcher = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                if path != "/watch":
                    self.send_error(404)
                    return
                if "look=1" in query.split("&"):
                    watcher.soon.set()
                with watcher.lock:
                    body = json.dumps(watcher.view, sort_keys=True).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((address, int(port)), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="watch-http", daemon=True).start()

    def peer(self, watcher: str) -> Json | None:
        """A peer watcher's view (watcher: NODE@IP:PORT), or None (not answering: its node or guard is down)."""
        try:
            data = http_json(f"http://{watcher.rpartition('@')[2]}/watch", PEER_TIMEOUT_S)
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    # -- the loop --------------------------------------------------------------------------------------------
    def run(self, stop_event: threading.Event) -> None:
        while not stop_event.is_set():
            t0 = time.monotonic()
            try:
                self.tick(time.time())
                self.error = None
            except (DockerError, OSError, ValueError, KeyError, TypeError) as exc:  # reported, tried again next look
                self.error = f"{exc.__class__.__name__}: {str(exc)[:200]}"
            self.rest(stop_event, t0)

    def rest(self, stop_event: threading.Event, t0: float) -> None:
        """Wait for the next look (the last began at t0): every_s after it, or LOOK_SOON_S after it when a look is
        asked for (`soon`, set by GET /watch?look=1, before or during the wait). A stop ends the wait at once
        until the asked-for part, then at the next look (the guard's process ends with it anyway)."""
        period = float(self.cfg["every_s"])
        if stop_event.wait(max(0.05, min(LOOK_SOON_S, period) - (time.monotonic() - t0))):
            return
        self.soon.wait(max(0.0, period - (time.monotonic() - t0)))
        self.soon.clear()

    def engines(self) -> dict[str, tuple[int, Json]]:
        """group -> (rank, inspect) of this node's engine containers that belong to a group."""
        out: dict[str, tuple[int, Json]] = {}
        for c in self.docker.containers(f"{GROUP}", all_=True):
            labels = c.get("Labels") or {}
            if labels.get("io.sparkdeploy.managed") != "true" or not labels.get(GROUP):
                continue
            out[labels[GROUP]] = (int(labels.get(RANK) or 0), self.docker.inspect(c["Id"]))
        return out

    def tick(self, now: float) -> None:
        groups: dict[str, Json] = {}
        self.demand = activate.poll(self.cfg["demand"]) if self.cfg.get("demand") else None
        saved = self.saved["groups"]
        engines = self.engines()
        self.here, self.others_here = {}, set()  # the deployments running on this node: led here -> group; others
        for gid, (rank, info) in engines.items():
            dep = ((info.get("Config") or {}).get("Labels") or {}).get(DEPLOYMENT)
            if dep and (info.get("State") or {}).get("Running"):
                if rank == 0:
                    self.here[dep] = gid
                else:
                    self.others_here.add(dep)
        for gid, (rank, info) in sorted(engines.items()):
            labels = (info.get("Config") or {}).get("Labels") or {}
            watchers = (labels.get(WATCHERS) or "").split()  # NODE@IP:PORT
            g = saved.setdefault(gid, {})
            me = rank_state(info)
            if rank == 0:
                self.saw(gid, g, me, now)
                self.lead(gid, g, info, me, watchers, labels.get(HEALTH_PORT), now)
                entry = self.summary(gid, g)
            else:
                acted = g.get("acted")
                self.follow(gid, g, info, me, watchers)
                entry = {"acted": g.get("acted"), "head": watchers[0] if watchers else None}
                entry.update(state=g.get("state"), reason=g.get("reason", ""))
                if g.get("acted") != acted:  # it acted: its container as it is now
                    me = rank_state(self.docker.inspect(info["Id"]))
            entry.update(rank=rank, container=me, stopped_gen=g.get("stopped_gen"), deployment=labels.get(DEPLOYMENT))
            groups[gid] = entry
        for gid in [k for k in saved if k not in groups]:
            saved.pop(gid)  # its containers are gone (`down`)
            self.live.pop(gid, None)
        with self.lock:
            self.view = {"node": self.node, "instance": self.saved["instance"], "groups": groups}
        self._save()

    # -- rank 0: decide ------------------------------------------------------------------------------------------
    def lead(
        self, gid: str, g: Json, info: Json, me: Json, watchers: list[str], health_port: str | None, now: float
    ) -> None:
        why: str | None  # this look's reason to act (on demand, or a failure), None: nothing to do
        t = self.live.setdefault(gid, {"healthy_once": False, "started": None})
        if g.get("container") != info["Id"]:  # a new container: `up` made it, a new record (the restarts stay listed)
            for key in ("gave_up", "failing_since", "decision", "state", "reason"):
                g.pop(key, None)
            g["container"], g["since"] = info["Id"], now
            t.update(healthy_once=False, started=None)
        if t["started"] != me["started"]:  # (re)started: by Docker's restart policy, by `up` or by us
            t.update(healthy_once=False, started=me["started"])
        peers = {i: self.peer(w) for i, w in enumerate(watchers) if i > 0}
        ranks = [me] + [((v or {}).get("groups") or {}).get(gid, {}).get("container") for v in peers.values()]
        look = Look(gid, g, t, info, watchers, peers, ranks, health_port, now)
        decision = g.get("decision")
        if decision and decision.get("phase") != "done":
            self.drive(look)
            return
        g.pop("evict", None)  # asked again below while this start still needs it (make_room)
        act = activate.choose(((self.demand or {}).get("groups") or {}).get(gid), me, now)
        if act is None and me["running"]:
            act = self.asked_to_stop(gid)  # a victim of another node's on-demand start (activate.asked_to_stop)
        if act is not None and not g.get("gave_up") and self.guard_state() != "held":
            action, why = act
            if action == "start":
                fits = self.make_room(look)
                if fits is None:
                    return
                why = f"{why}; {fits}"
            self.note(gid, g, action, why, now)
            g.update(state="starting" if action == "start" else "held", reason=why)
            self.decide(gid, g, action, why, now, phase="withdraw" if action == "stop" else "stop")
            self.drive(look)
            return
        ok, detail = probe(health_port) if (me["running"] and health_port) else (False, me["status"] or "not running")
        t["detail"] = detail
        if ok:
            t.update(healthy_once=True, last_ok=now)
            g["failing_since"] = None
        elif t["healthy_once"] and not g.get("failing_since"):
            g["failing_since"] = now  # the first failed probe of an engine that served (`status`: failing since)
        if g.get("gave_up"):
            g["state"] = "gave-up"
            return
        if decision and decision.get("action") == "stop":  # stopped on purpose already: keep saying why
            g["state"] = "held"
            return
        stopped = held_while_serving(ranks)
        if stopped is not None:  # a rank stopped on purpose while the others served: stop them, free their memory
            who = f"rank {stopped} ({node_of(watchers, stopped)}) was stopped on purpose (restart policy no)"
            g.update(state="held", reason=who)
            self.decide(gid, g, "stop", f"{who}: the rest of the group stopped, its memory freed", now)
            self.drive(look)
            return
        if self.guard_state() == "held":  # this node's engines were stopped by its memory guard: hands off
            g.update(state="held", reason="this node's memory guard holds its engines")
            return
        why = self.failure(look, me, ok, detail)
        if why is None:
            g.update(state="ok" if ok else ("starting" if not t["healthy_once"] else "failing"), reason=detail)
            return
        self.restart(look, why)

    def restart(self, look: Look, why: str) -> None:
        """A group that failed (`why`): restarted within its budget (max_restarts in window_s, each restart in a
        row that did not bring it back doubling the wait before the next), else given up and stopped."""
        cfg, gid, g, now = self.cfg, look.gid, look.g, look.now
        since = max(now - cfg["window_s"], g.get("since") or 0)  # the budget: this window, these containers
        recent = [r for r in g.get("restarts") or [] if r["at"] >= since]
        if len(recent) >= cfg["max_restarts"]:
            g["gave_up"] = {"at": now, "reason": why, "restarts": len(recent)}
            g.update(state="gave-up", reason=why, last_error=why)
            self.say(f"watch: {gid}: giving up after {len(recent)} restart(s) in {cfg['window_s']:g} s: {why}")
            self.decide(gid, g, "stop", f"gave up after {len(recent)} restart(s): {why}", now)
            self.drive(look)
            return
        failed = 0  # restarts in a row that did not bring it back: each doubles the wait before the next
        for r in reversed(recent):
            if r.get("ok"):
                break
            failed += 1
        if failed:
            wait = cfg["backoff_s"] * 2 ** (failed - 1)
            if now < recent[-1]["at"] + wait:
                g.update(state="backoff", reason=f"{why}; next restart at {clock(recent[-1]['at'] + wait)}")
                return
        self.say(f"watch: {gid}: restarting the group: {why}")
        g.setdefault("restarts", []).append({"at": now, "reason": why})
        g["restarts"] = g["restarts"][-HISTORY:]
        g["last_error"] = why
        self.decide(gid, g, "restart", why, now)
        self.drive(look)

    def make_room(self, look: Look) -> str | None:
        """Before an on-demand start: the budget's figures with what stays on every node of the group, or None
        (not now): the least recently used idle on-demand members told to stop first, those led from this node
        by their decision `stop`, those led from another node by this group's published `evict` (their own
        activator reads it: asked_to_stop), the start following on a later look once every node has room; or it
        waits for busy on-demand members to go idle (the decision `wait`, the held requests still held); or
        nothing can make room (state no-room: the gateway refuses the held requests with the reason)."""
        gid, g, now, running = look.gid, look.g, look.now, dict(self.here)
        seen = running_on(gid, self.node, set(running) | set(self.others_here), look.watchers, look.peers)
        if isinstance(seen, str):  # a node of the group whose watcher does not answer: its memory is not known
            g.update(state="starting", reason=f"on demand: waiting for word from {seen}'s watcher (its memory there)")
            return None
        demand = self.demand or {}
        started = set()
        for other, url in activate.unseen_starts(gid, demand, seen).items():
            entry = self.entry_at(url, other)
            if entry is None or (entry.get("container") or {}).get("running"):  # started (or not known): its room
                started.add(str(demand["groups"][other].get("deployment")))
        self.live.setdefault(gid, {})["weighed"] = (seen, started)  # what this look weighs: its figures too
        try:
            stop, why = activate.room_across(gid, demand, seen, started)
        except NoRoom as exc:
            if g.get("state") != "no-room":
                self.say(f"activate: {gid}: no room: {exc}")
                g["activation"] = activate.decision("refuse", str(exc), now, figures=self.figures(gid))
            g.update(state="no-room", reason=str(exc))
            return None
        except NotYet as exc:  # held, not refused: the busy members go idle (evicted then) or its hold runs out
            said = self.live.setdefault(gid, {})
            if said.get("wait") != exc.busy:  # once per set of busy members, not once a look
                self.say(f"activate: {gid}: wait: {exc}")
                said["wait"] = exc.busy
                g["activation"] = activate.decision("wait", str(exc), now, busy=exc.busy, figures=self.figures(gid))
            g.update(state="starting", reason=f"on demand: {exc}")
            return None
        self.live.get(gid, {}).pop("wait", None)
        if not stop:
            self.live.get(gid, {}).pop("evict", None)
            return why
        waiting, elsewhere, told = [], [], False
        for dep in stop:
            vgid = running.get(dep)
            vg = self.saved["groups"].get(vgid) if vgid else None
            if vg is None or vgid is None:  # led from another node: its activator stops it on reading `evict`
                waiting.append(f"{dep} ({self.led_from(dep, demand)})")
                elsewhere.append(dep)
                continue
            waiting.append(dep)
            d = vg.get("decision") or {}
            if d.get("action") == "stop":
                continue  # stopped or being stopped already (this look's list of what runs was read before)
            self.say(f"activate: {vgid}: evict: {why}")
            vg.update(state="held", reason=f"on demand: evicted for {gid.partition(':')[0]}: {why}")
            self.decide(vgid, vg, "stop", vg["reason"], now, phase="withdraw")
            vg["activation"] = activate.decision(
                "stop", vg["reason"], now, evicted_for=gid.partition(":")[0], figures=self.figures(gid)
            )
            told = True
        if elsewhere:
            said = self.live.setdefault(gid, {})
            if said.get("evict") != elsewhere:  # once per victim set, not once a look
                self.say(f"activate: {gid}: evict (led from another node): {why}")
                said["evict"] = elsewhere
                told = True
            g["evict"] = {"for": gid.partition(":")[0], "node": self.node, "stop": elsewhere, "why": why, "at": now}
        if told:  # this start's own record: what it stops first, and why
            g["activation"] = activate.decision("evict", why, now, stopped=stop, figures=self.figures(gid))
        g.update(state="starting", reason=f"on demand: waiting for {', '.join(waiting)} to stop: {why}")
        return None

    def led_from(self, dep: str, demand: Json) -> str:
        """Where a victim led from another node is led from, for the start's reason, and whether that node's
        watcher answers: one that does not (its node or guard down) never reads the eviction, so the start waits
        until its hold ends, and the held requests' 503 says why."""
        for o, vg in (demand.get("groups") or {}).items():
            if isinstance(vg, dict) and vg.get("deployment") == dep and vg.get("watch"):
                node = o.rpartition(":")[2]
                if self.entry_at(str(vg["watch"]), o) is None:
                    return f"led from {node}, whose watcher does not answer"
                return f"led from {node}"
        return "led from another node"

    def entry_at(self, url: str, group: str) -> Json | None:
        """Group `group`'s entry in the view of the watcher at `url` (http://IP:PORT/watch), or None."""
        try:
            data = http_json(url, PEER_TIMEOUT_S)
        except (OSError, ValueError):
            return None
        entry = ((data.get("groups") or {}) if isinstance(data, dict) else {}).get(group)
        return entry if isinstance(entry, dict) else None

    def asked_to_stop(self, gid: str) -> tuple[str, str] | None:
        """("stop", why) when another node's activator published this on-demand group as a victim of its start
        and it is idle (activate.asked_to_stop), else None; reads only the starters' watchers."""
        demand = self.demand or {}
        if gid not in (demand.get("groups") or {}):
            return None
        asks = activate.wanted(gid, demand)
        return activate.asked_to_stop(gid, demand, {o: self.entry_at(u, o) for o, u in asks.items()}) if asks else None

    def figures(self, gid: str) -> dict[str, Any]:
        """The budget's figures of a start of `gid` on this node (activate.figures), for its decision's record: from
        what its last make_room weighed (every node of it), else from this node's containers alone."""
        if self.node is None:
            return {}
        here: dict[str, set[str]] = {self.node: set(self.here) | set(self.others_here)}
        seen, started = self.live.get(gid, {}).get("weighed") or (here, set())
        return activate.figures(gid, self.demand or {}, seen, started, self.node)

    def saw(self, gid: str, g: Json, me: Json, now: float) -> None:
        """An on-demand group's demand as this look saw it (activate.demand_seen: its last request, idle time), kept
        for `status`; the last one seen stays while the gateway does not answer."""
        seen = activate.demand_seen(((self.demand or {}).get("groups") or {}).get(gid), me, now)
        if seen is not None:
            g["demand"] = seen

    def note(self, gid: str, g: Json, action: str, why: str, now: float) -> None:
        """An on-demand start or idle stop: said in the guard's log, and its record with its figures (`activation`:
        status shows it, the gateway logs it once): a start names what was stopped for it (this start's eviction),
        a stop its idle time."""
        self.say(f"activate: {gid}: {action}: {why}")
        if action == "start":
            prior = g.get("activation") or {}
            stopped = prior.get("stopped") if prior.get("action") == "evict" else []
            g["activation"] = activate.decision(action, why, now, stopped=stopped, figures=self.figures(gid))
            return
        seen = g.get("demand") or {}
        idle_s = round(now - seen["idle_from"], 1) if seen.get("idle_from") else None
        g["activation"] = activate.decision(action, why, now, idle_s=idle_s, idle_timeout=seen.get("idle_timeout"))

    def lost(self, ranks: list[Json | None], watchers: list[str]) -> str | None:
        """`rank N (NODE) exited at HH:MM:SS UTC while the group served` (groups.lost_rank), or None."""
        born = (ranks[0] or {}).get("created") if ranks else None
        labelled = [
            (f"rank {i} ({node_of(watchers, i)})", r["started"], r["finished"], r["running"])
            for i, r in enumerate(ranks)
            # a container older than rank 0's is of the group `up` is replacing (rank 0's node first): its exit is
            # that `up`, not a rank lost while the group served (seen: TP=4 native replaced by TP=2 PP=2 torchrun,
            # the old workers exiting as the new rank 0 started; the watcher stopped the new group mid-start)
            if r and not (born is not None and r.get("created") is not None and r["created"] < born - SLACK_S)
        ]
        hit = lost_rank(labelled)
        return f"{hit[0]} exited at {clock(hit[1])} while the group served" if hit else None

    def failure(self, look: Look, me: Json, ok: bool, detail: str) -> str | None:
        """Why the group must restart now, or None."""
        cfg, g, t, now = self.cfg, look.g, look.t, look.now
        lost = self.lost(look.ranks, look.watchers)
        if lost is not None:
            return lost
        if ok:
            return None
        since = g.get("failing_since")
        if t["healthy_once"] and since and now - since >= cfg["unhealthy_s"]:
            return f"engine not answering its health check since {clock(since)} ({now - since:.0f} s): {detail}"
        if not t["healthy_once"] and me["started"] and now - me["started"] >= cfg["start_s"]:
            return f"engine not healthy {cfg['start_s']:g} s after its start: {detail}"
        return None

    def decide(self, gid: str, g: Json, action: str, reason: str, now: float, phase: str = "stop") -> None:
        # Numbered across this node's record, not per group: a group's entry goes when its containers do (`up`
        # replacing them), while the other ranks' watchers keep what they acted on; a number starting again at
        # 1 would be one they have acted on already, and they would never stop or start their rank.
        gen = max(int(self.saved.get("generation") or 0), int(g.get("generation") or 0)) + 1
        self.saved["generation"] = g["generation"] = gen
        g["decision"] = {"gen": gen, "action": action, "phase": phase, "reason": reason, "at": now}

    def drive(self, look: Look) -> None:
        """Carry the current decision one step further (stop -> start -> done), never waiting long here."""
        gid, g, t, now, watchers, ranks = look.gid, look.g, look.t, look.now, look.watchers, look.ranks
        cfg, d = self.cfg, g["decision"]
        cid = look.info["Id"]
        if d["phase"] == "stop" and d["action"] == "start":  # an on-demand start: nothing to stop first
            self.start(cid)
            t.update(healthy_once=False, started=None)
            d.update(phase="start", start_at=now)
            g.update(state="starting", reason="on demand: starting rank 0, then the others")
            self.publish(gid, g)
            return
        if d["phase"] == "withdraw":  # an on-demand stop: out of the gateway's routes before its engine goes
            if not self.withdrawn(gid, g, d, now):
                return
            d["phase"] = "stop"
        if d["phase"] == "stop":
            self.publish(gid, g)  # the other ranks' watchers stop theirs meanwhile, not after this one's stop
            self.stop(cid, no_restart=d["action"] == "stop")
            d.update(phase="stopping", stopping_at=now)
        if d["phase"] == "stopping":
            if d["action"] == "stop":
                d.update(phase="done", done_at=now)
                g["state"] = g.get("state") if g.get("state") in ("held", "gave-up") else "gave-up"
                return
            waiting = [
                node_of(watchers, i)
                for i, v in look.peers.items()
                if v is None or ((v.get("groups") or {}).get(gid, {}).get("stopped_gen") or 0) < d["gen"]
            ]
            if waiting and now - d["stopping_at"] < cfg["stop_wait_s"]:
                g.update(state="restarting", reason=f"waiting for {', '.join(waiting)} to stop their rank")
                return
            if self.guard_state() == "held":  # the memory guard stopped this node's engines meanwhile: hands off
                d.update(phase="done", done_at=now)
                g.update(state="held", reason="this node's memory guard holds its engines")
                return
            self.start(cid)
            t.update(healthy_once=False, started=None)
            d.update(phase="start", start_at=now, unstopped=waiting)
            g.update(state="restarting", reason="starting rank 0, then the others")
            return
        if d["phase"] == "start":
            ok, detail = probe(look.health_port) if look.health_port else (False, "no health port")
            rec = (g.get("restarts") or [{}])[-1] if d["action"] == "restart" else {}
            if ok:
                rec.update(ok=True, took_s=round(now - d["at"], 1))
                d.update(phase="done", done_at=now)
                g.update(state="ok", reason="", failing_since=None)
                t.update(healthy_once=True, last_ok=now)
                what = "serving again" if d["action"] == "restart" else "serving (started on demand)"
                self.say(f"watch: {gid}: {what} {now - d['at']:.1f} s after the decision")
            elif now - d["start_at"] >= cfg["start_s"] or self.lost(ranks, watchers):
                why = self.lost(ranks, watchers) or f"not healthy {cfg['start_s']:g} s after the restart: {detail}"
                rec.update(ok=False, took_s=round(now - d["at"], 1), error=why)
                d.update(phase="done", done_at=now)
                g.update(state="failing", reason=why, last_error=why)
            else:
                g.update(state="restarting", reason=f"waiting for health ({detail})")

    def withdrawn(self, gid: str, g: Json, d: Json, now: float) -> bool:
        """Whether an on-demand group told to stop (idle, evicted: phase `withdraw`) may stop now: its stop
        published WITHDRAW_S ago (the gateway routes it no more) and no request of it in flight, or WITHDRAW_MAX_S
        gone. The other ranks' watchers wait for the phase `stop` (follow)."""
        demand = ((self.demand or {}).get("groups") or {}).get(gid)
        if "withdrawn_at" not in d:
            d["withdrawn_at"] = now
            self.publish(gid, g)  # `held` in /watch: the gateway's poller cools the model before its engine goes
            return False
        gone = now - float(d["withdrawn_at"])
        busy = int(demand.get("in_flight") or 0) if isinstance(demand, dict) else 0  # no word: none known
        return gone >= WITHDRAW_MAX_S or (gone >= WITHDRAW_S and not busy)

    def publish(self, gid: str, g: Json) -> None:
        """This group's entry of /watch now, ahead of the look's end (a decision the other ranks must see)."""
        with self.lock:
            entry = dict(self.view.get("groups", {}).get(gid) or {}, **self.summary(gid, g))
            self.view = dict(self.view, groups=dict(self.view.get("groups", {}), **{gid: entry}))

    def stop(self, cid: str, no_restart: bool = False) -> None:
        info = self.docker.inspect(cid)
        if no_restart:
            # kept, so that a start by a watcher (on demand, or the group's restart) gives the rank its policy back:
            # left at `no`, a crash of the warm engine would not be restarted and would read as stopped on purpose
            policy = ((info.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or ""
            if policy and policy != "no":
                policies = self.saved.setdefault("policies", {})
                policies[cid] = policy
                for old in list(policies)[:-64]:  # containers `up` replaced since: their entries are never read
                    del policies[old]
            self.docker.no_restart(cid)
        if (info.get("State") or {}).get("Paused"):  # frozen: no signal reaches it
            self.docker.unpause(cid)
        self.docker.stop(cid, self.cfg["grace_s"])

    def start(self, cid: str) -> None:
        """Start a rank this watcher stopped or `up --stack` created, with the restart policy it was made with."""
        policy = (self.saved.get("policies") or {}).pop(cid, None)
        if policy:
            self.docker.set_restart(cid, str(policy))
        self.docker.start(cid)

    # -- ranks > 0: follow rank 0's decisions -----------------------------------------------------------------------
    def follow(self, gid: str, g: Json, info: Json, me: Json, watchers: list[str]) -> None:
        head = self.peer(watchers[0]) if watchers else None
        if head is None:
            g.update(state="no word from rank 0", reason=f"{watchers[0]} does not answer" if watchers else "no watcher")
            return
        d = ((head.get("groups") or {}).get(gid) or {}).get("decision")
        if g.get("instance") != head.get("instance"):  # rank 0's record is new (first contact, or after `down`)
            g["instance"] = head.get("instance")
            g["acted"] = (d["gen"] if d.get("phase") == "done" else d["gen"] - 1) if d else 0
        g["state"] = "following"
        if not d or d["gen"] <= (g.get("acted") or 0):
            return
        created = docker_time(info.get("Created"))
        if created is not None and (d.get("at") or 0) < created - SLACK_S:
            # a decision older than this container is about the one `up` replaced (rank 0's watcher has not looked
            # since): acting on it would stop the new rank in the middle of `up`'s start (seen: exit 137 under load)
            g["acted"] = d["gen"]
            return
        cid = info["Id"]
        if d["phase"] == "withdraw":  # an on-demand stop still being taken out of the gateway's routes
            return
        if d["action"] == "stop":
            self.stop(cid, no_restart=True)
            g.update(acted=d["gen"], stopped_gen=d["gen"], reason=d["reason"])
            self.say(f"watch: {gid}: stopped this rank: {d['reason']}")
            return
        if g.get("stopped_gen") != d["gen"]:
            if me["running"] or me["status"] == "restarting":
                self.stop(cid)
            g["stopped_gen"] = d["gen"]
        if d["phase"] in ("start", "done"):
            self.start(cid)
            g.update(acted=d["gen"], reason=f"restarted with the group: {d['reason']}")
            self.say(f"watch: {gid}: restarted this rank with the group")

    # -- what status shows ----------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """For the guard's status.json: every group of this node, and the watcher's own error."""
        with self.lock:
            return {"groups": self.view.get("groups", {}), "error": self.error, "settings": self.cfg}

    def summary(self, gid: str, g: Json) -> Json:
        t = self.live.get(gid, {})
        restarts = g.get("restarts") or []
        d = g.get("decision") or {}
        return {
            "state": g.get("state", "starting"),
            "reason": g.get("reason", ""),
            "serving": g.get("state") == "ok",
            "failing_since": g.get("failing_since"),
            "restarts": restarts[-5:],
            "restart_count": len(restarts),
            "last_error": g.get("last_error"),
            "gave_up": g.get("gave_up"),
            "decision": {
                k: d.get(k) for k in ("gen", "action", "phase", "reason", "at", "stopping_at", "start_at", "done_at")
            }
            if d
            else None,
            "detail": t.get("detail"),
            "evict": g.get("evict"),  # an on-demand start's victims led from other nodes (make_room)
            "on_demand": g.get("demand"),  # an on-demand group's demand as last seen (activate.demand_seen)
            "activation": g.get("activation"),  # its last on-demand decision with its figures (activate.decision)
        }
