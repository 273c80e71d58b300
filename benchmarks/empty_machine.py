"""Put this machine in the state of a fresh one, as far as sparkdeploy is concerned (for the timing scripts).

A scratch copy of the state, as close as one machine allows: every lab container and volume (of any lab, any
checkout) and its keys removed, every sparkdeploy image and the engine's build cache removed, the downloaded
image wheels and the checkout's .venv / .venv-litellm removed, the state folder removed, sparkdeploy's own
packages removed from the system interpreter if someone installed them there, and the Docker engine stopped.
Kept: the apt packages (docker.io, debootstrap: what a machine that ran setup once has) and pip's download
cache. Destructive for every checkout on this engine: run it only on a machine nobody else is using.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SYSTEM_PACKAGES = ("sparkdeploy", "litellm", "llama-benchy", "ray", "torch", "fabric", "pytest-testinfra")


def sh(command: str, cwd: Path | None = None) -> None:
    subprocess.run(["bash", "-c", command], check=False, cwd=cwd)


def make_empty(repo: Path) -> None:
    sh("bash .ci/start-docker.sh >/dev/null 2>&1", cwd=repo)  # to list what must go
    sh("docker ps -aq --filter label=io.sparkdeploy.lab=1 | xargs -r docker rm -f >/dev/null 2>&1")
    sh("docker network ls -q --filter label=io.sparkdeploy.lab=1 | xargs -r docker network rm >/dev/null 2>&1")
    sh("docker volume ls -q --filter label=io.sparkdeploy.lab=1 | xargs -r docker volume rm >/dev/null 2>&1")
    # Children before parents: `docker rmi` refuses an image with dependent child images, so go round until
    # none is left (a base like debian-base goes last).
    sh("for _ in 1 2 3 4 5 6; do ids=$(docker images -a --format '{{.Repository}} {{.ID}}' "
       "| awk '$1 ~ /^sparkdeploy/ || $1 == \"<none>\" {print $2}' | sort -u); [ -z \"$ids\" ] && break; "
       "echo \"$ids\" | xargs -r docker rmi -f >/dev/null 2>&1; done")
    sh("docker builder prune -af >/dev/null 2>&1")
    for wheels in (repo / "images").glob("*/wheels"):
        shutil.rmtree(wheels, ignore_errors=True)
    for venv in (".venv", ".venv-litellm"):
        shutil.rmtree(repo / venv, ignore_errors=True)
    state = Path(os.environ.get("SPARKDEPLOY_STATE") or Path.home() / ".local" / "state" / "sparkdeploy")
    shutil.rmtree(state, ignore_errors=True)
    # The system interpreter's site, never the venv this script may be running from.
    system_python = getattr(sys, "_base_executable", sys.executable)
    sh(f"{system_python} -m pip uninstall -y -q " + " ".join(SYSTEM_PACKAGES) + " >/dev/null 2>&1")
    left = subprocess.run(["docker", "images", "-aq"], capture_output=True, text=True).stdout.split()
    if left:
        raise SystemExit(f"empty_machine: {len(left)} images are still in the engine: docker images -a")
    sh("pid=$(cat /var/run/docker.pid 2>/dev/null) && kill \"$pid\" && "
       "for _ in $(seq 1 120); do [ -d /proc/$pid ] || break; sleep 0.5; done")
