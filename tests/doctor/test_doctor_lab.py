"""doctor against the shared lab: every check for real, and each fault with the right verdict and fix.

Faults are injected from the host (`docker exec NODE ...`, as root inside the node container) and undone in
`finally` blocks, then verified undone, so the shared lab is as it was for the tests after these:
MTU 1500 on one node's fabric port, sshd stopped on one node, the recipe's image untagged on one node, a
wrong HCA name and a `.local` name in a modified copy of the lab inventory, the Docker engine stopped on one
node, and a paused (hung) engine container.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.lab.nodes import ssh_banner
from sparkdeploy.lab.spec import FABRIC_IFACE

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]

RECIPE = "openai-gpt-oss-120b"  # solo, cluster (ray) and 2xsolo; the lab runs it on vllm-sim
NODE_CHECK_GROUPS = ("access", "engine", "gpu", "image", "model", "network", "roce")


def doctor(cli, inventory, *args):
    code, out, err = cli("doctor", "-i", str(inventory), "--json", *args)
    try:
        report = json.loads(out)
    except ValueError:
        raise AssertionError(f"doctor printed no JSON (exit {code}):\n{out}\n{err}") from None
    return code, report, err


def rows(report) -> dict[tuple[str, str | None], dict]:
    return {(r["check"], r["node"]): r for r in report["results"]}


def show(report) -> str:
    return "\n".join(
        f"{r['check']:<20} {r['node']!s:<7} {r['status']:<4} {r['measured']} | {r['fix']}" for r in report["results"]
    )


@pytest.fixture(scope="module")
def sim_image(lab):
    """The lab's stand-in engine image, once the recipe renders with it (image definitions land separately)."""
    from sparkdeploy.doctor.api import prepare
    from sparkdeploy.doctor.doctor_run import Options
    from sparkdeploy.images.definitions import load_definition

    sim = load_definition("vllm-sim")
    run = prepare(str(lab.spec.inventory_path), Options(recipe=RECIPE))
    assert run.deployment is not None, f"{RECIPE} does not render: {run.deployment_error}"
    return sim


@pytest.fixture
def spark2(lab):
    return lab.nodes[1]


# -- a healthy lab ----------------------------------------------------------------------------------------------


def test_every_check_passes_on_the_healthy_lab(lab, cli, sim_image):
    only = [a for g in (*NODE_CHECK_GROUPS, "inventory") for a in ("--only", g)]
    code, report, _err = doctor(cli, lab.spec.inventory_path, "--recipe", RECIPE, *only)
    assert code == 0, show(report)
    assert report["seconds"] < 60
    r = rows(report)
    from sparkdeploy.doctor.registry import CHECKS

    for check in CHECKS:
        if check.group in ("endpoint", "nccl", "guard"):  # guard.crash: tests/guard/test_guard_lab.py (its black box)
            continue
        if check.opt_in:  # the owner's tests (--tests): tests/doctor/test_owner_tests_lab.py
            continue
        for node in ("spark1", "spark2") if check.scope == "node" else (None,):
            row = r[(check.id, node)]
            if (check.id, node) == ("network.ports", "spark2"):
                # cluster/torchrun: the worker's engine opens no port; its guard's watcher does (issue 43)
                assert row["status"] == "pass" and "7390" in row["measured"], row
                continue
            if check.id == "engine.disk" and row["status"] == "warn":
                continue  # the lab's Docker root is this machine's disk: its free space is not the lab's to fix
            if check.id == "engine.crashes" and row["status"] == "skip":
                # the shared lab may hold no deployment when this test runs: nothing can have crashed
                assert "no sparkdeploy container" in row["measured"], row
                continue
            assert row["status"] == "pass", f"{check.id} {node}: {row}"
    # the stand-ins are labelled, the real parts are not
    assert r[("gpu.present", "spark1")]["simulated"] and r[("roce.gid", "spark2")]["simulated"]
    assert r[("network.speed", "spark1")]["simulated"] and not r[("network.mtu", "spark1")]["simulated"]
    assert "9000" in r[("network.mtu", "spark2")]["measured"]
    assert "8972 B DF ok" in r[("network.ping_df", "spark1")]["measured"]
    ids = {r[("image.present", n)]["measured"] for n in ("spark1", "spark2")}
    assert len(ids) == 1  # same tag, same image ID on both
    torch_row = r[("image.torch_nccl", "spark1")]
    assert torch_row["measured"].startswith("torch ") and "NCCL" in torch_row["measured"]
    assert report["simulated_image"] is True


def test_plain_table_is_grouped_and_readable(lab, cli, sim_image):
    code, out, _ = cli("doctor", "-i", str(lab.spec.inventory_path), "--recipe", RECIPE, "--only", "network")
    assert code == 0, out
    assert "network.mtu" in out and "spark1" in out and "spark2" in out and "PASS" in out
    assert out.count("network.mtu") == 1  # the check's name once, one row per node under it
    assert "pass, 0 warn, 0 fail" in out


# -- faults ------------------------------------------------------------------------------------------------------


def _mtu(lab, node) -> int:
    return int(lab.docker_exec(node, "cat", f"/sys/class/net/{FABRIC_IFACE}/mtu").stdout)


def test_mtu_1500_on_one_node(lab, cli, spark2):
    assert _mtu(lab, spark2) == 9000
    try:
        lab.docker_exec(spark2, "ip", "link", "set", FABRIC_IFACE, "mtu", "1500")
        code, report, _ = doctor(cli, lab.spec.inventory_path, "--only", "network", "--only", "roce")
    finally:
        lab.docker_exec(spark2, "ip", "link", "set", FABRIC_IFACE, "mtu", "9000")
    assert _mtu(lab, spark2) == 9000  # restored
    assert code == 1, show(report)
    r = rows(report)
    mtu = r[("network.mtu", "spark2")]
    assert mtu["status"] == "fail" and "1500" in mtu["measured"]
    assert f"ip link set {FABRIC_IFACE} mtu 9000" in mtu["fix"]
    assert r[("network.mtu", "spark1")]["status"] == "pass"
    # jumbo frames do not pass in either direction
    for name in ("spark1", "spark2"):
        assert r[("network.ping_df", name)]["status"] == "fail", show(report)
    assert "message too long" in r[("network.ping_df", "spark2")]["measured"]
    # RoCE sees the small MTU too: 1024-byte RDMA frames
    assert r[("roce.devices", "spark2")]["status"] == "warn" and "1024" in r[("roce.devices", "spark2")]["measured"]
    # and the lab is whole again
    code, report, _ = doctor(cli, lab.spec.inventory_path, "--only", "network.mtu", "--only", "network.ping_df")
    assert code == 0, show(report)


def test_a_node_down(lab, cli, spark2):
    try:
        lab.docker_exec(spark2, "lab-service", "stop", "sshd")
        started = time.monotonic()
        code, report, _ = doctor(cli, lab.spec.inventory_path, "--only", "access", "--only", "gpu", "--only", "network")
        seconds = time.monotonic() - started
    finally:
        lab.docker_exec(spark2, "lab-service", "start", "sshd")
    deadline = time.monotonic() + 30
    while not ssh_banner(spark2.mgmt_ip) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ssh_banner(spark2.mgmt_ip).startswith("SSH-"), "sshd on spark2 did not come back"
    assert code == 1, show(report)
    r = rows(report)
    down = r[("access.ssh", "spark2")]
    assert down["status"] == "fail" and "refused" in down["measured"].lower()
    assert "sshd" in down["fix"]
    assert r[("gpu.present", "spark2")]["status"] == "skip"
    assert r[("gpu.present", "spark1")]["status"] == "pass"  # the other node is still checked
    assert r[("network.mgmt", "spark1")]["status"] == "pass"  # spark2 still answers ping: only sshd is down
    assert seconds < 15
    code, report, _ = doctor(cli, lab.spec.inventory_path, "--only", "access.ssh")
    assert code == 0, show(report)


def test_image_missing_on_one_node(lab, cli, spark2, sim_image):
    tag = sim_image.tag
    hold = "sparkdeploy-doctor-test/hold:missing-image"
    before = lab.docker_exec(spark2, "docker", "image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
    assert before, f"{tag} is not on spark2: the lab should have loaded it"
    try:
        # untag only: the layers stay (a second tag holds them), nothing has to be sent again to restore
        lab.docker_exec(spark2, "docker", "tag", tag, hold)
        lab.docker_exec(spark2, "docker", "rmi", tag)
        code, report, _ = doctor(cli, lab.spec.inventory_path, "--recipe", RECIPE, "--only", "image")
    finally:
        lab.docker_exec(spark2, "docker", "tag", hold, tag, check=False)
        lab.docker_exec(spark2, "docker", "rmi", hold, check=False)
    after = lab.docker_exec(spark2, "docker", "image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
    assert after == before  # restored, same image ID
    assert code == 1, show(report)
    r = rows(report)
    missing = r[("image.present", "spark2")]
    assert missing["status"] == "fail" and tag in missing["measured"]
    assert "docker load" in missing["fix"] and spark2.mgmt_ip in missing["fix"]
    assert r[("image.present", "spark1")]["status"] == "pass"
    assert r[("image.torch_nccl", "spark2")]["status"] == "skip"


def test_wrong_hca_name_in_the_inventory(lab, cli, derived_inventory):
    def wrong(data):
        data["nodes"][1]["hcas"] = ["rocep1s0f1", "mlx5_bogus"]

    path = derived_inventory(wrong)
    # cluster: spark2 is part of the deployment, so a node.env is rendered for it and roce.nccl_env runs there
    code, report, _ = doctor(cli, path, "--recipe", RECIPE, "-t", "cluster", "--only", "roce")
    assert code == 1, show(report)
    r = rows(report)
    hcas = r[("roce.hcas", "spark2")]
    assert hcas["status"] == "fail" and "mlx5_bogus" in hcas["measured"]
    assert "hcas: [roceP2p1s0f1, rocep1s0f1]" in hcas["fix"]
    assert r[("roce.hcas", "spark1")]["status"] == "pass"
    # the rendered node.env names the wrong HCA too: the check ran and failed (a skip fails this test)
    env = r[("roce.nccl_env", "spark2")]
    assert env["status"] == "fail", show(report)
    assert "NCCL_IB_HCA: no RDMA device mlx5_bogus" in env["measured"], env
    assert r[("roce.nccl_env", "spark1")]["status"] == "pass", show(report)


def test_local_name_in_the_inventory(lab, cli, derived_inventory):
    def mdns(data):
        data["nodes"][1]["mgmt_ip"] = "spark2.local"

    code, report, _err = doctor(cli, derived_inventory(mdns))
    assert code == 2
    first = report["results"][0]
    assert first["check"] == "inventory.valid" and first["status"] == "fail"
    assert "mDNS" in first["measured"] and "IP address" in first["fix"]
    assert all(r["status"] == "skip" for r in report["results"][1:])  # nothing connected anywhere


def _docker_ok(lab, node) -> bool:
    return lab.ssh(node, "docker info --format '{{.ServerVersion}}'", check=False).returncode == 0


def test_docker_engine_stopped_on_one_node(lab, cli, spark2):
    try:
        lab.docker_exec(spark2, "lab-service", "stop", "dockerd")
        code, report, _ = doctor(
            cli, lab.spec.inventory_path, "--only", "engine", "--only", "access", "--only", "endpoint"
        )
    finally:
        lab.docker_exec(spark2, "lab-service", "start", "dockerd")
    deadline = time.monotonic() + 60
    while not _docker_ok(lab, spark2) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _docker_ok(lab, spark2), "dockerd on spark2 did not come back"
    assert code == 1, show(report)
    r = rows(report)
    eng = r[("engine.running", "spark2")]
    assert eng["status"] == "fail" and "not running" in eng["measured"]
    assert "systemctl start docker" in eng["fix"]
    assert r[("engine.running", "spark1")]["status"] == "pass"
    assert r[("access.docker", "spark2")]["status"] == "pass"  # spark is in group docker: not the problem
    assert r[("endpoint.health", "spark2")]["status"] == "skip"
    code, report, _ = doctor(cli, lab.spec.inventory_path, "--only", "engine.running")
    assert code == 0, show(report)


# -- the NCCL probe (SIMULATED in the lab: gloo on CPU over the fabric IPs) ----------------------------------


def test_nccl_probe_runs_simulated_over_the_fabric(lab, cli, sim_image):
    code, report, _ = doctor(
        cli, lab.spec.inventory_path, "--recipe", RECIPE, "--nccl", "--only", "nccl", "--nccl-max-bytes", "4M"
    )
    r = rows(report)
    probe = r[("nccl.allreduce", None)]
    assert code == 0 and probe["status"] == "pass", show(report)
    assert probe["simulated"] and "SIMULATED gloo/CPU" in probe["measured"]
    assert "not applicable" in probe["expected"]
    result = report["nccl"]
    assert result["backend"] == "gloo" and result["world_size"] == 2
    assert {x["host"] for x in result["ranks"]} == {"spark1", "spark2"}
    assert result["rows"][-1]["size"] == 4 * 2**20 and all(x["wrong"] == 0 for x in result["rows"])
    # gloo has no NCCL to call directly: the sweep and the one latency row say torch.distributed
    assert result["sweep_method"] == "torch.distributed"
    assert [x["id"] for x in result["lat4k"]["rows"]] == ["eager torch.distributed"]
    # rendezvous went over the head's fabric IP
    assert {x["master_addr"] for x in result["ranks"]} == {lab.nodes[0].fabric_ip}
    # the result the probe (root in its container) wrote is the SSH user's, like the rest of the state dir
    owner = lab.ssh(lab.nodes[0], "stat -c %U .sparkdeploy/doctor/result.json").stdout.strip()
    assert owner == "spark"
    # nothing of the probe is left running
    for node in lab.nodes:
        names = lab.docker_exec(node, "docker", "ps", "-a", "--format", "{{.Names}}").stdout.split()
        assert "sparkdeploy-doctor-nccl" not in names
    # `down` removes what doctor wrote too (issue 30: it said nothing was left while doctor/ stayed on every
    # node), and its last line is true
    inv = str(lab.spec.inventory_path)
    for node in lab.nodes:
        assert lab.ssh(node, "test -d .sparkdeploy/doctor", check=False).returncode == 0
    r = sd("down", "-i", inv)
    assert r.returncode == 0, r.stderr[-2000:]
    for node in lab.nodes:
        assert lab.ssh(node, "test -e .sparkdeploy/doctor", check=False).returncode != 0, node.name
    assert "Nothing of sparkdeploy's is left on spark1, spark2." in r.stdout, r.stdout[-1500:]


# -- endpoints of a running topology --------------------------------------------------------------------------


def sd(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def deployed(lab, sim_image):
    inv = str(lab.spec.inventory_path)

    def up(topology: str):
        r = sd("up", "-i", inv, "--recipe", RECIPE, "--topology", topology)
        assert r.returncode == 0, f"up {topology}: {r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return inv

    yield up
    deadline = time.monotonic() + 300
    while True:  # another run holding the inventory's lock finishes first
        r = sd("down", "-i", inv)
        if r.returncode == 0 or "another sparkdeploy run" not in r.stderr or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert r.returncode == 0, r.stderr[-2000:]


def test_endpoints_of_2xsolo_and_a_hung_engine(lab, cli, deployed):
    inv = deployed("2xsolo")
    code, report, _ = doctor(cli, inv, "--recipe", RECIPE, "--topology", "2xsolo", "--only", "endpoint")
    assert code == 0, show(report)
    r = [x for x in report["results"] if x["status"] != "skip"]
    health = [x for x in r if x["check"] == "endpoint.health"]
    assert any("proxy" in x["measured"] and "backends healthy: 2" in x["measured"] for x in health), show(report)
    done = [x for x in r if x["check"] == "endpoint.completion"]
    assert len(done) == 3 and all(x["status"] == "pass" for x in done)  # 2 engines + the proxy
    # A paused container is reported as such (Docker knows it is not running) ...
    spark2 = lab.nodes[1]
    lab.docker_exec(spark2, "docker", "pause", "sparkdeploy-vllm")
    try:
        code, report, _ = doctor(cli, inv, "--only", "endpoint.health")
    finally:
        lab.docker_exec(spark2, "docker", "unpause", "sparkdeploy-vllm")
    paused = rows(report)[("endpoint.health", "spark2")]
    assert code == 1 and paused["status"] == "fail" and "Paused" in paused["measured"], show(report)
    # ... a hung engine is not: its processes stopped (SIGSTOP from the node), the container still "running",
    # the kernel still accepts connections, nothing answers. The check must fail within its timeout.
    pids = lab.docker_exec(spark2, "docker", "top", "sparkdeploy-vllm", "-eo", "pid").stdout.split()[1:]
    assert pids
    lab.docker_exec(spark2, "kill", "-STOP", *pids, check=False)  # a short-lived child may be gone already
    try:
        started = time.monotonic()
        code, report, _ = doctor(cli, inv, "--only", "endpoint.health")
        seconds = time.monotonic() - started
    finally:
        lab.docker_exec(spark2, "kill", "-CONT", *pids, check=False)
    assert code == 1, show(report)
    hung = rows(report)[("endpoint.health", "spark2")]
    assert hung["status"] == "fail" and "no answer within" in hung["measured"], show(report)
    assert seconds < 45
    # and it answers again once resumed
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        code, report, _ = doctor(cli, inv, "--only", "endpoint.health")
        if code == 0:
            break
        time.sleep(2)
    assert code == 0, show(report)


def test_doctor_checks_the_recipe_that_is_deployed_and_says_which(lab, cli, sim_image):
    """Issue 30: with another recipe deployed than the inventory's default, doctor checked the default (its
    image, memory and ports) and said so in its header. It reads the nodes' manifests now."""
    inv = str(lab.spec.inventory_path)
    other = "qwen3-coder-30b-int4"
    assert other != load_inventory(inv).cluster.default_recipe
    r = sd("up", "-i", inv, "--recipe", other, "--topology", "solo", "--timeout", "240")
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    try:
        code, report, _ = doctor(cli, inv, "--only", "inventory.recipe", "--only", "gpu.memory")
        assert (report["recipe"], report["recipe_source"]) == (other, "deployed on spark1"), show(report)
        assert code == 0, show(report)
        code, out, _ = cli("doctor", "-i", inv, "--only", "inventory.recipe")
        assert f"recipe {other} (solo)" in out and "[deployed on spark1]" in out, out
        code, report, _ = doctor(cli, inv, "--recipe", RECIPE, "--only", "inventory.recipe")
        assert (report["recipe"], report["recipe_source"]) == (RECIPE, "given with --recipe"), show(report)
    finally:
        r = sd("down", "-i", inv)
        assert r.returncode == 0, r.stderr[-2000:]
    code, report, _ = doctor(cli, inv, "--only", "inventory.recipe")
    assert report["recipe"] == load_inventory(inv).cluster.default_recipe, show(report)
    assert report["recipe_source"] == "nothing is deployed: the inventory's default recipe", show(report)


def test_unknown_and_changed_host_keys_are_refused(lab, cli, derived_inventory, tmp_path):
    import paramiko

    from sparkdeploy.runtime.remote import fingerprint

    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    path = derived_inventory(lambda d: d["cluster"].update(known_hosts=str(empty)), name="unknown.yaml")
    code, report, _ = doctor(cli, path, "--only", "access.ssh")
    assert code == 1
    row = rows(report)[("access.ssh", "spark2")]
    assert row["status"] == "fail" and "unknown SSH host key" in row["measured"] and "SHA256:" in row["measured"]
    assert "sparkdeploy trust spark2" in row["fix"]
    assert not empty.read_text()  # nothing was added behind the user's back

    other = paramiko.Ed25519Key.from_private_key_file(str(lab.key))  # a key that is not spark2's host key
    wrong = tmp_path / "known_hosts_wrong"
    good = lab.known_hosts.read_text().splitlines()
    lines = [ln for ln in good if not ln.startswith(lab.nodes[1].mgmt_ip + " ")]
    lines.append(f"{lab.nodes[1].mgmt_ip} {other.get_name()} {other.get_base64()}")
    wrong.write_text("\n".join(lines) + "\n")
    path = derived_inventory(lambda d: d["cluster"].update(known_hosts=str(wrong)), name="changed.yaml")
    code, report, _ = doctor(cli, path, "--only", "access.ssh")
    r = rows(report)
    assert code == 1 and r[("access.ssh", "spark1")]["status"] == "pass"
    row = r[("access.ssh", "spark2")]
    assert row["status"] == "fail" and "CHANGED" in row["measured"] and fingerprint(other) in row["measured"]


def test_no_module_is_first_imported_on_a_check_thread(lab, sim_image, tmp_path):
    """CPython 3.11 can crash compiling modules on two threads at once (python/cpython#106905): doctor's checks
    must find every module imported already. Cold interpreters, bytecode writing off, three runs: any module first
    imported off the main thread fails the test (the race itself shows only at random)."""
    harness = REPO / "tests" / "support" / "offthread_imports.py"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for attempt in range(3):
        out = tmp_path / f"run{attempt}.json"
        proc = subprocess.run(
            [
                sys.executable,
                "-B",
                str(harness),
                str(out),
                "--",
                "doctor",
                "-i",
                str(lab.spec.inventory_path),
                "--recipe",
                RECIPE,
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=tmp_path,
            env=env,
        )
        assert proc.returncode == 0 and out.is_file(), proc.stderr[-2000:]
        result = json.loads(out.read_text())
        report = json.loads(proc.stdout)
        crashed = [r for r in report["results"] if "check crashed" in r["measured"]]
        assert not crashed, crashed
        assert result["imports"] == [], f"run {attempt}: imported on worker threads: {result['imports']}"
