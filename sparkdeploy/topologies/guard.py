"""The guard as one more container of the deployment: `sparkdeploy-guard` (role `guard`) on every node that runs an
engine, so `up` plans and starts it, `status` lists it and `down` removes it with the rest (managed labels).

Run options, each the least the guard needs:
- the Docker socket: stop the node's engines and set their restart policy to `no` (the hard line);
- the host's /proc/sys/vm/drop_caches, bound read-write: the soft line writes 3 to it as the container's root.
  No --privileged and no capability: the kernel checks only that the writer is root (mode 0200) and Docker
  mounts /proc/sys read-only, which this one bind undoes for this one file;
- /sys/fs/cgroup read-only: the node's cgroup memory figures where they stand in for /proc/meminfo (the lab);
- /dev/kmsg read-only with CAP_SYSLOG (kernel messages about OOM, Xid and PCIe AER for the black box), only where
  the node has it: without it the black box says it could not read them;
- the state dir's guard/ folder at /guard: the black box (ring.jsonl) and status.json.
It never gets the GPUs: on a real Spark it reads nvidia-smi's telemetry with the NVIDIA runtime's `utility`
capability (`--gpus all`); in the lab the telemetry is a SIMULATED stand-in.
"""

from __future__ import annotations

from typing import Any

from sparkdeploy.config.guard_settings import GUARD_FOLDER, GuardSettings, effective
from sparkdeploy.config.inventory import Node
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.recipes import budget
from sparkdeploy.topologies.base import Context
from sparkdeploy.topologies.deployment import Listen, NodeDeployment

GUARD_CONTAINER = "sparkdeploy-guard"
GUARD_IMAGE = "guard"
GUARD_ROLE = "guard"
# The soft line sits at the budget's OS reserve of available memory (of a DGX Spark's total), the hard line at half
# of it: fractions, so a scaled-down lab node gets the same proportions.
SOFT_FRACTION = round(budget.OS_RESERVE_BYTES / budget.DGX_SPARK_TOTAL_BYTES, 4)  # 0.0668
HARD_FRACTION = SOFT_FRACTION / 2
GIB = 1 << 30


def guard_config(node: Node, settings: GuardSettings, simulated_gpu: bool, demand: str | None = None) -> dict[str, Any]:
    """What the guard on `node` runs with (nodeside/guard/run.py reads it; `watch`: nodeside/guard/watch.py;
    `watch.demand`: a stack with on-demand members, the gateway's demand URL its activator reads, activate.py)."""
    w = settings.watch
    config: dict[str, Any] = {
        "node": node.name,
        "state": "/guard",
        "soft_bytes": int(settings.soft_available_gib * GIB) if settings.soft_available_gib else None,
        "hard_bytes": int(settings.hard_available_gib * GIB) if settings.hard_available_gib else None,
        "soft_fraction": SOFT_FRACTION,
        "hard_fraction": HARD_FRACTION,
        "psi_full_hard": settings.psi_full_hard,
        "interval_s": settings.interval_ms / 1000,
        "grace_s": settings.grace_s,
        "sync_s": settings.sync_s,
        "simulated_gpu": simulated_gpu,
        "watch": {
            "enabled": w.enabled,
            "listen": node.fabric_address,  # the group's own network: every rank's watcher reaches the others there
            "port": w.port,
            "unhealthy_s": w.unhealthy_s,
            "start_s": w.start_s,
            "max_restarts": w.max_restarts,
            "window_s": w.window_s,
            "backoff_s": w.backoff_s,
            "stop_wait_s": w.stop_wait_s,
            "grace_s": settings.grace_s,
        },
    }
    if demand:
        config["watch"]["demand"] = demand
    return config


def watcher_address(node: Node, settings: GuardSettings) -> str:
    """IP:PORT where the watcher of `node` answers its peers (the engine containers' group labels name it)."""
    return f"{node.fabric_address}:{settings.watch.port}"


def check_settings(settings: GuardSettings, source: str) -> None:
    """Lines that contradict each other, refused before anything runs (the node's memory: check_lines)."""
    soft, hard = settings.soft_available_gib, settings.hard_available_gib
    if soft is not None and hard is not None and hard >= soft:
        raise ConfigError(
            Problem(
                source,
                "cluster.guard.hard_available_gib",
                f"the hard line ({hard:g} GiB) must be below the soft line ({soft:g} GiB)",
                "lower hard_available_gib or raise soft_available_gib",
            )
        )


def add_guard(ctx: Context, nodes: list[NodeDeployment]) -> None:
    """Add the guard container to every node of the deployment that runs an engine. A deployment of a stack gets
    none: the stack runs ONE guard per node for all its engines (`stack_guards`), since each guard stops every
    engine of its node."""
    if ctx.deployment:
        return
    _add(ctx, nodes, effective(ctx.cluster.guard, ctx.recipe.guard), ctx.run_image.simulated)


def stack_guards(ctx: Context, nodes: list[NodeDeployment], simulated_gpu: bool, demand: str | None = None) -> None:
    """A stack's guards: one per node in `nodes` (those where any deployment of the stack runs an engine), with the
    inventory's `cluster.guard` lines (a recipe's own `guard:` applies to a single deployment only). ctx: the
    stack's guard unit (deployment `guard`, deploy/stack/units.py)."""
    _add(ctx, nodes, ctx.cluster.guard, simulated_gpu, every=True, demand=demand)


def _add(
    ctx: Context,
    nodes: list[NodeDeployment],
    settings: GuardSettings,
    simulated_gpu: bool,
    every: bool = False,
    demand: str | None = None,
) -> None:
    if not settings.enabled:
        return
    check_settings(settings, ctx.inventory.source)
    tag = load_definition(GUARD_IMAGE).tag
    for nd in nodes:
        if not every and not nd.runs_engine:
            continue
        config = guard_config(nd.node, settings, simulated_gpu, demand)
        ctx.container(
            nd,
            role=GUARD_ROLE,
            name=GUARD_CONTAINER,
            entry_template="entry-guard.sh.j2",
            entry_name="guard.entry.sh",
            image_tag=tag,
            gpus=not simulated_gpu,  # nvidia-smi's telemetry (the runtime's utility capability)
            model_cache=False,
            ports=(Listen(settings.watch.port, "the guard's watcher", "cluster.guard.watch.port"),)
            if settings.watch.enabled
            else (),
            health_port=None,
            run_options={
                "env_files": False,  # neither the engines' environment nor the secrets
                "state_volumes": [(GUARD_FOLDER, "/guard")],
                "host_volumes": [
                    "/var/run/docker.sock:/var/run/docker.sock",
                    "/proc/sys/vm/drop_caches:/host/drop_caches",
                    "/sys/fs/cgroup:/host/cgroup:ro",
                ],
                "cap_add": ["SYSLOG"],
                "optional_devices": ["/dev/kmsg"],
            },
            config=config,
        )
