"""What a node has now: the typed facts every reader shares (plan, preflight, status, top, doctor).

Filled by the facts of facts/catalog.py, read in one round trip (facts/read.py). The flat fields are what the
deploy pipeline reads; the grouped ones (gpu, docker engine, network, rdma) what doctor's checks read too.
Container details come from `docker inspect --format` with only the fields we need: never `Config.Env`, which
holds the values of `--env-file secrets.env`.
"""

from __future__ import annotations

import copy
import re
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sparkdeploy.labels import LABEL_PREFIX

from .parsers import GidEntry, Link, RdmaDevice

MANIFEST = "manifest.json"  # in the state dir: what this tool wrote there (down removes exactly that)
TEMP_SUFFIX = ".sparkdeploy-tmp"  # NodeConnection.put's temp files: `.NAME.sparkdeploy-tmp`
# what is read only where something starts (catalog.RESOURCES, facts.add_resources)
RESOURCE_FACTS = ("resources", "meminfo", "cpus", "gpu", "model", "disk")


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
class ImageStoreFact:
    """The node's image store (images/inventory_images.py: push, push --from, registry pull): the engine's
    `docker info` (root, driver, its status pairs, version), the Docker root's free bytes, whether zstd is
    installed, and one `docker image inspect` record per image (id, tags, layers, labels, size). rc: the read's
    exit code (90: the engine did not answer, 91: inspecting its images failed); error: its last lines then."""

    rc: int | None = None
    error: str = ""
    info: dict[str, Any] | None = None
    free_bytes: int | None = None  # None: df could not read the Docker root
    zstd: bool = False
    images: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class CrashRecords:
    """How sparkdeploy's containers ended (daytwo/crashes.py makes their history of it): `docker inspect` of each
    of ours (id, name, the whole State, restarts, role), the engine's die/oom/kill events of the last
    catalog.CRASH_HISTORY_S, and the node's clock (`now`, ISO 8601 UTC) when they were read."""

    inspect: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    now: str = ""


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


class UnreadFact(Exception):
    """A NodeFacts field was read whose fact the reader did not ask for (a bug: the reader's set lacks it).
    A fact that was read and found nothing holds its empty value; one never read holds nothing at all."""

    def __init__(self, node: str, field_name: str, fact: str) -> None:
        self.node, self.field, self.fact = node, field_name, fact
        super().__init__(
            f"{node}: the fact {fact!r} was not read, so NodeFacts.{field_name} has no value"
            " (ask for it: a set of facts/catalog.py, or NodeFacts.has first)"
        )


def _fact(name: str, default: Any = MISSING, factory: Any = MISSING) -> Any:
    """A NodeFacts field filled by the fact `name` (facts/catalog.py); its default is what a hand-made
    NodeFacts(...) holds (tests, dry runs); facts parsed from a node start with every field unread."""
    return field(default=default, default_factory=factory, metadata={"fact": name})


@dataclass(repr=False, eq=False)
class NodeFacts:
    """What a node has now. Each field names the fact that fills it. `parse` (facts/read.py) starts from
    `NodeFacts.unread(node)`: a field whose fact was not read has no value, and reading it raises UnreadFact
    (never an empty value that looks read); `has(fact)` asks first. NodeFacts(node, ...) by hand: every field
    given or defaulted counts as read."""

    node: str
    home: str = _fact("home", "")
    docker_ok: bool = _fact("docker", False)
    docker_version: str = _fact("docker", "")
    docker_error: str = _fact("docker", "")
    containers: list[ContainerFact] = _fact("inspect", factory=list)  # ours (label io.sparkdeploy.managed=true)
    other_names: dict[str, str] = _fact("names", factory=dict)  # name -> id of containers that are not ours
    images: dict[str, str | None] = _fact("images", factory=dict)  # reference -> image ID (None: absent)
    state_dir_mode: int | None = _fact("statedir", None)  # None: the state dir does not exist
    state_dir_foreign: str = _fact("foreign", "")  # the state dir or an entry of it the SSH user does not own
    # (Docker makes them root's); deeper paths are not ours to write (doctor's probe leaves a root-owned
    # result.json in doctor/)
    files: dict[str, FileFact] = _fact("files", factory=dict)
    other_entries: list[str] = _fact("files", factory=list)  # folders/links in the state dir (not ours)
    manifest: dict[str, Any] | None = _fact("manifest", None)
    manifest_error: str = _fact("manifest", "")
    routes: dict[str, Any] | None = _fact("routes", None)  # the stack gateway's routes.json (deploy/stack/routes.py)
    routes_error: str = _fact("routes", "")
    state_dirs: dict[str, StateDirFact] = _fact("state_dirs", factory=dict)  # `<state_dir>`, `<state_dir>-*` by name
    mem_total_mb: int | None = _fact("meminfo", None)
    mem_available_mb: int | None = _fact("meminfo", None)
    cpus: int | None = _fact("cpus", None)  # nproc
    gpu_mem_total_mb: int | None = _fact("gpu", None)
    gpu_mem_free_mb: int | None = _fact("gpu", None)
    model_cached: bool = _fact("model", False)
    disk_free_mb: dict[str, int] = _fact("disk", factory=dict)  # home | hf_cache | docker -> free MiB
    listening: set[int] = _fact("listen", factory=set)
    running: dict[str, tuple[str, str]] = _fact("running", factory=dict)  # running of ours: name -> (role, deployment)
    manifests: dict[str, dict[str, Any]] = _fact("manifests", factory=dict)  # folder of ours -> its manifest.json
    guard_status: dict[str, str] = _fact("guard_status", factory=dict)  # path from the home -> the guard's status.json
    engine_errors: dict[str, str] = _fact("engine_errors", factory=dict)  # unhealthy container -> why it died (log)
    resources: bool = _fact("resources", False)  # memory, disk and model cache were read (where something starts)
    # read by doctor (and where asked): the engine's root, the SSH user, the GPU, kernel, network, RDMA
    docker_root: str = _fact("docker_info", "")
    docker_driver: str = _fact("docker_info", "")
    disk: dict[str, DiskUsage] = _fact("disk", factory=dict)  # home | hf_cache | docker -> usage
    image_errors: dict[str, str] = _fact("images", factory=dict)  # reference -> why inspect failed (not "no such")
    user: str = _fact("user", "")
    groups: list[str] = _fact("user", factory=list)
    uid: str = _fact("ids", "")  # `id -u` of the SSH user
    gid: str = _fact("ids", "")  # `id -g`
    image_store: ImageStoreFact | None = _fact("image_store", None)
    crashes: CrashRecords | None = _fact("crashes", None)
    # image IDs (of the references asked) whose config the layer store lets root read through `sudo -n`
    store_readable: set[str] = _fact("store_readable", factory=set)
    hf_missing: list[str] = _fact("hf_missing", factory=list)  # `$hf/hub` and parents not there, innermost first
    gpu: GpuFact | None = _fact("gpu", None)
    kernel: str = _fact("kernel", "")
    network: NetworkFact | None = _fact("network", None)
    rdma: RdmaFact | None = _fact("rdma", None)
    # read by day zero (dayzero/: init, setup ssh, setup network)
    machine_id: str = _fact("machine_id", "")  # /etc/machine-id ("" where it cannot be read)
    hostname: str = _fact("hostname", "")
    max_mtu: dict[str, int] = _fact("max_mtu", factory=dict)  # interface -> the largest MTU it takes (ip -d -j link)
    rdma_netdevs: dict[str, str] = _fact("rdma_netdevs", factory=dict)  # RDMA device -> its network interface
    rdma_netdevs_simulated: bool = _fact("rdma_netdevs", False)  # the lab's `rdma link` stand-in answered
    sudo: dict[str, str] = _fact("sudo", factory=dict)  # program -> ok | missing | absent (`sudo -n -l PATH`)
    sudo_paths: dict[str, str] = _fact("sudo", factory=dict)  # program -> its path on the node

    @classmethod
    def unread(cls, node: str) -> NodeFacts:
        """Facts of `node` with nothing read yet (what `parse` fills, fact by fact)."""
        f = cls.__new__(cls)
        f.node = node
        return f

    def has(self, fact: str) -> bool:
        """Whether the fact `fact` (a FACTS name) was read: its fields hold values."""
        names = FACT_FIELDS[fact]
        return all(n in self.__dict__ for n in names)

    if not TYPE_CHECKING:  # mypy keeps checking attribute names: __getattr__ would make every name valid

        def __getattr__(self, name: str) -> Any:
            fact = FIELD_FACT.get(name)
            if fact is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            raise UnreadFact(self.__dict__.get("node", "?"), name, fact)

    def __repr__(self) -> str:
        values = ", ".join(
            f"{f.name}={self.__dict__[f.name]!r}" if f.name in self.__dict__ else f"{f.name}=<unread>"
            for f in fields(self)
        )
        return f"NodeFacts({values})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as the dataclass was)

    def add_resources(self, other: NodeFacts) -> None:
        """Take the resources facts (RESOURCE_FACTS) `other` read: memory, disk, the GPU, the model cache."""
        for fact in RESOURCE_FACTS:
            for name in FACT_FIELDS[fact]:
                setattr(self, name, getattr(other, name))

    def copy(self) -> NodeFacts:
        """A shallow copy that keeps what was not read unread (dataclasses.replace would read every field)."""
        return copy.copy(self)

    def with_containers(self, containers: list[ContainerFact]) -> NodeFacts:
        g = self.copy()
        g.containers = containers
        return g

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


# field -> the fact that fills it, and back (from each field's metadata: one place)
FIELD_FACT: dict[str, str] = {f.name: f.metadata["fact"] for f in fields(NodeFacts) if "fact" in f.metadata}
FACT_FIELDS: dict[str, tuple[str, ...]] = {
    fact: tuple(n for n, owner in FIELD_FACT.items() if owner == fact) for fact in dict.fromkeys(FIELD_FACT.values())
}
for _name in FIELD_FACT:  # the dataclass left plain defaults as class attributes: an unread field must find none
    if _name in NodeFacts.__dict__:
        delattr(NodeFacts, _name)


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
