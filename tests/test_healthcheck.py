"""Docker's health check on serving containers: rendered for exactly the containers that serve HTTP, and the
probe itself, run for real by /bin/sh as Docker runs it, against a real local HTTP server."""

from __future__ import annotations

import http.server
import re
import shlex
import subprocess
import threading

import pytest

from sparkdeploy import healthcheck
from tests.test_render import deployment


@pytest.mark.parametrize(
    "topology,backend",
    [("solo", None), ("2xsolo", None), ("cluster", "ray"), ("cluster", "native"), ("cluster", "torchrun")],
)
def test_every_container_with_a_health_port_declares_a_check_on_its_own_port(topology, backend):
    dep = deployment(topology, backend)
    seen = 0
    for nd in dep.nodes:
        for c in nd.containers:
            script = nd.file(c.run_script).content
            if c.health_port is None:
                assert "--health-cmd" not in script, (nd.node.name, c.name)
                continue
            seen += 1
            m = re.search(r"--health-cmd (.+)\n", script)
            assert m, (nd.node.name, c.name)
            argv = shlex.split(shlex.split(m.group(1))[0])
            assert argv[:2] == ["python3", "-c"] and argv[-1] == f"http://127.0.0.1:{c.health_port}{c.health_path}"
            assert "--health-start-period 30m" in script and "--health-retries 3" in script
    assert seen >= 1


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # http.server's name
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()


@pytest.mark.parametrize("status,code", [(200, 0), (503, 1)])
def test_probe_exit_code_follows_the_endpoint_and_fails_in_one_line(server, status, code):
    _Handler.status = status
    check = healthcheck.for_port(server.server_address[1], "/health")
    r = subprocess.run(["/bin/sh", "-c", check.cmd], capture_output=True, text=True, timeout=30)
    assert r.returncode == code, r
    if code:
        assert r.stdout.strip().splitlines() == ["HTTP Error 503: Service Unavailable"] and not r.stderr


def test_probe_fails_when_nothing_listens():
    r = subprocess.run(
        ["/bin/sh", "-c", healthcheck.for_port(9, "/health").cmd], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 1 and "Connection refused" in r.stdout
