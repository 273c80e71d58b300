"""`run-recipe NAME`: serve a recipe on the inventory's nodes with its default topology.

It is `sparkdeploy up --recipe NAME --topology <the recipe's default>`.
"""

from __future__ import annotations

import click

from sparkdeploy.cli.common import CONTEXT_SETTINGS, UpArgs, emit_json, run_cli, up_options
from sparkdeploy.topologies.context import DeploymentSource, load_source
from sparkdeploy.topologies.dryrun import as_text, describe

DRY_RUN_HELP = (
    "Print, per node and in order, every file and command; connect to nothing, change nothing "
    "(`up --dry-run` also reads the nodes' state)."
)


def print_dry_run(source: DeploymentSource, as_json: bool) -> None:
    desc = describe(source.render())
    if as_json:
        emit_json(desc)
    else:
        click.echo(as_text(desc), nl=False)


@click.command("run-recipe", context_settings=CONTEXT_SETTINGS)
@click.argument("recipe")
@up_options(DRY_RUN_HELP)
def run_recipe(recipe: str, up_args: UpArgs, as_json: bool) -> None:
    """Serve RECIPE on your Sparks with the recipe's default topology: `sparkdeploy up --recipe RECIPE`, with
    up's options.

    \b
    Examples:
      run-recipe openai-gpt-oss-120b --dry-run                  # what would be written and run
      run-recipe openai-gpt-oss-120b -t 2xsolo --inventory lab  # two engines behind LiteLLM, in the lab
      run-recipe qwen3-coder-30b-int4 --set vllm.max_model_len=32768
    """
    a = up_args  # the inventory read and the recipe resolved once, here: the dry run and `up` render them
    source = load_source(a.inventory, recipe, a.topology, a.backend, a.sets, a.recipes_dir, a.node, a.metrics)
    if up_args.dry_run:
        print_dry_run(source, as_json)
        return
    from sparkdeploy.cli.up_cmd import run_up  # the dry run above needs neither the pipeline nor rich

    run_up(as_json, recipe, up_args, source)


def main(argv: list[str] | None = None) -> None:
    raise SystemExit(run_cli(run_recipe, argv))
