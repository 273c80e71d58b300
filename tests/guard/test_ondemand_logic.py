"""The activator's two decisions (sparkdeploy/nodeside/guard/ondemand.py, issue 40), pure: an idle on-demand member
stops after its timeout unless a request is in flight; a start that does not fit stops the least recently used
idle on-demand member(s) first, never an always-on one, never one with requests in flight, only ones holding
memory where it is missing; when nothing can make room it is refused with the figures."""

from __future__ import annotations

import pytest

from sparkdeploy.nodeside.guard import ondemand as od

ROOM = {"spark1": 0.94, "spark2": 0.94}


def member(name, shares, on_demand=True, last=None, in_flight=0, idle=60):
    return {
        "name": name,
        "on_demand": on_demand,
        "shares": shares,
        "last_request": last,
        "in_flight": in_flight,
        "idle_timeout": idle if on_demand else None,
    }


def test_idle_due_after_its_timeout_only_with_nothing_in_flight_and_never_always_on():
    m = member("coder", {"spark1": 0.45}, last=1000.0, idle=60)
    assert not od.idle_due(m, 1059.0) and od.idle_due(m, 1060.0)
    assert not od.idle_due({**m, "in_flight": 1}, 5000.0)
    assert not od.idle_due(member("chat", {"spark1": 0.45}, on_demand=False, last=0.0), 5000.0)
    assert not od.idle_due({**m, "last_request": None}, 5000.0)  # never asked since it started: the activator's


def test_a_start_that_fits_stops_nothing():
    stop, figures = od.make_room(member("small", {"spark1": 0.45}), [member("chat", {"spark1": 0.45}, False)], ROOM)
    assert stop == [] and figures.endswith(": fits") and "chat 0.45 (always on)" in figures


def test_the_least_recently_used_idle_member_stops_first_and_only_as_many_as_needed():
    running = [
        member("chat", {"spark1": 0.3}, on_demand=False),
        member("a", {"spark1": 0.3}, last=200.0),
        member("b", {"spark1": 0.3}, last=100.0),  # least recently used
    ]
    stop, figures = od.make_room(member("c", {"spark1": 0.3}), running, ROOM)
    assert [m["name"] for m in stop] == ["b"]
    assert figures.startswith("stop b (least recently used first) to start c: spark1: room 0.94")


def test_never_an_always_on_member_nor_one_with_requests_in_flight_and_none_on_other_nodes():
    running = [
        member("chat", {"spark1": 0.45}, on_demand=False),
        member("busy", {"spark1": 0.45}, last=1.0, in_flight=2),
        member("elsewhere", {"spark2": 0.9}, last=0.0),
    ]
    # only busy holds the room small lacks: wait for it to go idle (never stopped while busy), stop nothing now
    with pytest.raises(od.NotYet) as wait:
        od.make_room(member("small", {"spark1": 0.45}), running, ROOM)
    text = str(wait.value)
    assert text.startswith("small waits for busy to go idle (never stopped while busy): spark1: room 0.94") and (
        wait.value.busy == ["busy"]
    )
    assert "chat 0.45 (always on)" in text and "busy 0.45 (2 request(s) in flight)" in text
    assert "elsewhere" not in text
    # more than busy's share lacking: even busy idle would not make room, refused now
    with pytest.raises(od.NoRoom) as exc:
        od.make_room(member("small", {"spark1": 0.5}), running, ROOM)
    text = str(exc.value)
    assert "small does not fit even with every idle on-demand member stopped" in text
    assert "chat 0.45 (always on)" in text and "busy 0.45 (2 request(s) in flight)" in text


def test_a_multi_node_start_frees_every_node_it_needs():
    running = [
        member("left", {"spark1": 0.6}, last=10.0),
        member("right", {"spark2": 0.6}, last=20.0),
        member("newer", {"spark1": 0.2}, last=30.0),
    ]
    stop, _ = od.make_room(member("big", {"spark1": 0.7, "spark2": 0.7}), running, ROOM)
    assert [m["name"] for m in stop] == ["left", "right"]  # newer stays: spark1 has room once left stops
