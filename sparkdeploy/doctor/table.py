"""The doctor report: a rich table grouped by check (one row per node), or JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sparkdeploy.checks import FAIL, PASS, SKIP, WARN, Result

from .registry import BY_ID
from .runner import Report

STYLE = {PASS: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}


def headline(report: Report) -> str:
    run = report.run
    if run is None or run.inventory is None:
        return "sparkdeploy doctor: the inventory did not load"
    inv = run.inventory
    parts = [f"sparkdeploy doctor: {inv.cluster.name} ({len(inv.nodes)} node{'s' if len(inv.nodes) != 1 else ''})"]
    d = run.deployment
    if d is not None:
        topo = d.topology + (f"/{d.backend}" if d.topology == "cluster" else "")
        parts.append(
            f"recipe {d.recipe.name} ({topo}), image {d.image_tag}"
            + (" SIMULATED" if run.simulated_image else "")
            + (f" [{run.recipe_source}]" if run.recipe_source else "")
        )
    elif run.recipe_name:
        parts.append(
            f"recipe {run.recipe_name} (did not render)" + (f" [{run.recipe_source}]" if run.recipe_source else "")
        )
    return ", ".join(parts)


def summary(report: Report, strict: bool = False) -> str:
    c = report.counts()
    text = f"{c[PASS]} pass, {c[WARN]} warn, {c[FAIL]} fail, {c[SKIP]} skip in {report.seconds:.1f} s"
    if strict and c[WARN]:
        text += " (--strict: warnings fail)"
    return text


def _collapse(results: list[Result]) -> list[Result]:
    """Skipped rows of one check with one reason on every node become one row (node: all)."""
    out, i = [], 0
    while i < len(results):
        j = i
        while j < len(results) and results[j].check == results[i].check:
            j += 1
        group = results[i:j]
        if (
            len(group) > 1
            and all(r.status == SKIP for r in group)
            and len({r.measured.replace(r.node or "", "N") for r in group}) == 1
        ):
            first = group[0]
            out.append(
                type(first)(SKIP, first.measured.replace(first.node or "", "each node"), check=first.check, node="all")
            )
        else:
            out.extend(group)
        i = j
    return out


def console_for_output() -> Console:
    """A terminal keeps its width; piped output gets a width a table of measurements fits in."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    return console


def render(report: Report, console: Console | None = None, strict: bool = False) -> None:
    console = console or console_for_output()
    console.print(Text(headline(report), style="bold"))
    table = Table(show_lines=False, pad_edge=False, expand=False)
    table.add_column("check", no_wrap=True)
    table.add_column("node", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("measured / fix", overflow="fold", ratio=3)
    table.add_column("expected", style="dim", overflow="fold", ratio=1)
    results = _collapse(report.results)
    for i, r in enumerate(results):
        first = i == 0 or results[i - 1].check != r.check
        last = i == len(results) - 1 or results[i + 1].check != r.check
        cell = Text(r.measured or "")
        if r.simulated:
            cell.append(" [SIMULATED]", style="magenta")
        if r.fix and r.status in (WARN, FAIL):
            cell.append("\nfix: " + r.fix, style=STYLE[r.status])
        elif r.fix and r.status == PASS:
            cell.append("\nnote: " + r.fix, style="cyan")
        table.add_row(
            r.check if first else "",
            r.node or "-",
            Text(r.status.upper(), style=STYLE[r.status]),
            cell,
            r.expected or "",
            end_section=last,
        )
    console.print(table)
    nccl = report.run.extra.get("nccl") if report.run else None
    if nccl and nccl.get("table"):
        console.print(
            Text(
                "all-reduce probe (rank 0 on the head)"
                + (": SIMULATED gloo/CPU, not the fabric link's figures" if nccl.get("simulated") else ""),
                style="bold",
            )
        )
        console.print(Text(nccl["table"].rstrip()))
    code = report.exit_code(strict)
    console.print(Text(summary(report, strict), style="green" if code == 0 else "bold red"))


def as_dict(report: Report, strict: bool = False, exit_code: int | None = None) -> dict[str, Any]:
    run = report.run
    d = run.deployment if run else None
    nccl = run.extra.get("nccl") if run else None
    return {
        "ok": (exit_code if exit_code is not None else report.exit_code(strict)) == 0,
        "exit_code": exit_code if exit_code is not None else report.exit_code(strict),
        "strict": strict,
        "summary": report.counts(),
        "seconds": round(report.seconds, 3),
        "inventory": str(run.inventory.path) if run and run.inventory else None,
        "recipe": d.recipe.name if d else (run.recipe_name if run else None),
        "recipe_source": run.recipe_source if run else None,
        "topology": d.topology if d else None,
        "image": d.image_tag if d else None,
        "simulated_image": bool(run and run.simulated_image),
        "checks": {c.id: c.title for c in BY_ID.values()},
        "results": [r.to_dict() for r in report.results],
        "nccl": nccl["result"] if nccl else None,
    }
