"""`sparkdeploy`: the command groups, registered in one place."""

from __future__ import annotations

import click

from sparkdeploy import __version__
from sparkdeploy.cli.common import run_cli
from sparkdeploy.cli.recipes_cmd import recipes_group
from sparkdeploy.cli.render_cmd import render_cmd
from sparkdeploy.cli.run_recipe import run_recipe

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="sparkdeploy")
def cli():
    """Serve models on clusters of NVIDIA DGX Spark machines.

    \b
    Typical use:
      sparkdeploy lab up                                   # a virtual two-Spark cluster (no GPU needed)
      run-recipe openai-gpt-oss-120b --inventory lab       # serve a recipe with its default topology
      sparkdeploy recipes list                             # what can be served
      run-recipe openai-gpt-oss-120b --dry-run             # every file and command, nothing changed

    Exit codes: 0 ok, 1 a check or step failed, 2 bad usage or configuration.
    """


COMMANDS = [recipes_group, render_cmd, run_recipe]


def _optional(module: str, attr: str):
    """Command groups built by other parts of the project register here once they exist."""
    import importlib

    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("sparkdeploy"):
            return None
        raise


for _module, _attr in [("sparkdeploy.cli.lab", "lab"), ("sparkdeploy.cli.up_cmd", "up"), ("sparkdeploy.cli.up_cmd", "down"), ("sparkdeploy.cli.up_cmd", "status"), ("sparkdeploy.cli.trust_cmd", "trust"),
                       ("sparkdeploy.cli.bench_cmd", "bench"),
                       ("sparkdeploy.cli.bench_cmd", "advise"),
                       ("sparkdeploy.cli.doctor_cmd", "doctor"),
                       ("sparkdeploy.cli.images_cmd", "images")]:
    _cmd = _optional(_module, _attr)
    if _cmd is not None:
        COMMANDS.append(_cmd)

for _cmd in COMMANDS:
    cli.add_command(_cmd)


def main(argv: list[str] | None = None) -> None:
    raise SystemExit(run_cli(cli, argv))
