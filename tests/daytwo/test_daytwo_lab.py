"""Day two in the lab, on ONE 2xsolo deployment with Prometheus (`up --metrics`), a handful of requests:

- `logs --tail`: both nodes, every container, merged by time, the HF token and master key that an engine
  prints (canaries written into its stdout) masked; `logs --follow` keeps the other node while one node's
  SSH is cut (iptables REJECT + its sessions killed), says so, and picks the node up again;
- `top --once --json` while requests run: both engines' gauges, token rates, TTFT, and the proxy's split;
- Prometheus on the head answers a PromQL query for each engine's generation tokens (and scraped the proxy);
- an engine killed with SIGKILL and one OOM-killed for real (a cgroup memory limit + the sim's SIGUSR1
  fault) are told apart by `status` and `doctor --only engine.crashes`.

The engines are vllm-sim (SIMULATED GPU); everything else is real: sshd, Docker, LiteLLM, Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.parse

import pytest
import requests

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.config.secrets import parse_env_file
from sparkdeploy.runtime.session import Session
from tests.deploy.test_deploy_lab import _fail, sd
from tests.support.cli_process import spawn_cli

pytestmark = pytest.mark.lab

RECIPE = "openai-gpt-oss-120b"
MODEL = "openai/gpt-oss-120b"


@pytest.fixture(scope="module")
def day2(lab):
    path = str(lab.spec.inventory_path)
    # The watcher off: these tests read how containers died and Docker's health marks, which the watcher would
    # cut short by restarting a wedged engine (its own tests: tests/guard/test_watch_lab.py).
    r = sd(
        "up", "-i", path, "-r", RECIPE, "-t", "2xsolo", "--metrics", "--timeout", "240",
        "--set", "guard.watch.enabled=false",
    )  # fmt: skip
    assert r.returncode == 0, _fail(r)
    assert "metrics: Prometheus at http://" in r.stdout
    yield path
    sd("down", "-i", path)


@pytest.fixture(scope="module")
def secrets(lab) -> dict[str, str]:
    return parse_env_file(lab.spec.directory / "secrets.env")


def node_run(inv: str, node: str, command: str, check: bool = True) -> str:
    """A fixed shell command on a lab node over its SSH connection (the test acting as the node's admin)."""
    inventory = load_inventory(inv)
    with Session.open(inventory) as session:
        r = session.conn(node).run(["bash", "-c", command], check=check, timeout=60)
    return r.stdout


def say(inv: str, node: str, text: str) -> None:
    """Make the node's engine print a line, as if it logged it (written into its PID 1's stdout)."""
    node_run(inv, node, f"docker exec sparkdeploy-vllm sh -c 'echo \"{text}\" > /proc/1/fd/1'")


def chats(endpoint: str, key: str, n: int, max_tokens: int = 16) -> None:
    for _ in range(n):
        r = requests.post(
            endpoint + "/chat/completions",
            timeout=120,
            headers={"Authorization": f"Bearer {key}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens},
        )
        assert r.status_code == 200, r.text


def status(inv: str) -> dict:
    r = sd("status", "-i", inv, "--json")
    assert r.returncode == 0, _fail(r)
    return json.loads(r.stdout)


def test_logs_merged_by_time_and_masked(day2, secrets):
    for node in ("spark1", "spark2"):
        say(day2, node, f"canary from {node}: HF_TOKEN=$HF_TOKEN key=$LITELLM_MASTER_KEY")
    r = sd("logs", "-i", day2, "--tail", "100", "--timestamps")
    assert r.returncode == 0, _fail(r)
    for value in (secrets["HF_TOKEN"], secrets["LITELLM_MASTER_KEY"]):
        assert value not in r.stdout + r.stderr
    for node in ("spark1", "spark2"):
        assert f"{node}/vllm | canary from {node}: HF_TOKEN=******** key=********" in r.stdout
    assert re.search(r"^\S+ spark1/litellm \| ", r.stdout, re.M)
    times = [line.split(" ", 1)[0] for line in r.stdout.splitlines() if re.match(r"^\d\d:\d\d:\d\d\.\d{3} ", line)]
    assert len(times) > 10 and times == sorted(times), "lines are not merged in time order"
    assert "\x1b[" not in r.stdout  # not a terminal: no colour
    one = sd("logs", "-i", day2, "-n", "spark2", "-c", "vllm", "--tail", "2")
    assert one.returncode == 0 and one.stdout.count("\n") == 2
    assert all(line.startswith("spark2/vllm | ") for line in one.stdout.splitlines())


def test_logs_follow_survives_a_node_going_away(day2, lab):
    proc = spawn_cli("logs", "-i", day2, "-f", "--tail", "1")
    lines: list[str] = []
    notes: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    threading.Thread(target=lambda: notes.extend(iter(proc.stderr.readline, "")), daemon=True).start()

    def wait_for(where: list[str], text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in x for x in where):
            assert time.monotonic() < deadline, f"{text!r} not seen; out={lines[-5:]} err={notes}"
            time.sleep(0.2)

    node2 = lab.spec.container_name("spark2")
    try:
        say(day2, "spark2", "follow-before")
        wait_for(lines, "spark2/vllm | follow-before")
        # spark2 goes away: SSH refused and its open sessions cut (what a reboot looks like from here)
        subprocess.run(
            [
                "docker",
                "exec",
                node2,
                "iptables",
                "-I",
                "INPUT",
                "-p",
                "tcp",
                "--dport",
                "22",
                "-j",
                "REJECT",
                "--reject-with",
                "tcp-reset",
            ],
            check=True,
        )
        subprocess.run(["docker", "exec", node2, "pkill", "-KILL", "-f", "sshd: spark"], check=False)
        wait_for(notes, "spark2: lost")
        say(day2, "spark1", "follow-while-spark2-away")
        wait_for(lines, "spark1/vllm | follow-while-spark2-away")
        assert proc.poll() is None
    finally:
        subprocess.run(
            [
                "docker",
                "exec",
                node2,
                "iptables",
                "-D",
                "INPUT",
                "-p",
                "tcp",
                "--dport",
                "22",
                "-j",
                "REJECT",
                "--reject-with",
                "tcp-reset",
            ],
            check=False,
        )
    try:
        wait_for(notes, "spark2: back", timeout=60)
        say(day2, "spark2", "follow-after")
        wait_for(lines, "spark2/vllm | follow-after")
        assert sum("follow-before" in x for x in lines) == 1, "a line was shown twice after the reconnect"
    finally:
        proc.terminate()
        proc.wait(10)


def test_top_once_json_while_requests_run(day2, secrets):
    st = status(day2)
    chats(st["endpoint"], secrets["LITELLM_MASTER_KEY"], 12, 2)  # simple-shuffle: both backends get some
    worker = threading.Thread(target=chats, args=(st["endpoint"], secrets["LITELLM_MASTER_KEY"], 6, 64))
    worker.start()
    time.sleep(1.0)
    r = sd("top", "-i", day2, "--once", "--json")
    worker.join()
    assert r.returncode == 0, _fail(r)
    snap = json.loads(r.stdout)
    engines = {e["node"]: e for e in snap["engines"]}
    assert set(engines) == {"spark1", "spark2"}
    assert snap["simulated"] is True  # the lab's engines are vllm-sim: their /metrics say so
    assert snap["request_share_basis"] == "since the proxy started"  # --once: the share is the proxy's whole life
    for e in engines.values():
        assert e["error"] is None and e["kv_cache_usage"] is not None and e["running"] is not None
        assert e["simulated"] is True
        assert e["ttft_p50_s"] is not None and e["ttft_p95_s"] >= e["ttft_p50_s"]
    assert sum(e["generation_tokens_per_s"] for e in engines.values()) > 0
    share = snap["request_share"]
    assert set(share) == {"spark1", "spark2"} and all(v > 0 for v in share.values())
    assert abs(sum(share.values()) - 1) < 1e-9
    table = sd("top", "-i", day2, "--once")
    assert table.returncode == 0 and "spark2" in table.stdout
    # the caption says what the share is over (issue 30: "proxy share over the since the engine started")
    assert "proxy share since the proxy started" in " ".join(table.stdout.split()), table.stdout
    lines = table.stdout.splitlines()
    rows = [n for n, line in enumerate(lines) if line.startswith("│") and ("spark1" in line or "spark2" in line)]
    assert len(rows) == 2 and all("│ SIMULATED " in lines[n + 1] for n in rows), table.stdout  # under each engine
    assert lines[0].startswith("SIMULATED: vllm-sim stands in for the GPU"), table.stdout


def test_live_top_into_a_pipe_prints_a_table_each_interval(day2):
    """Issue 30: live `top` piped to a file printed nothing (a live screen needs a terminal).
    Issue 44: the Ctrl-C reaches it however the suite was started (spawn_cli: SIGINT at its default), and it
    exits 130 (interrupted), not 0."""
    import signal

    proc = spawn_cli("top", "-i", day2, "--interval", "0.5")
    time.sleep(4)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err[-2000:]
    assert out.count("sparkdeploy top (") >= 2, out[-3000:]  # one table per interval, not one frozen screen
    assert "\x1b[" not in out  # plain text: no terminal control codes in the file
    assert "spark1" in out and "spark2" in out


def test_prometheus_answers_promql_per_engine(day2, secrets):
    st = status(day2)
    assert st["metrics_url"], st
    chats(st["endpoint"], secrets["LITELLM_MASTER_KEY"], 4)
    url = st["metrics_url"] + "/api/v1/query?query=" + urllib.parse.quote("vllm:generation_tokens_total")
    deadline = time.monotonic() + 40
    while True:
        data = requests.get(url, timeout=10).json()
        per = {s["metric"]["node"]: float(s["value"][1]) for s in data["data"]["result"]}
        if set(per) == {"spark1", "spark2"} and all(v > 0 for v in per.values()):
            break
        assert time.monotonic() < deadline, data
        time.sleep(2)
    proxy = requests.get(st["metrics_url"] + "/api/v1/query", timeout=10, params={"query": 'up{job="litellm"}'}).json()[
        "data"
    ]["result"]
    assert proxy and proxy[0]["value"][1] == "1", proxy  # scraped with the key from the 0600 file


def _container(st: dict, node: str, name: str = "sparkdeploy-vllm") -> dict:
    n = next(n for n in st["nodes"] if n["name"] == node)
    return next(c for c in n["containers"] if c["name"] == name)


def _wait_restarted(inv: str, node: str, restarts: int) -> dict:
    deadline = time.monotonic() + 90
    while True:
        st = status(inv)
        c = _container(st, node)
        if c["restarts"] >= restarts and c["running"] and c.get("last_exit"):
            return c
        assert time.monotonic() < deadline, c
        time.sleep(2)


def test_killed_and_oom_killed_engines_are_told_apart(day2):
    before = status(day2)
    # spark2: the engine's process killed (SIGKILL from outside: not an OOM kill)
    node_run(day2, "spark2", "sudo kill -KILL \"$(docker inspect --format '{{.State.Pid}}' sparkdeploy-vllm)\"")
    killed = _wait_restarted(day2, "spark2", _container(before, "spark2")["restarts"] + 1)
    assert killed["last_exit"]["reason"] == "killed by SIGKILL (exit 137)" and not killed["last_exit"]["oom_killed"]

    # spark1: a real OOM kill: a cgroup memory limit a little above what the engine uses, then the sim's fault
    used = node_run(day2, "spark1", "docker stats --no-stream --format '{{.MemUsage}}' sparkdeploy-vllm")
    mib = float(re.match(r"([\d.]+)MiB", used.strip()).group(1))
    limit = f"{int(mib) + 200}m"
    node_run(day2, "spark1", f"docker update --memory {limit} --memory-swap {limit} sparkdeploy-vllm")
    node_run(day2, "spark1", "sudo kill -USR1 \"$(docker inspect --format '{{.State.Pid}}' sparkdeploy-vllm)\"")
    oom = _wait_restarted(day2, "spark1", _container(before, "spark1")["restarts"] + 1)
    assert oom["last_exit"]["oom_killed"] and oom["last_exit"]["reason"] == "OOM-killed (exit 137)", oom

    table = sd("status", "-i", day2)
    assert re.search(r"^spark1 sparkdeploy-vllm: \d restarts?; OOM-killed \(exit 137\) \S+ ago", table.stdout, re.M)
    assert re.search(r"^spark2 sparkdeploy-vllm: \d restarts?; killed by SIGKILL \(exit 137\)", table.stdout, re.M)
    r = sd("doctor", "-i", day2, "-r", RECIPE, "-t", "2xsolo", "--only", "engine.crashes", "--json")
    assert r.returncode == 1, _fail(r)
    rows = {(x["node"], x["status"]): x for x in json.loads(r.stdout)["results"] if x["check"] == "engine.crashes"}
    assert "OOM-killed" in rows[("spark1", "fail")]["measured"]
    assert "gpu_memory_utilization" in rows[("spark1", "fail")]["fix"]
    assert "SIGKILL" in rows[("spark2", "warn")]["measured"]


def test_a_wedged_engine_is_reported_health_failing_since(day2):
    """The engine's process stopped (SIGSTOP: it still runs, but answers nothing): Docker's own health check,
    which every serving container now declares, marks it unhealthy; `status` and doctor say since when."""
    pid = "\"$(docker inspect --format '{{.State.Pid}}' sparkdeploy-vllm)\""
    # Docker only counts failures once the container has been healthy (or its start period ran out).
    deadline = time.monotonic() + 60
    while _container(status(day2), "spark2").get("docker_health") != "healthy":
        assert time.monotonic() < deadline, _container(status(day2), "spark2")
        time.sleep(2)
    node_run(day2, "spark2", f"sudo kill -STOP {pid}")
    try:
        deadline = time.monotonic() + 60
        while (c := _container(status(day2), "spark2")).get("docker_health") != "unhealthy":
            assert time.monotonic() < deadline, c
            time.sleep(2)
        assert c["health_failing_since"], c
        table = sd("status", "-i", day2)
        since = r"^spark2 sparkdeploy-vllm: .*health failing since \d\d:\d\d:\d\d UTC, \S+ ago"
        assert re.search(since, table.stdout, re.M), table.stdout
        r = sd("doctor", "-i", day2, "-r", RECIPE, "-t", "2xsolo", "--only", "engine.crashes", "--json")
        assert r.returncode == 1, _fail(r)
        rows = [x for x in json.loads(r.stdout)["results"] if x["node"] == "spark2" and x["status"] == "fail"]
        assert any("health check failing since" in x["measured"] for x in rows), rows
    finally:
        node_run(day2, "spark2", f"sudo kill -CONT {pid}")
    deadline = time.monotonic() + 60
    while _container(status(day2), "spark2").get("docker_health") != "healthy":
        assert time.monotonic() < deadline, "spark2's engine did not become healthy again after SIGCONT"
        time.sleep(2)
