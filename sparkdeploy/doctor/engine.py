"""engine.*: the Docker engine runs (version) and its root has free disk for images."""

from __future__ import annotations

import json
import re

from sparkdeploy.deployment import DEPLOYMENT_LABEL, LABEL_PREFIX
from sparkdeploy.inventory import Node

from . import gather
from .model import Result, fail, ok, warn
from .parsers import gib, parse_df, version_tuple
from .session import DoctorRun

MIN_VERSION = (20, 10)
DISK_FAIL_GIB = 20  # one vLLM GPU image is 15-25 GB unpacked
DISK_WARN_GIB = 50  # room for a second image version while the first still runs

SCRIPT = r"""
sec version docker version --format '{{.Server.Version}}'
sec info docker info --format '{{.DockerRootDir}}|{{.Driver}}'
root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null); [ -n "$root" ] || root=/var/lib/docker
sec root echo "$root"
sec df df -PB1 -- "$root"
sec ps docker ps -a --filter "label=$1=true" --format '{{json .}}'
"""


def parse(secs: dict) -> dict:
    version, info = secs.get("version"), secs.get("info")
    facts: dict = {"running": False, "error": "", "version": "", "root": "", "driver": "", "df": None, "containers": []}
    if version is not None and version.rc == 0 and version.out.strip():
        facts.update(running=True, version=version.out.strip().splitlines()[-1])
        if info is not None and info.rc == 0 and "|" in info.out:
            root, _, driver = info.out.strip().splitlines()[-1].partition("|")
            facts.update(root=root, driver=driver)
    else:
        lines = [ln.strip() for ln in ((version.err or version.out) if version else "").splitlines() if ln.strip()]
        telling = [ln for ln in lines if re.search(r"cannot connect|permission denied|is the docker daemon", ln, re.I)]
        facts["error"] = (telling or lines or ["no answer"])[-1]
    facts["root"] = facts["root"] or (secs["root"].out.strip() if "root" in secs else "/var/lib/docker")
    if "df" in secs and secs["df"].rc == 0:
        facts["df"] = parse_df(secs["df"].out)
    if "ps" in secs and secs["ps"].rc == 0:
        for line in secs["ps"].out.splitlines():
            try:
                c = json.loads(line)
            except ValueError:
                continue
            labels = dict(kv.split("=", 1) for kv in (c.get("Labels") or "").split(",") if "=" in kv)
            facts["containers"].append(
                {
                    "name": c.get("Names", ""),
                    "state": c.get("State", ""),
                    "status": c.get("Status", ""),
                    "image": c.get("Image", ""),
                    "role": labels.get(f"{LABEL_PREFIX}.role", ""),
                    "recipe": labels.get(f"{LABEL_PREFIX}.recipe", ""),
                    "topology": labels.get(f"{LABEL_PREFIX}.topology", ""),
                    "deployment": labels.get(DEPLOYMENT_LABEL, ""),  # a stack's deployment (up --stack)
                }
            )
    return facts


def facts(run: DoctorRun, node: Node) -> dict:
    return run.facts(node, "engine", lambda s: parse(gather.base(run, node)))


def running(run: DoctorRun, node: Node) -> Result:
    f = facts(run, node)
    expected = f"running, >= {'.'.join(map(str, MIN_VERSION))}"
    if not f["running"]:
        return fail(
            f"not running: {f['error'] or 'no answer'}",
            expected,
            "sudo systemctl start docker (and `systemctl enable docker` so it survives a reboot)",
        )
    if version_tuple(f["version"]) < MIN_VERSION:
        return warn(f"Docker {f['version']} (old)", expected, "upgrade Docker (DGX OS: sudo apt upgrade docker-ce)")
    return ok(f"Docker {f['version']} ({f['driver']})", expected)


def disk(run: DoctorRun, node: Node) -> Result:
    f = facts(run, node)
    df = f["df"]
    expected = f">= {DISK_WARN_GIB} GiB free on the Docker root"
    if df is None:
        return fail(f"cannot read free space of {f['root']}", expected, f"check {f['root']} exists (df {f['root']})")
    free = int(df["avail"])
    measured = f"{gib(free)} free on {f['root']} ({df['mount']})" + ("" if f["running"] else " (engine down)")
    fix = "free space: docker image prune (removes unused images), or move the Docker root to a larger disk"
    if free < DISK_FAIL_GIB * 2**30:
        return fail(measured, expected, fix)
    if free < DISK_WARN_GIB * 2**30:
        return warn(measured, expected, fix)
    return ok(measured, expected)
