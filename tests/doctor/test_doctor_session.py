"""NodeSession's testinfra host: nodes must not wait for each other (pure logic, a fake connection)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from sparkdeploy.doctor.session import NodeSession
from sparkdeploy.remote import CommandResult

ANSWERS = {
    "uname -s": "Linux\n",
    "uname -m": "aarch64\n",
    "cat /etc/os-release": 'ID=ubuntu\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\n',
    "id -nu": "spark\n",
}
SYSTEM_INFO = ("uname -s", "uname -m", "cat /etc/os-release")  # what testinfra's system_info asks


class FakeConnection:
    """Answers testinfra's probes; its system_info probes after a short delay, counting how many nodes were
    being asked them at once."""

    in_flight = 0
    most = 0
    lock = threading.Lock()

    def __init__(self, name: str):
        self.node = SimpleNamespace(name=name, ssh=SimpleNamespace(user="spark", port=22), url_host=name)

    def run(self, command, check=False, timeout=None, stdin=None):
        cls = FakeConnection
        if command not in SYSTEM_INFO:
            return CommandResult(self.node.name, command, 0, ANSWERS.get(command, ""), "")
        with cls.lock:
            cls.in_flight += 1
            cls.most = max(cls.most, cls.in_flight)
        time.sleep(0.05)
        with cls.lock:
            cls.in_flight -= 1
        return CommandResult(self.node.name, command, 0, ANSWERS.get(command, ""), "")


def test_testinfra_system_info_is_asked_on_every_node_at_once():
    sessions = [NodeSession(SimpleNamespace(name=f"spark{i}"), FakeConnection(f"spark{i}")) for i in range(1, 5)]
    users: dict[str, str] = {}

    def first_testinfra_call(s: NodeSession) -> None:
        users[s.node.name] = s.host.user().name

    threads = [threading.Thread(target=first_testinfra_call, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert users == {f"spark{i}": "spark" for i in range(1, 5)}
    assert sessions[0].host.system_info.distribution == "ubuntu"
    assert sessions[0].host.system_info.arch == "aarch64"
    # With the class-wide cached_property lock, one node at a time would be asked (most == 1).
    assert FakeConnection.most >= 2
