"""The node's memory as the guard sees it: available bytes, total bytes, and the kernel's memory pressure (PSI).

`memory_source()` is the one place that decides where the figures come from:
- `meminfo`: /proc/meminfo MemAvailable and MemTotal. On a DGX Spark the GPU and the CPU share these 128 GB
  (unified memory), so this is the figure that runs out when the engine grows.
- `cgroup`: the memory limit of the cgroup the guard's own container sits in (its parent: the node). The lab's
  nodes are containers with a memory limit standing in for the Spark's unified memory, scaled down; inside a
  container /proc/meminfo shows the host's memory, so there the cgroup's limit and usage are the truth. It is
  shown as SIMULATED: only the lab has it.
PSI (/proc/pressure/memory) may be missing (kernel without CONFIG_PSI or booted psi=0): the guard then works on
the memory lines alone and says so (`psi: None`, `psi_note`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

UNLIMITED = 1 << 60  # cgroup v1 writes 9223372036854771712 for "no limit", v2 writes "max"


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def meminfo(proc: str = "/proc") -> tuple[int, int]:
    """(available, total) bytes from /proc/meminfo."""
    values: dict[str, int] = {}
    for line in read_text(f"{proc}/meminfo").splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemAvailable", "MemTotal"):
            values[key] = int(rest.split()[0]) * 1024
    return values["MemAvailable"], values["MemTotal"]


def _memory_cgroup(proc: str = "/proc") -> tuple[int, str] | None:
    """(version, path) of this process's memory cgroup from /proc/self/cgroup, or None."""
    try:
        lines = read_text(f"{proc}/self/cgroup").splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            return 1, parts[2]
    for line in lines:
        if line.startswith("0::"):
            return 2, line[3:]
    return None


def _stat_value(text: str, names: tuple[str, ...]) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in names:
            return int(value)
    return 0


class CgroupMemory:
    """The memory figures of one cgroup folder (v1 or v2). available = limit - usage + inactive file pages (the
    page cache the kernel can drop without writing anything: what MemAvailable counts too)."""

    def __init__(self, version: int, folder: str) -> None:
        self.version, self.folder = version, folder
        if version == 1:
            self.limit_file, self.usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
            self.cache_names = ("total_inactive_file",)
        else:
            self.limit_file, self.usage_file = "memory.max", "memory.current"
            self.cache_names = ("inactive_file",)

    def limit(self) -> int:
        text = read_text(os.path.join(self.folder, self.limit_file)).strip()
        return UNLIMITED if text == "max" else int(text)

    def read(self) -> tuple[int, int]:
        limit = self.limit()
        usage = int(read_text(os.path.join(self.folder, self.usage_file)))
        cache = _stat_value(read_text(os.path.join(self.folder, "memory.stat")), self.cache_names)
        return max(0, limit - usage + cache), limit


class MemorySource:
    def __init__(self, kind: str, label: str, reader: Callable[[], tuple[int, int]]) -> None:
        self.kind, self.label, self._reader = kind, label, reader

    def read(self) -> tuple[int, int]:
        """(available, total) bytes."""
        return self._reader()


def memory_source(proc: str = "/proc", cgroup_root: str = "/host/cgroup") -> MemorySource:
    """Where the node's memory figures come from (see the module's doc): the node's cgroup when it has a limit
    below the machine's memory (the lab), else /proc/meminfo (a real Spark)."""
    _, total = meminfo(proc)
    found = _memory_cgroup(proc)
    if found and os.path.isdir(cgroup_root):
        version, own = found
        parent = os.path.dirname(own.rstrip("/")) or "/"
        base = os.path.join(cgroup_root, "memory") if version == 1 else cgroup_root
        folder = os.path.join(base, parent.lstrip("/"))
        try:
            cg = CgroupMemory(version, folder)
            limit = cg.limit()
        except (OSError, ValueError):
            limit = UNLIMITED
        if limit < total:
            label = f"SIMULATED (lab): the node's cgroup memory limit ({limit >> 20} MiB, cgroup v{version})"
            return MemorySource("cgroup", label, cg.read)
    return MemorySource("meminfo", "/proc/meminfo MemAvailable (unified memory)", lambda: meminfo(proc))


def read_psi(proc: str = "/proc") -> dict[str, float] | None:
    """{'some10', 'full10' (percent), 'some_total', 'full_total' (microseconds stalled)} or None without PSI."""
    try:
        text = read_text(f"{proc}/pressure/memory")
    except OSError:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, *fields = line.split()
        values = dict(f.split("=", 1) for f in fields)
        out[f"{kind}10"] = float(values["avg10"])
        out[f"{kind}_total"] = int(values["total"])
    return out if "some10" in out else None


def psi_note(proc: str = "/proc") -> str | None:
    """Why PSI is missing (one line), or None when it can be read."""
    path = f"{proc}/pressure/memory"
    try:
        read_text(path)
        return None
    except FileNotFoundError:
        return f"no {path} (kernel without PSI): the guard watches available memory only"
    except OSError as exc:
        return f"{path} unreadable ({exc.strerror}; psi=0 at boot?): the guard watches available memory only"


def boot_id(proc: str = "/proc") -> str:
    try:
        return read_text(f"{proc}/sys/kernel/random/boot_id").strip()
    except OSError:
        return ""


def boot_time(proc: str = "/proc") -> int:
    """The epoch second the kernel booted (/proc/stat btime), or 0."""
    try:
        return _stat_value(read_text(f"{proc}/stat"), ("btime",))
    except OSError:
        return 0
