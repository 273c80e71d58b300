"""Fast tests of the pure logic of `up`/`down`: facts parsing, plans, preflight, the lock, the health gate
against a local stub server, and known_hosts handling for `trust`. No node, no Docker."""

from __future__ import annotations

import http.server
import json
import threading
from typing import ClassVar

import paramiko
import pytest

from sparkdeploy import facts as facts_mod
from sparkdeploy.deploy import health, preflight
from sparkdeploy.deploy.plan import manifest_text, plan_deployment, plan_down
from sparkdeploy.errors import StepFailed
from sparkdeploy.facts import FileFact
from sparkdeploy.runtime.locks import inventory_lock
from tests.deploy.deploy_helpers import (
    IMAGE,
    IMAGE_ID,
    PROXY_IMAGE,
    SECRET_HF,
    SECRET_KEY,
    converged_facts,
    empty_facts,
    make_deployment,
)
from tests.support.doubles import RecordingConn, recording_session


def _facts(dep, f=converged_facts):
    return {n.name: f(dep, n.name) if f is converged_facts else f(n.name) for n in dep.inventory.nodes}


def _changes(plan):
    return [(s.node, s.kind, s.target) for s in plan.steps if s.change]


# -- facts ----------------------------------------------------------------------------------------------

SAMPLE = f"""
@@sparkdeploy-facts@@ home
/home/spark
@@sparkdeploy-facts@@ docker
ok 28.0.1
@@sparkdeploy-facts@@ names
{"c" * 64} true sparkdeploy-vllm
{"d" * 64}  mine,alias
@@sparkdeploy-facts@@ inspect
{{"id":"{"c" * 64}","name":"/sparkdeploy-vllm","image":"{IMAGE_ID}","ref":"{IMAGE}","labels":{{"io.sparkdeploy.managed":"true","io.sparkdeploy.config-hash":"abc","io.sparkdeploy.recipe":"r","io.sparkdeploy.topology":"solo","io.sparkdeploy.role":"solo"}},"status":"running","running":true,"restarting":false,"exit_code":0,"started":"2026-01-01T00:00:00.123456789Z","finished":"0001-01-01T00:00:00Z","restarts":0}}
@@sparkdeploy-facts@@ images
{IMAGE} {IMAGE_ID}
{PROXY_IMAGE} -
@@sparkdeploy-facts@@ statedir
700
@@sparkdeploy-facts@@ files
644 f node.env
600 f secrets.env
600 f .node.env.sparkdeploy-tmp
700 d doctor
@@sparkdeploy-facts@@ sha
{"e" * 64}  ./node.env
{"f" * 64}  ./secrets.env
@@sparkdeploy-facts@@ manifest
{{"files": ["node.env", "secrets.env", "../../etc/passwd"], "containers": []}}
@@sparkdeploy-facts@@ resources
@@sparkdeploy-facts@@ meminfo
MemTotal:       125513728 kB
MemAvailable:   120000000 kB
@@sparkdeploy-facts@@ gpu
[N/A], [N/A]
@@sparkdeploy-facts@@ model
cached
@@sparkdeploy-facts@@ disk
home /dev/nvme0n1p2 3000000000 1000000000 2000000000 34% /
hf_cache /dev/nvme0n1p2 3000000000 1000000000 2000000000 34% /
@@sparkdeploy-facts@@ listen
00000000:1F40
00000000000000000000000000000000:0FA0
@@sparkdeploy-facts@@ end
"""  # noqa: E501 - a node's output, one record a line


def test_parse_facts():
    f = facts_mod.parse("spark1", SAMPLE)
    assert f.home == "/home/spark" and f.docker_ok and f.docker_version == "28.0.1"
    assert [c.name for c in f.containers] == ["sparkdeploy-vllm"]
    c = f.containers[0]
    assert c.config_hash == "abc" and c.running and c.image_id == IMAGE_ID and c.uptime_s() > 0
    assert f.other_names == {"mine": "d" * 64, "alias": "d" * 64}
    assert f.images == {IMAGE: IMAGE_ID, PROXY_IMAGE: None}
    assert f.state_dir_mode == 0o700
    assert f.files["secrets.env"].mode == 0o600 and f.files["node.env"].sha256 == "e" * 64
    assert f.temp_files == [".node.env.sparkdeploy-tmp"] and f.other_entries == ["doctor"]
    assert f.manifest_files == ["node.env", "secrets.env"]  # a path in a manifest is never trusted
    assert f.gpu_mem_free_mb is None and f.free_memory_mb == 120000000 // 1024  # [N/A]: falls back to meminfo
    assert f.resources and f.model_cached and f.disk_free_mb["home"] == 2000000000 // 1024
    assert f.listening == {8000, 4000}


def test_parse_facts_docker_down():
    f = facts_mod.parse(
        "spark1",
        "@@sparkdeploy-facts@@ home\n/home/spark\n@@sparkdeploy-facts@@ docker\nfail\n"
        "permission denied while trying to connect to the Docker daemon socket\n",
    )
    assert not f.docker_ok and "permission denied" in f.docker_error


def test_facts_script_reads_only_what_is_asked(tmp_path):
    import subprocess

    for what, present, absent in (("state", "listen", "meminfo"), ("resources", "meminfo", "inspect")):
        r = subprocess.run(
            facts_mod.command(what, facts_mod.FactArgs(".nope", "~/.cache/huggingface")),
            capture_output=True,
            text=True,
            env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        )
        sections = facts_mod.parse_sections(r.stdout)
        assert present in sections and absent not in sections and "home" in sections


def test_a_path_of_another_owner_in_the_state_dir_fails_preflight_with_the_chown(tmp_path):
    """The real facts script finds it (a folder Docker made as root for a bind mount, here one chowned to
    nobody); preflight names it and the command that fixes it."""
    import os
    import subprocess

    state = tmp_path / ".sparkdeploy"
    (state / "engine").mkdir(parents=True)
    os.chown(state / "engine", 65534, 65534)
    (state / "doctor").mkdir()
    (state / "doctor" / "result.json").write_text("{}")
    os.chown(state / "doctor" / "result.json", 65534, 65534)  # deeper than what up writes: not reported
    r = subprocess.run(
        facts_mod.command("state", facts_mod.FactArgs(".sparkdeploy", "~/.cache/huggingface")),
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    f = facts_mod.parse("spark1", r.stdout)
    assert f.state_dir_foreign == str(state / "engine")
    dep = make_deployment("solo")
    facts = _facts(dep, empty_facts)
    facts["spark1"].state_dir_foreign = f.state_dir_foreign
    [bad] = [c for c in preflight.run(dep, facts) if not c.ok]
    assert (bad.node, bad.check) == ("spark1", "state-dir") and str(state / "engine") in bad.measured
    assert bad.fix == "on spark1: sudo chown -R spark: ~/.sparkdeploy"
    os.chown(state / "engine", os.getuid(), os.getgid())  # only the probe's file, two levels down, is left
    r = subprocess.run(
        facts_mod.command("state", facts_mod.FactArgs(".sparkdeploy", "~/.cache/huggingface")),
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert facts_mod.parse("spark1", r.stdout).state_dir_foreign == ""


def test_facts_script_is_read_only():
    import re

    for fact in facts_mod.FACTS.values():  # every fact's command only looks
        for word in ("rm ", "mkdir", "docker run", "docker rm", "chmod", " > "):
            assert word not in fact.command, (fact.name, word)
        # no kill command (crashes reads the engine's `kill` events: --filter event=kill)
        assert not re.search(r"(^|[\s;&|(])kill\s", fact.command), fact.name
    # the framing's only writes: its own temp file and folder, removed again
    script = facts_mod.command("doctor", facts_mod.FactArgs())[2]

    assert set(re.findall(r"rm -\w+ [^;\n}]+", script)) == {'rm -f "$t"', 'rm -rf "$__d"'}


# -- plan -----------------------------------------------------------------------------------------------


def test_fresh_node_plan_order():
    dep = make_deployment("solo")
    plan = plan_deployment(dep, _facts(dep, empty_facts))
    kinds = [s.kind for s in plan.node("spark1").steps]
    assert kinds == ["state-dir", "manifest", "write", "write", "write", "write", "start-container", "manifest"]
    assert all(s.change for s in plan.node("spark1").steps[:-1])
    assert not plan.node("spark1").steps[-1].change  # the manifest written first already says it all
    assert plan.node("spark2").steps == []  # nothing of ours there: nothing to remove
    pre = plan.node("spark1").steps[1]
    assert set(json.loads(pre.file.content)["files"]) == {"node.env", "secrets.env", "vllm.entry.sh", "vllm.run.sh"}


@pytest.mark.parametrize("topology", ["solo", "cluster", "2xsolo"])
def test_second_up_changes_nothing(topology):
    dep = make_deployment(topology)
    plan = plan_deployment(dep, _facts(dep))
    assert plan.changes == 0, _changes(plan)
    assert all(s.kind in ("state-dir", "write", "start-container", "manifest") for s in plan.steps)


def test_one_value_restarts_only_what_depends_on_it():
    dep = make_deployment("2xsolo")
    facts = _facts(dep)
    changed = make_deployment("2xsolo", worker_value="2")  # only spark2's engine files change
    plan = plan_deployment(changed, facts)
    assert _changes(plan) == [
        ("spark2", "write", "node.env"),
        ("spark2", "write", "vllm.entry.sh"),
        ("spark2", "start-container", "sparkdeploy-vllm"),
        ("spark2", "manifest", "manifest.json"),
    ]


def test_cluster_ranks_restart_together():
    dep = make_deployment("cluster")
    plan = plan_deployment(make_deployment("cluster", worker_value="2"), _facts(dep))
    starts = [(s.node, s.change) for s in plan.steps if s.kind == "start-container"]
    assert starts == [("spark1", True), ("spark2", True)]
    assert "one engine" in next(s for s in plan.steps if s.kind == "start-container" and s.node == "spark1").reason


def test_container_not_running_or_other_image_is_restarted():
    dep = make_deployment("solo")
    facts = _facts(dep)
    facts["spark1"].containers[0].running = False
    facts["spark1"].containers[0].status = "exited"
    plan = plan_deployment(dep, facts)
    assert _changes(plan) == [("spark1", "start-container", "sparkdeploy-vllm")]
    facts = _facts(dep)
    facts["spark1"].images[IMAGE] = "sha256:" + "9" * 64
    step = next(s for s in plan_deployment(dep, facts).steps if s.kind == "start-container")
    assert step.change and step.reason.startswith("image ")


def test_topology_switch_takes_the_old_one_down_everywhere():
    old = make_deployment("2xsolo")
    facts = _facts(old)
    facts["spark2"].files["user-notes.txt"] = FileFact("user-notes.txt", 0o644, "0" * 64)  # not ours
    new = make_deployment("solo", value="2")
    plan = plan_deployment(new, facts)
    s1 = plan.node("spark1").steps
    assert ("remove-container", "sparkdeploy-litellm") in [(s.kind, s.target) for s in s1 if s.change]
    assert {s.target for s in s1 if s.kind == "remove-file"} == {"litellm-config.yaml", "litellm.run.sh"}
    s2 = plan.node("spark2").steps
    assert [(s.kind, s.target) for s in s2 if s.change] == [
        ("remove-container", "sparkdeploy-vllm"),
        ("remove-file", "node.env"),
        ("remove-file", "secrets.env"),
        ("remove-file", "vllm.entry.sh"),
        ("remove-file", "vllm.run.sh"),
        ("remove-file", "manifest.json"),
    ]
    rmdir = next(s for s in s2 if s.kind == "rmdir")
    assert not rmdir.change and "user-notes.txt" in rmdir.reason  # never removes what it did not write
    assert all(s.phase == 1 for s in s2)  # removals happen before anything starts anywhere


def test_stale_and_temp_files_removed():
    dep = make_deployment("solo")
    facts = _facts(dep)
    f = facts["spark1"]
    f.files["ray-head.entry.sh"] = FileFact("ray-head.entry.sh", 0o755, "1" * 64)
    f.manifest["files"].append("ray-head.entry.sh")
    f.files["manifest.json"].sha256 = "2" * 64  # the manifest on the node lists the old file
    f.files[".node.env.sparkdeploy-tmp"] = FileFact(".node.env.sparkdeploy-tmp", 0o600, "")
    plan = plan_deployment(dep, facts)
    assert sorted(_changes(plan)) == [
        ("spark1", "manifest", "manifest.json"),
        ("spark1", "remove-file", ".node.env.sparkdeploy-tmp"),
        ("spark1", "remove-file", "ray-head.entry.sh"),
    ]


def test_mode_only_difference_is_a_chmod_and_secrets_keep_0600():
    dep = make_deployment("solo")
    facts = _facts(dep)
    facts["spark1"].files["secrets.env"].mode = 0o644
    facts["spark1"].state_dir_mode = 0o755
    plan = plan_deployment(dep, facts)
    chmod = next(s for s in plan.steps if s.kind == "chmod")
    assert chmod.target == "secrets.env" and chmod.mode == 0o600
    assert next(s for s in plan.steps if s.kind == "state-dir").change


def test_down_plan_removes_only_ours():
    dep = make_deployment("2xsolo")
    facts = _facts(dep)
    facts["spark1"].other_names["postgres"] = "9" * 64
    facts["spark1"].other_entries.append("backups")  # someone else's folder in the state dir
    facts["spark1"].other_entries.append("doctor")  # doctor --nccl's: ours (issue 30: down left it behind)
    facts["spark2"].other_entries.append("doctor")
    plan = plan_down(dep.inventory.nodes, facts, ".sparkdeploy")
    rmdir1 = next(s for s in plan.steps if s.node == "spark1" and s.kind == "rmdir")
    assert not rmdir1.change and "backups/" in rmdir1.reason and "doctor" not in rmdir1.reason
    targets = {(s.node, s.kind, s.target) for s in plan.steps if s.change}
    assert ("spark1", "remove-container", "sparkdeploy-litellm") in targets
    assert not any(t[2] in ("postgres", "backups") for t in targets)
    assert {("spark1", "remove-folder", "doctor"), ("spark2", "remove-folder", "doctor")} <= targets
    assert ("spark2", "rmdir", "/home/spark/.sparkdeploy") in targets


def test_up_names_the_deployment_it_replaces():
    from sparkdeploy.deploy.up import replaces

    dep = make_deployment("2xsolo")
    facts = _facts(dep)
    assert replaces(dep, facts) is None  # nothing deployed
    for f in facts.values():
        f.manifest = {"recipe": dep.recipe.name, "topology": "2xsolo", "backend": None}
    assert replaces(dep, facts) is None  # the same one: converging, not replacing
    facts["spark1"].manifest = {"recipe": "qwen3-coder-30b-int4", "topology": "cluster", "backend": "torchrun"}
    facts["spark2"].manifest = {"recipe": "qwen3-coder-30b-int4", "topology": "cluster", "backend": "torchrun"}
    assert replaces(dep, facts) == "qwen3-coder-30b-int4 / cluster / torchrun on spark1, spark2"


def test_manifest_is_deterministic_and_lists_no_secret():
    dep = make_deployment("2xsolo")
    text = manifest_text(dep, dep.nodes[0])
    assert text == manifest_text(dep, dep.nodes[0])
    assert SECRET_HF not in text and SECRET_KEY not in text


# -- preflight ------------------------------------------------------------------------------------------


def _failed(checks):
    return [(c.node, c.check) for c in checks if not c.ok]


def test_preflight_passes_on_fresh_nodes():
    dep = make_deployment("cluster")
    checks = preflight.run(dep, _facts(dep, empty_facts))
    assert _failed(checks) == []
    assert {c.check for c in checks} >= {"ssh", "docker", "names", "image", "ports", "memory", "disk"}


def test_preflight_missing_image_names_the_push_command():
    dep = make_deployment("2xsolo")
    facts = _facts(dep, empty_facts)
    facts["spark1"].images[PROXY_IMAGE] = None
    checks = preflight.run(dep, facts)
    [bad] = [c for c in checks if not c.ok]
    assert bad.node == "spark1" and bad.missing_image == PROXY_IMAGE
    assert bad.fix.startswith("sparkdeploy images push litellm-proxy --to spark1 ")  # doctor's image.present


def test_preflight_image_ids_must_match():
    dep = make_deployment("cluster")
    facts = _facts(dep, empty_facts)
    facts["spark2"].images[IMAGE] = "sha256:" + "7" * 64
    assert ("spark1,spark2", "image") in _failed(preflight.run(dep, facts))


def test_preflight_ports_foreign_vs_ours():
    dep = make_deployment("solo")
    facts = _facts(dep, empty_facts)
    facts["spark1"].listening.add(8000)
    assert _failed(preflight.run(dep, facts)) == [("spark1", "ports")]
    facts = _facts(dep)  # our own running engine holds the port: fine
    assert _failed(preflight.run(dep, facts)) == []


def test_preflight_memory():
    """One budget for preflight and doctor (sparkdeploy/recipes/budget.py): vLLM reserves gpu_memory_utilization x total
    at start, so a node needs util x total + the 8 GiB OS reserve free, whatever its share of the weights."""
    dep = make_deployment("2xsolo")
    facts = _facts(dep, empty_facts)
    facts["spark2"].mem_available_mb = 60 * 1024
    [(node, check)] = _failed(preflight.run(dep, facts))
    assert (node, check) == ("spark2", "memory")
    # cluster: each node holds half of the weights, and vLLM still reserves 0.70 x 119.7 GiB = 83.8 GiB on each;
    # + 8 GiB = 91.8 GiB. The old weights-share formula (32.5 + 8 GB) passed 60 GiB here; doctor failed it.
    dep = make_deployment("cluster")
    facts = _facts(dep, empty_facts)
    facts["spark2"].mem_available_mb = 60 * 1024
    assert _failed(preflight.run(dep, facts)) == [("spark2", "memory")]
    facts["spark2"].mem_available_mb = 92 * 1024
    assert _failed(preflight.run(dep, facts)) == []
    facts["spark2"].mem_available_mb = 91 * 1024
    assert _failed(preflight.run(dep, facts)) == [("spark2", "memory")]
    facts["spark2"].mem_available_mb = 120000
    # the lab's simulated nvidia-smi reports the GPU's memory: it wins over /proc/meminfo
    facts["spark2"].gpu_mem_free_mb = 10 * 1024
    assert _failed(preflight.run(dep, facts)) == [("spark2", "memory")]


def test_preflight_unreachable_docker_and_foreign_name():
    dep = make_deployment("cluster")
    facts = _facts(dep, empty_facts)
    facts["spark2"] = StepFailed("spark2 (192.0.2.2): unreachable over SSH after 3 attempts")
    facts["spark1"].other_names["sparkdeploy-vllm"] = "1" * 64
    failed = _failed(preflight.run(dep, facts))
    assert ("spark2", "ssh") in failed and ("spark1", "names") in failed
    facts = _facts(dep, empty_facts)
    facts["spark1"].docker_ok = False
    assert _failed(preflight.run(dep, facts)) == [("spark1", "docker")]


def test_preflight_disk_needs_the_weights_unless_cached_or_simulated():
    dep = make_deployment("solo")
    facts = _facts(dep, empty_facts)
    facts["spark1"].disk_free_mb["hf_cache"] = 20 * 1024
    assert _failed(preflight.run(dep, facts)) == [("spark1", "disk")]
    assert _failed(preflight.run(dep, facts, simulated=True)) == []
    facts["spark1"].model_cached = True
    assert _failed(preflight.run(dep, facts)) == []


# -- lock -----------------------------------------------------------------------------------------------


def test_second_concurrent_run_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path))
    inv = make_deployment().inventory
    with inventory_lock(inv):
        with pytest.raises(StepFailed, match="another sparkdeploy run"):
            with inventory_lock(inv):
                pass
    with inventory_lock(inv):  # released
        pass


# -- health gate against a stub server ------------------------------------------------------------------


class _Stub(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list] = []  # shared: the server makes one handler per request

    def log_message(self, *a):
        pass

    def do_GET(self):
        ok = self.path in ("/health", "/health/liveliness")
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"ok")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Stub.seen.append((self.path, self.headers.get("Authorization"), body))
        if body.get("model") == "broken":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(f"boom {SECRET_KEY}".encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(
            json.dumps({"choices": [{"message": {"content": "OK"}}], "usage": {"completion_tokens": 1}}).encode()
        )


@pytest.fixture
def stub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Stub.seen = []
    yield server.server_address[1]
    server.shutdown()


def _local(dep, port):
    for nd in dep.nodes:
        object.__setattr__(nd.node, "mgmt_ip", "127.0.0.1")
        nd.containers = [
            type(c)(c.name, c.role, c.image, c.run_script, c.config_hash, (port,), port)
            for c in nd.containers
            if c.health_port
        ]
    dep.endpoint = f"http://127.0.0.1:{port}/v1"
    dep.backends = [f"http://127.0.0.1:{port}/v1" for _ in dep.backends]


def test_health_gate_sends_a_real_completion_with_the_key(stub):
    dep = make_deployment("2xsolo")
    _local(dep, stub)
    gate = health.wait_healthy(dep, {}, timeout=5, states_known_running=True)
    assert gate.ok, gate.reason
    auth = [a for _, a, _ in _Stub.seen]
    assert auth == [f"Bearer {SECRET_KEY}", None, None]  # the proxy with the key, each backend without
    assert all(b["max_tokens"] == 1 and b["model"] == dep.model_name for _, _, b in _Stub.seen)


def test_health_gate_times_out_naming_the_check_and_masks(stub):
    dep = make_deployment("solo")
    _local(dep, stub)
    dep.recipe.recipe.served_model_name = "broken"
    gate = health.wait_healthy(dep, {}, timeout=1.5, states_known_running=True)
    assert not gate.ok and "chat completion" in gate.reason and "HTTP 500" in gate.reason
    assert SECRET_KEY not in gate.reason and "********" in gate.reason


# -- trust: known_hosts handling ------------------------------------------------------------------------


def test_known_hosts_lookup_and_replace(tmp_path):
    from sparkdeploy.cli.trust_cmd import recorded_keys, remove_host

    k_old = paramiko.RSAKey.generate(1024)
    k_other = paramiko.RSAKey.generate(1024)
    hashed = paramiko.HostKeys.hash_host("192.0.2.1")
    path = tmp_path / "known_hosts"
    path.write_text(f"# comment\n{hashed} ssh-rsa {k_old.get_base64()}\n192.0.2.9 ssh-rsa {k_other.get_base64()}\n")
    assert [k.get_base64() for k in recorded_keys(path, "192.0.2.1")] == [k_old.get_base64()]
    assert remove_host(path, "192.0.2.1") == 1
    text = path.read_text()
    assert "# comment" in text and "192.0.2.9" in text and hashed not in text


# -- apply with fake connections --------------------------------------------------------------------------


def _apply_conn(node, fail_on: str | None = None) -> RecordingConn:
    """A node that answers every command with a sha256-like line; `fail_on`: a write or command that fails."""
    failure = f"exited 1: no space left on device {SECRET_HF}"
    return RecordingConn(node, stdout="f" * 64 + "\n", fail_on=fail_on, failure=failure)


def _session(dep, **per_node):
    return recording_session(
        dep.inventory, **{n.name: per_node.get(n.name) or _apply_conn(n) for n in dep.inventory.nodes}
    )


def test_apply_runs_phase1_everywhere_before_phase2_and_writes_secrets_0600():
    from sparkdeploy.deploy.apply import apply_plan

    dep = make_deployment("cluster")
    plan = plan_deployment(dep, _facts(dep, empty_facts))
    order = []
    s = _session(dep)
    for c in s.conns.values():
        c.hook = lambda text, name=c.node.name: order.append(
            (name, text.split()[0] if not text.startswith("put") else "put")
        )
    apply_plan(s, plan)
    assert plan.counts()["changed"] == plan.changes and not plan.failed()
    first_start = min(i for i, (_, t) in enumerate(order) if t == "bash")
    last_write = max(i for i, (_, t) in enumerate(order) if t == "put" and i < first_start)
    assert last_write < first_start
    puts = [c for c in s.conns["spark1"].calls if c[0] == "put"]
    assert ("put", "/home/spark/.sparkdeploy/secrets.env", 0o600) in puts
    runs = [c[1] for c in s.conns["spark1"].calls if c[0] == "run"]
    assert runs[0] == "mkdir -p -m 0700 /home/spark/.sparkdeploy"
    assert "bash /home/spark/.sparkdeploy/vllm.run.sh" in runs


def test_apply_failure_on_one_node_stops_before_starting_anything_and_masks():
    from sparkdeploy.deploy.apply import apply_plan
    from sparkdeploy.deploy.plan import FAILED, SKIPPED

    dep = make_deployment("cluster")
    plan = plan_deployment(dep, _facts(dep, empty_facts))
    worker = dep.inventory.nodes[1]
    s = _session(dep, spark2=_apply_conn(worker, fail_on="vllm.entry.sh"))
    apply_plan(s, plan, mask=dep.secrets.mask)
    [failed] = plan.failed()
    assert (failed.node, failed.kind, failed.target) == ("spark2", "write", "vllm.entry.sh")
    assert SECRET_HF not in failed.detail and "********" in failed.detail
    assert all(st.status == SKIPPED for st in plan.steps if st.phase == 2 and st.change)
    assert not any(c[1].startswith("bash") for conn in s.conns.values() for c in conn.calls if c[0] == "run")
    assert failed.status == FAILED


def test_apply_interrupted_skips_the_rest():
    from sparkdeploy.deploy.apply import apply_plan
    from sparkdeploy.deploy.plan import SKIPPED
    from sparkdeploy.runtime.interrupts import Interrupt

    dep = make_deployment("solo")
    plan = plan_deployment(dep, _facts(dep, empty_facts))
    intr = Interrupt()
    s = _session(dep)
    s.conns["spark1"].hook = lambda text: intr.event.set() if "node.env" in text else None
    apply_plan(s, plan, intr)
    statuses = [(st.kind, st.target, st.status) for st in plan.steps]
    assert ("write", "node.env", "changed") in statuses
    assert ("write", "secrets.env", SKIPPED) in statuses
    assert ("start-container", "sparkdeploy-vllm", SKIPPED) in statuses


def test_gate_fails_fast_on_a_dead_rank_or_a_crash_loop():
    dead = health._dead({"spark2": {"sparkdeploy-vllm": ("exited", 137, 0)}})
    assert dead == ["spark2 sparkdeploy-vllm: exited (exit code 137)"]
    first = {"spark1": {"sparkdeploy-vllm": ("running", 0, 0)}}
    assert health._dead({"spark1": {"sparkdeploy-vllm": ("restarting", 1, 1)}}, first) == []
    [loop] = health._dead({"spark1": {"sparkdeploy-vllm": ("restarting", 1, 2)}}, first)
    assert "restarting in a loop" in loop
