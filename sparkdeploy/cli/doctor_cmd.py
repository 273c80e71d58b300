"""`sparkdeploy doctor`: check the nodes, the link and a running topology; `--nccl` measures all-reduce."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import click

from sparkdeploy.cli.common import emit_json, inventory_option, json_option, recipes_dir_option, topology_option
from sparkdeploy.errors import StepFailed

if TYPE_CHECKING:
    from sparkdeploy.doctor.runner import Report


def _size(text: str | None) -> int | None:
    if not text:
        return None
    from sparkdeploy.doctor.probe.allreduce_probe import parse_size

    try:
        return parse_size(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: a size like 64M or 256MiB") from None


@click.command("doctor")
@inventory_option
@click.option(
    "--recipe",
    "-r",
    default=None,
    metavar="NAME",
    help="Recipe whose image, memory, ports and model (with its speculative draft) to check "
    "(default: what the nodes run, else cluster.default_recipe).",
)
@topology_option
@recipes_dir_option
@click.option(
    "--only",
    "only",
    multiple=True,
    metavar="ID",
    help="Run only checks whose id starts with ID (repeatable): e.g. --only network --only gpu.driver.",
)
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option(
    "--nccl",
    is_flag=True,
    help="Also run the all-reduce probe in the recipe's image over the fabric (SIMULATED gloo/CPU in the lab); "
    "its 4 KiB eager vs CUDA-graph figures say whether the recipe should keep graphs, cut them at the "
    "all-reduce or enforce eager.",
)
@click.option("--nccl-max-bytes", default=None, metavar="SIZE", help="Largest probe message (default 256M; lab 64M).")
@click.option(
    "--tests",
    "tests",
    multiple=True,
    metavar="PATH",
    help="Also run your own testinfra modules (a file or a folder; repeatable) on every node, with testinfra's "
    "`host` fixture over sparkdeploy's SSH (pinned host keys, sudo -n python3) and the fixtures `node` and `cluster`; "
    "one row per test. @spark runs the shipped example checks of a DGX Spark. The inventory's "
    "cluster.doctor_tests adds them to every run.",
)
@click.option("--list", "list_checks", is_flag=True, help="List the checks and exit.")
@click.option(
    "--deployment",
    metavar="NAME",
    help="A stack's (`up --stack`): only this deployment's endpoints and recipe checks (the gateway is `gateway`). "
    "Default: every one.",
)
@json_option
def doctor(
    inventory: str | None,
    recipe: str | None,
    topology: str | None,
    recipes_dir: str | None,
    only: tuple[str, ...],
    strict: bool,
    nccl: bool,
    nccl_max_bytes: str | None,
    tests: tuple[str, ...],
    list_checks: bool,
    deployment: str | None,
    as_json: bool,
) -> None:
    """Check every node: access, Docker, GPU, image, fabric link, RoCE, and a running topology's endpoints.

    \b
    Checks run in parallel over one SSH connection per node (host keys checked). Each row says what was
    measured, what was expected and, when it is not a pass, a one-line fix. Your own checks: --tests PATH
    (testinfra modules; docs/doctor-tests.md), e.g. doctor --tests @spark.
    Exit codes: 0 every check passed (warnings allowed unless --strict), 1 a check failed,
    2 the inventory (or an option) is invalid: the report shows each problem with its fix.
    """

    from sparkdeploy.doctor.api import doctor as run_doctor
    from sparkdeploy.doctor.doctor_run import Options
    from sparkdeploy.doctor.registry import CHECKS
    from sparkdeploy.doctor.table import as_dict, render

    if list_checks:
        if as_json:
            emit_json(
                [
                    {"id": c.id, "title": c.title, "scope": c.scope, "timeout_s": c.timeout_s, "opt_in": c.opt_in}
                    for c in CHECKS
                ]
            )
            return
        for c in CHECKS:
            click.echo(f"{c.id:<22} {c.title}" + (f" (--{c.opt_in})" if c.opt_in else ""))
        return
    options = Options(
        recipe=recipe,
        topology=topology,
        nccl=nccl,
        nccl_max_bytes=_size(nccl_max_bytes),
        strict=strict,
        deployment=deployment,
        tests=tuple(tests),
    )
    with _lock_for_nccl(inventory, nccl):
        report = run_doctor(inventory, options, tuple(only), recipes_dir)
    inventory_error = report.run.inventory_error if report.run is not None else None
    code = 2 if inventory_error is not None else report.exit_code(strict)
    if as_json:
        emit_json(as_dict(report, strict, code))
    else:
        render(report, strict=strict)
    if inventory_error is not None:  # code 2
        raise inventory_error  # one line per problem on stderr, exit 2 (the table showed them too)
    if code:
        raise DoctorFailed(report, strict)


def _lock_for_nccl(inventory: str | None, nccl: bool) -> AbstractContextManager[object]:
    """--nccl starts probe containers on the nodes: it takes the cluster lock like any change. An inventory
    that does not load is reported by doctor itself (exit 2), so no lock is needed then."""
    from contextlib import nullcontext

    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.errors import ConfigError
    from sparkdeploy.runtime.locks import cluster_lock

    if not nccl:
        return nullcontext()
    try:
        return cluster_lock(load_inventory(inventory))
    except ConfigError:
        return nullcontext()


class DoctorFailed(StepFailed):
    """Exit 1: at least one check failed (or warned, with --strict). The table above says which."""

    def __init__(self, report: Report, strict: bool) -> None:
        from sparkdeploy.checks import FAIL, WARN

        bad = [r for r in report.results if r.status == FAIL or (strict and r.status == WARN)]
        names = sorted({r.check + (f"@{r.node}" if r.node else "") for r in bad})
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        super().__init__(f"doctor: {len(bad)} check(s) did not pass: {shown}")
