"""An SSH server that stalls, for tests of what a stop (Ctrl-C, SIGTERM) does to a read that never ends.

paramiko's own server side on a real socket on 127.0.0.1, in this process: the client under test (the real CLI,
in a subprocess) connects over TCP, checks the host key against a known_hosts file written here, and
authenticates with a key made here. Each command it runs is answered by the first rule whose text the command
contains (exit 0, that stdout); a command no rule matches stalls: its channel stays open and silent until the
server stops. `stall_at_banner=True` stalls earlier: TCP is accepted and no SSH banner ever comes (connecting).
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import paramiko
import yaml


class _Server(paramiko.ServerInterface):
    def __init__(self, owner: StallingSSH):
        self.owner = owner

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL if key == self.owner.client_key else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        text = command.decode(errors="replace")
        self.owner.commands.append(text)
        self.owner.channels.append(channel)  # held: paramiko closes a channel nothing references any more
        answer = next((out for part, out in self.owner.answers.items() if part in text), None)
        if answer is None:
            self.owner.stalled.set()  # the client now waits in a read that never ends
            return True
        threading.Thread(target=self._answer, args=(channel, answer), daemon=True).start()
        return True

    @staticmethod
    def _answer(channel: paramiko.Channel, out: str) -> None:
        try:
            channel.sendall(out.encode())
            channel.send_exit_status(0)
            channel.shutdown_write()  # EOF, not close: a close may overtake the server's "exec accepted" reply
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the client went away first


class StallingSSH:
    """Use as a context manager; `port`, `inventory(tmp_path)`; `stalled` is set once a command (or, with
    stall_at_banner, a connection) is left waiting."""

    def __init__(self, answers: dict[str, str] | None = None, stall_at_banner: bool = False):
        self.answers = dict(answers or {})
        self.stall_at_banner = stall_at_banner
        self.host_key = paramiko.ECDSAKey.generate()
        self.client_key = paramiko.ECDSAKey.generate()
        self.commands: list[str] = []
        self.channels: list[paramiko.Channel] = []
        self.stalled = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._open: list[paramiko.Transport | socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True, name="stalling-sshd")

    def __enter__(self) -> StallingSSH:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for thing in self._open:
            thing.close()
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.stall_at_banner:
                self._open.append(conn)
                self.stalled.set()
                continue
            transport = paramiko.Transport(conn)
            transport.add_server_key(self.host_key)
            self._open.append(transport)
            try:
                transport.start_server(server=_Server(self))
            except (paramiko.SSHException, EOFError, OSError):
                transport.close()
                continue

    def inventory(self, folder: Path, name: str = "inventory.yaml") -> Path:
        """A one-node inventory for this server (key, known_hosts and secrets beside it); its path."""
        key = folder / "id_stall"
        self.client_key.write_private_key_file(str(key))
        (folder / "known_hosts").write_text(
            f"[127.0.0.1]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n"
        )
        secrets = folder / "secrets.env"
        secrets.write_text("HF_TOKEN=hf_STALLtoken\nLITELLM_MASTER_KEY=sk-STALLkey\n")
        secrets.chmod(0o600)
        data = {
            "cluster": {
                "name": "stall",
                "default_recipe": "openai-gpt-oss-120b",
                "secrets_file": "secrets.env",
                "known_hosts": str(folder / "known_hosts"),
            },
            "nodes": [
                {
                    "name": "spark1",
                    "role": "head",
                    "mgmt_ip": "127.0.0.1",
                    "fabric_ip": "198.51.100.1/24",
                    "fabric_ifaces": ["enp1s0f1np1"],
                    "ssh": {"user": "spark", "port": self.port, "key": str(key)},
                }
            ],
        }
        path = folder / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path


class StallingHTTP:
    """A TCP listener on 127.0.0.1 for an engine's /metrics: the first `answered` connections get a short 200
    answer, every later one is accepted and never answered (an engine that hangs); `stalled` is set then."""

    ANSWER = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nvllm:num_requests_running 0\n"

    def __init__(self, answered: int = 0) -> None:
        self.answered = answered
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self.stalled = threading.Event()
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True, name="stalling-http")

    def __enter__(self) -> StallingHTTP:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._open:
            conn.close()
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.answered > 0:
                self.answered -= 1
                with conn:
                    conn.settimeout(2)
                    try:
                        conn.recv(65536)  # the request (small: one read holds it)
                        conn.sendall(self.ANSWER)
                    except OSError:
                        pass
                continue
            self._open.append(conn)
            self.stalled.set()
