"""doctor --tests: the owner's testinfra modules (sparkdeploy/doctor/testinfra_*.py), without a node.

The shipped example checks run against a recorded host: what a lab node answered to their commands
(samples/testinfra_lab_spark1.json, made with `python3 -m sparkdeploy.doctor.testinfra_node --record`), replayed
by the backend doctor uses (the same child program, the same pytest plugin, only the transport differs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkdeploy.doctor import testinfra_run
from sparkdeploy.doctor.testinfra_backend import RecordedBackend, register
from sparkdeploy.errors import ConfigError

SAMPLES = Path(__file__).resolve().parent / "samples"
RECORDING = SAMPLES / "testinfra_lab_spark1.json"


def run_child(tmp_path: Path, recording: Path, *paths: str) -> list[dict]:
    out = tmp_path / "rows.json"
    subprocess.run(
        [sys.executable, "-m", "sparkdeploy.doctor.testinfra_node", "--recorded", str(recording), "--node", "spark1"]
        + ["--out", str(out), *paths],
        check=True,
        capture_output=True,
        cwd=tmp_path,
        timeout=120,
    )
    return json.loads(out.read_text())["rows"]


def by_test(rows: list[dict]) -> dict[str, dict]:
    return {r["test"]: r for r in rows}


# the shipped examples (sparkdeploy/doctor/spark_checks/), as the runner names them; the lab test reads them too
EXAMPLES = {
    "test_docker.py::test_engine_runs",
    "test_docker.py::test_nvidia_runtime",
    "test_fabric.py::test_ports_up_at_mtu",
    "test_fabric.py::test_rdma_devices",
    "test_gpu_stack.py::test_driver",
    "test_gpu_stack.py::test_cuda",
    "test_memory.py::test_no_swap_on_model_cache_disk",
    "test_memory.py::test_earlyoom",
    "test_model_cache.py::test_model_cache_writable",
}


def test_the_shipped_examples_pass_on_a_recorded_lab_node(tmp_path):
    rows = by_test(run_child(tmp_path, RECORDING, str(testinfra_run.SHIPPED_DIR)))
    assert set(rows) == EXAMPLES
    skipped = {t for t, r in rows.items() if r["outcome"] == "skipped"}
    assert skipped == {"test_memory.py::test_earlyoom"} and "SIMULATED lab node" in rows[next(iter(skipped))]["message"]
    assert all(r["outcome"] == "passed" for t, r in rows.items() if t not in skipped), rows
    # the lab's stand-ins say what they stand in for, and the rows carry it
    assert any("SIMULATED" in line for line in rows["test_gpu_stack.py::test_driver"]["simulated"])
    assert any(
        "nvidia-container-runtime-hook" in line for line in rows["test_docker.py::test_nvidia_runtime"]["simulated"]
    )
    assert rows["test_docker.py::test_engine_runs"]["simulated"] == []
    result = testinfra_run._row(rows["test_gpu_stack.py::test_driver"])
    assert result.status == "pass" and result.simulated and result.check == "tests:test_gpu_stack.py::test_driver"


def test_a_node_that_drifted_fails_with_testinfras_assertion_text(tmp_path):
    data = json.loads(RECORDING.read_text())
    cmds = data["commands"]
    link = json.loads(cmds["/usr/bin/ip --json link show enp1s0f1np1"][1])
    link[0]["mtu"] = 1500
    cmds["/usr/bin/ip --json link show enp1s0f1np1"][1] = json.dumps(link)
    cmds["nvidia-smi --query-gpu=driver_version --format=csv,noheader"][1] = "570.86.10\n"
    cmds["ibv_devices"][1] = cmds["ibv_devices"][1].replace("roceP2p1s0f1", "")
    drifted = tmp_path / "drifted.json"
    drifted.write_text(json.dumps(data))
    rows = by_test(run_child(tmp_path, drifted, str(testinfra_run.SHIPPED_DIR)))
    mtu = rows["test_fabric.py::test_ports_up_at_mtu"]
    assert mtu["outcome"] == "failed" and "MTU 1500, not 9000" in mtu["message"], mtu
    assert rows["test_gpu_stack.py::test_driver"]["outcome"] == "failed"
    assert "driver 570.86.10" in rows["test_gpu_stack.py::test_driver"]["message"]
    assert "roceP2p1s0f1 missing" in rows["test_fabric.py::test_rdma_devices"]["message"]
    assert rows["test_docker.py::test_engine_runs"]["outcome"] == "passed"
    result = testinfra_run._row(mtu)
    assert result.status == "fail" and result.measured.startswith("failed: AssertionError: enp1s0f1np1 has MTU 1500")


def test_a_module_that_does_not_import_or_has_no_tests_is_one_line(tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "test_broken.py").write_text("import no_such_module_here\n")
    (mods / "test_empty.py").write_text("X = 1\n")
    (mods / "test_setup.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef bad():\n    raise RuntimeError('fixture broke')\n\n"
        "def test_uses_it(host, bad):\n    pass\n\ndef test_ok(host, node, cluster):\n"
        "    assert node.name == 'spark1' and cluster.hf_cache\n"
    )
    rows = by_test(run_child(tmp_path, RECORDING, str(mods)))
    assert rows["test_broken.py"] == {
        "test": "test_broken.py",
        "outcome": "error",
        "message": "ModuleNotFoundError: No module named 'no_such_module_here'",
    }
    assert rows["test_empty.py"]["message"] == "no tests in this module"
    assert rows["test_setup.py::test_uses_it"]["outcome"] == "error"
    assert rows["test_setup.py::test_uses_it"]["message"] == "setup: RuntimeError: fixture broke"
    assert rows["test_setup.py::test_ok"]["outcome"] == "passed"
    assert all("Traceback" not in r["message"] and "\n" not in r["message"] for r in rows.values())
    assert testinfra_run._row(rows["test_broken.py"]).status == "fail"


def test_sudo_is_sudo_n_of_python3_as_sparkdeploy_runs_it():
    register("spark-x", {"commands": {}})
    backend = RecordedBackend("spark-x", sudo=True)
    wrapper = """'import os, sys; os.execv("/bin/sh", ["sh", "-c", sys.argv[1]])'"""
    assert backend.get_command("id -u") == f"sudo -n python3 -c {wrapper} 'id -u'"
    backend.sudo_user = "root"
    assert backend.get_command("id -u") == f"sudo -n -u root python3 -c {wrapper} 'id -u'"
    # what sh runs is the command itself
    argv = [sys.executable, "-c", 'import os, sys; os.execv("/bin/sh", ["sh", "-c", sys.argv[1]])', "echo $((6 * 7))"]
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout == "42\n"


def test_a_tests_path_that_is_not_there_is_bad_input(cli, inventory_file, tmp_path):
    missing = tmp_path / "nope"
    code, out, err = cli("doctor", "-i", str(inventory_file), "--tests", str(missing))
    assert code == 2
    assert f"{missing}: no such file or folder" in err and "--tests" in err and "Traceback" not in err + out
    with pytest.raises(ConfigError, match=r"cluster\.doctor_tests"):
        from sparkdeploy.config.inventory import load_inventory

        path = inventory_file
        text = path.read_text().replace("cluster:\n", "cluster:\n  doctor_tests: [./missing_checks]\n", 1)
        path.write_text(text)
        testinfra_run.resolve_paths((), load_inventory(str(path)))


def test_the_default_run_does_not_import_testinfra_or_pytest():
    code = (
        "import sys; import sparkdeploy.doctor.api, sparkdeploy.cli.doctor_cmd; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('testinfra', 'pytest', '_pytest')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_inventorys_doctor_tests_are_relative_to_it_and_tests_given_win(write_inventory, tmp_path):
    from sparkdeploy.config.inventory import load_inventory

    path = write_inventory()
    (path.parent / "my_checks").mkdir()
    path.write_text(path.read_text().replace("cluster:\n", "cluster:\n  doctor_tests: [my_checks, '@spark']\n", 1))
    inv = load_inventory(str(path))
    assert testinfra_run.resolve_paths((), inv) == (str(path.parent / "my_checks"), str(testinfra_run.SHIPPED_DIR))
    given = tmp_path / "other.py"
    given.write_text("def test_x(host):\n    pass\n")
    assert testinfra_run.resolve_paths((str(given),), inv) == (str(given),)
