"""SIMULATED faults for lab tests: a real out-of-memory kill, on request.

On a DGX Spark an engine that over-commits unified memory is killed by the kernel's OOM killer. The sim
reproduces that for real, not by faking an exit code: on SIGUSR1 it allocates (and touches) memory past its
cgroup's limit until the kernel OOM-kills it, so Docker records exit 137 with OOMKilled=true, exactly as
for a real engine. Give the container a limit first (`docker update --memory 512m --memory-swap 512m C`).
Without a cgroup limit it refuses (it would eat the host's memory) and logs why.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

log = logging.getLogger("vllm_sim.faults")

CHUNK = 32 * 2**20
UNLIMITED = 2**60  # cgroup v1 reports "no limit" as a huge number


def memory_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """This process's cgroup memory limit in bytes (v2 memory.max, v1 memory.limit_in_bytes); None: unlimited."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        return None if value >= UNLIMITED else value
    return None


def exhaust_memory(limit: int | None) -> bool:
    """Allocate past `limit` (the kernel ends the process first); False when there is no limit to hit."""
    if limit is None:
        log.error(
            "SIMULATED OOM refused: this container has no cgroup memory limit (it would exhaust the "
            "host); set one first: docker update --memory 512m --memory-swap 512m CONTAINER"
        )
        return False
    log.warning(
        "SIMULATED OOM: allocating past the cgroup memory limit (%d MiB) until the kernel's OOM killer "
        "ends this engine, as it would an engine over-committing unified memory",
        limit // 2**20,
    )
    hog = []
    while len(hog) * CHUNK < 2 * limit:  # bounded: never more than twice the limit
        hog.append(bytearray(b"\x01") * CHUNK)  # filled, so every page is really resident
    log.error("SIMULATED OOM: allocated %d MiB and was not killed; giving it back", len(hog) * CHUNK // 2**20)
    return False


def install() -> None:
    """SIGUSR1 -> exhaust_memory(); called once at start-up by `vllm serve` in the sim."""
    signal.signal(signal.SIGUSR1, lambda signum, frame: exhaust_memory(memory_limit()))
