"""A guard line at or above a node's memory, refused by `up` once it has read the nodes (deploy/up.py's hook).
Apart from topologies/guard.py, which the dry run imports: this one needs the nodes' facts (and so SSH)."""

from __future__ import annotations

from collections.abc import Mapping

from sparkdeploy.config.guard_settings import effective
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.facts import NodeFacts
from sparkdeploy.topologies.deployment import Deployment
from sparkdeploy.topologies.guard import GUARD_ROLE, HARD_FRACTION, SOFT_FRACTION


def check_lines(dep: Deployment, facts: Mapping[str, NodeFacts | Exception]) -> None:
    """A guard line at or above a node's memory (MemTotal as `up` read it) is refused before anything changes:
    one line per node, exit 2. (The guard checks again against what it reads itself, e.g. a lab node's cgroup
    limit, and says `refused` in `status`.)"""
    settings = effective(dep.inventory.cluster.guard, dep.recipe.recipe.guard)
    problems = []
    for nd in dep.nodes:
        f = facts.get(nd.node.name)
        if not isinstance(f, NodeFacts) or not any(c.role == GUARD_ROLE for c in nd.containers):
            continue
        if not f.has("meminfo") or not f.mem_total_mb:  # read only where something starts
            continue
        total_gib = f.mem_total_mb / 1024
        for field, value in (
            ("soft_available_gib", settings.soft_available_gib),
            ("hard_available_gib", settings.hard_available_gib),
        ):
            if value is not None and value >= total_gib:
                problems.append(
                    Problem(
                        dep.inventory.source,
                        f"cluster.guard.{field}",
                        f"{value:g} GiB is not below {nd.node.name}'s memory ({total_gib:.1f} GiB): the guard would "
                        "stop the engine at once",
                        f"set it below {total_gib:.0f} GiB (the inventory's cluster.guard or the recipe's guard:), "
                        f"or remove it for the default ({SOFT_FRACTION:.2%} / "
                        f"{HARD_FRACTION:.2%} of the node's memory)",
                    )
                )
    if problems:
        raise ConfigError(problems)
