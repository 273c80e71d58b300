"""The node's Docker engine through its socket (mounted into the guard's container): the few calls the guard
needs, over HTTP on a unix socket with the standard library."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from typing import Any

SOCKET = "/var/run/docker.sock"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class DockerError(Exception):
    pass


class Docker:
    def __init__(self, path: str = SOCKET) -> None:
        self.path = path

    def call(self, method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        conn = _UnixConnection(self.path, timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, url, body=data, headers=headers)
            resp = conn.getresponse()
            text = resp.read()
        except OSError as exc:
            raise DockerError(f"{method} {url}: {exc}") from None
        finally:
            conn.close()
        if resp.status >= 400:
            raise DockerError(f"{method} {url}: HTTP {resp.status} {text[:200]!r}")
        return json.loads(text) if text.strip() else None

    def containers(self, label: str, all_: bool = False) -> list[dict[str, Any]]:
        filters = urllib.parse.quote(json.dumps({"label": [label]}))
        listed: list[dict[str, Any]] = self.call("GET", f"/containers/json?all={int(all_)}&filters={filters}")
        return listed

    def inspect(self, cid: str) -> dict[str, Any]:
        found: dict[str, Any] = self.call("GET", f"/containers/{cid}/json")
        return found

    def no_restart(self, cid: str) -> None:
        """Restart policy `no`: the engine stays stopped, also across a Docker or node restart."""
        self.set_restart(cid, "no")

    def set_restart(self, cid: str, policy: str) -> None:
        """The container's restart policy (`no`, `unless-stopped`, ...), changed in place."""
        self.call("POST", f"/containers/{cid}/update", {"RestartPolicy": {"Name": policy}})

    def stop(self, cid: str, grace_s: float) -> None:
        """SIGTERM (the image's stop signal), SIGKILL after grace_s: Docker's own stop, which returns once the
        container has stopped."""
        self.call("POST", f"/containers/{cid}/stop?t={int(grace_s)}", timeout=grace_s + 30)

    def start(self, cid: str) -> None:
        """Start a stopped container (the watcher's group restart)."""
        self.call("POST", f"/containers/{cid}/start", timeout=60)

    def unpause(self, cid: str) -> None:
        """A paused container takes no signal: it is unpaused before it is stopped."""
        self.call("POST", f"/containers/{cid}/unpause")
