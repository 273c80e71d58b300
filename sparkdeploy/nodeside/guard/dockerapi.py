"""The node's Docker engine through its socket (mounted into the guard's container): the few calls the guard
needs, over HTTP on a unix socket with the standard library."""

import http.client
import json
import socket
import urllib.parse

SOCKET = "/var/run/docker.sock"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class DockerError(Exception):
    pass


class Docker:
    def __init__(self, path=SOCKET):
        self.path = path

    def call(self, method, url, body=None, timeout=10.0):
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

    def containers(self, label, all_=False):
        filters = urllib.parse.quote(json.dumps({"label": [label]}))
        return self.call("GET", f"/containers/json?all={int(all_)}&filters={filters}")

    def inspect(self, cid):
        return self.call("GET", f"/containers/{cid}/json")

    def no_restart(self, cid):
        """Restart policy `no`: the engine stays stopped, also across a Docker or node restart."""
        self.call("POST", f"/containers/{cid}/update", {"RestartPolicy": {"Name": "no"}})

    def stop(self, cid, grace_s):
        """SIGTERM (the image's stop signal), SIGKILL after grace_s: Docker's own stop, which returns once the
        container has stopped."""
        self.call("POST", f"/containers/{cid}/stop?t={int(grace_s)}", timeout=grace_s + 30)

    def start(self, cid):
        """Start a stopped container (the watcher's group restart)."""
        self.call("POST", f"/containers/{cid}/start", timeout=60)

    def unpause(self, cid):
        """A paused container takes no signal: it is unpaused before it is stopped."""
        self.call("POST", f"/containers/{cid}/unpause")
