"""Eviction across nodes (issue 40 item 2, docs/stack.md "On-demand members"): an on-demand member whose ranks span
nodes (tensor parallel) needs room on EVERY node it runs on, and the member that must stop for it may be led
(rank 0) from another node. The pure part (sparkdeploy/nodeside/guard/activate.py: room_across, unseen_starts,
wanted, asked_to_stop), then the real watchers of two nodes (sparkdeploy/nodeside/guard/watch.py) with their real
/watch endpoints, each node's Docker engine the watcher tests' stand-in (one per container, tests/guard/
test_watch_logic.py), the gateway's demand a real HTTP server, the clock driven by the test."""

from __future__ import annotations

import pytest

from sparkdeploy.deploy.stack.routes import DEMAND_PATH
from sparkdeploy.nodeside.guard import activate, watch
from sparkdeploy.nodeside.guard.ondemand import NoRoom, NotYet
from tests.guard.test_activate_logic import Gateway
from tests.guard.test_watch_logic import Clock, Engine, FakeDocker, _free_port, _iso

ROOM = {"spark1": 0.93, "spark2": 0.93, "spark3": 0.93}


def _member(shares, on_demand=True, waiting=0, in_flight=0, last=None, room=True):
    return {
        "model": "m",
        "on_demand": on_demand,
        "shares": shares,
        "room": {n: ROOM[n] for n in shares} if on_demand and room else {},
        "waiting": waiting,
        "in_flight": in_flight,
        "last_request": last,
    }


def _demand(members, rank0):
    """The gateway's demand: members as given, one group per on-demand member led from `rank0[name]`."""
    groups = {
        f"{n}:{rank0[n]}": {
            "model": f"{n}-m",
            "deployment": n,
            "idle_timeout": 600,
            "waiting": m["waiting"],
            "in_flight": m["in_flight"],
            "last_request": m["last_request"],
            "watch": f"http://{rank0[n]}:7390/watch",
        }
        for n, m in members.items()
        if m["on_demand"]
    }
    return {"groups": groups, "members": members}


# -- the decision, pure -------------------------------------------------------------------------------------------


def test_a_tensor_parallel_start_is_budgeted_on_every_node_and_stops_a_victim_led_from_the_other():
    d = _demand(
        {
            "chat": _member({"spark1": 0.4}, on_demand=False),
            "big": _member({"spark1": 0.5, "spark2": 0.5}, waiting=1),
            "right": _member({"spark2": 0.5}, last=100.0),
        },
        {"big": "spark1", "right": "spark2"},
    )
    seen = {"spark1": {"chat"}, "spark2": {"right"}}
    stop, why = activate.room_across("big:spark1", d, seen)
    assert stop == ["right"], why
    assert why == (
        "stop right (least recently used first) to start big: "
        "spark1: room 0.93, running chat 0.4 (always on); big needs 0.5; "
        "spark2: room 0.93, running right 0.5 (idle); big needs 0.5"
    )
    # rank 0's node alone (what the activator budgeted before): it fits there, and spark2 was overbooked
    assert activate.room_for("big:spark1", d, "spark1", {"chat"})[0] == []
    # once right stopped, spark2 has room: the start goes ahead
    assert activate.room_across("big:spark1", d, {"spark1": {"chat"}, "spark2": set()})[0] == []


def test_no_room_on_one_node_is_refused_naming_that_node_and_its_figures():
    d = _demand(
        {
            "big": _member({"spark1": 0.5, "spark2": 0.5}, waiting=1),
            "db": _member({"spark2": 0.5}, on_demand=False),
            "busy": _member({"spark1": 0.5}, in_flight=2, last=5.0),
        },
        {"big": "spark1", "busy": "spark1"},
    )
    with pytest.raises(NoRoom) as exc:
        activate.room_across("big:spark1", d, {"spark1": {"busy"}, "spark2": {"db"}})
    assert str(exc.value) == (
        "big does not fit even with every idle on-demand member stopped: "
        "spark1: room 0.93, running busy 0.5 (2 request(s) in flight); big needs 0.5; "
        "spark2: room 0.93, running db 0.5 (always on); big needs 0.5"
    )


def test_least_recently_used_first_over_every_node_ties_by_name_the_same_on_each_node():
    d = _demand(
        {
            "big": _member({"spark1": 0.5, "spark2": 0.5}, waiting=1),
            "x": _member({"spark1": 0.5}, last=50.0),
            "w": _member({"spark2": 0.5}, last=50.0),  # tie with x: by name, w first
            "v": _member({"spark2": 0.3}, last=70.0),  # spark2 fits once w stopped: v stays
        },
        {"big": "spark1", "x": "spark1", "w": "spark2", "v": "spark2"},
    )
    seen = {"spark1": {"x"}, "spark2": {"w", "v"}}
    assert activate.room_across("big:spark1", d, seen)[0] == ["w", "x"]
    assert activate.room_across("big:spark1", d, dict(reversed(seen.items())))[0] == ["w", "x"]


def test_two_members_waiting_at_once_never_both_take_the_room_nor_evict_each_other():
    members = {
        "a": _member({"spark1": 0.5, "spark2": 0.5}, waiting=1),
        "b": _member({"spark1": 0.5, "spark2": 0.5}, waiting=3),
        "old": _member({"spark1": 0.5, "spark2": 0.5}, last=10.0),
    }
    d = _demand(members, {"a": "spark1", "b": "spark2", "old": "spark1"})
    seen = {"spark1": {"old"}, "spark2": {"old"}}
    # a is first in name order: it ignores b (not started) and evicts old
    assert activate.room_across("a:spark1", d, seen)[0] == ["old"]
    # b counts a's share as taken on both nodes (a starts first): it cannot start beside a, and a is not a victim
    with pytest.raises(NotYet, match=r"^b waits for a to go idle .*spark1: room 0.93, running a 0.5 \(starting for 1"):
        activate.room_across("b:spark2", d, seen)
    # a running (rank 0 started, rank 1 not yet): its held requests protect it, its share is taken on spark2 too
    with pytest.raises(NotYet, match=r"spark2: room 0.93, running a 0.5 \(1 request\(s\) in flight\)"):
        activate.room_across("b:spark2", d, {"spark1": {"a"}, "spark2": set()})
    # a served and went idle: b may now evict it, and a (no request) evicts nothing: no loop without a new request
    members["a"].update(waiting=0, last_request=200.0)
    assert activate.room_across("b:spark2", d, {"spark1": {"a"}, "spark2": {"a"}})[0] == ["a"]
    assert activate.choose(d["groups"]["a:spark1"], {"running": True, "started": 150.0}, 300.0) is None


def test_a_decisions_figures_are_the_reading_its_room_was_weighed_by():
    """The decision's `figures` come from the same reading of the demand as the decision (activate.weigh): a
    member starting first (not running anywhere yet) is in them as it is in the reason, as are the shares of a
    member seen only by another node's watcher."""
    members = {
        "a": _member({"spark1": 0.5, "spark2": 0.5}, waiting=1),
        "b": _member({"spark1": 0.5, "spark2": 0.5}, waiting=3),
        "old": _member({"spark2": 0.4}, last=10.0),
    }
    d = _demand(members, {"a": "spark1", "b": "spark2", "old": "spark2"})
    seen = {"spark1": set(), "spark2": {"old"}}
    with pytest.raises(NotYet) as wait:
        activate.room_across("b:spark2", d, seen)
    fig = activate.figures("b:spark2", d, seen, set(), "spark2")
    assert fig == {
        "member": "b",
        "node": "spark2",
        "room": 0.93,
        "needs": 0.5,
        "running": [
            {"deployment": "a", "share": 0.5, "kept": "starting for 1 held request(s)"},
            {"deployment": "old", "share": 0.4, "kept": "idle"},
        ],
    }, fig
    assert "running a 0.5 (starting for 1 held request(s)), old 0.4 (idle); b needs 0.5" in str(wait.value)
    assert activate.figures("b:spark2", d, seen, set(), "spark3") == {}  # not a node of it
    assert activate.figures("b:spark2", d, {}, set(), "spark2") == {}  # nothing weighed: no figures


def test_a_later_member_started_on_a_node_not_seen_takes_its_share():
    d = _demand(
        {
            "a": _member({"spark1": 0.5, "spark2": 0.5}, waiting=1),
            "z": _member({"spark2": 0.5, "spark3": 0.5}, waiting=1),
        },
        {"a": "spark1", "z": "spark3"},
    )
    seen = {"spark1": set(), "spark2": set()}  # z's rank 1 (spark2) not started yet; its rank 0 is on spark3
    assert activate.unseen_starts("a:spark1", d, seen) == {"z:spark3": "http://spark3:7390/watch"}
    assert activate.room_across("a:spark1", d, seen)[0] == []  # z not started: a first (name order)
    with pytest.raises(NotYet, match=r"spark2: room 0.93, running z 0.5 \(starting for 1 held request\(s\)\)"):
        activate.room_across("a:spark1", d, seen, started={"z"})  # its watcher says its rank 0 runs
    assert activate.unseen_starts("a:spark1", d, {**seen, "spark3": set()}) == {}  # seen: not asked


def test_a_victim_led_from_another_node_stops_itself_only_while_idle_and_asked():
    d = _demand(
        {"big": _member({"spark1": 0.5, "spark2": 0.5}, waiting=1), "right": _member({"spark2": 0.5}, last=1.0)},
        {"big": "spark1", "right": "spark2"},
    )
    assert activate.wanted("right:spark2", d) == {"big:spark1": "http://spark1:7390/watch"}
    d["members"]["right"]["shares"] = {"spark3": 0.5}  # no node in common: big's start never asks it
    assert activate.wanted("right:spark2", d) == {}
    d["members"]["right"]["shares"] = {"spark2": 0.5}
    asked = {"big:spark1": {"evict": {"for": "big", "node": "spark1", "stop": ["right"], "why": "FIGURES"}}}
    assert activate.asked_to_stop("right:spark2", d, asked) == (
        "stop",
        "on demand: evicted for big (decided by its activator on spark1): FIGURES",
    )
    assert activate.asked_to_stop("right:spark2", d, {"big:spark1": {"evict": None}}) is None
    d["members"]["right"]["in_flight"] = 1  # a request came meanwhile: never stopped with one in flight
    assert activate.asked_to_stop("right:spark2", d, asked) is None
    d["members"]["right"]["in_flight"] = 0
    d["groups"]["big:spark1"]["waiting"] = 0  # the start's requests are gone (answered 503): its ask is stale
    assert activate.asked_to_stop("right:spark2", d, asked) is None and activate.wanted("right:spark2", d) == {}


# -- the watchers of two nodes ------------------------------------------------------------------------------------


class Node:
    """One node's Docker engine with several containers (one FakeDocker each)."""

    def __init__(self, *engines: FakeDocker) -> None:
        self.by = {e.c["Id"]: e for e in engines}

    def containers(self, label, all_=False):
        return [c for e in self.by.values() for c in e.containers(label, all_)]

    def inspect(self, cid):
        return self.by[cid].inspect(cid)

    def stop(self, cid, grace_s):
        self.by[cid].stop(cid, grace_s)

    def start(self, cid):
        self.by[cid].start(cid)

    def unpause(self, cid):
        self.by[cid].unpause(cid)

    def no_restart(self, cid):
        self.by[cid].no_restart(cid)

    def set_restart(self, cid, policy):
        self.by[cid].set_restart(cid, policy)


class Stack:
    """spark1 and spark2, each member as given: name -> (its nodes, rank 0's first; its share on each; on demand;
    cold: created and never started, else running and idle). By default `big` (on demand, TP=2 led from spark1,
    cold), `right` (on demand, solo on spark2, running) and `chat` (always on, solo on `chat_on`)."""

    def __init__(self, tmp_path, chat_on="spark1", chat_share=0.4, spec=None):
        spec = spec or {
            "big": (["spark1", "spark2"], 0.5, True, True),
            "right": (["spark2"], 0.5, True, False),
            "chat": ([chat_on], chat_share, False, False),
        }
        self.clock = Clock()
        self.gw = Gateway()  # the gateway's demand, served over HTTP (test_activate_logic's)
        ports = {n: _free_port() for n in ("spark1", "spark2")}
        self.url = {n: f"http://127.0.0.1:{p}/watch" for n, p in ports.items()}
        at = {n: f"{n}@127.0.0.1:{p}" for n, p in ports.items()}
        self.engine = {dep: Engine() for dep in spec}
        self.c: dict[str, FakeDocker] = {}
        on: dict[str, list[FakeDocker]] = {"spark1": [], "spark2": []}
        for dep, (nodes, _, _, cold) in spec.items():
            self.engine[dep].ok = not cold
            for rank, node in enumerate(nodes):
                labels = {
                    watch.GROUP: f"{dep}:{nodes[0]}",
                    watch.WATCHERS: " ".join(at[n] for n in nodes),
                    watch.DEPLOYMENT: dep,
                }
                if rank == 0:
                    labels[watch.HEALTH_PORT] = str(self.engine[dep].server_address[1])
                c = self.c[f"{dep}{rank}"] = FakeDocker(self.clock, f"{dep}{rank}".ljust(64, "0"), rank, labels)
                if cold:
                    c.c["State"].update(Status="created", Running=False, StartedAt=_iso(None), FinishedAt=_iso(None))
                on[node].append(c)
        self.lead = {dep: nodes[0] for dep, (nodes, _, od, _) in spec.items() if od}
        self.members = {
            dep: _member(dict.fromkeys(nodes, share), on_demand=od) for dep, (nodes, share, od, _) in spec.items()
        }
        self.said: list[str] = []
        self.w = {}
        demand_url = f"http://127.0.0.1:{self.gw.server_address[1]}{DEMAND_PATH}"
        for n in ("spark1", "spark2"):
            folder = tmp_path / n
            folder.mkdir()
            w = watch.Watcher({"start_s": 60, "demand": demand_url}, Node(*on[n]), n, str(folder), say=self.said.append)
            w.serve("127.0.0.1", ports[n])
            self.w[n] = w
        self.publish()

    def publish(self) -> None:
        groups = {
            f"{n}:{lead}": {
                "model": f"{n}-m",
                "deployment": n,
                "idle_timeout": 600,
                "waiting": self.members[n]["waiting"],
                "in_flight": self.members[n]["in_flight"],
                "last_request": self.members[n]["last_request"],
                "watch": self.url[lead],
            }
            for n, lead in self.lead.items()
        }
        self.gw.groups, self.gw.members = groups, self.members

    def look(self, times: int = 1) -> None:
        for _ in range(times):
            self.clock.now += 1.0
            for w in self.w.values():
                w.tick(self.clock.now)

    def group(self, gid: str) -> dict:
        return self.w[gid.partition(":")[2]].view["groups"][gid]

    def close(self) -> None:
        for w in self.w.values():
            w.server.shutdown()
        for e in self.engine.values():
            e.shutdown()
        self.gw.shutdown()


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path)
    yield s
    s.close()


def test_a_tp2_start_stops_the_idle_member_led_from_the_other_node_first_then_starts_every_rank(stack):
    s = stack
    s.look(times=2)  # no request: nothing moves
    assert [c.calls for c in s.c.values()] == [[], [], [], []]
    s.members["big"]["waiting"] = 1
    s.publish()
    s.look(times=4)  # the eviction published, right out of the gateway's routes for WITHDRAW_S, then stopped
    # spark2 lacks 0.07 (right 0.5 + big 0.5 > 0.93): right, led from spark2, stopped by spark2's own activator
    assert s.c["right0"].calls == ["no-restart", "stop"], s.said
    assert s.c["big0"].calls == [] and s.c["big1"].calls == [], "started before spark2 had room"
    assert any(
        line.startswith("activate: big:spark1: evict (led from another node): stop right (least recently used")
        and "spark2: room 0.93, running right 0.5 (idle); big needs 0.5" in line
        for line in s.said
    ), s.said
    right = s.group("right:spark2")
    assert right["state"] == "held" and "evicted for big (decided by its activator on spark1)" in right["reason"]
    s.look()  # spark2's watcher shows right stopped: every node has room, rank 0 starts, rank 1 follows
    assert s.c["big0"].calls == ["start"] and s.c["big1"].calls == ["start"], s.said
    assert s.group("big:spark1")["decision"]["action"] == "start"
    assert "spark2: room 0.93, running nothing; big needs 0.5: fits" in s.group("big:spark1")["decision"]["reason"]
    assert s.group("big:spark1")["evict"] is None
    assert s.c["chat0"].calls == []  # never an always-on member
    s.look(times=3)
    assert s.c["right0"].calls == ["no-restart", "stop"]  # stopped once, not asked again


def test_a_victim_with_a_request_in_flight_is_not_stopped_and_the_start_waits(stack):
    s = stack
    s.members["big"]["waiting"] = 1
    s.members["right"]["in_flight"] = 1
    s.publish()
    s.look(times=3)
    assert s.c["right0"].calls == [] and s.c["big0"].calls == []
    big = s.group("big:spark1")
    assert big["state"] == "starting" and big["reason"].startswith("on demand: big waits for right to go idle"), big
    assert "spark2: room 0.93, running right 0.5 (1 request(s) in flight); big needs 0.5" in big["reason"]
    assert big["activation"]["action"] == "wait" and big["activation"]["busy"] == ["right"], big
    s.members["right"]["in_flight"] = 0  # right answered: idle now, evicted (by spark2's own activator)
    s.publish()
    s.look(times=4)  # as the test above: the eviction published, right withdrawn for WITHDRAW_S, then stopped
    assert s.c["right0"].calls == ["no-restart", "stop"], s.said
    s.look()  # spark2's watcher shows right stopped: every node has room, big starts
    assert s.c["big0"].calls == ["start"] and s.c["big1"].calls == ["start"], s.said


def test_no_room_on_the_other_node_is_refused_naming_it(tmp_path):
    s = Stack(tmp_path, chat_on="spark2", chat_share=0.5)  # spark2: always-on chat 0.5 + big 0.5 > 0.93
    try:
        s.members["big"]["waiting"] = 1
        s.publish()
        s.look(times=3)
        big = s.group("big:spark1")
        assert big["state"] == "no-room" and s.c["big0"].calls == [] and s.c["chat0"].calls == [], big
        assert big["reason"].startswith("big does not fit even with every idle on-demand member stopped: spark2:")
        assert "running chat 0.5 (always on), right 0.5 (idle); big needs 0.5" in big["reason"]
    finally:
        s.close()


def test_two_tp2_members_waiting_at_once_led_from_different_nodes_only_the_first_starts(tmp_path):
    s = Stack(
        tmp_path,
        spec={
            "a": (["spark1", "spark2"], 0.5, True, True),
            "b": (["spark2", "spark1"], 0.5, True, True),
        },
    )
    try:
        s.members["a"]["waiting"] = s.members["b"]["waiting"] = 1
        s.publish()
        s.look(times=3)
        assert s.c["a0"].calls == ["start"] and s.c["a1"].calls == ["start"], s.said
        assert s.c["b0"].calls == [] and s.c["b1"].calls == [], s.said
        b = s.group("b:spark2")
        assert b["state"] == "starting" and b["reason"].startswith("on demand: b waits for a to go idle"), b
        assert "running a 0.5 (" in b["reason"], b
        s.engine["a"].ok = True
        s.look(times=2)
        assert s.group("a:spark1")["state"] == "ok"
        # a answered its requests and is idle; b's next request evicts it (a, with no request, evicts nothing)
        s.members["a"].update(waiting=0, last_request=s.clock.now)
        s.members["b"]["waiting"] = 1
        s.publish()
        s.look(times=6)  # (a out of the gateway's routes for WITHDRAW_S before it stops)
        assert s.c["a0"].calls == ["start", "no-restart", "stop"] and s.c["a1"].calls[-1] == "stop", s.said
        assert s.c["b0"].calls == ["start"] and s.c["b1"].calls == ["start"], s.said
        assert sum("activate: b:spark2: evict (led from another node): stop a" in line for line in s.said) == 1
        s.look(times=3)
        assert s.c["a0"].calls[-1] == "stop" and s.c["b0"].calls == ["start"]  # no eviction back and forth
    finally:
        s.close()


def test_a_victim_led_from_a_node_whose_watcher_does_not_answer_is_named_in_the_start_reason(tmp_path):
    """The victim (TP=2, led from spark2, a rank on spark1) must stop for a start on spark1, and spark2's guard is
    down: nothing reads the eviction there, so the start waits out its hold, and its reason (the held requests'
    503 quotes it) names the node and why, not just "another node"."""
    spec = {"wide": (["spark2", "spark1"], 0.5, True, False), "small": (["spark1"], 0.5, True, True)}
    s = Stack(tmp_path, spec=spec)
    try:
        s.look(times=2)
        s.w["spark2"].server.shutdown()  # spark2's watcher stops answering (its node or guard is down)
        s.w["spark2"].server.server_close()
        s.members["small"]["waiting"] = 1
        s.publish()
        for _ in range(3):  # spark1's watcher alone looks
            s.clock.now += 1.0
            s.w["spark1"].tick(s.clock.now)
        small = s.group("small:spark1")
        assert small["state"] == "starting", small
        assert (
            "waiting for wide (led from spark2, whose watcher does not answer) to stop: stop wide" in small["reason"]
        ), small
        assert s.c["small0"].calls == [] and s.c["wide1"].calls == [], s.said  # nothing started over wide
    finally:
        s.close()
