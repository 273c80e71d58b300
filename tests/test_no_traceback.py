"""A user's situation is one line, never a traceback (issue 24, item 5; the README's error contract).

- A node whose SSH port accepts TCP but is not sshd (a web server, a proxy): paramiko's transport thread logged a
  traceback per attempt (twelve for `up --dry-run`); now each command says it once, for the node.
- A local state folder (SPARKDEPLOY_STATE) that cannot be written: one line naming it and the fix.

The SSH cases run the real console entry point in a subprocess: paramiko's records reached stderr through
logging's last-resort handler, which pytest's own log capture would hide in-process.
"""

from __future__ import annotations

import re
import socket
import threading

import pytest

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.errors import ConfigError
from sparkdeploy.runtime.locks import cluster_lock
from tests.support.cli_process import failure, sd

NOT_SSH = b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n"


@pytest.fixture
def not_sshd():
    """A port on 127.0.0.1 that accepts every connection and answers like a web server, never with an SSH banner."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(NOT_SSH)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def _one_node(write_inventory, tmp_path, port: int):
    return write_inventory(
        {
            "cluster": {
                "name": "t",
                "default_recipe": "openai-gpt-oss-120b",
                "secrets_file": "secrets.env",
                "known_hosts": str(tmp_path / "known_hosts"),
            },
            "nodes": [
                {
                    "name": "spark1",
                    "role": "head",
                    "mgmt_ip": "127.0.0.1",
                    "fabric_ip": "198.51.100.1/24",
                    "fabric_ifaces": ["enp1s0f1np1"],
                    "ssh": {"user": "spark", "port": port},
                }
            ],
        }
    )


@pytest.mark.parametrize(
    "command",
    [["up", "--dry-run", "-t", "solo"], ["status"], ["doctor", "-t", "solo"], ["trust", "spark1", "--yes"]],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_port_that_is_not_sshd_is_one_line_for_the_node(command, not_sshd, write_inventory, tmp_path):
    inventory = _one_node(write_inventory, tmp_path, not_sshd)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SPARKDEPLOY_STATE": str(tmp_path / "state"),
        "COLUMNS": "200",
    }
    r = sd(*command, "-i", str(inventory), timeout=120, env=env)
    assert r.returncode == 1, failure(r)
    for noise in ("Traceback", "paramiko", "SSHException", "EOFError", "protocol banner"):
        assert noise not in r.stderr and noise not in r.stdout, failure(r)
    # stderr: the progress lines (`[  0.0s] ...`), then exactly one line, the error, naming the node
    said = [line for line in r.stderr.splitlines() if line.strip() and not re.match(r"\[\s*\d+\.\d+s\]", line)]
    assert len(said) == 1 and said[0].startswith("error: ") and "spark1" in said[0], failure(r)
    # and the reason, in words, where the command reports its nodes (doctor's table wraps it: read it flat)
    flat = re.sub(r"[\s│┃]+", " ", r.stdout + r.stderr)
    assert f"127.0.0.1:{not_sshd}" in flat and "accepts TCP connections but does not speak SSH" in flat, failure(r)


# -- the local state folder --------------------------------------------------------------------------------


@pytest.fixture
def unwritable_state(tmp_path, monkeypatch):
    """A state folder no one can create, root included: its parent is a regular file."""
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder\n")
    state = blocker / "state"
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(state))
    return state


def test_render_with_an_unwritable_state_folder_is_one_line_with_the_fix(
    cli, inventory_file, tmp_path, unwritable_state
):
    out = tmp_path / "out"
    code, _stdout, err = cli(
        "render", "openai-gpt-oss-120b", "-t", "2xsolo", "-i", str(inventory_file), "--out", str(out)
    )
    assert code == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {unwritable_state}"), err
    assert "cannot write the local state folder (SPARKDEPLOY_STATE)" in lines[0], err
    assert "(fix: set SPARKDEPLOY_STATE to a folder this user can write" in lines[0], err
    assert "Traceback" not in err and not out.exists()


def test_the_cluster_lock_in_an_unwritable_state_folder_is_the_same_line(inventory_file, unwritable_state):
    with pytest.raises(ConfigError) as info:
        with cluster_lock(load_inventory(str(inventory_file))):
            pass
    (problem,) = info.value.problems
    assert problem.file == str(unwritable_state / "locks")
    assert "cannot write the local state folder" in problem.message and "SPARKDEPLOY_STATE" in problem.fix
