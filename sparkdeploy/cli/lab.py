"""`sparkdeploy lab up | down | status | registry`: the virtual two-Spark cluster (see sparkdeploy/lab/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from sparkdeploy.cli.common import emit_json, json_option, stop_deployments_option
from sparkdeploy.config.userfile import load_json_file
from sparkdeploy.images.build import docker_client
from sparkdeploy.lab import bare as bare_lab
from sparkdeploy.lab import lifecycle
from sparkdeploy.lab import network as lab_network
from sparkdeploy.lab import nodestatus as lab_status
from sparkdeploy.lab.spec import DEFAULT_FABRIC_SUBNET, DEFAULT_IMAGES, DEFAULT_MGMT_SUBNET, DEFAULT_NAME, LabSpec

BARE_NAME = "bare"
name_option = click.option(
    "--name", default=DEFAULT_NAME, show_default=True, help="Lab name: several labs can coexist on their own subnets."
)


def _spec(
    name: str,
    nodes: int = 2,
    subnet: str | None = None,
    fabric_subnet: str | None = None,
    images: str = ",".join(DEFAULT_IMAGES),
    seed: bool = False,
    bare: bool = False,
) -> LabSpec:
    subnets: dict[str, Any] = {k: v for k, v in (("mgmt_subnet", subnet), ("fabric_subnet", fabric_subnet)) if v}
    if bare and not subnets:  # beside the default lab (which SPARKDEPLOY_LAB_SUBNETS may have moved): free ones
        subnets = dict(zip(("mgmt_subnet", "fabric_subnet"), lab_network.free_subnets(docker_client()), strict=True))
    return LabSpec(
        name=name,
        nodes=nodes,
        images=tuple(i.strip() for i in images.split(",") if i.strip()),
        seed=seed,
        bare=bare,
        **subnets,
    )


def _print_table(rows: list[lab_status.NodeStatus], title: str) -> None:
    table = Table(title=title, title_justify="left")
    for col in ("node", "state", "mgmt ip", "fabric ip", "fabric iface", "ssh", "dockerd", "storage"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.node,
            r.state,
            r.mgmt_ip,
            r.fabric_ip,
            r.fabric_iface or "-",
            "ok" if r.ssh else "no",
            "ok" if r.dockerd else "no",
            r.storage_driver or "-",
        )
    out = Console()
    if not out.is_terminal:  # a pipe or a CI log: don't squeeze the IPs into 80 columns
        out = Console(width=120)
    out.print(table)


@click.group()
def lab() -> None:
    """A virtual cluster of DGX Sparks in Docker: real sshd, Docker and jumbo-frame networks; GPU SIMULATED."""


def _serving_guard(spec: LabSpec, doing: str, stop_deployments: bool) -> Callable[[list[str]], None]:
    """before_replace for lifecycle.up, and the check before `lab down`: the lab's deployments on those nodes
    refused or stopped (deploy/serving.py), read over SSH with the lab's inventory; no inventory (a bare lab, or
    none made yet): nothing of ours can run there."""

    def check(node_names: list[str]) -> None:
        if not node_names or not spec.inventory_path.is_file():
            return
        from sparkdeploy.config.inventory import load_inventory
        from sparkdeploy.deploy import serving  # the fact layer and sessions: only when a node would go

        serving.guard(load_inventory(str(spec.inventory_path)), doing, node_names, stop_deployments, click.echo)

    return check


@lab.command("up")
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 20), help="How many nodes.")
@click.option("--rebuild", is_flag=True, help="Rebuild the lab images from scratch and recreate the nodes.")
@name_option
@click.option("--subnet", default=None, help=f"Management subnet (SSH).  [default: {DEFAULT_MGMT_SUBNET}]")
@click.option(
    "--fabric-subnet",
    default=None,
    help=f"Fabric subnet (MTU 9000, stands in for the ConnectX-7 link).  [default: {DEFAULT_FABRIC_SUBNET}]",
)
@click.option(
    "--images",
    default=",".join(DEFAULT_IMAGES),
    show_default=True,
    help="Engine images to preload into every node (comma separated; '' for none).",
)
@click.option(
    "--no-preload",
    is_flag=True,
    help="Preload no engine image: `up` pushes the images a recipe needs when it first needs them "
    "(what scripts/demo.sh does: it serves one topology, so it builds and pushes only its image).",
)
@click.option(
    "--seed",
    is_flag=True,
    help="Push the engine images to the first node only, then copy its image store into the other empty "
    "nodes (lab setup: skips a docker load per node; every node's image ID is still checked).",
)
@click.option(
    "--bare",
    is_flag=True,
    help="Nodes as a new pair of Sparks arrives (lab name `bare` unless --name): password login only, the fabric "
    "link up without addresses at MTU 1500, interface names differing per node, netplan.io; no inventory "
    "(run `sparkdeploy init`), no preloaded images.",
)
@stop_deployments_option
@json_option
def up_cmd(
    nodes: int,
    rebuild: bool,
    name: str,
    subnet: str | None,
    fabric_subnet: str | None,
    images: str,
    no_preload: bool,
    seed: bool,
    bare: bool,
    stop_deployments: bool,
    as_json: bool,
) -> None:
    """Create or repair the lab (idempotent) and write its inventory.

    \b
    Examples:
      sparkdeploy lab up                      two nodes, engine images preloaded
      sparkdeploy lab up --no-preload         two nodes; `run-recipe` pushes what it needs
      sparkdeploy lab up --nodes 4 --name lab4 --seed   four nodes beside the default lab
      sparkdeploy lab up --bare               two new Sparks: start day zero with `sparkdeploy init`
    """
    if bare and name == DEFAULT_NAME:
        name = BARE_NAME
    spec = _spec(name, nodes, subnet, fabric_subnet, "" if (no_preload or bare) else images, seed, bare)
    result = lifecycle.up(
        spec, rebuild=rebuild, before_replace=_serving_guard(spec, "lab up (replacing the node)", stop_deployments)
    )
    if as_json:
        emit_json(
            {
                "inventory": result.inventory,
                "seconds": round(result.seconds, 1),
                "phases": result.phases,
                "created": result.created,
                "started": result.started,
                "seeded": result.seeded,
                "images": [vars(i) for i in result.images],
                "nodes": lab_status.status_dicts(result.nodes),
            }
        )
        return
    _print_table(
        result.nodes,
        f"lab {spec.name}: up in {result.seconds:.1f} s ({len(result.created)} created, {len(result.started)} started)",
    )
    for item in result.images:
        if item.skipped:
            click.echo(f"image {item.image}: skipped ({item.skipped})")
        else:
            click.echo(
                f"image {item.tag}: loaded on {', '.join(item.loaded) or 'none'}; "
                f"already on {', '.join(item.present) or 'none'}"
            )
    click.echo("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.phases.items()))
    if spec.bare:
        notes = load_json_file(result.inventory, "bare lab notes")
        hosts = ", ".join(notes["hosts"])
        click.echo(f"bare nodes: {hosts} (user {notes['user']}; password in {notes['password_file']})")
        click.echo("next, the README's day-zero commands, in a folder of your own (the password they ask for is in")
        click.echo(f"{notes['password_file']}; `--password-file PATH` instead of `--ask-password` in a script):")
        for command in bare_lab.dayzero_commands(notes["hosts"], notes["user"]):
            click.echo(f"  {command}")
        click.echo(
            "`init` finds these hosts in this lab's notes and writes the lab's settings into the inventory "
            f"(the SIMULATED engine, its model hub and secrets, fabric subnet {notes['fabric_subnet']})."
        )
        click.echo("GPU, RDMA and link speed on these nodes are SIMULATED; so is systemd-networkd (netplan's backend).")
        return
    hint = "--inventory lab" if spec.name == DEFAULT_NAME else f"--inventory {result.inventory}"
    click.echo(f"inventory: {result.inventory}   (deploy with {hint})")
    click.echo("GPU, RDMA and link speed on these nodes are SIMULATED.")


@lab.command("down")
@name_option
@click.option(
    "--all",
    "all_labs",
    is_flag=True,
    help="Every lab on this engine (label io.sparkdeploy.lab=1); with SPARKDEPLOY_LAB_INSTANCE set, only its labs.",
)
@click.option("--purge", is_flag=True, help="Also delete the lab's keys and secrets on this machine.")
@stop_deployments_option
@json_option
def down_cmd(name: str, all_labs: bool, purge: bool, stop_deployments: bool, as_json: bool) -> None:
    """Remove the lab's containers, networks and volumes, and nothing else.

    A deployment that serves on the lab (its inventory's; with --all, the named lab's only) is named and refused,
    unless --stop-deployments (it is stopped cleanly first)."""
    spec = _spec(name)
    _serving_guard(spec, "lab down", stop_deployments)([n.name for n in spec.node_specs()])
    removed = lifecycle.down(spec, all_labs=all_labs, purge=purge)
    if as_json:
        emit_json(removed)
        return
    for kind, names in removed.items():
        click.echo(f"removed {len(names)} {kind}{': ' + ', '.join(names) if names else ''}")


@lab.command("status")
@name_option
@json_option
def status_cmd(name: str, as_json: bool) -> None:
    """Nodes, IPs and state. Exit 1 when the lab is not up or a node is unhealthy."""
    spec = _spec(name)
    rows = lab_status.status(spec)
    if as_json:
        emit_json({"name": spec.name, "inventory": str(spec.inventory_path), "nodes": lab_status.status_dicts(rows)})
    elif rows:
        _print_table(rows, f"lab {spec.name}")
    lab_status.fail_if_not_up(rows, spec)


@lab.command("registry")
@name_option
@click.option("--tag", default="demo", show_default=True, help="The tag to publish the lab's vllm-sim under.")
@json_option
def registry_cmd(name: str, tag: str, as_json: bool) -> None:
    """Start the lab's container registry (Debian's docker-registry, MGMT .6:5000, plain HTTP: the lab nodes'
    engines, and only they, trust it) and publish the lab's vllm-sim into it as lab/vllm-sim:TAG (with a label
    of its own, so no node has that image yet). Prints the reference pinned with its digest, for a recipe's
    `image:` or `sparkdeploy images pull REF --inventory lab`. Needs the lab up."""
    from sparkdeploy.images.build import docker_client
    from sparkdeploy.images.definitions import load_definition
    from sparkdeploy.lab import registry_server as registry

    spec = _spec(name)
    client = docker_client()
    lab_status.fail_if_not_up(lab_status.status(spec, client), spec)
    address = registry.ensure(client, spec, say=lambda line: click.echo(line, err=True))
    ref = registry.publish(client, spec, load_definition("vllm-sim").tag, "lab/vllm-sim", tag, tag)
    if as_json:
        emit_json({"registry": address, "reference": ref})
    else:
        click.echo(ref)
