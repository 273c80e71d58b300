"""Options and helpers shared by the commands: inventory/recipe loading, --json output, error reporting."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from sparkdeploy.config.userfile import redact
from sparkdeploy.deploy import DEFAULT_TIMEOUT_S
from sparkdeploy.errors import ConfigError, escape_controls

# Every entry point's context (the `sparkdeploy` group and the `run-recipe` console script): -h is --help.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
MAX_TIMEOUT_S = 7 * 24 * 3600.0
Command = Callable[..., None]  # a command's callback, before and after the decorators that reshape its arguments


def _finite_timeout(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not (1 <= value <= MAX_TIMEOUT_S):  # also false for nan
        raise click.BadParameter(f"{value!r} is not a number of seconds from 1 to {MAX_TIMEOUT_S:g}")
    return value


timeout_option = click.option(
    "--timeout",
    type=float,
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    callback=_finite_timeout,
    help="Seconds the health gate waits, in all, for /health and a real chat completion.",
)

inventory_option = click.option(
    "--inventory",
    "-i",
    "inventory",
    metavar="PATH|lab",
    envvar="SPARKDEPLOY_INVENTORY",
    help="Inventory file (default ./inventory.yaml; `lab` is the lab's). Env: SPARKDEPLOY_INVENTORY.",
)
recipes_dir_option = click.option(
    "--recipes-dir",
    metavar="DIR",
    envvar="SPARKDEPLOY_RECIPES_DIR",
    help="A folder of your own recipes, searched before the shipped ones (also SPARKDEPLOY_RECIPES).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of tables.")
# Commands that would break what serves refuse, naming it, unless told (sparkdeploy/deploy/serving.py).
stop_deployments_option = click.option(
    "--stop-deployments",
    "stop_deployments",
    is_flag=True,
    help="Stop the deployments this would break, cleanly, first (restart policy no, then docker stop); "
    "`sparkdeploy up` starts them again. Without it, such a run is refused and changes nothing.",
)
set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override any recipe field, e.g. --set vllm.max_model_len=8192 (repeatable; YAML values).",
)


class RegistryChoice(click.Choice[str]):
    """A choice among the names of a registry, read when first needed (--help or a value to check), so commands that
    never take the option do not pay for importing the registry."""

    def __init__(self, names: Callable[[], list[str]]) -> None:
        super().__init__([])
        self._names = names

    @property  # type: ignore[override]  # click's tuple attribute, here a list read when needed
    def choices(self) -> list[str]:
        return self._names()

    @choices.setter
    def choices(self, _value: object) -> None:
        pass


def _topologies() -> list[str]:
    from sparkdeploy.topologies import REGISTRY  # pydantic and the renderer: only for commands taking --topology

    return list(REGISTRY)


def _backends() -> list[str]:
    from sparkdeploy.topologies import REGISTRY

    return list(dict.fromkeys(b for t in REGISTRY.values() for b in t.backends))


topology_option = click.option(
    "--topology",
    "-t",
    type=RegistryChoice(_topologies),
    default=None,
    help="solo: one node; cluster: one engine over every node (TP=N, or --tp k with PP=N/k); 2xsolo: one engine "
    "per node behind LiteLLM; replicas: N/k engines of TP=k behind LiteLLM (--tp, default 2). "
    "Default: the recipe's default_topology.",
)
backend_option = click.option(
    "--backend",
    "-b",
    type=RegistryChoice(_backends),
    default=None,
    help="How cluster and replicas launch their ranks (default: the recipe's cluster_backend).",
)
tp_option = click.option(
    "--tp",
    "tp",
    type=click.IntRange(1, 64),
    default=None,
    metavar="K",
    help="Nodes per tensor-parallel engine (cluster: PP takes the rest; replicas: N/K engines). "
    "Checked against the model's heads. Same as --set tensor_parallel=K.",
)


def _tp_into_sets(command: Command) -> Command:
    """--tp K is --set tensor_parallel=K: one recipe field carries it through resolve, render and `recipes show`."""

    @functools.wraps(command)
    def wrapper(*args: Any, tp: int | None = None, sets: tuple[str, ...] = (), **kwargs: Any) -> None:
        if tp is not None:
            sets = (*sets, f"tensor_parallel={tp}")
        return command(*args, sets=sets, **kwargs)

    return wrapper


def deployment_options(command: Command) -> Command:
    """The options every command that renders a deployment takes: topology, backend, --tp, inventory, --set,
    recipes dir (one place, so run-recipe, up and render cannot drift apart)."""
    command = _tp_into_sets(command)
    for option in reversed(
        (topology_option, backend_option, tp_option, inventory_option, set_option, recipes_dir_option)
    ):
        command = option(command)
    return command


UP_DRY_RUN_HELP = "Read the nodes' state and print the plan; change nothing."


@dataclass(frozen=True)
class UpArgs:
    """The values of up_options, named as deploy.up.deploy's keywords: a command hands them on whole."""

    topology: str | None
    backend: str | None
    inventory: str | None
    sets: tuple[str, ...]
    recipes_dir: str | None
    node: str | None
    dry_run: bool
    metrics: bool | None
    pull_model: bool
    fabric_gate_on: bool
    timeout: float


def _into_up_args(command: Command) -> Command:
    """The command gets up_options' values as one `up_args: UpArgs`, not a dozen parameters of its own."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        up_args = UpArgs(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(UpArgs)})
        return command(*args, up_args=up_args, **kwargs)

    return wrapper


def up_options(dry_run_help: str = UP_DRY_RUN_HELP) -> Callable[[Command], Command]:
    """The options of `up` after --recipe, defined once: `run-recipe NAME` is `up --recipe NAME` and takes exactly
    these (tests/test_cli.py compares the two commands), and receives them as one UpArgs (`up_args`; --json stays
    `as_json`). Only --dry-run's help is the caller's: run-recipe's dry run prints every file and command without
    connecting, up's reads the nodes' state first."""

    def decorate(command: Command) -> Command:
        command = _into_up_args(command)
        for option in reversed(
            (
                click.option("--node", metavar="NAME", help="solo only: the node to run on (default: the head)."),
                click.option("--dry-run", is_flag=True, help=dry_run_help),
                click.option(
                    "--metrics/--no-metrics",
                    default=None,
                    help="Also run Prometheus on the head node, scraping every engine and the proxy (default: "
                    "the inventory's cluster.metrics; set it there to keep Prometheus on later runs).",
                ),
                click.option(
                    "--pull-model",
                    is_flag=True,
                    help="When the recipe's model is missing or incomplete on an engine node, pull it (download "
                    "once on the head, copy over the fabric) instead of failing preflight.",
                ),
                click.option(
                    "--no-fabric-gate",
                    "fabric_gate_on",
                    flag_value=False,
                    default=True,
                    help="cluster/replicas: skip the fabric gate (before any engine starts, the all-reduce probe in "
                    "the serving image over the fabric and the same NCCL, CUDA, driver and image ID on every node; "
                    "skipped anyway when no engine changes). The output says it was skipped.",
                ),
                timeout_option,
                json_option,
            )
        ):
            command = option(command)
        return deployment_options(command)  # listed first in --help, as they always were

    return decorate


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def warn(message: str) -> None:
    click.secho(f"warning: {escape_controls(message)}", fg="yellow", err=True)


PROBLEMS_SHOWN = 20  # a flood of problems (300 clashing deployments) is cut to the first 20 and a count


def report_error(exc: Exception) -> int:
    """Print a user error without a traceback, one line per problem (the first PROBLEMS_SHOWN, then how many
    more); return its exit code."""
    from sparkdeploy.errors import SparkdeployError

    if isinstance(exc, ConfigError):
        for problem in exc.problems[:PROBLEMS_SHOWN]:
            click.secho(f"error: {redact(str(problem))}", fg="red", err=True)
        more = len(exc.problems) - PROBLEMS_SHOWN
        if more > 0:
            click.secho(
                f"error: ... and {more} more problem(s) like these: fix the ones above, then run it again",
                fg="red",
                err=True,
            )
    elif isinstance(exc, SparkdeployError):
        text = "\n".join(escape_controls(line) for line in str(exc).split("\n"))
        click.secho(f"error: {redact(text)}", fg="red", err=True)
    return getattr(exc, "exit_code", 1)


def run_cli(command: click.Command, argv: list[str] | None = None) -> int:
    """Run a click command with sparkdeploy's error contract: user errors are one line each, no traceback.
    SIGINT and SIGTERM stop any command the same way (sparkdeploy/runtime/interrupts.py): exit 130 or 143."""
    from sparkdeploy.runtime import interrupts

    with interrupts.handling():
        code = _run(command, argv)
        if interrupts.received() is not None:
            if code != 0:  # what the stop left unfinished failed with it: the exit code says which signal
                code = interrupts.exit_code()
            interrupts.exit_now(code)  # threads still blocked in an SSH read are not waited for
    return code


def _run(command: click.Command, argv: list[str] | None) -> int:
    from sparkdeploy.errors import SparkdeployError
    from sparkdeploy.runtime import interrupts

    try:
        # Without standalone mode click returns a command's exit code (ctx.exit / Exit) instead of raising.
        code = command.main(args=argv, standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool):
            return code
    except SparkdeployError as exc:
        return report_error(exc)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:  # click turns a KeyboardInterrupt into Abort
        if interrupts.received() is not None:
            click.echo(f"stopped ({interrupts.name()})", err=True)
        else:
            click.echo("aborted" if isinstance(exc, click.exceptions.Abort) else "interrupted", err=True)
        return interrupts.exit_code()
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return 0


def exit_with(code: int) -> None:
    sys.exit(code)
