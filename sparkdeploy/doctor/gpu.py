"""gpu.*: nvidia-smi present, a GB10, a driver not known to be bad, free unified memory, temperature.

On a DGX Spark nvidia-smi reports memory.total/free as [N/A] (unified memory has no framebuffer figure), so
memory falls back to /proc/meminfo (MemTotal, MemAvailable): the pool the GPU allocates from. The lab's
stand-in nvidia-smi reports numbers (SIMULATED) and they are used as given. `memory` is the memory budget of
sparkdeploy/recipes/budget.py, and `up`'s preflight memory check.
"""

from __future__ import annotations

import fnmatch
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from sparkdeploy.checks import Result, fail, ok, skip, warn
from sparkdeploy.config.inventory import Node
from sparkdeploy.facts import GpuFact
from sparkdeploy.facts.parsers import number, version_tuple
from sparkdeploy.recipes import budget

from .check_context import CheckContext
from .doctor_run import DoctorRun

EXPECTED_NAME = "GB10"
TEMP_WARN_C = 85
TEMP_FAIL_C = 95
DATA = Path(__file__).resolve().parent / "data" / "known_bad.yaml"


@lru_cache(maxsize=1)
def known_bad() -> dict[str, Any]:
    return yaml.safe_load(DATA.read_text()) or {}


def facts(run: CheckContext, node: Node) -> GpuFact:
    return run.node_facts(node).gpu or GpuFact()


def _first(run: CheckContext, node: Node) -> tuple[dict[str, Any] | None, Result | None]:
    f = facts(run, node)
    if f.gpus:
        return f.gpus[0], None
    return None, skip("no GPU readable (see gpu.present)")


def present(run: DoctorRun, node: Node) -> Result:
    f = facts(run, node)
    sim = f.simulated
    expected = f"nvidia-smi lists one NVIDIA {EXPECTED_NAME}"
    if f.rc == 127:
        return fail("nvidia-smi not found", expected, "install the NVIDIA driver (DGX OS ships it), then reboot")
    if "version mismatch" in f.error.lower():
        return fail(
            f"nvidia-smi: {f.error.splitlines()[-1]}",
            expected,
            "the kernel module and the user-space driver differ after an update: reboot the node",
        )
    if not f.gpus:
        return fail(
            f"nvidia-smi failed: {(f.error or 'no GPU listed').splitlines()[-1]}",
            expected,
            "check the driver: sudo dmesg | grep -i nvrm; a reboot after a driver update",
        )
    names = [g["name"] or "?" for g in f.gpus]
    measured = ", ".join(names) + (f" ({len(names)} GPUs)" if len(names) > 1 else "")
    if not all(EXPECTED_NAME in n for n in names):
        return warn(
            measured,
            expected,
            "sparkdeploy's recipes and limits are tuned for DGX Spark (GB10); "
            "check gpu_memory_utilization and the image's CUDA arch for this GPU",
            simulated=sim,
        )
    return ok(measured, expected, simulated=sim)


def driver(run: DoctorRun, node: Node) -> Result:
    gpu, none = _first(run, node)
    if gpu is None:
        return none  # type: ignore[return-value]  # _first gives a Result when no GPU
    data = known_bad()
    version = gpu["driver_version"] or ""
    kernel = run.node_facts(node).kernel
    drivers = data.get("drivers", {})
    minimum = drivers.get("minimum") or {}
    expected = f">= {minimum.get('version', '?')}, not in doctor/data/known_bad.yaml"
    measured = f"driver {version or '?'}, kernel {kernel or '?'}"
    sim = facts(run, node).simulated
    if minimum and version_tuple(version) < version_tuple(minimum["version"]):
        return Result(
            minimum.get("severity", "fail"),
            measured,
            expected,
            f"{minimum['fix']} ({minimum['why']}; source: {minimum['source']})",
            simulated=sim,
        )
    hits = [(e, "driver") for e in drivers.get("bad", []) if fnmatch.fnmatch(version, e["match"])]
    hits += [(e, "kernel") for e in data.get("kernels", {}).get("bad", []) if fnmatch.fnmatch(kernel, e["match"])]
    if hits:
        entry, what = max(hits, key=lambda h: h[0].get("severity") == "fail")
        status = "fail" if any(e.get("severity") == "fail" for e, _ in hits) else "warn"
        return Result(
            status,
            f"{measured}: known-bad {what} ({entry['why']})",
            expected,
            f"{entry['fix']} (source: {entry['source']})",
            simulated=sim,
        )
    return ok(measured, expected, simulated=sim)


def same_driver(run: CheckContext) -> Result:
    """One driver version on every node that answers nvidia-smi (a node with another driver has another CUDA
    user-space and NCCL's plugins see another GPU stack: mixed drivers are a cross-node hang or a slow path)."""
    per: dict[str, str] = {}
    sim = False
    for node in run.nodes:
        if not run.reachable(node):
            continue
        gpu, _none = _first(run, node)
        if gpu is not None and gpu.get("driver_version"):
            per[node.name] = str(gpu["driver_version"])
            sim = sim or facts(run, node).simulated
    expected = "one NVIDIA driver version on every node"
    if len(set(per.values())) > 1:
        seen = ", ".join(f"{n} {v}" for n, v in sorted(per.items()))
        newest = max(per.values(), key=version_tuple)
        return fail(
            f"drivers differ: {seen}",
            expected,
            f"install driver {newest} on every node (DGX OS: sudo apt update && sudo apt upgrade), then reboot them",
            node=",".join(sorted(per)),
            simulated=sim,
        )
    if not per:
        return skip("no driver version read (see gpu.present)")
    return ok(f"driver {next(iter(per.values()))} on {len(per)} node(s)", expected, simulated=sim)


def memory(run: CheckContext, node: Node) -> Result:
    """The memory budget (sparkdeploy/recipes/budget.py), one formula for doctor and `up`'s preflight: free memory >=
    gpu_memory_utilization x total + the OS reserve, and the weights + peak + one max_model_len sequence of KV
    inside util x total (or the engine refuses to start)."""
    nd = run.node_deployment(node)
    if nd is None or not nd.runs_engine:
        return skip(f"no engine of this recipe runs on {node.name}")
    dep = run.deployment
    assert dep is not None  # node_deployment is None without one
    f = run.node_facts(node)
    engines = {c.name for c in nd.containers if c.is_engine}
    if not run.starts_engine(node):
        return ok("our engine runs unchanged", "")
    if not (f.has("resources") and f.resources):
        return fail("free memory was not read", "", "run again")
    b = budget.for_node(dep.recipe.recipe, dep.engine_size(node.name), f)
    if b is None:
        return fail("cannot read memory (nvidia-smi N/A and no /proc/meminfo)", "", "check the node")
    sim = b.simulated
    util = b.util
    measured = f"{budget.gib(b.free)} free of {budget.gib(b.total)} ({b.source})"
    expected = (
        f">= {budget.gib(b.need)} (gpu_memory_utilization {util:g} x total {budget.gib(b.reserve)} + "
        f"{budget.gib(b.os_reserve)} OS reserve)"
    )
    data = b.as_dict()
    if not b.starts:
        return fail(
            f"{budget.gib(b.weights)} of weights + {budget.gib(b.peak)} peak + {budget.gib(b.kv_per_seq)} KV of one "
            f"{b.max_model_len}-token sequence > {budget.gib(b.reserve)} (util {util:g} x total): "
            "the engine won't start",
            "the weights and one max_model_len sequence of KV inside gpu_memory_utilization x total",
            b.suggestion,
            simulated=sim,
            data=data,
        )
    ours = [c.name for c in f.containers if (c.running or c.restarting) and c.name in engines]
    if ours:
        return ok(
            measured + f"; our {', '.join(ours)} runs and holds its share (removed before a new engine starts)",
            expected,
            simulated=sim,
            data=data,
        )
    if b.free is None:
        return fail("cannot read free memory (/proc/meminfo, nvidia-smi)", expected, "check the node", data=data)
    if not b.node_fits:
        return fail(
            measured + " (unified memory: over-commit wedges the node)",
            expected,
            b.suggestion + "; stop what holds the memory (nvidia-smi; docker ps) or drop the page cache "
            "(sync; echo 3 | sudo tee /proc/sys/vm/drop_caches)",
            simulated=sim,
            data=data,
        )
    full = b.full_sequences
    if full is not None and full < b.max_num_seqs:
        return ok(
            measured + f"; KV room holds {full} of max_num_seqs {b.max_num_seqs} full-length sequences",
            expected,
            simulated=sim,
            data=data,
        )
    return ok(
        measured + (" (ESTIMATE: no architecture facts)" if b.estimated else ""), expected, simulated=sim, data=data
    )


def temperature(run: DoctorRun, node: Node) -> Result:
    gpu, none = _first(run, node)
    if gpu is None:
        return none  # type: ignore[return-value]  # _first gives a Result when no GPU
    t = number(gpu["temperature.gpu"])
    sim = facts(run, node).simulated
    expected = f"< {TEMP_WARN_C} C"
    if t is None:
        return ok("not reported", expected, simulated=sim)
    fix = "check airflow and that nothing else is running on the GPU (nvidia-smi), then let it cool"
    if t >= TEMP_FAIL_C:
        return fail(f"{t:g} C", expected, fix, simulated=sim)
    if t >= TEMP_WARN_C:
        return warn(f"{t:g} C", expected, fix, simulated=sim)
    return ok(f"{t:g} C", expected, simulated=sim)
