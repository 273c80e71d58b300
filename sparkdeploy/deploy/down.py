"""`down` as a library: remove what sparkdeploy created on every node it reaches, containers by label and files
by the manifest's list; a node it cannot reach is named and the others are cleaned.

In a stack, the gateway stops routing a deployment before its engines stop (`down --deployment NAME` rewrites
its routes first; `down` of everything removes the gateway first). The last line is read from the nodes after
the removal (the `leftovers` facts: containers and folders of ours): what is left, where and why.
"""

from __future__ import annotations

from typing import Any

from sparkdeploy.config.inventory import Inventory, load_inventory
from sparkdeploy.config.secrets import load_secrets
from sparkdeploy.deploy.apply import apply_plan, clean_temp_files
from sparkdeploy.deploy.plan import GATEWAY_KEPT, KEYS_FILE, Plan, plan_down
from sparkdeploy.deploy.progress import Reporter, plan_summary
from sparkdeploy.deploy.stack import converge as stack
from sparkdeploy.deploy.stack import routes as gateway_routes
from sparkdeploy.deploy.stack.file import NAME
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.facts import NodeFacts, gather_facts
from sparkdeploy.labels import DEPLOYMENT_LABEL
from sparkdeploy.runtime.interrupts import Interrupt
from sparkdeploy.runtime.locks import inventory_lock, node_locks
from sparkdeploy.runtime.session import Session
from sparkdeploy.topologies.running_stack import GATEWAY, RESERVED

KEEP_KEYS = "`sparkdeploy down --keys` removes them"


def remove(
    inventory: str | None = None,
    dry_run: bool = False,
    reporter: Reporter | None = None,
    result: dict[str, Any] | None = None,
    deployment: str | None = None,
    keys: bool = False,
) -> dict[str, Any]:
    """Plan and apply the removal on every reachable node; return the result (the `down --json` contract).
    Raises StepFailed (exit 1) when a node could not be cleaned; `result`, when given, holds what was done.
    deployment: only this deployment of a stack (deploy/stack/converge.py); default: everything of ours.
    keys: the stack gateway's keys and spend counts go too (kept otherwise)."""
    out = reporter if reporter is not None else Reporter()
    result = result if result is not None else {}
    if keys and deployment not in (None, GATEWAY):
        raise ConfigError(
            Problem(
                "down",
                "--keys",
                f"the keys are the gateway's, not {deployment}'s",
                "`sparkdeploy down --keys` (everything) or `sparkdeploy down --deployment gateway --keys`",
            )
        )
    inv = load_inventory(inventory)
    result.update({"dry_run": dry_run, "ok": False, "unreachable": {}})
    with (
        inventory_lock(inv),
        Interrupt(out.progress) as interrupt,
        Session.open(inv) as session,
        node_locks(session, dry_run, out.warn),
    ):
        facts = gather_facts(session, inv.nodes, what="down")
        bad = {name: f for name, f in facts.items() if not isinstance(f, NodeFacts)}
        good = {name: f for name, f in facts.items() if isinstance(f, NodeFacts)}
        result["unreachable"] = {name: str(err) for name, err in bad.items()}
        no_docker = [name for name, f in good.items() if not f.docker_ok]
        forget = stack.routes_before_down(session, inv, good, deployment)
        plans = stack.down_plans(session, inv, good, deployment, keys)  # a stack's deployments, each its own
        if deployment is None:
            single = stack.unlabelled(good) if plans else good
            plans.append(("down", plan_down([n for n in inv.nodes if n.name in good], single, inv.cluster.state_dir)))
        if forget is not None:
            plans.insert(0, ("gateway routes", forget[2]))
        plan = Plan([n for _title, p in plans for n in p.nodes])
        for _title, one in plans:
            if dry_run:
                out.dry_run(one)
                continue
            if forget is not None and one is forget[2]:
                _forget(session, inv, forget, out, interrupt)
                continue
            apply_plan(session, one, interrupt, say=out.progress if one.changes else None)
            if interrupt.set:
                clean_temp_files(session, [n for n in inv.nodes if n.name in good])
        result["steps"] = [s.as_dict() for s in plan.steps]
        if not dry_run:
            for title, one in plans:
                out.steps(one, title if title == "down" else f"down {title}")
        for name, err in bad.items():
            out.line(f"{name}: UNREACHABLE, nothing removed there: {err}", "red")
        for name in no_docker:
            out.line(
                f"{name}: Docker does not answer: containers could not be listed ({good[name].docker_error})", "red"
            )
        if interrupt.set:
            raise KeyboardInterrupt
        left = "" if dry_run else _left(session, inv, list(good), deployment, result)
        problems = list(bad) + no_docker + sorted({s.node for s in plan.failed()})
        if problems:
            if left:
                out.line(left)
            raise StepFailed(
                f"down incomplete on {', '.join(dict.fromkeys(problems))}; run `sparkdeploy down` again once the "
                "node is back"
            )
        result["ok"] = True
        if not dry_run:
            out.line(plan_summary(plan) + ". " + left)
    return result


def _forget(
    session: Session,
    inv: Inventory,
    forget: tuple[gateway_routes.Gateway, gateway_routes.Routes, Plan],
    out: Reporter,
    interrupt: Interrupt,
) -> None:
    """The gateway stops routing the deployment (routes.json rewritten, every worker reloaded) before it goes."""
    gw, routes, plan = forget
    key = load_secrets(inv.local_path(inv.cluster.secrets_file)).get("LITELLM_MASTER_KEY")
    out.progress(f"gateway: routes {', '.join(routes.served()) or 'no model'} from now on")
    ok, detail = gateway_routes.apply_write(session, gw, plan, routes, key, interrupt)
    if not ok:
        out.warn(f"gateway: after the new routes were written, {detail}")


def _left(session: Session, inv: Inventory, names: list[str], deployment: str | None, result: dict[str, Any]) -> str:
    """The last line, read from the nodes now (the leftovers facts), or what could not be read."""
    nodes = [n for n in inv.nodes if n.name in names]
    after = gather_facts(session, nodes, what="leftovers")
    read = {n: f for n, f in after.items() if isinstance(f, NodeFacts)}
    line = what_is_left(read, inv.cluster.state_dir, deployment)
    unread = [f"{n}: could not be read after the removal ({err})" for n, err in after.items() if n not in read]
    result["left"] = line
    return " ".join([line, *unread]).strip()


def what_is_left(after: dict[str, NodeFacts], state_dir: str, deployment: str | None) -> str:
    """What is left of sparkdeploy's on each node, and why (pure: from the facts read after the removal)."""
    clean, parts = [], []
    for node, f in after.items():
        said = _left_on(f, state_dir, deployment)
        if said:
            parts.append(f"Left on {node}: {'; '.join(said)}.")
        else:
            clean.append(node)
    if clean:
        parts.append(f"Nothing of sparkdeploy's is left on {', '.join(clean)}.")
    return " ".join(parts)


SINGLE = "the single deployment"


def _unit(name: str, state_dir: str) -> str | None:
    """Whose folder `name` is: SINGLE's (the state dir), a stack unit's (`<state_dir>-NAME`), or None."""
    if name == state_dir:
        return SINGLE
    unit = name.removeprefix(state_dir + "-")
    return unit if name != unit and (NAME.fullmatch(unit) or unit in RESERVED) else None


def _left_on(f: NodeFacts, state_dir: str, deployment: str | None) -> list[str]:
    running: dict[str, list[str]] = {}
    for c in f.containers:
        running.setdefault(c.labels.get(DEPLOYMENT_LABEL) or SINGLE, []).append(c.name)
    said = []
    if running:
        units = ", ".join(sorted(running))
        if deployment is not None:
            why = f"only {deployment} was asked to go; `sparkdeploy down` removes the rest"
        else:
            why = "not removed: run `sparkdeploy down` again"
        said.append(f"{units} still run{'s' if len(running) == 1 else ''} ({why})")
    for d in sorted(f.state_dirs.values(), key=lambda d: d.name):
        owner = _unit(d.name, state_dir)
        if owner is None or owner in running:
            continue  # not ours, or the folder of what still runs
        unit = owner
        kept = [e for e in d.entries if unit == GATEWAY and e in GATEWAY_KEPT and KEYS_FILE in d.entries]
        other = [e for e in d.entries if e not in kept]
        if kept:
            said.append(
                f"~/{d.name} keeps the gateway's keys and spend counts ({', '.join(kept)}) on purpose: a later "
                f"`up --stack` serves the same keys; {KEEP_KEYS}"
            )
        if d.has_manifest:
            said.append(
                f"~/{d.name} holds the files of {unit}, which runs no container: "
                + ("`sparkdeploy down`" if unit == SINGLE else f"`sparkdeploy down --deployment {unit}`")
                + " removes them"
            )
        elif other:
            said.append(f"~/{d.name} stays: it holds what sparkdeploy did not write ({', '.join(other[:3])})")
    return said
