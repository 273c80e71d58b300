"""Converging to serving (issue 43), on the shared lab (vllm-sim: the engine is SIMULATED, its ranks, Ray, gloo
and the containers are real):

- a Ray worker rank and a torchrun rank of a cluster deployment killed inside their containers (the containers
  stay): the watchers restart the group and it serves again without a command (time printed);
- the same with the watcher off: `up --dry-run` names the group restart, `up` does it;
- a node container restarted (a reboot): its deployment comes back on its own;
- `setup network` and `lab down` with a cluster running: refused, naming it, nothing changed;
- a stack's 2xsolo engine that stops answering: the gateway stops routing to it while its watcher restarts it,
  and no client request fails (another engine serves).
The watcher's timings are made short with `--set guard.watch.*` (and the stack's with its inventory's
`cluster.guard.watch`): 3 s of failed health checks, 2 s of backoff.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from sparkdeploy.config.secrets import parse_env_file
from tests.support.cli_process import failure
from tests.support.cli_process import sd as run_cli_process

pytestmark = pytest.mark.lab

RECIPE, MODEL = "openai-gpt-oss-120b", "openai/gpt-oss-120b"
FAST = ["--set", "guard.watch.unhealthy_s=3", "--set", "guard.watch.backoff_s=2", "--set", "guard.watch.stop_wait_s=20"]
TIMES: dict[str, float] = {}


def sd(*args: str, timeout: float = 600):
    return run_cli_process(*args, timeout=timeout)


@pytest.fixture(scope="module")
def inv(lab) -> str:
    path = str(lab.spec.inventory_path)
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)
    yield path
    sd("down", "-i", path)
    print("\nwatch lab: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMES.items()))


def up(inv: str, *args: str) -> dict:
    r = sd("up", "--recipe", RECIPE, "-i", inv, "--no-fabric-gate", "--timeout", "180", "--json", *args)
    assert r.returncode == 0, failure(r)
    return json.loads(r.stdout)


def answers(endpoint: str, key: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        r = requests.post(f"{endpoint}/chat/completions", json=body, headers=headers, timeout=5)
    except requests.RequestException:
        return False
    return r.status_code == 200


def wait_serving(endpoint: str, limit: float, lab=None) -> float:
    """Seconds until the endpoint answers a completion again (from now), failing past `limit` with what the
    watchers and the nodes' containers say (a failure on a loaded CI machine must be readable afterwards)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if answers(endpoint):
            return time.monotonic() - t0
        time.sleep(0.25)
    raise AssertionError(f"not serving {limit:g} s later" + (f"\n{node_views(lab)}" if lab else ""))


def node_views(lab) -> str:
    out = []
    for node in lab.nodes:
        try:
            out.append(f"{node.name} /watch: " + requests.get(f"http://{node.fabric_ip}:7390/watch", timeout=5).text)
        except requests.RequestException as e:
            out.append(f"{node.name} /watch: {e}")
        ps = lab.docker_exec(node, "docker", "ps", "-a", "--format", "{{.Names}} {{.Status}}", check=False)
        out.append(f"{node.name} containers: {ps.stdout.strip()}")
        logs = lab.docker_exec(node, "docker", "logs", "--tail", "25", "sparkdeploy-vllm", check=False)
        out.append(f"{node.name} engine log tail:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")
    return "\n".join(out)


def kill_rank(lab, pattern: str) -> None:
    """SIGKILL the rank's process inside the worker node's engine container: the container itself stays."""
    r = lab.docker_exec(lab.nodes[1], "docker", "exec", "sparkdeploy-vllm", "pkill", "-9", "-f", pattern, check=False)
    assert r.returncode == 0, f"no process {pattern!r} in spark2's engine: {r.stderr}"


def status(inv: str) -> dict:
    r = sd("status", "-i", inv, "--json")
    return json.loads(r.stdout)


def watched_serving(lab, node: int = 0, limit: float = 60) -> dict:
    """The group whose rank 0 runs on lab node `node`, once that node's watcher has seen it serve (`ok`). A rank
    killed before that look is one lost while the group starts, which the watcher waits out for `start_s` (30 min
    by default): `up` returns at its own health gate, and under load the watcher's next look can come after the
    kill (CI 2026-11-28: the Ray case killed within a second of `up`, then "starting, HTTP 503" for 120 s)."""
    t0 = time.monotonic()
    while True:
        groups = requests.get(f"http://{lab.nodes[node].fabric_ip}:7390/watch", timeout=5).json()["groups"]
        (w,) = [g for g in groups.values() if g.get("rank") == 0]
        if w.get("state") == "ok":
            return w
        assert time.monotonic() - t0 < limit, w
        time.sleep(0.25)


def restarted(lab, since: float, node: int = 0, limit: float = 90) -> dict:
    """The group whose rank 0 runs on lab node `node`, from that node's watcher (asked as its peers ask it, over
    the lab's fabric network, which this machine reaches), once it says it restarted the group after `since`
    (time.time(); the lab's nodes share this machine's clock) and serves."""
    t0 = time.monotonic()
    while True:
        groups = requests.get(f"http://{lab.nodes[node].fabric_ip}:7390/watch", timeout=5).json()["groups"]
        (w,) = [g for g in groups.values() if g.get("rank") == 0]
        if w.get("restarts") and w["restarts"][-1]["at"] >= since and w.get("state") == "ok":
            return w
        assert time.monotonic() - t0 < limit, w
        time.sleep(0.5)


@pytest.mark.parametrize(
    "backend,pattern",
    [("torchrun", "u /opt/sparkdeploy/launcher/serve_torchrun.py"), ("ray", "ray::SimRank")],
    ids=["torchrun", "ray"],
)
def test_a_killed_rank_is_serving_again_without_a_command(lab, inv, backend, pattern):
    result = up(inv, "-t", "cluster", "-b", backend, *FAST)
    endpoint = result["endpoint"]
    assert answers(endpoint)
    watched_serving(lab)  # a rank lost while its watcher still counts the group as starting is another case
    killed = time.time()
    kill_rank(lab, pattern)
    t0 = time.monotonic()
    while answers(endpoint) and time.monotonic() - t0 < 30:  # the head notices the dead rank (heartbeat)
        time.sleep(0.2)
    noticed = time.monotonic() - t0
    wait_serving(endpoint, 120, lab)
    TIMES[f"{backend}: rank killed -> serving again (engine noticed after {noticed:.1f} s)"] = time.monotonic() - t0
    last = restarted(lab, killed)["restarts"][-1]
    assert last["ok"] and ("exited at" in last["reason"] or "health check" in last["reason"]), last
    if backend == "torchrun":  # what `status` says, and a restart that left the group whole (once is enough)
        # Seen twice under load (CI 2026-11-28): the torchrun head exited again seconds after the group served,
        # and its watcher was in a second restart when `status` ran ("... (in progress)"). The group healed
        # again; `status` must say so once it has. Each look that does not is printed (the cause is not known yet).
        t0 = time.monotonic()
        while True:
            r = sd("status", "-i", inv)
            if "restart(s) by the watcher" in r.stdout and "serving again in" in r.stdout:
                break
            print(f"status {time.monotonic() - t0:.0f} s after the first restart served:\n{r.stdout}")
            assert time.monotonic() - t0 < 90, failure(r)
            time.sleep(3)
        again = up(inv, "-t", "cluster", "-b", backend, *FAST, "--dry-run")
        assert again["changes"] == 0, again


def test_with_the_watcher_off_up_names_the_group_restart_and_does_it(lab, inv):
    result = up(inv, "-t", "cluster", "-b", "torchrun", "--set", "guard.watch.enabled=false")
    kill_rank(lab, "u /opt/sparkdeploy/launcher/serve_torchrun.py")
    t0 = time.monotonic()
    time.sleep(12)  # Docker's health check marks the head unhealthy after 3 failed probes (5 s apart)
    assert not answers(result["endpoint"])  # nothing restarts it on its own
    r = sd("up", "--recipe", RECIPE, "-i", inv, "-t", "cluster", "-b", "torchrun", "--no-fabric-gate", "--dry-run",
           "--set", "guard.watch.enabled=false")  # fmt: skip
    assert r.returncode == 0, failure(r)
    assert "restart group: rank 1 (spark2) exited at" in r.stdout, failure(r)
    fixed = up(inv, "-t", "cluster", "-b", "torchrun", "--set", "guard.watch.enabled=false")
    assert fixed["changed"] >= 2 and answers(result["endpoint"])
    TIMES["watcher off: rank killed -> `up` by hand served"] = time.monotonic() - t0
    reasons = [s["reason"] for s in fixed["steps"] if s["step"] == "start-container" and s["change"]]
    assert any(x.startswith("restart group: ") for x in reasons), reasons


def test_a_rebooted_node_brings_its_deployment_back_on_its_own(lab, inv):
    result = up(inv, "-t", "cluster", "-b", "torchrun", *FAST)
    container = lab.spec.container_name(lab.nodes[1].name)
    t0, rebooted = time.monotonic(), time.time()
    r = subprocess.run(["docker", "restart", "-t", "5", container], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wait_serving(result["endpoint"], 240)
    TIMES["node container restarted -> serving again"] = time.monotonic() - t0
    assert restarted(lab, rebooted)["state"] == "ok"


def test_setup_network_and_lab_down_refuse_with_a_cluster_serving(lab, inv):
    up(inv, "-t", "cluster", "-b", "torchrun", *FAST)
    before = lab.docker_exec(lab.nodes[0], "ls", "-a", "/etc/netplan", "/var/lib/sparkdeploy", check=False).stdout
    r = sd("setup", "network", "-i", inv)
    assert r.returncode == 1, failure(r)
    assert "setup network would break openai-gpt-oss-120b / cluster / torchrun on spark1, spark2" in r.stderr
    assert "--stop-deployments" in r.stderr and "Nothing was changed" in r.stderr
    after = lab.docker_exec(lab.nodes[0], "ls", "-a", "/etc/netplan", "/var/lib/sparkdeploy", check=False).stdout
    assert after == before
    # --restore, on nodes that have a netplan of sparkdeploy's to put back (its record made here as root: the
    # default lab has no netplan to apply; tests/dayzero/test_bare_lab.py does it for real on the bare lab)
    record = "/var/lib/sparkdeploy/netguard/original.json"
    content = json.dumps({"files": {}, "links": {}})
    for node in lab.nodes:
        make = f"mkdir -p -m 0700 {record.rsplit('/', 1)[0]} && printf '%s' '{content}' > {record}"
        lab.docker_exec(node, "sh", "-c", make)
    try:
        r = sd("setup", "network", "-i", inv, "--restore")
        assert r.returncode == 1, failure(r)
        assert "setup network --restore would break openai-gpt-oss-120b / cluster / torchrun" in r.stderr, failure(r)
        assert lab.docker_exec(lab.nodes[0], "test", "-f", record, check=False).returncode == 0  # not restored
    finally:
        for node in lab.nodes:
            lab.docker_exec(node, "rm", "-f", record, check=False)
    r = sd("lab", "down", "--name", lab.spec.name)  # the shared lab itself: refused, or the session loses it
    assert r.returncode == 1 and "lab down would break openai-gpt-oss-120b / cluster" in r.stderr, failure(r)
    assert status(inv)["healthy"]


def _fast_inventory(lab, tmp_path: Path) -> str:
    """The lab's inventory with its paths absolute and the watcher's short timings (a stack's guards use the
    inventory's cluster.guard)."""
    data = yaml.safe_load(lab.spec.inventory_path.read_text())
    here = lab.spec.inventory_path.parent
    for key in ("secrets_file", "known_hosts"):
        data["cluster"][key] = str(here / data["cluster"][key])
    for node in data["nodes"]:
        node["ssh"]["key"] = str(here / node["ssh"]["key"])
    data["cluster"]["guard"] = {"watch": {"unhealthy_s": 3, "backoff_s": 2, "stop_wait_s": 20}}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("kind", ["stack", "2xsolo"])
def test_no_request_fails_while_an_engine_of_two_stops_answering_and_is_restarted(lab, inv, tmp_path, kind):
    """A stack's gateway stops routing to the engine its watcher says is not serving (and takes it back once it
    is); a 2xsolo proxy cools it down at its first failure (recipes.FAILOVER_ALLOWED_FAILS). Either way the
    requests go to the other engine: none fails."""
    if kind == "stack":
        r = sd("down", "-i", inv)  # a stack never replaces a single deployment (the earlier tests' cluster)
        assert r.returncode == 0, failure(r)
        target = _fast_inventory(lab, tmp_path)
        stack = tmp_path / "stack.yaml"
        stack.write_text("deployments:\n  - {name: pair, recipe: glm-4.7-flash-int4, topology: 2xsolo, memory: 0.25}\n")
        r = sd("up", "--stack", str(stack), "-i", target, "--timeout", "240")
        engine = "sparkdeploy-pair-vllm"
    else:
        target = inv
        r = sd("up", "--recipe", "glm-4.7-flash-int4", "-t", "2xsolo", "-i", inv, "--timeout", "240", *FAST)
        engine = "sparkdeploy-vllm"
    assert r.returncode == 0, failure(r)
    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"]
    gateway = f"http://{lab.nodes[0].mgmt_ip}:4000/v1"
    outcomes: list[object] = []
    stop = threading.Event()

    def loop() -> None:
        body = {"model": "glm-4.7-flash", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        while not stop.is_set():
            try:
                resp = requests.post(
                    f"{gateway}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
                )
                outcomes.append(resp.status_code)
            except requests.RequestException as exc:
                outcomes.append(exc.__class__.__name__)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(2)
    # spark2's engine stops answering (frozen: requests to it hang); its watcher restarts it after 3 s of it
    paused = time.time()
    lab.docker_exec(lab.nodes[1], "docker", "pause", engine)
    t0 = time.monotonic()
    restarted(lab, paused, node=1)  # its watcher restarted it and it serves again
    TIMES[f"{kind}: engine frozen -> restarted by its watcher"] = time.monotonic() - t0
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join(timeout=90)
    bad = [o for o in outcomes if o != 200]
    assert len(outcomes) > 20 and not bad, f"{len(bad)} of {len(outcomes)} failed: {bad[:5]}"
    if kind == "stack":
        r = sd("down", "-i", target)
        assert r.returncode == 0, failure(r)
