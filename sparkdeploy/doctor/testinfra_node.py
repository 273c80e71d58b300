"""The owner's testinfra modules against ONE node: the program `doctor --tests` starts once per node.

    python3 -m sparkdeploy.doctor.testinfra_node --inventory INV --node NAME --out FILE [--record FILE] PATH...
    python3 -m sparkdeploy.doctor.testinfra_node --recorded FILE --node NAME --out FILE PATH...

One pytest session in its own process (pytest keeps global state: sessions cannot share a process, so nodes run
in parallel as processes), with testinfra's `host` fixture on `sparkdeploy://NAME` (testinfra_backend.py: the
node's pinned SSH connection, or a recording) and two fixtures of ours: `node` (the inventory's entry for the node:
fabric_ifaces, hcas, mgmt_ip, ...) and `cluster` (the inventory's cluster settings: hf_cache, state_dir, ...).
It writes what happened as JSON to FILE: one entry per test (passed / failed with pytest's assertion text / error /
skipped, the SIMULATED lines its commands printed) and one per module that did not import or has no tests.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from sparkdeploy.config.inventory import ClusterSettings, Node, load_inventory
from sparkdeploy.doctor import testinfra_backend as backend
from sparkdeploy.errors import SparkdeployError
from sparkdeploy.runtime.remote import NodeConnection

MESSAGE_CHARS = 600  # of an assertion's text, per test


def _short(text: str) -> str:
    text = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def _error_line(longrepr: str) -> str:
    """The one line a collection error comes down to: pytest's last `E   ...` line (the exception), else the last."""
    lines = [ln for ln in longrepr.splitlines() if ln.strip()]
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return _short(errors[-1] if errors else (lines[-1] if lines else "unknown error"))


def _test_id(nodeid: str, node: str) -> str:
    """`spark/test_gpu.py::test_driver[sparkdeploy://spark1]` -> `test_gpu.py::test_driver` (the node is a column)."""
    path, _, name = nodeid.partition("::")
    name = name.replace(f"{backend.NAME}://{node}", "").replace("[-", "[").replace("-]", "]").replace("--", "-")
    name = name.removesuffix("[]")
    return f"{Path(path).name}::{name}" if name else Path(path).name


class Collector:
    """pytest hooks that turn a session into rows: per test, per broken module."""

    def __init__(self, node: Node, cluster: ClusterSettings) -> None:
        self._node = node
        self._cluster = cluster
        self.rows: list[dict[str, Any]] = []
        self._current: dict[str, dict[str, Any]] = {}

    @pytest.fixture(scope="session")
    def node(self) -> Node:
        """The inventory's entry for this node (fabric_ifaces, hcas, mgmt_ip, fabric_ip, ssh)."""
        return self._node

    @pytest.fixture(scope="session")
    def cluster(self) -> ClusterSettings:
        """The inventory's cluster settings (hf_cache, state_dir, ...)."""
        return self._cluster

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if not report.nodeid.endswith(".py"):
            return
        module = Path(report.nodeid).name
        if report.failed:
            self.rows.append({"test": module, "outcome": "error", "message": _error_line(report.longreprtext)})
        elif report.passed and not report.result:
            self.rows.append({"test": module, "outcome": "error", "message": "no tests in this module"})

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        for b in backend.MADE:
            b.simulated.clear()
        self._current[nodeid] = {"test": _test_id(nodeid, self._node.name), "outcome": "passed", "message": ""}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        row = self._current.get(report.nodeid)
        if row is None:
            return
        if report.failed:
            if report.when == "call":
                crash = getattr(report.longrepr, "reprcrash", None)
                row["outcome"], row["message"] = "failed", _short(crash.message if crash else report.longreprtext)
            elif row["outcome"] == "passed":  # a fixture (setup) or teardown error: the test did not judge
                row["outcome"], row["message"] = "error", f"{report.when}: {_error_line(report.longreprtext)}"
        elif report.skipped and row["outcome"] == "passed":
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            row["outcome"], row["message"] = "skipped", _short(str(reason).removeprefix("Skipped: "))
        if report.when == "teardown":
            row["simulated"] = [line for b in backend.MADE for line in b.simulated]
            self.rows.append(self._current.pop(report.nodeid))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sparkdeploy.doctor.testinfra_node")
    parser.add_argument("--inventory")
    parser.add_argument("--recorded", help="a recording (--record) to replay instead of connecting")
    parser.add_argument("--record", help="write every command this run sends, and its answer, to this file")
    parser.add_argument("--node", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    out = Path(args.out)
    conn: NodeConnection | None = None
    try:
        if args.recorded:
            recording = backend.load_recording(Path(args.recorded))
            node = Node.model_validate(recording["node"])
            cluster = ClusterSettings.model_validate(recording["cluster"])
            backend.register(node.name, recording)
        else:
            inventory = load_inventory(args.inventory)
            node = next(n for n in inventory.nodes if n.name == args.node)
            cluster = inventory.cluster
            conn = NodeConnection(node, inventory)
            conn.open()  # refuses an unknown or changed host key before any test runs (HostKeyError)
            backend.register(node.name, conn)
    except (SparkdeployError, StopIteration, OSError, ValueError) as exc:
        out.write_text(json.dumps({"rows": [{"test": "", "outcome": "error", "message": _short(str(exc))}]}))
        return 0
    backend.RECORD = bool(args.record)
    collector = Collector(node, cluster)
    code = pytest.main(
        [
            *args.paths,
            f"--hosts={backend.NAME}://{node.name}",
            "-q",
            "--no-header",
            "--continue-on-collection-errors",
            "-p",
            "no:cacheprovider",
            "--import-mode=importlib",
            "-o",
            "addopts=",
            "-o",
            "python_files=*.py",
            "-W",
            "ignore::DeprecationWarning",
            "-W",
            "ignore::pytest.PytestAssertRewriteWarning",
        ],
        plugins=[collector],
    )
    if args.record and conn is not None:
        commands: dict[str, Any] = {}
        for b in backend.MADE:
            commands.update(getattr(b, "recorded", None) or {})
        Path(args.record).write_text(
            json.dumps(
                {
                    "node": node.model_dump(mode="json"),
                    "cluster": cluster.model_dump(mode="json"),
                    "commands": commands,
                },
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )
    if conn is not None:
        conn.close()
    out.write_text(json.dumps({"rows": collector.rows, "pytest_exit": int(code)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
