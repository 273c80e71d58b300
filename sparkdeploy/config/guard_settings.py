"""`cluster.guard` in the inventory: the guard's lines and timings. Every field has a default; the lines default to
fractions of the node's memory derived from the memory budget (see topologies/guard.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sparkdeploy.config.schema import Number, Whole

# The guard's folder in the state dir: its black box and status.json (written by its container, removed by `down`).
GUARD_FOLDER = "guard"
# A stack's guards are their own unit of this name (deploy/stack/converge.py), in the state dir `<state_dir>-guard`.
STACK_UNIT = "guard"


class WatchSettings(BaseModel):
    """The watcher in the guard's container (nodeside/guard/watch.py): restarts a group that stopped serving."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True  # false: the guard only guards memory; a dead rank waits for `sparkdeploy up`
    port: Whole = Field(default=7390, ge=1, le=65535)  # where each node's watcher answers the others (fabric IP)
    # A serving engine failing its health check this long (seconds): its group restarts.
    unhealthy_s: Number = Field(default=30, ge=1, le=86400)
    # An engine not healthy this long after its (re)start: a failed start (the largest models load ~20 min).
    start_s: Number = Field(default=1800, ge=5, le=86400)
    max_restarts: Whole = Field(default=3, ge=1, le=100)  # restarts within window_s, then it gives up
    window_s: Number = Field(default=3600, ge=10, le=7 * 86400)
    # After a restart that did not bring the group back, before the next; doubles for each one in a row.
    backoff_s: Number = Field(default=30, ge=0, le=86400)
    stop_wait_s: Number = Field(default=60, ge=1, le=3600)  # rank 0 waits this long for the others to stop


class GuardSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True  # a guard container on every engine node
    # Available memory (GiB) below which the guard drops the page cache and warns / stops the node's engines.
    # Unset: the defaults of topologies/guard.py, fractions of the node's memory.
    soft_available_gib: Number | None = Field(default=None, gt=0, le=4096)
    hard_available_gib: Number | None = Field(default=None, gt=0, le=4096)
    # PSI memory `full` avg10 (percent of the last 10 s every task stalled on memory) that also counts as the
    # hard line; 0 turns it off. Ignored (and said so) on a kernel without PSI.
    psi_full_hard: Number = Field(default=40.0, ge=0, le=100)
    interval_ms: Whole = Field(default=200, ge=50, le=5000)  # one sample every interval
    grace_s: Whole = Field(default=5, ge=0, le=300)  # SIGTERM, then SIGKILL after this many seconds
    sync_s: Number = Field(default=1.0, ge=0.1, le=60)  # the black box is fdatasync'd at least this often
    watch: WatchSettings = Field(default_factory=WatchSettings)


def effective(cluster: GuardSettings, recipe: GuardSettings | None) -> GuardSettings:
    """The inventory's `cluster.guard` with what the recipe's `guard:` sets on top (a model that needs other lines)."""
    if recipe is None:
        return cluster
    update = recipe.model_dump(exclude_unset=True)
    if "watch" in update:  # a nested model: the recipe's fields over the inventory's
        update["watch"] = cluster.watch.model_copy(update=recipe.watch.model_dump(exclude_unset=True))
    return cluster.model_copy(update=update)
