"""How the pipeline tells what it does while it runs: progress, warnings, lines, and its tables as data.

Every message passes through the deployment's secrets mask, which the pipeline hands over (`use_mask`) as soon as
it knows the secrets. This base is what a library caller gets: progress, warnings and lines on stderr, plain; no
tables. sparkdeploy.cli.up_cmd.Out renders the same calls for people."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from sparkdeploy.checks import Result
from sparkdeploy.deploy.plan import CHANGED, FAILED, OK, SKIPPED, Plan


class Reporter:
    def __init__(self, mask: Callable[[str], str] = lambda s: s):
        self.mask = mask

    def use_mask(self, mask: Callable[[str], str]) -> None:
        self.mask = mask

    def progress(self, message: str) -> None:
        print(self.mask(message), file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        print(f"warning: {self.mask(message)}", file=sys.stderr, flush=True)

    def line(self, message: str, style: str | None = None) -> None:
        print(self.mask(message), file=sys.stderr, flush=True)

    def preflight(self, checks: list[Result]) -> None:
        """The preflight checks, shown when one failed or on a dry run."""

    def steps(self, plan: Plan, title: str) -> None:
        """The applied plan, step by step."""

    def dry_run(self, plan: Plan) -> None:
        """What a dry run would change, node by node."""


def plan_summary(plan: Plan) -> str:
    """One clause per node: how many steps were ok, changed, failed (and skipped)."""
    parts = []
    for n in plan.nodes:
        c = {OK: 0, CHANGED: 0, FAILED: 0, SKIPPED: 0}
        for s in n.steps:
            c[s.status] = c.get(s.status, 0) + 1
        parts.append(
            f"{n.node.name}: {c[OK]} ok, {c[CHANGED]} changed, {c[FAILED]} failed"
            + (f", {c[SKIPPED]} skipped" if c[SKIPPED] else "")
        )
    return "; ".join(parts)


def mask_data(mask: Callable[[str], str], data: Any) -> Any:
    """The same structure with every string masked: results leave the pipeline like its messages."""
    if isinstance(data, str):
        return mask(data)
    if isinstance(data, list):
        return [mask_data(mask, x) for x in data]
    if isinstance(data, dict):
        return {k: mask_data(mask, v) for k, v in data.items()}
    return data
