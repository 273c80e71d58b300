"""`sparkdeploy render NAME --topology T --out DIR`: write the rendered files, one folder per node."""

from __future__ import annotations

import os
from pathlib import Path

import click

from sparkdeploy.cli.common import (deployment_options, emit_json, json_option, warn)
from sparkdeploy.context import load_deployment


@click.command("render")
@click.argument("recipe")
@deployment_options
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder to write into.")
@click.option("--with-secrets", is_flag=True,
              help="Write secrets.env with the real values (mode 0600). Without it the values are masked.")
@json_option
def render_cmd(recipe, topology, backend, inventory, sets, recipes_dir, out_dir, with_secrets, as_json):
    """Render RECIPE for a topology into OUT/<node>/, exactly as `up` would write it to each node's state dir.

    Nothing connects to any node. Example: sparkdeploy render openai-gpt-oss-120b -t 2xsolo --out /tmp/r
    """
    dep = load_deployment(inventory, recipe, topology, backend, sets, recipes_dir)
    written = []
    for nd in dep.nodes:
        folder = Path(out_dir) / nd.node.name
        folder.mkdir(parents=True, exist_ok=True)
        for f in nd.files:
            path = folder / f.name
            content = f.content if (with_secrets or not f.secret) else f.shown()
            # Create with the final mode so a secret file is never readable by others, even briefly.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, f.mode)
            with os.fdopen(fd, "w") as fh:
                fh.write(content)
            os.chmod(path, f.mode)
            written.append({"node": nd.node.name, "path": str(path), "mode": f"{f.mode:04o}", "secret": f.secret})
    if as_json:
        emit_json({"files": written, "warnings": dep.warnings})
        return
    for w in dep.warnings:
        warn(w)
    for item in written:
        click.echo(f"{item['mode']} {item['path']}")
