"""On-demand stack members in the shared lab (issue 40, slice a): `up --stack` prepares an on-demand member
without starting it (its engine container created, not running: real `docker create` on the lab node), routes the
always-on one, answers the cold model 503 naming why, `status` shows each member cold or warm, a second `up`
changes nothing, `down` leaves nothing. The engines are vllm-sim (SIMULATED: no GPU math)."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from sparkdeploy.config.secrets import parse_env_file
from tests.support.cli_process import failure
from tests.support.cli_process import sd as run_cli_process

pytestmark = pytest.mark.lab

STACK = """
deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.45}
  - {name: coder, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark1], memory: 0.45, port: 8001,
     on_demand: true, idle_timeout: 20s}
"""


def sd(*args: str, timeout: float = 900):
    return run_cli_process(*args, timeout=timeout)


def settled(inv: str, within: float = 90) -> dict:
    """`status --json`'s members once none is starting (Docker's health check runs every few seconds)."""
    deadline = time.monotonic() + within
    while True:
        r = sd("status", "-i", inv, "--json")
        members = {m["deployment"]: m for m in json.loads(r.stdout)["members"]}
        if all(m["state"] != "starting" for m in members.values()) or time.monotonic() > deadline:
            return members
        time.sleep(3)


def test_up_prepares_an_on_demand_member_without_starting_it(lab, inv, tmp_path):
    stack = tmp_path / "stack.yaml"
    stack.write_text(STACK)
    r = sd("up", "--stack", str(stack), "-i", inv, "--timeout", "240", "--json")
    assert r.returncode == 0, failure(r)
    first = json.loads(r.stdout)
    assert first["routes"]["cold"] == ["coder"] and first["routes"]["served"] == ["glm-4.7-flash"]
    coder = next(u for u in first["units"] if u["deployment"] == "coder")
    (create,) = [s for s in coder["steps"] if s["step"] in ("create-container", "start-container")]
    assert create["step"] == "create-container" and create["status"] == "changed", create
    assert create["detail"].startswith("created ") and create["detail"].endswith(", not started"), create

    # the engine container exists on spark1 as rendered, created and never started (a second reader: docker)
    spark1 = lab.nodes[0]
    out = lab.ssh(
        spark1, "docker inspect --format '{{.State.Status}} {{.State.StartedAt}}' sparkdeploy-coder-vllm"
    ).stdout
    assert out.split()[0] == "created" and out.split()[1].startswith("0001-01-01"), out

    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"]
    client = openai.OpenAI(base_url=f"http://{spark1.mgmt_ip}:4000/v1", api_key=key, max_retries=0, timeout=60)
    assert {m.id for m in client.models.list()} == {"glm-4.7-flash"}
    answer = client.chat.completions.create(
        model="glm-4.7-flash", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    r = sd("status", "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    data = json.loads(r.stdout)
    assert data["healthy"], data  # a cold member's created container is not a failure
    members = {m["deployment"]: m for m in data["members"]}
    assert (members["chat"]["state"], members["coder"]["state"]) == ("warm", "cold"), members
    assert members["coder"]["on_demand"] and members["coder"]["idle_timeout_s"] == 20
    r = sd("status", "-i", inv)
    assert "member coder (qwen3-coder-30b, on demand, idle timeout 20 s): cold: on demand, not running" in r.stdout

    r = sd("up", "--stack", str(stack), "-i", inv, "--timeout", "240", "--json")
    assert r.returncode == 0, failure(r)
    assert json.loads(r.stdout)["changed"] == 0

    r = sd("top", "--deployment", "coder", "--once", "-i", inv)  # not `run up first`: it is cold, on demand
    assert r.returncode == 1 and "deployment coder is on demand and cold (not running)" in r.stderr, failure(r)

    # nothing on the nodes started it meanwhile (the node's watcher leaves a never-started container alone)
    out = lab.ssh(spark1, "docker inspect --format '{{.State.Status}}' sparkdeploy-coder-vllm").stdout
    assert out.strip() == "created", out

    # a streamed request for the cold model is held at the gateway, its node's activator starts the engine, and
    # the request is answered once the watcher says it serves
    t0, t_sent = time.monotonic(), time.time()
    stream = client.chat.completions.create(
        model="qwen3-coder-30b",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
        timeout=240,
    )
    chunks = list(stream)
    held_s = time.monotonic() - t0
    assert any(c.choices and c.choices[0].delta.content for c in chunks), chunks
    out = lab.ssh(spark1, "docker inspect --format '{{.State.Status}}' sparkdeploy-coder-vllm").stdout
    assert out.strip() == "running", out
    logs = lab.ssh(spark1, "docker logs sparkdeploy-guard 2>&1 | grep -E 'activate|on demand' | tail -5").stdout
    assert "activate: coder:spark1: start: on demand: 1 request(s) held at the gateway" in logs, logs
    members = settled(inv)  # warm once Docker's health check says healthy (its interval)
    assert members["coder"]["state"] == "warm", members
    # its last request (the held one, as the gateway counted it and its watcher published it) and its idle time
    coder = members["coder"]
    assert coder["last_request"] is not None and t_sent - 1 <= coder["last_request"] <= time.time(), coder
    assert coder["busy"] == 0 and 0 <= coder["idle_s"] <= time.time() - t_sent + 1, coder
    answer = client.chat.completions.create(  # warm: answered at once
        model="qwen3-coder-30b", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    print(f"cold start through the gateway, held request answered after {held_s:.1f} s (SIMULATED engine)")

    # idle for its timeout (20 s): stopped by its node's activator, its memory freed; status says cold again
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = lab.ssh(spark1, "docker inspect --format '{{.State.Status}}' sparkdeploy-coder-vllm").stdout.strip()
        if out == "exited":
            break
        time.sleep(2)
    assert out == "exited", out
    logs = lab.ssh(spark1, "docker logs sparkdeploy-guard 2>&1 | grep 'activate' | tail -3").stdout
    assert "activate: coder:spark1: stop: on demand: idle for" in logs, logs
    r = sd("status", "-i", inv, "--json")
    members = {m["deployment"]: m for m in json.loads(r.stdout)["members"]}
    assert members["coder"]["state"] == "cold", members
    stop = members["coder"]["decision"]  # the idle stop with its figures, in status and in the gateway's log
    assert stop["action"] == "stop" and stop["idle_timeout"] == 20 and 20 <= stop["idle_s"] < 40, stop
    gw_log = lab.ssh(spark1, "docker logs sparkdeploy-gateway-litellm 2>&1 | grep 'on-demand ' || true").stdout
    assert gw_log.count("on-demand stop coder:spark1: on demand: idle for") == 1, gw_log

    r = sd("down", "-i", inv)
    assert r.returncode == 0, failure(r)
    left = lab.ssh(spark1, "docker ps -a --filter label=io.sparkdeploy.deployment --format '{{.Names}}'").stdout
    assert left.strip() == "", left


EVICT = """
deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.45}
  - {name: coder, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark1], memory: 0.45, port: 8001,
     on_demand: true, idle_timeout: 10m}
  - {name: small, recipe: openai-gpt-oss-20b, topology: solo, nodes: [spark1], memory: 0.45, port: 8002,
     on_demand: true, idle_timeout: 10m, start_timeout: 1s}
gateway: {hold: 4m}
"""


def test_a_start_that_does_not_fit_evicts_the_least_recently_used_idle_member(lab, inv, tmp_path):
    """Also the hold from the stack file (routes.json, read by the gateway's hook): a request arriving during a
    start is held and answered; one past its member's start_timeout is refused 503 with Retry-After."""
    stack = tmp_path / "stack.yaml"
    stack.write_text(EVICT)
    r = sd("up", "--stack", str(stack), "-i", inv, "--timeout", "240", "--json")
    assert r.returncode == 0, failure(r)
    assert sorted(json.loads(r.stdout)["routes"]["cold"]) == ["coder", "small"]
    spark1 = lab.nodes[0]
    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"]
    client = openai.OpenAI(base_url=f"http://{spark1.mgmt_ip}:4000/v1", api_key=key, max_retries=0, timeout=240)

    def ask(model: str) -> None:
        answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert answer.usage is not None and answer.usage.completion_tokens > 0

    def state(name: str) -> str:
        return lab.ssh(
            spark1, f"docker inspect --format '{{{{.State.Status}}}}' sparkdeploy-{name}-vllm"
        ).stdout.strip()

    def starts() -> int:
        return int(
            lab.ssh(
                spark1, "docker logs sparkdeploy-guard 2>&1 | grep -c 'activate: coder:spark1: start' || true"
            ).stdout
        )

    # coder starts on the first request (the stack's hold: 4 m); a second request arriving during its start is
    # held too, and both are answered (0.45 beside chat's 0.45 fits)
    before = starts()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, "qwen3-coder-30b")
        time.sleep(0.2)  # the cold start through the gateway is ~0.8 s (SIMULATED engine), polls shortened
        assert not first.done(), "coder answered within 0.2 s of a cold start: no start to arrive during"
        second = pool.submit(ask, "qwen3-coder-30b")
        first.result(), second.result()
    assert (state("coder"), state("small")) == ("running", "created")
    assert starts() == before + 1  # one start for both requests

    # small's start_timeout (1 s) is shorter than its start (coder is evicted first): 503, Retry-After, one line
    t_small = time.time()
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(
            model="openai/gpt-oss-20b", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "30"
    assert "model openai/gpt-oss-20b is starting (on demand) and was not ready within 1 s (" in str(refused.value)
    assert "): retry in 30 s" in str(refused.value), str(refused.value)
    deadline = time.monotonic() + 120  # a client retrying: each held 1 s, the activator starts small meanwhile
    while True:
        try:
            ask("openai/gpt-oss-20b")
            break
        except openai.APIStatusError as exc:
            assert exc.status_code == 503 and time.monotonic() < deadline, exc
    # small did not fit beside chat and coder: coder (idle, least recently used) was stopped first
    t_answered = time.time()
    assert (state("coder"), state("small")) == ("exited", "running")
    logs = lab.ssh(spark1, "docker logs sparkdeploy-guard 2>&1 | grep 'activate' | tail -6").stdout
    assert "activate: coder:spark1: evict: stop coder (least recently used first) to start small" in logs, logs
    assert "running chat 0.45 (always on), coder 0.45 (idle); small needs 0.45" in logs, logs
    rows = settled(inv)
    members = {name: m["state"] for name, m in rows.items()}
    assert members == {"chat": "warm", "coder": "cold", "small": "warm"}, members

    # status names each decision with its figures: small started once coder (idle) was stopped for it, beside
    # chat (always on); coder evicted for small; each member's last request and small's idle time
    start, evicted = rows["small"]["decision"], rows["coder"]["decision"]
    assert start["action"] == "start" and start["stopped"] == ["coder"], start
    fig = start["figures"]
    assert (fig["node"], fig["member"], fig["needs"]) == ("spark1", "small", 0.45), fig
    assert 0.9 <= fig["room"] < 1.35, fig  # small fits beside chat alone, not beside chat and coder
    assert fig["running"] == [{"deployment": "chat", "share": 0.45, "kept": "always on"}], fig
    assert evicted["action"] == "stop" and evicted["evicted_for"] == "small", evicted
    assert {"deployment": "coder", "share": 0.45, "kept": "idle"} in evicted["figures"]["running"], evicted
    assert t_small - 1 <= rows["small"]["last_request"] <= t_answered + 1, rows["small"]
    assert rows["coder"]["last_request"] <= t_small and rows["coder"]["idle_s"] is None, rows["coder"]
    assert 0 <= rows["small"]["idle_s"] <= time.time() - t_small + 1, rows["small"]
    text = sd("status", "-i", inv).stdout
    assert "  last decision: started " in text and ", coder stopped for it: spark1: small needs 0.45, room " in text
    assert "beside chat 0.45 (always on)" in text and "  last decision: evicted " in text, text
    assert re.search(r"member small \(openai/gpt-oss-20b, .*; last request \d+ s ago, idle \d+ s of 600 s", text), text
    # the gateway's log: one line per decision (over its workers), no traceback
    gw_log = lab.ssh(spark1, "docker logs sparkdeploy-gateway-litellm 2>&1").stdout
    lines = [ln for ln in gw_log.splitlines() if "on-demand " in ln]
    evict = [ln for ln in lines if "on-demand evict small:spark1: stop coder (least recently used first)" in ln]
    assert len(evict) == 1 and "running chat 0.45 (always on), coder 0.45 (idle); small needs 0.45" in evict[0], lines
    assert len([ln for ln in lines if "on-demand stop coder:spark1: on demand: evicted for small: " in ln]) == 1
    assert len([ln for ln in lines if "on-demand start small:spark1: " in ln and "stopped for it: coder" in ln]) == 1
    assert "Traceback" not in gw_log and key not in gw_log

    r = sd("down", "-i", inv)
    assert r.returncode == 0, failure(r)
    left = lab.ssh(spark1, "docker ps -a --filter label=io.sparkdeploy.deployment --format '{{.Names}}'").stdout
    assert left.strip() == "", left


ACROSS = """
deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.45}
  - {name: right, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark2], memory: 0.5, port: 8001,
     on_demand: true, idle_timeout: 10m}
  - {name: dist, recipe: openai-gpt-oss-120b, topology: cluster, nodes: [spark1, spark2], memory: 0.45,
     port: 8003, on_demand: true, idle_timeout: 10m}
"""


def test_a_start_across_two_nodes_evicts_the_idle_member_led_from_the_other_node(lab, inv, tmp_path):
    """A tensor-parallel on-demand member over spark1 and spark2 (rank 0 on spark1) is budgeted on both: it fits
    beside chat on spark1, not beside right on spark2 (0.5 + 0.45), so right, led from spark2, is stopped first,
    by spark2's own activator reading dist's published eviction; then both of dist's ranks start."""
    stack = tmp_path / "stack.yaml"
    stack.write_text(ACROSS)
    r = sd("up", "--stack", str(stack), "-i", inv, "--timeout", "240", "--json")
    assert r.returncode == 0, failure(r)
    assert sorted(json.loads(r.stdout)["routes"]["cold"]) == ["dist", "right"]
    spark1, spark2 = lab.nodes[0], lab.nodes[1]
    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"]
    client = openai.OpenAI(base_url=f"http://{spark1.mgmt_ip}:4000/v1", api_key=key, max_retries=0, timeout=240)

    def ask(model: str) -> None:
        answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert answer.usage is not None and answer.usage.completion_tokens > 0

    def states(node, *names: str) -> list[str]:
        fmt = "'{{.Names}} {{.State}}'"
        out = lab.ssh(node, f"docker ps -a --filter label=io.sparkdeploy.deployment --format {fmt}").stdout
        return sorted(line for line in out.splitlines() if any(n in line for n in names))

    ask("qwen3-coder-30b")  # right starts alone on spark2
    ask("openai/gpt-oss-120b")  # dist needs spark2 too: right (idle) stopped first, by spark2's activator
    logs1 = lab.ssh(spark1, "docker logs sparkdeploy-guard 2>&1 | grep 'activate: dist' | tail -5").stdout
    logs2 = lab.ssh(spark2, "docker logs sparkdeploy-guard 2>&1 | grep 'activate: right' | tail -5").stdout
    assert "activate: dist:spark1: evict (led from another node): stop right (least recently used first)" in logs1
    assert "spark2: room " in logs1 and "running right 0.5 (idle); dist needs 0.45" in logs1, logs1
    assert "activate: right:spark2: stop: on demand: evicted for dist (decided by its activator on spark1)" in logs2
    out = lab.ssh(spark2, "docker inspect --format '{{.State.Status}}' sparkdeploy-right-vllm").stdout.strip()
    assert out == "exited", (out, logs2)
    assert "activate: dist:spark1: start: on demand:" in logs1, logs1
    assert all(line.endswith(" running") for line in states(spark1, "dist") + states(spark2, "dist")), (
        states(spark1, "dist"),
        states(spark2, "dist"),
    )

    r = sd("down", "-i", inv)
    assert r.returncode == 0, failure(r)
    for node in (spark1, spark2):
        left = lab.ssh(node, "docker ps -a --filter label=io.sparkdeploy.deployment --format '{{.Names}}'").stdout
        assert left.strip() == "", left
