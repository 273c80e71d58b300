"""The health gate: `up` returns only when the deployment really serves.

Passing means, queried from this machine to the nodes' management IPs:
- every container of the deployment is running (a rank that died fails the gate at once, with its logs);
- `/health` answers 200 on every engine that serves HTTP (the LiteLLM proxy: `/health/liveliness`, which
  needs no key; its `/health` would call every backend);
- a real one-token chat completion succeeds on the public endpoint (the proxy for 2xsolo, with the master
  key as Bearer) and, for 2xsolo, on each backend directly: `/health` alone can be 200 on a wedged engine.
On timeout (or a dead container) the last log lines of every container involved are collected per node.
Secrets are sent only in the Authorization header, and every text this module returns is masked.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from sparkdeploy.runtime.remote import on_nodes
from sparkdeploy.topologies.deployment import Deployment

if TYPE_CHECKING:
    from sparkdeploy.config.inventory import Node
    from sparkdeploy.runtime.remote import NodeConnection

POLL_S = 1.0
REQUEST_TIMEOUT_S = 30.0
MAX_ANSWER = 1 << 20  # bytes of an answer read at most
# What an HTTP request to an endpoint can raise: refused, reset or timed out (OSError), a malformed answer
# (HTTPException), a malformed URL (ValueError: e.g. a bad port in an endpoint read from a node's manifest).
HTTP_ERRORS = (OSError, http.client.HTTPException, ValueError)
LOG_TAIL = 30
STATE_FORMAT = "{{.Name}} {{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}"


@dataclass
class Probe:
    name: str  # what it checks, e.g. "spark1 /health :8000"
    url: str
    kind: str  # health | completion
    bearer: bool = False  # send the proxy's master key
    ok: bool = False
    detail: str = "not tried yet"
    seconds: float | None = None


@dataclass
class GateResult:
    ok: bool
    seconds: float
    probes: list[Probe]
    reason: str = ""
    dead: list[str] = field(default_factory=list)  # "node container: state" of containers that stopped
    logs: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> container -> last lines (masked)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "reason": self.reason,
            "dead": self.dead,
            "probes": [{"name": p.name, "url": p.url, "ok": p.ok, "detail": p.detail} for p in self.probes],
            "logs": self.logs,
        }


def probes_for(dep: Deployment) -> list[Probe]:
    probes = []
    for nd in dep.nodes:
        for c in nd.containers:
            if c.health_port is None:
                continue
            path = c.health_path
            probes.append(
                Probe(f"{nd.node.name} {c.name} {path}", f"http://{nd.node.url_host}:{c.health_port}{path}", "health")
            )
    public_bearer = dep.proxied
    probes.append(
        Probe(
            f"chat completion {dep.endpoint}",
            dep.endpoint.rstrip("/") + "/chat/completions",
            "completion",
            bearer=public_bearer,
        )
    )
    for url in dep.backends:
        probes.append(Probe(f"chat completion {url}", url.rstrip("/") + "/chat/completions", "completion"))
    return probes


class _Deadline:
    """Shut the socket down at an absolute time: a server that drips one byte at a time cannot stretch a read
    past it (a socket timeout restarts on every byte)."""

    def __init__(self, conn: http.client.HTTPConnection, at: float):
        self._conn = conn
        self.hit = False
        self._timer = threading.Timer(max(0.0, at - time.monotonic()), self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.hit = True
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self._conn.close()


def http_request(
    url: str,
    deadline: float,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    limit: int = MAX_ANSWER,
) -> tuple[int, bytes]:
    """(status, the first `limit` bytes of the body); every step ends by `deadline` (time.monotonic())."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("no time left before the deadline")
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(
        parts.hostname,  # type: ignore[arg-type]  # a URL without a host fails here, as it always has
        parts.port,
        timeout=min(REQUEST_TIMEOUT_S, remaining),
    )
    watch = _Deadline(conn, deadline)
    with watch:
        try:
            conn.request(method, parts.path or "/", body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read(limit)
        except (OSError, http.client.HTTPException) as exc:
            if watch.hit:
                raise TimeoutError("the answer did not finish before the deadline") from None
            raise exc


def http_get(url: str, deadline: float) -> tuple[int, str]:
    code, data = http_request(url, deadline, limit=2048)
    return code, data.decode(errors="replace")


def chat_completion(url: str, model: str, bearer: str | None, deadline: float) -> tuple[bool, str]:
    """One real generation of one token. (ok, detail); an answer of the wrong shape is not ok, with why."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Reply with OK."}],
            "max_tokens": 1,
            "temperature": 0,
            "stream": False,
        }
    ).encode()
    headers = {"Content-Type": "application/json"}
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    code, raw = http_request(url, deadline, method="POST", body=body, headers=headers)
    text = raw.decode(errors="replace")
    if code != 200:
        return False, f"HTTP {code} {_printable(text.strip()[:200])}"
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return False, "the answer is not JSON"
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        return False, "no choices in the answer"
    usage = data.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return True, f"{tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else '?'} token(s)"


def _printable(text: str) -> str:
    """An answer's text as shown: no control characters (a hostile answer cannot forge lines or colours)."""
    return "".join(c if c.isprintable() else " " for c in text)


def _try(probe: Probe, model: str, key: str | None, deadline: float) -> None:
    t0 = time.monotonic()
    if t0 >= deadline:  # keep the last answer's reason: it says more than "no time left"
        return
    try:
        if probe.kind == "health":
            code, text = http_get(probe.url, deadline)
            probe.ok = code == 200
            probe.detail = f"HTTP {code}" + ("" if probe.ok else f" {_printable(text.strip()[:120])}")
        else:
            probe.ok, probe.detail = chat_completion(probe.url, model, key if probe.bearer else None, deadline)
    except HTTP_ERRORS as exc:  # not healthy yet; the reason is shown
        reason = getattr(exc, "reason", exc)
        probe.ok, probe.detail = False, _printable(f"{reason.__class__.__name__}: {reason}"[:200])
    probe.seconds = time.monotonic() - t0


def container_states(
    dep: Deployment, conns: dict[str, NodeConnection], deadline: float | None = None
) -> dict[str, dict[str, tuple[str, int, int]]]:
    """node -> container -> (status, exit code, restart count), read over SSH (read-only)."""
    by_name = {nd.node.name: nd for nd in dep.nodes if nd.containers}

    def one(node: Node) -> dict[str, tuple[str, int, int]]:
        names = [c.name for c in by_name[node.name].containers]
        left = 30.0 if deadline is None else min(30.0, max(1.0, deadline - time.monotonic()))
        r = conns[node.name].run(["docker", "inspect", "--format", STATE_FORMAT, *names], check=False, timeout=left)
        found: dict[str, tuple[str, int, int]] = {}
        for line in r.stdout.splitlines():
            parts = line.strip().lstrip("/").split()
            if len(parts) == 4:
                found[parts[0]] = (parts[1], int(parts[2]), int(parts[3]))
        return {n: found.get(n, ("missing", -1, 0)) for n in names}

    outcomes = on_nodes([nd.node for nd in by_name.values()], one)
    return {
        o.node.name: (
            cast("dict[str, tuple[str, int, int]]", o.value) if o.ok else {"(ssh)": (f"unreadable: {o.error}", -1, 0)}
        )
        for o in outcomes
    }


CRASH_LOOP_RESTARTS = 2  # restarts seen during the gate that mean a crash loop, not a slow start


def _dead(
    states: dict[str, dict[str, tuple[str, int, int]]],
    baseline: dict[str, dict[str, tuple[str, int, int]]] | None = None,
) -> list[str]:
    """Containers that stopped, or restart in a loop (the restart policy would keep the gate waiting)."""
    out = []
    for node, per in states.items():
        for name, (status, code, restarts) in per.items():
            if status in ("exited", "dead", "missing", "created", "removing"):
                out.append(f"{node} {name}: {status}" + (f" (exit code {code})" if status == "exited" else ""))
                continue
            first = ((baseline or {}).get(node) or {}).get(name)
            if first is not None and restarts - first[2] >= CRASH_LOOP_RESTARTS:
                out.append(
                    f"{node} {name}: restarting in a loop ({restarts - first[2]} restarts during the gate, "
                    f"last exit code {code})"
                )
    return out


def collect_logs(dep: Deployment, conns: dict[str, NodeConnection], tail: int = LOG_TAIL) -> dict[str, dict[str, str]]:
    by_name = {nd.node.name: nd for nd in dep.nodes if nd.containers}

    def one(node: Node) -> dict[str, str]:
        out = {}
        for c in by_name[node.name].containers:
            r = conns[node.name].run(["docker", "logs", "--tail", str(tail), c.name], check=False, timeout=30)
            text = (r.stdout + ("\n" if r.stdout and r.stderr else "") + r.stderr).rstrip()
            out[c.name] = dep.secrets.mask(text or f"(no output; docker logs exited {r.exit_code})")
        return out

    return {
        o.node.name: (cast("dict[str, str]", o.value) if o.ok else {"(ssh)": dep.secrets.mask(str(o.error))})
        for o in on_nodes([nd.node for nd in by_name.values()], one)
    }


def wait_healthy(
    dep: Deployment,
    conns: dict[str, NodeConnection],
    timeout: float,
    stop: Callable[[], bool] = lambda: False,
    say: Callable[[str], None] | None = None,
    states_known_running: bool = False,
) -> GateResult:
    """Poll until every probe passes (health first, then completions) or the timeout; see the module doc.

    states_known_running: the containers were seen running a moment ago (nothing was started): skip the first
    SSH read of container states."""
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"the health gate needs a finite timeout, got {timeout!r}")
    t0 = time.monotonic()
    deadline = t0 + timeout  # one absolute deadline for the whole gate: every read ends by it
    probes = probes_for(dep)
    key = dep.secrets.get("LITELLM_MASTER_KEY")
    model = dep.model_name
    mask = dep.secrets.mask
    check_states = not states_known_running
    last_say = 0.0
    baseline = None

    def stopped(dead: list[str]) -> GateResult:
        why = mask(f"a container stopped during the health gate: {'; '.join(dead)}")
        return GateResult(False, time.monotonic() - t0, probes, why, dead)

    while True:
        if stop():
            return GateResult(False, time.monotonic() - t0, probes, "interrupted")
        if check_states:
            states = container_states(dep, conns, deadline)
            baseline = baseline or states
            dead = _dead(states, baseline)
            if dead:
                return stopped(dead)
        check_states = True
        for p in probes:
            if p.kind == "health" and not p.ok:
                _try(p, model, key, deadline)
        if all(p.ok for p in probes if p.kind == "health"):
            for p in probes:
                if p.kind == "completion" and not p.ok:
                    _try(p, model, key, deadline)
        for p in probes:
            p.detail = mask(p.detail)
        if all(p.ok for p in probes):
            if not states_known_running:  # a rank may have died after its peer answered: look once more
                dead = _dead(container_states(dep, conns, deadline), baseline)
                if dead:
                    return stopped(dead)
            return GateResult(True, time.monotonic() - t0, probes)
        now = time.monotonic()
        if now >= deadline:
            failing = [f"{p.name}: {p.detail}" for p in probes if not p.ok]
            return GateResult(False, now - t0, probes, mask(f"not healthy after {timeout:g} s: " + "; ".join(failing)))
        if say and now - last_say > 10:
            waiting = [p.name for p in probes if not p.ok]
            say(
                f"health: waiting for {', '.join(waiting[:3])}{' ...' if len(waiting) > 3 else ''} "
                f"({now - t0:.0f} s of {timeout:g} s)"
            )
            last_say = now
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
