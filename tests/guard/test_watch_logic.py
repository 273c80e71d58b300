"""The watcher's decisions (sparkdeploy/nodeside/guard/watch.py), two nodes' watchers in one process: each with its
own Docker engine (a stand-in: containers as data; the lab tests, tests/guard/test_watch_lab.py, run the real one),
their real /watch endpoints on 127.0.0.1 between them, and rank 0's engine a real HTTP server answering /health.
The clock is driven by the test (each look is `tick(now)`), so backoff, windows and give-up are exact."""

from __future__ import annotations

import http.server
import socket
import threading
import time
import urllib.request
from datetime import UTC, datetime

import pytest

from sparkdeploy import labels
from sparkdeploy.nodeside.guard import groups, watch

GROUP = "r:spark1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _iso(t: float | None) -> str:
    if t is None:
        return "0001-01-01T00:00:00Z"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0


class FakeDocker:
    """One node's Docker engine: its engine container of the group, as `docker inspect` shows it."""

    def __init__(self, clock: Clock, cid: str, rank: int, labels: dict[str, str]):
        self.clock, self.calls = clock, []
        self.c = {
            "Id": cid,
            "Created": _iso(clock.now),
            "State": {"Status": "running", "Running": True, "StartedAt": _iso(clock.now), "FinishedAt": _iso(None)},
            "RestartCount": 0,
            "HostConfig": {"RestartPolicy": {"Name": "unless-stopped"}},
            "Config": {"Labels": {"io.sparkdeploy.managed": "true", watch.RANK: str(rank), **labels}},
        }

    # what a crash followed by Docker's restart policy leaves behind
    def crash_and_restart(self, at: float) -> None:
        self.c["State"].update(FinishedAt=_iso(at), StartedAt=_iso(at + 1), Status="running", Running=True)
        self.c["RestartCount"] += 1

    gone = False  # between `up` removing the old containers and creating the new ones

    def containers(self, label, all_=False):
        return [] if self.gone else [{"Id": self.c["Id"], "Labels": self.c["Config"]["Labels"]}]

    def inspect(self, cid):
        return self.c

    on_stop = None  # called as the stop begins (what the other watchers can read then)

    def stop(self, cid, grace_s):
        self.calls.append("stop")
        if self.on_stop is not None:
            self.on_stop()
        if self.c["State"]["Running"]:
            self.c["State"].update(Status="exited", Running=False, FinishedAt=_iso(self.clock.now))

    def start(self, cid):
        self.calls.append("start")
        self.c["State"].update(Status="running", Running=True, StartedAt=_iso(self.clock.now))

    def unpause(self, cid):
        self.calls.append("unpause")
        self.c["State"]["Paused"] = False

    def no_restart(self, cid):
        self.calls.append("no-restart")
        self.c["HostConfig"]["RestartPolicy"]["Name"] = "no"

    def set_restart(self, cid, policy):
        self.calls.append(f"restart-policy {policy}")
        self.c["HostConfig"]["RestartPolicy"]["Name"] = policy


class Engine(http.server.ThreadingHTTPServer):
    """Rank 0's engine: /health 200 while `ok`, else 503."""

    def __init__(self) -> None:
        self.ok = True
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if server.ok else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", _free_port()), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Pair:
    """spark1 (rank 0) and spark2 (rank 1) of one group, each node's watcher answering on its own port."""

    def __init__(self, tmp_path, **cfg):
        self.clock = Clock()
        self.engine = Engine()
        ports = [_free_port(), _free_port()]
        self.addresses = [f"spark1@127.0.0.1:{ports[0]}", f"spark2@127.0.0.1:{ports[1]}"]
        labels = {
            watch.GROUP: GROUP,
            watch.WATCHERS: " ".join(self.addresses),
        }
        self.docker = [
            FakeDocker(self.clock, "a" * 64, 0, {**labels, watch.HEALTH_PORT: str(self.engine.server_address[1])}),
            FakeDocker(self.clock, "b" * 64, 1, labels),
        ]
        self.guard_state = ["ok", "ok"]
        self.said: list[str] = []
        self.w = []
        for i, node in enumerate(("spark1", "spark2")):
            folder = tmp_path / node
            folder.mkdir()
            w = watch.Watcher(
                {"unhealthy_s": 10, "start_s": 60, "max_restarts": 2, "window_s": 600, "backoff_s": 20, **cfg},
                self.docker[i],
                node,
                str(folder),
                lambda i=i: self.guard_state[i],
                self.said.append,
            )
            w.serve("127.0.0.1", ports[i])
            self.w.append(w)

    def look(self, seconds: float = 1.0, times: int = 1) -> dict:
        """`times` looks of both watchers, `seconds` apart; rank 0's group entry after the last."""
        for _ in range(times):
            self.clock.now += seconds
            for w in self.w:
                w.tick(self.clock.now)
        return self.w[0].view["groups"][GROUP]

    def close(self) -> None:
        for w in self.w:
            w.server.shutdown()
        self.engine.shutdown()


@pytest.fixture
def pair(tmp_path):
    p = Pair(tmp_path)
    yield p
    p.close()


def test_the_node_side_keeps_the_label_names_of_deployment_py():
    assert watch.GROUP == labels.GROUP_LABEL and watch.RANK == labels.RANK_LABEL
    assert watch.WATCHERS == labels.WATCHERS_LABEL and watch.HEALTH_PORT == labels.HEALTH_PORT_LABEL


def test_a_serving_group_is_left_alone(pair):
    g = pair.look(times=5)
    assert g["state"] == "ok" and g["serving"] and g["restart_count"] == 0
    assert pair.docker[0].calls == [] and pair.docker[1].calls == []
    assert pair.w[1].view["groups"][GROUP]["state"] == "following"


def test_a_rank_that_died_alone_restarts_the_whole_group_head_first(pair):
    # the group has served 100 s: the ranks' own stops in the restart come long after the worker's last start,
    # and a stopped rank is no peer that served on without the other (groups.lost_rank counts running ones only)
    pair.look(seconds=10, times=10)
    pair.docker[1].crash_and_restart(pair.clock.now + 0.5)  # the worker's rank died; Docker brought it back alone
    pair.engine.ok = False  # rank 0's engine is dead with it
    seen = []  # what the worker's watcher reads on rank 0's /watch while rank 0 stops its own rank
    pair.docker[0].on_stop = lambda: seen.append(pair.w[1].peer(pair.addresses[0]))
    pair.look()  # rank 0 reads the worker's watcher as it answered at its last look: one look later it knows
    g = pair.look()
    # the decision was published before rank 0's own (slow) stop began: the worker stops in parallel
    assert seen and seen[0]["groups"][GROUP]["decision"]["phase"] == "stop", seen
    assert g["state"] == "restarting" and "rank 1 (spark2) exited at" in g["decision"]["reason"]
    assert pair.docker[0].calls == ["stop"]  # rank 0 stopped first ...
    assert pair.docker[1].calls == ["stop"]  # ... the worker followed (same look: it reads rank 0's decision)
    g = pair.look()
    assert pair.docker[0].calls == ["stop", "start"] and g["decision"]["phase"] == "start"  # every rank stopped
    pair.look()
    assert pair.docker[1].calls == ["stop", "start"]  # then the worker joins the new rank 0
    pair.engine.ok = True
    g = pair.look()
    assert g["state"] == "ok" and g["decision"]["phase"] == "done" and g["restarts"][-1]["ok"]
    assert any("serving again" in s for s in pair.said)
    # the restart itself is no lost rank: every stop came before every start
    assert pair.look(times=3)["restart_count"] == 1
    starts = [groups.docker_time(d.c["State"]["StartedAt"]) for d in pair.docker]
    stops = [groups.docker_time(d.c["State"]["FinishedAt"]) for d in pair.docker]
    assert max(stops) <= min(starts)


def test_an_engine_failing_its_health_check_restarts_after_unhealthy_s_and_says_since_when(pair):
    pair.look(times=2)
    pair.engine.ok = False
    first = pair.clock.now + 1
    g = pair.look(times=5)
    assert g["state"] == "failing" and g["failing_since"] == first and pair.docker[0].calls == []
    g = pair.look(times=6)  # 11 s of failures: past unhealthy_s (10)
    assert g["state"] == "restarting" and "not answering its health check since" in g["decision"]["reason"]
    assert g["failing_since"] == first  # the first failure's time, not the last look's


def test_backoff_then_give_up_stops_every_rank_and_keeps_the_last_error(pair):
    pair.look()
    pair.engine.ok = False
    pair.look(times=12)  # first restart
    g = pair.look(times=3)
    assert g["restart_count"] == 1 and g["state"] == "restarting"
    g = pair.look(times=60)  # the restart does not bring health back within start_s (60)
    assert g["restarts"][0]["ok"] is False
    assert g["state"] in ("backoff", "restarting") and g["restart_count"] in (1, 2)
    g = pair.look(times=200)
    assert g["state"] == "gave-up" and g["restart_count"] == 2 and g["gave_up"]["restarts"] == 2
    assert "not healthy" in g["last_error"] or "not answering" in g["last_error"]
    for d in pair.docker:  # every rank stopped and left stopped: its memory freed, no restart by Docker or reboot
        assert not d.c["State"]["Running"] and d.c["HostConfig"]["RestartPolicy"]["Name"] == "no"
    calls = list(pair.docker[0].calls)
    pair.look(times=20)
    assert pair.docker[0].calls == calls  # given up: left alone
    assert any("giving up after 2 restart(s)" in s for s in pair.said)


def test_a_rank_the_memory_guard_stopped_is_never_started_and_the_rest_is_stopped(pair):
    pair.look(times=2)
    pair.docker[1].no_restart("b")  # spark2's guard: restart policy no, then docker stop
    pair.docker[1].stop("b", 1)
    pair.engine.ok = False
    g = pair.look(times=3)
    assert g["state"] == "held" and "rank 1 (spark2) was stopped on purpose" in g["reason"]
    assert pair.docker[0].calls == ["no-restart", "stop"]  # rank 0 stopped too: no memory held serving nothing
    assert "start" not in pair.docker[1].calls[2:] and not pair.docker[1].c["State"]["Running"]
    g = pair.look(times=30)
    assert g["state"] == "held" and pair.docker[0].calls == ["no-restart", "stop"]


def test_this_nodes_guard_holding_means_hands_off(pair):
    pair.look()
    pair.guard_state[0] = "held"
    pair.engine.ok = False
    g = pair.look(times=30)
    assert g["state"] == "held" and "start" not in pair.docker[0].calls


def test_a_new_container_from_up_starts_a_new_record(pair):
    pair.look()
    pair.engine.ok = False
    pair.look(times=300)
    assert pair.look()["state"] == "gave-up"
    for d, cid in zip(pair.docker, ("c" * 64, "d" * 64), strict=True):  # `up` made new containers
        d.c["Id"] = cid
        d.c["HostConfig"]["RestartPolicy"]["Name"] = "unless-stopped"
        d.c["State"]["FinishedAt"] = _iso(None)
        d.start(cid)
    pair.engine.ok = True
    g = pair.look(times=2)
    assert g["state"] == "ok" and g["gave_up"] is None
    pair.engine.ok = False  # the new containers get a budget of their own: a restart, not giving up at once
    g = pair.look(times=12)
    assert g["state"] == "restarting" and g["restart_count"] == 3, g  # the old restarts stay listed


def test_the_record_survives_the_watchers_restart(pair, tmp_path):
    pair.look()
    pair.engine.ok = False
    pair.look(times=12)
    g = pair.look()
    again = watch.Watcher({}, pair.docker[0], "spark1", str(tmp_path / "spark1"))
    saved = again.saved["groups"][GROUP]
    assert saved["generation"] == g["decision"]["gen"] and saved["restarts"] == g["restarts"]
    assert again.saved["instance"] == pair.w[0].saved["instance"]


def test_a_restart_that_served_again_sets_no_backoff_for_the_next_death(pair):
    """Backoff is for restarts that do not bring the group back; a group that served again restarts at once when
    it fails later (each restart still counts against max_restarts in the window)."""
    pair.look()
    pair.engine.ok = False
    pair.look(times=12)  # 11 s of failures: the first restart
    pair.engine.ok = True
    g = pair.look(times=3)
    assert g["state"] == "ok" and g["restarts"][-1]["ok"]
    pair.engine.ok = False
    g = pair.look(times=12)  # backoff_s is 20: a wait here would say "backoff"
    assert g["state"] == "restarting" and g["restart_count"] == 2, g


def test_a_rank_follows_the_next_decision_after_up_replaced_the_group_between_two_looks(pair):
    """`up` replaced the group's containers; spark1's watcher looked while they were gone (its record of the group
    went with them) and spark2's did not. Rank 0's next decision must still be one spark2 has not acted on: before,
    its number restarted at 1, spark2 had acted on 1 already and never stopped or restarted its rank (seen in CI:
    a Ray worker left joined to a dead head, the group not serving 120 s later)."""
    pair.look()
    pair.engine.ok = False
    pair.look(times=12)  # the first restart: decision 1, acted on by spark2
    pair.engine.ok = True
    assert pair.look(times=3)["state"] == "ok" and "stop" in pair.docker[1].calls
    pair.docker[0].gone = True  # spark1 looks while `up` has removed its old container
    pair.clock.now += 1
    pair.w[0].tick(pair.clock.now)
    assert GROUP not in pair.w[0].saved["groups"]
    pair.docker[0].gone = False
    for d, cid in zip(pair.docker, ("c" * 64, "d" * 64), strict=True):
        d.c["Id"] = cid
        d.start(cid)
    assert pair.look(times=2)["state"] == "ok"
    pair.docker[1].calls.clear()
    pair.engine.ok = False
    pair.look(times=14)
    assert pair.docker[1].calls[:2] == ["stop", "start"], pair.docker[1].calls


def test_a_new_rank_from_up_ignores_a_decision_older_than_its_container(pair):
    """rank 0's watcher was in the middle of a restart (waiting for health) when `up` replaced the group; spark2's
    watcher looked while its container was gone (a new record) and then saw the old decision before rank 0's
    watcher had looked at its own new container. It must leave the new rank alone: before, it adopted the decision
    as not yet acted on and stopped the rank `up` had just started (its health gate saw exit 137)."""
    pair.look()
    pair.engine.ok = False
    pair.look(times=14)  # a restart decided; the engine never answers again: the decision stays in its start phase
    assert pair.w[0].saved["groups"][GROUP]["decision"]["phase"] == "start"
    pair.clock.now += 30
    spark2 = pair.docker[1]
    spark2.gone = True  # `up` removed spark2's rank...
    pair.w[1].tick(pair.clock.now)
    assert GROUP not in pair.w[1].saved["groups"]
    spark2.gone = False  # ...and created a new one, which spark2's watcher sees before rank 0's watcher looks again
    spark2.c["Id"] = "e" * 64
    spark2.c["Created"] = _iso(pair.clock.now)
    spark2.start(spark2.c["Id"])
    spark2.calls.clear()
    pair.clock.now += 1
    pair.w[1].tick(pair.clock.now)
    assert spark2.calls == [], spark2.calls


def test_a_rank_of_the_group_up_is_replacing_exiting_after_the_new_rank_0_started_is_no_lost_rank(pair):
    pair.look(seconds=10, times=10)
    # `up` replaced rank 0 first (a new container, started now); the worker's old container, made long before,
    # exits a moment later, as a multi-node engine's worker does when its head goes, before `up` replaces it too
    pair.docker[0].c.update(Id="c" * 64, Created=_iso(pair.clock.now))
    pair.docker[0].c["State"].update(StartedAt=_iso(pair.clock.now), FinishedAt=_iso(None))
    pair.engine.ok = False  # the new rank 0 is still loading
    pair.docker[1].c["State"].update(Status="exited", Running=False, FinishedAt=_iso(pair.clock.now + 6))
    g = pair.look(seconds=8, times=2)
    assert pair.docker[0].calls == [] and pair.docker[1].calls == [], (pair.docker[0].calls, g)
    assert not (g.get("decision") or {}).get("action"), g


def test_a_look_asked_for_cuts_the_wait_to_the_next_look_and_idle_the_period_stays(tmp_path):
    """Issue 40's cold start: the gateway's hook, holding a request for an on-demand group, asks its rank 0's
    watcher GET /watch?look=1; the watcher then looks LOOK_SOON_S after its last look began, not at its second.
    A plain GET /watch (a peer's read) changes nothing, and without one the looks stay every_s apart."""
    w = watch.Watcher({"every_s": 1.0}, FakeDocker(Clock(), "a" * 64, 0, {}), "spark1", str(tmp_path))
    w.serve("127.0.0.1", 0)
    port = w.server.server_address[1]
    stop = threading.Event()
    try:
        t0 = time.monotonic()
        w.rest(stop, t0)
        assert time.monotonic() - t0 >= 0.95  # idle: the whole period, as before
        urllib.request.urlopen(f"http://127.0.0.1:{port}/watch", timeout=5).read()
        t0 = time.monotonic()
        w.rest(stop, t0)
        assert time.monotonic() - t0 >= 0.95  # a peer's read asks for nothing
        urllib.request.urlopen(f"http://127.0.0.1:{port}/watch?look=1", timeout=5).read()
        t0 = time.monotonic()
        w.rest(stop, t0)
        took = time.monotonic() - t0
        assert watch.LOOK_SOON_S - 0.02 <= took < 0.6  # asked for: LOOK_SOON_S after the last look began
        t0 = time.monotonic()
        w.rest(stop, t0)
        assert time.monotonic() - t0 >= 0.95  # once: the next wait is the period again
    finally:
        w.server.shutdown()
