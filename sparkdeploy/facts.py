"""What a node has now, read over SSH in one round trip: the input of `plan`, `preflight` and `status`.

One constant bash script runs per node (values such as the state dir and image references travel as its
positional arguments, quoted once by `NodeConnection.run`); its output is split into sections and parsed
here. Everything it runs is read-only. Container details come from `docker inspect --format` with only the
fields we need: never `Config.Env`, which holds the values of `--env-file secrets.env`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sparkdeploy.deployment import LABEL_PREFIX, MANAGED_LABEL
from sparkdeploy.remote import NodeConnection

MANIFEST = "manifest.json"  # in the state dir: what this tool wrote there (down removes exactly that)
TEMP_SUFFIX = ".sparkdeploy-tmp"  # NodeConnection.put's temp files: `.NAME.sparkdeploy-tmp`
SECTION = "@@sparkdeploy-facts@@"
FACTS_TIMEOUT_S = 60

_INSPECT = (
    '{"id":{{json .Id}},"name":{{json .Name}},"image":{{json .Image}},"ref":{{json .Config.Image}},'
    '"labels":{{json .Config.Labels}},"status":{{json .State.Status}},"running":{{json .State.Running}},'
    '"restarting":{{json .State.Restarting}},"exit_code":{{json .State.ExitCode}},'
    '"started":{{json .State.StartedAt}},"finished":{{json .State.FinishedAt}},'
    '"restarts":{{json .RestartCount}}}'
)

# $1 what to read: state (containers, images, files, ports) | resources (memory, disk, model cache) | all;
# $2 state dir (relative to $HOME), $3 hf cache (~/... or absolute), $4 the model's hub folder name,
# $5... image references. Read-only: every command here only looks.
SCRIPT = (
    r"""
what="$1"; sd="$2"; hf="$3"; model="$4"; shift 4
dir="$HOME/$sd"
case "$hf" in "~") hf="$HOME";; "~/"*) hf="$HOME/${hf#\~/}";; esac
s() { printf '\n%s %s\n' '@@sparkdeploy-facts@@' "$1"; }
s home; printf '%s\n' "$HOME"
if [ "$what" != resources ]; then
s docker
if out=$(docker version --format '{{.Server.Version}}' 2>&1); then echo "ok $out"; else echo "fail"; printf '%s\n' "$out" | tail -n 3; fi
s names
docker ps -a --no-trunc --format '{{.ID}} {{.Label "io.sparkdeploy.managed"}} {{.Names}}' 2>/dev/null
s inspect
ids=$(docker ps -aq --no-trunc --filter label=io.sparkdeploy.managed=true 2>/dev/null)
[ -n "$ids" ] && docker inspect --format '"""  # noqa: E501 - shell lines run as written
    + _INSPECT.replace("'", "'\\''")
    + r"""' $ids 2>/dev/null
s images
for ref in "$@"; do id=$(docker image inspect --format '{{.Id}}' "$ref" 2>/dev/null) || id=-; printf '%s %s\n' "$ref" "${id:--}"; done
s statedir
[ -d "$dir" ] && stat -c '%a' "$dir"
s foreign
[ -d "$dir" ] && find "$dir" -maxdepth 1 ! -user "$(id -u)" -print -quit 2>/dev/null
s files
[ -d "$dir" ] && (cd "$dir" && find . -mindepth 1 -maxdepth 1 -printf '%m %y %f\n')
s sha
[ -d "$dir" ] && (cd "$dir" && find . -maxdepth 1 -type f -exec sha256sum -- {} + 2>/dev/null)
s manifest
[ -f "$dir/manifest.json" ] && cat "$dir/manifest.json"
s listen
cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" {print $2}'
fi
if [ "$what" != state ]; then
s resources
s meminfo
grep -E '^(MemTotal|MemAvailable):' /proc/meminfo
s gpu
nvidia-smi --query-gpu=memory.total,memory.free --format=csv,noheader,nounits 2>/dev/null
s model
[ -n "$model" ] && [ -d "$hf/hub/$model" ] && echo cached
s disk
droot=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null)
p="$hf"; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done
for pair in "home:$HOME" "hf_cache:$p" "docker:$droot"; do
  [ -n "${pair#*:}" ] && printf '%s ' "${pair%%:*}" && df -Pk "${pair#*:}" 2>/dev/null | tail -n 1
done
fi
s end
"""  # noqa: E501 - shell lines run as written
)


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
    mem_total_mb: int | None = None
    mem_available_mb: int | None = None
    gpu_mem_total_mb: int | None = None
    gpu_mem_free_mb: int | None = None
    model_cached: bool = False
    disk_free_mb: dict[str, int] = field(default_factory=dict)  # home | hf_cache | docker -> free MiB
    listening: set[int] = field(default_factory=set)
    resources: bool = False  # memory, disk and model cache were read (only where something starts)

    def add_resources(self, other: NodeFacts) -> None:
        for name in (
            "mem_total_mb",
            "mem_available_mb",
            "gpu_mem_total_mb",
            "gpu_mem_free_mb",
            "model_cached",
            "disk_free_mb",
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
    return bool(re.match(r"^[A-Za-z0-9_.-]+$", name)) and name not in (".", "..")


def parse_time(text: str) -> datetime | None:
    if not text or text.startswith("0001-01-01"):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?$", text.strip())
    if not m:
        return None
    frac = (m.group(2) or "")[:7]  # Python takes at most microseconds
    tz = m.group(3) or "Z"
    tz = "+00:00" if tz == "Z" else tz
    try:
        return datetime.fromisoformat(m.group(1) + frac + tz)
    except ValueError:
        return None


def split_sections(text: str) -> dict[str, str]:
    sections: dict[str, str] = {}
    name = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(SECTION + " "):
            if name is not None:
                sections[name] = "\n".join(lines).strip("\n")
            name = line[len(SECTION) + 1 :].strip()
            lines = []
        elif name is not None:
            lines.append(line)
    if name is not None:
        sections[name] = "\n".join(lines).strip("\n")
    return sections


def _int(text: str) -> int | None:
    try:
        return int(float(text.strip()))
    except (TypeError, ValueError):
        return None


def parse(node: str, text: str) -> NodeFacts:
    """Turn the script's output into NodeFacts (pure: unit-tested without a node)."""
    sec = split_sections(text)
    f = NodeFacts(node=node, home=sec.get("home", "").strip())

    docker = sec.get("docker", "").splitlines()
    if "docker" not in sec:
        pass  # not read (resources only)
    elif docker and docker[0].startswith("ok "):
        f.docker_ok = True
        f.docker_version = docker[0].split()[1] if len(docker[0].split()) > 1 else ""
    else:
        f.docker_error = " ".join(line.strip() for line in docker[1:] if line.strip()) or "docker did not answer"

    managed_ids = set()
    for line in sec.get("names", "").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            cid, managed, names = parts
        elif len(parts) == 2:  # an empty label value collapses to two fields
            cid, names = parts
            managed = ""
        else:
            continue
        if managed == "true":
            managed_ids.add(cid)
        else:
            for name in names.split(","):
                f.other_names[name.strip()] = cid

    for line in sec.get("inspect", "").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        labels = d.get("labels") or {}
        if labels.get(MANAGED_LABEL) != "true":
            continue
        f.containers.append(
            ContainerFact(
                id=d.get("id") or "",
                name=(d.get("name") or "").lstrip("/"),
                image_id=d.get("image") or "",
                image_ref=d.get("ref") or "",
                labels=labels,
                status=d.get("status") or "",
                running=bool(d.get("running")),
                restarting=bool(d.get("restarting")),
                exit_code=int(d.get("exit_code") or 0),
                started_at=d.get("started") or "",
                finished_at=d.get("finished") or "",
                restarts=int(d.get("restarts") or 0),
            )
        )
    f.containers.sort(key=lambda c: c.name)

    for line in sec.get("images", "").splitlines():
        ref, _, image_id = line.strip().rpartition(" ")
        if ref:
            f.images[ref] = None if image_id in ("", "-") else image_id

    f.state_dir_foreign = sec.get("foreign", "").strip()
    mode = sec.get("statedir", "").strip()
    f.state_dir_mode = int(mode, 8) if re.fullmatch(r"[0-7]{3,4}", mode) else None

    for line in sec.get("files", "").splitlines():
        m = re.match(r"^([0-7]{3,4}) (\w) (.+)$", line)
        if m and m.group(2) == "f":
            f.files[m.group(3)] = FileFact(m.group(3), int(m.group(1), 8))
        elif m:
            f.other_entries.append(m.group(3))  # a folder or link: never ours (another tool's, e.g. doctor/)
    for line in sec.get("sha", "").splitlines():
        m = re.match(r"^([0-9a-f]{64})  \./(.+)$", line)
        if m and m.group(2) in f.files:
            f.files[m.group(2)].sha256 = m.group(1)

    manifest = sec.get("manifest", "").strip()
    if manifest:
        try:
            data = json.loads(manifest)
            f.manifest = data if isinstance(data, dict) else None
            if f.manifest is None:
                f.manifest_error = "not a JSON object"
        except ValueError as exc:
            f.manifest_error = f"not valid JSON ({exc.msg})"  # type: ignore[attr-defined]  # json raises JSONDecodeError

    for line in sec.get("meminfo", "").splitlines():
        m = re.match(r"^(MemTotal|MemAvailable):\s+(\d+) kB", line)
        if m:
            value = int(m.group(2)) // 1024
            if m.group(1) == "MemTotal":
                f.mem_total_mb = value
            else:
                f.mem_available_mb = value
    gpu = sec.get("gpu", "").strip().splitlines()
    if gpu:  # one line per GPU; a DGX Spark has one (and may print [N/A] for unified memory)
        parts = [p.strip() for p in gpu[0].split(",")]
        if len(parts) >= 2 and _int(parts[0]) is not None and _int(parts[1]) is not None:
            f.gpu_mem_total_mb, f.gpu_mem_free_mb = _int(parts[0]), _int(parts[1])

    f.resources = "resources" in sec
    f.model_cached = sec.get("model", "").strip() == "cached"
    for line in sec.get("disk", "").splitlines():
        parts = line.split()  # what, then df -P's columns: filesystem blocks used available capacity mount
        if len(parts) >= 7 and _int(parts[4]) is not None:
            f.disk_free_mb[parts[0]] = _int(parts[4]) // 1024  # type: ignore[operator]

    for line in sec.get("listen", "").splitlines():
        _, _, port = line.strip().rpartition(":")
        try:
            f.listening.add(int(port, 16))
        except ValueError:
            pass
    return f


def hub_folder(model: str) -> str:
    """The Hugging Face cache folder of a model id: openai/gpt-oss-120b -> models--openai--gpt-oss-120b."""
    return "models--" + model.replace("/", "--")


def read_facts(
    conn: NodeConnection,
    state_dir: str,
    images: Sequence[str] = (),
    hf_cache: str = "~",
    model: str = "",
    what: str = "state",
) -> NodeFacts:
    """Read the node's state in one SSH command (read-only). what: state | resources | all."""
    argv = [
        "bash",
        "-c",
        SCRIPT,
        "sparkdeploy-facts",
        what,
        state_dir,
        hf_cache,
        hub_folder(model) if model else "",
        *images,
    ]
    result = conn.run(argv, check=False, timeout=FACTS_TIMEOUT_S)
    facts = parse(conn.node.name, result.stdout)
    if not facts.home:
        from sparkdeploy.errors import StepFailed

        reason = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise StepFailed(
            f"{conn.node.name}: could not read the node's state (exit {result.exit_code}"
            + (": " + " | ".join(reason) if reason else "")
            + ")"
        )
    return facts
