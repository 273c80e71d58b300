"""`sparkdeploy images build | push | list`: image definitions on this machine and on the nodes.

    build NAME [--local]     build with this machine's engine (bases first; skipped when the tag exists)
    build NAME --on NODE     build with the node's engine: the build context travels over SSH (its base is
                             pushed there first); the node's architecture, free disk and Internet access are
                             checked before it starts; a failed build resumes from its last finished step
    build NAME --on NODE --dry-run
                             the plan only: base, sources (with the evidence in sources.yaml), expected
                             duration, disk needed, hosts fetched from, and where the image goes next
    push NAME [--to NODE]    send the image to the nodes in parallel, only the layers each one lacks
    push NAME --from NODE    send the image a node has (images build NAME --on NODE) from that node to the
                             others over the fabric (node to node SSH, a chain: the source sends each byte
                             once); --dry-run shows the chain, the fabric addresses and the peer SSH setup
    pull REF [--on NODE]     a registry image: pulled once on one node, its digest checked, its vLLM CLI read
                             from it, then sent node to node over the fabric to every other node
    list [--json]            per node, the images we manage (label io.sparkdeploy.image) and whether the
                             nodes agree on each tag's image ID

Exit codes: 0 ok, 1 a node failed (per-node results are printed), 2 bad usage or configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sparkdeploy.cli.common import emit_json, inventory_option, json_option, stop_deployments_option
from sparkdeploy.errors import StepFailed

if TYPE_CHECKING:
    from sparkdeploy.config.inventory import Inventory, Node
    from sparkdeploy.runtime.remote import NodeOutcome


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False, width=max(120, Console().width))


def _short(image_id: str | None) -> str:
    return image_id.removeprefix("sha256:")[:12] if image_id else "-"


def _size(n: int) -> str:
    from sparkdeploy.images.push_progress import human_size as size

    return size(n) if n else "-"


@click.group()
def images() -> None:
    """Image definitions (images/<name>/): build, push to the nodes (only missing layers), list."""


# -- build ----------------------------------------------------------------------------------------------------


@images.command("build")
@click.argument("name")
@click.option("--on", "on_node", metavar="NODE", help="Build with this node's Docker engine, over SSH.")
@click.option("--local", "local", is_flag=True, help="Build with this machine's engine (the default).")
@click.option("--force", is_flag=True, help="Build even when the tag exists (local builds).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan (base, sources, duration, disk, hosts, what comes next); build nothing.",
)
@inventory_option
@stop_deployments_option
def build_cmd(
    name: str,
    on_node: str | None,
    local: bool,
    force: bool,
    dry_run: bool,
    inventory: str | None,
    stop_deployments: bool,
) -> None:
    """Build image definition NAME here (default) or on a node (--on NODE).

    On a node, the node's architecture, free disk and an answer from every host the build fetches from are
    checked first (each on its own line; any failure stops it, exit 1). Each build step is reported as it
    starts, with the latest output line every 30 s; the node's engine keeps every finished step, so running
    the same command again after a failure resumes where it stopped. A build on a node that serves a deployment
    (its CPU and memory shared with the engines: the memory guard may stop them) is refused, naming it, unless
    --stop-deployments.
    """
    from sparkdeploy.images.definitions import load_definition

    if on_node and local:
        raise click.UsageError("--on and --local exclude each other")
    definition = load_definition(name)  # a bad name fails before anything connects
    err = Console(stderr=True, highlight=False)
    if dry_run:
        from sparkdeploy.images.build_plan import build_plan

        if on_node:
            from sparkdeploy.config.inventory import load_inventory
            from sparkdeploy.images.inventory_images import select_nodes

            select_nodes(load_inventory(inventory), [on_node])  # a bad node name fails here too
        click.echo("\n".join(build_plan(name, on_node or "this machine").lines()))
        return
    if not on_node:
        from sparkdeploy.images.build import ensure_image

        with err.status(f"building {name}", spinner="dots"):
            tag = ensure_image(name, progress=lambda line: err.print(f"[dim]{line}[/dim]"), force=force)
        click.echo(tag)
        return
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.images.build import build_on_node
    from sparkdeploy.images.build_plan import node_checks
    from sparkdeploy.images.inventory_images import select_nodes
    from sparkdeploy.runtime.remote import NodeConnection

    inv = load_inventory(inventory)
    node = select_nodes(inv, [on_node])[0]
    with NodeConnection(node, inv) as conn:
        checks = node_checks(definition, conn)
    for check in checks:
        err.print(f"{node.name}: {check}", style=None if check.ok else "red")
    failed = [c for c in checks if not c.ok]
    if failed:
        raise StepFailed(f"{node.name}: not building {name}: " + "; ".join(f"{c.what}: {c.detail}" for c in failed))
    from sparkdeploy.deploy import serving  # what serves on the node: refused or stopped first (issue 43)

    serving.guard(inv, f"images build {name} --on {node.name}", [node.name], stop_deployments, err.print)
    base = definition.base_definition()
    if base is not None:
        err.print(f"[dim]{node.name}: making sure its base {base.name} is there[/dim]")
        _push_or_fail(base.name, inv, [node.name])
    with NodeConnection(node, inv) as conn, err.status(f"{node.name}: building {name}", spinner="dots") as status:

        def step(n: int, total: int, text: str) -> None:
            err.print(f"[dim]{node.name}: step {n}/{total}: {text[:100]}[/dim]")
            status.update(f"{node.name}: building {name}: step {n}/{total}")

        tag = build_on_node(name, conn, progress=lambda line: err.print(f"[dim]{line}[/dim]"), step=step)
    click.echo(f"{node.name}: {tag}")


# -- pull (registry images) ---------------------------------------------------------------------------------


@images.command("pull")
@click.argument("image")
@click.option("--on", "on_node", metavar="NODE", help="The node that pulls it (default: the head).")
@click.option("--dry-run", is_flag=True, help="Print what it would do; connect to nothing.")
@inventory_option
@json_option
@click.option("--recipes-dir", metavar="DIR", help="Your own recipes folder (for a recipe NAME).")
@click.pass_context
def pull_cmd(
    ctx: click.Context,
    image: str,
    on_node: str | None,
    dry_run: bool,
    inventory: str | None,
    as_json: bool,
    recipes_dir: str | None,
) -> None:
    """Pull registry image IMAGE (a reference, or a recipe NAME whose image is one) once, then spread it.

    \b
    One node pulls it with its own `docker pull` (credentials: `docker login REGISTRY` on that node, never
    on a command line); the digest the engine records (RepoDigests) must be the one pinned in the reference
    (no digest pinned: a warning names the one it resolved to); its vLLM CLI is read once from the image and
    kept by digest in the local state (so lint and --set checks work for it); then every other node gets it
    node to node over the fabric (`images push --from`'s chain: no image byte passes through this machine),
    and every node holds it with one image ID.

    \b
      sparkdeploy images pull nvcr.io/nvidia/vllm:26.01-py3@sha256:<64 hex> --on spark1
      sparkdeploy images pull 172.30.77.6:5000/lab/vllm-sim:v1 --inventory lab   # the lab's own registry
    """
    from sparkdeploy.cli.common import warn
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.images import registry_pull as registry
    from sparkdeploy.images.image_ref import parse_reference
    from sparkdeploy.images.inventory_images import select_nodes

    ref, vllm = _registry_image(image, recipes_dir)
    parse_reference(ref, "IMAGE", "reference")  # a bad reference fails before anything connects
    inv = load_inventory(inventory)
    nodes = select_nodes(inv)
    source = select_nodes(inv, [on_node])[0] if on_node else inv.head
    if dry_run:
        lines = registry.dry_run_lines(ref, nodes, source)
        if as_json:
            emit_json({"reference": ref, "on": source.name, "nodes": [n.name for n in nodes], "steps": lines})
        else:
            click.echo("\n".join(lines))
        return
    from sparkdeploy.runtime.locks import cluster_lock

    err = Console(stderr=True, highlight=False)
    with cluster_lock(inv):  # a pull changes the nodes: one run at a time per cluster
        result = registry.pull_and_spread(
            ref, inv, nodes, on=source, say=lambda line: err.print(f"[dim]{line}[/dim]"), read_vllm_cli=vllm
        )
    for line in result.warnings:
        warn(line)
    if as_json:
        emit_json(result.as_dict())
    else:
        click.echo(
            f"{result.node}: {'pulled' if result.pulled else 'has'} {ref} digest {result.digest} image "
            f"{_short(result.image_id)} (vLLM {result.vllm_version or 'unknown'}"
            + (", SIMULATED" if result.simulated else "")
            + ")"
        )
        for item in result.pushed:
            click.echo(f"{item['node']}: {item['action']} over the fabric from {result.node}")
        for node, why in sorted(result.failed.items()):
            click.secho(f"{node}: FAILED: {why}", fg="red")
    if result.failed:
        ctx.exit(1)


def _registry_image(image: str, recipes_dir: str | None) -> tuple[str, bool]:
    """`images pull IMAGE`: (the reference, whether it carries vLLM's CLI). A bare reference is a vLLM image; a
    recipe names its registry image and says its engine (SGLang's: no vLLM CLI to read)."""
    from sparkdeploy.images.image_ref import is_reference
    from sparkdeploy.recipes.recipe import load_recipe

    if is_reference(image):
        return image, True
    recipe, path, _ = load_recipe(image, recipes_dir)
    if not is_reference(recipe.image):
        from sparkdeploy.errors import ConfigError, Problem

        raise ConfigError(
            Problem(
                str(path),
                "image",
                f"{recipe.image} is an image definition, not a registry image",
                f"sparkdeploy images push {recipe.image}",
            )
        )
    return recipe.image, recipe.engine == "vllm"


# -- push -----------------------------------------------------------------------------------------------------


def _push_or_fail(name: str, inv: Inventory, nodes: list[str], compression: str = "auto") -> list[NodeOutcome]:
    from sparkdeploy.images.push import push_image
    from sparkdeploy.images.push_progress import RichPushProgress

    with RichPushProgress() as progress:
        outcomes = push_image(name, inv, nodes, progress, compression=compression)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise StepFailed("; ".join(str(o.error) for o in failed))
    return outcomes


@images.command("push")
@click.argument("name")
@click.option("--to", "to_nodes", multiple=True, metavar="NODE", help="Only these nodes (repeatable; default all).")
@click.option(
    "--compress",
    "compression",
    type=click.Choice(["auto", "zstd", "gzip", "none"]),
    default="auto",
    show_default=True,
    help="auto: zstd where the node has it, else gzip (docker load reads gzip).",
)
@click.option(
    "--layer-source",
    "reader",
    type=click.Choice(["auto", "store", "save"]),
    default="auto",
    show_default=True,
    help="Where the layers are read (with --from: on that node; its store through sudo -n). store: "
    "the engine's layer store, only the layers sent (needs read access to the Docker root, "
    "overlay2); save: `docker save` of the whole image first; "
    "auto: store when readable, else save.",
)
@click.option(
    "--from",
    "from_node",
    metavar="NODE",
    help="Send the image as NODE's engine has it (built there with `images build --on NODE`), "
    "from that node straight to the others over their fabric IPs (nothing passes through this "
    "machine); sets up node-to-node SSH with host keys checked first.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="With --from: print what each node lacks, the chain and fabric addresses, and the peer SSH "
    "keys and host keys it would add; change nothing.",
)
@inventory_option
@json_option
@click.pass_context
def push_cmd(
    ctx: click.Context,
    name: str,
    to_nodes: tuple[str, ...],
    compression: str,
    reader: str,
    from_node: str | None,
    dry_run: bool,
    inventory: str | None,
    as_json: bool,
) -> None:
    """Send image NAME (a definition, built here if missing, or a local REPO:TAG) to the nodes.

    Every node in parallel; a node with the image ID is skipped; otherwise only the layers it lacks travel,
    compressed, over SSH, and the tag is set only after the loaded image ID matches this machine's.
    With --from NODE the source is that node's engine: `docker save` there, filtered to the layers the
    targets lack, streamed over node-to-node SSH on the fabric IPs as a chain (source -> t1 -> t2 ...: each
    target loads it and forwards it as it arrives, so the source sends each byte once); this machine only
    starts it and reads progress lines. Each node's image ID must then equal the source's before the tag moves.
    """
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.images.inventory_images import select_nodes
    from sparkdeploy.images.push import push_image
    from sparkdeploy.images.push_progress import PushProgress, RichPushProgress
    from sparkdeploy.runtime.locks import cluster_lock

    inv = load_inventory(inventory)
    nodes = select_nodes(inv, list(to_nodes))  # a bad node name fails before anything connects
    if dry_run and not from_node:
        raise click.UsageError("--dry-run goes with --from NODE")
    if from_node:
        source = select_nodes(inv, [from_node])[0]
        if not to_nodes:
            nodes = [n for n in nodes if n.name != source.name]
        if dry_run:
            _push_from_dry_run(name, inv, source, nodes, compression, reader, as_json)
            return
        with cluster_lock(inv):  # a push changes the nodes: one run at a time per cluster
            _push_from(ctx, name, inv, source, nodes, compression, reader, as_json)
        return
    with cluster_lock(inv):  # a push changes the nodes: one run at a time per cluster
        if as_json:
            outcomes = push_image(name, inv, nodes, PushProgress(), compression=compression, reader=reader)
        else:
            with RichPushProgress() as progress:
                outcomes = push_image(name, inv, nodes, progress, compression=compression, reader=reader)
    failed = [o for o in outcomes if not o.ok]
    if as_json:
        emit_json(
            [
                dict(o.value.as_dict(), ok=True) if o.ok else {"node": o.node.name, "ok": False, "error": str(o.error)}
                for o in outcomes
            ]
        )
    else:
        _console().print(_push_table(f"images push {name}", outcomes, "sent", with_note=True))
    if failed:
        ctx.exit(1)


def _push_table(title: str, outcomes: list[NodeOutcome], sent: str, with_note: bool) -> Table:
    """One row per node: what the push did there (a sent push's note is its compression and reader, plus the
    plan's note with `with_note`), or FAILED and why. `sent` names the bytes column (sent, or received)."""
    table = Table(title=title, title_justify="left")
    for col in ("node", "result", "image ID", "layers sent", sent, "archive", "time", "note"):
        table.add_column(col, overflow="fold")
    for o in outcomes:
        if not o.ok:
            table.add_row(o.node.name, Text("FAILED", style="red"), "-", "-", "-", "-", "-", str(o.error))
            continue
        r = o.value
        note = r.note
        if r.action == "sent":
            note = f"{r.compression}, from {r.reader}" + (f"; {r.note}" if with_note and r.note else "")
        table.add_row(
            o.node.name,
            Text(r.action, style="green"),
            _short(r.image_id),
            f"{r.layers_sent}/{r.layers_total}",
            _size(r.bytes_sent),
            _size(r.raw_bytes),
            f"{r.seconds:.1f} s",
            note,
        )
    return table


def _push_from_dry_run(
    name: str, inv: Inventory, source: Node, nodes: list[Node], compression: str, reader: str, as_json: bool
) -> None:
    from sparkdeploy.images.push_from import plan_from

    plan, failed = plan_from(name, inv, source, nodes, compression, dry_run=True, reader=reader)
    lines = plan.lines() + [f"{o.node.name}: cannot read its images: {o.error}" for o in failed]
    if as_json:
        emit_json(
            {
                "source": source.name,
                "source_fabric_ip": source.fabric_address,
                "image": plan.image.tag,
                "image_id": plan.image.id,
                "chain": [
                    {"from": a.name, "from_ip": a.fabric_address, "to": b.name, "to_ip": b.fabric_address}
                    for a, b in plan.edges
                ],
                "nodes": {
                    n: {"action": p.action, "layers": p.layers_sent, "bytes": p.estimate} for n, p in plan.plans.items()
                },
                "refused": {n: str(e) for n, e in plan.refused.items()},
                "peer_ssh": plan.trust,
                "bytes": plan.estimate,
                "compression": plan.compression,
                "reader": plan.reader,
                "lines": lines,
            }
        )
    else:
        click.echo(f"images push {name} --from {source.name} (dry run: nothing changed)")
        for line in lines:
            click.echo(f"  {line}")


def _push_from(
    ctx: click.Context,
    name: str,
    inv: Inventory,
    source: Node,
    nodes: list[Node],
    compression: str,
    reader: str,
    as_json: bool,
) -> None:
    from sparkdeploy.images.push_from import push_from_node
    from sparkdeploy.images.push_progress import PushProgress, RichPushProgress

    if as_json:
        plan, outcomes, received = push_from_node(name, inv, source, nodes, PushProgress(), compression, reader=reader)
    else:
        with RichPushProgress() as progress:
            plan, outcomes, received = push_from_node(name, inv, source, nodes, progress, compression, reader=reader)
    if as_json:
        emit_json(
            {
                "source": source.name,
                "chain": [[a.name, a.fabric_address, b.name, b.fabric_address] for a, b in plan.edges],
                "bytes_through_this_machine": received,
                "nodes": [
                    dict(o.value.as_dict(), ok=True)
                    if o.ok
                    else {"node": o.node.name, "ok": False, "error": str(o.error)}
                    for o in outcomes
                ],
            }
        )
    else:
        title = f"images push {name} --from {source.name}" + (f" (chain {plan.chain_text()})" if plan.edges else "")
        _console().print(_push_table(title, outcomes, "received", with_note=False))
        if plan.edges:
            click.echo(
                f"through this machine: {_size(received) if received else '0 B'} of progress lines, no image bytes"
            )
    if any(not o.ok for o in outcomes):
        ctx.exit(1)


# -- list -----------------------------------------------------------------------------------------------------


@images.command("list")
@inventory_option
@json_option
@click.pass_context
def list_cmd(ctx: click.Context, inventory: str | None, as_json: bool) -> None:
    """Per node the images we manage, their IDs, and whether the nodes agree on each tag."""
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.images.inventory_images import list_images

    inv = load_inventory(inventory)
    outcomes, rows = list_images(inv)
    failed = [o for o in outcomes if not o.ok]
    if as_json:
        emit_json(
            {
                "nodes": {
                    o.node.name: (
                        {
                            "ok": True,
                            "images": [{"name": i.name, "tags": i.tags, "id": i.id} for i in o.value.managed()],
                            "partial_pushes": o.value.partials(),
                        }
                        if o.ok
                        else {"ok": False, "error": str(o.error)}
                    )
                    for o in outcomes
                },
                "tags": [{"tag": r.tag, "name": r.name, "ids": r.ids, "agree": r.agree} for r in rows],
            }
        )
    else:
        readable = [o.node.name for o in outcomes if o.ok]
        table = Table(title="images on the nodes (label io.sparkdeploy.image)", title_justify="left")
        table.add_column("tag", overflow="fold")
        for name in readable:
            table.add_column(name)
        table.add_column("nodes agree")
        for r in rows:
            table.add_row(
                r.tag,
                *[_short(r.ids.get(n)) for n in readable],
                Text("yes", style="green") if r.agree else Text("no", style="red"),
            )
        _console().print(table)
        if not rows:
            click.echo("no managed images on the nodes")
        for o in outcomes:
            for image_id, count in (o.value.partials() if o.ok else {}).items():
                click.echo(
                    f"{o.node.name}: a cut push of {_short(image_id)} left {count} partial image(s); "
                    f"pushing that image again resumes it and removes them"
                )
        for o in failed:
            click.secho(f"error: {o.error}", fg="red", err=True)
    if failed:
        ctx.exit(1)
