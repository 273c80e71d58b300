"""`run-recipe NAME`: serve a recipe on the inventory's nodes with its default topology.

It is `sparkdeploy up --recipe NAME --topology <the recipe's default>`.
"""

from __future__ import annotations

import click

from sparkdeploy.cli.common import deployment_options, emit_json, json_option, run_cli, timeout_option
from sparkdeploy.context import load_deployment
from sparkdeploy.dryrun import as_text, describe


def print_dry_run(recipe, topology, backend, inventory, sets, recipes_dir, node, as_json) -> None:
    dep = load_deployment(inventory, recipe, topology, backend, sets, recipes_dir, node)
    desc = describe(dep)
    if as_json:
        emit_json(desc)
    else:
        click.echo(as_text(desc), nl=False)


@click.command("run-recipe")
@click.argument("recipe")
@deployment_options
@click.option("--node", metavar="NAME", help="solo only: the node to run on (default: the head).")
@click.option("--dry-run", is_flag=True, help="Print, per node and in order, every file and command; change nothing.")
@timeout_option
@json_option
def run_recipe(recipe, topology, backend, inventory, sets, recipes_dir, node, dry_run, timeout, as_json):
    """Serve RECIPE on your Sparks with the recipe's default topology.

    \b
    Examples:
      run-recipe openai-gpt-oss-120b --dry-run                  # what would be written and run
      run-recipe openai-gpt-oss-120b -t 2xsolo --inventory lab  # two engines behind LiteLLM, in the lab
      run-recipe qwen3-coder-30b-int4 --set vllm.max_model_len=32768
    """
    if dry_run:
        print_dry_run(recipe, topology, backend, inventory, sets, recipes_dir, node, as_json)
        return
    from sparkdeploy.cli import up_cmd

    up_cmd.deploy(recipe=recipe, topology=topology, backend=backend, inventory=inventory, sets=sets,
                  recipes_dir=recipes_dir, node=node, as_json=as_json, timeout=timeout)


def main(argv: list[str] | None = None) -> None:
    raise SystemExit(run_cli(run_recipe, argv))
