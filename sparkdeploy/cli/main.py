"""`sparkdeploy`: the command groups, registered in one place.

Commands are imported only when used, so `sparkdeploy images push` does not pay for importing the bench
or doctor code (the CLI starts in a fraction of a second).
"""

from __future__ import annotations

import importlib

import click

from sparkdeploy import __version__
from sparkdeploy.cli.common import CONTEXT_SETTINGS, run_cli

# name -> "module:attribute", in the order `--help` lists them. A new command is one line here.
COMMANDS = {
    "run-recipe": "sparkdeploy.cli.run_recipe:run_recipe",
    "up": "sparkdeploy.cli.up_cmd:up",
    "down": "sparkdeploy.cli.up_cmd:down",
    "status": "sparkdeploy.cli.up_cmd:status",
    "keys": "sparkdeploy.cli.keys_cmd:keys",
    "logs": "sparkdeploy.cli.logs_cmd:logs",
    "top": "sparkdeploy.cli.top_cmd:top",
    "postmortem": "sparkdeploy.cli.postmortem_cmd:postmortem_cmd",
    "doctor": "sparkdeploy.cli.doctor_cmd:doctor",
    "bench": "sparkdeploy.cli.bench_cmd:bench",
    "advise": "sparkdeploy.cli.bench_cmd:advise",
    "images": "sparkdeploy.cli.images_cmd:images",
    "models": "sparkdeploy.cli.models_cmd:models",
    "lab": "sparkdeploy.cli.lab:lab",
    "recipes": "sparkdeploy.cli.recipes_cmd:recipes_group",
    "render": "sparkdeploy.cli.render_cmd:render_cmd",
    "trust": "sparkdeploy.cli.trust_cmd:trust",
    "history": "sparkdeploy.cli.history_cmd:history",
    "rollback": "sparkdeploy.cli.history_cmd:rollback",
    "init": "sparkdeploy.cli.init_cmd:init",
    "setup": "sparkdeploy.cli.setup_cmd:setup",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="sparkdeploy")
def cli() -> None:
    """Serve models on clusters of NVIDIA DGX Spark machines.

    \b
    Typical use:
      sparkdeploy lab up                                   # a virtual two-Spark cluster (no GPU needed)
      run-recipe openai-gpt-oss-120b --inventory lab       # serve a recipe with its default topology
      sparkdeploy status --inventory lab                   # what runs where, health, endpoint
      sparkdeploy doctor --inventory lab                   # host, GPU, network, RoCE checks with fixes
      sparkdeploy recipes list                             # what can be served
      run-recipe openai-gpt-oss-120b --dry-run             # every file and command, nothing changed

    Exit codes: 0 ok, 1 a check or step failed, 2 bad usage or configuration.
    """


def main(argv: list[str] | None = None) -> None:
    raise SystemExit(run_cli(cli, argv))
