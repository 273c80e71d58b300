"""On-demand stack members in the shared lab (issue 40, slice a): `up --stack` prepares an on-demand member
without starting it (its engine container created, not running: real `docker create` on the lab node), routes the
always-on one, answers the cold model 503 naming why, `status` shows each member cold or warm, a second `up`
changes nothing, `down` leaves nothing. The engines are vllm-sim (SIMULATED: no GPU math)."""

from __future__ import annotations

import json
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
     on_demand: true, idle_timeout: 10s}
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


@pytest.fixture(scope="module")
def inv(lab) -> str:
    path = str(lab.spec.inventory_path)
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)
    yield path
    sd("down", "--keys", "-i", path)


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
    assert members["coder"]["on_demand"] and members["coder"]["idle_timeout_s"] == 10
    r = sd("status", "-i", inv)
    assert "member coder (qwen3-coder-30b, on demand, idle timeout 10 s): cold: on demand, not running" in r.stdout

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
    t0 = time.monotonic()
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
    answer = client.chat.completions.create(  # warm: answered at once
        model="qwen3-coder-30b", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    print(f"cold start through the gateway, held request answered after {held_s:.1f} s (SIMULATED engine)")

    # idle for its timeout (10 s): stopped by its node's activator, its memory freed; status says cold again
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
    assert (state("coder"), state("small")) == ("exited", "running")
    logs = lab.ssh(spark1, "docker logs sparkdeploy-guard 2>&1 | grep 'activate' | tail -6").stdout
    assert "activate: coder:spark1: evict: stop coder (least recently used first) to start small" in logs, logs
    assert "running chat 0.45 (always on), coder 0.45 (idle); small needs 0.45" in logs, logs
    members = {name: m["state"] for name, m in settled(inv).items()}
    assert members == {"chat": "warm", "coder": "cold", "small": "warm"}, members

    r = sd("down", "-i", inv)
    assert r.returncode == 0, failure(r)
    left = lab.ssh(spark1, "docker ps -a --filter label=io.sparkdeploy.deployment --format '{{.Names}}'").stdout
    assert left.strip() == "", left
