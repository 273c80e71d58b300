"""What a node has now: the typed facts every reader shares (plan, preflight, status, top, doctor).

Filled by the facts of facts/catalog.py, read in one round trip (facts/read.py). The flat fields are what the
deploy pipeline reads; the grouped ones (gpu, docker engine, network, rdma) what doctor's checks read too.
Container details come from `docker inspect --format` with only the fields we need: never `Config.Env`, which
holds the values of `--env-file secrets.env`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sparkdeploy.labels import LABEL_PREFIX

from .parsers import GidEntry, Link, RdmaDevice

MANIFEST = "manifest.json"  # in the state dir: what this tool wrote there (down removes exactly that)
TEMP_SUFFIX = ".sparkdeploy-tmp"  # NodeConnection.put's temp files: `.NAME.sparkdeploy-tmp`


@dataclass
class GpuFact:
    """nvidia-smi --query-gpu (catalog.GPU_FIELDS): one dict per GPU, N/A values None."""

    rc: int | None = None  # 127: no nvidia-smi
    gpus: list[dict[str, str | None]] = field(default_factory=list)
    error: str = ""
    simulated: bool = False  # the lab's stand-in answered (it says SIMULATED)


@dataclass
class DiskUsage:
    size: int  # bytes
    used: int
    avail: int
    mount: str


@dataclass
class NetworkFact:
    links: dict[str, Link] = field(default_factory=dict)  # ip -j addr
    speeds: dict[str, int | None] = field(default_factory=dict)  # fabric interface -> Mb/s (ethtool)
    simulated_speed: bool = False
    simulated_ifaces: set[str] = field(default_factory=set)  # whose ethtool answer said SIMULATED


@dataclass
class RdmaFact:
    rc: int | None = None  # ibv_devinfo's exit code (127: not installed)
    error: str = ""
    devices: dict[str, RdmaDevice] = field(default_factory=dict)
    gids: list[GidEntry] = field(default_factory=list)
    gids_text: str = ""

    @property
    def simulated(self) -> bool:
        return any(d.simulated for d in self.devices.values()) or "SIMULATED" in self.gids_text


@dataclass
class ContainerFact:
    id: str
    name: str
    image_id: str
    image_ref: str
    labels: dict[str, str]
    status: str
    running: bool
    restarting: bool = False
    exit_code: int = 0
    started_at: str = ""
    finished_at: str = ""
    restarts: int = 0
    health: str = ""  # Docker's health check: starting | healthy | unhealthy ("": the container has none)
    failing_since: datetime | None = None  # unhealthy: the first failed probe of the streak (healthcheck.py)
    health_output: str = ""  # the last failed probe's output

    def label(self, key: str) -> str:
        return self.labels.get(f"{LABEL_PREFIX}.{key}", "")

    @property
    def config_hash(self) -> str:
        return self.label("config-hash")

    @property
    def recipe(self) -> str:
        return self.label("recipe")

    @property
    def topology(self) -> str:
        return self.label("topology")

    @property
    def role(self) -> str:
        return self.label("role")

    def uptime_s(self, now: datetime | None = None) -> float | None:
        started = parse_time(self.started_at)
        if not self.running or started is None:
            return None
        return max(0.0, ((now or datetime.now(UTC)) - started).total_seconds())


@dataclass
class FileFact:
    name: str
    mode: int
    sha256: str = ""


@dataclass
class StateDirFact:
    """A folder of sparkdeploy's kind in the SSH user's home: the state dir or a stack's `<state_dir>-NAME`."""

    name: str  # relative to the home, e.g. .sparkdeploy-gateway
    mode: int | None
    foreign: str = ""  # the folder or an entry of it the SSH user does not own ("" when all are the user's)
    entries: list[str] = field(default_factory=list)  # its files and folders, by name

    @property
    def has_manifest(self) -> bool:
        return MANIFEST in self.entries


@dataclass
class NodeFacts:
    node: str
    home: str = ""
    docker_ok: bool = False
    docker_version: str = ""
    docker_error: str = ""
    containers: list[ContainerFact] = field(default_factory=list)  # ours (label io.sparkdeploy.managed=true)
    other_names: dict[str, str] = field(default_factory=dict)  # name -> id of containers that are not ours
    images: dict[str, str | None] = field(default_factory=dict)  # reference -> image ID (None: absent)
    state_dir_mode: int | None = None  # None: the state dir does not exist
    state_dir_foreign: str = ""  # the state dir or an entry of it the SSH user does not own (Docker makes them
    # root's); deeper paths are not ours to write (doctor's probe leaves a root-owned result.json in doctor/)
    files: dict[str, FileFact] = field(default_factory=dict)
    other_entries: list[str] = field(default_factory=list)  # folders/links in the state dir (not ours)
    manifest: dict[str, Any] | None = None
    manifest_error: str = ""
    routes: dict[str, Any] | None = None  # the stack gateway's routes.json (its state dir's; deploy/stack/routes.py)
    routes_error: str = ""
    state_dirs: dict[str, StateDirFact] = field(default_factory=dict)  # `<state_dir>` and `<state_dir>-*` by name
    mem_total_mb: int | None = None
    mem_available_mb: int | None = None
    cpus: int | None = None  # nproc
    gpu_mem_total_mb: int | None = None
    gpu_mem_free_mb: int | None = None
    model_cached: bool = False
    disk_free_mb: dict[str, int] = field(default_factory=dict)  # home | hf_cache | docker -> free MiB
    listening: set[int] = field(default_factory=set)
    engine_errors: dict[str, str] = field(default_factory=dict)  # unhealthy container -> why its engine died (log)
    resources: bool = False  # memory, disk and model cache were read (only where something starts)
    # read by doctor (and where asked): the engine's root, the SSH user, the GPU, kernel, network, RDMA
    docker_root: str = ""
    docker_driver: str = ""
    disk: dict[str, DiskUsage] = field(default_factory=dict)  # home | hf_cache | docker -> usage
    image_errors: dict[str, str] = field(default_factory=dict)  # reference -> why inspect failed (not "no such")
    user: str = ""
    groups: list[str] = field(default_factory=list)
    gpu: GpuFact | None = None
    kernel: str = ""
    network: NetworkFact | None = None
    rdma: RdmaFact | None = None
    # read by day zero (dayzero/: init, setup ssh, setup network)
    machine_id: str = ""  # /etc/machine-id ("" where it cannot be read)
    hostname: str = ""
    max_mtu: dict[str, int] = field(default_factory=dict)  # interface -> the largest MTU it takes (ip -d -j link)
    rdma_netdevs: dict[str, str] = field(default_factory=dict)  # RDMA device -> its network interface
    rdma_netdevs_simulated: bool = False  # the lab's `rdma link` stand-in answered (no sysfs devices)
    sudo: dict[str, str] = field(default_factory=dict)  # program -> ok | missing | absent (`sudo -n -l PATH`)
    sudo_paths: dict[str, str] = field(default_factory=dict)  # program -> its path on the node

    def add_resources(self, other: NodeFacts) -> None:
        for name in (
            "mem_total_mb",
            "mem_available_mb",
            "cpus",
            "gpu_mem_total_mb",
            "gpu_mem_free_mb",
            "model_cached",
            "disk_free_mb",
            "disk",
            "gpu",
            "resources",
        ):
            setattr(self, name, getattr(other, name))

    def container(self, name: str) -> ContainerFact | None:
        return next((c for c in self.containers if c.name == name), None)

    @property
    def temp_files(self) -> list[str]:
        return sorted(n for n in self.files if n.startswith(".") and n.endswith(TEMP_SUFFIX))

    @property
    def manifest_files(self) -> list[str]:
        names = (self.manifest or {}).get("files") or []
        return [n for n in names if isinstance(n, str) and safe_name(n)]

    @property
    def free_memory_mb(self) -> int | None:
        """The GPU's free memory when nvidia-smi reports one, else MemAvailable (DGX Spark: unified memory)."""
        if self.gpu_mem_free_mb is not None:
            return self.gpu_mem_free_mb
        return self.mem_available_mb

    @property
    def total_memory_mb(self) -> int | None:
        return self.gpu_mem_total_mb if self.gpu_mem_total_mb is not None else self.mem_total_mb


def safe_name(name: str) -> bool:
    """A plain file name in the state dir (what a manifest may list): never a path."""
    return bool(re.fullmatch(r"[A-Za-z0-9_.-]+", name)) and name not in (".", "..")


def parse_time(text: str) -> datetime | None:
    if not text or text.startswith("0001-01-01"):
        return None
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?", text.strip())
    if not m:
        return None
    frac = (m.group(2) or "")[:7]  # Python takes at most microseconds
    tz = m.group(3) or "Z"
    tz = "+00:00" if tz == "Z" else tz
    try:
        return datetime.fromisoformat(m.group(1) + frac + tz)
    except ValueError:
        return None


def hub_folder(model: str) -> str:
    """The Hugging Face cache folder of a model id: openai/gpt-oss-120b -> models--openai--gpt-oss-120b."""
    return "models--" + model.replace("/", "--")


def health_probes(log: list[Any]) -> list[tuple[datetime, bool]]:
    """Docker's health log (State.Health.Log) as (start, passed), oldest first (healthcheck.failing_since)."""
    out = []
    for p in log:
        start = parse_time(str(p.get("Start") or "")) if isinstance(p, dict) else None
        if start is not None:
            out.append((start, p.get("ExitCode") == 0))
    return out
