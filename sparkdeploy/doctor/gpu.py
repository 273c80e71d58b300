"""gpu.*: nvidia-smi present, a GB10, a driver not known to be bad, free unified memory, temperature.

On a DGX Spark nvidia-smi reports memory.total/free as [N/A] (unified memory has no framebuffer figure), so
memory falls back to /proc/meminfo (MemTotal, MemAvailable): the pool the GPU allocates from. The lab's
stand-in nvidia-smi reports numbers (SIMULATED) and they are used as given.
"""

from __future__ import annotations

import fnmatch
from functools import lru_cache
from pathlib import Path

import yaml

from sparkdeploy.facts.parsers import gib, number, parse_meminfo, parse_nvidia_smi_csv, version_tuple
from sparkdeploy.inventory import Node

from . import engine, gather
from .model import Result, fail, ok, skip, warn
from .session import DoctorRun

FIELDS = ["index", "name", "driver_version", "memory.total", "memory.used", "memory.free", "temperature.gpu"]
EXPECTED_NAME = "GB10"
HEADROOM_GIB = 8  # for the OS, page cache and the engine's own process beyond gpu_memory_utilization
TEMP_WARN_C = 85
TEMP_FAIL_C = 95
DATA = Path(__file__).resolve().parent / "data" / "known_bad.yaml"

SCRIPT = r"""
sec smi nvidia-smi --query-gpu="$2" --format=csv,noheader,nounits
sec meminfo grep -E '^(MemTotal|MemAvailable):' /proc/meminfo
sec kernel uname -r
"""


@lru_cache(maxsize=1)
def known_bad() -> dict:
    return yaml.safe_load(DATA.read_text()) or {}


def parse(secs: dict) -> dict:
    smi = secs.get("smi")
    text = (smi.out + "\n" + smi.err) if smi else ""
    return {
        "rc": smi.rc if smi else None,
        "gpus": parse_nvidia_smi_csv(smi.out, FIELDS) if smi and smi.rc == 0 else [],
        "error": (smi.err or smi.out).strip() if smi and smi.rc != 0 else "",
        "simulated": "SIMULATED" in text,
        "meminfo": parse_meminfo(secs["meminfo"].out) if "meminfo" in secs else {},
        "kernel": secs["kernel"].out.strip() if "kernel" in secs else "",
    }


def facts(run: DoctorRun, node: Node) -> dict:
    return run.facts(node, "gpu", lambda s: parse(gather.base(run, node)))


def _first(run: DoctorRun, node: Node) -> tuple[dict | None, Result | None]:
    f = facts(run, node)
    if f["gpus"]:
        return f["gpus"][0], None
    return None, skip("no GPU readable (see gpu.present)")


def present(run: DoctorRun, node: Node) -> Result:
    f = facts(run, node)
    sim = f["simulated"]
    expected = f"nvidia-smi lists one NVIDIA {EXPECTED_NAME}"
    if f["rc"] == 127:
        return fail("nvidia-smi not found", expected, "install the NVIDIA driver (DGX OS ships it), then reboot")
    if "version mismatch" in f["error"].lower():
        return fail(
            f"nvidia-smi: {f['error'].splitlines()[-1]}",
            expected,
            "the kernel module and the user-space driver differ after an update: reboot the node",
        )
    if not f["gpus"]:
        return fail(
            f"nvidia-smi failed: {(f['error'] or 'no GPU listed').splitlines()[-1]}",
            expected,
            "check the driver: sudo dmesg | grep -i nvrm; a reboot after a driver update",
        )
    names = [g["name"] or "?" for g in f["gpus"]]
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
    f = facts(run, node)
    data = known_bad()
    version = gpu["driver_version"] or ""
    kernel = f["kernel"]
    drivers = data.get("drivers", {})
    minimum = drivers.get("minimum") or {}
    expected = f">= {minimum.get('version', '?')}, not in doctor/data/known_bad.yaml"
    measured = f"driver {version or '?'}, kernel {kernel or '?'}"
    sim = f["simulated"]
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


def memory(run: DoctorRun, node: Node) -> Result:
    gpu, _none = _first(run, node)
    f = facts(run, node)
    nd = run.node_deployment(node)
    if nd is None or not any(c.role != "proxy" for c in nd.containers):
        return skip(f"no engine of this recipe runs on {node.name}")
    util = run.deployment.recipe.recipe.vllm.gpu_memory_utilization  # type: ignore[union-attr]  # needs_recipe: a deployment
    total = number(gpu["memory.total"]) if gpu else None
    free = number(gpu["memory.free"]) if gpu else None
    sim = f["simulated"]
    if total is not None and free is not None:
        total_b, free_b, source = total * 2**20, free * 2**20, "nvidia-smi"
    else:
        mem = f["meminfo"]
        if "MemTotal" not in mem or "MemAvailable" not in mem:
            return fail("cannot read memory (nvidia-smi N/A and no /proc/meminfo)", "", "check the node")
        total_b, free_b, source = mem["MemTotal"], mem["MemAvailable"], "unified, /proc/meminfo"
    need = util * total_b
    headroom = HEADROOM_GIB * 2**30
    measured = f"{gib(free_b)} free of {gib(total_b)} ({source})"
    expected = f">= {gib(need + headroom)} (gpu_memory_utilization {util:g} x total + {HEADROOM_GIB} GiB)"
    ours = [c for c in engine.facts(run, node)["containers"] if c["state"] == "running" and c["role"] != "proxy"]
    if ours:
        return ok(measured + f"; our {ours[0]['name']} is running and holds its share", expected, simulated=sim)
    fix = (
        "stop what holds the memory (nvidia-smi; docker ps), drop the page cache "
        "(sync; echo 3 | sudo tee /proc/sys/vm/drop_caches), or lower vllm.gpu_memory_utilization"
    )
    if free_b < need:
        return fail(measured, expected, fix, simulated=sim)
    if free_b < need + headroom:
        return warn(
            measured + " (no headroom: unified memory over-commit can wedge the node)", expected, fix, simulated=sim
        )
    return ok(measured, expected, simulated=sim)


def temperature(run: DoctorRun, node: Node) -> Result:
    gpu, none = _first(run, node)
    if gpu is None:
        return none  # type: ignore[return-value]  # _first gives a Result when no GPU
    t = number(gpu["temperature.gpu"])
    sim = facts(run, node)["simulated"]
    expected = f"< {TEMP_WARN_C} C"
    if t is None:
        return ok("not reported", expected, simulated=sim)
    fix = "check airflow and that nothing else is running on the GPU (nvidia-smi), then let it cool"
    if t >= TEMP_FAIL_C:
        return fail(f"{t:g} C", expected, fix, simulated=sim)
    if t >= TEMP_WARN_C:
        return warn(f"{t:g} C", expected, fix, simulated=sim)
    return ok(f"{t:g} C", expected, simulated=sim)
