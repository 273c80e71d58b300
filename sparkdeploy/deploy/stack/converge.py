"""Several deployments on one cluster behind one gateway: `sparkdeploy up --stack stack.yaml`.

A stack file lists deployments, each a recipe with its topology, nodes, engine port, memory share and `--set`
overrides. Each deployment is rendered by the ordinary topology code (topologies.build_deployment) with its name
in its container names and labels (`sparkdeploy-NAME-vllm`, label io.sparkdeploy.deployment=NAME) and its own
state dir (`<state_dir>-NAME` beside the single deployment's), so each is planned against only its own
containers and files: changing or removing one leaves the others' containers untouched, and a second `up`
changes nothing. 2xsolo and replicas start no proxy of their own: the stack's one gateway (the LiteLLM proxy on
the head node, deployment `gateway`) routes by model name to every engine, several engines of one deployment
being one model group. The gateway reloads its model list from its config file when `up` rewrites it
(sparkdeploy/nodeside/gateway/gateway_hook.py), so adding or removing a deployment restarts no proxy.

Memory (unified memory: vLLM reserves gpu_memory_utilization x total at start): engines sharing a node must fit
together (`fits`); `memory: auto` splits what the fixed shares leave on each node. `up` refuses before anything
changes, with each engine's share and settings that would fit.

The stack file's model, validation and memory budget are deploy/stack/file.py; the gateway and guard units,
deploy/stack/units.py; this module plans and converges them.

Each deployment goes through the single `up`'s phases (deploy/up.py: preflight with the image push and the
model check, the fabric gate, apply, health gate, the per-node lines after a failure, the history record); none
of them is written twice. Order of `up --stack`: every deployment that starts something passes preflight and
(cluster / replicas) the fabric gate before anything changes; then the guards (ONE per engine node, their own
unit `guard`: each stops every engine of its node at the hard line), the deployments that are new or changed
(each: taken out of the gateway's routes first when it replaces engines the gateway routes, apply, health gate),
the gateway's files with its routes (the new models appear, a replaced one is routed again), and last the
deployments no longer in the file are removed (after the gateway forgot them). An unchanged deployment whose
engine does not answer /health is left out of the routes and named (exit 1). Each changed deployment is recorded
in `history`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.config.secrets import refuse_missing
from sparkdeploy.deploy import DEFAULT_TIMEOUT_S, fabric_gate, history, preflight
from sparkdeploy.deploy.plan import (
    CHANGED,
    GATEWAY_KEPT,
    KEYS_FILE,
    SPEND_FOLDER,
    Plan,
    StepKind,
    _restart_together,
    describe,
    plan_node,
    plan_removal,
)
from sparkdeploy.deploy.progress import Reporter, mask_data, plan_summary
from sparkdeploy.deploy.stack import routes as gateway_routes
from sparkdeploy.deploy.stack.file import NAME, Member, Stack, budget, build, fits, load_stack, on_demand_figures
from sparkdeploy.deploy.stack.routes import Gateway, Routes
from sparkdeploy.deploy.stack.units import gateway_about, gateway_node, guard_about, guard_nodes, stack_routes
from sparkdeploy.deploy.up import apply_phase, failure_lines, health_phase, refusal, run_preflight, simulated
from sparkdeploy.deploy.up_result import Phase, Progress, UpResult
from sparkdeploy.errors import ConfigError, Problem, SparkdeployError, StepFailed
from sparkdeploy.facts import NodeFacts, gather_facts
from sparkdeploy.images import push
from sparkdeploy.labels import DEPLOYMENT_LABEL, NOT_ENGINES, ROLE_LABEL
from sparkdeploy.runtime.interrupts import Interrupt
from sparkdeploy.runtime.locks import inventory_lock, node_locks
from sparkdeploy.runtime.session import Session
from sparkdeploy.topologies.deployment import Deployment, NodeDeployment
from sparkdeploy.topologies.running_stack import GATEWAY, GUARD, RESERVED, deployments_on, state_dir_of

# -- planning ---------------------------------------------------------------------------------------------


def only(f: NodeFacts, name: str) -> NodeFacts:
    """The node's facts as one deployment sees them: its own containers only."""
    return f.with_containers([c for c in f.containers if c.labels.get(DEPLOYMENT_LABEL) == name])


@dataclass
class Unit:
    """What one plan converges: a deployment of the stack, the gateway, or a deployment that goes."""

    name: str
    kind: Literal["guard", "deployment", "gateway", "remove"]
    plan: Plan
    member: Member | None = None
    facts: dict[str, NodeFacts] = field(default_factory=dict)  # a deployment's: its own containers, resources

    @property
    def changes(self) -> int:
        return self.plan.changes

    def as_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.name,
            "action": self.kind,
            "changes": self.changes,
            "steps": [s.as_dict() for s in self.plan.steps],
        }


def plan_unit(
    inv: Inventory,
    name: str,
    facts: dict[str, NodeFacts],
    nodes: list[NodeDeployment],
    about: dict[str, Any],
    groups: Sequence[list[str]] = (),
) -> Plan:
    by = {nd.node.name: nd for nd in nodes}
    plans = []
    for node in inv.nodes:
        if node.name not in facts:  # unreachable (down): reported by the caller
            continue
        f = only(facts[node.name], name)
        if node.name in by:
            plans.append(plan_node(about, by[node.name], f))
        elif f.containers or f.state_dir_mode is not None:
            plans.append(plan_removal(node, f, state_dir_of(inv, name), f"not part of deployment {name}"))
    plan = Plan(plans)
    for group in groups:
        _restart_together(plan, group, {n: only(f, name) for n, f in facts.items()})
    return plan


def plan_stack(
    stack: Stack, facts: dict[str, dict[str, NodeFacts]], gone: Sequence[str], routes: Routes | None = None
) -> list[Unit]:
    """facts: state dir -> node -> facts. Units in the order they apply: the guards first (engines start
    watched), the deployments, the gateway (with `routes`: default every engine of the stack), the deployments
    that go."""
    inv = stack.inventory
    guards = guard_nodes(stack)
    sd = state_dir_of(inv, GUARD)
    units = [Unit(GUARD, "guard", plan_unit(inv, GUARD, facts[sd], guards, guard_about(stack)))]
    for m in stack.members:
        units.append(Unit(m.name, "deployment", _plan_member(stack, m, facts), m))
    units.append(Unit(GATEWAY, "gateway", _plan_gateway(stack, facts, routes)))
    for name in gone:
        units.append(Unit(name, "remove", plan_unit(inv, name, facts[state_dir_of(inv, name)], [], {})))
    return units


def _plan_gateway(stack: Stack, facts: dict[str, dict[str, NodeFacts]], routes: Routes | None) -> Plan:
    gw = gateway_node(stack, routes)
    return plan_unit(stack.inventory, GATEWAY, facts[gw.state_dir], [gw], gateway_about(stack))


def starts(u: Unit) -> bool:
    return any(s.kind == StepKind.START_CONTAINER and s.change for s in u.plan.steps)


# -- up ---------------------------------------------------------------------------------------------------


def _read(
    session: Session,
    inv: Inventory,
    state_dir: str,
    what: str = "state",
    dep: Deployment | list[NodeDeployment] | None = None,
) -> dict[str, NodeFacts]:
    """Every node's facts as seen from one state dir (with the image IDs `dep` needs)."""
    nds = dep.nodes if isinstance(dep, Deployment) else dep or []
    wanted = {nd.node.name: sorted({c.image for c in nd.containers}) for nd in nds}
    facts = gather_facts(session, inv.nodes, lambda n: wanted.get(n.name, []), state_dir=state_dir, what=what)
    bad = {n: f for n, f in facts.items() if not isinstance(f, NodeFacts)}
    if bad:
        raise StepFailed("; ".join(f"{n}: UNREACHABLE, nothing changed: {e}" for n, e in bad.items()))
    return cast("dict[str, NodeFacts]", facts)


def up(
    path: str,
    inventory: str | None = None,
    recipes_dir: str | None = None,
    dry_run: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    reporter: Reporter | None = None,
    result: dict[str, Any] | None = None,
    fabric_gate_on: bool = True,
) -> dict[str, Any]:
    """Converge the cluster to the stack file; return the `up --stack --json` result (masked).
    fabric_gate_on: False is `--no-fabric-gate` (deploy/fabric_gate.py), for every deployment of the stack."""
    out = reporter if reporter is not None else Reporter()
    result = result if result is not None else {}
    stack = load_stack(path, inventory, recipes_dir)
    if not dry_run:
        refuse_missing(stack.secrets)
    stack.secrets.require("LITELLM_MASTER_KEY", "the stack gateway's master key")
    out.use_mask(stack.secrets.mask)
    inv = stack.inventory
    result.update({"stack": path, "endpoint": stack.endpoint, "dry_run": dry_run, "ok": False})
    try:
        with (
            inventory_lock(inv),
            Interrupt(out.progress) as interrupt,
            Session.open(inv, mask=stack.secrets.mask) as session,
            node_locks(session, dry_run, out.warn),
        ):
            _up(stack, session, interrupt, out, result, dry_run, timeout, fabric_gate_on, inventory)
    finally:
        result.update(mask_data(stack.secrets.mask, result))
    return result


def _up(
    stack: Stack,
    session: Session,
    interrupt: Interrupt,
    out: Reporter,
    result: dict[str, Any],
    dry_run: bool,
    timeout: float,
    fabric_gate_on: bool = True,
    inventory_arg: str | None = None,
) -> None:
    inv = stack.inventory
    out.progress(f"reading facts on {', '.join(n.name for n in inv.nodes)}")
    base = _read(session, inv, inv.cluster.state_dir, what="all")
    totals = stack.totals = {n: f.total_memory_mb for n, f in base.items()}
    stack.head_cpus = base[stack.head.name].cpus
    util = budget(stack, totals)  # refuses (exit 2) before anything changes
    build(stack, util)
    result["memory"] = {m.name: util[m.name] for m in stack.members}
    for m in stack.members:
        assert m.deployment is not None
        for w in m.deployment.warnings:
            out.warn(f"{m.name}: {w}")
    running = deployments_on(cast("dict[str, NodeFacts | Exception]", base))
    wanted = {m.name for m in stack.members} | set(RESERVED)
    gone = sorted(running - wanted)
    unlabelled = sorted({c.name for f in base.values() for c in f.containers if not c.labels.get(DEPLOYMENT_LABEL)})
    if unlabelled:
        raise StepFailed(
            f"a single deployment runs on the nodes ({', '.join(unlabelled)}): run `sparkdeploy down` first "
            "(a stack never removes what `up` without --stack made). Nothing was changed."
        )
    facts = _unit_facts(stack, session, gone, dry_run, out)
    units = plan_stack(stack, facts, gone)
    result["units"] = [u.as_dict() for u in units]
    _check(stack, session, units, facts, base, out, result, dry_run, fabric_gate_on)  # nothing changed before
    # the engines of unchanged deployments that do not answer /health stay out of the routes
    asleep = cold(units)
    probed = gateway_routes.unhealthy(stack_routes(stack), [u.name for u in _unchanged(units) if u.name not in asleep])
    routes = stack_routes(stack, probed | dict.fromkeys(asleep, COLD))
    gateway = next(u for u in units if u.kind == "gateway")
    if probed or asleep:
        gateway.plan = _plan_gateway(stack, facts, routes)
    result["units"] = [u.as_dict() for u in units]  # a pushed image re-planned its deployment
    result["routes"] = {"served": routes.served(), "out": routes.out, "cold": asleep}
    if dry_run:
        for u in units:
            out.line(f"== {u.kind} {u.name}: {u.changes} change(s) ==", "bold")
            out.dry_run(u.plan)
        result["ok"] = True
        return
    _apply_units(stack, session, interrupt, out, result, units, facts, routes, timeout)
    key = stack.secrets.get("LITELLM_MASTER_KEY")
    if any(s.status == CHANGED for s in gateway.plan.steps):
        time.sleep(gateway_routes.SETTLE_S)  # every gateway worker routes by the new routes.json
    ok, detail = gateway_routes.wait_served(stack.endpoint, key, routes.served(), time.monotonic() + timeout)
    result.setdefault("health", {})[GATEWAY] = {"ok": ok, "detail": detail}
    if not ok:
        raise StepFailed(f"gateway: {detail}")
    for u in units:
        if u.kind == "remove":
            _apply(session, u, out, stack, interrupt)
    _record(stack, session, units, inventory_arg, result)
    result["units"] = [u.as_dict() for u in units]
    result["changed"] = sum(1 for u in units for s in u.plan.steps if s.status == CHANGED)
    for name in asleep:
        out.line(f"{name}: {COLD}")
    if probed:
        for engine, why in sorted(probed.items()):
            out.line(f"{engine}: not routed by the gateway: {why}", "red")
        raise StepFailed(
            f"{len(probed)} engine(s) of unchanged deployments do not answer, so the gateway does not route them "
            f"({', '.join(sorted(probed))}); it routes {', '.join(routes.served()) or 'no model'}. See "
            "`sparkdeploy logs --deployment NAME`; `up --stack` routes them again once they answer"
        )
    result["ok"] = True
    out.line(f"{result['changed']} change(s); gateway {stack.endpoint}: {detail}", "green")


def _unit_facts(
    stack: Stack, session: Session, gone: list[str], dry_run: bool, out: Reporter
) -> dict[str, dict[str, NodeFacts]]:
    """Each unit's facts, by its state dir: the members', the gateway's and the guards' (their images pushed
    here first: they have no preflight of their own), and those of the deployments this stack no longer has."""
    inv = stack.inventory
    facts = {m.state_dir: _read(session, inv, m.state_dir, dep=m.deployment) for m in stack.members}
    for name, nds in ((GATEWAY, [gateway_node(stack)]), (GUARD, guard_nodes(stack))):
        sd = state_dir_of(inv, name)
        facts[sd] = _read(session, inv, sd, dep=nds)
        if not dry_run and _push_images(inv, nds, facts[sd], out):
            facts[sd] = _read(session, inv, sd, dep=nds)
    for n in gone:
        facts[state_dir_of(inv, n)] = _read(session, inv, state_dir_of(inv, n))
    return facts


def _apply_units(
    stack: Stack,
    session: Session,
    interrupt: Interrupt,
    out: Reporter,
    result: dict[str, Any],
    units: list[Unit],
    facts: dict[str, dict[str, NodeFacts]],
    routes: Routes,
    timeout: float,
) -> None:
    """Each unit's plan applied in order, the removals aside (_up applies them once the gateway serves the new
    routes): a member that starts leaves the gateway's routes first, and passes its health gate before the next."""
    inv = stack.inventory
    gw_sd = state_dir_of(inv, GATEWAY)
    gw = Gateway(stack.head, gw_sd, facts[gw_sd][stack.head.name])
    rerouted = False
    for u in units:
        if interrupt.set:
            raise KeyboardInterrupt
        if u.kind == "remove":
            continue
        if u.kind == "gateway" and rerouted:  # its routes.json was written mid-way: planned again from the node
            facts[gw_sd] = _read(session, inv, gw_sd, dep=[gateway_node(stack)])
            u.plan = _plan_gateway(stack, facts, routes)
        if u.member is None:  # the guards, the gateway
            _apply(session, u, out, stack, interrupt)
            continue
        dep = u.member.deployment
        assert dep is not None
        if starts(u) and _take_out(session, gw, u.name, stack, out, interrupt):
            rerouted = True
            gw = Gateway(stack.head, gw_sd, _read(session, inv, gw_sd)[stack.head.name])  # as the node has it now
        seen = Progress(Phase.APPLY, facts=u.facts, plan=u.plan)
        mine = UpResult()
        try:
            _apply(session, u, out, stack, interrupt)
            if any(s.kind == StepKind.START_CONTAINER and s.status == CHANGED for s in u.plan.steps):
                health_phase(dep, session, u.plan, interrupt, timeout, out, mine, seen, who=u.name)
        except (KeyboardInterrupt, StepFailed) as exc:
            failure_lines(u.member.inventory, seen, exc, out, u.name)
            raise
        finally:
            if mine.health is not None:
                result.setdefault("health", {})[u.name] = mine.health


def _record(
    stack: Stack, session: Session, units: list[Unit], inventory_arg: str | None, result: dict[str, Any]
) -> None:
    """What runs now, for `sparkdeploy history` (rollback names the stack file: it says what runs)."""
    for u in units:
        if u.member is not None and u.changes:
            dep = cast(Deployment, u.member.deployment)
            rec = history.record_deployment(
                dep, session.conns, u.member.sets, inventory_arg, simulated(dep), stack=(stack.path, u.name)
            )
            result.setdefault("history_ids", {})[u.name] = rec["id"]


def _unchanged(units: list[Unit]) -> list[Unit]:
    """The deployments this `up` starts nothing of (their engines are asked /health before the gateway routes
    them); the others pass the health gate or `up` stops."""
    return [u for u in units if u.kind == "deployment" and not starts(u)]


def _take_out(
    session: Session, gw: Gateway, name: str, stack: Stack, out: Reporter, interrupt: Interrupt | None
) -> bool:
    """Before deployment `name`'s engines are replaced: out of the gateway's routes, if it routes them (a client
    gets 503 saying so, not a dead engine's 500). True when routes.json was written."""
    routes = gw.routes
    if routes is None or name not in routes.groups or not routes.routed(name):
        return False
    new = routes.taken_out(name, "its engines are being replaced by `up --stack`")
    plan = gateway_routes.plan_write(gw, new, f"take {name} out while its engines are replaced")
    out.progress(f"gateway: {name} out of the routes while its engines are replaced")
    gateway_routes.apply_write(session, gw, plan, new, stack.secrets.get("LITELLM_MASTER_KEY"), interrupt)
    return True


def _check(
    stack: Stack,
    session: Session,
    units: list[Unit],
    facts: dict[str, dict[str, NodeFacts]],
    base: dict[str, NodeFacts],
    out: Reporter,
    result: dict[str, Any],
    dry_run: bool,
    fabric_gate_on: bool,
) -> None:
    """`up`'s checks for every deployment of the stack, before anything changes: preflight (with the image push
    and the model check) where it starts something, then the fabric gate (cluster / replicas that change)."""
    inv = stack.inventory
    checks: list[preflight.Result] = []
    for u in units:
        m = u.member
        if m is None:
            continue
        dep = cast(Deployment, m.deployment)

        def own(read: dict[str, NodeFacts], name: str = u.name) -> dict[str, NodeFacts]:
            return {n: _with_resources(only(f, name), base[n]) for n, f in read.items()}

        u.facts = own(facts[m.state_dir])
        if not any(s.kind == StepKind.START_CONTAINER and s.change for s in u.plan.steps) and not (
            m.on_demand and u.changes
        ):
            continue  # only deployments that start something (or prepare an on-demand one): ports, images, memory

        def read(m: Member = m, u: Unit = u) -> dict[str, NodeFacts | Exception]:
            facts[m.state_dir] = _read(session, inv, m.state_dir, dep=m.deployment)
            u.facts = own(facts[m.state_dir], u.name)
            u.plan = _plan_member(stack, m, facts)  # a pushed image: its ID changed the plan
            return cast("dict[str, NodeFacts | Exception]", u.facts)

        mine = UpResult()
        cs, _ = run_preflight(
            dep,
            session,
            cast("dict[str, NodeFacts | Exception]", u.facts),
            read,
            out,
            simulated(dep),
            dry_run,
            False,
            mine,
        )
        if mine.pushed:
            result.setdefault("pushed", []).extend(mine.pushed)
        checks += [dataclasses.replace(c, check=f"{u.name}: {c.check}") for c in cs]
    result["preflight"] = [c.as_row() for c in checks]
    failed = preflight.failures(checks)
    if failed:
        out.preflight(checks)
        raise refusal(failed)
    for u in units:
        if u.member is None:
            continue
        dep = cast(Deployment, u.member.deployment)
        mine = UpResult()
        try:
            fabric_gate.gate(
                dep,
                session,
                cast("dict[str, NodeFacts | Exception]", u.facts),
                u.plan,
                out,
                mine,
                dry_run,
                fabric_gate_on,
                simulated(dep),
                who=u.name,
            )
        except StepFailed as exc:
            failure_lines(u.member.inventory, Progress(Phase.FABRIC_GATE, facts=u.facts), exc, out, u.name)
            raise
        finally:
            if mine.fabric_gate is not None and mine.fabric_gate.get("status") != fabric_gate.NOT_APPLICABLE:
                result.setdefault("fabric_gate", {})[u.name] = mine.fabric_gate


def _plan_member(stack: Stack, m: Member, facts: dict[str, dict[str, NodeFacts]]) -> Plan:
    dep = cast(Deployment, m.deployment)
    about = describe(dep) | {"deployment": m.name, "endpoint": stack.endpoint}
    # what renders it again without the stack file (doctor's recipe checks: `rebuild`)
    about["stack"] = {"nodes": m.node_names, "port": m.port, "sets": m.sets}
    if m.on_demand:
        about["on_demand"] = on_demand_figures(stack, m)
    plan = plan_unit(stack.inventory, m.name, facts[m.state_dir], dep.nodes, about, dep.groups)
    if m.on_demand and not warm(m, facts[m.state_dir]):
        prepare_only(plan)
    return plan


# An on-demand member that is not running: `up --stack` prepares it (files, image, model: preflight) and starts
# nothing; the gateway's request starts it (docs/stack.md, "On-demand members").
COLD = "cold: on demand, not running"


def warm(m: Member, facts: dict[str, NodeFacts]) -> bool:
    """Whether any engine container of the member runs on its nodes (then `up --stack` converges it like any)."""
    names = {c.name for nd in cast(Deployment, m.deployment).nodes for c in nd.containers if c.is_engine}
    return any(c.running for f in facts.values() for c in only(f, m.name).containers if c.name in names)


# _container_reason's words for a container that is missing or not the one rendered: created again
_RECREATE = ("missing", "config-hash", "image")


def prepare_only(plan: Plan) -> None:
    """A cold on-demand member's plan: its files are written and its engine containers created, not started (the
    node's watcher starts them on the gateway's request); one created already as rendered is left as it is."""
    for s in plan.steps:
        if s.kind != StepKind.START_CONTAINER or not s.change:
            continue
        if s.reason.startswith(_RECREATE):
            s.kind, s.reason = StepKind.CREATE_CONTAINER, f"on demand: created, not started ({s.reason})"
        else:
            s.change, s.reason = False, COLD


def cold(units: Sequence[Unit]) -> list[str]:
    """The on-demand members this `up` leaves cold (out of the routes with COLD, not a failure)."""
    return [
        u.name
        for u in units
        if u.member is not None
        and u.member.on_demand
        and any(s.reason == COLD or s.kind == StepKind.CREATE_CONTAINER for s in u.plan.steps)
    ]


def _push_images(inv: Inventory, nds: list[NodeDeployment], facts: dict[str, NodeFacts], out: Reporter) -> bool:
    """The images of the gateway or the guards that a node lacks, pushed to it; True when any was."""
    missing: dict[str, list[Node]] = {}
    for nd in nds:
        for c in nd.containers:
            if facts[nd.node.name].images.get(c.image) is None:
                missing.setdefault(preflight.image_definition_name(c.image), []).append(nd.node)
    for name, nodes in sorted(missing.items()):
        out.progress(f"pushing image {name} to {', '.join(n.name for n in nodes)}")
        for o in push.push_image(name, inv, nodes):
            if not o.ok:
                raise StepFailed(f"push of {name} to {o.node.name} failed: {o.error}")
    return bool(missing)


def _with_resources(f: NodeFacts, base: NodeFacts) -> NodeFacts:
    g = f.copy()
    g.add_resources(base)
    return g


def _apply(session: Session, u: Unit, out: Reporter, stack: Stack, interrupt: Interrupt | None = None) -> None:
    if not u.changes:
        return
    mask = stack.secrets.mask
    again = f"sparkdeploy up --stack {stack.path}"
    apply_phase(session, u.plan, interrupt, mask, out, f"{u.kind} {u.name}", UpResult(), again)
    out.line(f"{u.name}: {plan_summary(u.plan)}")


# -- down / narrowing -------------------------------------------------------------------------------------


def check_deployment(facts: dict[str, NodeFacts | Exception], deployment: str | None) -> None:
    """--deployment NAME (down, status, logs): a deployment of a stack that runs on the nodes."""
    names = deployments_on(facts)
    if deployment is not None and deployment not in names:
        raise ConfigError(
            Problem(
                "--deployment",
                deployment,
                "no deployment of that name runs on the nodes",
                f"running: {', '.join(sorted(names)) or 'none (a single deployment has no name)'}",
            )
        )


def down_plans(
    session: Session, inv: Inventory, good: dict[str, NodeFacts], deployment: str | None, keys: bool = False
) -> list[tuple[str, Plan]]:
    """`down`'s removal plans for the stack deployments on the reachable nodes (or only `deployment`), in order:
    the gateway first (nothing is routed to an engine that stops; with `keys`, its keys and spend go too), then
    each deployment (its own containers and its state dir's files), the guards of nodes left without an engine.
    `good`: the nodes' facts read with the "down" set (their folders: a stack's whose containers are gone)."""
    check_deployment(cast("dict[str, NodeFacts | Exception]", good), deployment)
    nodes = [n for n in inv.nodes if n.name in good]
    names = {deployment} if deployment else deployments_on(cast("dict[str, NodeFacts | Exception]", good))
    if deployment is None:  # also state dirs whose containers are gone (a single `up` replaced the stack)
        names |= _state_dirs_on(inv, good, keys)
    ordered = ([GATEWAY] if GATEWAY in names else []) + sorted(names - {GATEWAY})
    plans = []
    for name in ordered:
        sd = state_dir_of(inv, name)
        read = gather_facts(session, nodes, state_dir=sd)
        facts = {n: f for n, f in read.items() if isinstance(f, NodeFacts)}
        mine = {n: only(f, name) for n, f in facts.items()}
        plans.append(
            (
                name,
                Plan(
                    [
                        plan_removal(
                            node, mine[node.name], sd, f"not part of deployment {name}", _also(name, facts, node, keys)
                        )
                        for node in nodes
                        if node.name in mine
                        and (mine[node.name].containers or mine[node.name].state_dir_mode is not None)
                    ]
                ),
            )
        )
    if deployment is not None and deployment not in RESERVED:  # its nodes' guard goes where no engine is left
        left = {
            n
            for n, f in good.items()
            for c in f.containers
            if c.labels.get(DEPLOYMENT_LABEL) not in (None, deployment, *RESERVED)
            and c.labels.get(ROLE_LABEL) not in NOT_ENGINES
        }
        idle = [n for n in nodes if n.name not in left]
        read = gather_facts(session, idle, state_dir=state_dir_of(inv, GUARD)) if idle else {}
        facts = {n: f for n, f in read.items() if isinstance(f, NodeFacts)}
        if any(only(f, GUARD).containers for f in facts.values()):
            plans.append((GUARD, plan_unit(inv, GUARD, facts, [], {})))
    return plans


def _also(name: str, facts: dict[str, NodeFacts], node: Node, keys: bool) -> dict[str, str] | None:
    """What else of the gateway's state dir goes: its keys and spend with --keys; the spend counts when there is
    no keys.json (they count no key); nothing else."""
    if name != GATEWAY:
        return None
    if keys:
        return GATEWAY_KEPT
    if KEYS_FILE not in facts[node.name].files:
        return {SPEND_FOLDER: "the spend counts of no key (there is no keys.json)"}
    return None


def routes_before_down(
    session: Session, inv: Inventory, good: dict[str, NodeFacts], deployment: str | None
) -> tuple[Gateway, Routes, Plan] | None:
    """`down --deployment NAME` of a deployment the running gateway routes: the routes.json write that takes it
    out first (the gateway forgets it before its engines stop). None when there is nothing to forget (`down` of
    everything removes the gateway first)."""
    if deployment is None or deployment in RESERVED or inv.head.name not in good:
        return None
    if not any(c.labels.get(DEPLOYMENT_LABEL) == GATEWAY for c in good[inv.head.name].containers):
        return None
    gw = gateway_routes.read_gateway(session, inv)
    routes = gw.routes
    if routes is None or deployment not in routes.groups:
        return None
    new = routes.without([deployment])
    return gw, new, gateway_routes.plan_write(gw, new, f"stop routing {deployment} before its engines stop")


def _state_dirs_on(inv: Inventory, good: dict[str, NodeFacts], keys: bool) -> set[str]:
    """The stack units whose state dirs are on the nodes (`<state_dir>-NAME` holding a manifest of ours; the
    gateway's too when only its spend counts are left, or with `keys` its keys), from the `state_dirs` fact."""
    prefix = inv.cluster.state_dir + "-"
    out: set[str] = set()
    for f in good.values():
        for d in f.state_dirs.values():
            name = d.name.removeprefix(prefix)
            if not d.name.startswith(prefix) or not (NAME.fullmatch(name) or name in RESERVED):
                continue
            if d.has_manifest or (name == GATEWAY and (keys or KEYS_FILE not in d.entries) and d.entries):
                out.add(name)
    return out


def health_ports(
    session: Session, inv: Inventory, facts: dict[str, NodeFacts | Exception]
) -> dict[str, dict[str, tuple[Any, Any]]]:
    """node -> container -> (health port, role) from the manifests of the stack deployments that run there
    (status probes them as it probes the single deployment's)."""
    out: dict[str, dict[str, tuple[Any, Any]]] = {}
    nodes = [n for n in inv.nodes if isinstance(facts.get(n.name), NodeFacts)]
    for name in sorted(deployments_on(facts)):
        for node, f in gather_facts(session, nodes, state_dir=state_dir_of(inv, name)).items():
            listed = (f.manifest or {}).get("containers") or [] if isinstance(f, NodeFacts) else []
            for c in listed:
                if isinstance(c, dict):
                    out.setdefault(node, {})[str(c.get("name"))] = (c.get("health_port"), c.get("role"))
    return out


def unlabelled(good: dict[str, NodeFacts]) -> dict[str, NodeFacts]:
    """The facts as the single deployment sees them: containers of no stack deployment."""
    return {
        n: f.with_containers([c for c in f.containers if not c.labels.get(DEPLOYMENT_LABEL)]) for n, f in good.items()
    }


__all__ = ["GATEWAY", "SparkdeployError", "Stack", "budget", "fits", "load_stack", "plan_stack", "up"]
