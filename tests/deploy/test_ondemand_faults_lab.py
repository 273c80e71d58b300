"""On-demand stack members' faults in the shared lab (issue 40, item 5 and item 3's keys): requests the gateway
refuses start nothing and count nothing, nor does a client that hangs up while held; the gateway restarted while a
member starts (its held request answered 503 at once, a retry answered); the gateway killed with requests held
(dropped, a retry answered, no count left behind by the dead workers, which would keep the member from its idle
stop for ever); the warm engine killed (a crash: Docker restarts it with the policy the idle stop took and the
start gave back, the watcher does not read it as a rank stopped on purpose, the next request is answered). After
each, nothing runs that `status` does not show. The engines are vllm-sim (SIMULATED: no GPU math). The tests run in
order on one stack."""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

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
     on_demand: true, idle_timeout: 15s}
gateway: {hold: 4m}
"""
CODER, CHAT = "qwen3-coder-30b", "glm-4.7-flash"
HI = [{"role": "user", "content": "hi"}]


def sd(*args: str, timeout: float = 900) -> Any:
    return run_cli_process(*args, timeout=timeout)


@pytest.fixture(scope="module")
def stack(lab, inv, tmp_path_factory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("faults") / "stack.yaml"
    path.write_text(STACK)
    r = sd("up", "--stack", str(path), "-i", inv, "--timeout", "240", "--json")
    assert r.returncode == 0, failure(r)
    assert json.loads(r.stdout)["routes"]["cold"] == ["coder"]
    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"]
    base = f"http://{lab.nodes[0].mgmt_ip}:4000"
    admin = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=240)
    return {"inv": inv, "base": base, "admin": admin}


def on_node(lab, command: str) -> str:
    r = lab.docker_exec(lab.nodes[0], "sh", "-c", command)
    assert r.returncode == 0, r.stderr
    return str(r.stdout).strip()


def engine(lab, name: str = "coder") -> dict[str, Any]:
    out = on_node(
        lab,
        f"docker inspect --format '{{{{json .State}}}} {{{{.RestartCount}}}} {{{{.HostConfig.RestartPolicy.Name}}}}' "
        f"sparkdeploy-{name}-vllm",
    )
    state, restarts, policy = out.rsplit(" ", 2)
    return dict(json.loads(state), restarts=int(restarts), policy=policy)


def demand(base: str) -> dict[str, Any]:
    """The gateway's demand for coder, as the activators read it (GET /sparkdeploy/demand, no key)."""
    with urllib.request.urlopen(f"{base}/sparkdeploy/demand", timeout=5) as resp:
        return dict(json.loads(resp.read())["members"]["coder"])


def drained(base: str, within: float = 10) -> dict[str, Any]:
    """The demand once nothing is held or in flight (an answered request's end is counted just after its answer
    is sent), or as it is after `within` s."""
    deadline = time.monotonic() + within
    while True:
        seen = demand(base)
        if (seen["waiting"], seen["in_flight"]) == (0, 0) or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)


def activations(lab) -> str:
    return on_node(lab, "docker logs sparkdeploy-guard 2>&1 | grep -E 'activate: coder|watch: coder' || true")


def members(inv: str) -> dict[str, str]:
    r = sd("status", "-i", inv, "--json")
    return {m["deployment"]: m["state"] for m in json.loads(r.stdout)["members"]}


def settled(inv: str, want: dict[str, str], within: float = 90) -> dict[str, str]:
    deadline = time.monotonic() + within
    while True:
        seen = members(inv)
        if seen == want or time.monotonic() > deadline:
            return seen
        time.sleep(2)


def nothing_unseen(lab, inv: str) -> None:
    """The engines (containers of a watched group) running on the node are those of the members `status` calls
    warm, and no other."""
    running = set(on_node(lab, "docker ps --filter label=io.sparkdeploy.group --format '{{.Names}}'").split())
    warm = {f"sparkdeploy-{name}-vllm" for name, state in members(inv).items() if state == "warm"}
    assert running == warm, (running, warm)


def key(inv: str, name: str, *flags: str) -> openai.OpenAI:
    sd("keys", "revoke", name, "-i", inv)  # a previous run's
    r = sd("keys", "create", name, *flags, "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    return json.loads(r.stdout)["key"]


def test_a_refused_key_starts_nothing_and_counts_nothing(lab, stack):
    """A key limited to another model (403), one past its budget or its rpm (429): refused before the hold, so
    the cold member is not started and its demand (what its activator reads) is untouched."""
    inv, base = stack["inv"], stack["base"]
    before = demand(base)
    assert (before["waiting"], before["in_flight"]) == (0, 0), before

    def client(token: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0, timeout=30)

    other = client(key(inv, "e40-other", "--models", CHAT))
    with pytest.raises(openai.PermissionDeniedError, match=f"may not use model {CODER}"):
        other.chat.completions.create(model=CODER, messages=HI)
    rpm = client(key(inv, "e40-rpm", "--rpm", "1"))
    rpm.chat.completions.create(model=CHAT, messages=HI, max_tokens=4)  # its one request of the minute
    with pytest.raises(openai.RateLimitError, match="requests per minute"):
        rpm.chat.completions.create(model=CODER, messages=HI)
    spent = client(key(inv, "e40-spent", "--max-budget", "1"))
    spent.chat.completions.create(model=CHAT, messages=HI, max_tokens=4)  # more than its 1 token
    time.sleep(1)  # counted just after the answer is sent
    with pytest.raises(openai.RateLimitError, match="budget exceeded"):
        spent.chat.completions.create(model=CODER, messages=HI)
    time.sleep(3)  # three looks of coder's activator
    assert engine(lab)["Status"] == "created", engine(lab)
    assert demand(base) == before, (demand(base), before)  # no request held, in flight, or last
    assert "activate: coder" not in activations(lab)
    assert members(inv)["coder"] == "cold"


def test_a_held_client_that_hangs_up_starts_nothing(lab, stack):
    """A client that gives up while its request is held for a cold member's start (its node's guard paused, so
    that the start cannot win the race) is counted out at once, not at the end of its hold (4 m here): the member
    is then not started for nobody, and the gateway's log says so in one line."""
    inv, base, admin = stack["inv"], stack["base"], stack["admin"]
    assert engine(lab)["Status"] == "created", engine(lab)
    impatient = admin.with_options(timeout=3)
    on_node(lab, "docker pause sparkdeploy-guard")
    try:
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(model=CODER, messages=HI, max_tokens=4)
        seen = drained(base, within=3)
    finally:
        on_node(lab, "docker unpause sparkdeploy-guard")
    assert (seen["waiting"], seen["in_flight"]) == (0, 0), seen
    time.sleep(3)  # three looks of coder's activator, which would start it for a request still counted
    assert engine(lab)["Status"] == "created", (engine(lab), activations(lab))
    assert "activate: coder" not in activations(lab)
    log = on_node(lab, "docker logs sparkdeploy-gateway-litellm 2>&1 | grep 'the client hung up' || true")
    assert len(log.splitlines()) == 1 and "HTTP 499" in log and f"model {CODER}: the client hung up after " in log, log
    assert members(inv)["coder"] == "cold"


def retried(client: openai.OpenAI, within: float = 180) -> Any:
    """A client retrying: connection refused while Docker restarts the gateway, a 503 while the member starts,
    then held and answered."""
    deadline = time.monotonic() + within
    while True:
        try:
            return client.chat.completions.create(model=CODER, messages=HI, max_tokens=4)
        except (openai.APIConnectionError, openai.InternalServerError) as exc:
            assert not isinstance(exc, openai.InternalServerError) or exc.status_code == 503, exc
            assert time.monotonic() < deadline, exc
            time.sleep(1)


def kill(lab, container: str) -> None:
    """SIGKILL of the container's main process (a crash: not `docker stop`, so its restart policy applies)."""
    on_node(lab, f"kill -KILL \"$(docker inspect --format '{{{{.State.Pid}}}}' {container})\"")


def test_the_gateway_restarted_while_a_request_is_held(lab, stack):
    """`docker restart` of the gateway while a request is held for the member's start (its node's guard paused
    meanwhile, so that the start cannot win the race): the request is answered the one clear 503 at once, not
    dropped when Docker kills the worker 10 s after its SIGTERM; a retry starts the member and is answered; it is
    stopped when idle (restart policy `no`), as `status` then says."""
    inv, base, admin = stack["inv"], stack["base"], stack["admin"]
    on_node(lab, "docker pause sparkdeploy-guard")
    try:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(admin.chat.completions.create, model=CODER, messages=HI, max_tokens=4)
            deadline = time.monotonic() + 30
            while demand(base)["waiting"] != 1:
                assert time.monotonic() < deadline and not held.done(), demand(base)
                time.sleep(0.2)
            asked = time.monotonic()
            on_node(lab, "docker restart sparkdeploy-gateway-litellm")
            with pytest.raises(openai.InternalServerError) as refused:
                held.result(timeout=60)
            took = time.monotonic() - asked
    finally:
        on_node(lab, "docker unpause sparkdeploy-guard")
    assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "30", refused.value
    assert f"model {CODER} is starting (on demand) and the gateway is restarting: retry in 30 s" in str(refused.value)
    assert took < 9, took  # before Docker kills the worker (10 s after its SIGTERM)
    answer = retried(admin)
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    seen = drained(base)
    assert (seen["waiting"], seen["in_flight"]) == (0, 0), seen
    assert settled(inv, {"chat": "warm", "coder": "warm"}) == {"chat": "warm", "coder": "warm"}
    nothing_unseen(lab, inv)
    deadline = time.monotonic() + 90  # idle for its timeout: stopped, with restart policy `no`
    while engine(lab)["Status"] != "exited":
        assert time.monotonic() < deadline, (engine(lab), demand(base), activations(lab))
        time.sleep(2)
    assert engine(lab)["policy"] == "no"
    assert "activate: coder:spark1: stop: on demand: idle for" in activations(lab)
    assert settled(inv, {"chat": "warm", "coder": "cold"}) == {"chat": "warm", "coder": "cold"}
    nothing_unseen(lab, inv)


def test_the_gateway_killed_with_held_requests_then_the_warm_engine_crashes(lab, stack):
    """Started again after its idle stop: an rpm-limited key's two held requests count in its minute (429 for a
    third); the gateway's main process killed while they are held (both dropped at once, never a hang or a 500),
    a retry answered, and the killed workers' counts not counted (else the member is never stopped as idle).
    Then the warm engine killed (not `docker stop`): Docker restarts it with the policy the start gave back, its
    watcher does not stop it as held, the next request is answered, `status` says warm."""
    inv, base, admin = stack["inv"], stack["base"], stack["admin"]
    user = openai.OpenAI(base_url=f"{base}/v1", api_key=key(inv, "e40-held", "--rpm", "2"), max_retries=0, timeout=240)
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(user.chat.completions.create, model=CODER, messages=HI, max_tokens=4) for _ in range(2)]
        time.sleep(0.3)  # both admitted (and counted in the key's minute), held for the start
        with pytest.raises(openai.RateLimitError, match="2 requests per minute"):  # the two held ones counted
            user.chat.completions.create(model=CODER, messages=HI, max_tokens=4)
        assert not any(f.done() for f in held), "answered at once from a cold start: nothing held"
        killed = time.monotonic()
        kill(lab, "sparkdeploy-gateway-litellm")
        for f in held:
            with pytest.raises(openai.APIConnectionError):
                f.result(timeout=30)
        assert time.monotonic() - killed < 30
    answer = retried(admin)
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    seen = drained(base)
    assert (seen["waiting"], seen["in_flight"]) == (0, 0), seen  # nothing left by the killed workers
    up = engine(lab)
    assert up["Running"] and up["policy"] == "unless-stopped", up  # given back by the start
    assert settled(inv, {"chat": "warm", "coder": "warm"}) == {"chat": "warm", "coder": "warm"}

    kill(lab, "sparkdeploy-coder-vllm")
    deadline = time.monotonic() + 60
    while engine(lab)["restarts"] == up["restarts"] or not engine(lab)["Running"]:  # Docker's restart policy
        assert time.monotonic() < deadline, (engine(lab), activations(lab))
        time.sleep(1)
    answer = admin.chat.completions.create(model=CODER, messages=HI, max_tokens=4)
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert settled(inv, {"chat": "warm", "coder": "warm"}) == {"chat": "warm", "coder": "warm"}
    logs = activations(lab)
    assert "stopped on purpose" not in logs and "giving up" not in logs, logs
    nothing_unseen(lab, inv)
