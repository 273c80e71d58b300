"""What `sparkdeploy top` shows: each engine's load from its own Prometheus /metrics, and the proxy's split.

Scraped from this machine over the management network, at the endpoints `status` reports (each serving
container's health port on its node's management IP). Read from vLLM's metrics (names as vLLM 0.32's
PrometheusStatLogger writes them; the lab's simulator serves the same):
  vllm:num_requests_running / vllm:num_requests_waiting / vllm:kv_cache_usage_perc   gauges
  vllm:prompt_tokens_total / vllm:generation_tokens_total                           counters -> tokens/s
  vllm:time_to_first_token_seconds                                                   histogram -> p50/p95
  vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens (_total)   counters -> draft acceptance
    (speculative decoding: accepted / drafted tokens, and 1 + accepted / drafts tokens a step; recipes/speculative.py)
SGLang's and llama.cpp's engines are read by their own names (recipes/engines/: each engine's `metrics`,
recognised from the page itself; llama.cpp has no KV-use gauge and no TTFT histogram: shown as -).
and, for 2xsolo, LiteLLM's `litellm_deployment_total_requests_total` per `model_id` (sparkdeploy names each
backend's model_info.id after its node): the share of requests each backend received from the proxy.
Token rates are over the last refresh interval; TTFT quantiles and request shares over the window (default
60 s), from the difference of two cumulative samples, as Prometheus' rate() and histogram_quantile() do.
"""

from __future__ import annotations

import math
import re
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkdeploy.facts import FactArgs, NodeFacts, gather
from sparkdeploy.facts.catalog import TOP
from sparkdeploy.recipes.engines.registered import metric_names
from sparkdeploy.recipes.speculative import SpecCounters, read_counters
from sparkdeploy.runtime.interrupts import in_threads
from sparkdeploy.simulated import any_simulated, metrics_say_simulated

if TYPE_CHECKING:
    from sparkdeploy.config.inventory import Inventory, Node
    from sparkdeploy.runtime.remote import NodeConnection

Metrics = dict[str, list[tuple[dict[str, str], float]]]

SCRAPE_TIMEOUT_S = 1.5
SERVING_ROLES = ("solo", "head", "backend")
PROXY_REQUESTS = "litellm_deployment_total_requests_total"

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format -> name -> [(labels, value)] (comments and malformed lines are skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.fullmatch(line.strip())
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {
            k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for k, v in _LABEL.findall(m.group(2) or "")
        }
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def _sum(metrics: Metrics, name: str) -> float | None:
    series = metrics.get(name)
    return None if not series else sum(v for _, v in series)


def _buckets(metrics: Metrics, name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) summed over every series of a histogram, sorted by bound."""
    per: dict[float, float] = {}
    for labels, value in metrics.get(name + "_bucket", []):
        le = labels.get("le", "")
        bound = math.inf if le == "+Inf" else float(le)
        per[bound] = per.get(bound, 0.0) + value
    return sorted(per.items())


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile(): linear interpolation inside the bucket holding rank q x count."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower  # in the +Inf bucket: the highest finite bound is all that is known
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


@dataclass(frozen=True)
class Target:
    node: str
    container: str
    kind: str  # engine | proxy
    url: str  # the /metrics URL


@dataclass
class Sample:
    time: float
    error: str = ""
    running: float | None = None
    waiting: float | None = None
    kv: float | None = None
    prompt: float | None = None
    generation: float | None = None
    ttft: list[tuple[float, float]] = field(default_factory=list)
    requests: dict[str, float] = field(default_factory=dict)  # proxy: backend id -> requests sent
    simulated: bool = False  # the engine's /metrics carries vllm-sim's marker (sparkdeploy.simulated)
    spec: SpecCounters | None = None  # speculative decoding's counters (None: the engine drafts nothing)


def scrape(target: Target, bearer: str | None = None, timeout: float = SCRAPE_TIMEOUT_S) -> Sample:
    """One GET of the target's /metrics; an unreachable target gives a Sample with its error."""
    now = time.monotonic()
    req = urllib.request.Request(target.url)
    if bearer and target.kind == "proxy":
        req.add_header("Authorization", f"Bearer {bearer}")  # LiteLLM guards /metrics with the master key
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return Sample(now, error=f"HTTP {exc.code}")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return Sample(now, error=f"{reason.__class__.__name__}: {reason}")
    m = parse_metrics(text)
    if target.kind == "proxy":
        requests: dict[str, float] = {}
        for labels, value in m.get(PROXY_REQUESTS, []):
            key = labels.get("model_id") or labels.get("api_base") or "?"
            requests[key] = requests.get(key, 0.0) + value
        return Sample(now, requests=requests)
    names = metric_names(set(m))  # the engine's own names (recipes/engines/): vLLM, SGLang or llama.cpp
    kv = m.get(names.kv_usage) if names.kv_usage else None
    return Sample(
        now,
        running=_sum(m, names.running),
        waiting=_sum(m, names.waiting) if names.waiting else None,
        kv=max(v for _, v in kv) if kv else None,
        prompt=_sum(m, names.prompt_tokens),
        generation=_sum(m, names.generation_tokens),
        ttft=_buckets(m, names.ttft) if names.ttft else [],
        simulated=metrics_say_simulated(m),
        spec=read_counters(m, names.spec_accept_rate, names.spec_accept_length),
    )


def _rate(new: float | None, old: float | None, seconds: float) -> float | None:
    if new is None or old is None or seconds <= 0:
        return None
    return max(0.0, new - old) / seconds  # a counter that went down: the engine restarted


def _delta_buckets(new: list[tuple[float, float]], old: list[tuple[float, float]]) -> list[tuple[float, float]]:
    before = dict(old)
    if any(count < before.get(bound, 0.0) for bound, count in new):
        return list(new)  # reset (restart): the new cumulative counts are the window
    return [(bound, count - before.get(bound, 0.0)) for bound, count in new]


class Monitor:
    """Samples of every target, kept for `window_s`; `snapshot()` turns them into one row per engine."""

    def __init__(
        self, targets: list[Target], bearer: str | None = None, window_s: float = 60.0, since_start: bool = False
    ):
        """since_start: TTFT quantiles and request shares from every request since each engine (proxy)
        started, not over the window (`top --once`, whose only window is one sample gap)."""
        self.targets = targets
        self.bearer = bearer
        self.window_s = window_s
        self.since_start = since_start
        self.history: dict[Target, deque[Sample]] = {t: deque() for t in targets}

    def sample(self) -> None:
        """Scrape every target at once (one thread each)."""
        if not self.targets:
            return
        samples = in_threads(self.targets, lambda t: scrape(t, self.bearer))  # a stop does not wait for a scrape
        for target, s in zip(self.targets, samples, strict=False):
            h = self.history[target]
            h.append(s)
            while len(h) > 2 and s.time - h[0].time > self.window_s:
                h.popleft()

    def _window(self, target: Target) -> tuple[Sample | None, Sample | None, Sample | None]:
        """(oldest good sample in the window, the one before the newest, the newest)."""
        good = [s for s in self.history[target] if not s.error]
        if not good:
            return None, None, None
        return good[0], (good[-2] if len(good) > 1 else None), good[-1]

    def proxy_share(self) -> tuple[dict[str, float], str]:
        """backend id -> share of the proxy's requests over the window (or since the proxy started)."""
        totals: dict[str, float] = {}
        basis = "window"
        for t in self.targets:
            if t.kind != "proxy":
                continue
            first, _, last = self._window(t)
            if last is None:
                continue
            before = first.requests if first is not last else {}  # type: ignore[union-attr]  # a newest sample means an oldest one
            delta = {k: v - before.get(k, 0.0) for k, v in last.requests.items()}
            if first is last or self.since_start or sum(delta.values()) <= 0:
                delta, basis = dict(last.requests), "since the proxy started"
            for k, v in delta.items():
                totals[k] = totals.get(k, 0.0) + max(0.0, v)
        whole = sum(totals.values())
        return ({k: v / whole for k, v in totals.items()} if whole > 0 else {}), basis

    def snapshot(self) -> dict[str, Any]:
        share, share_basis = self.proxy_share()
        engines = []
        for t in self.targets:
            if t.kind != "engine":
                continue
            first, prev, last = self._window(t)
            newest = self.history[t][-1] if self.history[t] else None
            row: dict[str, Any] = {
                "node": t.node,
                "container": t.container,
                "url": t.url,
                "error": newest.error if newest is not None and newest.error else None,
            }
            if last is not None:
                dt = last.time - prev.time if prev is not None else 0.0
                ttft = _delta_buckets(last.ttft, first.ttft) if first is not last else list(last.ttft)  # type: ignore[union-attr]  # a newest sample means an oldest one
                basis = "window" if first is not last else "since the engine started"
                if self.since_start:
                    ttft, basis = list(last.ttft), "since the engine started"
                spec = None
                if last.spec is not None:  # over the window, as TTFT (since the start with --once or no traffic)
                    spec = last.spec if self.since_start or first is last else last.spec.since(first.spec)  # type: ignore[union-attr]  # a newest sample means an oldest one
                    if not spec.draft_tokens:
                        spec = last.spec
                row.update(
                    {
                        "simulated": last.simulated,
                        "running": last.running,
                        "waiting": last.waiting,
                        "kv_cache_usage": last.kv,
                        "prompt_tokens_per_s": _rate(last.prompt, prev.prompt, dt) if prev else None,
                        "generation_tokens_per_s": _rate(last.generation, prev.generation, dt) if prev else None,
                        "ttft_p50_s": quantile(0.5, ttft),
                        "ttft_p95_s": quantile(0.95, ttft),
                        "ttft_requests": ttft[-1][1] if ttft else 0,
                        "ttft_basis": basis,
                        "spec_decode": spec.as_dict() if spec is not None else None,
                    }
                )
            if share:
                row["request_share"] = share.get(t.node, 0.0)
            engines.append(row)
        proxies = [
            {
                "node": t.node,
                "container": t.container,
                "url": t.url,
                "error": (self.history[t][-1].error or None) if self.history[t] else None,
            }
            for t in self.targets
            if t.kind == "proxy"
        ]
        return {
            "window_s": self.window_s,
            "engines": engines,
            "proxies": proxies,
            "request_share": share,
            "request_share_basis": share_basis if share else None,
            "simulated": any_simulated(engines),
        }


def node_targets(node: Node, facts: NodeFacts, deployment: str | None = None) -> list[Target]:
    """A node's targets from its facts (set TOP: the running containers of ours with their role, and the
    manifests of the state dir and of a stack's deployments beside it, `<state_dir>-NAME`: each container's
    health port). deployment: only that deployment of a stack (pure)."""
    ports = {}
    for manifest in facts.manifests.values():
        listed = manifest.get("containers") or []
        ports.update({c.get("name"): c.get("health_port") for c in listed if isinstance(c, dict)})
    out = []
    for name, (role, of) in facts.running.items():
        port = ports.get(name)
        if not port or (deployment and of != deployment):
            continue
        url = f"http://{node.url_host}:{port}/metrics"
        if role == "proxy":
            out.append(Target(node.name, name, "proxy", url))
        elif role in SERVING_ROLES:
            out.append(Target(node.name, name, "engine", url))
    return out


def read_targets(
    inventory: Inventory, conns: dict[str, NodeConnection], deployment: str | None = None
) -> tuple[list[Target], dict[str, Exception]]:
    """Every node's targets over its SSH connection, in parallel: (targets in node order, node -> error).
    deployment: only that deployment of a stack."""
    from sparkdeploy.runtime.remote import on_nodes

    args = FactArgs(state_dir=inventory.cluster.state_dir)

    def one(node: Node) -> list[Target]:
        return node_targets(node, gather(conns[node.name], TOP, args, timeout=30), deployment)

    outcomes = on_nodes(list(inventory.nodes), one)
    return [t for o in outcomes if o.ok for t in o.value], {o.node.name: o.error for o in outcomes if not o.ok}  # type: ignore[misc]  # not ok: an error
