"""On-demand stack members (issue 40), without nodes: the stack file's `on_demand` / `idle_timeout` (one line per
bad value), the budget per set of engines that must run together, and `up --stack`'s plan that prepares a cold
member (files written, nothing started) and routes it as cold."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

import pytest

from sparkdeploy.deploy.plan import StepKind
from sparkdeploy.deploy.stack import converge as st
from sparkdeploy.deploy.stack import file as sf
from sparkdeploy.deploy.stack import members as sm
from sparkdeploy.deploy.stack import routes as sr
from sparkdeploy.deploy.stack import units as su
from sparkdeploy.errors import ConfigError
from sparkdeploy.facts import ContainerFact, NodeFacts, parse
from sparkdeploy.guard import state as guard_state
from sparkdeploy.labels import DEPLOYMENT_LABEL, GROUP_LABEL, ROLE_LABEL
from sparkdeploy.nodeside.gateway import gateway_spend

from .deploy_helpers import make_deployment
from .test_stack import TOTAL, apply_to, facts_for, loaded, problems


def built(s: sf.Stack) -> sf.Stack:
    s.totals = {n.name: TOTAL for n in s.inventory.nodes}
    sf.build(s, sf.budget(s, s.totals))
    return s


# one always-on and two on-demand members on one node: 0.45 + 0.45 + 0.45 cannot all run at once
THREE = """
deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.45}
  - {name: coder, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark1], memory: 0.45, port: 8001,
     on_demand: true, idle_timeout: 90s}
  - {name: small, recipe: openai-gpt-oss-20b, topology: solo, nodes: [spark1], memory: 0.45, port: 8002,
     on_demand: true}
"""


def test_bad_on_demand_values_are_one_line_each_naming_the_field(tmp_path, inventory_file):
    lines = problems(
        tmp_path,
        inventory_file,
        """
        deployments:
          - {name: a, recipe: glm-4.7-flash-int4, nodes: [spark1], idle_timeout: 10m}
          - {name: b, recipe: qwen3-coder-30b-int4, nodes: [spark2], on_demand: true, idle_timeout: 5 minutes}
          - {name: c, recipe: openai-gpt-oss-20b, nodes: [spark2], port: 8009, on_demand: true, idle_timeout: 3}
          - {name: d, recipe: nemotron-3-nano, nodes: [spark2], port: 8010, on_demand: "yes"}
        """,
    )
    assert len(lines) == 4, lines
    a, b, c, d = sorted(lines, key=lambda line: line.split("deployments[")[1])
    assert "deployments[0]: idle_timeout: set, but the deployment is not on_demand" in a and "on_demand: true" in a
    assert "deployments[1].idle_timeout" in b and "'5 minutes' is not a duration" in b and "10m" in b
    assert "deployments[2].idle_timeout" in c and "3 s is out of range" in c
    assert "deployments[3].on_demand" in d


def test_bad_hold_values_are_one_line_each_naming_the_field(tmp_path, inventory_file):
    lines = problems(
        tmp_path,
        inventory_file,
        """
        gateway: {hold: soon}
        deployments:
          - {name: a, recipe: glm-4.7-flash-int4, nodes: [spark1], start_timeout: 10m}
          - {name: b, recipe: qwen3-coder-30b-int4, nodes: [spark2], on_demand: true, start_timeout: 2h}
        """,
    )
    assert len(lines) == 3, lines
    hold = next(line for line in lines if "gateway.hold" in line)
    assert "'soon' is not a duration" in hold and "90s, 10m" in hold, hold
    a = next(line for line in lines if "deployments[0]" in line)
    assert "start_timeout: set, but the deployment is not on_demand" in a and "on_demand: true" in a, a
    b = next(line for line in lines if "deployments[1]" in line)
    assert "deployments[1].start_timeout" in b and "7200 s is out of range" in b and "3600 s" in b, b


def test_a_duration_of_the_wrong_type_is_one_line_without_the_schemas_inner_names(tmp_path, inventory_file):
    lines = problems(
        tmp_path,
        inventory_file,
        """
        gateway: {hold: true}
        deployments:
          - {name: a, recipe: glm-4.7-flash-int4, nodes: [spark1], on_demand: true, idle_timeout: [1]}
          - {name: b, recipe: qwen3-coder-30b-int4, nodes: [spark2], on_demand: true, idle_timeout: "10s\\n"}
        """,
    )
    assert len(lines) == 3, lines  # one per field, not one per branch of int | str
    assert any("gateway.hold: True is not a duration" in line for line in lines), lines
    assert any("deployments[0].idle_timeout: [1] is not a duration" in line for line in lines), lines
    assert any("deployments[1].idle_timeout: holds a newline" in line for line in lines), lines
    assert not any("function-after" in line or ".int:" in line for line in lines), lines
    assert all("fix: " in line for line in lines), lines


def test_the_hold_is_the_members_start_timeout_else_the_stacks_else_the_default(tmp_path, inventory_file):
    """routes.json carries each on-demand member's hold (the gateway's hook reads it, not only its env var)."""
    held = "gateway: {hold: 45s}\n" + THREE.replace("idle_timeout: 90s}", "idle_timeout: 90s, start_timeout: 4m}")
    s = built(loaded(tmp_path, inventory_file, held))
    assert [sf.hold_s(s, m) for m in s.members] == [None, 240, 45]
    routes = su.stack_routes(s, {"coder": st.COLD, "small": st.COLD})
    data = json.loads(routes.text())
    assert (data["on_demand"]["coder"]["hold"], data["on_demand"]["small"]["hold"]) == (240, 45)
    assert "hold" not in data["groups"]["chat"]
    back = sr.parse(data)
    assert back is not None and back.groups["coder"].hold == 240 and back.text() == routes.text()
    plain = built(loaded(tmp_path, inventory_file, THREE))
    assert [sf.hold_s(plain, m) for m in plain.members] == [None, sf.HOLD_DEFAULT_S, sf.HOLD_DEFAULT_S]


def test_idle_timeout_reads_seconds_minutes_hours_and_defaults_to_ten_minutes(tmp_path, inventory_file):
    s = loaded(tmp_path, inventory_file, THREE)
    assert [m.entry.idle_timeout_s for m in s.members] == [None, 90, sf.IDLE_TIMEOUT_DEFAULT_S]
    assert [sf.idle_seconds(v) for v in (600, "45s", "10m", "2h", "120")] == [600, 45, 600, 7200, 120]


def test_on_demand_members_need_not_fit_together_only_each_with_the_always_on_ones(tmp_path, inventory_file):
    s = loaded(tmp_path, inventory_file, THREE)
    util = sf.budget(s, {n.name: TOTAL for n in s.inventory.nodes})  # 0.45 + 0.45 fits; all three would not
    assert util == {"chat": 0.45, "coder": 0.45, "small": 0.45}
    always = loaded(
        tmp_path,
        inventory_file,
        THREE.replace("on_demand: true", "on_demand: false").replace(", idle_timeout: 90s", ""),
    )
    with pytest.raises(ConfigError) as exc:  # the same three always on: refused as before
        sf.budget(always, {n.name: TOTAL for n in always.inventory.nodes})
    assert "at most 0.94 fits" in str(exc.value.problems[0])


def test_an_on_demand_member_that_does_not_fit_beside_the_always_on_ones_is_refused_with_a_fix(
    tmp_path, inventory_file
):
    s = loaded(tmp_path, inventory_file, THREE.replace("memory: 0.45, port: 8002", "memory: 0.6, port: 8002"))
    with pytest.raises(ConfigError) as exc:
        sf.budget(s, {n.name: TOTAL for n in s.inventory.nodes})
    (line,) = [str(p) for p in exc.value.problems]
    assert "chat 0.45" in line and "small 0.6" in line and "coder" not in line.split("(fix")[0], line


def created(units: list[st.Unit], containers: dict[str, list]) -> None:
    """What the create-container steps leave: the container, as rendered, not running (Docker: `created`)."""
    for u in units:
        for x in u.plan.steps:
            if x.kind == StepKind.CREATE_CONTAINER and x.change and x.container is not None:
                c = x.container
                labels = {
                    "io.sparkdeploy.managed": "true",
                    "io.sparkdeploy.config-hash": c.config_hash,
                    DEPLOYMENT_LABEL: u.name,
                    ROLE_LABEL: c.role,
                }
                containers[x.node].append(
                    ContainerFact(
                        id=c.config_hash * 4,
                        name=c.name,
                        image_id="sha256:x",
                        image_ref=c.image,
                        labels=labels,
                        status="created",
                        running=False,
                    )
                )


def test_up_prepares_a_cold_member_creates_its_engine_and_starts_nothing_of_it(tmp_path, inventory_file):
    s = built(loaded(tmp_path, inventory_file, THREE))
    containers: dict[str, list] = {n.name: [] for n in s.inventory.nodes}
    facts = facts_for(s, ["chat", "coder", "small", "gateway", "guard"], containers)
    units = st.plan_stack(s, facts, [])
    started = [x.target for u in units for x in u.plan.steps if x.kind == StepKind.START_CONTAINER and x.change]
    assert "sparkdeploy-chat-vllm" in started
    assert not [t for t in started if "coder" in t or "small" in t], started
    coder = next(u for u in units if u.name == "coder")
    (create,) = [x for x in coder.plan.steps if x.kind in (StepKind.START_CONTAINER, StepKind.CREATE_CONTAINER)]
    assert (create.kind, create.change, create.target) == (StepKind.CREATE_CONTAINER, True, "sparkdeploy-coder-vllm")
    assert create.reason == "on demand: created, not started (missing)"
    assert st.cold(units) == ["coder", "small"]
    manifest = json.loads(next(x.file.content for x in coder.plan.steps if x.kind == StepKind.MANIFEST and x.file))
    assert manifest["on_demand"] == {"idle_timeout": 90, "share": 0.45, "room": {"spark1": 0.93}}
    apply_to(units, facts, containers)
    created(units, containers)
    again = st.plan_stack(s, facts_for(s, [], containers, facts), [])
    assert [(u.name, u.changes) for u in again] == [
        ("guard", 0),
        ("chat", 0),
        ("coder", 0),
        ("small", 0),
        ("gateway", 0),
    ]
    assert st.cold(again) == ["coder", "small"]
    reasons = [x.reason for u in again if u.name == "coder" for x in u.plan.steps if x.target.endswith("-vllm")]
    assert reasons == [st.COLD]
    changed = built(loaded(tmp_path, inventory_file, THREE.replace("idle_timeout: 90s", "idle_timeout: 91s")))
    units = st.plan_stack(changed, facts_for(changed, [], containers, facts), [])
    steps = [x for u in units if u.name == "coder" for x in u.plan.steps if x.target == "sparkdeploy-coder-vllm"]
    assert [(x.kind, x.change) for x in steps] == [(StepKind.START_CONTAINER, False)]  # only its manifest changed


def test_a_warm_on_demand_member_is_converged_like_any_other(tmp_path, inventory_file):
    s = built(loaded(tmp_path, inventory_file, THREE))
    containers: dict[str, list] = {n.name: [] for n in s.inventory.nodes}
    facts = facts_for(s, ["chat", "coder", "small", "gateway", "guard"], containers)
    units = st.plan_stack(s, facts, [])
    coder = next(u for u in units if u.name == "coder")
    for x in coder.plan.steps:  # as if its first request had started it
        if x.kind == StepKind.CREATE_CONTAINER:
            x.kind = StepKind.START_CONTAINER
    apply_to(units, facts, containers)
    changed = built(
        loaded(tmp_path, inventory_file, THREE.replace("memory: 0.45, port: 8001", "memory: 0.4, port: 8001"))
    )
    again = st.plan_stack(changed, facts_for(changed, [], containers, facts), [])
    restarted = [x.target for u in again for x in u.plan.steps if x.kind == StepKind.START_CONTAINER and x.change]
    assert restarted == ["sparkdeploy-coder-vllm"]
    assert st.cold(again) == ["small"]


def test_routes_carry_each_on_demand_members_idle_timeout_and_its_cold_reason(tmp_path, inventory_file):
    s = built(loaded(tmp_path, inventory_file, THREE))
    routes = su.stack_routes(s, {"coder": st.COLD, "small": st.COLD})
    data = json.loads(routes.text())
    assert data["groups"]["coder"]["idle_timeout"] == 90 and "idle_timeout" not in data["groups"]["chat"]
    assert routes.served() == [s.member("chat").model]
    assert "cold: on demand" in routes.unavailable()[s.member("coder").model]
    back = sr.parse(data)
    assert back is not None and back.groups["small"].idle_timeout == sf.IDLE_TIMEOUT_DEFAULT_S
    assert back.text() == routes.text()
    # every engine of an on-demand member, with its watcher: the hook routes it while the watcher says `ok`
    od = data["on_demand"]
    assert sorted(od) == ["coder", "small"] and od["coder"]["idle_timeout"] == 90
    (entry,) = od["coder"]["model_list"]
    assert entry["model_name"] == s.member("coder").model and entry["model_info"]["group"] == "coder:spark1"
    assert entry["model_info"]["watch"].endswith(":7390/watch"), entry
    assert "on_demand" not in json.loads(su.stack_routes(built(loaded(tmp_path, inventory_file, ONE_ON))).text())


ONE_ON = """
deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.45}
"""


def test_the_guards_of_a_stack_with_on_demand_members_read_the_gateways_demand(tmp_path, inventory_file):
    s = built(loaded(tmp_path, inventory_file, THREE))
    (guard,) = su.guard_nodes(s)
    url = f"http://{s.head.url_host}:{s.gateway_port}/sparkdeploy/demand"
    assert f'"demand":"{url}"' in guard.file("guard.entry.sh").content  # the config the guard's entry writes
    (plain,) = su.guard_nodes(built(loaded(tmp_path, inventory_file, ONE_ON)))
    assert '"demand"' not in plain.file("guard.entry.sh").content


def test_the_hook_answers_the_demand_where_the_activators_read_it():
    hook = su.HOOK_SOURCE.read_text(encoding="utf-8")
    assert f'DEMAND_PATH = "{sr.DEMAND_PATH}"' in hook


def test_demand_counts_waiting_and_in_flight_requests_over_processes_never_below_zero(tmp_path):
    db = str(tmp_path / "spend.sqlite")
    gateway_spend.demand_add("m", waiting=1, path=db)
    gateway_spend.demand_add("m", in_flight=1, path=db)
    seen = gateway_spend.demand(db)["m"]
    assert (seen["waiting"], seen["in_flight"]) == (1, 1) and seen["last_request"] is not None
    last = seen["last_request"]
    gateway_spend.demand_add("m", waiting=-1, path=db)
    gateway_spend.demand_add("m", in_flight=-1, path=db)
    gateway_spend.demand_add("m", in_flight=-1, path=db)  # a stray end: never below 0
    assert gateway_spend.demand(db)["m"] == {"waiting": 0, "in_flight": 0, "last_request": last}
    gateway_spend.demand_add("other", in_flight=-1, path=db)  # an end first: counted 0, no last request
    assert gateway_spend.demand(db)["other"] == {"waiting": 0, "in_flight": 0, "last_request": None}


def test_a_killed_gateway_workers_demand_counts_are_not_counted(tmp_path):
    """A gateway worker killed mid-request (the gateway's container killed or restarted, uvicorn respawning a
    worker) never ends its requests: its +1 waiting and in flight must not count, or the member's activator would
    see a request held for ever (started again after every stop, never stopped as idle). Its last request stays."""
    db = str(tmp_path / "spend.sqlite")
    gone = (
        f"import gateway_spend as g\ng.demand_add('m', waiting=1, path={db!r})\n"
        f"g.demand_add('m', in_flight=1, path={db!r})\nprint(g.demand({db!r})['m'])"
    )
    env = {"PYTHONPATH": str(gateway_spend.__file__).rsplit("/", 1)[0]}
    r = subprocess.run([sys.executable, "-c", gone], capture_output=True, text=True, check=True, env=env)
    assert "'waiting': 1, 'in_flight': 1" in r.stdout, r.stdout  # counted while its worker lived
    gateway_spend.demand_add("m", in_flight=1, path=db)  # a live worker's request (this process)
    seen = gateway_spend.demand(db)["m"]
    assert (seen["waiting"], seen["in_flight"]) == (0, 1) and seen["last_request"] is not None, seen
    gateway_spend.demand_add("m", in_flight=-1, path=db)
    assert gateway_spend.demand(db)["m"]["in_flight"] == 0
    assert gateway_spend.alive(gateway_spend.worker()) and not gateway_spend.alive("?/1/0")


def _engine(name: str, member: str, running: bool, health: str) -> ContainerFact:
    labels = {DEPLOYMENT_LABEL: member, ROLE_LABEL: "head"}
    return ContainerFact(
        id="x" * 64,
        name=name,
        image_id="sha256:x",
        image_ref="vllm",
        labels=labels,
        running=running,
        health=health,
        status="running",
    )


def test_status_shows_each_member_cold_starting_warm_or_stopping_from_the_routes_and_containers(
    tmp_path, inventory_file
):
    s = built(loaded(tmp_path, inventory_file, THREE))
    routes = su.stack_routes(s, {"small": st.COLD})
    facts: dict[str, NodeFacts | Exception] = {
        "spark1": NodeFacts(node="spark1", containers=[_engine("sparkdeploy-chat-vllm", "chat", True, "healthy")]),
        "spark2": RuntimeError("unreachable"),
    }
    rows = {r["deployment"]: r for r in sm.member_states(routes, facts)}
    assert (rows["chat"]["state"], rows["chat"]["on_demand"]) == ("warm", False)
    assert (rows["small"]["state"], rows["small"]["why"]) == ("cold", "on demand, not running")
    assert rows["small"]["idle_timeout_s"] == sf.IDLE_TIMEOUT_DEFAULT_S and rows["coder"]["state"] == "cold"
    starting = routes.taken_out("coder", "starting: on demand")
    spark1 = cast(NodeFacts, facts["spark1"])
    spark1.containers.append(_engine("sparkdeploy-coder-vllm", "coder", True, "starting"))
    assert sm.member_state("coder", starting, facts)["state"] == "starting"
    assert sm.member_state("coder", routes, facts)["state"] == "starting"  # routed, Docker says not healthy yet
    stopping = routes.taken_out("chat", "stopping: idle for 90 s")
    assert sm.member_state("chat", stopping, facts)["state"] == "stopping"
    # started on a request: routes.json (written by `up`) still says cold; healthy is warm, before that starting
    spark1.containers.append(_engine("sparkdeploy-small-vllm", "small", True, "starting"))
    assert sm.member_state("small", routes, facts)["state"] == "starting"
    spark1.containers[-1] = _engine("sparkdeploy-small-vllm", "small", True, "healthy")
    assert sm.member_state("small", routes, facts)["state"] == "warm"
    assert sm.member_states(None, facts) == []


def test_the_gateway_logs_each_on_demand_decision_once_over_every_worker_and_a_restart(tmp_path):
    """Issue 40 item 2: the poller of each proxy worker sees a watcher's decision (`activation`) once a second;
    the gateway's log has one line for it, in one line whatever the watcher says, no matter how many workers
    (each with its own connection) or restarts see it."""
    db = str(tmp_path / "spend.sqlite")
    record = {
        "action": "start",
        "why": "on demand: 1 request(s) held at the gateway for small-m; spark1: room 0.93, running chat 0.45 "
        "(always on); small needs 0.45: fits",
        "at": 1_800_000_000.5,
        "stopped": ["coder"],
    }
    line = gateway_spend.decision_line("small:spark1", record, path=db)
    assert line == (
        "on-demand start small:spark1: on demand: 1 request(s) held at the gateway for small-m; spark1: room 0.93, "
        "running chat 0.45 (always on); small needs 0.45: fits; stopped for it: coder"
    )
    assert gateway_spend.decision_line("small:spark1", record, path=db) is None  # this worker, the next look
    other = sqlite3.connect(db)  # another worker's (or a restarted gateway's) view of the same file
    assert other.execute("SELECT key FROM decisions").fetchall() == [("small:spark1@1800000000.5",)]
    assert gateway_spend.decision_line("small:spark1", dict(record, at=1_800_000_060.0), path=db) is not None
    assert gateway_spend.decision_line("coder:spark1", record, path=db) is not None  # another group's
    hostile = dict(record, at=1.0, why="evil\nFAKE LINE\r" + "x" * 2000, stopped=[])
    text = gateway_spend.decision_line("small:spark1", hostile, path=db)
    assert text is not None and "\n" not in text and "\r" not in text and len(text) == gateway_spend.LINE_MAX
    assert gateway_spend.decision_line("g", {"why": "no action, no time"}, path=db) is None


def _watched(gid: str, **entry: object) -> dict[str, dict[str, object]]:
    return {gid: {"rank": 0, "state": "ok", "node": "spark1", **entry}}


def test_status_shows_last_request_idle_time_stopping_and_the_last_decision_from_the_watchers(tmp_path, inventory_file):
    """Issue 40 item 3: an on-demand member's last request and idle time as its watcher published them (epoch in
    --json, `12 s ago` / `idle 12 s of 600 s` in the table), `stopping` while its activator stops it, and its
    last decision with its figures, short."""
    s = built(loaded(tmp_path, inventory_file, THREE))
    routes = su.stack_routes(s, {"small": st.COLD})
    small = _engine("sparkdeploy-small-vllm", "small", True, "healthy")
    small.labels[GROUP_LABEL] = "small:spark1"
    facts: dict[str, NodeFacts | Exception] = {"spark1": NodeFacts(node="spark1", containers=[small])}
    now = 1_800_000_100.0
    seen = {"last_request": now - 12, "waiting": 0, "in_flight": 0, "idle_timeout": 600, "idle_from": now - 12}
    fig = {
        "member": "small",
        "node": "spark1",
        "room": 0.93,
        "needs": 0.45,
        "running": [{"deployment": "chat", "share": 0.45, "kept": "always on"}],
    }
    start = {"action": "start", "why": "on demand: ...: fits", "at": now - 40, "stopped": ["coder"], "figures": fig}
    row = sm.member_state("small", routes, facts, _watched("small:spark1", on_demand=seen, activation=start), now)
    assert (row["state"], row["last_request"], row["idle_s"], row["busy"]) == ("warm", now - 12, 12.0, 0), row
    assert row["decision"] == start
    assert sm.usage_text(row, now) == "last request 12 s ago, idle 12 s of 600 s"
    assert sm.decision_text(row["decision"], now) == (
        "started 40 s ago, coder stopped for it: spark1: small needs 0.45, room 0.93, beside chat 0.45 (always on)"
    )
    busy = sm.member_state("small", routes, facts, _watched("small:spark1", on_demand=dict(seen, in_flight=2)), now)
    assert busy["idle_s"] == 0 and sm.usage_text(busy, now) == "last request 12 s ago, 2 request(s) held or in flight"
    stopping = {"action": "stop", "phase": "stopping", "reason": "on demand: evicted for big: stop small ..."}
    row = sm.member_state("small", routes, facts, _watched("small:spark1", decision=stopping, on_demand=seen), now)
    assert (row["state"], row["why"]) == ("stopping", "on demand: evicted for big: stop small ..."), row
    evicted = {
        "action": "stop",
        "why": "...",
        "at": now - 300,
        "evicted_for": "big",
        "figures": dict(fig, member="big"),
    }
    assert sm.decision_text(evicted, now).startswith("evicted 5 min ago for big (least recently used idle member): ")
    idle = {"action": "stop", "why": "...", "at": now - 2, "idle_s": 601.0, "idle_timeout": 600}
    assert sm.decision_text(idle, now) == "stopped 2 s ago: idle 10 min of 600 s, its memory freed"
    refuse = {"action": "refuse", "why": "small does not fit even with every idle ...", "at": now - 3, "figures": fig}
    assert sm.decision_text(refuse, now) == "refuse 3 s ago: small does not fit even with every idle ..."
    wait = {"action": "wait", "why": "small waits for coder ...", "at": now - 4, "busy": ["coder"], "figures": fig}
    assert sm.decision_text(wait, now).startswith("waiting since 4 s ago for coder to go idle (busy now): spark1: ")
    small.running = False  # cold: a last request, no idle time
    row = sm.member_state("small", routes, facts, _watched("small:spark1", on_demand=seen), now)
    assert (row["state"], row["last_request"], row["idle_s"]) == ("cold", now - 12, None), row
    nothing = sm.member_state("small", routes, facts, {}, now)  # no watcher has published: nothing made up
    assert (nothing["last_request"], nothing["idle_s"], nothing["decision"]) == (None, None, None)
    assert sm.usage_text(nothing, now) == ""


def test_members_read_from_a_real_guard_status_after_an_eviction(tmp_path, inventory_file):
    """The fact `guard_status` of the lab's spark1 (tests/facts/samples/lab-ondemand-guard.txt: the GUARD set read
    over SSH while tests/deploy/test_ondemand_lab.py's eviction had just happened: small started, coder evicted
    for it, chat always on) read as `status` reads it: each watcher's demand and last decision, per member."""
    sample = (Path(__file__).resolve().parents[1] / "facts" / "samples" / "lab-ondemand-guard.txt").read_text()
    f = parse("spark1", sample)
    watched = guard_state.watched_groups({"spark1": guard_state.status_of(f, make_deployment("solo").inventory)})
    assert set(watched) == {"chat:spark1", "coder:spark1", "small:spark1"}
    s = built(loaded(tmp_path, inventory_file, THREE))
    routes = su.stack_routes(s, {"coder": st.COLD, "small": st.COLD})
    engines = []
    for name, running in (("chat", True), ("coder", False), ("small", True)):
        c = _engine(f"sparkdeploy-{name}-vllm", name, running, "healthy" if running else "")
        c.labels[GROUP_LABEL] = f"{name}:spark1"
        engines.append(c)
    facts: dict[str, NodeFacts | Exception] = {"spark1": NodeFacts(node="spark1", containers=engines)}
    start = watched["small:spark1"]["activation"]
    now = start["at"] + 30
    rows = {r["deployment"]: r for r in sm.member_states(routes, facts, watched, now)}
    small, coder, chat = rows["small"], rows["coder"], rows["chat"]
    assert (
        small["state"] == "warm"
        and small["decision"]["action"] == "start"
        and small["decision"]["stopped"] == ["coder"]
    )
    assert small["decision"]["figures"]["running"] == [{"deployment": "chat", "kept": "always on", "share": 0.45}]
    assert start["at"] < small["last_request"] < now and 0 < small["idle_s"] < 30 and small["busy"] == 0, small
    assert coder["state"] == "cold" and coder["idle_s"] is None and coder["last_request"] < small["last_request"]
    evicted = coder["decision"]
    assert (evicted["action"], evicted["evicted_for"]) == ("stop", "small") and evicted["at"] < start["at"], evicted
    assert sm.decision_text(evicted, now).startswith(
        "evicted 32 s ago for small (least recently used idle member): spark1: small needs 0.45, room 0.93, "
        "beside chat 0.45 (always on), coder 0.45 (idle)"
    )
    assert (chat["last_request"], chat["decision"], chat["busy"]) == (None, None, None)  # always on: no demand


def test_in_flight_counts_are_noted_without_a_write_and_written_merged_by_one_thread(tmp_path):
    """The warm on-demand path (issue 40 item 4): a request's beginning and end only note the change; the writer
    thread writes them, a pass's beginnings in one write (the last request's time) and its ends in another."""
    db = str(tmp_path / "spend.sqlite")
    writes: list[tuple[str, int]] = []

    def write(model: str, in_flight: int, path: str) -> None:
        writes.append((model, in_flight))
        gateway_spend.demand_add(model, in_flight=in_flight, path=path)

    counts = gateway_spend.InFlight(db, write)
    counts._thread = threading.current_thread()  # no writer thread: this test flushes by hand
    for _ in range(5):
        counts.begin("m")
    counts.end("m")
    counts.end("m")
    assert writes == [] and gateway_spend.demand(db) == {}  # nothing written on the request's path
    assert counts.flush() == 2 and writes == [("m", 5), ("m", -2)]
    seen = gateway_spend.demand(db)["m"]
    assert seen["in_flight"] == 3 and seen["last_request"] is not None
    assert counts.flush() == 0


def test_in_flight_counts_reach_the_table_through_the_writer_thread_and_survive_a_failed_write(tmp_path):
    db = str(tmp_path / "spend.sqlite")
    failing = [True]

    def write(model: str, in_flight: int, path: str) -> None:
        if failing[0]:
            failing[0] = False
            raise sqlite3.OperationalError("database is locked")
        gateway_spend.demand_add(model, in_flight=in_flight, path=path)

    counts = gateway_spend.InFlight(db, write)
    counts.begin("m")
    counts.begin("m")
    counts.end("m")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (gateway_spend.demand(db).get("m") or {}).get("in_flight") != 1:
        time.sleep(0.05)
    assert gateway_spend.demand(db)["m"]["in_flight"] == 1  # the failed pass's counts written on the next


def test_a_note_made_while_the_writer_swaps_its_counts_is_not_lost(tmp_path):
    """The writer takes the noted counts by swapping both dicts for new ones under the lock. A note must go into the
    dict current once it holds the lock, not the one it saw before: the writer may already have written (and
    dropped) that model from the dict it took. Here the swap happens just as the note takes the lock."""
    counts = gateway_spend.InFlight(str(tmp_path / "spend.sqlite"), write=lambda *a, **kw: None)
    counts._thread = threading.current_thread()  # no writer thread: this test swaps as the writer would
    lock, taken = counts._cond, []

    class SwapOnEnter:
        def __enter__(self) -> None:
            if not taken:  # the writer's swap, between the note's look at its dict and its taking the lock
                taken.append((counts._begun, counts._ended))
                counts._begun, counts._ended = {}, {}
            lock.__enter__()

        def __exit__(self, *exc: object) -> None:
            lock.__exit__(*exc)

        def notify(self) -> None:
            lock.notify()

    counts._cond = SwapOnEnter()  # type: ignore[assignment]
    counts.end("m")
    assert counts._ended == {"m": 1} and taken == [({}, {})], (counts._ended, taken)  # noted for the next pass
