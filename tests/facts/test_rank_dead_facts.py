"""A cluster engine that lost a rank, read from the lab and planned (issue 43 item 1).

tests/facts/samples/lab-cluster-{head,worker}-rank-dead.txt are the `state` set read over SSH from the two lab
nodes of a torchrun cluster deployment (vllm-sim, SIMULATED engine; the watcher off: `--set
guard.watch.enabled=false`) 47 s after the worker's rank process was killed inside its container (`kill -9` of
serve_torchrun.py; the container stayed): the head's engine died
(`engine dead: RankFailure`, /health 503, Docker marks it unhealthy), the worker's torchrun exited and Docker's
restart policy keeps bringing it back alone. `up`'s plan must restart the group, naming why."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sparkdeploy.deploy.plan import StepKind, plan_deployment
from sparkdeploy.facts import parse, parse_sections
from sparkdeploy.facts.catalog import DOCTOR, STATE
from tests.deploy.deploy_helpers import converged_facts, make_deployment

SAMPLES = Path(__file__).parent / "samples"
HEAD = (SAMPLES / "lab-cluster-head-rank-dead.txt").read_text()
WORKER = (SAMPLES / "lab-cluster-worker-rank-dead.txt").read_text()
DOCTOR_SAMPLE = (SAMPLES / "lab-node-doctor.txt").read_text()


def test_the_samples_are_the_state_set_and_every_doctor_fact_has_a_real_sample():
    assert set(parse_sections(HEAD)) == set(STATE) == set(parse_sections(WORKER))
    every = parse_sections((SAMPLES / "lab-every-fact.txt").read_text())  # manifests (doctor's stack ports)
    assert set(DOCTOR) == set(parse_sections(DOCTOR_SAMPLE)) | set(STATE) | ({"manifests", "guard_status"} & set(every))


def test_the_unhealthy_head_its_first_failure_and_why_its_engine_died():
    f = parse("spark1", HEAD)
    engine, guard = f.container("sparkdeploy-vllm"), f.container("sparkdeploy-guard")
    assert engine is not None and guard is not None
    assert engine.running and engine.health == "unhealthy"
    # The rank was killed at 22:44:44; read at 22:45:31 the health log holds the last 5 probes (all failed, the
    # oldest at 22:45:04.9) of a failing streak of 8: three more, 5.17 s apart, go back to 22:44:49.4.
    assert engine.failing_since is not None
    assert abs((engine.failing_since - datetime(2026, 11, 27, 22, 44, 49, 400000, tzinfo=UTC)).total_seconds()) < 0.1
    assert engine.health_output == "HTTP Error 503: Service Unavailable"
    assert guard.health == "" and guard.failing_since is None  # no health check on the guard
    # from the words that say it on (the log line's prefix, time and logger, left out)
    assert f.engine_errors["sparkdeploy-vllm"].startswith("engine dead: RankFailure: broadcast to the other ranks")


def test_the_worker_rank_restarted_alone_after_the_group_started():
    w = parse("spark2", WORKER).container("sparkdeploy-vllm")
    h = parse("spark1", HEAD).container("sparkdeploy-vllm")
    assert w is not None and h is not None
    assert w.running and w.restarts == 7 and w.health == ""  # its 7th restart, running alone
    assert w.finished_at > h.started_at  # same format: the worker's last exit came after the head's start
    assert parse("spark2", WORKER).engine_errors == {}


def _with_real_state(dep, name: str, text: str):
    """converged facts (the deployment's files and config hashes) with the lab's real container state."""
    f = converged_facts(dep, name)
    real = parse(name, text)
    for c in f.containers:
        have = real.container(c.name)
        for field in ("status", "running", "restarting", "exit_code", "started_at", "finished_at", "restarts"):
            setattr(c, field, getattr(have, field))
        c.health, c.failing_since, c.health_output = have.health, have.failing_since, have.health_output
    f.engine_errors = real.engine_errors
    return f


def _starts(plan):
    return {s.node: s for s in plan.steps if s.kind == StepKind.START_CONTAINER}


def test_up_restarts_the_group_that_lost_a_rank_naming_the_rank_and_the_time():
    dep = make_deployment("cluster")
    facts = {"spark1": _with_real_state(dep, "spark1", HEAD), "spark2": _with_real_state(dep, "spark2", WORKER)}
    starts = _starts(plan_deployment(dep, facts))
    assert all(s.change for s in starts.values())
    for s in starts.values():
        assert s.reason.startswith("restart group: rank 1 (spark2) exited at 22:45:23 UTC while the group served")
    assert "7 restart(s) since" in starts["spark2"].reason
    assert "(and: unhealthy since 22:44:49 UTC: engine dead: RankFailure" in starts["spark1"].reason


def test_up_restarts_the_group_whose_head_stopped_answering_while_every_container_runs():
    """The Ray case: the worker's container (ray start --block) stays up, its rank (an actor) died."""
    dep = make_deployment("cluster")
    facts = {"spark1": _with_real_state(dep, "spark1", HEAD), "spark2": converged_facts(dep, "spark2")}
    starts = _starts(plan_deployment(dep, facts))
    assert starts["spark2"].change and starts["spark1"].change
    want = "restart group: spark1's head unhealthy since 22:44:49 UTC: engine dead: RankFailure: broadcast"
    assert starts["spark1"].reason.startswith(want) and starts["spark2"].reason.startswith(want)


def test_a_healthy_group_and_a_healthy_solo_are_untouched():
    for topology in ("cluster", "solo", "2xsolo"):
        dep = make_deployment(topology)
        facts = {n.name: converged_facts(dep, n.name) for n in dep.inventory.nodes}
        for f in facts.values():
            for c in f.containers:
                c.health = "healthy"
        assert plan_deployment(dep, facts).changes == 0, topology


def test_an_unhealthy_solo_engine_restarts_alone_with_why():
    dep = make_deployment("2xsolo")
    facts = {n.name: converged_facts(dep, n.name) for n in dep.inventory.nodes}
    c = facts["spark2"].container("sparkdeploy-vllm")
    assert c is not None
    c.health, c.failing_since, c.health_output = "unhealthy", datetime(2026, 1, 1, 9, 5, tzinfo=UTC), "timed out"
    plan = plan_deployment(dep, facts)
    changed = [s for s in plan.steps if s.change]
    assert [(s.node, s.target) for s in changed] == [("spark2", "sparkdeploy-vllm")]
    assert changed[0].reason == "unhealthy since 09:05:00 UTC: timed out"


def test_an_engine_that_served_and_answers_503_restarts_before_docker_marks_it_unhealthy():
    """The Ray case a few seconds after the rank died: Docker still says `healthy` (3 failures flip it), but the
    last probe got 503, which an engine answers only when it is dead: `up` restarts the group at once."""
    dep = make_deployment("cluster")
    facts = {n.name: converged_facts(dep, n.name) for n in dep.inventory.nodes}
    head = facts["spark1"].container("sparkdeploy-vllm")
    assert head is not None
    head.health, head.health_output = "healthy", "HTTP Error 503: Service Unavailable"
    head.failing_since = datetime(2026, 1, 1, 9, 5, tzinfo=UTC)
    starts = _starts(plan_deployment(dep, facts))
    assert starts["spark1"].change and starts["spark2"].change
    assert starts["spark1"].reason.startswith("restart group: spark1's head unhealthy since 09:05:00 UTC")
    head.health_output = "timed out"  # one slow answer is no death: left alone until Docker counts 3
    assert not any(s.change for s in _starts(plan_deployment(dep, facts)).values())
    # dead before Docker's first passing probe: Docker says `starting` (for its 30-minute start period); the
    # engine's own words in its log say it died (a 503 while ranks still join is no death)
    head.health, head.health_output = "starting", "HTTP Error 503: Service Unavailable"
    assert not any(s.change for s in _starts(plan_deployment(dep, facts)).values())
    facts["spark1"].engine_errors = {"sparkdeploy-vllm": "engine dead: RankFailure: a Ray worker rank failed"}
    starts = _starts(plan_deployment(dep, facts))
    assert starts["spark1"].change and "engine dead: RankFailure" in starts["spark1"].reason
