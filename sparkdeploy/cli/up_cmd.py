"""`sparkdeploy up | down | status`: deploy over SSH, plan then apply, with a health gate.

    up:     render -> facts (read-only, every node in parallel) -> preflight (any failure: nothing changes)
            -> plan (files by sha256, containers by config-hash label, image by ID) -> apply -> health gate
    down:   remove our containers (by label) and our files (the manifest's list) on every node reachable
    status: per node our containers, image, uptime, health, and the endpoint

`run-recipe NAME` calls `deploy(recipe=NAME, ...)`: the same as `sparkdeploy up --recipe NAME`.
Everything printed passes through the secrets mask.
"""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sparkdeploy import health, preflight
from sparkdeploy.apply import (Interrupt, Session, add_resources, apply_plan, clean_temp_files, gather_facts,
                               NodeLockHeld, hold_point, inventory_lock, node_locks)
from sparkdeploy.cli.common import (DEFAULT_TIMEOUT_S, deployment_options, emit_json, inventory_option, json_option,
                                    timeout_option)
from sparkdeploy.context import load_deployment
from sparkdeploy.deployment import Deployment
from sparkdeploy.errors import ConfigError, StepFailed
from sparkdeploy.facts import NodeFacts
from sparkdeploy.inventory import load_inventory
from sparkdeploy.models import up_check
from sparkdeploy.secrets import refuse_missing
from sparkdeploy.plan import CHANGED, FAILED, OK, SKIPPED, Plan, StepKind, plan_deployment, plan_down

STATUS_COLORS = {OK: "green", CHANGED: "yellow", FAILED: "red", SKIPPED: "bright_black", "pending": "bright_black"}


# -- output ---------------------------------------------------------------------------------------------

class Out:
    """Tables and lines for people (stdout), progress (stderr), all masked; quiet on stdout with --json."""

    def __init__(self, as_json: bool, mask=lambda s: s):
        self.as_json = as_json
        self.mask = mask
        self.console = Console(highlight=False, soft_wrap=False, width=max(120, Console().width))
        self.err = Console(stderr=True, highlight=False)
        self._t0 = time.monotonic()

    def progress(self, message: str) -> None:
        self.err.print(Text(f"[{time.monotonic() - self._t0:5.1f}s] {self.mask(message)}", style="dim"))

    def line(self, message: str, style: str | None = None) -> None:
        if not self.as_json:
            self.console.print(Text(self.mask(message), style=style or ""), soft_wrap=True)

    def warn(self, message: str) -> None:
        self.err.print(Text(f"warning: {self.mask(message)}", style="yellow"))

    def table(self, table: Table) -> None:
        if not self.as_json:
            for col in table.columns:  # never cut a fingerprint, a path or an error message
                col.overflow = "fold"
            self.console.print(table)

    def cell(self, value: Any, style: str = "") -> Text:
        return Text(self.mask("" if value is None else str(value)), style=style)


def _mask_data(mask, data):
    if isinstance(data, str):
        return mask(data)
    if isinstance(data, list):
        return [_mask_data(mask, x) for x in data]
    if isinstance(data, dict):
        return {k: _mask_data(mask, v) for k, v in data.items()}
    return data


def _preflight_table(out: Out, checks: list[preflight.Check], only_failures: bool = False) -> None:
    table = Table(title="preflight", title_justify="left")
    for col in ("node", "check", "result", "detail", "fix"):
        table.add_column(col)
    for c in checks:
        if only_failures and c.ok:
            continue
        table.add_row(out.cell(c.node), out.cell(c.name), out.cell("ok" if c.ok else "FAILED", "green" if c.ok else "red"),
                      out.cell(c.detail), out.cell(c.fix))
    out.table(table)
    for c in checks:  # in full, one line each (a table folds long fingerprints and paths)
        if not c.ok:
            out.line(f"FAILED {c.node} {c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else ""), "red")


def _steps_table(out: Out, plan: Plan, title: str) -> None:
    table = Table(title=title, title_justify="left")
    for col in ("node", "step", "target", "result", "detail"):
        table.add_column(col)
    for s in plan.steps:
        status = s.status if s.status != "pending" else ("change" if s.change else "ok")
        detail = s.detail or s.reason
        if s.status == CHANGED and s.reason and s.detail:
            detail = f"{s.reason}: {s.detail}"
        table.add_row(out.cell(s.node), out.cell(s.kind), out.cell(s.target),
                      out.cell(status, STATUS_COLORS.get(s.status, "yellow" if s.change else "green")),
                      out.cell(detail))
    out.table(table)


def _summary(plan: Plan) -> str:
    parts = []
    for n in plan.nodes:
        c = {OK: 0, CHANGED: 0, FAILED: 0, SKIPPED: 0}
        for s in n.steps:
            c[s.status] = c.get(s.status, 0) + 1
        parts.append(f"{n.node.name}: {c[OK]} ok, {c[CHANGED]} changed, {c[FAILED]} failed"
                     + (f", {c[SKIPPED]} skipped" if c[SKIPPED] else ""))
    return "; ".join(parts)


def _dry_run_plan(out: Out, plan: Plan) -> None:
    out.line("DRY RUN: facts were read; nothing is changed on any node.", "bold")
    for n in plan.nodes:
        out.line("")
        out.line(f"== {n.node.name} {n.node.mgmt_ip} ({n.node.role}): {len(n.changes)} change(s) ==", "bold")
        for i, s in enumerate(n.steps, 1):
            mark = "change" if s.change else "ok    "
            out.line(f"{i:>2}. {mark} {s.kind} {s.target}  ({s.reason})")
            if s.change and s.file is not None and s.kind == StepKind.WRITE:
                shown = s.file.shown()
                for content_line in shown.rstrip("\n").split("\n"):
                    out.line(f"      | {content_line}")


def _simulated(dep: Deployment) -> bool:
    from sparkdeploy.images.definitions import load_definition

    try:
        return load_definition(preflight.image_definition_name(dep.image_tag)).simulated
    # An unknown or unreadable definition is reported elsewhere; assume real hardware (stricter checks).
    except (ConfigError, OSError, ValueError):
        return False


def _push_missing(dep: Deployment, checks: list[preflight.Check], out: Out, pushed: list | None = None) -> bool:
    """Push each missing image to the nodes lacking it (only the layers each lacks travel); True when tried.
    When a node of the deployment has it (an image built there), it goes from that node over the fabric.
    `pushed` gets one entry per image: where from, what each node got (`up --json` reports it)."""
    from sparkdeploy.images.push import push_image
    from sparkdeploy.images.push_from import push_from_node

    missing: dict[str, set[str]] = {}
    for c in checks:
        if c.missing_image:
            missing.setdefault(c.missing_image, set()).add(c.node)
    for ref, node_names in sorted(missing.items()):
        name = preflight.image_definition_name(ref)
        targets = [dep.inventory.node(n) for n in sorted(node_names)]
        holders = [nd.node for nd in dep.nodes if nd.node.name not in node_names
                   and ref in {c.image for c in nd.containers}]  # its image check passed: it has the image
        received = None
        if holders:
            out.progress(f"pushing image {ref} from {holders[0].name} to {', '.join(sorted(node_names))} "
                         f"over the fabric")
            _plan, outcomes, received = push_from_node(ref, dep.inventory, holders[0], targets)
        else:
            out.progress(f"pushing image {name} to {', '.join(sorted(node_names))}")
            outcomes = push_image(name, dep.inventory, targets)
        for o in outcomes:
            if not o.ok:
                out.warn(f"push of {name} to {o.node.name} failed: {o.error}")
        if pushed is not None:
            # bytes_through_this_machine: from a node, the progress and result lines only (None: sent from here)
            pushed.append({"image": ref, "from": holders[0].name if holders else None,
                           "bytes_through_this_machine": received,
                           "nodes": [dict(o.value.as_dict(), ok=True) if o.ok else
                                     {"node": o.node.name, "ok": False, "error": str(o.error)} for o in outcomes]})
    return bool(missing)


def _starting(dep: Deployment, facts: dict) -> set[str]:
    """Nodes where the plan starts a container: only there memory, disk and the model cache matter."""
    if all(isinstance(f, NodeFacts) for f in facts.values()):
        plan = plan_deployment(dep, facts)
        return {s.node for s in plan.steps if s.kind == StepKind.START_CONTAINER and s.change}
    return {nd.node.name for nd in dep.nodes}


def _images_for(dep: Deployment):
    wanted = {nd.node.name: sorted({c.image for c in nd.containers}) for nd in dep.nodes}
    return lambda node: wanted.get(node.name, [])


# -- up -------------------------------------------------------------------------------------------------

def deploy(recipe: str | None = None, topology: str | None = None, backend: str | None = None,
           inventory: str | None = None, sets=(), recipes_dir: str | None = None, node: str | None = None,
           as_json: bool = False, dry_run: bool = False, timeout: float = DEFAULT_TIMEOUT_S,
           metrics: bool | None = None, pull_model: bool = False, **_ignored) -> None:
    """Plan and apply a deployment, then wait for the health gate. Raises StepFailed (exit 1) on failure.
    metrics: also run Prometheus on the head node (None: the inventory's cluster.metrics)."""
    dep = load_deployment(inventory, recipe, topology, backend, sets, recipes_dir, node, metrics)
    if not dry_run:
        refuse_missing(dep.secrets)
    if dep.proxied:
        dep.secrets.require("LITELLM_MASTER_KEY", f"the {dep.topology} proxy's master key")
    out = Out(as_json, dep.secrets.mask)
    result: dict[str, Any] = {"recipe": dep.recipe.name, "topology": dep.topology, "backend": dep.backend or None,
                              "image": dep.image_tag, "endpoint": dep.endpoint, "backends": dep.backends,
                              "metrics_url": dep.metrics_url,
                              "dry_run": dry_run, "ok": False}
    for w in dep.warnings:
        out.warn(w)
    simulated = _simulated(dep)
    inv = dep.inventory
    try:
        with inventory_lock(inv), Interrupt(out.progress) as interrupt, \
                Session.open(inv, mask=dep.secrets.mask) as session, node_locks(session, dry_run, out.warn):
            _deploy(dep, session, interrupt, out, result, dry_run, timeout, simulated, pull_model)
    except NodeLockHeld as exc:
        for line in exc.lines:
            out.line(line, "red")
        raise
    finally:
        if as_json:
            emit_json(_mask_data(dep.secrets.mask, result))


def _node_lines(inv, seen: dict, why: str) -> list[str]:
    """After a Ctrl-C or a failure: one line per node saying what happened there (the table has the steps)."""
    facts, plan, gate = seen.get("facts"), seen.get("plan"), seen.get("gate")
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
            lines.append(f"{name}: FAILED at {failed[0].label}: {failed[0].detail}; {len(done)} change(s) made "
                         f"before it, {len(skipped)} not done")
        elif skipped:
            lines.append(f"{name}: {why}: {len(done)} change(s) made, {len(skipped)} not done "
                         f"(next: {skipped[0].label})")
        else:
            dead = [d for d in (gate.dead if gate is not None else []) if d.startswith(f"{node.name} ")]
            lines.append(f"{name}: every step applied ({len(done)} changed)"
                         + (f"; then {', '.join(dead)}" if dead else f"; {why}" if gate is not None else ""))
    return lines


def _deploy(dep: Deployment, session: Session, interrupt: Interrupt, out: Out, result: dict, dry_run: bool,
            timeout: float, simulated: bool, pull_model: bool = False) -> None:
    seen: dict = {}
    try:
        _deploy_steps(dep, session, interrupt, out, result, dry_run, timeout, simulated, seen, pull_model)
    except (KeyboardInterrupt, StepFailed) as exc:
        if not dry_run:
            why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else "the run failed"
            if "gate" in seen:
                why = "interrupted during the health gate" if isinstance(exc, KeyboardInterrupt) else \
                    "health gate failed"
            elif "plan" not in seen and "facts" in seen and isinstance(exc, StepFailed):
                why = "preflight failed"
            for line in _node_lines(dep.inventory, seen, why):
                out.line(line, "red")
        raise


def _deploy_steps(dep: Deployment, session: Session, interrupt: Interrupt, out: Out, result: dict, dry_run: bool,
                  timeout: float, simulated: bool, seen: dict, pull_model: bool = False) -> None:
    inv = dep.inventory
    images_for = _images_for(dep)
    model_id = dep.recipe.recipe.model

    hold_point("connect", interrupt)  # connected and locked on every node; nothing read yet
    if interrupt.set:
        raise KeyboardInterrupt
    out.progress(f"reading facts on {', '.join(n.name for n in inv.nodes)}")

    def read() -> dict:
        facts = gather_facts(session, inv.nodes, images_for)
        add_resources(session, facts, _starting(dep, facts), inv.cluster.hf_cache, model_id)
        return facts

    facts = seen["facts"] = read()
    hold_point("preflight", interrupt)
    checks = preflight.run(dep, facts, simulated)
    failed = preflight.failures(checks)
    if failed and not dry_run and all(c.missing_image for c in failed) and \
            _push_missing(dep, failed, out, result.setdefault("pushed", [])):
        facts = seen["facts"] = read()
        checks = preflight.run(dep, facts, simulated)
        failed = preflight.failures(checks)
    if not failed:  # the recipe's model, complete and verified on every engine node (models/up_check.py)
        model_checks = up_check.checks(dep, session.conns, simulated)
        if preflight.failures(model_checks) and pull_model and not dry_run:
            up_check.pull(dep, session.conns, out.progress)
            model_checks = up_check.checks(dep, session.conns, simulated)
        checks += model_checks
        failed = preflight.failures(checks)
    result["preflight"] = [c.as_dict() for c in checks]
    if interrupt.set:
        raise KeyboardInterrupt
    if failed:
        _preflight_table(out, checks)
        first = failed[0]
        nodes = sorted({c.node for c in failed})
        plan = None
        if dry_run and all(isinstance(f, NodeFacts) for f in facts.values()):
            plan = plan_deployment(dep, facts)  # type: ignore[arg-type]
            result["steps"] = [s.as_dict() for s in plan.steps]
            _dry_run_plan(out, plan)
        raise StepFailed(f"preflight failed on {', '.join(nodes)} ({len(failed)} check(s); first: {first.node} "
                         f"{first.name}: {first.detail}" + (f"; fix: {first.fix}" if first.fix else "") +
                         "). Nothing was changed on any node.")
    out.progress(f"preflight: {len(checks)} checks passed")

    plan = plan_deployment(dep, facts)  # type: ignore[arg-type]
    if dry_run:
        _preflight_table(out, checks)
        _dry_run_plan(out, plan)
        result["steps"] = [s.as_dict() for s in plan.steps]
        result["changes"] = plan.changes
        result["ok"] = True
        return

    seen["plan"] = plan
    apply_plan(session, plan, interrupt, dep.secrets.mask, out.progress if plan.changes else None)
    counts = plan.counts()
    result["steps"] = [s.as_dict() for s in plan.steps]
    result["changed"] = counts[CHANGED]
    result["counts"] = counts
    _steps_table(out, plan, f"{dep.recipe.name} / {dep.topology}" + (f" / {dep.backend}" if dep.backend else ""))
    if interrupt.set:
        clean_temp_files(session, inv.nodes)
        raise KeyboardInterrupt
    if plan.failed():
        s = plan.failed()[0]
        where = ("no container was started on any node. " if s.phase == 1 else
                 "the other nodes finished their steps (see the table). ")
        raise StepFailed(f"{s.node}: step {s.kind} {s.target} failed: {s.detail}; {where}"
                         "Run `sparkdeploy up` again to converge, or `sparkdeploy down` to remove everything.")

    started = any(s.kind == StepKind.START_CONTAINER and s.status == CHANGED for s in plan.steps)
    out.progress(f"health gate (timeout {timeout:g} s)")
    hold_point("health", interrupt)
    gate = health.wait_healthy(dep, session.conns, timeout, stop=lambda: interrupt.set, say=out.progress,
                               states_known_running=not started)
    seen["gate"] = gate
    result["health"] = gate.as_dict()
    if interrupt.set:
        out.warn("interrupted during the health gate: every step was applied; run `sparkdeploy up` again to "
                 "wait for health (it changes nothing), or `sparkdeploy down`")
        raise KeyboardInterrupt
    if not gate.ok:
        gate.logs = health.collect_logs(dep, session.conns)
        result["health"] = gate.as_dict()
        for node_name, per in gate.logs.items():
            for cname, text in per.items():
                out.line(f"--- {node_name} {cname}: last {health.LOG_TAIL} log lines ---", "bold")
                out.line(text)
        raise StepFailed(f"health gate failed: {gate.reason}")
    result["ok"] = True
    out.line(_summary(plan))
    out.line(f"healthy in {gate.seconds:.1f} s; endpoint {dep.endpoint} (model {dep.model_name})", "green")
    if dep.backends:
        out.line(f"backends: {', '.join(dep.backends)}")
    if dep.metrics_url:
        scraped = "every engine and the proxy" if dep.backends else "every engine"
        out.line(f"metrics: Prometheus at {dep.metrics_url} (scraping {scraped})")


recipe_option = click.option("--recipe", "-r", metavar="NAME", help="Recipe (default: the inventory's default_recipe).")


@click.command("up")
@recipe_option
@deployment_options
@click.option("--node", metavar="NAME", help="solo only: the node to run on (default: the head).")
@click.option("--dry-run", is_flag=True, help="Read the nodes' state and print the plan; change nothing.")
@click.option("--metrics/--no-metrics", default=None,
              help="Also run Prometheus on the head node, scraping every engine and the proxy (default: the "
                   "inventory's cluster.metrics; set it there to keep Prometheus on later runs).")
@click.option("--pull-model", is_flag=True,
              help="When the recipe's model is missing or incomplete on an engine node, pull it (download once "
                   "on the head, copy over the fabric) instead of failing preflight.")
@timeout_option
@json_option
def up(recipe, topology, backend, inventory, sets, recipes_dir, node, dry_run, metrics, pull_model, timeout, as_json):
    """Deploy a recipe: only the differences are applied; returns once it serves.

    \b
    Examples:
      sparkdeploy up --inventory lab                         # the inventory's default recipe and its topology
      sparkdeploy up -r openai-gpt-oss-120b -t 2xsolo       # one engine per node behind LiteLLM
      sparkdeploy up -t cluster -b torchrun --dry-run        # the plan, nothing changed
    """
    deploy(recipe=recipe, topology=topology, backend=backend, inventory=inventory, sets=sets,
           recipes_dir=recipes_dir, node=node, as_json=as_json, dry_run=dry_run, timeout=timeout, metrics=metrics,
           pull_model=pull_model)


# -- down -----------------------------------------------------------------------------------------------

@click.command("down")
@inventory_option
@click.option("--dry-run", is_flag=True, help="Print what would be removed; change nothing.")
@json_option
def down(inventory, dry_run, as_json):
    """Remove what sparkdeploy created on every node: containers (by label) and files (the manifest's list).

    A node that cannot be reached is reported (exit 1); the others are cleaned."""
    inv = load_inventory(inventory)
    out = Out(as_json)
    result: dict[str, Any] = {"dry_run": dry_run, "ok": False, "unreachable": {}}
    try:
        with inventory_lock(inv), Interrupt(out.progress) as interrupt, Session.open(inv) as session, \
                node_locks(session, dry_run, out.warn):
            facts = gather_facts(session, inv.nodes)
            bad = {name: f for name, f in facts.items() if not isinstance(f, NodeFacts)}
            good = {name: f for name, f in facts.items() if isinstance(f, NodeFacts)}
            result["unreachable"] = {name: str(err) for name, err in bad.items()}
            no_docker = [name for name, f in good.items() if not f.docker_ok]
            plan = plan_down([n for n in inv.nodes if n.name in good], good, inv.cluster.state_dir)
            if dry_run:
                _dry_run_plan(out, plan)
            else:
                apply_plan(session, plan, interrupt, say=out.progress if plan.changes else None)
                if interrupt.set:
                    clean_temp_files(session, [n for n in inv.nodes if n.name in good])
            result["steps"] = [s.as_dict() for s in plan.steps]
            if not dry_run:
                _steps_table(out, plan, "down")
            for name, err in bad.items():
                out.line(f"{name}: UNREACHABLE, nothing removed there: {err}", "red")
            for name in no_docker:
                out.line(f"{name}: Docker does not answer: containers could not be listed ({good[name].docker_error})",
                         "red")
            if interrupt.set:
                raise KeyboardInterrupt
            problems = list(bad) + no_docker + sorted({s.node for s in plan.failed()})
            if problems:
                raise StepFailed(f"down incomplete on {', '.join(dict.fromkeys(problems))}; "
                                 f"{'the other nodes are clean' if len(problems) < len(inv.nodes) else 'nothing cleaned'}"
                                 "; run `sparkdeploy down` again once the node is back")
            result["ok"] = True
            if not dry_run:
                out.line(_summary(plan) + ". Nothing of sparkdeploy's is left on " + ", ".join(good) + ".")
    finally:
        if as_json:
            emit_json(result)


# -- status ---------------------------------------------------------------------------------------------

def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _probe(url: str) -> dict:
    try:
        code, _ = health.http_get(url, time.monotonic() + 3.0)
        return {"url": url, "ok": code == 200, "detail": f"HTTP {code}"}
    except health.HTTP_ERRORS as exc:  # unreachable endpoint: report it, never fail status on it
        reason = getattr(exc, "reason", exc)
        return {"url": url, "ok": False, "detail": f"{reason.__class__.__name__}: {reason}"}


def node_status(node, f: NodeFacts | Exception, history=None) -> dict:
    """history: the node's crashes.NodeHistory (restarts, last exit, health), when it could be read."""
    entry: dict[str, Any] = {"name": node.name, "mgmt_ip": node.mgmt_ip, "role": node.role}
    if not isinstance(f, NodeFacts):
        entry.update(reachable=False, error=str(f), containers=[], files=[])
        return entry
    manifest = f.manifest or {}
    health_ports = {c.get("name"): (c.get("health_port"), c.get("role")) for c in manifest.get("containers") or []
                    if isinstance(c, dict)}
    containers = []
    for c in f.containers:
        port, role = health_ports.get(c.name, (None, c.role))
        probe = None
        if port and c.running:
            path = "/health/liveliness" if (role or c.role) == "proxy" else "/health"
            probe = _probe(f"http://{node.url_host}:{port}{path}")
        containers.append({
            "name": c.name, "role": c.role, "recipe": c.recipe, "topology": c.topology,
            "backend": c.label("backend") or None, "state": c.status, "running": c.running,
            "started_at": c.started_at, "uptime_s": None if c.uptime_s() is None else round(c.uptime_s(), 1),
            "restarts": c.restarts, "image": c.image_ref, "image_id": c.image_id, "config_hash": c.config_hash,
            "health": probe,
            **_crash_fields(history, c.name),
        })
    entry.update(reachable=True, docker=f.docker_ok, error=f.docker_error or None, containers=containers,
                 files=list(f.manifest_files), deployment={k: manifest.get(k) for k in
                                                           ("recipe", "topology", "backend", "model", "endpoint")}
                 if manifest else None)
    return entry


def _crash_fields(history, name: str) -> dict:
    from sparkdeploy import crashes

    h = history.containers.get(name) if history is not None else None
    if h is None:
        return {"last_exit": None, "crashes": "-"}
    return {**h.as_dict(), "restarts": h.restarts, "crashes": crashes.summary(h, history.now)}


def _metrics_url(inv, facts: dict) -> str | None:
    """Prometheus' URL when its container (role metrics) runs: the head node's management IP and its port."""
    for node in inv.nodes:
        f = facts.get(node.name)
        if not isinstance(f, NodeFacts):
            continue
        listed = (f.manifest or {}).get("containers") or []
        ports = {c.get("name"): c.get("ports") for c in listed if isinstance(c, dict)}
        for c in f.containers:
            if c.role == "metrics" and c.running and ports.get(c.name):
                return f"http://{node.url_host}:{ports[c.name][0]}"
    return None


def _crash_style(c: dict) -> str:
    last = c.get("last_exit") or {}
    if last.get("oom_killed") or c.get("state") == "restarting" or c.get("docker_health") == "unhealthy":
        return "red"
    return "yellow" if c.get("restarts") or last else ""


def _histories(session: Session, inv, facts: dict) -> dict:
    """Each reachable node's container history (crashes.read); a node where it fails just shows none."""
    from sparkdeploy import crashes
    from sparkdeploy.remote import on_nodes

    nodes = [n for n in inv.nodes if isinstance(facts.get(n.name), NodeFacts) and facts[n.name].containers]
    return {o.node.name: o.value for o in on_nodes(nodes, lambda n: crashes.read(session.conn(n))) if o.ok}


@click.command("status")
@inventory_option
@json_option
def status(inventory, as_json):
    """Per node: our containers, image, uptime, health, and the endpoint URL. Exit 1 if a node is unreachable."""
    inv = load_inventory(inventory)
    out = Out(as_json)
    with Session.open(inv) as session:
        facts = gather_facts(session, inv.nodes)
        histories = _histories(session, inv, facts)
    nodes = [node_status(n, facts[n.name], histories.get(n.name)) for n in inv.nodes]
    deployments = [n["deployment"] for n in nodes if n.get("deployment")]
    head = next((n for n in nodes if n["role"] == "head" and n.get("deployment")), None)
    dep_info = (head or {}).get("deployment") or (deployments[0] if deployments else None)
    all_containers = [c for n in nodes for c in n["containers"]]
    data = {
        "inventory": inv.source,
        "deployed": bool(all_containers),
        "recipe": dep_info.get("recipe") if dep_info else None,
        "topology": dep_info.get("topology") if dep_info else None,
        "backend": dep_info.get("backend") if dep_info else None,
        "model": dep_info.get("model") if dep_info else None,
        "endpoint": dep_info.get("endpoint") if dep_info else None,
        "metrics_url": _metrics_url(inv, facts),
        "healthy": bool(all_containers) and all(c["running"] and (c["health"] is None or c["health"]["ok"])
                                                for c in all_containers),
        "nodes": nodes,
    }
    unreachable = [n["name"] for n in nodes if not n["reachable"]]
    if as_json:
        emit_json(data)
    else:
        table = Table(title=f"sparkdeploy status ({inv.source})", title_justify="left")
        for col in ("node", "container", "role", "recipe / topology", "state", "uptime", "image", "health",
                    "restarts"):
            table.add_column(col)
        for n in nodes:
            if not n["reachable"]:
                table.add_row(out.cell(n["name"]), out.cell("-"), out.cell("-"), out.cell("-"),
                              out.cell("UNREACHABLE", "red"), out.cell("-"), out.cell("-"), out.cell("see below"),
                              out.cell("-"))
                continue
            if not n["containers"]:
                table.add_row(out.cell(n["name"]), out.cell("(none)"), *[out.cell("-") for _ in range(7)])
            for c in n["containers"]:
                h = c["health"]
                table.add_row(out.cell(n["name"]), out.cell(c["name"]), out.cell(c["role"]),
                              out.cell(f"{c['recipe']} / {c['topology']}" + (f" / {c['backend']}" if c["backend"] and c["backend"] != "none" else "")),
                              out.cell(c["state"], "green" if c["running"] else "red"),
                              out.cell(_uptime(c["uptime_s"])),
                              out.cell(f"{c['image']} ({c['image_id'].removeprefix('sha256:')[:12]})"),
                              out.cell("-" if h is None else ("ok" if h["ok"] else h["detail"]),
                                       "" if h is None else ("green" if h["ok"] else "red")),
                              out.cell(c.get("restarts", 0), _crash_style(c)))
        out.table(table)
        for n in nodes:  # in full, one line each (a table folds them): how each container last stopped
            for c in n["containers"]:
                if c.get("last_exit") or c.get("docker_health") == "unhealthy":
                    out.line(f"{n['name']} {c['name']}: {c['crashes']}", _crash_style(c) or None)
        for n in nodes:
            if not n["reachable"]:
                out.line(n["error"] if n["error"].startswith(n["name"]) else f"{n['name']}: {n['error']}", "red")
        if data["endpoint"]:
            out.line(f"endpoint: {data['endpoint']} (model {data['model']})" + ("" if data["healthy"] else "  NOT HEALTHY"),
                     "green" if data["healthy"] else "red")
        elif not all_containers:
            out.line("nothing of sparkdeploy's is deployed")
        if data["metrics_url"]:
            out.line(f"metrics: Prometheus at {data['metrics_url']}")
    if unreachable:
        raise StepFailed(f"unreachable: {', '.join(unreachable)}")


__all__ = ["up", "down", "status", "deploy"]
