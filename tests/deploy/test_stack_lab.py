"""`up --stack` in the shared lab with the real OpenAI Python client: two recipes on two nodes behind one gateway
both answer; a third deployment added while the first two serve, then removed again, with requests to the first
two running the whole time (counted: none may fail); a second `up` changes nothing; `status --deployment`.
Keys: a model limit, an rpm, a budget of tokens (refused once spent, still after a restart), kept over a gateway
restart, refused within a second of `keys revoke`; `down` leaves nothing. `down --deployment` of one of three:
the gateway stops routing it before its engine stops (404, never a 500), keys refuse it, `down`'s last line says
what is left and why; a client's mistakes are 4xx with one line each in the gateway's log, no traceback. The
engines are vllm-sim (SIMULATED: no GPU math)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

import openai
import pytest

from sparkdeploy.config.secrets import parse_env_file
from tests.support.cli_process import failure
from tests.support.cli_process import sd as run_cli_process

pytestmark = pytest.mark.lab

TWO = """
deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.25}
  - {name: coder, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark2], memory: 0.3}
"""
THIRD = "  - {name: big, recipe: openai-gpt-oss-120b, topology: solo, nodes: [spark1], memory: 0.6, port: 8002}\n"
MODELS = {"chat": "glm-4.7-flash", "coder": "qwen3-coder-30b", "big": "openai/gpt-oss-120b"}


def sd(*args: str, timeout: float = 900):
    return run_cli_process(*args, timeout=timeout)


@pytest.fixture(scope="module")
def client(lab, inv) -> openai.OpenAI:
    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"]
    return openai.OpenAI(base_url=f"http://{lab.nodes[0].mgmt_ip}:4000/v1", api_key=key, max_retries=0, timeout=60)


def up(inv: str, path, text: str) -> dict:
    path.write_text(text)
    r = sd("up", "--stack", str(path), "-i", inv, "--timeout", "240", "--json")
    assert r.returncode == 0, failure(r)
    return json.loads(r.stdout)


class Traffic:
    """Requests to some models through the gateway in a loop, on threads: every outcome counted."""

    def __init__(self, client: openai.OpenAI, models: list[str]):
        self.client, self.models = client, models
        self.ok = dict.fromkeys(models, 0)
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(m,), daemon=True) for m in models for _ in range(2)]

    def _loop(self, model: str) -> None:
        while not self.stop.is_set():
            try:
                r = self.client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                assert r.model == model and r.usage.completion_tokens > 0
                self.ok[model] += 1
            except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
                self.failed.append(f"{model}: {exc.__class__.__name__}: {str(exc)[:200]}")

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        time.sleep(1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(1.0)
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def ids(client: openai.OpenAI) -> set[str]:
    return {m.id for m in client.models.list()}


def guards_per_node(inv: str) -> dict[str, int]:
    r = sd("status", "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    return {
        n["name"]: sum(1 for c in n["containers"] if c["name"] == "sparkdeploy-guard")
        for n in json.loads(r.stdout)["nodes"]
    }


def test_stack_two_recipes_then_a_third_added_and_removed_without_failed_requests(inv, client, tmp_path):
    stack = tmp_path / "stack.yaml"
    stack.write_text(
        TWO.replace("memory: 0.3}", "memory: 0.7}").replace("nodes: [spark2]", "nodes: [spark1], port: 8001")
    )
    r = sd("up", "--stack", str(stack), "-i", inv)  # 0.25 + 0.7 on one node: refused before anything starts
    assert r.returncode == 2 and "at most" in r.stderr and "memory: auto" in r.stderr, failure(r)
    r = sd("status", "-i", inv, "--json")
    assert all(not n["containers"] for n in json.loads(r.stdout)["nodes"]), r.stdout
    first = up(inv, stack, TWO)
    assert first["ok"] and ids(client) == {MODELS["chat"], MODELS["coder"]}
    for name in ("chat", "coder"):
        r = client.chat.completions.create(model=MODELS[name], messages=[{"role": "user", "content": "hi"}])
        assert r.model == MODELS[name] and r.usage.completion_tokens > 0

    again = up(inv, stack, TWO)
    assert again["changed"] == 0, again["units"]

    with Traffic(client, [MODELS["chat"], MODELS["coder"]]) as added:
        grown = up(inv, stack, TWO + THIRD)
    assert added.failed == [] and min(added.ok.values()) > 0, (added.ok, added.failed[:5])
    changed = {u["deployment"]: u["changes"] for u in grown["units"]}
    assert changed["chat"] == 0 and changed["coder"] == 0 and changed["big"] > 0, changed
    assert ids(client) == set(MODELS.values())
    r = client.chat.completions.create(model=MODELS["big"], messages=[{"role": "user", "content": "hi"}])
    assert r.model == MODELS["big"]

    r = sd("doctor", "-i", inv, "--only", "endpoint", "--json")  # each engine asked at its own port
    assert r.returncode == 0, failure(r)
    assert r.stdout.count("sparkdeploy-big-vllm (solo)") == 2 and r.stdout.count("sparkdeploy-coder-vllm") == 2

    r = sd("status", "-i", inv, "--deployment", "big", "--json")
    assert r.returncode == 0, failure(r)
    shown = [c["name"] for n in json.loads(r.stdout)["nodes"] for c in n["containers"]]
    assert shown == ["sparkdeploy-big-vllm"]  # its engine; the memory guard is the stack's, one per node
    assert guards_per_node(inv) == {"spark1": 1, "spark2": 1}  # chat and big on spark1 share one guard

    with Traffic(client, [MODELS["chat"], MODELS["coder"]]) as removed:
        shrunk = up(inv, stack, TWO)
    assert removed.failed == [] and min(removed.ok.values()) > 0, (removed.ok, removed.failed[:5])
    assert {u["deployment"]: u["action"] for u in shrunk["units"]}["big"] == "remove"
    assert ids(client) == {MODELS["chat"], MODELS["coder"]}
    with pytest.raises(openai.NotFoundError, match="not served by this gateway"):  # the gateway forgot it
        client.chat.completions.create(model=MODELS["big"], messages=[{"role": "user", "content": "hi"}])
    print(f"requests during the add: {added.ok}; during the removal: {removed.ok}; failed: 0")


def test_keys_model_limit_rpm_revoked_within_a_second_and_kept_over_a_gateway_restart(lab, inv, client, tmp_path):
    assert up(inv, tmp_path / "stack.yaml", TWO)["ok"]  # the stack of the test above: nothing to change
    sd("keys", "revoke", "alice", "-i", inv)  # a previous run's
    sd("keys", "revoke", "carol", "-i", inv)
    r = sd("keys", "create", "alice", "--models", MODELS["coder"], "--rpm", "3", "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    token = json.loads(r.stdout)["key"]
    listed = sd("keys", "list", "-i", inv, "--json")
    assert token not in listed.stdout and "alice" in listed.stdout
    stored = lab.docker_exec(lab.nodes[0], "stat", "-c", "%a", "/home/spark/.sparkdeploy-gateway/keys.json")
    assert stored.stdout.strip() == "600"
    keyfile = lab.docker_exec(lab.nodes[0], "cat", "/home/spark/.sparkdeploy-gateway/keys.json").stdout
    assert token not in keyfile and "sha256" in keyfile
    again = sd("keys", "create", "alice", "-i", inv)
    assert again.returncode == 2 and "a key of that name exists" in again.stderr
    unknown = sd("keys", "create", "bob", "--models", "no-such-model", "-i", inv)
    assert unknown.returncode == 2 and "no deployment serves no-such-model" in unknown.stderr

    user = openai.OpenAI(base_url=client.base_url, api_key=token, max_retries=0, timeout=60)
    first = time.monotonic()  # before the 1st request the rpm counts (the gateway's clock is this machine's)
    hi = [{"role": "user", "content": "hi"}]
    assert user.chat.completions.create(model=MODELS["coder"], messages=hi).model == MODELS["coder"]
    with pytest.raises(openai.PermissionDeniedError, match="may not use model"):
        user.chat.completions.create(model=MODELS["chat"], messages=hi)
    user.chat.completions.create(model=MODELS["coder"], messages=hi)
    user.chat.completions.create(model=MODELS["coder"], messages=hi)
    third = time.monotonic()  # the window holds the 3 requests made between `first` and `third`
    with pytest.raises(openai.RateLimitError, match="requests per minute"):  # the 4th within a minute
        user.chat.completions.create(model=MODELS["coder"], messages=hi)

    # a budget of 20 tokens (prompt + completion): answers until its answers have used them, then 429
    r = sd("keys", "create", "carol", "--max-budget", "20", "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    carol = openai.OpenAI(base_url=client.base_url, api_key=json.loads(r.stdout)["key"], max_retries=0, timeout=60)
    used, answered, deadline = 0, 0, time.monotonic() + 30
    while True:  # each answer is counted just after it is sent: the refusal may come one request late
        try:
            used += carol.chat.completions.create(model=MODELS["chat"], messages=hi, max_tokens=4).usage.total_tokens
            answered += 1
        except openai.RateLimitError as exc:
            assert "budget exceeded" in str(exc), exc
            break
        assert time.monotonic() < deadline, f"still answered after {answered} answers, {used} tokens"
    assert answered >= 1 and used >= 20, (answered, used)
    listed = {k["name"]: k for k in json.loads(sd("keys", "list", "-i", inv, "--json").stdout)}
    assert listed["carol"]["max_budget"] == 20 and listed["carol"]["spent"] == used, listed["carol"]

    restarted = lab.docker_exec(lab.nodes[0], "docker", "restart", "sparkdeploy-gateway-litellm")
    assert restarted.returncode == 0, restarted.stderr
    deadline = time.monotonic() + 120
    while True:  # the proxy serves again; the key's rpm window is kept over the restart (shared by the workers)
        asked = time.monotonic()
        try:
            assert user.chat.completions.create(model=MODELS["coder"], messages=hi).model == MODELS["coder"]
            # answered: only once the oldest of the 3 is a minute old
            assert asked >= first + 60 - 1, f"answered {asked - first:.1f} s after the 1st of 3, within its minute"
            break
        except openai.RateLimitError as exc:  # refused: the 3 requests made before the restart still count
            assert "requests per minute" in str(exc) and time.monotonic() < third + 60 + 1, exc
            break
        except (openai.APIConnectionError, openai.InternalServerError):
            assert time.monotonic() < deadline, "the gateway did not come back in 120 s"
            time.sleep(1)
    with pytest.raises(openai.RateLimitError, match="budget exceeded"):  # its count survived the restart
        carol.chat.completions.create(model=MODELS["chat"], messages=hi, max_tokens=4)
    assert sd("keys", "revoke", "carol", "-i", inv).returncode == 0

    r = sd("keys", "revoke", "alice", "-i", inv)
    assert r.returncode == 0, failure(r)
    revoked_at = time.monotonic()
    refused = None
    while time.monotonic() - revoked_at < 5:
        try:
            user.chat.completions.create(model=MODELS["coder"], messages=hi)
        except openai.AuthenticationError:
            refused = time.monotonic() - revoked_at
            break
    assert refused is not None and refused < 1.0, refused
    assert client.chat.completions.create(model=MODELS["chat"], messages=hi).model == MODELS["chat"]  # master key

    r = sd("down", "-i", inv)
    assert r.returncode == 0, failure(r)
    r = sd("status", "-i", inv, "--json")
    assert all(not n["containers"] for n in json.loads(r.stdout)["nodes"])


DIST = "  - {name: dist, recipe: openai-gpt-oss-120b, topology: cluster, memory: 0.3, port: 8003}\n"


def test_a_stacks_cluster_deployment_passes_the_fabric_gate_and_history_lists_the_stack(inv, tmp_path):
    """A cluster deployment added to the stack of the tests above (chat on spark1, coder on spark2): the fabric gate
    runs before its engines start (gloo over the fabric IPs: SIMULATED), the others stay untouched, ONE guard per
    node watches all three; `history` lists each deployment with its stack, `rollback` of one refuses naming the
    stack file (exit 2); doctor's recipe checks look at each deployment (or one: --deployment); the same `up` again
    skips the gate; `--no-fabric-gate --dry-run` says so; `down --deployment` takes a node's guard with its last
    engine."""
    stack = tmp_path / "stack.yaml"
    assert up(inv, stack, TWO)["ok"]  # the tests above leave it running (then nothing changes); alone, it starts
    grown = up(inv, stack, TWO + DIST)
    gate = grown["fabric_gate"]["dist"]
    assert gate["status"] == "passed" and gate["simulated"], gate
    assert {c["check"] for c in gate["checks"]} >= {"image.same_id", "gpu.same_driver", "nccl.allreduce"}
    changed = {u["deployment"]: u["changes"] for u in grown["units"]}
    assert changed["chat"] == 0 and changed["coder"] == 0 and changed["dist"] > 0, changed
    assert guards_per_node(inv) == {"spark1": 1, "spark2": 1}
    r = sd("status", "-i", inv, "--json")  # each guard's own state, read from the stack guard's state dir
    assert all((n.get("guard") or {}).get("state") for n in json.loads(r.stdout)["nodes"]), r.stdout

    recipe_checks = ("image.present", "gpu.memory", "network.ports")
    r = sd("doctor", "-i", inv, *(x for c in recipe_checks for x in ("--only", c)), "--json")
    assert r.returncode == 0, failure(r)
    rows = [x for x in json.loads(r.stdout)["results"] if x["check"] in recipe_checks and x["status"] != "skip"]
    seen = {(x["check"], x["measured"].partition(":")[0]) for x in rows}
    assert seen == {(c, n) for c in recipe_checks for n in ("chat", "coder", "dist")}, rows  # each deployment
    r = sd("doctor", "-i", inv, "--only", "image.present", "--deployment", "dist", "--json")
    assert r.returncode == 0, failure(r)
    rows = [x for x in json.loads(r.stdout)["results"] if x["check"] == "image.present"]
    assert rows and all(x["measured"].startswith("dist: ") for x in rows), rows

    r = sd("history", "--json")
    assert r.returncode == 0, failure(r)
    records = json.loads(r.stdout)
    mine = [x for x in records if x.get("stack") == str(stack)]
    assert mine[0]["deployment"] == "dist" and mine[0]["topology"] == "cluster", mine  # newest first
    listed = {x.get("deployment") for x in records if x.get("stack")}
    assert {"chat", "coder", "dist"} <= listed, listed  # each deployment that changed, when it did
    r = sd("rollback", str(mine[0]["id"]), "-i", inv)
    assert r.returncode == 2 and str(stack) in r.stderr and "up --stack" in r.stderr, failure(r)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr

    r = sd("up", "--stack", str(stack), "-i", inv, "--timeout", "240")
    assert r.returncode == 0, failure(r)
    assert "dist: fabric gate: skipped: the deployment is unchanged" in r.stdout, failure(r)
    r = sd("up", "--stack", str(stack), "-i", inv, "--no-fabric-gate", "--dry-run")
    assert r.returncode == 0, failure(r)
    assert "dist: fabric gate: skipped (--no-fabric-gate)" in r.stdout, failure(r)

    for name in ("coder", "dist"):  # spark2 then runs no engine: its guard goes with the last one there
        r = sd("down", "-i", inv, "--deployment", name)
        assert r.returncode == 0, failure(r)
        assert guards_per_node(inv) == {"spark1": 1, "spark2": 1 if name == "coder" else 0}


def ask(host: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(host, 4000, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def test_down_of_one_deployment_of_three_unroutes_it_first_and_clients_mistakes_are_4xx(lab, inv, client, tmp_path):
    started = lab.docker_exec(lab.nodes[0], "date", "-u", "+%Y-%m-%dT%H:%M:%SZ").stdout.strip()
    assert up(inv, tmp_path / "stack.yaml", TWO + THIRD)["ok"]
    assert ids(client) == set(MODELS.values())
    r = sd("doctor", "-i", inv, "--only", "access.state_dir")  # the stack's folders, not "not made yet"
    assert r.returncode == 0 and "~/.sparkdeploy-gateway" in r.stdout and "not made yet" not in r.stdout, failure(r)

    # requests to the model that goes, all through its removal: answered, or 404 once the gateway forgot it
    seen: list[str] = []
    stop = threading.Event()

    def big() -> None:
        while not stop.is_set():
            try:
                client.chat.completions.create(
                    model=MODELS["big"], messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
                seen.append("answered")
            except openai.NotFoundError:
                seen.append("404")
            except Exception as exc:  # noqa: BLE001 - any other outcome is a failure, shown
                seen.append(f"{exc.__class__.__name__}: {str(exc)[:200]}")

    thread = threading.Thread(target=big, daemon=True)
    with Traffic(client, [MODELS["chat"], MODELS["coder"]]) as others:
        thread.start()
        r = sd("down", "-i", inv, "--deployment", "big")
        time.sleep(1.0)
        stop.set()
        thread.join(timeout=90)
    assert r.returncode == 0, failure(r)
    assert others.failed == [] and min(others.ok.values()) > 0, (others.ok, others.failed[:5])
    assert set(seen) <= {"answered", "404"} and seen[-1] == "404", seen[-5:]  # never a 500 nor a dead engine
    last = r.stdout.strip().splitlines()[-1]
    assert "Left on spark1: chat, gateway, guard still run (only big was asked to go" in last, last
    assert "Left on spark2: coder, guard still run" in last and "Nothing of sparkdeploy's" not in last, last

    assert ids(client) == {MODELS["chat"], MODELS["coder"]}
    with pytest.raises(openai.NotFoundError, match="not served by this gateway"):
        client.chat.completions.create(model=MODELS["big"], messages=[{"role": "user", "content": "hi"}])
    refused = sd("keys", "create", "erin", "--models", MODELS["big"], "-i", inv)
    assert refused.returncode == 2 and f"no deployment serves {MODELS['big']}" in refused.stderr, failure(refused)

    # a client's mistakes: each a 4xx with one message
    host, key = lab.nodes[0].mgmt_ip, client.api_key
    json_type = {"Content-Type": "application/json"}
    chat = json.dumps({"model": MODELS["chat"], "messages": [{"role": "user", "content": "hi"}]}).encode()
    cases = {
        "no header": ("GET", "/v1/models", {}, None, 401, "no API key"),
        "malformed header": ("GET", "/v1/models", {"Authorization": f"Basic {key}"}, None, 401, "not `Bearer KEY`"),
        "no key after Bearer": ("GET", "/v1/models", {"Authorization": "Bearer "}, None, 401, "no key after"),
        "unknown key": (
            "POST",
            "/v1/chat/completions",
            {"Authorization": "Bearer sk-nope", **json_type},
            chat,
            401,
            "unknown or revoked key",
        ),
        "unknown model": (
            "POST",
            "/v1/chat/completions",
            {"Authorization": f"Bearer {key}", **json_type},
            chat.replace(MODELS["chat"].encode(), b"no-such-model"),
            404,
            "not served by this gateway",
        ),
        "not JSON": (
            "POST",
            "/v1/chat/completions",
            {"Authorization": f"Bearer {key}", **json_type},
            b"hello",
            400,
            "not JSON",
        ),
        "a JSON list": (
            "POST",
            "/v1/chat/completions",
            {"Authorization": f"Bearer {key}", **json_type},
            b"[1]",
            400,
            "JSON list",
        ),
        "no model": (
            "POST",
            "/v1/chat/completions",
            {"Authorization": f"Bearer {key}", **json_type},
            b'{"messages": []}',
            400,
            "names no model",
        ),
    }
    for what, (method, path, headers, body, code, words) in cases.items():
        status, answer = ask(host, method, path, headers, body)
        message = answer.get("error", {}).get("message", "")
        assert (status, words in message) == (code, True), (what, status, answer)
        assert key not in json.dumps(answer), what  # the key is never echoed
    logs = lab.docker_exec(lab.nodes[0], "docker", "logs", "--since", started, "sparkdeploy-gateway-litellm")
    text = logs.stdout + logs.stderr
    errors = [line for line in text.splitlines() if ":ERROR:" in line or line.startswith("ERROR:")]
    assert "Traceback" not in text and "prisma" not in text and errors == [], (errors, text[-3000:])
    refusals = [line for line in text.splitlines() if "gateway refused" in line]
    assert len(refusals) >= len(cases) and all(":WARNING:" in line for line in refusals), refusals
    assert key not in text

    # `down` keeps the gateway's keys on purpose and says how to remove them; `down --keys` does
    assert sd("keys", "create", "frank", "-i", inv).returncode == 0
    r = sd("down", "-i", inv)
    assert r.returncode == 0, failure(r)
    last = r.stdout.strip().splitlines()[-1]
    assert "~/.sparkdeploy-gateway keeps the gateway's keys and spend counts" in last, last
    assert "`sparkdeploy down --keys` removes them" in last and "Nothing of sparkdeploy's is left on spark2." in last
    r = sd("down", "-i", inv, "--keys")
    assert r.returncode == 0, failure(r)
    assert r.stdout.strip().splitlines()[-1].endswith("Nothing of sparkdeploy's is left on spark1, spark2."), r.stdout


def test_up_restarts_an_unanswering_engine_and_takes_a_replaced_one_out_first(lab, inv, client, tmp_path):
    """An unchanged deployment whose engine stopped answering is a difference `up --stack` converges (issue 43:
    its group restarts, the other deployment is untouched) and is routed again; a deployment whose engine `up`
    replaces is out of the routes meanwhile (503), never a dead engine's 500. (Routes without an engine that does
    not answer, and the 503 saying why: tests/deploy/test_gateway_routes.py and the in-flight test below.)"""
    stack = tmp_path / "stack.yaml"
    assert up(inv, stack, TWO)["ok"]
    # spark2's guard stopped first: its watcher would restart the paused engine itself after 30 s (its own tests:
    # tests/guard/test_watch_lab.py); here `up` is what must bring it back
    lab.docker_exec(lab.nodes[1], "docker", "stop", "sparkdeploy-guard")
    lab.docker_exec(lab.nodes[1], "docker", "pause", "sparkdeploy-coder-vllm")
    deadline = time.monotonic() + 120
    health = ""
    while time.monotonic() < deadline and health != "unhealthy":
        time.sleep(2)
        health = lab.docker_exec(
            lab.nodes[1], "docker", "inspect", "-f", "{{.State.Health.Status}}", "sparkdeploy-coder-vllm"
        ).stdout.strip()
    assert health == "unhealthy", health
    converged = up(inv, stack, TWO)
    changes = {u["deployment"]: u["changes"] for u in converged["units"]}
    assert changes["coder"] > 0 and changes["chat"] == 0, changes
    # nothing out, nothing cold (no on-demand member in this stack)
    assert converged["routes"] == {"served": sorted([MODELS["chat"], MODELS["coder"]]), "out": {}, "cold": []}
    assert ids(client) == {MODELS["chat"], MODELS["coder"]}

    seen: list[str] = []
    stop = threading.Event()

    def coder() -> None:
        while not stop.is_set():
            try:
                client.chat.completions.create(
                    model=MODELS["coder"], messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
                seen.append("answered")
            except openai.APIStatusError as exc:
                seen.append("503" if exc.status_code == 503 else f"{exc.status_code}: {str(exc)[:200]}")
            except Exception as exc:  # noqa: BLE001 - any other outcome is a failure, shown
                seen.append(f"{exc.__class__.__name__}: {str(exc)[:200]}")

    thread = threading.Thread(target=coder, daemon=True)
    thread.start()
    changed = up(inv, stack, TWO.replace("memory: 0.3}", "memory: 0.35}"))  # coder's engine is replaced
    stop.set()
    thread.join(timeout=90)
    assert {u["deployment"]: u["changes"] > 0 for u in changed["units"]}["coder"]
    assert set(seen) <= {"answered", "503"} and "503" in seen and seen[-1] == "answered", seen
    assert ids(client) == {MODELS["chat"], MODELS["coder"]}


def test_a_request_in_flight_when_its_model_leaves_is_answered_like_a_new_one(lab, inv, tmp_path):
    assert up(inv, tmp_path / "stack.yaml", TWO)["ok"]
    script = (Path(__file__).parent / "gateway_in_flight.py").read_text()
    r = lab.docker_exec(lab.nodes[0], "docker", "exec", "sparkdeploy-gateway-litellm", "python3", "-c", script)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [
        [404, "model gone is not served by this gateway (served: here)"],
        [503, "model out is not available now: deployment x is out of the gateway: why"],
        [400, "Invalid model name passed in model=x"],  # a model still routed: LiteLLM's own answer stands
    ]
    assert "gateway refused POST /v1/chat/completions from 1.2.3.4: HTTP 404" in r.stdout + r.stderr
