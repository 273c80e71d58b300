"""The stack gateway's routes: which engines the gateway sends each model's requests to, derived from what runs.

ONE file holds them: `routes.json` in the gateway's state dir on the head node (litellm-config.yaml beside it
holds only the gateway's settings). Its `groups` are the stack's deployments (each a model and its engines, one
LiteLLM model group), `out` the groups or single engines taken out and why; `model_list` (LiteLLM's entries of
every engine routed now) and `unavailable` (a model of the stack with no engine routed now: why) are derived from
those two by `Routes` below and are what the gateway's hook reads (sparkdeploy/nodeside/gateway/gateway_hook.py).
The hook reloads the file when it changes, so a write re-routes without restarting the proxy: SETTLE_S after the
write, no worker routes by the old file.

Who writes it, always through `plan_write` (a one-step plan on the head node: shown by --dry-run, in --json):
- `up --stack` renders it with the gateway's other files (deploy/stack/units.py) from the stack's deployments,
  leaving out the engines of unchanged deployments that do not answer /health; before it replaces the engines of
  a deployment the gateway routes, it takes that deployment out (the gateway's write puts it back once they pass
  the health gate; one that fails stays out, named in `unavailable`).
- `down --deployment NAME` and `down`: the deployment leaves the routes before its engines stop.
- `take_out` / `put_back` (a group or one engine, with why): the small call for whoever restarts a group
  (issue 43's watcher), on the same write.

A model the gateway does not route is answered by the hook: 404 when no deployment of the stack serves it, 503
with the reason while it is out (docs/gateway.md).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.deploy import health
from sparkdeploy.deploy.apply import apply_plan
from sparkdeploy.deploy.plan import CHANGED, NodePlan, Plan, StepKind, state_dir_path
from sparkdeploy.errors import StepFailed
from sparkdeploy.facts import NodeFacts, gather_facts
from sparkdeploy.labels import DEPLOYMENT_LABEL
from sparkdeploy.recipes.recipe import FAILOVER_ALLOWED_FAILS
from sparkdeploy.runtime.interrupts import Interrupt
from sparkdeploy.runtime.session import Session
from sparkdeploy.topologies.deployment import FileSpec
from sparkdeploy.topologies.running_stack import GATEWAY, state_dir_of

ROUTES_FILE = "routes.json"
# How stale one gateway worker's view of routes.json may be: it looks at the file at most every CHECK_S (0.2 s,
# gateway_hook.py), so twice that after a write no request goes by the old routes (a test reads the hook's figure).
SETTLE_S = 0.5
HEALTH_TIMEOUT_S = 5.0  # an unchanged engine's /health, asked by `up --stack`


# The gateway hook's read-only answer of each on-demand group's demand (nodeside/gateway/gateway_hook.py's
# DEMAND_PATH, the same string: a fast test compares them), polled by the nodes' activators (guard/activate.py).
DEMAND_PATH = "/sparkdeploy/demand"


@dataclass(frozen=True)
class Engine:
    id: str  # `<deployment>-<i>`: LiteLLM's model_info.id
    api_base: str  # http://HOST:PORT/v1
    # Its rank 0's watcher (nodeside/guard/watch.py) and the group it reports the engine under: the hook leaves the
    # engine out while that watcher restarts it (issue 43). None where no watcher runs.
    watch: str | None = None
    watch_group: str | None = None

    def model_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"id": self.id, "allowed_fails": FAILOVER_ALLOWED_FAILS}
        if self.watch and self.watch_group:
            info["group"], info["watch"] = self.watch_group, self.watch
        return info

    def as_json(self) -> dict[str, Any]:
        out = {"id": self.id, "api_base": self.api_base}
        if self.watch and self.watch_group:
            out["watch"], out["group"] = self.watch, self.watch_group
        return out

    @property
    def health_url(self) -> str:
        parts = urllib.parse.urlsplit(self.api_base)
        return f"{parts.scheme}://{parts.netloc}/health"


@dataclass(frozen=True)
class Group:
    model: str
    engines: tuple[Engine, ...]
    idle_timeout: int | None = None  # an on-demand member's (seconds; docs/stack.md); None: always on
    # a stack with on-demand members: node -> the member's share there, and (on-demand ones) node -> the most the
    # shares there may sum to (the one budget's shared_room): the activators' eviction figures (guard/ondemand.py)
    shares: dict[str, float] = field(default_factory=dict)
    room: dict[str, float] = field(default_factory=dict)
    hold: int | None = None  # an on-demand member's: seconds the gateway holds a request for its start, then 503


@dataclass
class Routes:
    groups: dict[str, Group] = field(default_factory=dict)  # deployment -> its model and engines
    out: dict[str, str] = field(default_factory=dict)  # a deployment or an engine id -> why it is out

    def routed(self, name: str) -> list[Engine]:
        """The engines of deployment `name` the gateway sends requests to now."""
        if name in self.out:
            return []
        return [e for e in self.groups[name].engines if e.id not in self.out]

    def model_list(self) -> list[dict[str, Any]]:
        """LiteLLM's model_list: one entry per routed engine; a deployment's engines share its model (one group)."""
        return [_entry(g, e) for name, g in sorted(self.groups.items()) for e in self.routed(name)]

    def on_demand(self) -> dict[str, dict[str, Any]]:
        """The on-demand deployments (docs/stack.md): deployment -> its model, idle timeout and every engine's
        model_list entry. The gateway's hook routes them while their watchers say `ok` and holds a request for
        one that is not (it starts on the request), whatever `model_list` says."""
        return {
            name: {"model": g.model, "idle_timeout": g.idle_timeout, "model_list": [_entry(g, e) for e in g.engines]}
            | ({"hold": g.hold} if g.hold is not None else {})
            for name, g in sorted(self.groups.items())
            if g.idle_timeout is not None
        }

    def models(self) -> list[str]:
        """Every model of the stack (keys may name any of them)."""
        return sorted({g.model for g in self.groups.values()})

    def served(self) -> list[str]:
        """The models the gateway routes now: what its /v1/models lists."""
        return sorted({g.model for name, g in self.groups.items() if self.routed(name)})

    def unavailable(self) -> dict[str, str]:
        """model -> why, for each deployment of the stack none of whose engines is routed now."""
        out = {}
        for name, g in sorted(self.groups.items()):
            if not self.routed(name):
                why = self.out.get(name) or "; ".join(
                    f"{e.id}: {self.out[e.id]}" for e in g.engines if e.id in self.out
                )
                out[g.model] = f"deployment {name} is out of the gateway: {why}"
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "groups": {
                name: {"model": g.model, "engines": [e.as_json() for e in g.engines]}
                | ({"idle_timeout": g.idle_timeout} if g.idle_timeout is not None else {})
                | ({"shares": g.shares} if g.shares else {})
                | ({"room": g.room} if g.room else {})
                | ({"hold": g.hold} if g.hold is not None else {})
                for name, g in sorted(self.groups.items())
            },
            "out": dict(sorted(self.out.items())),
            "model_list": self.model_list(),
            "unavailable": self.unavailable(),
        } | ({"on_demand": self.on_demand()} if self.on_demand() else {})

    def text(self) -> str:
        """routes.json: deterministic (an unchanged stack rewrites nothing)."""
        return json.dumps(self.as_json(), indent=1, sort_keys=True) + "\n"

    def without(self, names: Iterable[str]) -> Routes:
        """These deployments leave the stack's routes (down)."""
        gone = set(names)
        ids = {e.id for n in gone if n in self.groups for e in self.groups[n].engines}
        return Routes(
            {n: g for n, g in self.groups.items() if n not in gone},
            {k: v for k, v in self.out.items() if k not in gone and k not in ids},
        )

    def taken_out(self, name: str, why: str) -> Routes:
        """A deployment or one engine out of the routes, with why (the 503 names it)."""
        return Routes(dict(self.groups), {**self.out, name: why})

    def put_back(self, name: str) -> Routes:
        return Routes(dict(self.groups), {k: v for k, v in self.out.items() if k != name})


def _entry(g: Group, e: Engine) -> dict[str, Any]:
    return {
        "model_name": g.model,
        "litellm_params": {"model": f"hosted_vllm/{g.model}", "api_base": e.api_base, "api_key": "EMPTY"},
        "model_info": e.model_info(),
    }


def engine_id(deployment: str, index: int) -> str:
    return f"{deployment}-{index}"


def group(
    deployment: str,
    model: str,
    urls: Iterable[str],
    watchers: dict[str, tuple[str, str]] | None = None,
    idle_timeout: int | None = None,
    shares: dict[str, float] | None = None,
    room: dict[str, float] | None = None,
    hold: int | None = None,
) -> Group:
    """A deployment's engines; `watchers`: an engine's URL -> (its watcher's group, its watcher's URL)."""
    engines = []
    for i, url in enumerate(urls):
        watch_group, watch = (watchers or {}).get(url, (None, None))
        engines.append(Engine(engine_id(deployment, i), url, watch, watch_group))
    return Group(model, tuple(engines), idle_timeout, dict(shares or {}), dict(room or {}), hold)


def _fractions(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, (int, float))}


def _text(value: Any) -> str | None:
    return str(value) if isinstance(value, str) and value else None


def parse(data: dict[str, Any] | None) -> Routes | None:
    """routes.json as read by the `routes` fact (None: no such file, or not one of ours)."""
    if not isinstance(data, dict) or not isinstance(data.get("groups"), dict):
        return None
    groups = {}
    for name, g in data["groups"].items():
        if isinstance(g, dict) and isinstance(g.get("model"), str) and isinstance(g.get("engines"), list):
            engines = tuple(
                Engine(str(e["id"]), str(e["api_base"]), _text(e.get("watch")), _text(e.get("group")))
                for e in g["engines"]
                if isinstance(e, dict) and "id" in e
            )
            idle, hold = g.get("idle_timeout"), g.get("hold")
            groups[str(name)] = Group(
                g["model"],
                engines,
                idle if isinstance(idle, int) else None,
                _fractions(g.get("shares")),
                _fractions(g.get("room")),
                hold if isinstance(hold, int) else None,
            )
    out = data.get("out") if isinstance(data.get("out"), dict) else {}
    return Routes(groups, {str(k): str(v) for k, v in (out or {}).items()})


def unhealthy(routes: Routes, names: Iterable[str], timeout: float = HEALTH_TIMEOUT_S) -> dict[str, str]:
    """engine id -> why, for each engine of these deployments whose /health does not answer 200."""
    out = {}
    for name in names:
        for e in routes.groups[name].engines:
            try:
                code, _ = health.http_get(e.health_url, time.monotonic() + timeout)
                if code != 200:
                    out[e.id] = f"{e.health_url} answers HTTP {code}"
            except health.HTTP_ERRORS as exc:
                out[e.id] = f"{e.health_url} does not answer ({exc.__class__.__name__}: {exc})"
    return out


# -- the gateway as it runs -------------------------------------------------------------------------------


@dataclass
class Gateway:
    """The stack gateway on the head node, as its facts (read with the gateway's state dir) show it."""

    head: Node
    state_dir: str  # relative to the home
    facts: NodeFacts

    @property
    def routes(self) -> Routes | None:
        return parse(self.facts.routes)

    @property
    def running(self) -> bool:
        return any(c.running for c in self.facts.containers if c.labels.get(DEPLOYMENT_LABEL) == GATEWAY)

    @property
    def endpoint(self) -> str | None:
        value = (self.facts.manifest or {}).get("endpoint")
        return value if isinstance(value, str) else None


def read_gateway(session: Session, inv: Inventory) -> Gateway:
    """The gateway's facts on the head node (one round trip); StepFailed when the head cannot be read."""
    sd = state_dir_of(inv, GATEWAY)
    facts = gather_facts(session, [inv.head], state_dir=sd)[inv.head.name]
    if not isinstance(facts, NodeFacts):
        raise StepFailed(f"{inv.head.name}: UNREACHABLE, the gateway's routes cannot be read: {facts}")
    return Gateway(inv.head, sd, facts)


def plan_write(gw: Gateway, routes: Routes, reason: str) -> Plan:
    """The one step that writes routes.json (no change when the file already says it)."""
    spec = FileSpec(ROUTES_FILE, routes.text())
    have = gw.facts.files.get(ROUTES_FILE)
    change = have is None or have.sha256 != spec.sha256
    node = NodePlan(node=gw.head, state_dir=state_dir_path(gw.facts, gw.state_dir))
    node.add(
        phase=1,
        kind=StepKind.WRITE,
        target=ROUTES_FILE,
        change=change,
        reason=reason if change else "same sha256",
        file=spec,
        mode=spec.mode,
    )
    return Plan([node])


def wait_served(endpoint: str, key: str | None, want: list[str], deadline: float) -> tuple[bool, str]:
    """Until `deadline`: the gateway's /v1/models (asked with the master key) lists exactly `want`."""
    last = ""
    while True:
        try:
            code, body = health.http_request(
                f"{endpoint.rstrip('/')}/models",
                deadline=min(deadline, time.monotonic() + 5),
                headers={"Authorization": f"Bearer {key}"} if key else None,
            )
            if code == 200:
                have = sorted({str(d.get("id")) for d in json.loads(body).get("data", [])})
                if have == sorted(want):
                    return True, f"/v1/models lists {', '.join(want) or 'no model'}"
                last = f"/v1/models lists {', '.join(have) or 'no model'} (want {', '.join(want) or 'none'})"
            else:
                last = f"/v1/models: HTTP {code}"
        except health.HTTP_ERRORS as exc:  # not up yet: asked again until the deadline
            last = f"{exc.__class__.__name__}: {exc}"
        if time.monotonic() + 0.5 >= deadline:
            return False, last
        time.sleep(0.5)


def apply_write(
    session: Session,
    gw: Gateway,
    plan: Plan,
    routes: Routes,
    key: str | None,
    interrupt: Interrupt | None = None,
    say: Callable[[str], None] | None = None,
    timeout: float = 15.0,
) -> tuple[bool, str]:
    """Write routes.json (the plan of plan_write), then wait until no worker routes by the old file; with the
    master key, until /v1/models lists the routed models. (ok, what the gateway lists or why not)."""
    apply_plan(session, plan, interrupt, say=say)
    if plan.failed():
        step = plan.failed()[0]
        raise StepFailed(f"{step.node}: writing the gateway's {ROUTES_FILE} failed: {step.detail}")
    if not any(s.status == CHANGED for s in plan.steps):
        return True, "routes unchanged"
    time.sleep(SETTLE_S)
    if key is None or gw.endpoint is None or not gw.running:
        return True, f"routes {', '.join(routes.served()) or 'no model'}"
    return wait_served(gw.endpoint, key, routes.served(), time.monotonic() + timeout)


def _change(session: Session, inv: Inventory, edit: Callable[[Routes], Routes], reason: str, key: str | None) -> Routes:
    gw = read_gateway(session, inv)
    routes = gw.routes
    if routes is None:
        where = f"~/{gw.state_dir}/{ROUTES_FILE}"
        raise StepFailed(f"no stack gateway routes on {gw.head.name} ({where}): run `sparkdeploy up --stack FILE`")
    new = edit(routes)
    ok, detail = apply_write(session, gw, plan_write(gw, new, reason), new, key)
    if not ok:
        raise StepFailed(f"gateway: {detail}")
    return new


def take_out(session: Session, inv: Inventory, name: str, why: str, key: str | None = None) -> Routes:
    """Deployment (or engine id) `name` out of the gateway's routes, with why (its model answers 503 saying so)."""
    return _change(session, inv, lambda r: r.taken_out(name, why), f"take {name} out: {why}", key)


def put_back(session: Session, inv: Inventory, name: str, key: str | None = None) -> Routes:
    """Deployment (or engine id) `name` routed again."""
    return _change(session, inv, lambda r: r.put_back(name), f"route {name} again", key)
