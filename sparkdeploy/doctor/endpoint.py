"""endpoint.*: when a topology is up (containers labelled io.sparkdeploy.managed), every engine answers
/health and a real one-token completion; the 2xsolo proxy answers too and reports every backend healthy.

`/health` alone is not enough: a wedged engine can still answer 200. The completion goes through the same
port clients use. Requests go from this machine to the node's management IP, each with its own timeout;
the proxy's master key (secrets file) is sent in a header and never printed.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from sparkdeploy.checks import FAIL, Result, fail, ok, skip
from sparkdeploy.config.inventory import Node
from sparkdeploy.facts import ContainerFact
from sparkdeploy.topologies.deployment import health_path

from . import engine
from .doctor_run import DoctorRun

HTTP_TIMEOUT_S = 10
COMPLETION_TIMEOUT_S = 60
SERVING_ROLES = ("solo", "head", "backend")


class HttpError(Exception):
    pass


def http(
    url: str, body: dict[str, Any] | None = None, key: str | None = None, timeout: float = HTTP_TIMEOUT_S
) -> tuple[int, Any, float]:
    """(status, parsed JSON or text, seconds). Raises HttpError with a one-line reason (no key in it)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read().decode(errors="replace")
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw = exc.read().decode(errors="replace")[:300]
        raise HttpError(f"HTTP {exc.code}: {raw.strip()[:160]}") from None
    except TimeoutError:
        raise HttpError(f"no answer within {timeout:g} s") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise HttpError(f"no answer within {timeout:g} s") from None
        raise HttpError(str(reason)) from None
    except (ConnectionError, OSError) as exc:
        raise HttpError(str(exc)) from None
    seconds = time.monotonic() - started
    try:
        return status, json.loads(raw), seconds
    except ValueError:
        return status, raw, seconds


def _ours(run: DoctorRun, node: Node) -> list[ContainerFact]:
    only = run.options.deployment
    return [
        c
        for c in run.node_facts(node).containers
        if c.role in (*SERVING_ROLES, "proxy", "worker") and (only is None or c.label("deployment") == only)
    ]


def stack_ports(run: DoctorRun, node: Node) -> dict[str, int]:
    """container name -> its port, for a stack's containers: their deployment's own manifest (its state dir
    `<state_dir>-NAME` beside the single one), from the fact `manifests` of the node's one facts read."""
    state_dir = run.inventory.cluster.state_dir  # type: ignore[union-attr]  # checks run only with an inventory (runner)
    out: dict[str, int] = {}
    for folder, manifest in sorted(run.node_facts(node).manifests.items()):
        if folder == state_dir:
            continue  # the single deployment's containers use the inventory's ports
        listed = manifest.get("containers") or []
        out.update({c["name"]: c["health_port"] for c in listed if isinstance(c, dict) and c.get("health_port")})
    return out


def _base(run: DoctorRun, node: Node, c: ContainerFact) -> str:
    port = run.inventory.cluster.proxy_port if c.role == "proxy" else run.inventory.cluster.vllm_port  # type: ignore[union-attr]  # checks run only with an inventory (runner)
    if c.label("deployment"):  # a stack's container: its own port (its deployment's manifest)
        port = stack_ports(run, node).get(c.name, port)
    return f"http://{node.url_host}:{port}"


def _serving(run: DoctorRun, node: Node) -> list[ContainerFact] | Result:
    """Our containers on the node that answer requests, or the skip that says why there are none."""
    if not run.node_facts(node).docker_ok:
        return skip("engine not running (see engine.running)")
    return _ours(run, node) or skip(f"no sparkdeploy container on {node.name} (no topology up here)")


def _logs(c: ContainerFact, node: Node) -> str:
    """The fix of a container that fails its checks: its last log lines."""
    return f"docker logs --tail 50 {c.name} on {node.name}"


def health(run: DoctorRun, node: Node) -> list[Result]:
    ours = _serving(run, node)
    if isinstance(ours, Result):
        return [ours]
    out = []
    key = run.secrets.get("LITELLM_MASTER_KEY")
    for c in ours:
        label = f"{c.name} ({c.role})"
        if c.status != "running":
            out.append(fail(f"{label} is {engine.state_text(c)}", "running", f"docker logs {c.name} on {node.name}"))
            continue
        if c.role == "worker":
            out.append(ok(f"{label} running (served by the head)", "running"))
            continue
        base = _base(run, node, c)
        path = health_path(c.role)
        try:
            status, _, secs = http(base + path)
        except HttpError as exc:
            out.append(fail(f"{label} {base}{path}: {exc}", "200", _logs(c, node)))
            continue
        if c.role == "proxy" and key:
            # LiteLLM's /health calls every backend: the proxy's own view of them.
            try:
                _, body, _ = http(base + "/health", key=key, timeout=COMPLETION_TIMEOUT_S / 2)
                good = body.get("healthy_count") if isinstance(body, dict) else None
                bad = body.get("unhealthy_count") if isinstance(body, dict) else None
                if bad:
                    names = [e.get("api_base", "?") for e in body.get("unhealthy_endpoints", [])]
                    out.append(
                        fail(
                            f"{label}: {bad} backend(s) unhealthy: {', '.join(names)}",
                            "every backend healthy",
                            "see those backends' endpoint rows and docker logs",
                        )
                    )
                    continue
                out.append(ok(f"{label} 200; backends healthy: {good}", "200, every backend healthy"))
                continue
            except HttpError as exc:
                out.append(
                    fail(
                        f"{label} /health (backends): {exc}",
                        "200, every backend healthy",
                        _logs(c, node),
                    )
                )
                continue
        out.append(ok(f"{label} {path} {status} in {secs * 1000:.0f} ms", "200"))
    return out


def completion(run: DoctorRun, node: Node) -> list[Result]:
    ours = _serving(run, node)
    if isinstance(ours, Result):
        return [ours]
    out = []
    key = run.secrets.get("LITELLM_MASTER_KEY")
    for c in ours:
        if c.role == "worker" or c.status != "running":
            continue
        label = f"{c.name} ({c.role})"
        base = _base(run, node, c)
        use_key = key if c.role == "proxy" else None
        if c.role == "proxy" and not key:
            out.append(
                fail(
                    f"{label}: no LITELLM_MASTER_KEY in the secrets file",
                    "a completion",
                    "add LITELLM_MASTER_KEY to the inventory's secrets_file",
                )
            )
            continue
        try:
            _, models, _ = http(base + "/v1/models", key=use_key)
            model = models["data"][0]["id"]
            _, body, secs = http(
                base + "/v1/completions",
                key=use_key,
                timeout=COMPLETION_TIMEOUT_S,
                body={"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0},
            )
            text = body["choices"][0].get("text", "")
            tokens = (body.get("usage") or {}).get("completion_tokens")
        except HttpError as exc:
            out.append(fail(f"{label}: {exc}", "a one-token completion", _logs(c, node)))
            continue
        except (KeyError, IndexError, TypeError, AttributeError):
            out.append(
                fail(
                    f"{label}: unexpected answer shape",
                    "an OpenAI completion object",
                    _logs(c, node),
                )
            )
            continue
        if tokens == 0:
            out.append(
                Result(
                    FAIL,
                    f"{label}: 0 tokens generated",
                    ">= 1 token",
                    _logs(c, node),
                )
            )
            continue
        out.append(ok(f"{label} {model}: {text!r} ({tokens} token) in {secs * 1000:.0f} ms", "a one-token completion"))
    return out or [skip("no serving endpoint on this node")]
