"""The runner, the registry, check logic on hand-made facts, and the CLI contract (no lab needed)."""

from __future__ import annotations

import copy
import json
import socket
import threading
import time

import pytest
import yaml

from sparkdeploy.checks import Check, Result
from sparkdeploy.doctor import endpoint, gpu, roce
from sparkdeploy.doctor import network_checks as network
from sparkdeploy.doctor.api import prepare
from sparkdeploy.doctor.doctor_run import NodeSession, Options
from sparkdeploy.doctor.registry import BY_ID, CHECKS
from sparkdeploy.doctor.runner import _run_tasks, _Task, select
from sparkdeploy.errors import ConfigError
from sparkdeploy.facts import GpuFact, NetworkFact, NodeFacts, RdmaFact
from sparkdeploy.facts.parsers import Link, RdmaDevice, RdmaPort
from tests.conftest import TWO_NODES
from tests.support.doubles import RecordingConn

# -- helpers ---------------------------------------------------------------------------------------------


def make_run(write_inventory, facts: dict[str, dict], data=None, recipe=None, topology=None):
    path = write_inventory(data)
    run = prepare(str(path), Options(recipe=recipe, topology=topology))
    for node in run.nodes:
        session = NodeSession(node, RecordingConn(node))
        session.connected = True
        nf = NodeFacts(node=node.name, home="/home/spark", docker_ok=True)
        for key, value in facts.get(node.name, {}).items():
            if key == "network":  # the typed facts of sparkdeploy.facts, from the hand-made values
                nf.network = NetworkFact(**value)
            elif key == "roce":
                nf.rdma = RdmaFact(**value)
            elif key == "gpu":
                nf.kernel = value.pop("kernel", "")
                value.pop("meminfo", None)
                nf.gpu = GpuFact(**value)
            else:
                session.memo.get(key, lambda v=value: v)
        session.memo.get("facts", lambda nf=nf: nf)
        run.sessions[node.name] = session
    return run


def node(run, name):
    return next(n for n in run.nodes if n.name == name)


# -- registry and selection --------------------------------------------------------------------------------


def test_registry_ids_groups_and_titles():
    groups = {c.group for c in CHECKS}
    assert groups == {
        "inventory",
        "access",
        "engine",
        "guard",
        "gpu",
        "image",
        "model",
        "network",
        "roce",
        "endpoint",
        "nccl",
        "tests",
    }
    assert all(c.title and c.timeout_s > 0 for c in CHECKS)
    assert len(BY_ID) == len(CHECKS)


def test_select_prefix_unknown_and_opt_in():
    assert {c.id for c in select(CHECKS, ["network"])} == {c.id for c in CHECKS if c.group in ("network", "inventory")}
    assert [c.id for c in select(CHECKS, ["gpu.mem"])] == ["inventory.valid", "inventory.recipe", "gpu.memory"]
    assert "nccl.allreduce" not in {c.id for c in select(CHECKS)}
    assert "nccl.allreduce" in {c.id for c in select(CHECKS, options=Options(nccl=True))}
    assert [c.id for c in select(CHECKS, ["nccl"])][-1] == "nccl.allreduce"  # asking by name turns it on
    with pytest.raises(ConfigError) as err:
        select(CHECKS, ["netwrok"])
    assert "matches no check" in str(err.value)


# -- the runner: timeouts name the check, crashes are rows --------------------------------------------------


def test_a_hung_check_fails_within_its_timeout_naming_it(write_inventory):
    run = make_run(write_inventory, {})
    hung = Check("network.hang", "sleeps", lambda r, n: time.sleep(5) or Result("pass"), timeout_s=0.3)
    quick = Check("network.quick", "returns", lambda r, n: Result("pass", "fine"), timeout_s=5)
    started = time.monotonic()
    results = _run_tasks(run, [_Task(hung, node(run, "spark1")), _Task(quick, node(run, "spark2"))])
    assert time.monotonic() - started < 2
    by = {r.check: r for r in results}
    assert by["network.hang"].status == "fail"
    assert "check network.hang timed out after 0.3 s on spark1" in by["network.hang"].measured
    assert "--only network.hang" in by["network.hang"].fix
    assert by["network.quick"].status == "pass" and by["network.quick"].node == "spark2"


def test_a_crashing_check_is_a_failed_row_not_a_traceback(write_inventory):
    run = make_run(write_inventory, {})
    boom = Check("gpu.boom", "raises", lambda r, n: 1 / 0)
    [res] = _run_tasks(run, [_Task(boom, node(run, "spark1"))])
    assert res.status == "fail" and "ZeroDivisionError" in res.measured and res.node == "spark1"


# -- a hung endpoint ---------------------------------------------------------------------------------------


@pytest.fixture
def silent_server():
    """Accepts TCP connections and never answers (a wedged engine)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []
    stop = threading.Event()

    def loop():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(1)
    for c in conns:
        c.close()
    srv.close()


def test_hung_endpoint_http_times_out(silent_server):
    started = time.monotonic()
    with pytest.raises(endpoint.HttpError) as err:
        endpoint.http(f"http://127.0.0.1:{silent_server}/health", timeout=0.5)
    assert "no answer within 0.5 s" in str(err.value)
    assert time.monotonic() - started < 2


def test_hung_endpoint_check_fails_within_the_check_timeout(write_inventory, silent_server):
    run = make_run(write_inventory, {})
    check = Check(
        "endpoint.health",
        "hangs",
        lambda r, n: endpoint.http(f"http://127.0.0.1:{silent_server}/health", timeout=30),
        timeout_s=0.5,
    )
    [res] = _run_tasks(run, [_Task(check, node(run, "spark1"))])
    assert res.status == "fail" and "check endpoint.health timed out after 0.5 s on spark1" in res.measured


# -- check logic on hand-made facts -------------------------------------------------------------------------


def _net(mtu, addr):
    return {
        "links": {"enp1s0f1np1": Link("enp1s0f1np1", mtu, "UP", ["UP", "LOWER_UP"], [addr])},
        "speeds": {"enp1s0f1np1": 200000},
        "simulated_speed": False,
    }


def test_mtu_mismatch_fails_the_low_node_only(write_inventory):
    run = make_run(
        write_inventory,
        {"spark1": {"network": _net(9000, "198.51.100.1/24")}, "spark2": {"network": _net(1500, "198.51.100.2/24")}},
    )
    low = network.mtu(run, node(run, "spark2"))
    high = network.mtu(run, node(run, "spark1"))
    assert low.status == "fail" and "1500" in low.measured and "mtu 9000" in low.fix
    assert high.status == "pass" and "differs" in high.measured
    both_small = make_run(
        write_inventory,
        {"spark1": {"network": _net(1500, "198.51.100.1/24")}, "spark2": {"network": _net(1500, "198.51.100.2/24")}},
    )
    assert network.mtu(both_small, node(both_small, "spark1")).status == "warn"


def test_link_missing_and_wrong_address(write_inventory):
    run = make_run(
        write_inventory,
        {
            "spark1": {
                "network": {"links": {"eth0": Link("eth0", 1500, "UP", ["UP"])}, "speeds": {}, "simulated_speed": False}
            },
            "spark2": {"network": _net(9000, "10.9.9.9/24")},
        },
    )
    r1 = network.link(run, node(run, "spark1"))
    assert r1.status == "fail" and "no interface enp1s0f1np1" in r1.measured and "eth0" in r1.measured
    r2 = network.link(run, node(run, "spark2"))
    assert r2.status == "fail" and "no interface holds 198.51.100.2" in r2.measured


def _rdma(names, simulated=False):
    devs = {}
    for n in names:
        d = RdmaDevice(n, board_id="SIMULATED" if simulated else "NVD")
        d.ports[1] = RdmaPort(1, "PORT_ACTIVE", 4096, 4096, "Ethernet")
        devs[n] = d
    return {"rc": 0, "error": "", "devices": devs, "gids": [], "gids_text": ""}


def test_wrong_hca_name_fails_with_the_real_names(write_inventory):
    data = copy.deepcopy(TWO_NODES)
    data["nodes"][1]["hcas"] = ["rocep1s0f1", "mlx5_bogus"]
    run = make_run(write_inventory, {"spark2": {"roce": _rdma(["rocep1s0f1", "roceP2p1s0f1"])}}, data=data)
    res = roce.hcas(run, node(run, "spark2"))
    assert res.status == "fail" and "mlx5_bogus" in res.measured
    assert "hcas: [roceP2p1s0f1, rocep1s0f1]" in res.fix


def test_driver_against_the_known_bad_list(write_inventory):
    def facts(version, kernel="6.11.0-1016-nvidia"):
        return {
            "gpu": {
                "rc": 0,
                "gpus": [
                    {
                        "index": "0",
                        "name": "NVIDIA GB10",
                        "driver_version": version,
                        "memory.total": None,
                        "memory.used": None,
                        "memory.free": None,
                        "temperature.gpu": "40",
                    }
                ],
                "error": "",
                "simulated": False,
                "meminfo": {},
                "kernel": kernel,
            }
        }

    for version, kernel, status in [
        ("580.95.05", "6.11.0-1016-nvidia", "pass"),
        ("590.48.01", "x", "warn"),
        ("575.51.02", "x", "fail"),
        ("580.126.09", "6.17.0-1008-nvidia", "warn"),
    ]:
        run = make_run(write_inventory, {"spark1": facts(version, kernel)})
        res = gpu.driver(run, node(run, "spark1"))
        assert res.status == status, (version, kernel, res)
        if status != "pass":
            assert "source:" in res.fix  # every known-bad verdict cites where it comes from


def test_known_bad_data_file_is_sourced():
    data = gpu.known_bad()
    entries = [data["drivers"]["minimum"], *data["drivers"]["bad"], *data["kernels"]["bad"]]
    for e in entries:
        assert e["source"].startswith("http") and e["why"] and e["fix"] and e["severity"] in ("warn", "fail")


# -- the CLI contract ------------------------------------------------------------------------------------------


def test_local_name_is_a_failed_inventory_check_exit_2(cli, write_inventory):
    data = copy.deepcopy(TWO_NODES)
    data["nodes"][1]["mgmt_ip"] = "spark2.local"
    path = write_inventory(data)
    code, out, err = cli("doctor", "-i", str(path))
    assert code == 2
    assert "inventory.valid" in out and "FAIL" in out and "mDNS" in out
    assert "write the node's IP address in mgmt_ip" in out
    assert "error:" in err and "mDNS" in err  # the ConfigError contract: one line per problem, no traceback
    code, out, _ = cli("doctor", "-i", str(path), "--json")
    report = json.loads(out)
    assert code == 2 and report["exit_code"] == 2 and not report["ok"]
    first = report["results"][0]
    assert first["check"] == "inventory.valid" and first["status"] == "fail" and "mgmt_ip" in first["fix"]
    assert all(r["status"] == "skip" for r in report["results"][1:])


def test_unknown_only_is_a_usage_error(cli, inventory_file):
    code, _, err = cli("doctor", "-i", str(inventory_file), "--only", "nope")
    assert code == 2 and "matches no check" in err


def test_list_checks(cli):
    code, out, _ = cli("doctor", "--list", "--json")
    ids = [c["id"] for c in json.loads(out)]
    assert code == 0 and ids == [c.id for c in CHECKS]


def test_unreachable_node_fails_access_and_skips_the_rest(cli, write_inventory):
    # TEST-NET addresses: nothing answers. access.ssh is included even when --only does not name it.
    data = copy.deepcopy(TWO_NODES)
    for n in data["nodes"]:
        n["ssh"]["port"] = 22  # an explicit port: the quick TCP probe decides
    path = write_inventory(data)
    import sparkdeploy.doctor.runner as runner

    old = runner.CONNECT_TIMEOUT_S
    runner.CONNECT_TIMEOUT_S = 0.5
    try:
        code, out, _ = cli("doctor", "-i", str(path), "--only", "gpu.present", "--json")
    finally:
        runner.CONNECT_TIMEOUT_S = old
    report = json.loads(out)
    assert code == 1
    rows = {(r["check"], r["node"]): r for r in report["results"]}
    assert rows[("access.ssh", "spark1")]["status"] == "fail"
    assert "sshd" in rows[("access.ssh", "spark1")]["fix"]
    assert rows[("gpu.present", "spark2")]["status"] == "skip"


def test_json_is_valid_yaml_free_of_secrets(cli, refusing_inventory):
    from tests.conftest import SECRET_HF, SECRET_KEY

    # inventory.recipe reads what the nodes run: the nodes (down here) are asked too
    _code, out, _ = cli("doctor", "-i", str(refusing_inventory), "--only", "inventory", "--json")
    assert SECRET_HF not in out and SECRET_KEY not in out
    first = yaml.safe_load(out)["results"][0]
    assert (first["check"], first["status"]) == ("inventory.valid", "pass"), first


def test_clock_skew_over_a_second_fails(write_inventory):
    run = make_run(write_inventory, {})
    import sparkdeploy.doctor.network_checks as net

    def clock(n, offset: float) -> RecordingConn:
        from sparkdeploy.runtime.remote import CommandResult

        return RecordingConn(
            n, answer=lambda _c, _s: CommandResult(n.name, "date", 0, f"{time.time() + offset:.6f}\n", "")
        )

    run.sessions["spark1"].conn = clock(node(run, "spark1"), 0.0)
    run.sessions["spark2"].conn = clock(node(run, "spark2"), 4.0)
    res = net.clock(run, node(run, "spark2"))
    assert res.status == "fail" and res.measured.startswith("+4.0") and "timedatectl set-ntp true" in res.fix
    assert net.clock(run, node(run, "spark1")).status == "pass"


def test_strict_turns_warnings_into_failure():
    from sparkdeploy.doctor.runner import Report

    report = Report(
        results=[Result("pass", check="a.b"), Result("warn", check="a.c", node="spark1"), Result("skip", check="a.d")]
    )
    assert report.exit_code() == 0 and report.exit_code(strict=True) == 1
    report.results.append(Result("fail", check="a.e"))
    assert report.exit_code() == 1


def test_report_collapses_identical_skips_only():
    from sparkdeploy.doctor.table import _collapse

    rows = [
        Result("skip", "not run: spark1 is not reachable", check="gpu.present", node="spark1"),
        Result("skip", "not run: spark2 is not reachable", check="gpu.present", node="spark2"),
        Result("pass", "9000", check="network.mtu", node="spark1"),
        Result("skip", "no peer", check="network.mtu", node="spark2"),
    ]
    out = _collapse(rows)
    assert [(r.check, r.node) for r in out] == [
        ("gpu.present", "all"),
        ("network.mtu", "spark1"),
        ("network.mtu", "spark2"),
    ]
    assert out[0].measured == "not run: each node is not reachable"


def test_gid_index_per_twin(write_inventory):
    from sparkdeploy.facts.parsers import GidEntry

    def facts(twin_ip):
        gids = [GidEntry("rocep1s0f1", 1, 3, "::ffff:198.51.100.2", "198.51.100.2", "v2", "enp1s0f1np1")]
        if twin_ip:
            gids.append(GidEntry("roceP2p1s0f1", 1, 3, "::ffff:" + twin_ip, twin_ip, "v2", "enP2p1s0f1np1"))
        return dict(_rdma(["rocep1s0f1", "roceP2p1s0f1"]), gids=gids)

    run = make_run(write_inventory, {"spark2": {"roce": facts("198.51.101.2")}})
    res = roce.gid(run, node(run, "spark2"))
    assert res.status == "pass" and "roceP2p1s0f1: 3 (198.51.101.2 on enP2p1s0f1np1)" in res.measured
    run = make_run(write_inventory, {"spark2": {"roce": facts(None)}})
    res = roce.gid(run, node(run, "spark2"))
    assert res.status == "fail" and "roceP2p1s0f1: none" in res.measured and "IPv4" in res.fix
    data = copy.deepcopy(TWO_NODES)
    data["nodes"][1]["gid_index"] = 1
    run = make_run(write_inventory, {"spark2": {"roce": facts("198.51.101.2")}}, data=data)
    res = roce.gid(run, node(run, "spark2"))
    assert res.status == "fail" and "gid_index: 3" in res.fix


def test_the_state_dir_check_looks_at_every_folder_of_a_stack():
    """doctor on a stack names the stack's folders (not "~/.sparkdeploy not made yet"), and a root-owned entry in
    one of them with the chown of that folder (the folders as the `state_dirs` fact reads them)."""
    from types import SimpleNamespace

    from sparkdeploy.config.inventory import Inventory
    from sparkdeploy.doctor import access
    from sparkdeploy.facts import NodeFacts, StateDirFact
    from tests.conftest import TWO_NODES

    inv = Inventory.model_validate(TWO_NODES)
    f = NodeFacts("spark1", home="/home/spark")
    run = SimpleNamespace(inventory=inv, node_facts=lambda node: f)
    assert access.state_dir(run, inv.nodes[0]).measured == "~/.sparkdeploy not made yet"
    f.state_dirs = {
        d: StateDirFact(d, 0o700, "", ["manifest.json"])
        for d in (".sparkdeploy-chat", ".sparkdeploy-gateway", ".sparkdeploy-guard")
    }
    ok = access.state_dir(run, inv.nodes[0])
    assert ok.status == "pass", ok
    assert ok.measured == "~/.sparkdeploy-chat, ~/.sparkdeploy-gateway, ~/.sparkdeploy-guard are spark's (a stack's)"
    f.state_dirs[".sparkdeploy-gateway"].foreign = "/home/spark/.sparkdeploy-gateway/spend"
    bad = access.state_dir(run, inv.nodes[0])
    assert bad.status == "fail" and bad.measured.startswith("/home/spark/.sparkdeploy-gateway/spend is not owned")
    assert bad.fix == "on spark1: sudo chown -R spark: ~/.sparkdeploy-gateway"


@pytest.mark.parametrize(
    "recipe,engine,text",
    [
        ("qwen3-coder-30b", "vllm", "vLLM 0.32.0"),
        ("sglang-gpt-oss-120b", "sglang", "SGLang 0.5.23"),
        ("llamacpp-qwen3-coder-30b", "llamacpp", "llama.cpp b11434"),
    ],
)
def test_image_engine_names_the_engine_and_its_version(write_inventory, recipe, engine, text):
    """image.engine (issue 38): the deployment's engine and its version, from the recipe and its image through
    the engine interface; the same in --json's data."""
    run = make_run(write_inventory, {}, recipe=recipe, topology="solo")
    assert run.deployment is not None, run.deployment_error
    (row,) = _run_tasks(run, [_Task(BY_ID["image.engine"], None)])
    assert row.status == "pass", row
    assert row.measured.startswith(f"{text} ("), row.measured
    assert row.data["engine"] == engine and row.data["engine_version"] == text.split(" ")[-1]
    assert row.to_dict()["data"]["image"] == run.deployment.image_tag


def test_a_stack_containers_port_comes_from_its_deployments_manifest_fact():
    """doctor's endpoint checks find a stack container's port in the fact `manifests` of the node's one facts
    read (node state only through facts/): the stack's state dirs, not the single deployment's."""
    from types import SimpleNamespace

    from sparkdeploy.doctor.endpoint import stack_ports
    from sparkdeploy.facts import parse

    facts = parse(
        "spark1",
        "@@sparkdeploy-facts@@ manifests\n"
        '@@manifest .sparkdeploy\n{"containers": [{"name": "sparkdeploy-vllm", "health_port": 8000}]}\n'
        '@@manifest .sparkdeploy-chat\n{"containers": [{"name": "sparkdeploy-chat-vllm", "health_port": 8001},'
        ' {"name": "sparkdeploy-chat-guard", "health_port": null}]}\n',
    )
    run = SimpleNamespace(
        inventory=SimpleNamespace(cluster=SimpleNamespace(state_dir=".sparkdeploy")), node_facts=lambda node: facts
    )
    assert stack_ports(run, None) == {"sparkdeploy-chat-vllm": 8001}  # type: ignore[arg-type]
