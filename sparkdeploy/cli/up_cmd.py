"""`sparkdeploy up | down | status`: options in, people's tables out; the pipeline is sparkdeploy.deploy.

`run-recipe NAME` is `sparkdeploy up --recipe NAME` (run_up). Everything printed passes through the secrets mask.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sparkdeploy.checks import Result
from sparkdeploy.cli.common import UpArgs, emit_json, inventory_option, json_option, up_options
from sparkdeploy.deploy.down import remove
from sparkdeploy.deploy.plan import CHANGED, FAILED, OK, SKIPPED, Plan, StepKind
from sparkdeploy.deploy.progress import Reporter
from sparkdeploy.deploy.stack import members as stack_members
from sparkdeploy.deploy.stack.converge import up as stack_up
from sparkdeploy.deploy.status import cluster_status
from sparkdeploy.deploy.up import deploy
from sparkdeploy.deploy.up_result import UpResult
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.guard.state import line as guard_line
from sparkdeploy.guard.state import watch_line
from sparkdeploy.topologies.context import DeploymentSource

STATUS_COLORS = {OK: "green", CHANGED: "yellow", FAILED: "red", SKIPPED: "bright_black", "pending": "bright_black"}


# -- output ---------------------------------------------------------------------------------------------


class Out(Reporter):
    """Tables and lines for people (stdout), progress (stderr), all masked; quiet on stdout with --json."""

    def __init__(self, as_json: bool, mask: Callable[[str], str] = lambda s: s) -> None:
        super().__init__(mask)
        self.as_json = as_json
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

    def preflight(self, checks: list[Result], only_failures: bool = False) -> None:
        table = Table(title="preflight", title_justify="left")
        for col in ("node", "check", "result", "detail", "fix"):
            table.add_column(col)
        for c in checks:
            if only_failures and c.ok:
                continue
            table.add_row(
                self.cell(c.node),
                self.cell(c.check),
                self.cell(
                    {"warn": "warn", "fail": "FAILED"}.get(c.status, "ok"),
                    {"warn": "yellow", "fail": "red"}.get(c.status, "green"),
                ),
                self.cell(c.measured),
                self.cell(c.fix),
            )
        self.table(table)
        for c in checks:  # in full, one line each (a table folds long fingerprints and paths)
            if not c.ok:
                self.line(f"FAILED {c.node} {c.check}: {c.measured}" + (f" (fix: {c.fix})" if c.fix else ""), "red")

    def steps(self, plan: Plan, title: str) -> None:
        table = Table(title=title, title_justify="left")
        for col in ("node", "step", "target", "result", "detail"):
            table.add_column(col)
        for s in plan.steps:
            status = s.status if s.status != "pending" else ("change" if s.change else "ok")
            detail = s.detail or s.reason
            if s.status == CHANGED and s.reason and s.detail:
                detail = f"{s.reason}: {s.detail}"
            table.add_row(
                self.cell(s.node),
                self.cell(s.kind),
                self.cell(s.target),
                self.cell(status, STATUS_COLORS.get(s.status, "yellow" if s.change else "green")),
                self.cell(detail),
            )
        self.table(table)

    def dry_run(self, plan: Plan) -> None:
        self.line("DRY RUN: facts were read; nothing is changed on any node.", "bold")
        for n in plan.nodes:
            self.line("")
            self.line(f"== {n.node.name} {n.node.mgmt_ip} ({n.node.role}): {len(n.changes)} change(s) ==", "bold")
            for i, s in enumerate(n.steps, 1):
                mark = "change" if s.change else "ok    "
                self.line(f"{i:>2}. {mark} {s.kind} {s.target}  ({s.reason})")
                if s.change and s.file is not None and s.kind == StepKind.WRITE:
                    shown = s.file.shown()
                    for content_line in shown.rstrip("\n").split("\n"):
                        self.line(f"      | {content_line}")


# -- up -------------------------------------------------------------------------------------------------

recipe_option = click.option("--recipe", "-r", metavar="NAME", help="Recipe (default: the inventory's default_recipe).")


@click.command("up")
@recipe_option
@click.option(
    "--stack",
    metavar="FILE",
    help="Several deployments from a stack file (docs/stack.md), behind one LiteLLM gateway on the head node; "
    "takes --inventory, --recipes-dir, --dry-run, --timeout and --json.",
)
@up_options()
def up(recipe: str | None, stack: str | None, up_args: UpArgs, as_json: bool) -> None:
    """Deploy a recipe: only the differences are applied; returns once it serves.

    \b
    Examples:
      sparkdeploy up --inventory lab                         # the inventory's default recipe and its topology
      sparkdeploy up -r openai-gpt-oss-120b -t 2xsolo       # one engine per node behind LiteLLM
      sparkdeploy up -t cluster -b torchrun --dry-run        # the plan, nothing changed
      sparkdeploy up --stack stack.yaml --dry-run            # several models behind one gateway: the plan
      sparkdeploy up -t cluster --no-fabric-gate             # start without the fabric gate (said in the output)
    """
    if stack:
        a = up_args
        given = [
            o
            for o, v in (
                ("--recipe", recipe),
                ("--topology", a.topology),
                ("--backend", a.backend),
                ("--set", a.sets),
                ("--node", a.node),
                ("--metrics", a.metrics),
                ("--pull-model", a.pull_model),
            )
            if v
        ]
        if given:
            raise ConfigError(
                Problem(
                    "--stack",
                    stack,
                    f"{', '.join(given)} apply to one deployment",
                    "write them into the stack file's deployment (recipe, topology, backend, nodes, set)",
                )
            )
        result: dict[str, Any] = {}
        try:
            stack_up(stack, a.inventory, a.recipes_dir, a.dry_run, a.timeout, Out(as_json), result, a.fabric_gate_on)
        finally:
            if as_json and result:
                emit_json(result)
        return
    run_up(as_json, recipe, up_args)


def run_up(as_json: bool, recipe: str | None, up_args: UpArgs, source: DeploymentSource | None = None) -> None:
    """`up` and `run-recipe`: the library's deploy, shown to people (or as JSON, even when it fails).
    source: the inventory and recipe run-recipe read already (deploy reads them otherwise)."""
    result = UpResult()
    try:
        deploy(reporter=Out(as_json), result=result, recipe=recipe, source=source, **dataclasses.asdict(up_args))
    finally:
        data = result.as_dict()
        if as_json and data:
            emit_json(data)


# -- down -----------------------------------------------------------------------------------------------


deployment_option = click.option(
    "--deployment",
    metavar="NAME",
    help="Only this deployment of a stack (`up --stack`; the gateway is `gateway`). Default: every deployment.",
)


@click.command("down")
@inventory_option
@click.option("--dry-run", is_flag=True, help="Print what would be removed; change nothing.")
@deployment_option
@click.option(
    "--keys",
    is_flag=True,
    help="Also remove the stack gateway's keys and their spend counts (kept otherwise, so that a later "
    "`up --stack` serves the same keys).",
)
@json_option
def down(inventory: str | None, dry_run: bool, deployment: str | None, keys: bool, as_json: bool) -> None:
    """Remove what sparkdeploy created on every node: containers (by label) and files (the manifest's list).

    A node that cannot be reached is reported (exit 1); the others are cleaned. In a stack, --deployment NAME
    removes one deployment only, after the gateway stopped routing to it (its model is then a 404); `down`
    removes the gateway first. The last line says what is left on each node and why, read from the nodes after
    the removal. The gateway's keys and spend counts stay unless --keys."""
    result: dict[str, Any] = {}
    try:
        remove(inventory, dry_run, Out(as_json), result, deployment, keys)
    finally:
        if as_json and result:
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


def _crash_style(c: dict[str, Any]) -> str:
    last = c.get("last_exit") or {}
    if last.get("oom_killed") or c.get("state") == "restarting" or c.get("docker_health") == "unhealthy":
        return "red"
    return "yellow" if c.get("restarts") or last else ""


@click.command("status")
@inventory_option
@deployment_option
@json_option
def status(inventory: str | None, deployment: str | None, as_json: bool) -> None:
    """Per node: our containers, image, uptime, health, and the endpoint URL. Exit 1 if a node is unreachable.

    A stack's containers carry their deployment's name (sparkdeploy-NAME-vllm); --deployment NAME shows one."""
    data = cluster_status(inventory, deployment)
    nodes = data["nodes"]
    out = Out(as_json)
    all_containers = [c for n in nodes for c in n["containers"]]
    unreachable = [n["name"] for n in nodes if not n["reachable"]]
    if as_json:
        emit_json(data)
    else:
        out.table(_status_table(out, data))
        for n in nodes:  # in full, one line each (a table folds them): how each container last stopped
            for c in n["containers"]:
                if c.get("last_exit") or c.get("docker_health") == "unhealthy":
                    out.line(f"{n['name']} {c['name']}: {c['crashes']}", _crash_style(c) or None)
        for n in nodes:  # the memory guard's state (sparkdeploy/guard): why an engine was stopped
            if "guard" in n:
                state = (n["guard"] or {}).get("state")
                out.line(f"{n['name']} {guard_line(n['guard'])}", {"held": "red", "soft": "yellow"}.get(state or ""))
        shown = set()
        for n in nodes:  # each engine group as its watcher sees it: restarts by the watcher and why, or giving up
            for c in n["containers"]:
                if c.get("watch") and c["group"] not in shown:
                    shown.add(c["group"])
                    w = c["watch"]
                    style = {"gave-up": "red", "held": "red", "failing": "yellow", "restarting": "yellow"}
                    out.line(f"{w['node']} {watch_line(c['group'], w)}", style.get(w.get("state"), None))
        for n in nodes:
            if not n["reachable"]:
                out.line(n["error"] if n["error"].startswith(n["name"]) else f"{n['name']}: {n['error']}", "red")
        _member_lines(out, data.get("members") or [])
        if data["endpoint"]:
            out.line(
                f"endpoint: {data['endpoint']} (model {data['model']})" + ("" if data["healthy"] else "  NOT HEALTHY"),
                "green" if data["healthy"] else "red",
            )
        elif not all_containers:
            out.line("nothing of sparkdeploy's is deployed")
        if data["metrics_url"]:
            out.line(f"metrics: Prometheus at {data['metrics_url']}")
    if unreachable:
        raise StepFailed(f"unreachable: {', '.join(unreachable)}")


def _status_table(out: Out, data: dict[str, Any]) -> Table:
    """The status table: a row per container of each node (an unreachable node's row says so)."""
    table = Table(title=f"sparkdeploy status ({data['inventory']})", title_justify="left")
    for col in ("node", "container", "role", "recipe / topology", "state", "uptime", "image", "health", "restarts"):
        table.add_column(col)
    for n in data["nodes"]:
        if not n["reachable"]:
            table.add_row(
                out.cell(n["name"]),
                out.cell("-"),
                out.cell("-"),
                out.cell("-"),
                out.cell("UNREACHABLE", "red"),
                out.cell("-"),
                out.cell("-"),
                out.cell("see below"),
                out.cell("-"),
            )
            continue
        if not n["containers"]:
            table.add_row(out.cell(n["name"]), out.cell("(none)"), *[out.cell("-") for _ in range(7)])
        for c in n["containers"]:
            h = c["health"]
            table.add_row(
                out.cell(n["name"]),
                out.cell(c["name"]),
                out.cell(c["role"]),
                out.cell(
                    f"{c['recipe']} / {c['topology']}"
                    + (f" / {c['backend']}" if c["backend"] and c["backend"] != "none" else "")
                ),
                out.cell(c["state"], "green" if c["running"] else "red"),
                out.cell(_uptime(c["uptime_s"])),
                out.cell(f"{c['image']} ({c['image_id'].removeprefix('sha256:')[:12]})"),
                out.cell(
                    "-" if h is None else ("ok" if h["ok"] else h["detail"]),
                    "" if h is None else ("green" if h["ok"] else "red"),
                ),
                out.cell(c.get("restarts", 0), _crash_style(c)),
            )
    return table


def _member_lines(out: Out, members: list[dict[str, Any]]) -> None:
    """A stack's members, one line each: cold / starting / warm / stopping, and on demand with its idle timeout,
    its last request and idle time; under it, its activator's last decision with its figures (a short line)."""
    colour = {"warm": "green", "starting": "yellow", "stopping": "yellow"}
    now = time.time()
    for m in members:
        kind = f"on demand, idle timeout {m['idle_timeout_s']} s" if m["on_demand"] else "always on"
        engines = f"{m['engines_running']}/{m['engines']} engine(s) running"
        usage = stack_members.usage_text(m, now)
        out.line(
            f"member {m['deployment']} ({m['model']}, {kind}): {m['state']}: {m['why']}; {engines}"
            + (f"; {usage}" if usage else ""),
            colour.get(m["state"]),
        )
        if m.get("decision"):
            out.line(f"  last decision: {stack_members.decision_text(m['decision'], now)}")


__all__ = ["down", "run_up", "status", "up"]
