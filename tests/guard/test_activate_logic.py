"""The activator (sparkdeploy/nodeside/guard/activate.py, issue 40) driving the real watchers of two nodes: the
gateway's demand is a real HTTP server answering GET /sparkdeploy/demand, each node's Docker engine the watcher
tests' stand-in (tests/guard/test_watch_logic.py), the clock driven by the test. A group created and never started
starts on a held request, rank 0 first and the worker following; it serves once its /health answers; idle past its
timeout with nothing in flight, every rank stops (restart policy `no`); a request in flight keeps it."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from sparkdeploy import labels
from sparkdeploy.deploy.stack.routes import DEMAND_PATH
from sparkdeploy.nodeside.guard import activate, watch
from sparkdeploy.nodeside.guard.ondemand import NoRoom, NotYet
from tests.guard.test_watch_logic import GROUP, Clock, Engine, Pair, _free_port, _iso


class Gateway(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        self.groups: dict = {}
        self.members: dict = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                assert self.path == DEMAND_PATH
                body = json.dumps({"groups": server.groups, "members": server.members}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", _free_port()), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def demand(self, waiting=0, in_flight=0, last=None, idle=30) -> None:
        self.groups = {
            GROUP: {
                "model": "coder-m",
                "deployment": "coder",
                "idle_timeout": idle,
                "waiting": waiting,
                "in_flight": in_flight,
                "last_request": last,
            }
        }


@pytest.fixture
def cold(tmp_path):
    gw = Gateway()
    p = Pair(tmp_path, demand=f"http://127.0.0.1:{gw.server_address[1]}{DEMAND_PATH}")
    for d in p.docker:  # `up --stack` created them (docker create), nobody started them
        d.c["State"].update(Status="created", Running=False, StartedAt=_iso(None), FinishedAt=_iso(None))
    p.engine.ok = False
    yield p, gw
    p.close()
    gw.shutdown()


def test_a_held_request_starts_the_group_head_first_and_idle_stops_it(cold):
    p, gw = cold
    gw.demand()
    g = p.look(times=3)  # no request: a cold member stays cold
    assert p.docker[0].calls == [] and p.docker[1].calls == [] and g["state"] == "starting"
    gw.demand(waiting=1)
    g = p.look()
    assert p.docker[0].calls == ["start"] and g["decision"]["action"] == "start", g
    assert "1 request(s) held at the gateway for coder-m" in g["decision"]["reason"]
    p.look()
    assert p.docker[1].calls == ["start"]  # the worker follows rank 0's published decision
    p.engine.ok = True
    g = p.look()
    assert g["state"] == "ok" and g["decision"]["phase"] == "done" and g["restart_count"] == 0, g
    assert any("serving (started on demand)" in s for s in p.said), p.said

    t = p.clock.now
    gw.demand(in_flight=1, last=t)
    p.look(seconds=10, times=6)  # 60 s past its last request, with one in flight: kept
    assert p.docker[0].calls == ["start"]
    gw.demand(last=t + 50)  # answered at t + 50
    p.look(seconds=10)  # idle 20 s of its 30
    assert p.docker[0].calls == ["start"]
    g = p.look(seconds=10)  # idle 30 s: first out of the gateway's routes (published `held`), no rank stopped yet
    assert g["state"] == "held" and g["decision"]["phase"] == "withdraw", g
    assert p.docker[0].calls == ["start"] and p.docker[1].calls == ["start"], "stopped before the gateway let go"
    gw.demand(in_flight=1, last=t + 50)  # a request that reached it before the gateway let go: waited for
    p.look(seconds=watch.WITHDRAW_S, times=2)
    assert p.docker[0].calls == ["start"] and p.docker[1].calls == ["start"], "stopped under a request in flight"
    gw.demand(last=t + 50)
    g = p.look(seconds=watch.WITHDRAW_S)  # then every rank stops, restart policy `no`, its memory freed
    assert p.docker[0].calls == ["start", "no-restart", "stop"], p.docker[0].calls
    assert p.docker[1].calls == ["start", "no-restart", "stop"], p.docker[1].calls
    assert g["state"] == "held" and "idle for 30 s (idle timeout 30 s)" in g["reason"], g
    assert p.look(times=3)["state"] == "held" and p.docker[0].calls[-1] == "stop"

    p.engine.ok = False
    gw.demand(waiting=2, last=p.clock.now)  # the next request starts it again
    g = p.look()
    assert p.docker[0].calls[-1] == "start" and g["decision"]["action"] == "start"
    p.look()
    assert p.docker[1].calls[-1] == "start"
    # started again with the restart policy it was made with: a crash of the warm engine is Docker's to restart
    # and the watcher's to see as a crash, not as a rank stopped on purpose (`no` and not running)
    for d in p.docker:
        assert d.calls[-2:] == ["restart-policy unless-stopped", "start"], d.calls
        assert d.c["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"


def test_no_word_from_the_gateway_starts_and_stops_nothing(tmp_path):
    p = Pair(tmp_path, demand=f"http://127.0.0.1:{_free_port()}{DEMAND_PATH}")  # nothing answers there
    try:
        p.look(seconds=100, times=3)
        assert p.docker[0].calls == [] and p.look()["state"] == "ok"
    finally:
        p.close()


def test_choose():
    rank = {"running": True, "started": 1000.0}
    d = {"model": "m", "idle_timeout": 60, "waiting": 0, "in_flight": 0, "last_request": None}
    assert activate.choose(None, rank, 5000.0) is None  # not an on-demand group
    assert activate.choose(d, rank, 1059.0) is None  # started 59 s ago, never asked: not idle yet
    assert activate.choose(d, rank, 1060.0)[0] == "stop"
    assert activate.choose({**d, "waiting": 1}, rank, 5000.0) is None  # held requests count as in flight
    assert activate.choose({**d, "last_request": 2000.0}, rank, 2059.0) is None
    stopped = {"running": False, "started": 1000.0}
    assert activate.choose(d, stopped, 5000.0) is None
    assert activate.choose({**d, "waiting": 1}, stopped, 5000.0)[0] == "start"


def test_the_node_side_keeps_the_deployment_label_name():
    assert watch.DEPLOYMENT == labels.DEPLOYMENT_LABEL


def _demand(**members):
    return {
        "groups": {f"{n}:spark1": {"deployment": n, "model": f"{n}-m"} for n in members},
        "members": {
            n: {
                "model": f"{n}-m",
                "on_demand": od,
                "shares": {"spark1": 0.45},
                "room": {"spark1": 0.93} if od else {},
                "waiting": 0,
                "in_flight": fl,
                "last_request": last,
            }
            for n, (od, fl, last) in members.items()
        },
    }


def test_room_for_stops_the_least_recently_used_idle_on_demand_member_of_this_node():
    d = _demand(chat=(False, 0, None), coder=(True, 0, 100.0), small=(True, 0, None), big=(True, 0, 50.0))
    stop, why = activate.room_for("small:spark1", d, "spark1", {"chat", "coder"})
    assert stop == ["coder"] and "stop coder (least recently used first) to start small" in why, why
    assert "spark1: room 0.93, running chat 0.45 (always on), coder 0.45 (idle); small needs 0.45" in why
    assert activate.room_for("small:spark1", d, "spark1", {"chat"}) == (
        [],
        "spark1: room 0.93, running chat 0.45 (always on); small needs 0.45: fits",
    )
    busy = _demand(chat=(False, 0, None), coder=(True, 2, 100.0), small=(True, 0, None))
    # coder busy holds the room: the start waits for it to go idle (a moment: a request just answered is counted
    # a write later), not refused
    with pytest.raises(
        NotYet,
        match=r"small waits for coder to go idle \(never stopped while busy\): .*"
        r"coder 0.45 \(2 request\(s\) in flight\)",
    ):
        activate.room_for("small:spark1", busy, "spark1", {"chat", "coder"})
    busy["members"]["chat"]["shares"] = {"spark1": 0.6}  # chat (always on) leaves no room whatever stops: refused
    with pytest.raises(NoRoom, match=r"small does not fit even with every idle on-demand member stopped: "):
        activate.room_for("small:spark1", busy, "spark1", {"chat", "coder"})
    assert activate.room_for("small:spark1", d, "spark2", {"chat", "coder"})[0] == []  # no figures there


def test_the_watcher_publishes_the_demand_it_saw_and_each_decision_with_its_figures(cold):
    """What `status` shows of an on-demand member (issue 40 item 3): its last request, what is held or in flight,
    since when it is idle (its last request or its start, the later), and each decision with its figures."""
    p, gw = cold
    gw.demand()
    p.look()  # each watcher's first look: rank 0 starts only once the other rank's watcher answers (running_on)
    gw.demand(waiting=1, last=p.clock.now + 1)
    g = p.look()
    seen = g["on_demand"]
    assert (seen["last_request"], seen["waiting"], seen["idle_timeout"]) == (p.clock.now, 1, 30), seen
    assert seen["idle_from"] is None  # not running yet: not idle
    start = g["activation"]
    assert start["action"] == "start" and start["at"] == p.clock.now and start["stopped"] == [], start
    assert "1 request(s) held at the gateway for coder-m" in start["why"] and start["figures"] == {}, start
    p.engine.ok = True
    p.look()
    started = p.clock.now - 1  # rank 0 started at the first look
    gw.demand(last=started - 5)  # the held request's arrival, before the start: idle counts from the start
    g = p.look(seconds=9)
    assert g["on_demand"]["idle_from"] == started and g["on_demand"]["last_request"] == started - 5, g
    g = p.look(seconds=10, times=2)  # idle 30 s of its 30: stopped
    stop = g["activation"]
    assert (stop["action"], stop["idle_s"], stop["idle_timeout"]) == ("stop", 30.0, 30), stop
    assert stop["why"].startswith("on demand: idle for 30 s (idle timeout 30 s)"), stop


class Node:
    """One node's Docker engine with several single-rank engine groups (one per stack member), as `docker
    inspect` shows them; every group's rank 0 is here, so this node's activator decides for all of them."""

    def __init__(self, clock, watcher: str, health_port: int, running: dict[str, bool]):
        self.clock, self.calls = clock, []
        self.c = {}
        for i, (name, up) in enumerate(running.items()):
            cid = f"{i}" * 64
            self.c[cid] = {
                "Id": cid,
                "Created": _iso(clock.now - 100),
                "State": {
                    "Status": "running" if up else "created",
                    "Running": up,
                    "StartedAt": _iso(clock.now - 100 if up else None),
                    "FinishedAt": _iso(None),
                },
                "RestartCount": 0,
                "HostConfig": {"RestartPolicy": {"Name": "unless-stopped"}},
                "Config": {
                    "Labels": {
                        "io.sparkdeploy.managed": "true",
                        watch.GROUP: f"{name}:spark1",
                        watch.RANK: "0",
                        watch.WATCHERS: watcher,
                        watch.HEALTH_PORT: str(health_port),
                        watch.DEPLOYMENT: name,
                    }
                },
            }

    def containers(self, label, all_=False):
        return [{"Id": c["Id"], "Labels": c["Config"]["Labels"]} for c in self.c.values()]

    def inspect(self, cid):
        return self.c[cid]

    def name(self, cid):
        return self.c[cid]["Config"]["Labels"][watch.DEPLOYMENT]

    def stop(self, cid, grace_s):
        self.calls.append(f"stop {self.name(cid)}")
        self.c[cid]["State"].update(Status="exited", Running=False, FinishedAt=_iso(self.clock.now))

    def start(self, cid):
        self.calls.append(f"start {self.name(cid)}")
        self.c[cid]["State"].update(Status="running", Running=True, StartedAt=_iso(self.clock.now))

    def no_restart(self, cid):
        self.c[cid]["HostConfig"]["RestartPolicy"]["Name"] = "no"

    def set_restart(self, cid, policy):
        self.c[cid]["HostConfig"]["RestartPolicy"]["Name"] = policy

    def unpause(self, cid):
        pass


def test_an_eviction_is_recorded_for_both_members_with_the_figures_and_the_start_names_what_it_stopped(tmp_path):
    """Issue 40 item 2: the decision and its figures, as the watcher publishes them for `status` and the gateway's
    log: the evicted member's stop (evicted for whom), the starting member's eviction then its start, which names
    what was stopped for it; each decision once (a stop under way is not decided again)."""
    gw, engine, clock = Gateway(), Engine(), Clock()
    port = _free_port()
    docker = Node(
        clock, f"spark1@127.0.0.1:{port}", engine.server_address[1], {"chat": True, "coder": True, "small": False}
    )
    said: list[str] = []
    w = watch.Watcher(
        {"demand": f"http://127.0.0.1:{gw.server_address[1]}{DEMAND_PATH}"},
        docker,
        "spark1",
        str(tmp_path),
        say=said.append,
    )
    w.serve("127.0.0.1", port)
    try:
        d = _demand(chat=(False, 0, None), coder=(True, 0, clock.now - 50), small=(True, 0, None))
        gw.members = d["members"]
        gw.groups = {
            "coder:spark1": {
                "deployment": "coder",
                "model": "coder-m",
                "idle_timeout": 600,
                "waiting": 0,
                "in_flight": 0,
                "last_request": clock.now - 50,
            },
            "small:spark1": {
                "deployment": "small",
                "model": "small-m",
                "idle_timeout": 600,
                "waiting": 1,
                "in_flight": 0,
                "last_request": clock.now,
            },
        }
        gw.members["small"]["waiting"] = 1
        for _ in range(6):  # the eviction; coder out of the gateway's routes for WITHDRAW_S, stopped; small started
            clock.now += 1
            w.tick(clock.now)
        groups = w.view["groups"]
        evict, stop = groups["small:spark1"]["activation"], groups["coder:spark1"]["activation"]
        assert docker.calls == ["stop coder", "start small"], docker.calls
        assert len([s for s in said if ": evict: " in s]) == 1, said
        figures = {
            "member": "small",
            "node": "spark1",
            "room": 0.93,
            "needs": 0.45,
            "running": [
                {"deployment": "chat", "share": 0.45, "kept": "always on"},
                {"deployment": "coder", "share": 0.45, "kept": "idle"},
            ],
        }
        assert stop["action"] == "stop" and stop["evicted_for"] == "small" and stop["figures"] == figures, stop
        assert stop["why"].startswith("on demand: evicted for small: stop coder (least recently used first)"), stop
        start = evict  # the eviction came first; once coder stopped, small started, naming it
        assert start["action"] == "start" and start["stopped"] == ["coder"], start
        assert start["figures"] == dict(figures, running=figures["running"][:1]), start
        assert "small needs 0.45: fits" in start["why"], start
        assert groups["coder:spark1"]["on_demand"]["last_request"] == 1_800_000_000.0 - 50
    finally:
        w.server.shutdown()
        gw.shutdown()
        engine.shutdown()


def test_a_start_beside_a_busy_member_waits_then_evicts_it_once_idle_and_no_room_is_refused(tmp_path):
    gw, engine, clock = Gateway(), Engine(), Clock()
    port = _free_port()
    docker = Node(
        clock, f"spark1@127.0.0.1:{port}", engine.server_address[1], {"chat": True, "coder": True, "small": False}
    )
    w = watch.Watcher(
        {"demand": f"http://127.0.0.1:{gw.server_address[1]}{DEMAND_PATH}"},
        docker,
        "spark1",
        str(tmp_path),
        say=lambda s: None,
    )
    w.serve("127.0.0.1", port)
    try:
        gw.members = _demand(chat=(False, 0, None), coder=(True, 2, clock.now), small=(True, 0, None))["members"]
        gw.groups = {"small:spark1": {"deployment": "small", "model": "small-m", "idle_timeout": 600, "waiting": 1}}
        for _ in range(3):
            clock.now += 1
            w.tick(clock.now)
        small = w.view["groups"]["small:spark1"]
        wait = small["activation"]
        assert wait["action"] == "wait" and wait["at"] == 1_800_000_001.0, wait  # once: the first look's
        assert wait["busy"] == ["coder"] and wait["why"].startswith("small waits for coder to go idle"), wait
        assert {"deployment": "coder", "share": 0.45, "kept": "2 request(s) in flight"} in wait["figures"]["running"]
        assert small["state"] == "starting" and small["reason"].startswith("on demand: small waits for coder"), small
        assert docker.calls == []  # nothing stopped nor started while coder is busy
        gw.members["coder"]["in_flight"] = 0  # coder answered its requests: idle, the least recently used
        clock.now += 1
        w.tick(clock.now)
        evict = w.view["groups"]["small:spark1"]["activation"]
        assert evict["action"] == "evict" and evict["stopped"] == ["coder"], evict
        clock.now += 1
        w.tick(clock.now)
        coder = w.view["groups"]["coder:spark1"]
        assert (coder["decision"] or {}).get("action") == "stop", coder
        # always-on chat grew past what leaves small room: nothing can make room, refused once with the figures
        gw.members["chat"]["shares"] = {"spark1": 0.6}
        for _ in range(3):
            clock.now += 1
            w.tick(clock.now)
        refuse = w.view["groups"]["small:spark1"]["activation"]
        assert refuse["action"] == "refuse" and refuse["at"] == clock.now - 2, refuse  # once: the first look's
        assert refuse["why"].startswith("small does not fit even with every idle on-demand member stopped"), refuse
        assert w.view["groups"]["small:spark1"]["state"] == "no-room"
    finally:
        w.server.shutdown()
        gw.shutdown()
        engine.shutdown()
