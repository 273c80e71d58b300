"""`up` as a library, one linear pass: the recipe and the deployment resolved once -> facts (read-only, every node
in parallel, one round trip each) -> the one plan made from them (files by sha256, containers by config-hash label,
image by ID) -> preflight over those facts and that plan (any failure: nothing changes) -> the image step (a missing
image pushed, from a node that has it when one does, then only the nodes that got it read again) -> the fabric
gate -> apply -> health gate (a real one-token completion).

After a Ctrl-C or a failure every node gets one line saying what happened there; the next `up` converges."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import cast

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.config.secrets import refuse_missing
from sparkdeploy.deploy import DEFAULT_TIMEOUT_S, fabric_gate, health, history, preflight, registry_image
from sparkdeploy.deploy.apply import apply_plan, clean_temp_files
from sparkdeploy.deploy.plan import CHANGED, FAILED, SKIPPED, Plan, StepKind, plan_deployment
from sparkdeploy.deploy.progress import Reporter, plan_summary
from sparkdeploy.deploy.up_result import Deployed, JsonDict, Phase, Progress, UpResult
from sparkdeploy.errors import ConfigError, StepFailed
from sparkdeploy.facts import NodeFacts, add_resources, gather_facts
from sparkdeploy.guard.lines import check_lines as check_guard_lines
from sparkdeploy.images import push, push_from
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.images.image_ref import RegistryImage
from sparkdeploy.models import up_check
from sparkdeploy.runtime.holds import hold_point
from sparkdeploy.runtime.interrupts import Interrupt
from sparkdeploy.runtime.locks import NodeLockHeld, inventory_lock, node_locks
from sparkdeploy.runtime.session import Session
from sparkdeploy.topologies.context import DeploymentSource, load_source
from sparkdeploy.topologies.deployment import Deployment


def simulated(dep: Deployment) -> bool:
    # its io.sparkdeploy.simulated label, read when it was pulled; unless a definition stands in for it (the lab's
    # vllm-sim for SGLang's registry image)
    if isinstance(dep.image, RegistryImage) and dep.image_tag == dep.image.tag:
        return dep.image.simulated
    try:
        return load_definition(preflight.image_definition_name(dep.image_tag)).simulated
    # An unknown or unreadable definition is reported elsewhere; assume real hardware (stricter checks).
    except (ConfigError, OSError, ValueError):
        return False


def push_missing(
    dep: Deployment, checks: list[preflight.Result], out: Reporter, pushed: list[JsonDict] | None = None
) -> bool:
    """Push each missing image to the nodes lacking it (only the layers each lacks travel); True when tried.
    When a node of the deployment has it (an image built there), it goes from that node over the fabric.
    `pushed` gets one entry per image: where from, what each node got (`up --json` reports it)."""
    missing: dict[str, set[str]] = {}
    for c in checks:
        if c.missing_image:
            missing.setdefault(c.missing_image, set()).add(c.node or "")
    for ref, node_names in sorted(missing.items()):
        name = preflight.image_definition_name(ref)
        targets = [dep.inventory.node(n) for n in sorted(node_names)]
        holders = [
            nd.node for nd in dep.nodes if nd.node.name not in node_names and ref in {c.image for c in nd.containers}
        ]  # its image check passed: it has the image
        received = None
        if holders:
            out.progress(
                f"pushing image {ref} from {holders[0].name} to {', '.join(sorted(node_names))} over the fabric"
            )
            _plan, outcomes, received = push_from.push_from_node(ref, dep.inventory, holders[0], targets)
        else:
            out.progress(f"pushing image {name} to {', '.join(sorted(node_names))}")
            outcomes = push.push_image(name, dep.inventory, targets)
        for o in outcomes:
            if not o.ok:
                out.warn(f"push of {name} to {o.node.name} failed: {o.error}")
        if pushed is not None:
            # bytes_through_this_machine: from a node, the progress and result lines only (None: sent from here)
            pushed.append(
                {
                    "image": ref,
                    "from": holders[0].name if holders else None,
                    "bytes_through_this_machine": received,
                    "nodes": [
                        dict(cast(push.PushResult, o.value).as_dict(), ok=True)
                        if o.ok
                        else {"node": o.node.name, "ok": False, "error": str(o.error)}
                        for o in outcomes
                    ],
                }
            )
    return bool(missing)


Facts = dict[str, NodeFacts | Exception]


def make_plan(dep: Deployment, facts: Facts) -> Plan | None:
    """The plan from the facts; None while a node could not be read (preflight's ssh row says why)."""
    if all(isinstance(f, NodeFacts) for f in facts.values()):
        return plan_deployment(dep, cast("dict[str, NodeFacts]", facts))  # all NodeFacts: checked above
    return None


def _starting(dep: Deployment, plan: Plan | None) -> set[str]:
    """Nodes where the plan starts a container: only there memory, disk and the model cache matter."""
    if plan is not None:
        return {s.node for s in plan.steps if s.kind == StepKind.START_CONTAINER and s.change}
    return {nd.node.name for nd in dep.nodes}


def read_and_plan(dep: Deployment, session: Session, nodes: list[Node], facts: Facts) -> Plan | None:
    """Read the facts of `nodes` (one round trip each, into `facts`), make the plan over every node's facts, then
    read memory, disk and the model cache where that plan starts something; return the plan."""
    read = gather_facts(session, nodes, _images_for(dep))
    facts.update(read)
    plan = make_plan(dep, facts)
    add_resources(session, read, _starting(dep, plan), dep.inventory.cluster.hf_cache, dep.recipe.recipe.model)
    facts.update(read)  # a node whose resources could not be read: its error
    return plan


def image_step(
    dep: Deployment, session: Session, facts: Facts, failed: list[preflight.Result], out: Reporter, result: UpResult
) -> Plan | None:
    """A missing image: pushed to the nodes lacking it (push_missing), then those nodes' facts read again (only
    theirs: the push changed nothing else) and the plan made over them (the image's ID is in it)."""
    result.pushed = result.pushed if result.pushed is not None else []
    push_missing(dep, failed, out, result.pushed)
    got = sorted({c.node for c in failed if c.missing_image and c.node})
    return read_and_plan(dep, session, [dep.inventory.node(n) for n in got], facts)


def _images_for(dep: Deployment) -> Callable[[Node], list[str]]:
    wanted = {nd.node.name: sorted({c.image for c in nd.containers}) for nd in dep.nodes}
    return lambda node: wanted.get(node.name, [])


def deploy(
    recipe: str | None = None,
    topology: str | None = None,
    backend: str | None = None,
    inventory: str | None = None,
    sets: Sequence[str] = (),
    recipes_dir: str | None = None,
    node: str | None = None,
    dry_run: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    metrics: bool | None = None,
    pull_model: bool = False,
    reporter: Reporter | None = None,
    result: UpResult | None = None,
    fabric_gate_on: bool = True,
    source: DeploymentSource | None = None,
) -> UpResult:
    """Plan and apply a deployment, then wait for the health gate; return the result (the `up --json` contract:
    `UpResult.as_dict()`, masked). Raises StepFailed (exit 1) on failure; `result`, when given, holds what was done
    so far.
    metrics: also run Prometheus on the head node (None: the inventory's cluster.metrics).
    fabric_gate_on: False is `--no-fabric-gate` (deploy/fabric_gate.py).
    source: the inventory, recipe and secrets already read (`run-recipe`): recipe .. metrics are then not read."""
    out = reporter if reporter is not None else Reporter()
    result = result if result is not None else UpResult()
    if source is None:
        source = load_source(inventory, recipe, topology, backend, tuple(sets), recipes_dir, node, metrics)
    dep = source.render()
    if not dry_run:
        refuse_missing(dep.secrets)
    if dep.proxied:
        dep.secrets.require("LITELLM_MASTER_KEY", f"the {dep.topology} proxy's master key")
    out.use_mask(dep.secrets.mask)
    result.mask = dep.secrets.mask
    result.deployed = Deployed(
        dep.recipe.name, dep.topology, dep.backend or None, dep.image_tag, dep.endpoint, dep.backends, dep.metrics_url
    )
    result.dry_run, result.ok = dry_run, False
    for w in dep.warnings:
        out.warn(w)
    is_simulated = simulated(dep)
    inv = dep.inventory
    try:
        with (
            inventory_lock(inv),
            Interrupt(out.progress) as interrupt,
            Session.open(inv, mask=dep.secrets.mask) as session,
            node_locks(session, dry_run, out.warn),
        ):
            if isinstance(dep.image, RegistryImage):  # pulled once, digest checked, sent over the fabric
                dep = registry_image.for_deployment(dep, out, result, dry_run, source.render)  # flags from the image
                is_simulated = simulated(dep)
            _deploy(dep, session, interrupt, out, result, dry_run, timeout, is_simulated, pull_model, fabric_gate_on)
            if result.ok and not dry_run:  # what ran, for `sparkdeploy history` and `rollback`
                result.history_id = history.record_deployment(dep, session.conns, sets, inventory, is_simulated)["id"]
    except NodeLockHeld as exc:
        for line in exc.lines:
            out.line(line, "red")
        raise
    finally:
        result.mask = dep.secrets.mask  # a registry image re-rendered the deployment: its mask
    return result


def replaces(dep: Deployment, facts: dict[str, NodeFacts | Exception]) -> str | None:
    """The deployment the nodes run now when it is not this one ("recipe / topology[ / backend] on nodes"), from
    their manifests; None when nothing runs or the same recipe and topology do."""
    now: dict[tuple[object, ...], list[str]] = {}
    for node in dep.inventory.nodes:
        f = facts.get(node.name)
        m = f.manifest if isinstance(f, NodeFacts) else None
        if m and m.get("recipe"):
            now.setdefault((m["recipe"], m.get("topology"), m.get("backend")), []).append(node.name)
    mine = (dep.recipe.name, dep.topology, dep.backend or None)
    other = {k: v for k, v in now.items() if k != mine}
    if not other:
        return None
    return "; ".join(" / ".join(str(x) for x in key if x) + f" on {', '.join(nodes)}" for key, nodes in other.items())


def say_replaced(dep: Deployment, facts: Facts, out: Reporter, result: UpResult, dry_run: bool) -> None:
    """Said before anything changes (and by --dry-run): `up` converges to ONE deployment."""
    replaced = replaces(dep, facts)
    if replaced:
        result.replaces = replaced
        out.warn(
            f"{'would replace' if dry_run else 'replacing'} {replaced} with {dep.recipe.name} / "
            f"{dep.topology}" + (f" / {dep.backend}" if dep.backend else "")
        )


def _node_lines(inv: Inventory, seen: Progress, why: str) -> list[str]:
    """After a Ctrl-C or a failure: one line per node saying what happened there (the table has the steps)."""
    facts, plan, gate = seen.facts, seen.plan, seen.gate
    lines = []
    for node in inv.nodes:
        name = f"{node.name} ({node.mgmt_ip})"
        f = (facts or {}).get(node.name)
        if isinstance(f, Exception):
            lines.append(f"{name}: UNREACHABLE, nothing changed here: {f}")
            continue
        np = next((n for n in plan.nodes if n.node.name == node.name), None) if plan else None
        if np is None:
            lines.append(f"{name}: {why}; nothing changed here")
            continue
        done = [s for s in np.steps if s.status == CHANGED]
        failed = [s for s in np.steps if s.status == FAILED]
        skipped = [s for s in np.steps if s.status == SKIPPED]
        if failed:
            lines.append(
                f"{name}: FAILED at {failed[0].label}: {failed[0].detail}; {len(done)} change(s) made "
                f"before it, {len(skipped)} not done"
            )
        elif skipped:
            lines.append(
                f"{name}: {why}: {len(done)} change(s) made, {len(skipped)} not done (next: {skipped[0].label})"
            )
        else:
            dead = [d for d in (gate.dead if gate is not None else []) if d.startswith(f"{node.name} ")]
            lines.append(
                f"{name}: every step applied ({len(done)} changed)"
                + (f"; then {', '.join(dead)}" if dead else f"; {why}" if gate is not None else "")
            )
    return lines


def _deploy(
    dep: Deployment,
    session: Session,
    interrupt: Interrupt,
    out: Reporter,
    result: UpResult,
    dry_run: bool,
    timeout: float,
    simulated: bool,
    pull_model: bool = False,
    fabric_gate_on: bool = True,
) -> None:
    seen = Progress()
    try:
        _deploy_steps(
            dep, session, interrupt, out, result, dry_run, timeout, simulated, seen, pull_model, fabric_gate_on
        )
    except (KeyboardInterrupt, StepFailed) as exc:
        if not dry_run:
            failure_lines(dep.inventory, seen, exc, out)
        raise


def failure_lines(inv: Inventory, seen: Progress, exc: BaseException, out: Reporter, who: str = "") -> None:
    """After a Ctrl-C or a failure (`up`, each deployment of `up --stack`): one red line per node of `inv`.
    seen: how far the run got (its phase, the facts, plan and gate); who: the stack deployment's name."""
    why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else "the run failed"
    if seen.phase == Phase.HEALTH:
        why = "interrupted during the health gate" if isinstance(exc, KeyboardInterrupt) else "health gate failed"
    elif seen.phase == Phase.FABRIC_GATE and isinstance(exc, StepFailed):
        why = "the fabric gate refused"
    elif seen.phase == Phase.PREFLIGHT and isinstance(exc, StepFailed):
        why = "preflight failed"
    for line in _node_lines(inv, seen, why):
        out.line(f"{who}: {line}" if who else line, "red")


def _deploy_steps(
    dep: Deployment,
    session: Session,
    interrupt: Interrupt,
    out: Reporter,
    result: UpResult,
    dry_run: bool,
    timeout: float,
    simulated: bool,
    seen: Progress,
    pull_model: bool = False,
    fabric_gate_on: bool = True,
) -> None:
    inv = dep.inventory
    hold_point("connect", interrupt)  # connected and locked on every node; nothing read yet
    if interrupt.set:
        raise KeyboardInterrupt
    out.progress(f"reading facts on {', '.join(n.name for n in inv.nodes)}")
    facts: Facts = {}
    plan = read_and_plan(dep, session, list(inv.nodes), facts)  # the facts, read once; the one plan over them
    seen.facts = facts
    seen.reach(Phase.PREFLIGHT)
    check_guard_lines(dep, facts)  # a guard line above a node's memory: refused, nothing changed (#29)
    say_replaced(dep, facts, out, result, dry_run)
    hold_point("preflight", interrupt)
    checks = preflight.run(dep, facts, simulated, plan)
    failed = preflight.failures(checks)
    if failed and not dry_run and all(c.missing_image for c in failed):
        plan = image_step(dep, session, facts, failed, out, result)  # its own fact refresh, on its nodes only
        checks = preflight.run(dep, facts, simulated, plan)
        failed = preflight.failures(checks)
    if not failed:
        checks += model_checks(dep, session, simulated, dry_run, pull_model, out)
        failed = preflight.failures(checks)
    result.preflight = [c.as_row() for c in checks]
    if interrupt.set:
        raise KeyboardInterrupt
    if failed:
        out.preflight(checks)
        if dry_run and plan is not None and all(isinstance(f, NodeFacts) for f in facts.values()):
            result.steps = [s.as_dict() for s in plan.steps]
            out.dry_run(plan)
        raise refusal(failed)
    assert plan is not None  # preflight passed: every node was read
    out.progress(f"preflight: {len(checks)} checks passed")

    seen.reach(Phase.FABRIC_GATE)  # before any engine starts (a refusal changes nothing)
    fabric_gate.gate(dep, session, facts, plan, out, result, dry_run, fabric_gate_on, simulated)
    if dry_run:
        out.preflight(checks)
        out.dry_run(plan)
        result.steps = [s.as_dict() for s in plan.steps]
        result.changes = plan.changes
        result.ok = True
        return

    seen.plan = plan
    seen.reach(Phase.APPLY)
    title = f"{dep.recipe.name} / {dep.topology}" + (f" / {dep.backend}" if dep.backend else "")
    apply_phase(session, plan, interrupt, dep.secrets.mask, out, title, result)
    gate = health_phase(dep, session, plan, interrupt, timeout, out, result, seen)
    result.ok = True
    out.line(plan_summary(plan))
    out.line(f"healthy in {gate.seconds:.1f} s; endpoint {dep.endpoint} (model {dep.model_name})", "green")
    if dep.backends:
        out.line(f"backends: {', '.join(dep.backends)}")
    if dep.metrics_url:
        scraped = "every engine and the proxy" if dep.backends else "every engine"
        out.line(f"metrics: Prometheus at {dep.metrics_url} (scraping {scraped})")


# -- the phases, shared by `up` and `up --stack` (deploy/stack/converge.py runs them per deployment) -----------------


def run_preflight(
    dep: Deployment,
    session: Session,
    facts: dict[str, NodeFacts | Exception],
    read: Callable[[], dict[str, NodeFacts | Exception]],
    out: Reporter,
    simulated: bool,
    dry_run: bool,
    pull_model: bool,
    result: UpResult,
) -> tuple[list[preflight.Result], dict[str, NodeFacts | Exception]]:
    """A stack deployment's preflight (deploy/stack/converge.py; `up` runs the same steps in line): a missing image
    is pushed first, then the nodes are read again with `read`; then the recipe's model (model_checks).
    Returns every row and the facts they judged; result.pushed gets what was pushed."""
    checks = preflight.run(dep, facts, simulated)
    failed = preflight.failures(checks)
    if failed and not dry_run and all(c.missing_image for c in failed):
        result.pushed = result.pushed if result.pushed is not None else []
        if push_missing(dep, failed, out, result.pushed):
            facts = read()
            checks = preflight.run(dep, facts, simulated)
            failed = preflight.failures(checks)
    if not failed:
        checks += model_checks(dep, session, simulated, dry_run, pull_model, out)
    return checks, facts


def model_checks(
    dep: Deployment, session: Session, simulated: bool, dry_run: bool, pull_model: bool, out: Reporter
) -> list[preflight.Result]:
    """The recipe's model, complete and verified on every engine node (models/up_check.py; pulled first with
    --pull-model)."""
    checks = up_check.checks(dep, session.conns, simulated)
    if preflight.failures(checks) and pull_model and not dry_run:
        up_check.pull(dep, session.conns, out.progress)
        checks = up_check.checks(dep, session.conns, simulated)
    return checks


def refusal(failed: Sequence[preflight.Result]) -> StepFailed:
    """The one error of a failed preflight (nothing changed yet)."""
    first = failed[0]
    nodes = sorted({c.node or "" for c in failed})
    return StepFailed(
        f"preflight failed on {', '.join(nodes)} ({len(failed)} check(s); first: {first.node} "
        f"{first.check}: {first.measured}"
        + (f"; fix: {first.fix}" if first.fix else "")
        + "). Nothing was changed on any node."
    )


def apply_phase(
    session: Session,
    plan: Plan,
    interrupt: Interrupt | None,
    mask: Callable[[str], str],
    out: Reporter,
    title: str,
    result: UpResult,
    again: str = "sparkdeploy up",
) -> None:
    """Apply the plan's steps (every node in parallel), print its table; result gets steps, changed, counts.
    A failed step: StepFailed saying what the other nodes did; Ctrl-C: temp files cleaned, KeyboardInterrupt."""
    apply_plan(session, plan, interrupt, mask, out.progress if plan.changes else None)
    counts = plan.counts()
    result.steps = [s.as_dict() for s in plan.steps]
    result.changed = counts[CHANGED]
    result.counts = counts
    out.steps(plan, title)
    if interrupt is not None and interrupt.set:
        clean_temp_files(session, [n.node for n in plan.nodes])
        raise KeyboardInterrupt
    if plan.failed():
        s = plan.failed()[0]
        where = (
            "no container was started on any node. "
            if s.phase == 1
            else "the other nodes finished their steps (see the table). "
        )
        raise StepFailed(
            f"{s.node}: step {s.kind} {s.target} failed: {s.detail}; {where}"
            f"Run `{again}` again to converge, or `sparkdeploy down` to remove everything."
        )


def health_phase(
    dep: Deployment,
    session: Session,
    plan: Plan,
    interrupt: Interrupt,
    timeout: float,
    out: Reporter,
    result: UpResult,
    seen: Progress,
    who: str = "",
) -> health.GateResult:
    """The health gate: a real one-token completion from every engine (and proxy). result.health and
    seen.gate get its outcome; on failure each container's last log lines are printed and StepFailed raised."""
    started = any(s.kind == StepKind.START_CONTAINER and s.status == CHANGED for s in plan.steps)
    prefix = f"{who}: " if who else ""
    out.progress(f"{prefix}health gate (timeout {timeout:g} s)")
    t0 = time.monotonic()
    stopped = False
    try:
        with interrupt.immediate():  # nothing under way to finish: a stop ends the wait at once, even mid-read
            hold_point("health", interrupt)
            gate = health.wait_healthy(
                dep,
                session.conns,
                timeout,
                stop=lambda: interrupt.set,
                say=out.progress,
                states_known_running=not started,
            )
    except KeyboardInterrupt:
        stopped = True
        gate = health.GateResult(False, time.monotonic() - t0, health.probes_for(dep), "interrupted")
    seen.gate = gate
    seen.reach(Phase.HEALTH)
    result.health = gate.as_dict()
    if stopped or interrupt.set:
        again = "sparkdeploy up --stack" if who else "sparkdeploy up"
        out.warn(
            f"{prefix}interrupted during the health gate: every step was applied; run `{again}` again to "
            "wait for health (it changes nothing), or `sparkdeploy down`"
        )
        raise KeyboardInterrupt
    if not gate.ok:
        gate.logs = health.collect_logs(dep, session.conns)
        result.health = gate.as_dict()
        for node_name, per in gate.logs.items():
            for cname, text in per.items():
                out.line(f"--- {node_name} {cname}: last {health.LOG_TAIL} log lines ---", "bold")
                out.line(text)
        raise StepFailed(f"{prefix}health gate failed: {gate.reason}")
    return gate
