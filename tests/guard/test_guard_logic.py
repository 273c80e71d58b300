"""The memory guard's own logic (sparkdeploy/nodeside/guard) on real files: the memory source it picks, PSI and its
fallback, the lines, the black box's ring and where it finds a crash; and the guard's loop against a real HTTP
server on a unix socket speaking the Docker API calls it makes (the real engine: tests/guard/test_guard_lab.py)."""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import sys
import threading
import time
from pathlib import Path

import pytest

from sparkdeploy.daytwo.postmortem import analyse, evidence
from sparkdeploy.nodeside.guard import memory, ring, run
from tests.test_nodeside import _imports

GIB = 1 << 30


def _proc(tmp_path: Path, avail_kb: int, total_kb: int, psi: bool = True, cgroup: str = "12:memory:/docker/n1/g1\n"):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {total_kb} kB\nMemFree: 1 kB\nMemAvailable: {avail_kb} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    if psi:
        (proc / "pressure").mkdir()
        (proc / "pressure" / "memory").write_text(
            "some avg10=1.50 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.25 avg60=0.00 avg300=0.00 total=200\n"
        )
    return proc


def _cgroup_v1(tmp_path: Path, limit: int, usage: int, inactive_file: int) -> Path:
    root = tmp_path / "cgroup"
    node = root / "memory" / "docker" / "n1"
    node.mkdir(parents=True)
    (node / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (node / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (node / "memory.stat").write_text(f"cache 5\ntotal_inactive_file {inactive_file}\n")
    return root


def test_a_real_spark_reads_meminfo(tmp_path):
    proc = _proc(tmp_path, avail_kb=100 * 1024 * 1024, total_kb=128 * 1024 * 1024)
    root = _cgroup_v1(tmp_path, limit=(1 << 63) - 4096, usage=GIB, inactive_file=0)  # the node's cgroup: no limit
    src = memory.memory_source(str(proc), str(root))
    assert src.kind == "meminfo" and "SIMULATED" not in src.label
    assert src.read() == (100 * GIB, 128 * GIB)


def test_a_lab_node_reads_its_cgroup_limit_and_says_simulated(tmp_path):
    proc = _proc(tmp_path, avail_kb=20 * 1024 * 1024, total_kb=24 * 1024 * 1024)
    root = _cgroup_v1(tmp_path, limit=4 * GIB, usage=3 * GIB, inactive_file=GIB // 2)
    src = memory.memory_source(str(proc), str(root))
    assert src.kind == "cgroup" and "SIMULATED" in src.label
    assert src.read() == (GIB + GIB // 2, 4 * GIB)  # limit - usage + inactive file pages


def test_cgroup_v2(tmp_path):
    proc = _proc(tmp_path, avail_kb=20 * 1024 * 1024, total_kb=24 * 1024 * 1024, cgroup="0::/lab/n1/guard\n")
    node = tmp_path / "cgroup" / "lab" / "n1"
    node.mkdir(parents=True)
    (node / "memory.max").write_text(f"{2 * GIB}\n")
    (node / "memory.current").write_text(f"{GIB}\n")
    (node / "memory.stat").write_text("anon 1\ninactive_file 1024\n")
    src = memory.memory_source(str(proc), str(tmp_path / "cgroup"))
    assert src.kind == "cgroup" and src.read() == (GIB + 1024, 2 * GIB)


def test_psi_is_read_and_its_absence_is_said(tmp_path):
    with_psi = _proc(tmp_path / "a", 1, 2)
    assert memory.read_psi(str(with_psi)) == {"some10": 1.5, "some_total": 1000, "full10": 0.25, "full_total": 200}
    assert memory.psi_note(str(with_psi)) is None
    without = _proc(tmp_path / "b", 1, 2, psi=False)
    assert memory.read_psi(str(without)) is None
    assert "kernel without PSI" in memory.psi_note(str(without))


def test_lines_and_decisions():
    soft, hard = run.lines({"soft_fraction": 0.0625, "hard_fraction": 0.03125}, 128 * GIB)
    assert (soft, hard) == (8 * GIB, 4 * GIB)
    assert run.lines({"soft_bytes": 3, "hard_bytes": 2, "soft_fraction": 0.5, "hard_fraction": 0.1}, 100) == (3, 2)
    psi = {"some10": 10.0, "full10": 45.0}
    assert run.decide(9 * GIB, None, soft, hard, 40)[0] == "ok"
    assert run.decide(7 * GIB, None, soft, hard, 40)[0] == "soft"
    level, why = run.decide(3 * GIB, None, soft, hard, 40)
    assert level == "hard" and "hard line 4096 MiB" in why
    assert run.decide(9 * GIB, psi, soft, hard, 40)[0] == "hard"  # pressure alone
    assert run.decide(9 * GIB, psi, soft, hard, 0)[0] == "ok"  # PSI line off


def test_the_ring_is_bounded_ordered_and_survives_a_torn_slot(tmp_path):
    r = ring.Ring(str(tmp_path), sync_s=0.0, slots=10)
    for i in range(25):
        r.write({"kind": "s", "t": 1000.0 + i, "boot": "b1", "avail_mb": i, "msg": "x" * 3000})
    r.close()
    data = (tmp_path / ring.FILE).read_bytes()
    assert len(data) == 10 * ring.SLOT  # bounded: 10 slots however many records
    records = ring.read_records(data)
    assert [rec["avail_mb"] for rec in records] == list(range(15, 25))
    torn = bytearray(data)
    torn[3 * ring.SLOT : 3 * ring.SLOT + 20] = b"\0" * 20  # a write torn by a power-off
    assert len(ring.read_records(bytes(torn))) == 9
    again = ring.Ring(str(tmp_path), slots=10)  # a restart continues after the newest record
    assert again.seq == 25 and again.previous["avail_mb"] == 24
    again.close()


def test_crash_points_and_postmortem():
    recs = [{"seq": i, "kind": "s", "t": 100.0 + i, "boot": "b1", "avail_mb": 500 - i} for i in range(120)]
    recs.append(
        {"seq": 120, "kind": "e", "t": 219.5, "boot": "b1", "ev": "kmsg", "msg": "Out of memory: Killed process"}
    )
    recs.append({"seq": 121, "kind": "e", "t": 400.0, "boot": "b2", "ev": "start", "msg": "guard"})
    points = ring.crash_points(recs)
    assert [p["kind"] for p in points] == ["reboot or power-off"]
    assert ring.crash_points(recs[:-1], boot_time=300.0)[0]["resumed"] is None  # ends before this boot
    result = analyse(recs, boot_time=0, minutes=1, now=500.0)
    assert result["crash"]["last_sample_at"] == 219.5 and result["crash"]["gap_s"] == 180.5
    assert result["min_available_mb"] == 381 and len(result["samples"]) == 60
    assert "Out of memory" in evidence(result) and "reboot or power-off" in evidence(result)
    quiet = analyse(recs[:100], boot_time=0, minutes=1, now=500.0)
    assert quiet["crash"] is None and evidence(quiet) == "no crash in the black box"
    gap = recs[:50] + [{"seq": 50, "kind": "e", "t": 300.0, "boot": "b1", "ev": "start", "msg": "guard"}]
    assert ring.crash_points(gap)[0]["kind"] == "guard restarted"
    clean = [*recs[:50], {"seq": 50, "kind": "e", "t": 150.0, "boot": "b1", "ev": "exit", "msg": "guard stopped"}]
    assert ring.crash_points([*clean, {**gap[-1], "seq": 51}]) == []  # `docker stop` of the guard is no crash


class _DockerStub(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _docker(path: str, calls: list[str]):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _reply(self, body):
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(200 if body is not None else 204)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if data:
                self.wfile.write(data)

        def do_GET(self):
            calls.append(f"GET {self.path.split('?')[0]}")
            stopped = any(c.startswith("POST /containers/e1/stop") for c in calls)
            if self.path.startswith("/containers/json"):
                engine = {"Id": "e1", "Names": ["/sparkdeploy-vllm"], "Labels": {"io.sparkdeploy.role": "solo"}}
                engine["State"] = "exited" if stopped else "running"
                guard = {"Id": "g1", "Names": ["/sparkdeploy-guard"], "Labels": {"io.sparkdeploy.role": "guard"}}
                self._reply([engine, guard])
            else:
                self._reply({"Name": "/sparkdeploy-vllm", "RestartCount": 0})

        def do_POST(self):
            calls.append(f"POST {self.path}")
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._reply(None)

    server = _DockerStub(path, Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("psi", [True, False])
def test_the_loop_stops_the_engine_at_the_hard_line_and_holds_it(tmp_path, psi):
    proc = _proc(tmp_path, avail_kb=1024 * 1024, total_kb=64 * 1024 * 1024, psi=psi)  # 1 GiB of 64: below hard
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("abcdef12-0000\n")
    sock = str(tmp_path / "docker.sock")
    calls: list[str] = []
    server = _docker(sock, calls)
    cfg = {
        "node": "spark1",
        "state": str(tmp_path / "guard"),
        "soft_fraction": 0.0625,
        "hard_fraction": 0.03125,
        "psi_full_hard": 40,
        "interval_s": 0.05,
        "grace_s": 1,
        "socket": sock,
        "proc": str(proc),
        "cgroup_root": str(tmp_path / "none"),
        "kmsg": str(tmp_path / "no-kmsg"),
        "drop_caches": str(tmp_path / "drop_caches"),
        "simulated_gpu": True,
    }
    guard = run.Guard(cfg)
    try:
        assert guard.run(max_s=1.5) == 0
    finally:
        guard.ring.close()
        server.shutdown()
    assert "POST /containers/e1/update" in calls and "POST /containers/e1/stop?t=1" in calls
    assert not any("g1/stop" in c for c in calls)  # never the guard itself
    status = json.loads((tmp_path / "guard" / "status.json").read_text())
    assert status["state"] == "held" and "hard line" in status["reason"]
    assert status["last_stop"]["engines"] == ["sparkdeploy-vllm"]
    assert status["psi_note"] is None if psi else "kernel without PSI" in status["psi_note"]
    assert "unreadable" in status["kmsg_note"]
    events = [r.get("ev") for r in ring.read_records((tmp_path / "guard" / ring.FILE).read_bytes())]
    assert events[:3] == ["start", "hard", "stopped"]
    assert calls.count("POST /containers/e1/stop?t=1") == 1  # held: not stopped again and again


def test_a_line_above_the_nodes_memory_is_refused_by_the_guard(tmp_path):
    proc = _proc(tmp_path, avail_kb=1024 * 1024, total_kb=2 * 1024 * 1024)
    cfg = {
        "state": str(tmp_path / "guard"),
        "soft_bytes": 4 * GIB,
        "hard_bytes": GIB,
        "soft_fraction": 0.1,
        "hard_fraction": 0.05,
        "proc": str(proc),
        "cgroup_root": str(tmp_path / "none"),
        "kmsg": str(tmp_path / "no-kmsg"),
        "socket": str(tmp_path / "none.sock"),
    }
    guard = run.Guard(cfg)
    assert guard.run(max_s=0.5) == 2
    guard.ring.close()
    status = json.loads((tmp_path / "guard" / "status.json").read_text())
    assert status["state"] == "refused" and "above the node's memory" in status["reason"]


def test_the_guard_costs_little_per_sample(tmp_path):
    """The sampling itself (two small reads, one decision) stays far under the 1%-of-a-core goal at 5 Hz."""
    proc = _proc(tmp_path, avail_kb=64 * 1024 * 1024, total_kb=128 * 1024 * 1024)
    src = memory.memory_source(str(proc), str(tmp_path / "none"))
    t0 = time.process_time()
    for _ in range(500):
        avail, _ = src.read()
        run.decide(avail, memory.read_psi(str(proc)), 8 * GIB, 4 * GIB, 40)
    per_sample = (time.process_time() - t0) / 500
    assert per_sample * 5 < 0.01, f"{per_sample * 1e3:.2f} ms CPU per sample"
    assert os.path.exists(str(proc))


def test_the_guard_imports_only_the_standard_library_and_itself():
    """It runs on Debian's python3 in its own image: nothing of sparkdeploy, nothing from PyPI."""
    folder = Path(run.__file__).parent
    modules = {p.stem for p in folder.glob("*.py")}
    for path in sorted(folder.glob("*.py")):
        absolute, relative = _imports(path)
        assert not absolute - set(sys.stdlib_module_names) - {"__future__"}, path.name
        assert relative <= modules, path.name
