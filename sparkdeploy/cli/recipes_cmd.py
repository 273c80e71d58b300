"""`sparkdeploy recipes list | show | lint`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sparkdeploy.cli.common import (
    backend_option,
    emit_json,
    json_option,
    recipes_dir_option,
    set_option,
    topology_option,
    warn,
)
from sparkdeploy.doctor import graph_advice
from sparkdeploy.errors import ConfigError, escape_controls
from sparkdeploy.recipes import budget, catalogue
from sparkdeploy.recipes import importing as recipe_import
from sparkdeploy.recipes import recipe as recipes_mod
from sparkdeploy.topologies import fit as fit_mod

if TYPE_CHECKING:
    from sparkdeploy.recipes.recipe import ResolvedRecipe


@click.group("recipes")
def recipes_group() -> None:
    """List, inspect and check recipes (recipes/*.yaml and your --recipes-dir)."""


@recipes_group.command("list")
@recipes_dir_option
@json_option
def list_cmd(recipes_dir: str | None, as_json: bool) -> None:
    """One line per recipe: model, weights, fits one node, topologies (default first), tool-call and reasoning
    parsers. `recipes search TEXT` narrows it down."""
    print_catalogue(catalogue.entries(recipes_dir), as_json, "recipes")


@recipes_group.command("search")
@click.argument("text")
@recipes_dir_option
@json_option
def search_cmd(text: str, recipes_dir: str | None, as_json: bool) -> None:
    """Recipes whose name, model, description, parsers or topologies contain every word of TEXT
    (case-insensitive). Exit 1 when none does.

    \b
    Examples:
      recipes search qwen coder        # the Qwen3-Coder recipes
      recipes search glm47             # recipes that serve tools with the glm47 parser
      recipes search cluster llama --json
    """
    rows = catalogue.search(text, recipes_dir)
    print_catalogue(rows, as_json, f"recipes matching {text!r}")
    if not rows:
        raise click.exceptions.Exit(1)


def print_catalogue(rows: list[dict[str, Any]], as_json: bool, title: str) -> None:
    if as_json:
        emit_json(rows)
        return
    table = Table(title=plain(title), title_justify="left")
    for col in ("name", "engine", "model", "weights", "one node", "topologies", "tool parser", "reasoning"):
        table.add_column(col)
    for r in rows:
        if r["problems"]:
            table.add_row(plain(r["name"]), "", Text(r["problems"][0], style="red"), "", "", "", "", "")
            continue
        topologies = [r["default_topology"]] + [t for t in r["topologies"] if t != r["default_topology"]]
        weights = f"{r['weights_gb']:g} GB" if r["weights_gb"] else "?"
        table.add_row(
            *map(
                plain,
                (
                    r["name"],
                    r["engine"],
                    r["model"],
                    weights,
                    "yes" if r["fits_one_node"] else "no",
                    ", ".join(topologies),
                    r["tool_call_parser"] or "-",
                    r["reasoning_parser"] or "-",
                ),
            )
        )
    Console(width=180).print(table)
    if not rows:
        click.echo("no recipe matches (see: sparkdeploy recipes list)")


@recipes_group.command("show")
@click.argument("name")
@topology_option
@backend_option
@set_option
@recipes_dir_option
@json_option
def show_cmd(
    name: str, topology: str | None, backend: str | None, sets: tuple[str, ...], recipes_dir: str | None, as_json: bool
) -> None:
    """The merged values of NAME for a topology, and where each value came from
    (default, the recipe file, its overrides.<topology>, or --set)."""
    resolved = recipes_mod.resolve(name, topology, backend, sets, recipes_dir)
    values = recipes_mod._leaves(resolved.recipe.model_dump(exclude={"overrides"}))
    rows = [{"key": k, "value": v, "source": resolved.sources.get(k, "default")} for k, v in values.items()]
    allreduce = allreduce_mode(resolved)
    if as_json:
        emit_json(
            {
                "recipe": resolved.name,
                "topology": resolved.topology,
                "backend": resolved.backend or None,
                "file": str(resolved.source),
                "values": rows,
                "warnings": resolved.warnings,
                "allreduce": allreduce,
            }
        )
        return
    for w in resolved.warnings:
        warn(w)
    table = Table(
        title=plain(f"{resolved.name} ({resolved.topology}{', ' + resolved.backend if resolved.backend else ''})"),
        title_justify="left",
    )
    table.add_column("key")
    table.add_column("value")
    table.add_column("from")
    for r in rows:
        table.add_row(
            plain(r["key"]),
            plain(repr(r["value"]) if isinstance(r["value"], str) else str(r["value"])),
            plain(r["source"]),
        )
    table.add_row(
        "all-reduce (derived)", plain(allreduce["mode"]), "vllm.enforce_eager, vllm.compilation.eager_allreduce"
    )
    Console(width=160).print(table)
    click.echo(
        f"all-reduce: {allreduce['mode']}: {allreduce['meaning']}. `sparkdeploy doctor --nccl` measures which "
        "this cluster wants."
    )


def allreduce_mode(resolved: ResolvedRecipe) -> dict[str, str]:
    """Which way the recipe runs vLLM's all-reduce: keep graphs / cut at all-reduce / enforce eager."""
    mode = graph_advice.recipe_mode(resolved.recipe.vllm)
    return {"mode": mode, "meaning": graph_advice.MEANING[mode], "setting": graph_advice.SETTING[mode]}


@recipes_group.command("fit")
@click.argument("name")
@topology_option
@click.option(
    "--nodes",
    type=click.IntRange(1, 64),
    default=None,
    help="Without --inventory: how many DGX Sparks (default: the topology's minimum).",
)
@click.option(
    "--inventory",
    "-i",
    "inventory",
    metavar="PATH|lab",
    default=None,
    help="Read each engine node's live memory over SSH (read-only). Without it: the recipe's own figures "
    "against DGX Sparks (119.7 GiB each).",
)
@set_option
@recipes_dir_option
@json_option
def fit_cmd(
    name: str,
    topology: str | None,
    nodes: int | None,
    inventory: str | None,
    sets: tuple[str, ...],
    recipes_dir: str | None,
    as_json: bool,
) -> None:
    """The memory budget of NAME per node: the weights' share, the KV cache at max_model_len x max_num_seqs
    (from the recipe's architecture), what vLLM reserves (gpu_memory_utilization x total), the
    compile/activation peak, the OS reserve, the node's free memory: fits or not, and the setting that would
    fit. The same budget `up`'s preflight and `doctor` (gpu.memory) check. Exit 1 when it does not fit."""
    report = fit_mod.fit(name, topology, sets, recipes_dir, inventory, nodes)
    if as_json:
        emit_json(report.as_dict())
    else:
        _print_fit(report)
    if not report.fits:
        raise click.exceptions.Exit(1)


def _print_fit(report: fit_mod.FitReport) -> None:
    gib = budget.gib
    where = "live, over SSH" if report.live else "nominal DGX Sparks, no node asked"
    table = Table(
        title=plain(f"{report.recipe} ({report.topology}): memory budget per node ({where})"), title_justify="left"
    )
    for col in ("node", "weights", "KV 1 seq", "KV x seqs", "peak", "util x total", "OS", "needs free", "free", "fits"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for b in report.budgets:
        table.add_row(
            plain(b.node),
            plain(f"{gib(b.weights)} (/{b.engine_size})"),
            plain(f"{gib(b.kv_per_seq)} ({b.max_model_len or '?'} tok)"),
            plain(f"{gib(b.kv_full)} (x{b.max_num_seqs})"),
            plain(gib(b.peak)),
            plain(f"{gib(b.reserve)} ({b.util:g} x {gib(b.total)})"),
            plain(gib(b.os_reserve)),
            plain(gib(b.need)),
            plain(f"{gib(b.free)} {b.source}"),
            Text("yes" if b.fits else "NO", style="green" if b.fits else "red"),
        )
    Console(width=200).print(table)
    for b in report.budgets:
        if b.simulated:
            click.echo(f"{b.node}: SIMULATED: the lab's stand-in nvidia-smi reports these totals, not a GB10")
        if not b.starts:
            click.echo(
                f"{b.node}: the weights + peak + one max_model_len sequence of KV do not fit inside util x total: "
                "the engine won't start"
            )
        elif b.full_sequences is not None and b.full_sequences < b.max_num_seqs:
            click.echo(
                f"{b.node}: the KV room ({gib(b.kv_room)}) holds {b.full_sequences} of {b.max_num_seqs} "
                "full-length sequences at once (the engine queues the rest)"
            )
        for note in b.notes:
            click.echo(f"{b.node}: {note}")
        if b.suggestion:
            click.echo(f"{b.node}: fix: {b.suggestion}")
    for node, why in report.errors.items():
        click.echo(f"{node}: memory not read: {why}", err=True)
    click.echo("fits" if report.fits else "does NOT fit")


@recipes_group.command("lint")
@recipes_dir_option
@json_option
def lint_cmd(recipes_dir: str | None, as_json: bool) -> None:
    """Render every recipe for every topology (and every backend of cluster) against the example inventory
    shape; exit 1 if any combination fails."""
    from sparkdeploy.topologies.lint import lint_all

    results = lint_all(recipes_dir)
    failed = [r for r in results if not r["ok"]]
    if as_json:
        emit_json(results)
    else:
        for r in results:
            mark = click.style("ok  ", fg="green") if r["ok"] else click.style("FAIL", fg="red")
            combo = f"{r['recipe']} / {r['topology']}" + (f" / {r['backend']}" if r["backend"] else "")
            click.echo(f"{mark} {combo}")
            for line in r["problems"]:
                click.echo(f"       {line}")
            for line in r["warnings"]:
                click.echo(f"       warning: {line}")
        click.echo(f"{len(results) - len(failed)} of {len(results)} combinations render")
    if failed:
        raise click.exceptions.Exit(1)


@recipes_group.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    "out_dir",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder to write NAME.yaml into (pass it as --recipes-dir later, or set SPARKDEPLOY_RECIPES).",
)
@click.option("--dry-run", is_flag=True, help="Print the recipe that would be written; write nothing.")
@click.option("--force", is_flag=True, help="Replace NAME.yaml if it exists.")
@set_option
@json_option
def import_cmd(file: str, out_dir: str, dry_run: bool, force: bool, sets: tuple[str, ...], as_json: bool) -> None:
    """Write the sparkdeploy recipe equivalent to FILE, an eugr/spark-vllm-docker v1 recipe (`recipe_version`),
    and list what it could not carry over as written. `run-recipe FILE` runs such a file without importing it.

    \b
    --set NAME=VALUE fills the command's {NAME} placeholder (instead of its default); --set container=IMAGE,
    --set mods=[] or --set build_args=[] replace those eugr fields; any other --set is a recipe key.
    A mod, build_arg or container with no sparkdeploy equivalent is refused, naming it.

    \b
    Examples:
      recipes import ~/spark-vllm-docker/recipes/openai-gpt-oss-120b.yaml --dry-run
      recipes import minimax-m2-awq.yaml --set container=vllm-node --out ~/my-recipes
    """
    result = recipe_import.import_recipe(file, sets, out_dir, dry_run=dry_run, force=force)
    if as_json:
        emit_json(result)
        return
    if dry_run:
        click.echo(result["text"], nl=False)
    else:
        click.echo(f"wrote {result['file']} (recipe {result['recipe']})")
    if result["not_carried"]:
        click.echo("not carried over as written:", err=dry_run)
        for note in result["not_carried"]:
            click.echo(f"  - {escape_controls(note)}", err=dry_run)


__all__ = ["ConfigError", "recipes_group"]


def plain(value: str) -> Text:
    """A cell shown as written: never read as rich markup ([/x]), control characters shown escaped."""
    text = str(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        text = repr(text)
    return Text(text)
