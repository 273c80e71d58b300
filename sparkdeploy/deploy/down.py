"""`down` as a library: remove what sparkdeploy created on every node it reaches, containers by label and files
by the manifest's list; a node it cannot reach is named and the others are cleaned."""

from __future__ import annotations

from typing import Any

from sparkdeploy.apply import Interrupt, Session, apply_plan, clean_temp_files, gather_facts, inventory_lock, node_locks
from sparkdeploy.deploy import stack
from sparkdeploy.deploy.report import Reporter, plan_summary
from sparkdeploy.errors import StepFailed
from sparkdeploy.facts import NodeFacts
from sparkdeploy.inventory import load_inventory
from sparkdeploy.plan import CHANGED, Plan, StepKind, plan_down


def remove(
    inventory: str | None = None,
    dry_run: bool = False,
    reporter: Reporter | None = None,
    result: dict[str, Any] | None = None,
    deployment: str | None = None,
) -> dict[str, Any]:
    """Plan and apply the removal on every reachable node; return the result (the `down --json` contract).
    Raises StepFailed (exit 1) when a node could not be cleaned; `result`, when given, holds what was done.
    deployment: only this deployment of a stack (deploy/stack.py); default: everything of ours."""
    out = reporter if reporter is not None else Reporter()
    result = result if result is not None else {}
    inv = load_inventory(inventory)
    result.update({"dry_run": dry_run, "ok": False, "unreachable": {}})
    with (
        inventory_lock(inv),
        Interrupt(out.progress) as interrupt,
        Session.open(inv) as session,
        node_locks(session, dry_run, out.warn),
    ):
        facts = gather_facts(session, inv.nodes)
        bad = {name: f for name, f in facts.items() if not isinstance(f, NodeFacts)}
        good = {name: f for name, f in facts.items() if isinstance(f, NodeFacts)}
        result["unreachable"] = {name: str(err) for name, err in bad.items()}
        no_docker = [name for name, f in good.items() if not f.docker_ok]
        plans = stack.down_plans(session, inv, good, deployment)  # a stack's deployments, each its own
        if deployment is None:
            single = stack.unlabelled(good) if plans else good
            plans.append(("down", plan_down([n for n in inv.nodes if n.name in good], single, inv.cluster.state_dir)))
        plan = Plan([n for _title, p in plans for n in p.nodes])
        for _title, one in plans:
            if dry_run:
                out.dry_run(one)
            else:
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
        problems = list(bad) + no_docker + sorted({s.node for s in plan.failed()})
        if problems:
            raise StepFailed(
                f"down incomplete on {', '.join(dict.fromkeys(problems))}; "
                f"{'the other nodes are clean' if len(problems) < len(inv.nodes) else 'nothing cleaned'}"
                "; run `sparkdeploy down` again once the node is back"
            )
        result["ok"] = True
        if not dry_run:
            out.line(plan_summary(plan) + ". " + _what_is_left(plan, list(good)))
    return result


def _what_is_left(plan: Plan, nodes: list[str]) -> str:
    """The last line, true: nothing of ours is left, except a state folder that holds what `up` did not write."""
    kept = {s.node: s.reason for s in plan.steps if s.kind == StepKind.RMDIR and s.status != CHANGED}
    clean = [n for n in nodes if n not in kept]
    parts = [f"Nothing of sparkdeploy's is left on {', '.join(clean)}."] if clean else []
    parts += [f"On {node} the state folder stays: {reason.removeprefix('kept: ')}." for node, reason in kept.items()]
    return " ".join(parts)
