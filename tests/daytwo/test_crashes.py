"""crashes.parse and doctor's engine.crashes diagnosis, from the text the node-side script prints
(the same docker inspect / docker events formats the lab test reads from real engines)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sparkdeploy.checks import FAIL, PASS, WARN
from sparkdeploy.daytwo import crashes
from sparkdeploy.doctor.containers import diagnose
from sparkdeploy.facts import FACTS

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
S = crashes.SECTION


def _ns(minutes_ago: float) -> int:
    return int((NOW.timestamp() - minutes_ago * 60) * 1e9)


def node_output(containers: list[dict], events: list[dict], now: str = "2026-11-23T10:00:00Z") -> str:
    lines = [
        f"{S} inspect",
        *[json.dumps(c) for c in containers],
        f"{S} events",
        *[json.dumps(e) for e in events],
        f"{S} now",
        now,
    ]
    return "\n".join(lines) + "\n"


def container(
    name="sparkdeploy-vllm",
    cid="c1",
    status="running",
    running=True,
    oom=False,
    code=0,
    restarts=0,
    finished="0001-01-01T00:00:00Z",
    health=None,
    role="solo",
):
    state = {
        "Status": status,
        "Running": running,
        "Paused": False,
        "Restarting": status == "restarting",
        "OOMKilled": oom,
        "Dead": False,
        "Pid": 42,
        "ExitCode": code,
        "Error": "",
        "StartedAt": "2026-11-23T09:58:00.5Z",
        "FinishedAt": finished,
    }
    if health is not None:
        state["Health"] = health
    return {"id": cid, "name": "/" + name, "state": state, "restarts": restarts, "role": role}


def die(minutes_ago, code, cid="c1"):
    return {"action": "die", "time": _ns(minutes_ago), "id": cid, "code": str(code)}


def oom(minutes_ago, cid="c1"):
    return {"action": "oom", "time": _ns(minutes_ago), "id": cid, "code": None}


def kill(minutes_ago, cid="c1"):
    return {"action": "kill", "time": _ns(minutes_ago), "id": cid, "code": None}


def test_oom_kill_seen_through_events_after_a_restart():
    """The restart policy brought it back (inspect says running): the events still say it was OOM-killed."""
    h = crashes.parse(node_output([container(restarts=1)], [oom(3.01), die(3, 137)]))
    c = h.containers["sparkdeploy-vllm"]
    assert c.running and c.restarts == 1
    assert c.last_exit.oom and c.last_exit.code == 137 and c.last_exit.reason == "OOM-killed (exit 137)"
    assert crashes.summary(c, h.now) == "1 restart; OOM-killed (exit 137) 3m ago"
    rows = diagnose(h, "spark1", "lower vllm.gpu_memory_utilization")
    assert len(rows) == 1 and rows[0].status == FAIL
    assert "OOM-killed 3m ago" in rows[0].measured and "gpu_memory_utilization" in rows[0].fix
    assert "unified memory is shared with the OS" in rows[0].fix


def test_sigkill_is_not_an_oom_kill():
    h = crashes.parse(node_output([container(restarts=1)], [die(1, 137)]))
    c = h.containers["sparkdeploy-vllm"]
    assert not c.last_exit.oom and c.last_exit.reason == "killed by SIGKILL (exit 137)"
    rows = diagnose(h, "spark1", "x")
    assert [r.status for r in rows] == [WARN] and "SIGKILL" in rows[0].measured


def test_stopped_container_state_says_oom_without_events():
    """Events gone (engine restarted): a stopped container's own state still carries OOMKilled."""
    h = crashes.parse(
        node_output(
            [container(status="exited", running=False, oom=True, code=137, finished="2026-11-23T09:50:00.1Z")], []
        )
    )
    c = h.containers["sparkdeploy-vllm"]
    assert c.last_exit.oom and crashes.ago(c.last_exit.at, h.now) == "9m ago"
    assert diagnose(h, "spark1", "x")[0].status == FAIL


def test_restart_loop():
    events = [die(m, 1) for m in (12, 8, 4, 1)]
    h = crashes.parse(
        node_output(
            [container(status="restarting", running=False, code=1, restarts=4, finished="2026-11-23T09:59:00Z")], events
        )
    )
    rows = diagnose(h, "spark2", "x")
    assert rows[0].status == FAIL and "restarting in a loop: 4 exits" in rows[0].measured
    assert "sparkdeploy logs --node spark2 --container sparkdeploy-vllm" in rows[0].fix
    assert "exit code 1" in rows[0].measured


def test_health_failing_since():
    health = {
        "Status": "unhealthy",
        "FailingStreak": 2,
        "Log": [
            {"Start": "2026-11-23T09:50:00Z", "ExitCode": 0, "Output": ""},
            {"Start": "2026-11-23T09:55:00Z", "ExitCode": 1, "Output": "refused"},
            {"Start": "2026-11-23T09:57:00Z", "ExitCode": 1, "Output": "refused"},
        ],
    }
    h = crashes.parse(node_output([container(health=health)], []))
    c = h.containers["sparkdeploy-vllm"]
    assert c.health == "unhealthy" and crashes.ago(c.failing_since, h.now) == "5m ago"
    assert "health failing since 09:55:00 UTC, 5m ago" in crashes.summary(c, h.now)
    assert diagnose(h, "spark1", "x")[0].status == FAIL


def test_health_failing_since_is_the_first_failure_also_once_the_log_dropped_it():
    """Docker keeps the last 5 probes: a streak of 40 goes back 35 probe spacings from the oldest it holds, so
    every later read gives the same time (issue 43: it moved forward at every look)."""
    log = [{"Start": f"2026-11-23T09:59:{s:02d}Z", "ExitCode": 1, "Output": "503"} for s in (30, 35, 40, 45, 50)]
    for streak, now in ((40, "10:00:00"), (41, "10:00:05")):
        last = {"Start": "2026-11-23T09:59:55Z", "ExitCode": 1, "Output": "503"}
        probes = log if streak == 40 else [*log[1:], last]
        health = {"Status": "unhealthy", "FailingStreak": streak, "Log": probes}
        h = crashes.parse(node_output([container(health=health)], [], now=f"2026-11-23T{now}Z"))
        c = h.containers["sparkdeploy-vllm"]
        assert c.failing_since is not None and c.failing_since.strftime("%H:%M:%S") == "09:56:35", streak


def test_healthy_history_passes():
    h = crashes.parse(node_output([container(), container("sparkdeploy-litellm", role="proxy")], []))
    rows = diagnose(h, "spark1", "x")
    assert [r.status for r in rows] == [PASS]
    assert crashes.summary(h.containers["sparkdeploy-vllm"], h.now) == "-"


def test_an_old_oom_kill_is_not_recent():
    h = crashes.parse(node_output([container(restarts=1)], [oom(60 * 30 + 0.01), die(60 * 30, 137)]))
    assert diagnose(h, "spark1", "x")[0].status == PASS


def test_exit_reasons():
    assert crashes.Exit(NOW, 143).reason == "killed by SIGTERM (exit 143)"
    assert crashes.Exit(NOW, 0).reason == "exited cleanly (exit 0)"
    assert crashes.Exit(NOW, 3).reason == "exit code 3"
    assert crashes.Exit(NOW, None).reason == "exited (code unknown)"


def test_script_reads_no_environment():
    """Config.Env holds the secrets of --env-file: the crashes fact never asks for it."""
    assert "Env" not in FACTS["crashes"].command


def test_ends_of_replaced_containers_and_docker_stops_are_not_crashes():
    """`up` replaces containers under the same names (docker rm -f: kill, then die 137): only this
    container's own exits count, and one Docker asked for (docker restart) is reported but not a crash."""
    old = [oom(9.01, "old"), die(9, 137, "old"), kill(5.01, "older"), die(5, 137, "older")]
    h = crashes.parse(node_output([container(restarts=0)], old + [kill(2.01), die(2, 137)]))
    c = h.containers["sparkdeploy-vllm"]
    assert len(c.exits) == 1 and c.last_exit.by_docker and not c.last_exit.oom
    assert c.last_exit.reason == "stopped by Docker (docker stop/kill/restart, exit 137)"
    assert c.exits_within(3600, h.now) == []
    assert [r.status for r in diagnose(h, "spark1", "x")] == [PASS]
