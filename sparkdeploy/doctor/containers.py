"""engine.crashes: a recent OOM kill or a restart loop of sparkdeploy's containers, as one line with its fix.

The history comes from sparkdeploy.daytwo.crashes (docker inspect + the engine's die/oom events), read over the
node's one SSH connection. An OOM kill on a DGX Spark is the classic unified-memory over-commit: the GPU's
128 GB are the OS's memory too, and `gpu_memory_utilization` is not a hard cap.
"""

from __future__ import annotations

from sparkdeploy.checks import Result, fail, ok, skip, warn
from sparkdeploy.config.inventory import Node
from sparkdeploy.daytwo import crashes
from sparkdeploy.recipes.engines.registered import engine_of

from .doctor_run import DoctorRun

RECENT_S = 24 * 3600  # an OOM kill this recent is worth a diagnosis
LOOP_WINDOW_S = 15 * 60  # this many exits within this window is a restart loop
LOOP_EXITS = 3


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _lower_util(run: DoctorRun) -> str:
    if run.deployment is None:
        return "lower vllm.gpu_memory_utilization (e.g. --set vllm.gpu_memory_utilization=0.60)"
    recipe = run.deployment.recipe.recipe
    share = engine_of(recipe).reservation(recipe)  # the engine's own setting (SGLang: sglang.mem_fraction_static)
    if share.fraction_field is None or share.fraction is None:  # llama.cpp takes what its context needs
        return (
            f"lower {share.length_field} or llamacpp.parallel (e.g. `sparkdeploy up --set {share.length_field}=8192`)"
        )
    util = share.fraction
    lower = max(0.3, round(util - 0.10, 2))
    return f"lower {share.fraction_field} from {util:g} (e.g. `sparkdeploy up --set {share.fraction_field}={lower:g}`)"


def diagnose(history: crashes.NodeHistory, node: str, fix_memory: str) -> list[Result]:
    """Pure: one row per container with a recent OOM kill or restart loop, else one passing row."""
    out: list[Result] = []
    now = history.now
    for c in history.containers.values():
        recent_oom = [e for e in c.exits_within(RECENT_S, now) if e.oom]
        last_oom = c.last_exit if c.last_exit is not None and c.last_exit.oom else None
        if last_oom is not None and last_oom.at is not None and (now - last_oom.at).total_seconds() > RECENT_S:
            last_oom = None
        loop = c.exits_within(LOOP_WINDOW_S, now)
        data = {"container": c.name, **c.as_dict()}
        if recent_oom or last_oom is not None:
            when = (recent_oom[-1] if recent_oom else last_oom).at  # type: ignore[union-attr]  # no recent OOM: last_oom is set
            count = max(len(recent_oom), 1)
            state = "restarting" if c.status == "restarting" else ("running again" if c.running else c.status)
            out.append(
                fail(
                    f"{c.name} was OOM-killed {crashes.ago(when, now)} ({count}x in 24 h, {_n(c.restarts, 'restart')}; "
                    f"now {state}): the engine asked for more memory than the node could give",
                    "no OOM kill",
                    f"{fix_memory}, or lower max_model_len / max_num_seqs: unified memory is shared with the OS, so "
                    "the engine's budget must leave it headroom (doctor's gpu.memory shows the free memory)",
                    data=data,
                )
            )
        elif len(loop) >= LOOP_EXITS or c.status == "restarting":
            last = c.last_exit
            why = last.reason if last is not None else "unknown exit"
            out.append(
                fail(
                    f"{c.name} is restarting in a loop: {len(loop)} exits in the last {LOOP_WINDOW_S // 60} min, "
                    f"{_n(c.restarts, 'restart')}; last: {why}",
                    f"fewer than {LOOP_EXITS} exits in {LOOP_WINDOW_S // 60} min",
                    f"read why with `sparkdeploy logs --node {node} --container {c.name} --since 15m`; fix that, then "
                    "`sparkdeploy up` (or `sparkdeploy down` to stop the loop)",
                    data=data,
                )
            )
        elif c.health == "unhealthy":
            out.append(
                fail(
                    f"{c.name}: Docker health check failing since {crashes.ago(c.failing_since, now)}",
                    "healthy",
                    f"sparkdeploy logs --node {node} --container {c.name} --tail 100",
                    data=data,
                )
            )
        elif (
            c.last_exit is not None
            and not c.last_exit.by_docker
            and c.last_exit.code not in (None, 0)
            and c.exits_within(RECENT_S, now)
        ):
            out.append(
                warn(
                    f"{c.name} {c.last_exit.reason} {crashes.ago(c.last_exit.at, now)} "
                    f"({_n(c.restarts, 'restart')}; now {c.status})",
                    "no unexpected exit",
                    f"sparkdeploy logs --node {node} --container {c.name} --since 1h",
                    data=data,
                )
            )
    if not out:
        names = ", ".join(sorted(history.containers))
        out.append(ok(f"no OOM kill or restart loop in 24 h ({names})", "no OOM kill, no restart loop"))
    return out


def recent_crashes(run: DoctorRun, node: Node) -> list[Result] | Result:
    history = crashes.read(run.session(node).conn)
    if not history.containers:
        return skip(f"no sparkdeploy container on {node.name}")
    return diagnose(history, node.name, _lower_util(run))


__all__ = ["Result", "diagnose", "recent_crashes"]
