"""Typed steps and errors (issue 25): every step kind has a handler, steps are built with keywords, and a remote
command's failure has a type: CommandFailed (carrying its result, secrets masked), ConnectionLost, CommandTimeout,
NodeUnreachable, all StepFailed.

NodeConnection runs against a scripted SSH transport here (no network): what each channel prints, how it exits,
or how it breaks.
"""

from __future__ import annotations

import json

import paramiko
import pytest

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import MASK, Secrets
from sparkdeploy.deploy.apply import HANDLERS, run_step
from sparkdeploy.deploy.plan import Step, StepKind
from sparkdeploy.errors import StepFailed
from sparkdeploy.runtime import remote
from sparkdeploy.runtime.remote import CommandFailed, CommandTimeout, ConnectionLost, NodeConnection, NodeUnreachable
from sparkdeploy.topologies.deployment import ContainerSpec
from tests.conftest import TWO_NODES

SECRET = "hf_STEPSandERRORSsecret42"


class Channel:
    """One SSH channel: prints `out`/`err` and exits `code`; `hang`: never reaches EOF; `broken`: exec fails."""

    def __init__(
        self, out: str = "", err: str = "", code: int = 0, hang: bool = False, broken: BaseException | None = None
    ):
        self.out, self.err, self.code, self.hang, self.broken = out.encode(), err.encode(), code, hang, broken
        self.command = ""
        self.closed = False

    def settimeout(self, timeout):
        pass

    def exec_command(self, command):
        self.command = command
        if self.broken is not None:
            raise self.broken

    def sendall(self, data):
        pass

    def shutdown_write(self):
        pass

    def recv_ready(self):
        return bool(self.out)

    def recv(self, n):
        data, self.out = self.out[:n], self.out[n:]
        return data

    def recv_stderr_ready(self):
        return bool(self.err)

    def recv_stderr(self, n):
        data, self.err = self.err[:n], self.err[n:]
        return data

    @property
    def eof_received(self):
        return not self.hang and not self.out and not self.err

    def recv_exit_status(self):
        return self.code


class Transport:
    sock = None  # not a socket: _keepalive sets nothing

    def __init__(self, channels: list[Channel]):
        self.channels = channels

    def open_session(self, timeout=None):
        return self.channels.pop(0)

    def set_keepalive(self, seconds):
        pass


class Client:
    def __init__(self, transport):
        self.transport = transport

    def get_transport(self):
        return self.transport


class Fabric:
    """What NodeConnection uses of a fabric.Connection."""

    host, port, is_connected = "192.0.2.1", 22, True

    def __init__(self, channels: list[Channel]):
        self.client = Client(Transport(channels))

    def open(self):
        pass

    def close(self):
        pass


def _inventory() -> Inventory:
    return Inventory.model_validate(json.loads(json.dumps(TWO_NODES)))


def _connection(*channels: Channel, mask=None) -> NodeConnection:
    inv = _inventory()
    conn = NodeConnection(inv.nodes[0], inv, mask=mask)
    fabric = Fabric(list(channels))
    conn._fabric = lambda: fabric  # type: ignore[method-assign]
    return conn


def _mask():
    return Secrets({"HF_TOKEN": SECRET}, "unit").mask


def _step(kind: StepKind, **kw) -> Step:
    return Step(node="spark1", phase=1, kind=kind, target=kw.pop("target", "x"), change=True, **kw)


# -- step kinds ----------------------------------------------------------------------------------------------


def test_every_step_kind_has_a_handler():
    assert set(HANDLERS) == set(StepKind)


def test_step_kinds_print_as_the_strings_the_json_and_golden_files_show():
    assert [k.value for k in StepKind] == [
        "remove-container",
        "state-dir",
        "remove-file",
        "write",
        "chmod",
        "manifest",
        "start-container",
        "create-container",
        "rmdir",
        "remove-folder",
    ]
    step = _step(StepKind.START_CONTAINER, target="sparkdeploy-vllm")
    assert step.label == "start-container sparkdeploy-vllm"
    assert json.dumps(step.as_dict()["step"]) == '"start-container"'


def test_steps_are_built_with_keywords():
    with pytest.raises(TypeError):
        Step("spark1", 1, StepKind.WRITE, "x", True)  # type: ignore[misc]


def test_an_unknown_step_kind_is_a_step_failure():
    with pytest.raises(StepFailed, match="unknown step"):
        run_step(_connection(), _step("reboot"), "/home/spark/.sparkdeploy")  # type: ignore[arg-type]


# -- CommandFailed -------------------------------------------------------------------------------------------


def test_a_failed_command_carries_its_result_with_secrets_masked():
    conn = _connection(Channel(out="starting\n", err=f"token {SECRET} refused\nno space left\n", code=3), mask=_mask())
    with pytest.raises(CommandFailed) as info:
        conn.run(["sh", "-c", f"echo {SECRET}"])
    exc = info.value
    assert isinstance(exc, StepFailed)
    r = exc.result
    assert (r.node, r.exit_code, r.ok) == ("spark1", 3, False)
    assert r.command == f"sh -c 'echo {MASK}'" and r.stdout == "starting\n"
    assert r.stderr == f"token {MASK} refused\nno space left\n"
    assert str(exc) == f"spark1: `sh -c 'echo {MASK}'` exited 3: token {MASK} refused | no space left"
    assert SECRET not in str(exc) and SECRET not in repr(exc.result)


def test_a_failed_command_keeps_only_the_tails_of_its_output():
    conn = _connection(Channel(out="x" * (remote.TAIL_CHARS + 500) + "\nlast\n", code=1))
    with pytest.raises(CommandFailed) as info:
        conn.run(["true"])
    assert len(info.value.result.stdout) == remote.TAIL_CHARS and info.value.result.stdout.endswith("last\n")
    assert str(info.value).endswith("| last")


def test_check_false_returns_the_unmasked_result():
    conn = _connection(Channel(out=SECRET, code=1), mask=_mask())
    assert conn.run(["true"], check=False).stdout == SECRET  # the caller reads it; only errors are masked


def test_a_failed_start_is_a_command_failed_with_the_same_message():
    container = ContainerSpec(
        name="sparkdeploy-vllm", role="solo", image="img", run_script="vllm.run.sh", config_hash="h"
    )
    conn = _connection(Channel(err="line1\nline2\n", code=125), mask=_mask())
    with pytest.raises(CommandFailed) as info:
        run_step(conn, _step(StepKind.START_CONTAINER, container=container), "/home/spark/.sparkdeploy")
    assert str(info.value) == "`bash vllm.run.sh` exited 125: line1 | line2"
    assert info.value.result.command == "bash /home/spark/.sparkdeploy/vllm.run.sh"
    assert (info.value.node, info.value.command) == ("spark1", info.value.result.command)


def test_a_create_step_runs_the_run_script_with_docker_create_and_starts_nothing():
    container = ContainerSpec(
        name="sparkdeploy-coder-vllm", role="solo", image="img", run_script="vllm.run.sh", config_hash="h"
    )
    conn = _connection(Channel(out="0123456789abcdef\n"))
    step = _step(StepKind.CREATE_CONTAINER, container=container)
    assert run_step(conn, step, "/home/spark/.sparkdeploy-coder") == "created 0123456789ab, not started"
    failing = _connection(Channel(err="Conflict\n", code=125), mask=_mask())
    with pytest.raises(CommandFailed) as info:
        run_step(failing, step, "/home/spark/.sparkdeploy-coder")
    assert str(info.value) == "`docker create` of vllm.run.sh exited 125: Conflict"
    assert info.value.result.command.endswith(" create /home/spark/.sparkdeploy-coder/vllm.run.sh")


# -- a lost connection, a timeout, an unreachable node -----------------------------------------------------


def test_a_lost_connection_raises_connection_lost():
    conn = _connection(Channel(broken=EOFError()))
    with pytest.raises(ConnectionLost, match="connection lost during `true`") as info:
        conn.run(["true"])
    assert conn.lost
    # node, command and cause travel with the error (the cause is no longer dropped with `from None`)
    assert (info.value.node, info.value.command) == ("spark1", "true")
    assert isinstance(info.value.cause, EOFError) and info.value.__cause__ is info.value.cause


def test_a_write_that_stalls_raises_connection_lost(monkeypatch):
    conn = _connection(Channel())  # `install -m` succeeds; then SFTP breaks

    def sftp():
        raise paramiko.SSHException("Server connection dropped")

    monkeypatch.setattr(conn, "sftp", sftp)
    with pytest.raises(ConnectionLost, match="writing /tmp/f failed or stalled") as info:
        conn.put("x", "/tmp/f")
    assert conn.lost
    assert info.value.node == "spark1" and info.value.command is None  # a write, not a command
    assert isinstance(info.value.__cause__, paramiko.SSHException) and info.value.cause is info.value.__cause__


def test_a_command_past_its_timeout_raises_command_timeout():
    conn = _connection(Channel(hang=True), mask=_mask())
    with pytest.raises(CommandTimeout) as info:
        conn.run(["sleep", SECRET], timeout=0.05)
    assert str(info.value) == f"spark1: `sleep {MASK}` timed out after 0.05s"
    assert info.value.timeout == 0.05 and info.value.command == f"sleep {MASK}"
    assert info.value.node == "spark1" and isinstance(info.value.__cause__, TimeoutError)
    assert isinstance(info.value, StepFailed) and not conn.lost


def test_a_node_that_refuses_connections_raises_node_unreachable(monkeypatch):
    monkeypatch.setattr(remote, "CONNECT_ATTEMPTS", 1)

    class Refusing(Fabric):
        def open(self):
            raise ConnectionRefusedError(111, "Connection refused")

    inv = _inventory()
    conn = NodeConnection(inv.nodes[0], inv)
    conn._fabric = lambda: Refusing([])  # type: ignore[method-assign]
    with pytest.raises(NodeUnreachable, match="unreachable over SSH after 1 attempts") as info:
        conn.run(["true"])
    assert isinstance(info.value, ConnectionLost) and isinstance(info.value, StepFailed)
    assert info.value.node == "spark1" and info.value.command is None  # connecting: nothing ran
    assert isinstance(info.value.__cause__, ConnectionRefusedError) and info.value.cause is info.value.__cause__


def test_closing_a_dead_connection_is_quiet():
    class Dead(Fabric):
        def close(self):
            raise OSError("Broken pipe")

    conn = _connection()
    conn._conn = Dead([])
    conn.close()
    assert conn._conn is None
