"""`sparkdeploy models pull | list`: model weights downloaded once, copied over the fabric, verified everywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn
from rich.table import Table

from sparkdeploy.cli.common import emit_json, exit_with, inventory_option, json_option, recipes_dir_option
from sparkdeploy.errors import ConfigError, Problem

if TYPE_CHECKING:
    from sparkdeploy.config.inventory import Inventory, Node
    from sparkdeploy.models.ops import ModelRef
    from sparkdeploy.models.pull import PullResult
    from sparkdeploy.topologies.deployment import Deployment


class RichProgress:
    """One bar per node: bytes and rate (rich)."""

    def __init__(self, console: Console) -> None:
        self.bars = Progress(
            TextColumn("{task.fields[node]:<8}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TextColumn("{task.fields[what]}"),
            console=console,
        )
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> RichProgress:
        self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.stop()

    def start(self, node: str, total: int, what: str) -> None:
        if node in self.tasks:
            self.bars.update(self.tasks[node], total=total, completed=0, what=what)
        else:
            self.tasks[node] = self.bars.add_task("", total=total or 1, node=node, what=what)

    def update(self, node: str, done: int) -> None:
        if node in self.tasks:
            self.bars.update(self.tasks[node], completed=done)

    def finish(self, node: str, ok: bool, note: str = "") -> None:
        if node in self.tasks:
            task = self.bars.tasks[self.tasks[node]]
            self.bars.update(
                self.tasks[node], completed=task.total if ok else task.completed, what="verified" if ok else "FAILED"
            )


def resolve_target(
    arg: str, revision: str | None, inventory: str | None, recipes_dir: str | None, include: tuple[str, ...] = ()
) -> tuple[list[ModelRef], Deployment, Inventory]:
    """RECIPE|MODEL -> ([the model, its speculative draft], the deployment, the inventory)."""
    from sparkdeploy.models.ops import model_ref, recipe_refs
    from sparkdeploy.recipes.engines.registered import engine_of
    from sparkdeploy.recipes.recipe import recipe_files
    from sparkdeploy.topologies.context import load_deployment

    if arg in recipe_files(recipes_dir):
        dep = load_deployment(inventory, arg, recipes_dir=recipes_dir)
        r = dep.recipe.recipe
        files = include or tuple(engine_of(r).model_files(r))  # llama.cpp: only the recipe's GGUF files
        model_ref(r.model, revision, include=files)  # a model that is no hub id: said here, as before
        spec = r.speculative
        draft, draft_rev = (spec.model, spec.revision) if spec else (None, None)
        return recipe_refs(r.model, draft, draft_rev, revision, include=files), dep, dep.inventory
    ref = model_ref(arg, revision, include=include)
    try:
        dep = load_deployment(inventory, None, recipes_dir=recipes_dir)
    except ConfigError as exc:
        raise ConfigError(
            Problem(
                "models",
                arg,
                "is a model id, and no recipe says which engine image runs the download",
                "name a recipe instead, or set cluster.default_recipe",
            )
        ) from exc
    return [ref], dep, dep.inventory


def _ensure_image(dep: Deployment, tag: str, node: Node, say: Callable[[str], None]) -> None:
    """The hub client's image (the engine's, models/ops.hub_image_tag) must be on the download node: push it
    when missing."""
    from sparkdeploy.deploy.preflight import image_definition_name
    from sparkdeploy.images.push import push_image
    from sparkdeploy.runtime.remote import NodeConnection

    with NodeConnection(node, dep.inventory) as conn:
        if conn.run(["docker", "image", "inspect", tag], check=False).ok:
            return
    name = image_definition_name(tag)
    say(f"pushing image {name} to {node.name} (it runs the hub client)")
    for o in push_image(name, dep.inventory, [node]):
        if o.error is not None:
            raise o.error


@click.group("models")
def models() -> None:
    """Model weights: downloaded once on one node, copied to the others over the fabric, verified everywhere."""


@models.command("pull")
@click.argument("target", metavar="RECIPE|MODEL")
@click.option("--revision", metavar="REV", help="Branch, tag or commit of the model (default: main).")
@click.option("--on", "on_node", metavar="NODE", help="The node that downloads from the hub (default: the head).")
@click.option(
    "--include",
    multiple=True,
    metavar="PATTERN",
    help="Only the repo's files matching PATTERN (repeatable; e.g. one GGUF quant). Default for a recipe: the "
    "files its engine reads (a llama.cpp recipe's llamacpp.include, else its GGUF's folder).",
)
@click.option("--dry-run", is_flag=True, help="Read what every node has and what the hub lists; print the plan.")
@inventory_option
@recipes_dir_option
@json_option
def pull_cmd(
    target: str,
    revision: str | None,
    on_node: str | None,
    include: tuple[str, ...],
    dry_run: bool,
    inventory: str | None,
    recipes_dir: str | None,
    as_json: bool,
) -> None:
    """Download a model once and copy it node to node over the fabric, into every node's hf_cache.

    \b
    The download runs ON the head node (or --on NODE) with huggingface_hub, in a container of the recipe's
    engine image; HF_TOKEN reaches it only through a 0600 env file. The other nodes get it from there over
    their fabric IPs (node-to-node SSH, host keys checked), in a chain: the download node sends each byte
    once. Every file is verified on every node (sha256 of LFS files, git blob id otherwise); a copy cut
    midway resumes where it stopped; a model counts as complete only once every file verified. Engines then
    start with HF_HUB_OFFLINE=1. A recipe with a speculative draft (`speculative.model`) gets its draft too,
    pulled the same way after the model (--revision is the model's; the draft's is speculative.revision).

    \b
    Examples:
      sparkdeploy models pull openai-gpt-oss-120b            # the recipe's model
      sparkdeploy models pull Qwen/Qwen3-30B-A3B --revision main --dry-run
      sparkdeploy models pull lab/tiny-model --inventory lab  # the lab hub's small model
      sparkdeploy models pull llamacpp-gpt-oss-120b          # only the recipe's GGUF files
      sparkdeploy models pull unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF --include '*Q4_K_M.gguf'
    """
    from sparkdeploy.models.ops import hub_image_tag
    from sparkdeploy.models.pull import Puller
    from sparkdeploy.runtime.remote import NodeConnection

    refs, dep, inv = resolve_target(target, revision, inventory, recipes_dir, tuple(include))
    hub_image = hub_image_tag(dep)
    source = inv.node(on_node) if on_node else inv.head
    console = Console(stderr=True, highlight=False)

    def say(msg: str) -> None:
        if not as_json:
            console.print("[dim]models:[/dim] " + escape(msg), soft_wrap=True)

    conns = {n.name: NodeConnection(n, inv) for n in inv.nodes}
    results = []
    try:
        if not dry_run:
            _ensure_image(dep, hub_image, source, say)
        for ref in refs:  # the model, then its speculative draft: each once from the hub, then over the fabric
            if as_json or dry_run:
                result = Puller(inv, conns, dep.secrets, hub_image, None, say).pull(ref, source, inv.nodes, dry_run)
            else:
                with RichProgress(console) as bars:
                    result = Puller(inv, conns, dep.secrets, hub_image, bars, say).pull(ref, source, inv.nodes)
            results.append((ref, result))
            if not result.ok:
                break
    finally:
        for c in conns.values():
            c.close()
    if as_json:
        first = results[0][1].as_dict()
        if len(refs) > 1:
            first["drafts"] = [r.as_dict() for _, r in results[1:]]
        emit_json(first)
    else:
        _print_pulls(results, dry_run)
    if not all(result.ok for _, result in results):
        for _, result in results:
            for r in result.nodes.values():
                if not r.ok and not as_json:
                    click.echo(f"error: {r.error}", err=True)
        exit_with(1)


def _print_pulls(results: list[tuple[ModelRef, PullResult]], dry_run: bool) -> None:
    """Per ref (the model, then its draft): the commit, size, the plan (dry run) and each node's line."""
    for i, (ref, result) in enumerate(results):
        label = "" if i == 0 else "speculative draft "
        click.echo(f"{label}{ref}: commit {result.commit[:12]}, {result.files} files, {result.size / 1e9:.2f} GB")
        if dry_run:
            for line in result.plan:
                click.echo("  " + line)
        for name, r in result.nodes.items():
            rate = f", {r.bytes / r.seconds / 1e6:.0f} MB/s" if r.bytes and r.seconds else ""
            via = f" via {r.via}" if r.via else (f" from {r.source}" if r.source else "")
            click.echo(
                f"  {name}: {r.action}{via} ({r.bytes / 1e6:.1f} MB in {r.seconds:.1f} s{rate})"
                if r.ok
                else f"  {name}: {r.action}: {r.error}"
            )
    if dry_run:
        click.echo("dry run: nothing was downloaded, copied or changed")


@models.command("list")
@click.option("--verify", is_flag=True, help="Re-hash every file (default: only files changed since last verified).")
@inventory_option
@json_option
def list_cmd(verify: bool, inventory: str | None, as_json: bool) -> None:
    """Per node: the models and revisions present, their size, and whether complete and verified.

    Exit 1 when a node cannot be read or holds a model that does not verify."""
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.models.listing import node_models
    from sparkdeploy.models.ops import describe_bad
    from sparkdeploy.runtime.remote import NodeConnection

    inv = load_inventory(inventory)
    conns = {n.name: NodeConnection(n, inv) for n in inv.nodes}
    try:
        found = node_models(conns, inv.nodes, inv.cluster.hf_cache, verify)
    finally:
        for c in conns.values():
            c.close()
    rows: list[dict[str, Any]] = []
    bad = False
    for node, state in found.items():
        if isinstance(state, str):
            rows.append({"node": node, "error": state})
            bad = True
            continue
        for m in state["models"]:
            rows.append(
                {
                    "node": node,
                    "model": m["repo"],
                    "revision": m["revision"],
                    "commit": m["commit"],
                    "size": m["size"],
                    "files": m["files"],
                    "complete": not m["bad"],
                    "verified": not m["bad"],
                    "problems": m["bad"],
                }
            )
            bad = bad or bool(m["bad"])
    if as_json:
        emit_json({"hf_cache": inv.cluster.hf_cache, "nodes": rows})
    else:
        table = Table(title=f"models in {inv.cluster.hf_cache}", title_justify="left")
        for col in ("node", "model", "revision", "commit", "size", "state"):
            table.add_column(col)
        for r in rows:
            if "error" in r:
                table.add_row(r["node"], "-", "-", "-", "-", f"[red]unreadable: {r['error']}[/red]")
                continue
            state = (
                "[green]complete, verified[/green]"
                if r["complete"]
                else f"[red]NOT complete: {describe_bad(r['problems'])}[/red]"
            )
            table.add_row(r["node"], r["model"], r["revision"], r["commit"][:12], f"{r['size'] / 1e9:.2f} GB", state)
        Console(width=160).print(table)
        if bad:
            click.echo(
                "fix: run `sparkdeploy models pull MODEL` again: bad files are fetched again, the rest kept", err=True
            )
    if bad:
        exit_with(1)
