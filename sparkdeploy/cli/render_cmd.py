"""`sparkdeploy render NAME --topology T --out DIR`: write the rendered files, one folder per node."""

from __future__ import annotations

import os
from pathlib import Path

import click

from sparkdeploy.cli.common import deployment_options, emit_json, json_option, warn
from sparkdeploy.runtime.localfiles import open_folder, open_subfolder, write_atomic
from sparkdeploy.topologies.context import load_deployment


@click.command("render")
@click.argument("recipe")
@deployment_options
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to write into.")
@click.option(
    "--with-secrets",
    is_flag=True,
    help="Write secrets.env with the real values (mode 0600; --out must then be your own folder that "
    "others cannot write). Without it the values are masked.",
)
@json_option
def render_cmd(
    recipe: str,
    topology: str | None,
    backend: str | None,
    inventory: str | None,
    sets: tuple[str, ...],
    recipes_dir: str | None,
    out_dir: str,
    with_secrets: bool,
    as_json: bool,
) -> None:
    """Render RECIPE for a topology into OUT/<node>/, exactly as `up` would write it to each node's state dir.

    Nothing connects to any node. Example: sparkdeploy render openai-gpt-oss-120b -t 2xsolo --out ./rendered
    """
    dep = load_deployment(inventory, recipe, topology, backend, sets, recipes_dir)
    written = []
    private = with_secrets and any(f.secret for nd in dep.nodes for f in nd.files)
    out_fd = open_folder(Path(out_dir), private)
    try:
        for nd in dep.nodes:
            folder = Path(out_dir) / nd.node.name
            node_fd = open_subfolder(out_fd, nd.node.name, folder, private)
            try:
                for f in nd.files:
                    content = f.content if (with_secrets or not f.secret) else f.shown()
                    write_atomic(node_fd, f.name, content, f.mode, folder / f.name)
                    written.append(
                        {
                            "node": nd.node.name,
                            "path": str(folder / f.name),
                            "mode": f"{f.mode:04o}",
                            "secret": f.secret,
                        }
                    )
            finally:
                os.close(node_fd)
    finally:
        os.close(out_fd)
    if as_json:
        emit_json({"files": written, "warnings": dep.warnings})
        return
    for w in dep.warnings:
        warn(w)
    for item in written:
        click.echo(f"{item['mode']} {item['path']}")
